//! Rows summed per tunnel (peer, encapsulation), counted as the rules
//! count them: this node's own addresses left out, drops split by what
//! they say (allow-set, netfilter, MTU), and what a read tells beyond
//! counts (inner source, reported path MTU, drop reasons).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use foldhash::HashMap;
use observer_common::{ClassifierDrop, Direction, Proto};

use super::Key;
use crate::model::rows::{DropRow, Origin, Row};

/// Kernel drop reason of netfilter's DROP verdict (Calico's rules).
const NETFILTER_DROP: &str = "NETFILTER_DROP";

/// Totals of one (peer, encapsulation) at one read; all since attach.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Totals {
    pub(super) tx: u64,
    pub(super) rx: u64,
    /// Classifier `calico_allow_set`.
    pub(super) allow_set: u64,
    /// Kernel NETFILTER_DROP.
    pub(super) netfilter: u64,
    pub(super) over_mtu: u64,
    pub(super) outer_fragment: u64,
    pub(super) path_mtu: u64,
    /// Drops the kernel reported, whatever the reason.
    pub(super) kernel_drops: u64,
    /// Drops the classifier predicts (every reason but outer_fragment,
    /// which is no drop by itself).
    pub(super) classifier_drops: u64,
}

impl Totals {
    pub(super) fn minus(&self, base: &Totals) -> Totals {
        Totals {
            tx: self.tx.saturating_sub(base.tx),
            rx: self.rx.saturating_sub(base.rx),
            allow_set: self.allow_set.saturating_sub(base.allow_set),
            netfilter: self.netfilter.saturating_sub(base.netfilter),
            over_mtu: self.over_mtu.saturating_sub(base.over_mtu),
            outer_fragment: self.outer_fragment.saturating_sub(base.outer_fragment),
            path_mtu: self.path_mtu.saturating_sub(base.path_mtu),
            kernel_drops: self.kernel_drops.saturating_sub(base.kernel_drops),
            classifier_drops: self.classifier_drops.saturating_sub(base.classifier_drops),
        }
    }

    /// Packets dropped: the kernel and the classifier usually see the same
    /// packets (a flagged source, then netfilter's DROP), so the larger of
    /// the two rather than their sum.
    pub(super) fn drops(&self) -> u64 {
        self.kernel_drops.max(self.classifier_drops)
    }
}

/// What one read says about one (peer, encapsulation) beyond counts.
#[derive(Debug, Clone, Default)]
pub(super) struct Extra {
    /// Latest inner source seen from the peer.
    pub(super) inner_src: Option<IpAddr>,
    /// Lowest next-hop MTU routers reported.
    pub(super) path_mtu: Option<u32>,
    /// Drops by reason name, since attach.
    pub(super) reasons: BTreeMap<String, u64>,
}

/// Packets sent, received and dropped per tunnel (peer, encapsulation)
/// since attach, counted as the rules count them: this node's own
/// addresses left out, and a packet both flagged by the classifier and
/// dropped by the kernel counted once.
pub fn peer_totals(
    rows: &[Row],
    drops: &[DropRow],
    local: &BTreeSet<IpAddr>,
) -> BTreeMap<(IpAddr, Proto), (u64, u64, u64)> {
    collect(rows, drops, local)
        .0
        .into_iter()
        .filter(|((_, proto), _)| *proto != Proto::Other)
        .map(|(key, t)| (key, (t.tx, t.rx, t.drops())))
        .filter(|(_, counts)| *counts != (0, 0, 0))
        .collect()
}

