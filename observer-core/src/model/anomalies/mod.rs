//! The anomaly vocabulary: what kinds of problems exist ([`Kind`]), the
//! thresholds that judge them, what the node knows of its peers
//! ([`Known`]), and the anomalies and events the [`Engine`] hands out.
//!
//! The engine turns per-peer counters (what is on the wire) and the node's
//! own view (which nodes exist, which pod blocks they own, which
//! encapsulation the routes prescribe, who is allowed, which UDP ports mean
//! which encapsulation, which BGP sessions are up) into named problems per peer, each with evidence
//! and a next step, raised when a condition starts and cleared (with its
//! duration) when it ends. The work is split by concern:
//! - `engine`: the window over successive reads, raising and clearing, and
//!   the bounds that keep memory finite;
//! - `collect`: what each row adds to its (peer, encapsulation), and rows
//!   summed per pair;
//! - `rules`: one rule per kind, with its texts.
//!
//! Pure logic over values passed in: no kernel, no clock (times come from
//! the caller), so every rule has fast unit tests.

mod collect;
mod engine;
mod rules;

#[cfg(test)]
mod fixtures;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::{Duration, SystemTime},
};

use ipnet::IpNet;
use observer_common::Proto;
use serde::Serialize;
use serde_json::Value;

pub use collect::peer_totals;
pub use engine::Engine;

use crate::model::{
    bgp::BgpSession,
    bgp_wire::WirePeer,
    dataplane::BlockRoute,
    facts::{self, ExpectedPeer, SetKind, longest_prefix},
    ports::PortConfig,
    routes::MissingBlock,
};

/// (peer, encapsulation) pairs whose history is kept; beyond it the
/// longest-idle ones are forgotten (and counted), so attacker-chosen
/// sources cannot grow memory. An idle pair keeps the samples of its last
/// window and costs no work per read.
///
/// 57,344 is 7/8 of 65,536: the most a hash table of 65,536 buckets holds
/// (hashbrown's load factor), where one entry more doubles it. (Pairs
/// forgotten and made at the cap every read may still make it double once,
/// when removals leave no room to insert in place.)
pub const MAX_TRACKED_PEERS: usize = 57_344;

/// Anomalies active at once; beyond it new ones are only counted, so a
/// flood of spoofed sources cannot flood the output (each would be an
/// `unknown_peer`).
pub const MAX_ACTIVE: usize = 1024;

/// One tunnel: a peer and the encapsulation it speaks.
type Key = (IpAddr, Proto);
/// One condition of one tunnel; also orders findings (kind first).
type ActiveKey = (Kind, IpAddr, Proto);

/// What kind of problem an anomaly is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Tunnel packets go to a node and none come back, or the reverse.
    OneWay,
    /// Packets from an address that is no node, carrying a node's pod
    /// address inside: a router rewrote the outer source.
    SnatSuspected,
    /// Packets dropped because the source is not in the allow-set (or by
    /// a netfilter DROP rule).
    AllowSetDrop,
    /// Another encapsulation on the wire than the routes prescribe.
    EncapMismatch,
    /// Tunnel packets above the MTU, outer fragments, or routers' "too big".
    Mtu,
    /// Tunnel packets from a source that is neither a node nor allowed.
    UnknownPeer,
    /// A peer's drop rate above the threshold.
    DropSpike,
    /// Tunnel packets that arrived whole dropped by this node after
    /// decapsulation (or its packets to the peer before encapsulation):
    /// conntrack, a policy, the reverse-path filter, a missing FDB or
    /// neighbour entry.
    DroppedAfterDecap,
    /// Inner TCP SYNs to or from the peer's pods retried without an
    /// answer (SYN-ACK or RST): handshakes fail while other traffic may
    /// pass (the checksum-offload bug's signature).
    TcpSynUnanswered,
    /// The peer's tunnel packets carry wrong inner TCP or outer UDP
    /// checksums (the checksum-offload bug's cause).
    BadChecksum,
    /// Inner TCP handshakes with the peer's pods advertise an MSS whose
    /// full segments, encapsulated, exceed the interface's MTU (no MSS
    /// clamping on a tunnel with a smaller MTU).
    MssExceedsTunnel,
    /// A BGP session of the node's BIRD is not established.
    BgpDown,
    /// A BGP session re-established more often than the threshold.
    BgpFlap,
    /// Pod blocks that were routed to a node have no route here, and the
    /// node is still a BGP peer or exchanges traffic with this one.
    RouteMissing,
    /// One pod block routed via two nodes, or a blackhole beside a route
    /// for the same block.
    RouteConflict,
    /// A route, FDB or neighbour entry towards an address that is no
    /// longer a node: no BGP peer, not in the allow-set, no traffic.
    StaleRoute,
}

