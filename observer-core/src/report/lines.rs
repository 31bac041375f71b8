//! The JSON lines for programs: one object per row or event, every kind
//! a variant of [`Line`] (its `type` tag), which is the schema docs/json.md
//! documents. The per-interval snapshot they render is in `view`.

use std::{
    collections::BTreeMap,
    io::{self, Write},
    net::IpAddr,
};

use ipnet::IpNet;
use observer_common::{Proto, TcpCounts, Unclassified};
use serde::Serialize;

use crate::{
    model::anomalies::FindingRecord,
    model::anomalies::{Anomaly, Event},
    model::bgp::BgpSession,
    model::bgp_wire::{WireCounters, WireRow},
    model::crosscheck::NetfilterCheck,
    model::dataplane::{BlockRoute, ExpectedPeer, TunnelDevice, TunnelRoute, UnderlayInterface},
    model::evidence::TallyKey,
    model::probe::{Arrival, Encap, Finding, Rtt, Skipped},
    model::routes::Outage,
    model::rows::Row,
    model::rows::{DropRow, by_rate, direction_name},
    model::verdicts::PairVerdict,
};

use super::view::{Snapshot, drop_summary, drops_of, iface_name, index_drops, timestamp};

/// `{"type":"attach",...}`: one per interface once attached.
#[derive(Serialize)]
pub struct AttachLine<'a> {
    /// When.
    pub ts: String,
    /// The interface.
    pub iface: &'a str,
    /// Its index.
    pub ifindex: u32,
    /// How received packets are counted (`xdp-native`, `tcx`, ...).
    pub rx_hook: String,
    /// How sent packets are counted.
    pub tx_hook: String,
    /// Why XDP was not used, when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xdp_fallback_reason: Option<&'a str>,
    /// Kernel ids of the XDP, tc ingress and tc egress programs (`None`
    /// for one not loaded).
    pub program_ids: &'a [Option<u32>],
    /// How kernel drops are counted: `tp_btf`, or why not.
    pub drop_hook: String,
    /// The running kernel (`uname -r`).
    pub kernel: &'a str,
    /// Program names in use.
    pub programs: ProgramNames,
    /// Features this kernel lacks, what is used instead and what that
    /// changes (empty on a kernel with everything).
    pub fallbacks: Vec<String>,
}

/// The `programs` member of an [`AttachLine`].
#[derive(Serialize)]
pub struct ProgramNames {
    /// The XDP variant or tc ingress.
    pub rx: &'static str,
    /// tc egress.
    pub tx: &'static str,
    /// The kfree_skb variant, absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drops: Option<&'static str>,
}

/// `{"type":"peer",...}`: counters of one (iface, direction, proto, peer, vni).
#[derive(Serialize)]
pub struct PeerLine<'a> {
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
    /// What the inner TCP segments said since attach (tunnel rows that
    /// carried a SYN, SYN-ACK or RST).
    #[serde(skip_serializing_if = "Option::is_none")]
    tcp: Option<TcpLine>,
}

/// The `tcp` member of a [`PeerLine`].
#[derive(Serialize)]
struct TcpLine {
    /// SYNs (without ACK), retries included.
    syn: u64,
    /// SYN-ACKs.
    syn_ack: u64,
    /// Segments with RST.
    rst: u64,
    /// SYNs and SYN-ACKs whose MSS, encapsulated, exceeds the interface's MTU.
    mss_over: u64,
}

impl TcpLine {
    /// The member for `tcp`, absent when nothing was counted.
    fn of(tcp: &TcpCounts) -> Option<TcpLine> {
        (*tcp != TcpCounts::NONE).then_some(TcpLine {
            syn: tcp.syn,
            syn_ack: tcp.syn_ack,
            rst: tcp.rst,
            mss_over: tcp.mss_over,
        })
    }
}

