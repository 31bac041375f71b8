//! One verdict per node pair (this node and one peer) for `diagnose`:
//! route loss, policy drop, MTU, or healthy, with the findings that say
//! so. It answers the second incident's question ("the service answers
//! from one node and is silent from another": a lost route, a policy
//! drop, or an MTU problem?) from the run's findings alone.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use serde::Serialize;

use crate::model::anomalies::{FindingRecord, Kind};

/// What is wrong between this node and one peer, most decisive first:
/// without a route nothing else is tried, a policy drop does not depend
/// on the packet, an MTU problem only hits large packets, one-way traffic
/// and loss say where, not why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The peer's pod blocks lost their route here, or its BGP session
    /// went down or flapped, or the routes towards it are wrong
    /// (`route_missing`, `bgp_down`, `bgp_flap`, `route_conflict`,
    /// `stale_route`).
    RouteLoss,
    /// Its packets are dropped by policy: Calico's allow-set or a DROP
    /// rule, also after a router rewrote their source (`allow_set_drop`,
    /// `snat_suspected`).
    PolicyDrop,
    /// Its packets arrive and this node drops them after decapsulation
    /// (`dropped_after_decap`): conntrack, a policy, the reverse-path
    /// filter, a missing FDB or neighbour entry.
    AfterDecap,
    /// Its tunnel packets do not fit the path (`mtu`), or TCP handshakes
    /// promise segments that do not (`mss_exceeds_tunnel`).
    Mtu,
    /// TCP handshakes with its pods go unanswered while the tunnel
    /// carries other traffic (`tcp_syn_unanswered`), or its packets carry
    /// wrong checksums (`bad_checksum`).
    TcpHandshake,
    /// Tunnel packets go one way and nothing comes back (`one_way`; in
    /// `observer cluster`: sent by one node, none received by the other).
    OneWay,
    /// Part of what one node sends never reaches the other, or is dropped
    /// there (`observer cluster` only: it compares both nodes' counts).
    Loss,
    /// Something else is wrong (`encap_mismatch`, `unknown_peer`,
    /// `drop_spike` alone): see the findings.
    Other,
    /// No finding for it.
    Healthy,
}

impl Verdict {
    /// The verdict a finding of `kind` supports.
    pub fn of(kind: Kind) -> Verdict {
        match kind {
            Kind::RouteMissing
            | Kind::BgpDown
            | Kind::BgpFlap
            | Kind::RouteConflict
            | Kind::StaleRoute => Verdict::RouteLoss,
            Kind::AllowSetDrop | Kind::SnatSuspected => Verdict::PolicyDrop,
            Kind::DroppedAfterDecap => Verdict::AfterDecap,
            Kind::Mtu | Kind::MssExceedsTunnel => Verdict::Mtu,
            Kind::TcpSynUnanswered | Kind::BadChecksum => Verdict::TcpHandshake,
            Kind::OneWay => Verdict::OneWay,
            Kind::EncapMismatch | Kind::UnknownPeer | Kind::DropSpike => Verdict::Other,
        }
    }

    /// The words of the write-up.
    pub fn words(self) -> &'static str {
        match self {
            Verdict::RouteLoss => "route loss",
            Verdict::PolicyDrop => "policy drop",
            Verdict::AfterDecap => "dropped after decapsulation",
            Verdict::Mtu => "MTU",
            Verdict::TcpHandshake => "TCP handshakes fail",
            Verdict::OneWay => "one-way",
            Verdict::Loss => "loss",
            Verdict::Other => "other",
            Verdict::Healthy => "healthy",
        }
    }
}

/// The verdict for one peer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairVerdict {
    /// The peer node (underlay address).
    pub peer: IpAddr,
    /// What is wrong between this node and it.
    pub verdict: Verdict,
    /// The kinds of the findings about it, in `Kind::ALL`'s order.
    pub kinds: Vec<&'static str>,
    /// How long the longest of them lasted, when all of them cleared.
    pub longest_s: Option<f64>,
    /// Whether one still held at the end.
    pub active: bool,
}