impl Kind {
    /// Every kind, in the order findings are listed (most decisive first).
    pub const ALL: [Kind; 16] = [
        Kind::OneWay,
        Kind::SnatSuspected,
        Kind::AllowSetDrop,
        Kind::DroppedAfterDecap,
        Kind::BadChecksum,
        Kind::TcpSynUnanswered,
        Kind::EncapMismatch,
        Kind::Mtu,
        Kind::MssExceedsTunnel,
        Kind::UnknownPeer,
        Kind::DropSpike,
        Kind::BgpDown,
        Kind::BgpFlap,
        Kind::RouteMissing,
        Kind::RouteConflict,
        Kind::StaleRoute,
    ];

    /// The name used in JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            Kind::OneWay => "one_way",
            Kind::SnatSuspected => "snat_suspected",
            Kind::AllowSetDrop => "allow_set_drop",
            Kind::EncapMismatch => "encap_mismatch",
            Kind::Mtu => "mtu",
            Kind::UnknownPeer => "unknown_peer",
            Kind::DropSpike => "drop_spike",
            Kind::DroppedAfterDecap => "dropped_after_decap",
            Kind::TcpSynUnanswered => "tcp_syn_unanswered",
            Kind::BadChecksum => "bad_checksum",
            Kind::MssExceedsTunnel => "mss_exceeds_tunnel",
            Kind::BgpDown => "bgp_down",
            Kind::BgpFlap => "bgp_flap",
            Kind::RouteMissing => "route_missing",
            Kind::RouteConflict => "route_conflict",
            Kind::StaleRoute => "stale_route",
        }
    }

    /// What the kind means, for the diagnosis write-up.
    pub fn meaning(self) -> &'static str {
        match self {
            Kind::OneWay => {
                "tunnel traffic crosses in one direction only: something on the path (or the peer) drops the other"
            }
            Kind::SnatSuspected => {
                "a router between the nodes rewrites the outer source address of tunnel packets"
            }
            Kind::AllowSetDrop => {
                "the data plane drops these tunnel packets because their source is not an allowed node"
            }
            Kind::EncapMismatch => {
                "the two ends disagree on the encapsulation: what the routes prescribe is not what is on the wire"
            }
            Kind::Mtu => "tunnel packets do not fit the path: large transfers stall or fragment",
            Kind::UnknownPeer => {
                "tunnel packets arrive from an address this node neither routes to nor allows"
            }
            Kind::DropSpike => "a large share of this peer's packets is dropped",
            Kind::DroppedAfterDecap => {
                "the overlay delivers these packets and this node drops them after decapsulation (conntrack, a policy, the reverse-path filter, a missing FDB or neighbour entry)"
            }
            Kind::TcpSynUnanswered => {
                "TCP connections between pods here and the peer's are not answered: SYNs are retried (at 1, 3, 7, 15, 31 s) while other traffic may pass"
            }
            Kind::BadChecksum => {
                "the peer's tunnel packets arrive with wrong checksums, which the receiving stack drops: its checksum offload for encapsulated packets is broken"
            }
            Kind::MssExceedsTunnel => {
                "TCP handshakes with the peer's pods promise segments the tunnel cannot carry whole: small requests work, large responses stall (no MSS clamping)"
            }
            Kind::BgpDown => {
                "the BGP session with this peer is down: its routes (pod blocks) are withdrawn here, and ours there"
            }
            Kind::BgpFlap => {
                "the BGP session with this peer keeps re-establishing: each time its routes are withdrawn and learnt again"
            }
            Kind::RouteMissing => {
                "this node lost its route to the peer's pod blocks: traffic to pods there goes nowhere (or by the default route) until the route returns"
            }
            Kind::RouteConflict => {
                "a pod block has two owners here: its packets go to either node (or are dropped), so its pods answer from one path and are silent on the other"
            }
            Kind::StaleRoute => {
                "the data plane still sends to an address that is no longer a node: traffic for those pods is lost until the entry is removed"
            }
        }
    }
}

/// Thresholds of the rules.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Span over which one-way traffic is judged and past which a quiet
    /// condition clears.
    pub window: Duration,
    /// Packets in one direction, over the window, before a missing other
    /// direction (or another encapsulation) counts.
    pub min_packets: u64,
    /// Drops per second of one peer that make a drop spike.
    pub drop_spike_pps: f64,
    /// Re-establishments of one BGP session, within `bgp_flap_window`,
    /// beyond which it is a `bgp_flap`.
    pub bgp_flaps: u32,
    /// Span over which BGP re-establishments are counted.
    pub bgp_flap_window: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            window: Duration::from_secs(5),
            min_packets: 5,
            drop_spike_pps: 5.0,
            bgp_flaps: 3,
            bgp_flap_window: Duration::from_secs(600),
        }
    }
}

/// What this node knows about its peers: the data plane's expected nodes,
/// its own addresses, the allow-sets, and the UDP ports that mean each
/// encapsulation.
#[derive(Debug, Clone, Default)]
pub struct Known {
    /// Expected peer nodes by underlay address (from the data plane).
    pub nodes: BTreeMap<IpAddr, ExpectedPeer>,
    /// This node's own addresses.
    pub local: BTreeSet<IpAddr>,
    /// Allowed sources (VXLAN, IPIP); `None` before they were read.
    pub allow: Option<facts::AllowSets>,
    /// The UDP ports the programs classify by, so that hints name the
    /// ports a firewall or NAT rule must match on this cluster, not the
    /// defaults.
    pub ports: PortConfig,
    /// The BGP sessions of the node's BIRD, as last read.
    pub bgp: Vec<BgpSession>,
    /// What the wire says of each BGP peer's session.
    pub bgp_wire: BTreeMap<IpAddr, WirePeer>,
    /// Pod blocks that were routed to a node and have no route now.
    pub missing_blocks: Vec<MissingBlock>,
    /// The routes of pod blocks now (from the data-plane view).
    pub blocks: Vec<BlockRoute>,
}