/// `{"type":"drop",...}`: one (iface, proto, peer, vni, origin, reason).
#[derive(Serialize)]
pub struct DropLine<'a> {
    ts: &'a str,
    iface: &'a str,
    ifindex: u32,
    proto: &'static str,
    peer: Option<IpAddr>,
    vni: u32,
    /// `path_mtu` rows only: the next-hop MTU the router reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    mtu: Option<u32>,
    origin: &'static str,
    reason: &'a str,
    /// underlay, tunnel or pod.
    stage: &'static str,
    /// After decapsulation: rx when `peer` sent the packet, tx when it
    /// was on its way to `peer`; rx on the underlay.
    direction: &'static str,
    /// Kernel drops: the kernel function that freed the packets.
    #[serde(skip_serializing_if = "Option::is_none")]
    location: Option<&'a str>,
    packets: u64,
    bytes: u64,
    message: &'a str,
}

/// `{"type":"drop_summary",...}`: one reason over all peers.
#[derive(Serialize)]
pub struct DropSummaryLine<'a> {
    ts: &'a str,
    origin: &'static str,
    reason: &'a str,
    packets: u64,
    peers: usize,
}

#[derive(Serialize)]
pub struct NetfilterLine<'a> {
    ts: &'a str,
    #[serde(flatten)]
    check: &'a NetfilterCheck,
}

/// `{"type":"unclassified",...}`: frames that could not be parsed, by reason.
#[derive(Serialize)]
pub struct UnclassifiedLine<'a> {
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
pub struct StatsLine<'a> {
    ts: &'a str,
    /// True on the last line the process prints.
    #[serde(rename = "final")]
    is_final: bool,
    flow_entries: u64,
    flow_evictions: u64,
    flow_insert_failures: u64,
    flow_cache_slots: u64,
    flow_cache_collisions: u64,
    probe_rx_packets: u64,
    probe_tx_packets: u64,
    rows_forgotten: u64,
    late_intervals: u64,
    netlink_overruns: u64,
    /// With `--capture-dir` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    evidence: Option<EvidenceStatsLine>,
}

/// The `evidence` member of the `stats` line: every frame the programs
/// offered as evidence since attach, by what became of it. `sent` +
/// `lost` + `rate_limited` are all the programs offered; of `sent`,
/// `written` + `not_drops` + `skipped_low_space` + `failed` were handled
/// (the rest are still in the rings).
#[derive(Serialize)]
struct EvidenceStatsLine {
    sent: u64,
    lost: u64,
    rate_limited: u64,
    written: u64,
    not_drops: u64,
    skipped_low_space: u64,
    failed: u64,
    files_completed: u64,
    files_removed: u64,
}

/// `{"type":"anomaly",...}`: an anomaly raised (`state` "raised") or
/// cleared (`state` "cleared", with `duration_s`).
#[derive(Serialize)]
pub struct AnomalyLine<'a> {
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
            ts,
            state,
            anomaly,
            duration_s,
        }
    }
}

/// `{"type":"dataplane",...}`: what the data plane prescribes, printed when
/// it changes.
#[derive(Serialize)]
pub struct DataplaneLine<'a> {
    pub ts: String,
    pub devices: &'a [TunnelDevice],
    pub underlay: &'a [UnderlayInterface],
    pub expected_peers: &'a BTreeMap<IpAddr, ExpectedPeer>,
    pub unresolved_routes: Vec<&'a TunnelRoute>,
}

/// `{"type":"interface",...}`: an interface went away or came back.
#[derive(Serialize)]
pub struct InterfaceLine<'a> {
    pub ts: String,
    pub iface: &'a str,
    pub event: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ifindex: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
}

/// `{"type":"bgp",...}`: one BGP session of the node's BIRD, printed when
/// it changes (state, error, routes), when BIRD no longer has it
/// (`removed`), and at the end.
#[derive(Serialize)]
pub struct BgpLine<'a> {
    pub ts: String,
    #[serde(flatten)]
    pub session: &'a BgpSession,
    /// BIRD no longer has this protocol (removed from its config): the
    /// session as last read, printed once.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

/// `{"type":"bgp_wire",...}`: the TCP/179 segments of one (interface,
/// direction, peer) since attach, printed when they changed (every key
/// at the end): TCP flags, the BGP message each segment starts with, the
/// latest NOTIFICATION and the hold time the latest OPEN proposed.
#[derive(Serialize)]
pub struct BgpWireLine<'a> {
    pub ts: &'a str,
    pub iface: &'a str,
    pub ifindex: u32,
    pub direction: &'static str,
    pub peer: IpAddr,
    #[serde(flatten)]
    pub counters: &'a WireCounters,
}

