//! Rows summed per tunnel (peer, encapsulation), counted as the rules
//! count them: this node's own addresses left out, drops split by what
//! they say (allow-set, netfilter, MTU), and what a read tells beyond
//! counts (inner source, reported path MTU, drop reasons).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use foldhash::HashMap;
use observer_common::{ClassifierDrop, Direction, Proto, TcpCounts};
use smallvec::SmallVec;

use super::Key;
use crate::model::rows::{DropRow, Origin, Row};

/// Kernel drop reason of netfilter's DROP verdict (Calico's rules).
const NETFILTER_DROP: &str = "NETFILTER_DROP";

/// Packets of one (peer, encapsulation), by what they say: since attach
/// when summed from rows ([`collect`]), since the pair was first tracked
/// in the engine's samples.
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
    /// Kernel drops after decapsulation (stage tunnel or pod): part of
    /// `kernel_drops`, never of `netfilter` (not the allow-set's rules).
    pub(super) after_decap: u64,
    /// Inner TCP SYNs sent to the peer's pods, and received from them.
    pub(super) syn_tx: u64,
    pub(super) syn_rx: u64,
    /// Answers to SYNs (SYN-ACKs and RSTs) sent to the peer, and received.
    pub(super) answers_tx: u64,
    pub(super) answers_rx: u64,
    /// SYNs and SYN-ACKs either way whose MSS the tunnel cannot carry.
    pub(super) mss_over: u64,
    /// Packets with a wrong inner TCP or outer UDP checksum.
    pub(super) bad_checksum: u64,
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
            after_decap: self.after_decap.saturating_sub(base.after_decap),
            syn_tx: self.syn_tx.saturating_sub(base.syn_tx),
            syn_rx: self.syn_rx.saturating_sub(base.syn_rx),
            answers_tx: self.answers_tx.saturating_sub(base.answers_tx),
            answers_rx: self.answers_rx.saturating_sub(base.answers_rx),
            mss_over: self.mss_over.saturating_sub(base.mss_over),
            bad_checksum: self.bad_checksum.saturating_sub(base.bad_checksum),
        }
    }

    /// Adds `packets` of a flow row, and its inner TCP signals `tcp`.
    fn add_flow(&mut self, direction: Direction, packets: u64, tcp: &TcpCounts) {
        let answers = tcp.syn_ack + tcp.rst;
        match direction {
            Direction::Tx => {
                self.tx += packets;
                self.syn_tx += tcp.syn;
                self.answers_tx += answers;
            }
            Direction::Rx => {
                self.rx += packets;
                self.syn_rx += tcp.syn;
                self.answers_rx += answers;
            }
        }
        self.mss_over += tcp.mss_over;
    }

    /// Adds `packets` of a drop row of `origin` (`classifier`: its
    /// classifier reason; `netfilter`: its reason is netfilter's DROP).
    fn add_drop(
        &mut self,
        origin: Origin,
        classifier: Option<ClassifierDrop>,
        netfilter: bool,
        packets: u64,
    ) {
        match (origin, classifier) {
            (Origin::Kernel, _) => self.kernel_drops += packets,
            (_, Some(ClassifierDrop::OuterFragment | ClassifierDrop::ZeroUdpChecksum)) => {}
            _ => self.classifier_drops += packets,
        }
        match classifier {
            Some(ClassifierDrop::CalicoAllowSet) => self.allow_set += packets,
            Some(ClassifierDrop::OverMtu) => self.over_mtu += packets,
            Some(ClassifierDrop::OuterFragment) => self.outer_fragment += packets,
            Some(ClassifierDrop::PathMtu) => self.path_mtu += packets,
            Some(ClassifierDrop::BadInnerChecksum | ClassifierDrop::BadOuterChecksum) => {
                self.bad_checksum += packets
            }
            _ if netfilter => self.netfilter += packets,
            _ => {}
        }
    }

    /// Packets dropped: the kernel and the classifier usually see the same
    /// packets (a flagged source, then netfilter's DROP), so the larger of
    /// the two rather than their sum.
    pub(super) fn drops(&self) -> u64 {
        self.kernel_drops.max(self.classifier_drops)
    }
}

