//! The lab's scenarios: what the router (or a half-applied change) does to
//! the traffic between the GPU node and the control plane, and which pings
//! run.

use clap::ValueEnum;

pub use crate::cli::Scenario;

use super::topology::{Block, CP1, CP2, GPU};

/// Payload size of the steady pings (ping's default).
const STEADY_SIZE: u16 = 56;
/// Sizes of the `mtu` scenario's big pings: 1400 bytes overflow the
/// router's 1400-byte link once encapsulated, 1300 bytes fit.
const BIG_SIZES: [u16; 2] = [1400, 1300];

/// One ping process: from one node's pod address to another's, in `block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingSpec {
    /// Index of the sending node in `NODES`.
    pub from: usize,
    /// Index of the target node.
    pub to: usize,
    /// Which pod block (and so which prescribed encapsulation).
    pub block: Block,
    /// ICMP payload bytes (`ping -s`).
    pub size: u16,
}

impl Scenario {
    /// The name on the command line.
    pub fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }

    /// The one-line description (the variant's doc).
    pub fn about(self) -> String {
        self.to_possible_value()
            .and_then(|v| v.get_help().map(ToString::to_string))
            .unwrap_or_default()
    }

    /// Whether it is a BGP scenario (its own mesh of nodes with BIRD, in
    /// `lab::bgp`), not the incident's three nodes and router.
    pub fn is_bgp(self) -> bool {
        matches!(
            self,
            Scenario::BgpDown | Scenario::NewNode | Scenario::StaleRoute
        )
    }

    /// Whether the router source-NATs UDP toward the GPU node.
    pub fn snat_udp_to_gpu(self) -> bool {
        self == Scenario::Incident
    }

    /// Whether the router drops UDP/4789 coming from the GPU node.
    pub fn drop_udp_from_gpu(self) -> bool {
        matches!(self, Scenario::Incident | Scenario::UdpBlock)
    }

    /// The MTU of the router's link toward the GPU node, when reduced.
    pub fn gpu_link_mtu(self) -> Option<u32> {
        (self == Scenario::Mtu).then_some(1400)
    }

    /// Whether the GPU node routes cp1's VXLAN block over tunl0.
    pub fn gpu_routes_cp1_vxlan_block_over_ipip(self) -> bool {
        self == Scenario::EncapMismatch
    }

    /// The pings, each direction its own process. VXLAN runs between gpu
    /// and cp1 (the incident's pair) and between the control-plane nodes;
    /// not between gpu and cp2, because both control-plane nodes would then
    /// hide behind the one SNAT address, and the observer's row for it
    /// keeps only the latest inner sample. IPIP runs between gpu and both.
    pub fn pings(self) -> Vec<PingSpec> {
        if self.is_bgp() {
            return Vec::new();
        }
        let pairs = [
            (GPU, CP1, Block::Vxlan),
            (CP1, CP2, Block::Vxlan),
            (GPU, CP1, Block::Ipip),
            (GPU, CP2, Block::Ipip),
        ];
        let mut pings: Vec<PingSpec> = pairs
            .iter()
            .flat_map(|&(a, b, block)| [(a, b, block), (b, a, block)])
            .map(|(from, to, block)| PingSpec {
                from,
                to,
                block,
                size: STEADY_SIZE,
            })
            .collect();
        if self == Scenario::Mtu {
            for size in BIG_SIZES {
                for block in Block::ALL {
                    for (from, to) in [(GPU, CP1), (CP1, GPU)] {
                        pings.push(PingSpec {
                            from,
                            to,
                            block,
                            size,
                        });
                    }
                }
            }
        }
        pings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_has_a_name_and_a_line_of_help() {
        for scenario in Scenario::value_variants() {
            assert!(!scenario.name().is_empty());
            assert!(scenario.about().len() > 20, "{scenario:?}");
        }
        assert_eq!(Scenario::EncapMismatch.name(), "encap-mismatch");
    }

    #[test]
    fn pings_run_both_ways() {
        for scenario in Scenario::value_variants() {
            let pings = scenario.pings();
            for p in &pings {
                assert!(
                    pings
                        .iter()
                        .any(|q| (q.from, q.to, q.block, q.size) == (p.to, p.from, p.block, p.size)),
                    "{p:?} has no way back"
                );
            }
        }
        assert_eq!(Scenario::Incident.pings().len(), 8);
        assert_eq!(Scenario::Mtu.pings().len(), 16);
    }
}