impl<'a> BgpWireLine<'a> {
    /// The line of `row`.
    pub fn new(ts: &'a str, iface: &'a str, row: &'a WireRow) -> BgpWireLine<'a> {
        BgpWireLine {
            ts,
            iface,
            ifindex: row.id.ifindex,
            direction: direction_name(row.id.direction),
            peer: row.id.peer,
            counters: &row.total,
        }
    }
}

/// `{"type":"routes",...}`: the routes of pod blocks (main table) that
/// changed: every block at the first read, then those new or different
/// (`blocks`) and those whose route went (`withdrawn`).
#[derive(Serialize)]
pub struct RoutesLine<'a> {
    pub ts: String,
    pub blocks: &'a [BlockRoute],
    pub withdrawn: &'a [IpNet],
    /// Blocks routed now (all of them, not only those that changed).
    pub routed: usize,
    /// Blocks routed to a node before and without a route now.
    pub missing: usize,
    /// Missing blocks forgotten so far (missing 6 hours, or beyond the
    /// 16,384 remembered).
    pub forgotten: u64,
}

/// `{"type":"route_outage",...}`: a pod block's route came back; how long
/// it was gone.
#[derive(Serialize)]
pub struct RouteOutageLine<'a> {
    pub ts: String,
    #[serde(flatten)]
    pub outage: &'a Outage,
}

/// `{"type":"bird_socket",...}`: a BIRD control socket became readable,
/// absent or unreadable (printed when that changes).
#[derive(Serialize)]
pub struct BirdSocketLine<'a> {
    pub ts: String,
    pub socket: &'a str,
    /// `ok`, `absent` or `failed`.
    pub status: &'static str,
    /// BGP sessions read from it.
    pub sessions: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
}

/// `{"type":"diagnosis",...}`: the last line of `observer diagnose --output json`.
#[derive(Serialize)]
pub struct DiagnosisLine<'a> {
    pub ts: String,
    pub netns: Option<&'a str>,
    pub interfaces: &'a [String],
    pub duration_s: f64,
    pub healthy: bool,
    pub findings: Vec<&'a FindingRecord>,
    pub findings_not_kept: u64,
    pub measured: Vec<Measured>,
    /// One verdict per node pair.
    pub pairs: Vec<PairVerdict>,
    /// Route outages of pod blocks that ended during the run.
    pub route_outages: &'a [Outage],
    pub netfilter: &'a [NetfilterCheck],
    /// `diagnose --probe`: what the probes found (their `probe` lines come
    /// before this line); absent without `--probe`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeVerdict>,
    pub text: &'a str,
}

/// The probes' part of a diagnosis.
#[derive(Serialize)]
pub struct ProbeVerdict {
    /// Whether the probes found nothing wrong.
    pub healthy: bool,
    /// Their conclusion in words.
    pub conclusion: String,
}

/// Packets per (peer, encapsulation) over the whole run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    pub peer: IpAddr,
    pub proto: &'static str,
    pub sent: u64,
    pub received: u64,
    pub dropped: u64,
    /// `dropped / received` when packets went both ways, else `None`
    /// (`model::verdicts::loss`).
    pub loss: Option<f64>,
    /// `node`, `not a node`, or `unknown` when the data plane names no nodes.
    pub role: &'static str,
}

/// `{"type":"replay",...}`: one capture's own counters.
#[derive(Serialize)]
pub struct ReplayLine<'a> {
    /// The capture, as given on the command line; rows carry it as `iface`.
    pub iface: &'a str,
    /// The capture's number (from 1); rows carry it as `ifindex`.
    pub ifindex: u32,
    pub format: &'static str,
    /// `native` (the programs' parser compiled into observer) or
    /// `bpf_test_run` (`--kernel`: the programs loaded into this kernel).
    pub engine: &'static str,
    pub frames: u64,
    pub tx_frames: u64,
    pub truncated: u64,
    pub truncated_bytes: u64,
    pub cut: u64,
    /// Frames the kernel refused to test-run (`--kernel` only; counted as
    /// unclassified `truncated_l3`, as the parser counts every such frame).
    pub refused: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_ts: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_ts: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
    /// Frames whose comment the observer wrote (its evidence files); its
    /// `evidence` lines count them per reason. Absent when none.
    #[serde(skip_serializing_if = "is_zero")]
    pub evidence_frames: u64,
    /// (frame, reason) pairs beyond the evidence tally's bound, in no
    /// `evidence` line. Absent when none.
    #[serde(skip_serializing_if = "is_zero")]
    pub evidence_overflow: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `{"type":"evidence",...}`: `observer replay`, the frames of one