/// What the rows say about one (peer, encapsulation) beyond counts.
#[derive(Debug, Clone, Default)]
pub(super) struct Extra {
    /// Latest inner source seen from the peer.
    pub(super) inner_src: Option<IpAddr>,
    /// What its drop rows say; boxed, as most tunnels have none (one is
    /// kept per tracked tunnel).
    drops: Option<Box<DropFacts>>,
}

/// What a tunnel's drop rows say.
#[derive(Debug, Clone, Default)]
struct DropFacts {
    /// Lowest next-hop MTU routers reported.
    path_mtu: Option<u32>,
    /// Drops by reason name, over the packets summed, in first-seen
    /// order: a tunnel's drops have one or two reasons, and one is kept per
    /// tracked tunnel (a map's node was most of the memory of 57,344
    /// tracked sources dropped by an allow-set).
    reasons: SmallVec<[(Box<str>, u64); 1]>,
    /// Drops after decapsulation, in first-seen order.
    after_decap: SmallVec<[PlaceCount; 1]>,
}

/// Drops after decapsulation of one (reason, where: `DropRow::place`),
/// over the packets summed.
type PlaceCount = (Box<str>, Box<str>, u64);

impl Extra {
    /// Lowest next-hop MTU routers reported.
    pub(super) fn path_mtu(&self) -> Option<u32> {
        self.drops.as_ref()?.path_mtu
    }

    /// Drops by reason name.
    pub(super) fn reasons(&self) -> impl Iterator<Item = (&str, u64)> {
        self.drops
            .iter()
            .flat_map(|d| d.reasons.iter().map(|(r, n)| (&**r, *n)))
    }

    /// Drops after decapsulation by (reason, where).
    pub(super) fn after_decap(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.drops
            .iter()
            .flat_map(|d| d.after_decap.iter().map(|(r, w, n)| (&**r, &**w, *n)))
    }
}

/// One row's part in its tunnel's counts, before choosing which of its
/// packets to count (since attach, or in the last interval).
pub(super) struct Part<'a> {
    /// The tunnel.
    pub(super) key: Key,
    what: What<'a>,
    /// Packets since attach.
    pub(super) packets: u64,
    /// Packets counted in the last interval.
    pub(super) interval_packets: u64,
}

/// Which of a row's counts a [`Part`] adds.
#[derive(Clone, Copy)]
pub(super) enum Span {
    /// Since attach.
    Attach,
    /// The last interval.
    Interval,
}

/// Which counters a row adds to.
enum What<'a> {
    Flow {
        direction: Direction,
        inner_src: Option<IpAddr>,
        /// Inner TCP signals since attach, and in the last interval.
        tcp: &'a TcpCounts,
        interval_tcp: &'a TcpCounts,
    },
    Drop {
        origin: Origin,
        classifier: Option<ClassifierDrop>,
        reason: &'a str,
        mtu: Option<u32>,
        /// After decapsulation: where (`DropRow::place`).
        place: Option<&'a str>,
    },
}