/// One verdict per peer in `peers` and per node a finding is about
/// ([`Anomaly::node`](crate::model::anomalies::Anomaly::node)).
pub fn verdicts(
    findings: &[&FindingRecord],
    peers: impl IntoIterator<Item = IpAddr>,
) -> Vec<PairVerdict> {
    let mut by_peer: BTreeMap<IpAddr, Vec<&FindingRecord>> =
        peers.into_iter().map(|p| (p, Vec::new())).collect();
    for f in findings {
        by_peer.entry(f.anomaly.node()).or_default().push(f);
    }
    by_peer
        .into_iter()
        .map(|(peer, found)| {
            let verdict = found
                .iter()
                .map(|f| Verdict::of(f.anomaly.kind))
                .min()
                .unwrap_or(Verdict::Healthy);
            let kinds: BTreeSet<Kind> = found.iter().map(|f| f.anomaly.kind).collect();
            let active = found.iter().any(|f| f.active);
            PairVerdict {
                peer,
                verdict,
                kinds: kinds.into_iter().map(Kind::name).collect(),
                longest_s: if active {
                    None
                } else {
                    found.iter().filter_map(|f| f.duration_s).reduce(f64::max)
                },
                active,
            }
        })
        .collect()
}

/// The share of the tunnel packets received from a peer that were
/// dropped here (`dropped / received`), over a run where packets went both
/// ways (`sent` and `received` above 0): the rollout-loss figure of the
/// second incident, per node pair. `None` for one-way traffic, where the
/// share says nothing about the pair (a one-way finding does).
pub fn loss(sent: u64, received: u64, dropped: u64) -> Option<f64> {
    (sent > 0 && received > 0).then(|| dropped as f64 / received as f64)
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use observer_common::Proto;
    use serde_json::json;

    use super::*;
    use crate::model::anomalies::Anomaly;

    fn finding(kind: Kind, peer: &str, duration: Option<f64>) -> FindingRecord {
        FindingRecord {
            anomaly: Anomaly {
                kind,
                peer: peer.parse().unwrap(),
                proto: Proto::Vxlan,
                since: SystemTime::UNIX_EPOCH,
                evidence: BTreeMap::from([("real_node", json!("10.10.60.127"))]),
                summary: String::new(),
                hint: String::new(),
            },
            active: duration.is_none(),
            duration_s: duration,
            meaning: kind.meaning(),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn each_peer_gets_its_most_decisive_verdict() {
        let found = [
            // The incident at the GPU node: .244 is the router, .127 the
            // node behind it.
            finding(Kind::SnatSuspected, "10.10.10.244", None),
            finding(Kind::AllowSetDrop, "10.10.10.244", None),
            finding(Kind::OneWay, "10.10.60.127", None),
            // A node whose BIRD went down and came back, and also MTU.
            finding(Kind::Mtu, "10.99.0.4", Some(3.0)),
            finding(Kind::RouteMissing, "10.99.0.4", Some(12.0)),
            finding(Kind::BgpDown, "10.99.0.4", Some(13.0)),
            finding(Kind::EncapMismatch, "10.99.0.5", Some(1.0)),
        ];
        let refs: Vec<&FindingRecord> = found.iter().collect();
        let verdicts = verdicts(&refs, [ip("10.99.0.2"), ip("10.99.0.4")]);
        // One line per peer: peer, verdict, kinds, longest, active.
        let summary: Vec<String> = verdicts
            .into_iter()
            .map(|v| {
                format!(
                    "{} {:?} [{}] {:?} {}",
                    v.peer,
                    v.verdict,
                    v.kinds.join(" "),
                    v.longest_s,
                    v.active
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                "10.10.10.244 PolicyDrop [allow_set_drop] None true",
                "10.10.60.127 PolicyDrop [one_way snat_suspected] None true",
                "10.99.0.2 Healthy [] None false",
                "10.99.0.4 RouteLoss [mtu bgp_down route_missing] Some(13.0) false",
                "10.99.0.5 Other [encap_mismatch] Some(1.0) false",
            ]
        );
    }

    #[test]
    fn loss_is_the_dropped_share_of_what_came_in_when_both_ways_moved() {
        assert_eq!(loss(100, 20_000, 10), Some(0.0005));
        assert_eq!(loss(100, 200, 0), Some(0.0));
        assert_eq!(loss(0, 200, 200), None, "received only");
        assert_eq!(loss(25, 0, 0), None, "sent only");
    }

    #[test]
    fn every_kind_supports_a_verdict_and_serializes_by_name() {
        for kind in Kind::ALL {
            assert_ne!(Verdict::of(kind), Verdict::Healthy, "{kind:?}");
        }
        assert_eq!(
            serde_json::to_value(Verdict::RouteLoss).unwrap(),
            "route_loss"
        );
    }
}