/// capture the observer's evidence comments name, per (peer, stage,
/// direction, origin, reason); a frame with two reasons is on two lines.
#[derive(Debug, Serialize)]
pub struct EvidenceLine<'a> {
    /// The capture, as given on the command line (the `replay` line's
    /// `iface`).
    pub capture: &'a str,
    /// The tunnel peer the observer attributed the frames to; null when
    /// unknown.
    pub peer: Option<IpAddr>,
    /// underlay, tunnel or pod.
    pub stage: &'static str,
    /// rx or tx.
    pub direction: &'static str,
    /// classifier or kernel.
    pub origin: &'static str,
    /// The reason's name (`-` for a comment that names none).
    pub reason: &'a str,
    /// Frames.
    pub frames: u64,
}

impl<'a> EvidenceLine<'a> {
    /// The line of one tally entry of `capture`.
    pub fn new(capture: &'a str, key: &'a TallyKey, frames: u64) -> EvidenceLine<'a> {
        EvidenceLine {
            capture,
            peer: key.peer,
            stage: key.stage.name(),
            direction: direction_name(key.direction),
            origin: key.origin.name(),
            reason: &key.reason,
            frames,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AllowSetLine {
    /// `vxlan` or `ipip`.
    pub proto: &'static str,
    /// Whether sources are checked against it.
    pub active: bool,
    /// Where the members came from.
    pub sources: Vec<String>,
    /// Number of prefixes mirrored.
    pub prefixes: usize,
    /// Set names looked for.
    pub looked_for: Vec<String>,
    /// Problems met reading the sets.
    pub problems: Vec<String>,
}

/// `{"type":"probe",...}`: what the probes of one (peer, encapsulation)
/// found.
#[derive(Serialize)]
pub struct ProbeLine<'a> {
    /// When the run started.
    pub ts: &'a str,
    /// The peer's underlay address.
    pub peer: IpAddr,
    /// The encapsulation (`vxlan`, `vxlan:8472`, `geneve`, `ipip`).
    pub encap: Encap,
    /// The local tunnel device whose address the answers go to.
    pub device: &'a str,
    /// Reachability probes sent.
    pub sent: u32,
    /// Of those, answered.
    pub answered: u32,
    /// Round-trip times; null when nothing was answered.
    pub rtt: Option<Rtt>,
    /// Where the answers came from: outer source, how they arrived
    /// (`other`: not encapsulated), how many.
    pub answer_sources: Vec<AnswerSource>,
    /// The largest inner packet (bytes of IP) answered with DF set; null
    /// when nothing was answered or with --no-ladder.
    pub max_size: Option<u32>,
    /// The tunnel device's MTU.
    pub device_mtu: u32,
    /// Probes the size ladder sent.
    pub ladder_sent: u32,
    /// `ok`, or the first finding's kind.
    pub verdict: &'static str,
    /// Everything wrong with the pair.
    pub findings: Vec<Finding>,
}

/// One source answers came from.
#[derive(Serialize)]
pub struct AnswerSource {
    /// Outer source address.
    pub from: IpAddr,
    /// The encapsulation they arrived in (`other`: none).
    #[serde(serialize_with = "crate::model::facts::proto_name")]
    pub proto: Proto,
    /// Answers.
    pub answers: u32,
}

/// `{"type":"probe_arrival",...}`: a peer's tunnel packets that arrived
/// during the run, by the outer source they arrived from.
#[derive(Serialize)]
pub struct ArrivalLine<'a> {
    /// When the run started.
    pub ts: &'a str,
    /// The fact.
    #[serde(flatten)]
    pub fact: &'a Arrival,
    /// Whether `arrived_from` is another address than the node's.
    pub rewritten: bool,
    /// The allow-set of this node that refuses `arrived_from` (Calico
    /// drops these packets here); null when none does.
    pub refused_by: Option<&'a str>,
    /// Whether `arrived_from` is a node.
    pub from_a_node: bool,
    /// Packets seen.
    pub packets: u64,
}