impl Part<'_> {
    /// Adds this row's counts over `span` to `t`, and what it says to
    /// `extra`.
    pub(super) fn add(&self, span: Span, t: &mut Totals, extra: &mut Extra) {
        let packets = match span {
            Span::Attach => self.packets,
            Span::Interval => self.interval_packets,
        };
        match self.what {
            What::Flow {
                direction,
                inner_src,
                tcp,
                interval_tcp,
            } => {
                let tcp = match span {
                    Span::Attach => tcp,
                    Span::Interval => interval_tcp,
                };
                t.add_flow(direction, packets, tcp);
                if inner_src.is_some() {
                    extra.inner_src = inner_src;
                }
            }
            What::Drop {
                origin,
                classifier,
                reason,
                mtu,
                place,
            } => {
                // Netfilter after decapsulation is not the allow-set's
                // rules (those drop the tunnel packets themselves).
                let netfilter = reason == NETFILTER_DROP && place.is_none();
                t.add_drop(origin, classifier, netfilter, packets);
                let facts = extra.drops.get_or_insert_with(Box::default);
                if let Some(place) = place {
                    t.after_decap += packets;
                    let found = facts
                        .after_decap
                        .iter_mut()
                        .find(|(r, w, _)| **r == *reason && **w == *place);
                    match found {
                        Some((_, _, n)) => *n += packets,
                        None => facts
                            .after_decap
                            .push((reason.into(), place.into(), packets)),
                    }
                }
                match facts.reasons.iter_mut().find(|(r, _)| **r == *reason) {
                    Some((_, n)) => *n += packets,
                    None => facts.reasons.push((reason.into(), packets)),
                }
                // Routers on the path may report different MTUs: only the
                // lowest fits them all.
                if let (Some(ClassifierDrop::PathMtu), Some(mtu)) = (classifier, mtu) {
                    facts.path_mtu = Some(facts.path_mtu.map_or(mtu, |m| m.min(mtu)));
                }
            }
        }
    }
}

/// Every row and drop row that counts for a tunnel, as [`Part`]s: rows
/// without a peer, this node's own addresses and plain IP flows left out
/// (drops of plain IP stay: they can spike).
pub(super) fn tunnel_parts<'a>(
    rows: impl Iterator<Item = &'a Row>,
    drops: impl Iterator<Item = &'a DropRow>,
    local: &'a BTreeSet<IpAddr>,
) -> impl Iterator<Item = Part<'a>> {
    let flows = rows.filter_map(move |row| {
        let peer = row.id.peer?;
        if row.id.proto == Proto::Other || local.contains(&peer) {
            return None;
        }
        Some(Part {
            key: (peer, row.id.proto),
            what: What::Flow {
                direction: row.id.direction,
                inner_src: match row.id.direction {
                    Direction::Rx => row.inner.map(|(src, _)| src),
                    Direction::Tx => None,
                },
                tcp: &row.tcp,
                interval_tcp: &row.interval_tcp,
            },
            packets: row.packets,
            interval_packets: row.interval_packets,
        })
    });
    let drops = drops.filter_map(move |drop| {
        let id = &drop.row.id;
        let peer = id.peer?;
        if local.contains(&peer) {
            return None;
        }
        Some(Part {
            key: (peer, id.proto),
            what: What::Drop {
                origin: id.origin,
                classifier: match id.origin {
                    Origin::Classifier => ClassifierDrop::from_u16(id.reason as u16),
                    Origin::Kernel => None,
                },
                reason: &drop.reason,
                mtu: id.mtu,
                place: drop.place.as_deref(),
            },
            packets: drop.row.packets,
            interval_packets: drop.row.interval_packets,
        })
    });
    flows.chain(drops)
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
        .into_iter()
        .filter(|((_, proto), _)| *proto != Proto::Other)
        .map(|(key, (t, _))| (key, (t.tx, t.rx, t.drops())))
        .filter(|(_, counts)| *counts != (0, 0, 0))
        .collect()
}

/// Rows and drop rows summed per tunnel since attach.
pub(super) fn collect(
    rows: &[Row],
    drops: &[DropRow],
    local: &BTreeSet<IpAddr>,
) -> HashMap<Key, (Totals, Extra)> {
    let mut tunnels: HashMap<Key, (Totals, Extra)> = HashMap::default();
    for part in tunnel_parts(rows.iter(), drops.iter(), local) {
        let (t, extra) = tunnels.entry(part.key).or_default();
        part.add(Span::Attach, t, extra);
    }
    tunnels
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
        let tunnels = collect(
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
        let (t, extra) = &tunnels[&key];
        assert_eq!((t.path_mtu, t.outer_fragment), (3, 4));
        // A fragment is no drop by itself.
        assert_eq!(t.drops(), 3);
        // The lowest MTU a router reported.
        assert_eq!(extra.path_mtu(), Some(1300));
    }
}
