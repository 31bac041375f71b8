//! The anomaly engine: turns per-peer counters (what is on the wire) and
//! the node's own view (which nodes exist, which pod blocks they own, which
//! encapsulation the routes prescribe, who is allowed) into named problems
//! per peer, each with evidence and a next step, raised when a condition
//! starts and cleared (with its duration) when it ends.
//!
//! Pure logic over values passed in: no kernel, no clock (times come from
//! the caller), so every rule has fast unit tests.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    net::IpAddr,
    time::{Duration, SystemTime},
};

use ipnet::IpNet;
use observer_common::{ClassifierDrop, Direction, Proto};
use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    model::aggregate::Row,
    model::facts::{self, ExpectedPeer, SetKind, longest_prefix},
    model::rows::DropRow,
    model::rows::Origin,
};

/// (peer, encapsulation) pairs whose history is kept; beyond it the
/// longest-idle ones are forgotten (and counted), so attacker-chosen
/// sources cannot grow memory. An idle pair keeps a single sample.
pub const MAX_TRACKED_PEERS: usize = 65536;

/// Kernel drop reason of netfilter's DROP verdict (Calico's rules).
const NETFILTER_DROP: &str = "NETFILTER_DROP";

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
}

impl Kind {
    /// Every kind, in the order findings are listed (most decisive first).
    pub const ALL: [Kind; 7] = [
        Kind::OneWay,
        Kind::SnatSuspected,
        Kind::AllowSetDrop,
        Kind::EncapMismatch,
        Kind::Mtu,
        Kind::UnknownPeer,
        Kind::DropSpike,
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
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            window: Duration::from_secs(5),
            min_packets: 5,
            drop_spike_pps: 5.0,
        }
    }
}

/// What this node knows about its peers: the data plane's expected nodes,
/// its own addresses and the allow-sets.
#[derive(Debug, Clone, Default)]
pub struct Known {
    /// Expected peer nodes by underlay address (from the data plane).
    pub nodes: BTreeMap<IpAddr, ExpectedPeer>,
    /// This node's own addresses.
    pub local: BTreeSet<IpAddr>,
    /// Allowed sources (VXLAN, IPIP); `None` before they were read.
    pub allow: Option<facts::Snapshot>,
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
        let kind = set_kind(proto)?;
        let set = self.allow.as_ref()?.get(kind);
        if !set.active() {
            return None;
        }
        // One set lookup per prefix length rather than a scan of every
        // prefix: sets hold one entry per node, possibly thousands.
        let max_len = if addr.is_ipv4() { 32 } else { 128 };
        Some(
            (0..=max_len).any(|len| {
                IpNet::new(addr, len).is_ok_and(|net| set.prefixes.contains(&net.trunc()))
            }),
        )
    }

    fn is_node(&self, addr: IpAddr) -> bool {
        self.nodes.contains_key(&addr)
    }
}

fn set_kind(proto: Proto) -> Option<SetKind> {
    match proto {
        Proto::Vxlan => Some(SetKind::Vxlan),
        Proto::Ipip | Proto::Ip6ip => Some(SetKind::Ipip),
        _ => None,
    }
}

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

/// Anomalies active at once; beyond it new ones are only counted, so a
/// flood of spoofed sources cannot flood the output (each would be an
/// `unknown_peer`).
pub const MAX_ACTIVE: usize = 1024;

/// Findings kept for one write-up; beyond it they are only counted.
pub const MAX_FINDINGS: usize = 256;

/// Every anomaly seen during a bounded run (`observer diagnose`), with its
/// latest evidence, whether it still holds, and how long it lasted.
#[derive(Debug, Default)]
pub struct Findings {
    entries: BTreeMap<ActiveKey, FindingRecord>,
    /// Findings not kept because [`MAX_FINDINGS`] were already.
    pub overflow: u64,
}

/// One entry of [`Findings`].
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

impl Findings {
    /// Folds in one read's events.
    pub fn record(&mut self, events: &[Event]) {
        for event in events {
            let (anomaly, active, duration) = match event {
                Event::Raised(a) => (a, true, None),
                Event::Cleared { anomaly, duration } => (anomaly, false, Some(*duration)),
            };
            let key = (anomaly.kind, anomaly.peer, anomaly.proto);
            if !self.entries.contains_key(&key) && self.entries.len() >= MAX_FINDINGS {
                self.overflow += 1;
                continue;
            }
            let entry = self.entries.entry(key).or_insert_with(|| FindingRecord {
                anomaly: anomaly.clone(),
                active,
                duration_s: None,
                meaning: anomaly.kind.meaning(),
            });
            entry.active = active;
            entry.duration_s = duration.map(|d| (d.as_secs_f64() * 10.0).round() / 10.0);
            if !active {
                entry.anomaly.evidence = anomaly.evidence.clone();
                entry.anomaly.summary = anomaly.summary.clone();
            }
        }
    }

