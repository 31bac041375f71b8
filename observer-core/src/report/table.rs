//! The table for people: one screen per interval, redrawn on a terminal.

use std::{
    collections::BTreeMap,
    io::{self, Write},
};

use observer_common::{Proto, Unclassified};

use super::view::{Snapshot, drop_summary, drops_of, iface_name, index_drops, timestamp};
use crate::model::{
    anomalies::Anomaly,
    bgp::BgpSession,
    crosscheck::NetfilterCheck,
    evidence::EvidenceCounts,
    rows::Row,
    rows::{DropRow, KernelStats, by_rate, direction_name},
};

/// Rows shown in the table before "(N more)".
const TABLE_ROWS: usize = 40;

/// Writes one interval as a table; `clear` redraws the screen (terminal).
pub fn write_table(out: &mut impl Write, snap: &Snapshot<'_>, clear: bool) -> io::Result<()> {
    if clear {
        write!(out, "\x1b[2J\x1b[H")?;
    }
    write_header(out, snap)?;
    let peers = peers_by_rate(snap.rows);
    write_peers(out, snap, &peers)?;
    write_totals(out, &peers)?;
    write_unclassified(out, snap)?;
    write_drops(out, snap)?;
    write_netfilter(out, snap.netfilter)?;
    write_bgp(out, snap.bgp)?;
    write_bgp_wire(out, snap)?;
    write_anomalies(out, snap.anomalies)?;
    write_kernel_stats(out, &snap.stats)?;
    if let Some(counts) = &snap.evidence {
        write_evidence(out, &snap.stats, counts)?;
    }
    out.flush()
}

/// The time of the interval and how each interface is attached.
fn write_header(out: &mut impl Write, snap: &Snapshot<'_>) -> io::Result<()> {
    writeln!(out, "observer  {}", timestamp(snap.at))?;
    for a in snap.attachments {
        writeln!(
            out,
            "  {} (ifindex {}): rx via {}, tx via {}",
            a.iface, a.ifindex, a.rx, a.tx
        )?;
    }
    Ok(())
}

/// The peer rows (classified rows), the top [`TABLE_ROWS`] first and in
/// order; the rest after them in no order.
fn peers_by_rate(rows: &[Row]) -> Vec<&Row> {
    let mut peers: Vec<&Row> = rows
        .iter()
        .filter(|r| r.id.reason == Unclassified::None)
        .collect();
    // The top rows only: a selection, then a sort of what is shown.
    let shown = peers.len().min(TABLE_ROWS);
    if peers.len() > TABLE_ROWS {
        peers.select_nth_unstable_by(TABLE_ROWS, |a, b| by_rate(a, b));
    }
    peers[..shown].sort_by(|a, b| by_rate(a, b));
    peers
}

/// The column headings, then the top [`TABLE_ROWS`] of `peers` (from
/// [`peers_by_rate`]) with their drops, then how many are not shown.
fn write_peers(out: &mut impl Write, snap: &Snapshot<'_>, peers: &[&Row]) -> io::Result<()> {
    writeln!(
        out,
        "\n{:<10} {:<3} {:<10} {:<39} {:>8} {:>9} {:>9} {:>12} {:>12}  INNER SAMPLE",
        "IFACE", "DIR", "PROTO", "PEER", "VNI", "PKT/S", "BIT/S", "PACKETS", "BYTES"
    )?;
    let drop_index = index_drops(snap.drops);
    for row in peers.iter().take(TABLE_ROWS) {
        let peer = row
            .id
            .peer
            .map_or("(all non-tunnel IP)".to_string(), |p| p.to_string());
        let vni = if row.id.vni != 0
            || matches!(row.id.proto, Proto::Vxlan | Proto::Geneve | Proto::VxlanGpe)
        {
            row.id.vni.to_string()
        } else {
            "-".to_string()
        };
        let mut inner = row
            .inner
            .map_or(String::new(), |(s, d)| format!("{s} > {d}"));
        let drops = drops_of(row, &drop_index);
        if !drops.is_empty() {
            let list: Vec<String> = drops.iter().map(|(r, n)| format!("{r}={n}")).collect();
            inner.push_str(&format!("  DROPS {}", list.join(",")));
        }
        writeln!(
            out,
            "{:<10} {:<3} {:<10} {:<39} {:>8} {:>9} {:>9} {:>12} {:>12}  {}",
            iface_name(snap.ifaces, row.id.ifindex),
            direction_name(row.id.direction),
            row.id.proto.name(),
            peer,
            vni,
            si(row.pps),
            si(row.bps),
            row.packets,
            row.bytes,
            inner
        )?;
    }
    if peers.len() > TABLE_ROWS {
        writeln!(
            out,
            "({} more rows; use --output json for all)",
            peers.len() - TABLE_ROWS
        )?;
    }
    Ok(())
}