/// `{"type":"probe_summary",...}`: the run's totals and conclusion.
#[derive(Serialize)]
pub struct SummaryLine<'a> {
    /// When the run started.
    pub ts: &'a str,
    /// Pairs probed.
    pub pairs: usize,
    /// Pairs with a finding.
    pub pairs_with_findings: usize,
    /// Pairs that could not be probed.
    pub skipped: usize,
    /// Probe packets sent, ladder included.
    pub probes_sent: u64,
    /// Frames the listener's queue overflowed by.
    pub listener_drops: u64,
    /// Arriving packets whose key found no room.
    pub arrivals_overflow: u64,
    /// Whether everything was healthy (exit status 0).
    pub healthy: bool,
    /// The conclusion in words.
    pub conclusion: &'a str,
}

/// Every JSON line the observer prints: the schema (docs/json.md). Each
/// variant's `type` is its name in snake case; `lab` lines and `observer
/// check`'s single object are outside it.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Line<'a> {
    /// Once per interface, after attaching.
    Attach(AttachLine<'a>),
    /// What an allow-set holds, when it changed.
    AllowSet(&'a AllowSetLine),
    /// The data plane's view, when it changed.
    Dataplane(DataplaneLine<'a>),
    /// An interface went away or came back.
    Interface(InterfaceLine<'a>),
    /// A BGP session, when it changed.
    Bgp(BgpLine<'a>),
    /// A BIRD control socket's status, when it changed.
    BirdSocket(BirdSocketLine<'a>),
    /// Routes of pod blocks, when they changed.
    Routes(RoutesLine<'a>),
    /// A pod block's route came back after an outage.
    RouteOutage(RouteOutageLine<'a>),
    /// Counters of one (iface, direction, proto, peer, vni).
    Peer(PeerLine<'a>),
    /// BGP at the wire: TCP/179 of one (iface, direction, peer).
    BgpWire(BgpWireLine<'a>),
    /// Frames that could not be parsed, by reason.
    Unclassified(UnclassifiedLine<'a>),
    /// One drop row.
    Drop(DropLine<'a>),
    /// One drop reason over all peers.
    DropSummary(DropSummaryLine<'a>),
    /// A netfilter rule's counter beside the observer's.
    Netfilter(NetfilterLine<'a>),
    /// An anomaly raised or cleared.
    Anomaly(AnomalyLine<'a>),
    /// The observer's own counters, once per interval.
    Stats(StatsLine<'a>),
    /// One replayed capture's own counters.
    Replay(ReplayLine<'a>),
    /// `observer replay`: a capture's evidence frames of one (peer,
    /// stage, direction, origin, reason).
    Evidence(EvidenceLine<'a>),
    /// The last line of `observer diagnose`.
    Diagnosis(DiagnosisLine<'a>),
    /// `observer probe`: one (peer, encapsulation).
    Probe(ProbeLine<'a>),
    /// `observer probe`: a pair that could not be probed.
    ProbeSkipped(&'a Skipped),
    /// `observer probe`: a peer's tunnel packets that arrived.
    ProbeArrival(ArrivalLine<'a>),
    /// `observer probe`: the last line, with the conclusion.
    ProbeSummary(SummaryLine<'a>),
    /// `observer cluster`: one (from node, to node, encapsulation).
    Pair(&'a crate::model::cluster::Pair),
    /// `observer cluster`: the last line.
    ClusterSummary(crate::report::cluster::SummaryLine<'a>),
}

/// Writes one interval as JSON lines: rows that changed during the interval
/// (every row when final), then a stats line.
pub fn write_json(out: &mut impl Write, snap: &Snapshot<'_>) -> io::Result<()> {
    let ts = timestamp(snap.at);
    write_row_lines(out, snap, &ts)?;
    write_drop_lines(out, snap, &ts)?;
    for row in snap.bgp_wire.iter().filter(|r| r.changed || snap.is_final) {
        let iface = iface_name(snap.ifaces, row.id.ifindex);
        write_line(out, &Line::BgpWire(BgpWireLine::new(&ts, &iface, row)))?;
    }
    for event in snap.anomaly_events {
        write_line(out, &Line::Anomaly(AnomalyLine::new(event, &ts)))?;
    }
    for check in snap.netfilter {
        write_line(out, &Line::Netfilter(NetfilterLine { ts: &ts, check }))?;
    }
    write_stats_line(out, snap, &ts)?;
    out.flush()
}

/// A `peer` or `unclassified` line per row that changed (every row when
/// final), fastest first.
fn write_row_lines(out: &mut impl Write, snap: &Snapshot<'_>, ts: &str) -> io::Result<()> {
    let drop_index = index_drops(snap.drops);
    let mut rows: Vec<&Row> = snap
        .rows
        .iter()
        .filter(|r| r.changed() || snap.is_final)
        .collect();
    rows.sort_by(|a, b| by_rate(a, b));
    for row in rows {
        let iface = iface_name(snap.ifaces, row.id.ifindex);
        let direction = direction_name(row.id.direction);
        if row.id.reason == Unclassified::None {
            write_line(
                out,
                &Line::Peer(PeerLine {
                    ts,
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
                    tcp: TcpLine::of(&row.tcp),
                }),
            )?;
        } else {
            write_line(
                out,
                &Line::Unclassified(UnclassifiedLine {
                    ts,
                    iface: &iface,
                    ifindex: row.id.ifindex,
                    direction,
                    reason: row.id.reason.name(),
                    packets: row.packets,
                    bytes: row.bytes,
                }),
            )?;
        }
    }
    Ok(())
}

/// A `drop` line per drop row that changed, then a `drop_summary` line per
/// reason that changed (all of them when final).
fn write_drop_lines(out: &mut impl Write, snap: &Snapshot<'_>, ts: &str) -> io::Result<()> {
    let mut drops: Vec<&DropRow> = snap
        .drops
        .iter()
        .filter(|d| d.row.changed() || snap.is_final)
        .collect();
    drops.sort_by(|a, b| by_rate(&a.row, &b.row));
    for d in drops {
        let line = DropLine {
            ts,
            iface: &iface_name(snap.ifaces, d.row.id.ifindex),
            ifindex: d.row.id.ifindex,
            proto: d.row.id.proto.name(),
            peer: d.row.id.peer,
            vni: d.row.id.vni,
            mtu: d.row.id.mtu,
            origin: d.row.id.origin.name(),
            reason: &d.reason,
            stage: d.row.id.stage.name(),
            direction: direction_name(d.row.id.direction),
            location: d.location.as_deref(),
            packets: d.row.packets,
            bytes: d.row.bytes,
            message: &d.message,
        };
        write_line(out, &Line::Drop(line))?;
    }
    for ((origin, reason), (packets, peers, changed)) in drop_summary(snap.drops) {
        if changed || snap.is_final {
            let line = DropSummaryLine {
                ts,
                origin,
                reason,
                packets,
                peers,
            };
            write_line(out, &Line::DropSummary(line))?;
        }
    }
    Ok(())
}

/// The interval's `stats` line.
fn write_stats_line(out: &mut impl Write, snap: &Snapshot<'_>, ts: &str) -> io::Result<()> {
    let stats = StatsLine {
        ts,
        is_final: snap.is_final,
        flow_entries: snap.stats.flow_entries,
        flow_evictions: snap.stats.flow_evictions,
        flow_insert_failures: snap.stats.flow_insert_failures,
        flow_cache_slots: snap.stats.flow_cache_slots,
        flow_cache_collisions: snap.stats.flow_cache_collisions,
        probe_rx_packets: snap.stats.probe_rx_packets,
        probe_tx_packets: snap.stats.probe_tx_packets,
        rows_forgotten: snap.rows_forgotten,
        late_intervals: snap.late_intervals,
        netlink_overruns: snap.netlink_overruns,
        evidence: snap.evidence.map(|counts| EvidenceStatsLine {
            sent: snap.stats.evidence_sent,
            lost: snap.stats.evidence_lost,
            rate_limited: snap.stats.evidence_rate_limited,
            written: counts.written,
            not_drops: counts.not_drops,
            skipped_low_space: counts.skipped_low_space,
            failed: counts.failed,
            files_completed: counts.files_completed,
            files_removed: counts.files_removed,
        }),
    };
    write_line(out, &Line::Stats(stats))
}

/// Writes `line` as one JSON line.
pub fn write_line(out: &mut impl Write, line: &Line<'_>) -> io::Result<()> {
    serde_json::to_writer(&mut *out, line).map_err(io::Error::other)?;
    out.write_all(b"\n")
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, time::SystemTime};

    use observer_common::Direction;

    use super::*;
    use crate::model::rows::KernelStats;
    use crate::model::rows::{DropId, FlowId, Origin, testing};
    use crate::report::table::{si, write_table};

    fn row(proto: Proto, peer: Option<&str>, reason: Unclassified, changed: bool) -> Row {
        let id = FlowId {
            ifindex: 7,
            proto,
            reason,
            peer: peer.map(|p| p.parse().unwrap()),
            vni: if proto == Proto::Vxlan { 4096 } else { 0 },
            ..testing::flow_id("0.0.0.0")
        };
        Row {
            bytes: 45678,
            pps: 1.0 / 3.0,
            bps: 8.0,
            inner: Some((
                "10.42.182.1".parse().unwrap(),
                "10.42.168.210".parse().unwrap(),
            )),
            interval_packets: if changed { 3 } else { 0 },
            ..testing::row(id, 123)
        }
    }

    #[test]
    fn bgp_sessions_print_as_lines_and_in_the_table() {
        let session = crate::model::bgp::testing::session("10.0.0.2", "Active");
        let line = Line::Bgp(BgpLine {
            ts: "t".into(),
            session: &session,
            removed: false,
        });
        let mut out = Vec::new();
        crate::report::write_line(&mut out, &line).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "type": "bgp", "ts": "t", "socket": "/var/run/calico/bird.ctl",
                "protocol": "Mesh_10_0_0_2", "neighbor": "10.0.0.2", "neighbor_as": 64512,
                "local_as": 64512, "state": "start", "bgp_state": "Active",
                "since": "07:40:19.573", "last_error": "Socket: Connection refused",
                "routes_imported": 0, "routes_exported": 1, "updates_filtered": 0
            })
        );
        let ifaces = HashMap::new();
        let bgp = [session];
        let snap = snapshot(&[], &ifaces, &bgp, false);
        let mut table = Vec::new();
        crate::report::table::write_table(&mut table, &snap, false).unwrap();
        let table = String::from_utf8(table).unwrap();
        let row = table
            .lines()
            .find(|l| l.contains("Mesh_10_0_0_2"))
            .expect("a BGP row");
        for part in [
            "10.0.0.2",
            "Active",
            "routes 0 in / 1 out",
            "last error: Socket: Connection refused",
        ] {
            assert!(row.contains(part), "{part} missing from {row:?}");
        }
    }

    /// A snapshot of `rows` and `bgp` read at the epoch, nothing else.
    fn snapshot<'a>(
        rows: &'a [Row],
        ifaces: &'a HashMap<u32, String>,
        bgp: &'a [BgpSession],
        is_final: bool,
    ) -> Snapshot<'a> {
        Snapshot {
            bgp,
            ..Snapshot::new(
                rows,
                KernelStats::default(),
                ifaces,
                SystemTime::UNIX_EPOCH,
                is_final,
            )
        }
    }

    /// The `stats` line has an `evidence` member with `--capture-dir`
    /// only: the programs' counts beside what userspace did with them.
    #[test]
    fn the_stats_line_accounts_for_evidence_when_captured() {
        let ifaces = HashMap::new();
        let stats_line = |snap: &Snapshot<'_>| {
            let mut out = Vec::new();
            write_stats_line(&mut out, snap, "t").unwrap();
            serde_json::from_slice::<serde_json::Value>(&out).unwrap()
        };
        let plain = snapshot(&[], &ifaces, &[], false);
        assert!(stats_line(&plain).get("evidence").is_none());
        let captured = Snapshot {
            stats: KernelStats {
                evidence_sent: 9,
                evidence_lost: 3,
                evidence_rate_limited: 2,
                ..KernelStats::default()
            },
            evidence: Some(crate::model::evidence::EvidenceCounts {
                written: 7,
                not_drops: 1,
                skipped_low_space: 1,
                failed: 0,
                files_completed: 2,
                files_removed: 1,
            }),
            ..snapshot(&[], &ifaces, &[], false)
        };
        assert_eq!(
            stats_line(&captured)["evidence"],
            serde_json::json!({
                "sent": 9, "lost": 3, "rate_limited": 2, "written": 7, "not_drops": 1,
                "skipped_low_space": 1, "failed": 0, "files_completed": 2, "files_removed": 1
            })
        );
    }

    fn render(rows: &[Row], is_final: bool) -> Vec<serde_json::Value> {
        let ifaces = HashMap::from([(7, "eth0".to_string())]);
        let snap = snapshot(rows, &ifaces, &[], is_final);
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
        let snap = snapshot(&rows, &ifaces, &[], false);
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
                bytes: 0,
                ..testing::row(
                    DropId {
                        ifindex: 7,
                        ..testing::drop_id("10.10.10.244", origin, 1)
                    },
                    579,
                )
            },
            reason: reason.to_string(),
            location: None,
            place: None,
            message: format!("579 VXLAN packets from 10.10.10.244 dropped: {reason}"),
        };
        let drops = [
            drop("calico_allow_set", Origin::Classifier),
            drop("NETFILTER_DROP", Origin::Kernel),
        ];
        let ifaces = HashMap::from([(7, "eth0".to_string())]);
        let snap = Snapshot {
            drops: &drops,
            ..snapshot(&rows, &ifaces, &[], false)
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
    fn bgp_wire_lines_carry_the_counts_and_the_named_notification() {
        use crate::model::bgp_wire::{Notification, WireCounters, WireId, WireRow};
        let row = |changed| WireRow {
            id: WireId {
                peer: "10.99.0.4".parse().unwrap(),
                ifindex: 7,
                direction: Direction::Tx,
            },
            total: WireCounters {
                segments: 4,
                fin: 1,
                keepalive: 2,
                notification: 1,
                last_notification: Some(Notification {
                    code: 6,
                    subcode: 2,
                }),
                hold_time_s: Some(6),
                ..WireCounters::default()
            },
            changed,
        };
        let ifaces = HashMap::from([(7, "eth0".to_string())]);
        let lines = |rows: &[WireRow], is_final| {
            let mut snap = snapshot(&[], &ifaces, &[], is_final);
            snap.bgp_wire = rows;
            let mut out = Vec::new();
            write_json(&mut out, &snap).unwrap();
            String::from_utf8(out)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .filter(|l| l["type"] == "bgp_wire")
                .collect::<Vec<_>>()
        };
        assert!(
            lines(&[row(false)], false).is_empty(),
            "unchanged: not printed"
        );
        assert_eq!(lines(&[row(false)], true).len(), 1, "every key at the end");
        let line = &lines(&[row(true)], false)[0];
        assert_eq!(
            *line,
            serde_json::json!({
                "type": "bgp_wire", "ts": line["ts"], "iface": "eth0", "ifindex": 7,
                "direction": "tx", "peer": "10.99.0.4", "segments": 4, "syn": 0, "fin": 1,
                "rst": 0, "open": 0, "update": 0, "notification": 1, "keepalive": 2,
                "route_refresh": 0, "hold_time_s": 6,
                "last_notification": {"code": 6, "subcode": 2, "name": "Cease/Administrative Shutdown"}
            })
        );
    }

    #[test]
    fn si_prefixes() {
        assert_eq!(si(999.0), "999");
        assert_eq!(si(1500.0), "1.5k");
        assert_eq!(si(2_500_000.0), "2.5M");
    }
}