impl Known {
    /// The node whose pod block holds `addr` (longest prefix), with the block.
    pub fn node_owning(&self, addr: IpAddr) -> Option<(IpAddr, IpNet)> {
        longest_prefix(
            self.nodes
                .iter()
                .flat_map(|(node, n)| n.blocks.iter().map(move |b| (*b, (*node, *b)))),
            addr,
        )
    }

    /// Whether `addr` may send `proto` here: `None` when no allow-set is
    /// active for that encapsulation.
    fn allowed(&self, proto: Proto, addr: IpAddr) -> Option<bool> {
        let kind = SetKind::guarding(proto)?;
        let set = self.allow.as_ref()?.get(kind);
        if !set.active() {
            return None;
        }
        set.allows(addr)
    }

    fn is_node(&self, addr: IpAddr) -> bool {
        self.nodes.contains_key(&addr)
    }

    /// Whether `addr` is still a node by the node's own membership
    /// sources: `None` when it has none (no BGP sessions read, no active
    /// allow-set), else whether BIRD has a session with it or an
    /// allow-set admits it.
    fn still_a_node(&self, addr: IpAddr) -> Option<bool> {
        let allowed = [Proto::Vxlan, Proto::Ipip].map(|p| self.allowed(p, addr));
        if self.bgp.is_empty() && allowed.iter().all(Option::is_none) {
            return None;
        }
        Some(self.bgp.iter().any(|s| s.neighbor == Some(addr)) || allowed.contains(&Some(true)))
    }
}

/// The allow-set that admits `proto`, for the encapsulations that have one.
/// One problem with one peer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Anomaly {
    /// What is wrong.
    pub kind: Kind,
    /// The peer it is about (outer address).
    pub peer: IpAddr,
    /// Encapsulation concerned (its name in JSON).
    #[serde(serialize_with = "crate::model::facts::proto_name")]
    pub proto: Proto,
    /// When the condition was first seen.
    #[serde(serialize_with = "rfc3339")]
    pub since: SystemTime,
    /// Counts that show it (over the window unless the name says otherwise).
    pub evidence: BTreeMap<&'static str, Value>,
    /// One line saying what was measured.
    pub summary: String,
    /// One line saying what to do next.
    pub hint: String,
}

impl Anomaly {
    /// The node it is about: its peer, except for `snat_suspected`, which
    /// is about the node whose packets were rewritten (its `real_node`),
    /// not the router's address.
    pub fn node(&self) -> IpAddr {
        match self.kind {
            Kind::SnatSuspected => self
                .evidence
                .get("real_node")
                .and_then(Value::as_str)
                .and_then(|n| n.parse().ok())
                .unwrap_or(self.peer),
            _ => self.peer,
        }
    }
}

fn rfc3339<S: serde::Serializer>(at: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*at))
}

/// A change in the set of active anomalies.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A condition started.
    Raised(Anomaly),
    /// A condition ended after `duration`; the anomaly carries its last evidence.
    Cleared {
        /// The anomaly as last seen.
        anomaly: Anomaly,
        /// How long it lasted.
        duration: Duration,
    },
}

/// One anomaly of a bounded run (`observer diagnose`): its latest
/// evidence, whether it still holds, how long it lasted.
#[derive(Debug, Clone, Serialize)]
pub struct FindingRecord {
    /// The anomaly with its latest evidence.
    #[serde(flatten)]
    pub anomaly: Anomaly,
    /// Whether it still held at the end.
    pub active: bool,
    /// How long it lasted, when it ended during the run.
    pub duration_s: Option<f64>,
    /// What the kind means.
    pub meaning: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::facts::{AllowSets, Family, SetSource};

    #[test]
    fn a_family_without_a_set_is_not_judged() {
        let mut allow = AllowSets::default();
        allow.vxlan.add(
            SetSource::Ipset("cali40all-vxlan-net".into()),
            Some(Family::V4),
            ["10.0.0.1/32".parse().unwrap()],
        );
        let known = Known {
            allow: Some(allow),
            ..Known::default()
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(known.allowed(Proto::Vxlan, ip("10.0.0.1")), Some(true));
        assert_eq!(known.allowed(Proto::Vxlan, ip("10.0.0.2")), Some(false));
        // No IPv6 set: the programs do not check IPv6 sources, nor do we.
        assert_eq!(known.allowed(Proto::Vxlan, ip("fd00::1")), None);
        assert_eq!(known.allowed(Proto::Ipip, ip("10.0.0.2")), None);
    }
}
