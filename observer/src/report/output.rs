//! Renders rows for people (a refreshed table) and for programs (JSON
//! lines, one object per row; schema in the README).

use std::{
    collections::{BTreeMap, HashMap},
    io::{self, Write},
    net::IpAddr,
    time::SystemTime,
};

use observer_common::{Direction, Proto, Unclassified};
use serde::Serialize;

use crate::{
    bpf::{AttachedWith, Attachment, DropHook, Hook, KernelStats, Observer},
    model::aggregate::Row,
    model::anomalies::{Anomaly, Event},
    model::drops::DropId,
};

/// Output format (`--output`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table refreshed every interval (default on a terminal).
    Table,
    /// One JSON object per line (default when stdout is not a terminal).
    Json,
}

fn direction_name(direction: Direction) -> &'static str {
    match direction {
        Direction::Rx => "rx",
        Direction::Tx => "tx",
    }
}

fn timestamp(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// `{"type":"attach",...}`: one per interface once attached.
#[derive(Serialize)]
pub struct AttachLine<'a> {
    r#type: &'static str,
    ts: String,
    iface: &'a str,
    ifindex: u32,
    rx_hook: String,
    tx_hook: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    xdp_fallback_reason: Option<&'a str>,
    program_ids: &'a [Option<u32>],
    /// How kernel drops are counted: `tp_btf`, or why not.
    drop_hook: String,
    /// The running kernel (`uname -r`).
    kernel: &'a str,
    /// Program names in use: `rx` (XDP variant or tc ingress), `tx`,
    /// `drops` (the kfree_skb variant, absent when none).
    programs: ProgramNames,
    /// Features this kernel lacks, what is used instead and what that
    /// changes (empty on a kernel with everything).
    fallbacks: Vec<String>,
}

/// The `programs` member of an [`AttachLine`].
#[derive(Serialize)]
struct ProgramNames {
    rx: &'static str,
    tx: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    drops: Option<&'static str>,
}

impl<'a> AttachLine<'a> {
    /// Describes `attachment`.
    pub fn new(
        attachment: &'a Attachment,
        program_ids: &'a [Option<u32>],
        observer: &'a Observer,
        at: SystemTime,
    ) -> Self {
        let rx_hook = match attachment.rx {
            AttachedWith::XdpNative | AttachedWith::XdpGeneric => Hook::Xdp,
            AttachedWith::Tcx | AttachedWith::Clsact => Hook::TcIngress,
        };
        let drop_hook = observer.drop_hook();
        AttachLine {
            r#type: "attach",
            ts: timestamp(at),
            iface: &attachment.iface,
            ifindex: attachment.ifindex,
            rx_hook: attachment.rx.to_string(),
            tx_hook: attachment.tx.to_string(),
            xdp_fallback_reason: attachment.xdp_fallback_reason.as_deref(),
            program_ids,
            drop_hook: match drop_hook {
                DropHook::Pending => "pending".to_string(),
                DropHook::Attached(_) => "tp_btf".to_string(),
                DropHook::Unavailable(why) => format!("unavailable: {why}"),
            },
            kernel: &observer.features().release,
            programs: ProgramNames {
                rx: observer.program_name(rx_hook),
                tx: observer.program_name(Hook::TcEgress),
                drops: match drop_hook {
                    DropHook::Attached(name) => Some(name),
                    _ => None,
                },
            },
            fallbacks: observer
                .plan()
                .fallbacks
                .iter()
                .map(|f| f.to_string())
                .collect(),
        }
    }
}

/// `{"type":"peer",...}`: counters of one (iface, direction, proto, peer, vni).
#[derive(Serialize)]
struct PeerLine<'a> {
    r#type: &'static str,
    ts: &'a str,
    iface: &'a str,
    /// An interface deleted and re-created gets a new index: its rows
    /// before and after are separate lines.
    ifindex: u32,
    direction: &'static str,
    proto: &'static str,
    /// Outer source (rx) / destination (tx); null for the `other` aggregate.
    peer: Option<IpAddr>,
    vni: u32,
    packets: u64,
    bytes: u64,
    pps: f64,
    bps: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    inner_src: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inner_dst: Option<IpAddr>,
    /// Drops of this peer's packets by reason (rx rows only).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    drops: BTreeMap<&'a str, u64>,
}