/// Totals per direction and protocol over every peer row, shown or not.
fn write_totals(out: &mut impl Write, peers: &[&Row]) -> io::Result<()> {
    let mut totals: BTreeMap<(&str, &str), (u64, u64, f64, f64)> = BTreeMap::new();
    for row in peers {
        let entry = totals
            .entry((direction_name(row.id.direction), row.id.proto.name()))
            .or_default();
        entry.0 += row.packets;
        entry.1 += row.bytes;
        entry.2 += row.pps;
        entry.3 += row.bps;
    }
    writeln!(out, "\nTOTALS")?;
    for ((direction, proto), (packets, bytes, pps, bps)) in totals {
        writeln!(
            out,
            "  {direction:<3} {proto:<10} {:>9} pkt/s {:>9} bit/s {packets:>12} packets {bytes:>14} bytes",
            si(pps),
            si(bps)
        )?;
    }
    Ok(())
}

/// Frames that could not be parsed, by reason (nothing when none).
fn write_unclassified(out: &mut impl Write, snap: &Snapshot<'_>) -> io::Result<()> {
    let mut unclassified: Vec<&Row> = snap
        .rows
        .iter()
        .filter(|r| r.id.reason != Unclassified::None)
        .collect();
    unclassified.sort_by(|a, b| by_rate(a, b));
    if !unclassified.is_empty() {
        writeln!(out, "\nUNCLASSIFIED FRAMES")?;
        for row in unclassified {
            writeln!(
                out,
                "  {:<10} {:<3} {:<16} {:>12} packets",
                iface_name(snap.ifaces, row.id.ifindex),
                direction_name(row.id.direction),
                row.id.reason.name(),
                row.packets
            )?;
        }
    }
    Ok(())
}

/// The top [`TABLE_ROWS`] drop rows by packets, then the total of each
/// reason (nothing when no drops).
fn write_drops(out: &mut impl Write, snap: &Snapshot<'_>) -> io::Result<()> {
    if snap.drops.is_empty() {
        return Ok(());
    }
    writeln!(out, "\nDROPS (why packets die)")?;
    let mut drops: Vec<&DropRow> = snap.drops.iter().collect();
    drops.sort_by(|a, b| {
        b.row
            .packets
            .cmp(&a.row.packets)
            .then_with(|| by_rate(&a.row, &b.row))
    });
    for d in drops.iter().take(TABLE_ROWS) {
        writeln!(
            out,
            "  {:<12} {}",
            iface_name(snap.ifaces, d.row.id.ifindex),
            d.message
        )?;
    }
    for ((origin, reason), (packets, peers, _)) in drop_summary(snap.drops) {
        writeln!(
            out,
            "  total {origin:<10} {reason:<24} {packets:>12} packets from {peers} peer(s)"
        )?;
    }
    Ok(())
}

/// Netfilter rule counters beside the observer's (nothing when none).
fn write_netfilter(out: &mut impl Write, checks: &[NetfilterCheck]) -> io::Result<()> {
    if checks.is_empty() {
        return Ok(());
    }
    writeln!(out, "\nNETFILTER CROSS-CHECK (since attach)")?;
    for c in checks {
        writeln!(
            out,
            "  {:<9} \"{}\": rule {} / observer {}{}",
            c.backend,
            c.rule,
            c.packets,
            c.observer_packets,
            if c.agree { "" } else { "  <-- DISAGREE" }
        )?;
    }
    Ok(())
}