    /// Refreshes the evidence of the anomalies active now.
    pub fn still_active(&mut self, active: &[&Anomaly]) {
        for a in active {
            if let Some(entry) = self.entries.get_mut(&(a.kind, a.peer, a.proto)) {
                entry.anomaly.evidence = a.evidence.clone();
                entry.anomaly.summary = a.summary.clone();
                entry.anomaly.hint = a.hint.clone();
            }
        }
    }

    /// Findings in kind order (most decisive first), then peer.
    pub fn list(&self) -> Vec<&FindingRecord> {
        let mut list: Vec<&FindingRecord> = self.entries.values().collect();
        list.sort_by_key(|f| (f.anomaly.kind, f.anomaly.peer));
        list
    }

    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.overflow == 0
    }
}

/// Totals of one (peer, encapsulation) at one read; all since attach.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Totals {
    tx: u64,
    rx: u64,
    /// Classifier `calico_allow_set`.
    allow_set: u64,
    /// Kernel NETFILTER_DROP.
    netfilter: u64,
    over_mtu: u64,
    outer_fragment: u64,
    path_mtu: u64,
    /// Drops the kernel reported, whatever the reason.
    kernel_drops: u64,
    /// Drops the classifier predicts (every reason but outer_fragment,
    /// which is no drop by itself).
    classifier_drops: u64,
}

impl Totals {
    fn minus(&self, base: &Totals) -> Totals {
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
    fn drops(&self) -> u64 {
        self.kernel_drops.max(self.classifier_drops)
    }
}

/// What one read says about one (peer, encapsulation) beyond counts.
#[derive(Debug, Clone, Default)]
struct Extra {
    /// Latest inner source seen from the peer.
    inner_src: Option<IpAddr>,
    /// Lowest next-hop MTU routers reported.
    path_mtu: Option<u32>,
    /// Drops by reason name, since attach.
    reasons: BTreeMap<String, u64>,
}

/// History of one (peer, encapsulation).
#[derive(Debug, Default)]
struct Track {
    /// (time, totals), oldest first, spanning a little more than the window.
    samples: VecDeque<(f64, Totals)>,
    extra: Extra,
    last_seen: f64,
}

type Key = (IpAddr, Proto);
type ActiveKey = (Kind, IpAddr, Proto);

/// Active anomaly with its monotonic start.
#[derive(Debug)]
struct Active {
    anomaly: Anomaly,
    started: f64,
}

/// Raises and clears anomalies from successive reads.
#[derive(Debug)]
pub struct Engine {
    thresholds: Thresholds,
    tracks: HashMap<Key, Track>,
    active: BTreeMap<ActiveKey, Active>,
    /// When counting started (attach).
    start: f64,
    /// Time of the previous read: a peer seen for the first time had zero
    /// packets then.
    previous: f64,
    forgotten_peers: u64,
    raised: BTreeMap<Kind, u64>,
    suppressed: u64,
}

impl Engine {
    /// An engine with `thresholds`, for counters that started at `start`
    /// (seconds on the monotonic clock `observe` is given).
    pub fn new(thresholds: Thresholds, start: f64) -> Engine {
        Engine {
            thresholds,
            tracks: HashMap::new(),
            active: BTreeMap::new(),
            start,
            previous: start,
            forgotten_peers: 0,
            raised: BTreeMap::new(),
            suppressed: 0,
        }
    }

    /// Changes the thresholds (SIGHUP); history is kept.
    pub fn set_thresholds(&mut self, thresholds: Thresholds) {
        self.thresholds = thresholds;
    }

    /// Anomalies active now, in kind then peer order.
    pub fn active(&self) -> Vec<&Anomaly> {
        self.active.values().map(|a| &a.anomaly).collect()
    }

    /// Anomalies raised so far, by kind.
    pub fn raised(&self) -> &BTreeMap<Kind, u64> {
        &self.raised
    }

    /// Anomalies not raised because [`MAX_ACTIVE`] were active.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }

    /// Peers forgotten because more than [`MAX_TRACKED_PEERS`] were seen.
    pub fn forgotten_peers(&self) -> u64 {
        self.forgotten_peers
    }