/// A drop row with its reason named and explained.
#[derive(Debug, Clone)]
pub struct DropRow {
    /// Totals and rates.
    pub row: Row<DropId>,
    /// Reason name (`calico_allow_set`, `NETFILTER_DROP`, ...).
    pub reason: String,
    /// One-line explanation.
    pub message: String,
}

/// `{"type":"drop",...}`: one (iface, proto, peer, vni, origin, reason).
#[derive(Serialize)]
struct DropLine<'a> {
    r#type: &'static str,
    ts: &'a str,
    iface: &'a str,
    ifindex: u32,
    proto: &'static str,
    peer: Option<IpAddr>,
    vni: u32,
    origin: &'static str,
    reason: &'a str,
    packets: u64,
    bytes: u64,
    message: &'a str,
}

/// `{"type":"drop_summary",...}`: one reason over all peers.
#[derive(Serialize)]
struct DropSummaryLine<'a> {
    r#type: &'static str,
    ts: &'a str,
    origin: &'static str,
    reason: &'a str,
    packets: u64,
    peers: usize,
}

/// The observer's count beside a netfilter rule's counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetfilterCheck {
    /// `iptables`, `ip6tables` or `nftables`.
    pub backend: &'static str,
    /// The rule's comment.
    pub rule: String,
    /// `vxlan` or `ipip`.
    pub proto: &'static str,
    /// Packets the rule matched since attach.
    pub packets: u64,
    /// Packets the observer flagged `calico_allow_set` for the same
    /// protocol and family since attach.
    pub observer_packets: u64,
    /// Whether both agree.
    pub agree: bool,
}

#[derive(Serialize)]
struct NetfilterLine<'a> {
    r#type: &'static str,
    ts: &'a str,
    #[serde(flatten)]
    check: &'a NetfilterCheck,
}

/// `{"type":"unclassified",...}`: frames that could not be parsed, by reason.
#[derive(Serialize)]
struct UnclassifiedLine<'a> {
    r#type: &'static str,
    ts: &'a str,
    iface: &'a str,
    ifindex: u32,
    direction: &'static str,
    reason: &'static str,
    packets: u64,
    bytes: u64,
}

/// `{"type":"stats",...}`: the observer's own counters, once per interval.
#[derive(Serialize)]
struct StatsLine<'a> {
    r#type: &'static str,
    ts: &'a str,
    /// True on the last line the process prints.
    #[serde(rename = "final")]
    is_final: bool,
    flow_entries: u64,
    flow_evictions: u64,
    flow_insert_failures: u64,
    rows_forgotten: u64,
}

/// Everything one interval reports.
pub struct Snapshot<'a> {
    /// Rows with totals and rates.
    pub rows: &'a [Row],
    /// Kernel self counters.
    pub stats: KernelStats,
    /// Rows the aggregator forgot (bound reached).
    pub rows_forgotten: u64,
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
}

/// `{"type":"anomaly",...}`: an anomaly raised (`state` "raised") or
/// cleared (`state` "cleared", with `duration_s`).
#[derive(Serialize)]
pub struct AnomalyLine<'a> {
    r#type: &'static str,
    ts: &'a str,
    state: &'static str,
    #[serde(flatten)]
    anomaly: &'a Anomaly,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_s: Option<f64>,
}

impl<'a> AnomalyLine<'a> {
    /// The line for `event` at `ts`.
    pub fn new(event: &'a Event, ts: &'a str) -> Self {
        let (state, anomaly, duration_s) = match event {
            Event::Raised(a) => ("raised", a, None),
            Event::Cleared { anomaly, duration } => {
                ("cleared", anomaly, Some(round2(duration.as_secs_f64())))
            }
        };
        AnomalyLine {
            r#type: "anomaly",
            ts,
            state,
            anomaly,
            duration_s,
        }
    }
}

/// Drops by reason of the rx row `row`.
/// Drops by reason, keyed like the rx row they belong to.
type DropIndex<'a> = HashMap<(u32, Proto, Option<IpAddr>, u32), BTreeMap<&'a str, u64>>;

/// Indexes `drops` once per snapshot (rows times drops would be quadratic).
fn index_drops(drops: &[DropRow]) -> DropIndex<'_> {
    let mut index = DropIndex::new();
    for d in drops {
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
fn drops_of<'a>(row: &Row, index: &DropIndex<'a>) -> BTreeMap<&'a str, u64> {
    if row.id.direction != Direction::Rx {
        return BTreeMap::new();
    }
    index
        .get(&(row.id.ifindex, row.id.proto, row.id.peer, row.id.vni))
        .cloned()
        .unwrap_or_default()
}

