//! The view model every renderer reads: [`Snapshot`], everything one
//! interval reports, and the helpers the renderers share to present it
//! (the `ts` timestamp, interface names, drops indexed by row and summed by
//! reason). Renderers (`lines`, `table`, `textfile`) take these from here,
//! never from one another.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    time::SystemTime,
};

use observer_common::{Direction, Proto};

use crate::model::{
    anomalies::{Anomaly, Event},
    bgp::BgpSession,
    bgp_wire::WireRow,
    crosscheck::NetfilterCheck,
    evidence::EvidenceCounts,
    hooks::Attachment,
    rows::{DropRow, KernelStats, Row},
};

/// Everything one interval reports.
pub struct Snapshot<'a> {
    /// Rows with totals and rates.
    pub rows: &'a [Row],
    /// Kernel self counters.
    pub stats: KernelStats,
    /// Rows the aggregator forgot (bound reached).
    pub rows_forgotten: u64,
    /// Intervals read a whole period or more late since the start (the
    /// process was starved or stopped, or an interval took too long).
    pub late_intervals: u64,
    /// Times the data-plane change notifications overran their socket
    /// (notifications lost, the data plane re-read in full).
    pub netlink_overruns: u64,
    /// Interface names by index.
    pub ifaces: &'a HashMap<u32, String>,
    /// Attachments, for the table header.
    pub attachments: &'a [Attachment],
    /// When the snapshot was taken.
    pub at: SystemTime,
    /// Last snapshot before exit: JSON prints every row, not only changed ones.
    pub is_final: bool,
    /// Drop rows.
    pub drops: &'a [DropRow],
    /// Netfilter rule counters beside the observer's.
    pub netfilter: &'a [NetfilterCheck],
    /// Anomalies raised or cleared during the interval (JSON lines).
    pub anomaly_events: &'a [Event],
    /// Anomalies active now (table).
    pub anomalies: &'a [&'a Anomaly],
    /// BGP sessions of the node's BIRD (table; JSON prints `bgp` lines
    /// when they change).
    pub bgp: &'a [BgpSession],
    /// BGP at the wire, totals since attach per (interface, direction,
    /// peer).
    pub bgp_wire: &'a [WireRow],
    /// Evidence capture's userspace counters, when it runs (the programs'
    /// are in `stats`).
    pub evidence: Option<EvidenceCounts>,
}

impl<'a> Snapshot<'a> {
    /// A snapshot of `rows` with every optional section empty (no
    /// attachments, drops, netfilter counters, anomalies, BGP, nothing
    /// forgotten or late): a caller names the sections it has with
    /// `Snapshot { drops: &d, ..Snapshot::new(...) }`. What every
    /// snapshot has is an argument, so that none is left to a default.
    pub fn new(
        rows: &'a [Row],
        stats: KernelStats,
        ifaces: &'a HashMap<u32, String>,
        at: SystemTime,
        is_final: bool,
    ) -> Snapshot<'a> {
        Snapshot {
            rows,
            stats,
            rows_forgotten: 0,
            late_intervals: 0,
            netlink_overruns: 0,
            ifaces,
            attachments: &[],
            at,
            is_final,
            drops: &[],
            netfilter: &[],
            anomaly_events: &[],
            anomalies: &[],
            bgp: &[],
            bgp_wire: &[],
            evidence: None,
        }
    }
}

/// RFC 3339 with milliseconds, as every line's `ts`.
pub fn timestamp(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// Drops by reason, keyed like the rx row they belong to.
type DropIndex<'a> = HashMap<(u32, Proto, Option<IpAddr>, u32), BTreeMap<&'a str, u64>>;

/// Indexes `drops` once per snapshot (rows times drops would be quadratic).
pub(super) fn index_drops(drops: &[DropRow]) -> DropIndex<'_> {
    let mut index = DropIndex::new();
    // path_mtu rows count packets this node sent: no received row owns them.
    for d in drops.iter().filter(|d| d.row.id.mtu.is_none()) {
        let id = &d.row.id;
        *index
            .entry((id.ifindex, id.proto, id.peer, id.vni))
            .or_default()
            .entry(d.reason.as_str())
            .or_default() += d.row.packets;
    }
    index
}

/// Drops by reason of `row` (rx rows only).
pub(super) fn drops_of<'a>(row: &Row, index: &DropIndex<'a>) -> BTreeMap<&'a str, u64> {
    if row.id.direction != Direction::Rx {
        return BTreeMap::new();
    }
    index
        .get(&(row.id.ifindex, row.id.proto, row.id.peer, row.id.vni))
        .cloned()
        .unwrap_or_default()
}

/// Per (origin, reason): packets and distinct peers.
pub(super) fn drop_summary(
    drops: &[DropRow],
) -> BTreeMap<(&'static str, &str), (u64, usize, bool)> {
    let mut summary: BTreeMap<(&'static str, &str), (u64, usize, bool)> = BTreeMap::new();
    for d in drops {
        let entry = summary
            .entry((d.row.id.origin.name(), d.reason.as_str()))
            .or_default();
        entry.0 += d.row.packets;
        entry.1 += 1;
        entry.2 |= d.row.changed();
    }
    summary
}

/// The name of interface `ifindex`, `if<ifindex>` when `ifaces` lacks it.
pub fn iface_name(ifaces: &HashMap<u32, String>, ifindex: u32) -> String {
    ifaces
        .get(&ifindex)
        .cloned()
        .unwrap_or_else(|| format!("if{ifindex}"))
}