    /// Folds in one read (`now` in seconds on a monotonic clock, `wall`
    /// the same instant on the wall clock) and returns what changed.
    pub fn observe(
        &mut self,
        now: f64,
        wall: SystemTime,
        rows: &[Row],
        drops: &[DropRow],
        known: &Known,
    ) -> Vec<Event> {
        let start = self.start;
        let (totals, extras) = collect(rows, drops, &known.local);
        let zero_at = self.previous;
        let keep_from = now - self.thresholds.window.as_secs_f64() * 2.0;
        // A pair the rows no longer have was forgotten by the aggregator
        // too: if it comes back, its totals start from zero again.
        self.tracks.retain(|key, _| totals.contains_key(key));
        for (key, t) in totals {
            let track = self.tracks.entry(key).or_default();
            if track.samples.is_empty() && zero_at < now {
                track.samples.push_back((zero_at, Totals::default()));
            }
            // Only changes are kept: an unchanged pair's latest sample
            // still tells its totals, and idle pairs stay one sample.
            if track.samples.back().map(|s| s.1) != Some(t) {
                track.last_seen = now;
                track.samples.push_back((now, t));
            }
            // Keep one sample at or before the window's start as the base.
            while track.samples.len() > 2 && track.samples[1].0 <= keep_from {
                track.samples.pop_front();
            }
            if let Some(extra) = extras.get(&key) {
                if extra.inner_src.is_some() {
                    track.extra.inner_src = extra.inner_src;
                }
                if extra.path_mtu.is_some() {
                    track.extra.path_mtu = extra.path_mtu;
                }
                track.extra.reasons.clone_from(&extra.reasons);
            }
        }
        self.forget_excess();
        self.previous = now;

        let mut conditions: BTreeMap<ActiveKey, Finding> = BTreeMap::new();
        for (&(peer, proto), track) in &self.tracks {
            let Some(w) = self.window_delta(track, now) else {
                continue;
            };
            let full_window = now - start >= self.thresholds.window.as_secs_f64() - 1e-6
                && now - w.since >= self.thresholds.window.as_secs_f64() - 1e-6;
            for finding in rules(
                &self.thresholds,
                peer,
                proto,
                &w.delta,
                w.seconds,
                full_window,
                &track.extra,
                known,
            ) {
                conditions.insert((finding.kind, peer, proto), finding);
            }
        }
        self.transition(now, wall, conditions)
    }

    /// Raises new conditions, updates running ones, clears ended ones.
    fn transition(
        &mut self,
        now: f64,
        wall: SystemTime,
        mut conditions: BTreeMap<ActiveKey, Finding>,
    ) -> Vec<Event> {
        let mut events = Vec::new();
        let ended: Vec<ActiveKey> = self
            .active
            .keys()
            .filter(|k| !conditions.contains_key(k))
            .copied()
            .collect();
        for key in ended {
            let active = self.active.remove(&key).expect("listed just now");
            events.push(Event::Cleared {
                duration: Duration::from_secs_f64((now - active.started).max(0.0)),
                anomaly: active.anomaly,
            });
        }
        for (key, finding) in std::mem::take(&mut conditions) {
            let (kind, peer, proto) = key;
            let full = self.active.len() >= MAX_ACTIVE;
            match self.active.get_mut(&key) {
                Some(active) => {
                    active.anomaly.evidence = finding.evidence;
                    active.anomaly.summary = finding.summary;
                    active.anomaly.hint = finding.hint;
                }
                None if full => {
                    if self.suppressed == 0 {
                        tracing::warn!(
                            max = MAX_ACTIVE,
                            "too many anomalies at once; further ones are only counted (spoofed sources?)"
                        );
                    }
                    self.suppressed += 1;
                }
                None => {
                    let anomaly = Anomaly {
                        kind,
                        peer,
                        proto,
                        since: wall,
                        evidence: finding.evidence,
                        summary: finding.summary,
                        hint: finding.hint,
                    };
                    *self.raised.entry(kind).or_default() += 1;
                    events.push(Event::Raised(anomaly.clone()));
                    self.active.insert(
                        key,
                        Active {
                            anomaly,
                            started: now,
                        },
                    );
                }
            }
        }
        events
    }

    /// Totals over the window: the latest sample minus the newest one at
    /// or before the window's start (or the oldest kept).
    fn window_delta(&self, track: &Track, now: f64) -> Option<WindowDelta> {
        let (_, latest) = *track.samples.back()?;
        let window_start = now - self.thresholds.window.as_secs_f64();
        let base = track
            .samples
            .iter()
            .rev()
            .find(|(t, _)| *t <= window_start + 1e-6)
            .or_else(|| track.samples.front())?;
        Some(WindowDelta {
            delta: latest.minus(&base.1),
            since: base.0,
            seconds: (now - base.0).max(1e-3),
        })
    }