/// Per (origin, reason): packets and distinct peers.
fn drop_summary(drops: &[DropRow]) -> BTreeMap<(&'static str, &str), (u64, usize, bool)> {
    let mut summary: BTreeMap<(&'static str, &str), (u64, usize, bool)> = BTreeMap::new();
    for d in drops {
        let entry = summary
            .entry((d.row.id.origin.name(), d.reason.as_str()))
            .or_default();
        entry.0 += d.row.packets;
        entry.1 += 1;
        entry.2 |= d.row.changed;
    }
    summary
}

fn iface_name(ifaces: &HashMap<u32, String>, ifindex: u32) -> String {
    ifaces
        .get(&ifindex)
        .cloned()
        .unwrap_or_else(|| format!("if{ifindex}"))
}

/// Writes one interval as JSON lines: rows that changed during the interval
/// (every row when final), then a stats line.
pub fn write_json(out: &mut impl Write, snap: &Snapshot<'_>) -> io::Result<()> {
    let drop_index = index_drops(snap.drops);
    let ts = timestamp(snap.at);
    for row in snap.rows.iter().filter(|r| r.changed || snap.is_final) {
        let iface = iface_name(snap.ifaces, row.id.ifindex);
        let direction = direction_name(row.id.direction);
        if row.id.reason == Unclassified::None {
            write_line(
                out,
                &PeerLine {
                    r#type: "peer",
                    ts: &ts,
                    iface: &iface,
                    ifindex: row.id.ifindex,
                    direction,
                    proto: row.id.proto.name(),
                    peer: row.id.peer,
                    vni: row.id.vni,
                    packets: row.packets,
                    bytes: row.bytes,
                    pps: round2(row.pps),
                    bps: round2(row.bps),
                    inner_src: row.inner.map(|i| i.0),
                    inner_dst: row.inner.map(|i| i.1),
                    drops: drops_of(row, &drop_index),
                },
            )?;
        } else {
            write_line(
                out,
                &UnclassifiedLine {
                    r#type: "unclassified",
                    ts: &ts,
                    iface: &iface,
                    ifindex: row.id.ifindex,
                    direction,
                    reason: row.id.reason.name(),
                    packets: row.packets,
                    bytes: row.bytes,
                },
            )?;
        }
    }
    for d in snap.drops.iter().filter(|d| d.row.changed || snap.is_final) {
        let line = DropLine {
            r#type: "drop",
            ts: &ts,
            iface: &iface_name(snap.ifaces, d.row.id.ifindex),
            ifindex: d.row.id.ifindex,
            proto: d.row.id.proto.name(),
            peer: d.row.id.peer,
            vni: d.row.id.vni,
            origin: d.row.id.origin.name(),
            reason: &d.reason,
            packets: d.row.packets,
            bytes: d.row.bytes,
            message: &d.message,
        };
        write_line(out, &line)?;
    }
    for ((origin, reason), (packets, peers, changed)) in drop_summary(snap.drops) {
        if changed || snap.is_final {
            let line = DropSummaryLine {
                r#type: "drop_summary",
                ts: &ts,
                origin,
                reason,
                packets,
                peers,
            };
            write_line(out, &line)?;
        }
    }
    for event in snap.anomaly_events {
        write_line(out, &AnomalyLine::new(event, &ts))?;
    }
    for check in snap.netfilter {
        let line = NetfilterLine {
            r#type: "netfilter",
            ts: &ts,
            check,
        };
        write_line(out, &line)?;
    }
    let stats = StatsLine {
        r#type: "stats",
        ts: &ts,
        is_final: snap.is_final,
        flow_entries: snap.stats.flow_entries,
        flow_evictions: snap.stats.flow_evictions,
        flow_insert_failures: snap.stats.flow_insert_failures,
        rows_forgotten: snap.rows_forgotten,
    };
    write_line(out, &stats)?;
    out.flush()
}

/// Writes `line` as one JSON line.
pub fn write_line(out: &mut impl Write, line: &impl Serialize) -> io::Result<()> {
    serde_json::to_writer(&mut *out, line).map_err(io::Error::other)?;
    out.write_all(b"\n")
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
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

/// Rows shown in the table before "(N more)".
const TABLE_ROWS: usize = 40;

/// Writes one interval as a table; `clear` redraws the screen (terminal).
pub fn write_table(out: &mut impl Write, snap: &Snapshot<'_>, clear: bool) -> io::Result<()> {
    let drop_index = index_drops(snap.drops);
    if clear {
        write!(out, "\x1b[2J\x1b[H")?;
    }
    writeln!(out, "observer  {}", timestamp(snap.at))?;
    for a in snap.attachments {
        writeln!(
            out,
            "  {} (ifindex {}): rx via {}, tx via {}",
            a.iface, a.ifindex, a.rx, a.tx
        )?;
    }
    writeln!(
        out,
        "\n{:<10} {:<3} {:<10} {:<39} {:>8} {:>9} {:>9} {:>12} {:>12}  INNER SAMPLE",
        "IFACE", "DIR", "PROTO", "PEER", "VNI", "PKT/S", "BIT/S", "PACKETS", "BYTES"
    )?;
    let peers: Vec<&Row> = snap
        .rows
        .iter()
        .filter(|r| r.id.reason == Unclassified::None)
        .collect();
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

    // Totals per direction and protocol.
    let mut totals: BTreeMap<(&str, &str), (u64, u64, f64, f64)> = BTreeMap::new();
    for row in &peers {
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
    let unclassified: Vec<&Row> = snap
        .rows
        .iter()
        .filter(|r| r.id.reason != Unclassified::None)
        .collect();
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
    if !snap.drops.is_empty() {
        writeln!(out, "\nDROPS (why packets die)")?;
        let mut drops: Vec<&DropRow> = snap.drops.iter().collect();
        drops.sort_by_key(|d| std::cmp::Reverse(d.row.packets));
        for d in drops.iter().take(TABLE_ROWS) {
            writeln!(
                out,
                "  {:<10} {}",
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
    }
    if !snap.netfilter.is_empty() {
        writeln!(out, "\nNETFILTER CROSS-CHECK (since attach)")?;
        for c in snap.netfilter {
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
    }
    write_anomalies(out, snap.anomalies)?;
    writeln!(
        out,
        "\nflow map: {} entries, {} evictions, {} insert failures",
        snap.stats.flow_entries, snap.stats.flow_evictions, snap.stats.flow_insert_failures
    )?;
    out.flush()
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
            "  {:<15} {:<6} {:<16} since {}  {}",
            a.kind.name(),
            a.proto.name(),
            a.peer.to_string(),
            humantime::format_rfc3339_seconds(a.since),
            a.summary
        )?;
        writeln!(out, "  {:<15} next: {}", "", a.hint)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::flows::FlowId;

    fn row(proto: Proto, peer: Option<&str>, reason: Unclassified, changed: bool) -> Row {
        Row {
            id: FlowId {
                ifindex: 7,
                direction: Direction::Rx,
                proto,
                reason,
                peer: peer.map(|p| p.parse().unwrap()),
                vni: if proto == Proto::Vxlan { 4096 } else { 0 },
            },
            packets: 123,
            bytes: 45678,
            pps: 1.0 / 3.0,
            bps: 8.0,
            inner: Some((
                "10.42.182.1".parse().unwrap(),
                "10.42.168.210".parse().unwrap(),
            )),
            changed,
        }
    }

    fn render(rows: &[Row], is_final: bool) -> Vec<serde_json::Value> {
        let ifaces = HashMap::from([(7, "eth0".to_string())]);
        let snap = Snapshot {
            rows,
            stats: KernelStats::default(),
            rows_forgotten: 0,
            ifaces: &ifaces,
            attachments: &[],
            at: SystemTime::UNIX_EPOCH,
            is_final,
            drops: &[],
            netfilter: &[],
            anomaly_events: &[],
            anomalies: &[],
        };
        let mut out = Vec::new();
        write_json(&mut out, &snap).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn peer_row_has_the_documented_fields() {
        let lines = render(
            &[row(
                Proto::Vxlan,
                Some("10.10.60.127"),
                Unclassified::None,
                true,
            )],
            false,
        );
        let peer = &lines[0];
        assert_eq!(peer["type"], "peer");
        assert_eq!(peer["iface"], "eth0");
        assert_eq!(peer["direction"], "rx");
        assert_eq!(peer["proto"], "vxlan");
        assert_eq!(peer["peer"], "10.10.60.127");
        assert_eq!(peer["vni"], 4096);
        assert_eq!(peer["packets"], 123);
        assert_eq!(peer["bytes"], 45678);
        assert_eq!(peer["pps"], 0.33);
        assert_eq!(peer["inner_src"], "10.42.182.1");
        assert_eq!(peer["ts"], "1970-01-01T00:00:00.000Z");
        assert_eq!(lines[1]["type"], "stats");
        assert_eq!(lines[1]["final"], false);
    }

    #[test]
    fn other_aggregate_has_null_peer_and_unclassified_has_reason() {
        let lines = render(
            &[
                row(Proto::Other, None, Unclassified::None, true),
                row(Proto::Other, None, Unclassified::TruncatedL4, true),
            ],
            false,
        );
        assert_eq!(lines[0]["proto"], "other");
        assert!(lines[0]["peer"].is_null());
        assert_eq!(lines[1]["type"], "unclassified");
        assert_eq!(lines[1]["reason"], "truncated_l4");
    }

    #[test]
    fn unchanged_rows_print_only_in_the_final_snapshot() {
        let rows = [row(
            Proto::Vxlan,
            Some("10.0.0.1"),
            Unclassified::None,
            false,
        )];
        assert_eq!(render(&rows, false).len(), 1);
        let last = render(&rows, true);
        assert_eq!(last.len(), 2);
        assert_eq!(last[1]["final"], true);
    }

    #[test]
    fn table_shows_rows_and_totals() {
        let rows = [row(
            Proto::Vxlan,
            Some("10.10.60.127"),
            Unclassified::None,
            true,
        )];
        let ifaces = HashMap::new();
        let snap = Snapshot {
            rows: &rows,
            stats: KernelStats::default(),
            rows_forgotten: 0,
            ifaces: &ifaces,
            attachments: &[],
            at: SystemTime::UNIX_EPOCH,
            is_final: false,
            drops: &[],
            netfilter: &[],
            anomaly_events: &[],
            anomalies: &[],
        };
        let mut out = Vec::new();
        write_table(&mut out, &snap, false).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("10.10.60.127"), "{text}");
        assert!(text.contains("10.42.182.1 > 10.42.168.210"), "{text}");
        assert!(text.contains("TOTALS"), "{text}");
        assert!(text.contains("rx  vxlan"), "{text}");
    }

    #[test]
    fn peer_rows_carry_their_drops_in_json_and_table() {
        let rows = [row(
            Proto::Vxlan,
            Some("10.10.10.244"),
            Unclassified::None,
            true,
        )];
        let drop = |reason: &str, origin| DropRow {
            row: Row {
                id: crate::model::drops::DropId {
                    ifindex: 7,
                    proto: Proto::Vxlan,
                    peer: Some("10.10.10.244".parse().unwrap()),
                    vni: 4096,
                    origin,
                    reason: 1,
                },
                packets: 579,
                bytes: 0,
                pps: 0.0,
                bps: 0.0,
                inner: None,
                changed: true,
            },
            reason: reason.to_string(),
            message: format!("579 VXLAN packets from 10.10.10.244 dropped: {reason}"),
        };
        let drops = [
            drop("calico_allow_set", crate::model::drops::Origin::Classifier),
            drop("NETFILTER_DROP", crate::model::drops::Origin::Kernel),
        ];
        let ifaces = HashMap::from([(7, "eth0".to_string())]);
        let snap = Snapshot {
            rows: &rows,
            stats: KernelStats::default(),
            rows_forgotten: 0,
            ifaces: &ifaces,
            attachments: &[],
            at: SystemTime::UNIX_EPOCH,
            is_final: false,
            drops: &drops,
            netfilter: &[],
            anomaly_events: &[],
            anomalies: &[],
        };
        let mut json = Vec::new();
        write_json(&mut json, &snap).unwrap();
        let peer: serde_json::Value =
            serde_json::from_str(String::from_utf8(json).unwrap().lines().next().unwrap()).unwrap();
        assert_eq!(peer["drops"]["calico_allow_set"], 579, "{peer}");
        assert_eq!(peer["drops"]["NETFILTER_DROP"], 579, "{peer}");
        let mut table = Vec::new();
        write_table(&mut table, &snap, false).unwrap();
        let text = String::from_utf8(table).unwrap();
        assert!(
            text.contains("DROPS NETFILTER_DROP=579,calico_allow_set=579"),
            "{text}"
        );
        assert!(
            text.contains("579 VXLAN packets from 10.10.10.244 dropped"),
            "{text}"
        );
    }

    #[test]
    fn si_prefixes() {
        assert_eq!(si(999.0), "999");
        assert_eq!(si(1500.0), "1.5k");
        assert_eq!(si(2_500_000.0), "2.5M");
    }
}
