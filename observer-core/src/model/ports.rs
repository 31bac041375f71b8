//! Which UDP ports mean which encapsulation; written into the programs'
//! `UDP_PORT_TAGS` table before they are loaded.

use observer_common::{PORT_MATCH_SOURCE, Proto, parse::PortTable, ports};

/// The UDP port assignment, with the defaults Calico, flannel, Cilium and
/// WireGuard use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// VXLAN ports (default 4789 and 8472).
    pub vxlan: Vec<u16>,
    /// VXLAN-GPE ports (default 4790).
    pub vxlan_gpe: Vec<u16>,
    /// Geneve ports (default 6081).
    pub geneve: Vec<u16>,
    /// WireGuard ports (default 51820 and 51821), matched as source or destination.
    pub wireguard: Vec<u16>,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            vxlan: vec![ports::VXLAN, ports::VXLAN_LINUX],
            vxlan_gpe: vec![ports::VXLAN_GPE],
            geneve: vec![ports::GENEVE],
            wireguard: vec![ports::WIREGUARD, ports::WIREGUARD_V6],
        }
    }
}

impl PortConfig {
    /// The `(port, map value)` pairs to write. A port named for two
    /// protocols is an error, because the kernel side can hold only one.
    pub fn entries(&self) -> Result<Vec<(u16, u8)>, String> {
        let mut entries: Vec<(u16, u8, Proto)> = Vec::new();
        let groups = [
            (&self.vxlan, Proto::Vxlan, 0),
            (&self.vxlan_gpe, Proto::VxlanGpe, 0),
            (&self.geneve, Proto::Geneve, 0),
            (&self.wireguard, Proto::Wireguard, PORT_MATCH_SOURCE),
        ];
        for (list, proto, flags) in groups {
            for &port in list {
                if port == 0 {
                    return Err(format!("{} port 0 is not a valid UDP port", proto.name()));
                }
                if let Some((_, _, other)) = entries.iter().find(|(p, _, _)| *p == port) {
                    if *other == proto {
                        continue;
                    }
                    return Err(format!(
                        "UDP port {port} is given for both {} and {}; each port can mean one protocol",
                        other.name(),
                        proto.name()
                    ));
                }
                entries.push((port, proto as u8 | flags, proto));
            }
        }
        Ok(entries.into_iter().map(|(p, v, _)| (p, v)).collect())
    }
}

/// The port table as an array indexed by port, like the programs'
/// `UDP_PORT_TAGS` table: what the parser reads when it runs natively
/// (`observer replay`, `observer probe`).
pub struct PortArray(Box<[u8; 65536]>);

impl PortArray {
    /// The table of `config`.
    pub fn new(config: &PortConfig) -> Result<PortArray, String> {
        let mut table = Box::new([0u8; 65536]);
        for (port, tag) in config.entries()? {
            table[usize::from(port)] = tag;
        }
        Ok(PortArray(table))
    }

    /// The tag of every port, indexed by port.
    pub fn tags(&self) -> &[u8; 65536] {
        &self.0
    }
}

impl PortTable for PortArray {
    #[inline]
    fn tag(&self, port: u16) -> u8 {
        self.0[usize::from(port)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_cover_every_udp_encapsulation() {
        let entries = PortConfig::default().entries().unwrap();
        assert_eq!(
            entries,
            vec![
                (4789, Proto::Vxlan as u8),
                (8472, Proto::Vxlan as u8),
                (4790, Proto::VxlanGpe as u8),
                (6081, Proto::Geneve as u8),
                (51820, Proto::Wireguard as u8 | PORT_MATCH_SOURCE),
                (51821, Proto::Wireguard as u8 | PORT_MATCH_SOURCE),
            ]
        );
    }

    #[test]
    fn conflicting_port_is_rejected_with_both_names() {
        let config = PortConfig {
            geneve: vec![4789],
            ..PortConfig::default()
        };
        let err = config.entries().unwrap_err();
        assert!(
            err.contains("4789") && err.contains("vxlan") && err.contains("geneve"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_port_for_same_protocol_is_kept_once() {
        let config = PortConfig {
            vxlan: vec![4789, 4789],
            ..PortConfig::default()
        };
        assert_eq!(
            config
                .entries()
                .unwrap()
                .iter()
                .filter(|(p, _)| *p == 4789)
                .count(),
            1
        );
    }

    #[test]
    fn port_zero_is_rejected() {
        let config = PortConfig {
            vxlan: vec![0],
            ..PortConfig::default()
        };
        assert!(config.entries().is_err());
    }
}