    /// Keeps at most [`MAX_TRACKED_PEERS`] tracks, forgetting the longest
    /// idle ones.
    fn forget_excess(&mut self) {
        if self.tracks.len() <= MAX_TRACKED_PEERS {
            return;
        }
        let mut by_age: Vec<(f64, Key)> =
            self.tracks.iter().map(|(k, t)| (t.last_seen, *k)).collect();
        by_age.sort_by(|a, b| a.0.total_cmp(&b.0));
        let excess = self.tracks.len() - MAX_TRACKED_PEERS;
        for (_, key) in by_age.into_iter().take(excess) {
            self.tracks.remove(&key);
            self.forgotten_peers += 1;
        }
    }
}

struct WindowDelta {
    delta: Totals,
    since: f64,
    seconds: f64,
}

/// A condition that holds now.
struct Finding {
    kind: Kind,
    evidence: BTreeMap<&'static str, Value>,
    summary: String,
    hint: String,
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
fn collect(
    rows: &[Row],
    drops: &[DropRow],
    local: &BTreeSet<IpAddr>,
) -> (HashMap<Key, Totals>, HashMap<Key, Extra>) {
    let mut totals: HashMap<Key, Totals> = HashMap::new();
    let mut extras: HashMap<Key, Extra> = HashMap::new();
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
            // The row's vni field holds the reported next-hop MTU.
            if let Some(mtu) = id.mtu {
                extra.path_mtu = Some(extra.path_mtu.map_or(mtu, |m| m.min(mtu)));
            }
        }
    }
    (totals, extras)
}

/// Outer header bytes each encapsulation adds (IPv4 underlay).
fn overhead(proto: Proto) -> u32 {
    match proto {
        Proto::Vxlan | Proto::VxlanGpe | Proto::Geneve => 50,
        Proto::Ipip => 20,
        Proto::Ip6ip => 40,
        Proto::Gre => 24,
        Proto::Wireguard => 60,
        Proto::Other => 0,
    }
}

/// How an encapsulation is recognised on the path, for hints.
fn carrier(proto: Proto) -> &'static str {
    match proto {
        Proto::Vxlan => "VXLAN (UDP 4789/8472)",
        Proto::VxlanGpe => "VXLAN-GPE (UDP 4790)",
        Proto::Geneve => "Geneve (UDP 6081)",
        Proto::Ipip => "IPIP (IP protocol 4)",
        Proto::Ip6ip => "IPv6-in-IP (IP protocol 41)",
        Proto::Gre => "GRE (IP protocol 47)",
        Proto::Wireguard => "WireGuard (UDP 51820)",
        Proto::Other => "plain IP",
    }
}

fn upper(proto: Proto) -> String {
    proto.name().to_uppercase()
}

fn set_names(proto: Proto) -> String {
    set_kind(proto).map_or_else(String::new, |k| k.calico_sets().join("/"))
}