/// The BGP sessions of the node's BIRD (nothing when none).
fn write_bgp(out: &mut impl Write, sessions: &[BgpSession]) -> io::Result<()> {
    if sessions.is_empty() {
        return Ok(());
    }
    writeln!(out, "\nBGP SESSIONS (BIRD)")?;
    for s in sessions {
        let neighbor = s.neighbor.map(|n| n.to_string()).unwrap_or_default();
        writeln!(
            out,
            "  {:<20} {:<15} {:<12} since {:<12} routes {} in / {} out{}",
            s.protocol,
            neighbor,
            s.bgp_state,
            s.since,
            s.routes_imported,
            s.routes_exported,
            s.last_error
                .as_deref()
                .map(|e| format!("  last error: {e}"))
                .unwrap_or_default()
        )?;
    }
    Ok(())
}

/// BGP at the wire: TCP/179 segments per (interface, direction, peer)
/// since attach (nothing when none).
fn write_bgp_wire(out: &mut impl Write, snap: &Snapshot<'_>) -> io::Result<()> {
    if snap.bgp_wire.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\nBGP AT THE WIRE (TCP/179 since attach)\n  {:<10} {:<3} {:<39} {:>8} {:>4} {:>4} {:>4} {:>5} {:>7} {:>6} {:>9}  LAST NOTIFICATION",
        "IFACE",
        "DIR",
        "PEER",
        "SEGMENTS",
        "SYN",
        "FIN",
        "RST",
        "OPEN",
        "UPDATE",
        "NOTIF",
        "KEEPALIVE"
    )?;
    for row in snap.bgp_wire {
        let t = &row.total;
        writeln!(
            out,
            "  {:<10} {:<3} {:<39} {:>8} {:>4} {:>4} {:>4} {:>5} {:>7} {:>6} {:>9}  {}",
            iface_name(snap.ifaces, row.id.ifindex),
            direction_name(row.id.direction),
            row.id.peer,
            t.segments,
            t.syn,
            t.fin,
            t.rst,
            t.open,
            t.update,
            t.notification,
            t.keepalive,
            t.last_notification.map(|n| n.name()).unwrap_or_default()
        )?;
    }
    Ok(())
}

/// The table's anomaly section: one line each, then its next step.
pub fn write_anomalies(out: &mut impl Write, anomalies: &[&Anomaly]) -> io::Result<()> {
    if anomalies.is_empty() {
        return writeln!(out, "\nANOMALIES: none");
    }
    writeln!(out, "\nANOMALIES ({})", anomalies.len())?;
    for a in anomalies {
        writeln!(
            out,
            "  {:<19} {:<6} {:<16} since {}  {}",
            a.kind.name(),
            a.proto.name(),
            a.peer.to_string(),
            humantime::format_rfc3339_seconds(a.since),
            a.summary
        )?;
        writeln!(out, "  {:<19} next: {}", "", a.hint)?;
    }
    Ok(())
}

/// The footer: the kernel flow map's and flow cache's own counters.
fn write_kernel_stats(out: &mut impl Write, stats: &KernelStats) -> io::Result<()> {
    writeln!(
        out,
        "\nflow map: {} entries, {} evictions, {} insert failures; flow cache: {} slots, {} collisions",
        stats.flow_entries,
        stats.flow_evictions,
        stats.flow_insert_failures,
        stats.flow_cache_slots,
        stats.flow_cache_collisions
    )
}

/// The evidence footer (`--capture-dir`).
fn write_evidence(
    out: &mut impl Write,
    stats: &KernelStats,
    counts: &EvidenceCounts,
) -> io::Result<()> {
    writeln!(
        out,
        "evidence: {} written, {} lost (ring full), {} rate-limited, {} not drops, {} skipped (low space), {} failed; {} files completed, {} removed",
        counts.written,
        stats.evidence_lost,
        stats.evidence_rate_limited,
        counts.not_drops,
        counts.skipped_low_space,
        counts.failed,
        counts.files_completed,
        counts.files_removed
    )
}

/// Human rate with SI prefixes: `1.5 M`, `980`, `12.0 k`.
pub fn si(value: f64) -> String {
    let units = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    for (scale, unit) in units {
        if value >= scale {
            return format!("{:.1}{unit}", value / scale);
        }
    }
    format!("{value:.0}")
}