/// Sums rows and drop rows per (peer, encapsulation), skipping rows
/// without a peer and this node's own addresses.
pub(super) fn collect(
    rows: &[Row],
    drops: &[DropRow],
    local: &BTreeSet<IpAddr>,
) -> (HashMap<Key, Totals>, HashMap<Key, Extra>) {
    let mut totals: HashMap<Key, Totals> = HashMap::default();
    let mut extras: HashMap<Key, Extra> = HashMap::default();
    for row in rows {
        let Some(peer) = row.id.peer else { continue };
        if row.id.proto == Proto::Other || local.contains(&peer) {
            continue;
        }
        let key = (peer, row.id.proto);
        let t = totals.entry(key).or_default();
        match row.id.direction {
            Direction::Tx => t.tx += row.packets,
            Direction::Rx => {
                t.rx += row.packets;
                if let Some((src, _)) = row.inner {
                    extras.entry(key).or_default().inner_src = Some(src);
                }
            }
        }
    }
    for drop in drops {
        let Some(peer) = drop.row.id.peer else {
            continue;
        };
        if local.contains(&peer) {
            continue;
        }
        let id = &drop.row.id;
        let key = (peer, id.proto);
        let packets = drop.row.packets;
        let t = totals.entry(key).or_default();
        let classifier = match id.origin {
            Origin::Classifier => ClassifierDrop::from_u16(id.reason as u16),
            Origin::Kernel => None,
        };
        match (id.origin, classifier) {
            (Origin::Kernel, _) => t.kernel_drops += packets,
            (_, Some(ClassifierDrop::OuterFragment)) => {}
            _ => t.classifier_drops += packets,
        }
        match classifier {
            Some(ClassifierDrop::CalicoAllowSet) => t.allow_set += packets,
            Some(ClassifierDrop::OverMtu) => t.over_mtu += packets,
            Some(ClassifierDrop::OuterFragment) => t.outer_fragment += packets,
            Some(ClassifierDrop::PathMtu) => t.path_mtu += packets,
            _ if drop.reason == NETFILTER_DROP => t.netfilter += packets,
            _ => {}
        }
        let extra = extras.entry(key).or_default();
        *extra.reasons.entry(drop.reason.clone()).or_default() += packets;
        if classifier == Some(ClassifierDrop::PathMtu) {
            // Routers on the path may report different MTUs: only the
            // lowest fits them all.
            if let Some(mtu) = id.mtu {
                extra.path_mtu = Some(extra.path_mtu.map_or(mtu, |m| m.min(mtu)));
            }
        }
    }
    (totals, extras)
}

#[cfg(test)]
mod tests {
    use observer_common::{ClassifierDrop, Direction, Proto};

    use super::*;
    use crate::model::{
        anomalies::fixtures::{drop, flow, ip},
        rows::testing,
    };

    #[test]
    fn peer_totals_count_a_flagged_and_dropped_packet_once() {
        let kernel = testing::drop_row(
            testing::drop_id("10.10.10.244", Origin::Kernel, 12),
            10,
            NETFILTER_DROP,
        );
        let totals = peer_totals(
            &[
                flow("10.10.10.244", Proto::Vxlan, Direction::Rx, 10),
                flow("10.10.60.127", Proto::Vxlan, Direction::Tx, 7),
                // This node's own address and plain IP are no tunnels.
                flow("10.10.10.62", Proto::Vxlan, Direction::Rx, 3),
                flow("10.10.60.127", Proto::Other, Direction::Rx, 3),
            ],
            &[
                kernel,
                drop(
                    "10.10.10.244",
                    Proto::Vxlan,
                    ClassifierDrop::CalicoAllowSet,
                    10,
                    4096,
                ),
            ],
            &BTreeSet::from([ip("10.10.10.62")]),
        );
        assert_eq!(
            totals,
            BTreeMap::from([
                ((ip("10.10.10.244"), Proto::Vxlan), (0, 10, 10)),
                ((ip("10.10.60.127"), Proto::Vxlan), (7, 0, 0)),
            ])
        );
    }

    #[test]
    fn drops_are_split_by_what_they_say() {
        let (totals, extras) = collect(
            &[],
            &[
                drop(
                    "10.10.60.209",
                    Proto::Ipip,
                    ClassifierDrop::PathMtu,
                    2,
                    1400,
                ),
                drop(
                    "10.10.60.209",
                    Proto::Ipip,
                    ClassifierDrop::PathMtu,
                    1,
                    1300,
                ),
                drop(
                    "10.10.60.209",
                    Proto::Ipip,
                    ClassifierDrop::OuterFragment,
                    4,
                    0,
                ),
            ],
            &BTreeSet::new(),
        );
        let key = (ip("10.10.60.209"), Proto::Ipip);
        let t = totals[&key];
        assert_eq!((t.path_mtu, t.outer_fragment), (3, 4));
        // A fragment is no drop by itself.
        assert_eq!(t.drops(), 3);
        // The lowest MTU a router reported.
        assert_eq!(extras[&key].path_mtu, Some(1300));
    }
}