/// Every rule, for one (peer, encapsulation) over the window.
#[allow(clippy::too_many_arguments)]
fn rules(
    th: &Thresholds,
    peer: IpAddr,
    proto: Proto,
    d: &Totals,
    seconds: f64,
    full_window: bool,
    extra: &Extra,
    known: &Known,
) -> Vec<Finding> {
    let mut found = Vec::new();
    let p = upper(proto);
    let secs = seconds.round().max(1.0) as u64;
    let is_node = known.is_node(peer);

    // one_way: needs a whole window of evidence. Received-only traffic from
    // an address that is no node is left to snat_suspected / unknown_peer.
    if full_window {
        if d.tx >= th.min_packets && d.rx == 0 && proto != Proto::Wireguard {
            found.push(Finding {
                kind: Kind::OneWay,
                evidence: BTreeMap::from([
                    ("direction", json!("tx_only")),
                    ("sent", json!(d.tx)),
                    ("received", json!(0)),
                    ("window_s", json!(secs)),
                ]),
                summary: format!(
                    "{p} to {peer}: {} packets sent, none received from {peer} in {secs} s",
                    d.tx
                ),
                hint: format!(
                    "run `observer diagnose` on {peer}: if nothing arrives there, the path drops {} in this direction; if it arrives from another address, a router rewrites the source",
                    carrier(proto)
                ),
            });
        } else if d.rx >= th.min_packets && d.tx == 0 && is_node {
            found.push(Finding {
                kind: Kind::OneWay,
                evidence: BTreeMap::from([
                    ("direction", json!("rx_only")),
                    ("sent", json!(0)),
                    ("received", json!(d.rx)),
                    ("window_s", json!(secs)),
                ]),
                summary: format!(
                    "{p} from {peer}: {} packets received, none sent back to {peer} in {secs} s",
                    d.rx
                ),
                hint: format!(
                    "replies to {peer} do not leave by {p}: check this node's routes to {peer}'s pod blocks (`ip route | grep {peer}`) and whether the packets are dropped here (drop rows)"
                ),
            });
        }
    }

    // snat_suspected: the outer source is no node, the inner source is a
    // node's pod address.
    if d.rx > 0
        && !is_node
        && let Some(inner) = extra.inner_src
        && let Some((node, block)) = known.node_owning(inner)
    {
        found.push(Finding {
            kind: Kind::SnatSuspected,
            evidence: BTreeMap::from([
                ("outer_source", json!(peer)),
                ("inner_source", json!(inner)),
                ("real_node", json!(node)),
                ("pod_block", json!(block.to_string())),
                ("packets", json!(d.rx)),
            ]),
            summary: format!(
                "{p} arrives from {peer}, which is no node, carrying {inner} from {node}'s pod block {block}: {node} really sent it"
            ),
            hint: format!(
                "a router between {node} and this node source-NATs {}: exempt it from NAT (or use an encapsulation the router does not NAT, such as IPIP)",
                carrier(proto)
            ),
        });
    }

    // allow_set_drop: the classifier's allow-set verdict or netfilter's DROP.
    let allow_drops = d.allow_set.max(d.netfilter);
    if allow_drops > 0 {
        let sets = set_names(proto);
        found.push(Finding {
            kind: Kind::AllowSetDrop,
            evidence: BTreeMap::from([
                ("calico_allow_set", json!(d.allow_set)),
                ("netfilter_drop", json!(d.netfilter)),
                ("allow_set", json!(sets)),
                ("window_s", json!(secs)),
            ]),
            summary: format!(
                "{allow_drops} {p} packets from {peer} dropped in {secs} s: source not in {sets}"
            ),
            hint: if is_node {
                format!("{peer} is a node: add it to {sets} (is its calico-node running and its Node address right?)")
            } else {
                format!(
                    "if {peer} is a real node, add it to {sets}; if it is a router's address, the real sender is hidden by SNAT (see snat_suspected)"
                )
            },
        });
    }

    // encap_mismatch: a node's routes prescribe other encapsulations.
    if let Some(node) = known.nodes.get(&peer)
        && !node.encaps.is_empty()
        && !node.encaps.contains(&proto)
        && d.tx + d.rx >= th.min_packets
    {
        let prescribed: Vec<&str> = node.encaps.iter().map(|e| e.name()).collect();
        found.push(Finding {
            kind: Kind::EncapMismatch,
            evidence: BTreeMap::from([
                ("on_wire", json!(proto.name())),
                ("routes_prescribe", json!(prescribed)),
                ("devices", json!(node.devices)),
                ("sent", json!(d.tx)),
                ("received", json!(d.rx)),
            ]),
            summary: format!(
                "{p} on the wire with {peer} ({} sent, {} received), but this node's routes to it prescribe {}",
                d.tx,
                d.rx,
                prescribed.join("/")
            ),
            hint: format!(
                "one side still runs the old encapsulation: compare the routes on both nodes (`ip route | grep {peer}`) with the pool the data plane reads (Calico: the IPPool's ipipMode/vxlanMode, not the Installation)"
            ),
        });
    }

    // mtu: above the interface MTU, outer fragments, routers' "too big".
    let mtu_events = d.over_mtu + d.outer_fragment + d.path_mtu;
    if mtu_events > 0 {
        let mut evidence = BTreeMap::from([
            ("over_mtu", json!(d.over_mtu)),
            ("outer_fragments", json!(d.outer_fragment)),
            ("too_big_errors", json!(d.path_mtu)),
            ("overhead_bytes", json!(overhead(proto))),
        ]);
        let reported = extra.path_mtu.filter(|_| d.path_mtu > 0);
        if let Some(mtu) = reported {
            evidence.insert("path_mtu", json!(mtu));
        }
        let fit = reported.map_or(String::new(), |mtu| {
            format!(
                " (at most {} for {p} over a {mtu}-byte path)",
                mtu.saturating_sub(overhead(proto))
            )
        });
        found.push(Finding {
            kind: Kind::Mtu,
            evidence,
            summary: format!(
                "{p} with {peer}: {} above the MTU, {} outer fragments, {} routers' too-big errors in {secs} s",
                d.over_mtu, d.outer_fragment, d.path_mtu
            ),
            hint: format!(
                "the tunnel MTU plus {} bytes of {p} overhead exceeds the path MTU: lower the tunnel and pod MTU{fit} or raise the underlay MTU on the path",
                overhead(proto)
            ),
        });
    }

    // unknown_peer: neither a node nor allowed, when either is known. The
    // allow-set is only looked up for sources that are no node.
    let allowed = (d.rx > 0 && !is_node).then(|| known.allowed(proto, peer));
    if let Some(allowed) = allowed
        && allowed != Some(true)
        && (!known.nodes.is_empty() || allowed.is_some())
    {
        found.push(Finding {
            kind: Kind::UnknownPeer,
            evidence: BTreeMap::from([
                ("received", json!(d.rx)),
                ("known_nodes", json!(known.nodes.len())),
                ("in_allow_set", json!(allowed)),
            ]),
            summary: format!(
                "{} {p} packets from {peer}, which is neither a node in this node's routes nor in {}",
                d.rx,
                if set_kind(proto).is_some() {
                    set_names(proto)
                } else {
                    "an allow-set".to_string()
                }
            ),
            hint: format!(
                "find out what owns {peer}: a router doing SNAT (see snat_suspected), a node missing from the routes and allow-set, or traffic that should not be here"
            ),
        });
    }

    // drop_spike: the drop rate over the window (a shorter history, at
    // start, had no drops before it).
    let drops = d.drops();
    let rate = drops as f64 / seconds.max(th.window.as_secs_f64());
    if rate > th.drop_spike_pps {
        let reasons: BTreeMap<&str, u64> = extra
            .reasons
            .iter()
            .map(|(r, n)| (r.as_str(), *n))
            .collect();
        found.push(Finding {
            kind: Kind::DropSpike,
            evidence: BTreeMap::from([
                ("drops", json!(drops)),
                ("drops_per_second", json!((rate * 10.0).round() / 10.0)),
                ("threshold_per_second", json!(th.drop_spike_pps)),
                ("reasons_since_attach", json!(reasons)),
            ]),
            summary: format!(
                "{rate:.1} {p} drops/s for {peer} ({drops} in {secs} s; threshold {})",
                th.drop_spike_pps
            ),
            hint: format!(
                "see the drop rows for {peer}: the reasons say whether policy (allow-set, netfilter), the VNI, or the MTU drops them"
            ),
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::facts::{AllowSet, Snapshot},
        model::rows::{DropId, FlowId, testing},
    };

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn flow(peer: &str, proto: Proto, direction: Direction, packets: u64) -> Row {
        testing::row(
            FlowId {
                proto,
                direction,
                ..testing::flow_id(peer)
            },
            packets,
        )
    }

    /// `vni_or_mtu` is the MTU of a `path_mtu` row, else its VNI.
    fn drop(
        peer: &str,
        proto: Proto,
        reason: ClassifierDrop,
        packets: u64,
        vni_or_mtu: u32,
    ) -> DropRow {
        let path_mtu = reason == ClassifierDrop::PathMtu;
        let id = DropId {
            proto,
            vni: if path_mtu { 0 } else { vni_or_mtu },
            mtu: path_mtu.then_some(vni_or_mtu),
            ..testing::drop_id(peer, Origin::Classifier, reason as u32)
        };
        testing::drop_row(id, packets, reason.name())
    }

    fn known() -> Known {
        let mut nodes = BTreeMap::new();
        nodes.insert(
            ip("10.10.60.127"),
            ExpectedPeer {
                blocks: vec!["10.42.168.192/26".parse().unwrap()],
                encaps: BTreeSet::from([Proto::Vxlan]),
                devices: vec!["vxlan.calico".into()],
                route_mtu: None,
            },
        );
        nodes.insert(
            ip("10.10.60.209"),
            ExpectedPeer {
                blocks: vec!["10.42.10.0/26".parse().unwrap()],
                encaps: BTreeSet::from([Proto::Ipip]),
                devices: vec!["tunl0".into()],
                route_mtu: None,
            },
        );
        let set = |prefixes: &[&str]| AllowSet {
            ipv4: true,
            ipv6: false,
            prefixes: prefixes.iter().map(|p| p.parse().unwrap()).collect(),
            sources: vec!["ipset:cali40all-vxlan-net".into()],
        };
        Known {
            nodes,
            local: BTreeSet::from([ip("10.10.10.62")]),
            allow: Some(Snapshot {
                vxlan: set(&["10.10.60.127/32", "10.10.60.209/32"]),
                ipip: set(&["10.10.60.127/32", "10.10.60.209/32"]),
                problems: vec![],
            }),
        }
    }

    fn th() -> Thresholds {
        Thresholds {
            window: Duration::from_secs(5),
            min_packets: 5,
            drop_spike_pps: 5.0,
        }
    }

    /// Runs reads at t = 1, 2, ... with rows from `read(t)`; returns all events.
    fn drive(
        engine: &mut Engine,
        known: &Known,
        seconds: u32,
        read: impl Fn(u32) -> (Vec<Row>, Vec<DropRow>),
    ) -> Vec<Event> {
        let mut events = Vec::new();
        for t in 1..=seconds {
            let (rows, drops) = read(t);
            let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(t as u64);
            events.extend(engine.observe(t as f64, wall, &rows, &drops, known));
        }
        events
    }

    fn raised(events: &[Event]) -> Vec<(Kind, String)> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Raised(a) => Some((a.kind, a.peer.to_string())),
                Event::Cleared { .. } => None,
            })
            .collect()
    }

    #[test]
    fn healthy_traffic_raises_nothing() {
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 30, |t| {
            let n = t as u64 * 10;
            (
                vec![
                    flow("10.10.60.127", Proto::Vxlan, Direction::Tx, n),
                    flow("10.10.60.127", Proto::Vxlan, Direction::Rx, n),
                    flow("10.10.60.209", Proto::Ipip, Direction::Tx, n),
                    flow("10.10.60.209", Proto::Ipip, Direction::Rx, n),
                ],
                vec![],
            )
        });
        assert_eq!(events, vec![]);
    }

    #[test]
    fn one_way_needs_a_full_window_and_clears_when_replies_come() {
        let mut e = Engine::new(th(), 0.0);
        // Sent only, for 4 s: not yet a whole window.
        let events = drive(&mut e, &known(), 4, |t| {
            (
                vec![flow(
                    "10.10.60.127",
                    Proto::Vxlan,
                    Direction::Tx,
                    t as u64 * 10,
                )],
                vec![],
            )
        });
        assert!(events.is_empty());
        let events = e.observe(
            5.0,
            SystemTime::UNIX_EPOCH + Duration::from_secs(5),
            &[flow("10.10.60.127", Proto::Vxlan, Direction::Tx, 50)],
            &[],
            &known(),
        );
        let Event::Raised(a) = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(a.kind, Kind::OneWay);
        assert_eq!(a.evidence["direction"], json!("tx_only"));
        assert_eq!(a.evidence["sent"], json!(50));
        assert_eq!(
            a.summary,
            "VXLAN to 10.10.60.127: 50 packets sent, none received from 10.10.60.127 in 5 s"
        );
        // Replies arrive: cleared, with the duration.
        let events = e.observe(
            7.0,
            SystemTime::UNIX_EPOCH + Duration::from_secs(7),
            &[
                flow("10.10.60.127", Proto::Vxlan, Direction::Tx, 70),
                flow("10.10.60.127", Proto::Vxlan, Direction::Rx, 3),
            ],
            &[],
            &known(),
        );
        assert_eq!(events.len(), 1);
        let Event::Cleared { anomaly, duration } = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(anomaly.kind, Kind::OneWay);
        assert_eq!(*duration, Duration::from_secs(2));
        assert!(e.active().is_empty());
    }

    #[test]
    fn one_way_below_min_packets_is_quiet_and_rx_only_needs_a_node() {
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 10, |_| {
            (
                vec![
                    // 4 packets only.
                    flow("10.10.60.127", Proto::Vxlan, Direction::Tx, 4),
                    flow("10.10.60.209", Proto::Ipip, Direction::Rx, 100),
                ],
                vec![],
            )
        });
        // The IPIP peer's 100 packets all came in the first second.
        let raised = raised(&events);
        assert!(!raised.contains(&(Kind::OneWay, "10.10.60.127".into())));
        assert!(raised.contains(&(Kind::OneWay, "10.10.60.209".into())));
        assert_eq!(
            e.active().iter().filter(|a| a.kind == Kind::OneWay).count(),
            0,
            "quiet for a whole window: cleared"
        );
    }

    #[test]
    fn the_incident_on_the_gpu_node() {
        let mut e = Engine::new(th(), 0.0);
        let mut snat = flow("10.10.10.244", Proto::Vxlan, Direction::Rx, 0);
        snat.inner = Some((ip("10.42.168.210"), ip("10.42.182.1")));
        let events = drive(&mut e, &known(), 6, |t| {
            let n = t as u64 * 10;
            let mut snat = snat.clone();
            snat.packets = n;
            (
                vec![
                    flow("10.10.60.127", Proto::Vxlan, Direction::Tx, n),
                    snat,
                    flow("10.10.60.209", Proto::Ipip, Direction::Rx, n),
                    flow("10.10.60.209", Proto::Ipip, Direction::Tx, n),
                ],
                vec![drop(
                    "10.10.10.244",
                    Proto::Vxlan,
                    ClassifierDrop::CalicoAllowSet,
                    n,
                    4096,
                )],
            )
        });
        let mut raised = raised(&events);
        raised.sort();
        assert_eq!(
            raised,
            vec![
                (Kind::OneWay, "10.10.60.127".into()),
                (Kind::SnatSuspected, "10.10.10.244".into()),
                (Kind::AllowSetDrop, "10.10.10.244".into()),
                (Kind::UnknownPeer, "10.10.10.244".into()),
                (Kind::DropSpike, "10.10.10.244".into()),
            ]
        );
        let snat = e
            .active()
            .into_iter()
            .find(|a| a.kind == Kind::SnatSuspected)
            .unwrap()
            .clone();
        assert_eq!(snat.evidence["real_node"], json!("10.10.60.127"));
        assert_eq!(snat.evidence["inner_source"], json!("10.42.168.210"));
        assert_eq!(snat.evidence["pod_block"], json!("10.42.168.192/26"));
        let line = serde_json::to_value(&snat).unwrap();
        assert_eq!(line["since"], json!("1970-01-01T00:00:01.000Z"));
        assert_eq!(line["kind"], json!("snat_suspected"));
        assert_eq!(line["proto"], json!("vxlan"));
    }

    #[test]
    fn encap_mismatch_against_the_routes() {
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 3, |t| {
            let n = t as u64 * 10;
            (
                vec![
                    // Routes to .209 say IPIP; VXLAN arrives.
                    flow("10.10.60.209", Proto::Vxlan, Direction::Rx, n),
                    flow("10.10.60.209", Proto::Ipip, Direction::Tx, n),
                ],
                vec![],
            )
        });
        assert_eq!(
            raised(&events),
            vec![(Kind::EncapMismatch, "10.10.60.209".into())]
        );
        let a = e.active()[0];
        assert_eq!(a.evidence["routes_prescribe"], json!(["ipip"]));
        assert_eq!(a.evidence["on_wire"], json!("vxlan"));
    }

    #[test]
    fn mtu_from_fragments_and_too_big_errors() {
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 2, |t| {
            let n = t as u64 * 10;
            (
                vec![
                    flow("10.10.60.209", Proto::Ipip, Direction::Tx, n),
                    flow("10.10.60.209", Proto::Ipip, Direction::Rx, n),
                ],
                vec![
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
                        ClassifierDrop::OuterFragment,
                        t as u64,
                        0,
                    ),
                ],
            )
        });
        assert_eq!(raised(&events), vec![(Kind::Mtu, "10.10.60.209".into())]);
        let a = e.active()[0];
        assert_eq!(a.evidence["path_mtu"], json!(1400));
        assert_eq!(a.evidence["too_big_errors"], json!(2));
        assert_eq!(a.evidence["outer_fragments"], json!(2));
        assert!(a.hint.contains("at most 1380 for IPIP"), "{}", a.hint);
    }

    #[test]
    fn allowed_unknown_sources_and_nothing_known() {
        // In the allow-set but not routed to: not unknown.
        let mut k = known();
        k.allow
            .as_mut()
            .unwrap()
            .vxlan
            .prefixes
            .insert("10.10.99.0/24".parse().unwrap());
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &k, 3, |t| {
            (
                vec![flow("10.10.99.5", Proto::Vxlan, Direction::Rx, t as u64)],
                vec![],
            )
        });
        assert_eq!(events, vec![]);
        // A node without routes or allow-sets knows nothing: no unknown_peer.
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &Known::default(), 3, |t| {
            (
                vec![flow("10.10.99.5", Proto::Vxlan, Direction::Rx, t as u64)],
                vec![],
            )
        });
        assert_eq!(events, vec![]);
    }

    #[test]
    fn drop_spike_threshold_and_clearing() {
        let mut e = Engine::new(th(), 0.0);
        // 4 drops/s: below 5/s.
        let events = drive(&mut e, &known(), 6, |t| {
            (
                vec![],
                vec![drop(
                    "10.10.60.127",
                    Proto::Vxlan,
                    ClassifierDrop::VniUnknown,
                    t as u64 * 4,
                    4096,
                )],
            )
        });
        assert_eq!(events, vec![]);
        // 20 drops/s, then none: raised, then cleared once the window passes.
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 15, |t| {
            (
                vec![],
                vec![drop(
                    "10.10.60.127",
                    Proto::Vxlan,
                    ClassifierDrop::VniUnknown,
                    t.min(5) as u64 * 20,
                    4096,
                )],
            )
        });
        assert_eq!(
            raised(&events),
            vec![(Kind::DropSpike, "10.10.60.127".into())]
        );
        assert!(matches!(events.last(), Some(Event::Cleared { .. })));
    }

    #[test]
    fn active_anomalies_are_bounded() {
        let mut e = Engine::new(th(), 0.0);
        let rows: Vec<Row> = (0..(MAX_ACTIVE as u32 + 10))
            .map(|i| {
                let mut r = flow("10.0.0.0", Proto::Vxlan, Direction::Rx, 1);
                r.id.peer = Some(IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + i)));
                r
            })
            .collect();
        // Each source is neither a node nor allowed: unknown_peer for all.
        let events = e.observe(1.0, SystemTime::UNIX_EPOCH, &rows, &[], &known());
        assert_eq!(events.len(), MAX_ACTIVE);
        assert_eq!(e.active().len(), MAX_ACTIVE);
        assert_eq!(e.suppressed(), 10);
    }

    #[test]
    fn tracked_peers_are_bounded() {
        let mut e = Engine::new(th(), 0.0);
        let rows: Vec<Row> = (0..(MAX_TRACKED_PEERS as u32 + 100))
            .map(|i| {
                let peer = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
                let mut r = flow("10.0.0.0", Proto::Vxlan, Direction::Tx, 1);
                r.id.peer = Some(peer);
                r
            })
            .collect();
        e.observe(1.0, SystemTime::UNIX_EPOCH, &rows, &[], &Known::default());
        assert_eq!(e.tracks.len(), MAX_TRACKED_PEERS);
        assert_eq!(e.forgotten_peers(), 100);
    }
}
