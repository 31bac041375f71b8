//! node_exporter textfile export: turns the rows into Prometheus metric
//! families (classic text format, via the `prometheus` crate's encoder),
//! caps the `peer` label values, and writes the file atomically.
//!
//! Counters never go backwards while the process lives: a peer that moves
//! between its own series and the capped `peer="other"` series carries its
//! counts along as offsets, so each series only ever grows and the sum over
//! series always equals the total.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fs,
    io::{self, Write},
    net::{IpAddr, Ipv4Addr},
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::LazyLock,
    time::SystemTime,
};

use foldhash::{HashMap as FastMap, HashSet as FastSet};
use prometheus::{
    Encoder, TextEncoder,
    proto::{
        Bucket as HistogramBucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily,
        MetricType,
    },
};

use observer_common::{Direction, Proto, Unclassified};

use super::view::iface_name;
use crate::{
    model::anomalies::{Anomaly, Event, Kind},
    model::bgp::BgpSession,
    model::bgp_wire::{WireCounters, WireRow},
    model::cluster::NodeIdentity,
    model::evidence::EvidenceCounts,
    model::probe::{Encap, Outcome, Run},
    model::read_order::ReadOrderMap,
    model::routes::Outage,
    model::rows::DropRow,
    model::rows::Row,
    model::rows::{KernelStats, Stage, direction_name},
};

/// Name of the file written in the textfile directory.
pub const TEXTFILE_NAME: &str = "observer.prom";
/// `peer` label value of the peers beyond `--max-peers`.
pub const OTHER_PEERS: &str = "other";

/// Label key of an encapsulation series: (iface, direction, proto, peer).
/// Integers only (the interface by its [`IfaceNames`] id): a key is made,
/// hashed and compared per row per export.
type EncapSeries = (IfaceId, Direction, Proto, Option<IpAddr>);
/// Label key of a drop series: (iface, proto, peer, reason).
type DropSeries = (IfaceId, Proto, Option<IpAddr>, String, Stage, Direction);

/// An interface name's id in [`IfaceNames`].
type IfaceId = u32;

/// The interface names the series have used, each with a small id kept for
/// the exporter's life. Bounded by the names of the interfaces the
/// observer is attached to (rows come from no others).
#[derive(Default)]
struct IfaceNames {
    names: Vec<String>,
    ids: HashMap<String, IfaceId>,
}

impl IfaceNames {
    /// The id of `name`, made on first use.
    fn id(&mut self, name: &str) -> IfaceId {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = self.names.len() as IfaceId;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }

    fn name(&self, id: IfaceId) -> String {
        self.names[id as usize].clone()
    }
}

/// A series key with a peer in it: what [`SplitFamily::export`] needs to
/// split it between its own series and "other".
trait SeriesKey: Clone + Eq + std::hash::Hash {
    /// The key's peer.
    fn peer(&self) -> Option<IpAddr>;
    /// Its labels, with `peer` as the peer value (`None`: its own peer).
    fn labels(&self, peer: Option<String>, names: &IfaceNames) -> Labels;
    /// The key without its peer: keys that differ only in their peer share
    /// one "other" series.
    fn without_peer(&self) -> Self;
}

impl SeriesKey for EncapSeries {
    fn peer(&self) -> Option<IpAddr> {
        self.3
    }

    fn labels(&self, peer: Option<String>, names: &IfaceNames) -> Labels {
        let (iface, direction, proto, own) = self;
        vec![
            ("iface", names.name(*iface)),
            ("direction", direction_name(*direction).to_string()),
            ("proto", proto.name().to_string()),
            ("peer", peer.unwrap_or_else(|| peer_label(*own))),
        ]
    }

    fn without_peer(&self) -> Self {
        (self.0, self.1, self.2, None)
    }
}

impl SeriesKey for DropSeries {
    fn peer(&self) -> Option<IpAddr> {
        self.2
    }

    fn labels(&self, peer: Option<String>, names: &IfaceNames) -> Labels {
        let (iface, proto, own, reason, stage, direction) = self;
        vec![
            ("iface", names.name(*iface)),
            ("proto", proto.name().to_string()),
            ("peer", peer.unwrap_or_else(|| peer_label(*own))),
            ("reason", reason.clone()),
            ("stage", stage.name().to_string()),
            ("direction", direction_name(*direction).to_string()),
        ]
    }

    fn without_peer(&self) -> Self {
        (self.0, self.1, None, self.3.clone(), self.4, self.5)
    }
}

/// Where a row's counts currently go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bucket {
    Own,
    Other,
}

/// Split of one row's counts between its own series and `peer="other"`,
/// for `N` counters (packets and bytes, or drops). Fixed-size arrays: one
/// split per key, updated per key at every export.
#[derive(Debug, Clone)]
struct Split<const N: usize> {
    bucket: Bucket,
    /// Number of the export that last saw the key.
    seen: u64,
    /// The row's counts at the previous export: a move between buckets
    /// takes effect from there, so the interval in which a peer rose to
    /// the top already counts as its own.
    last: [u64; N],
    /// The key's counts in the export under way (its rows summed).
    now: [u64; N],
    /// Its earlier periods, once it has moved between buckets (most keys
    /// never do: they keep no history).
    history: Option<Box<History<N>>>,
}

/// The periods a key spent in each bucket before its current one.
#[derive(Debug, Clone)]
struct History<const N: usize> {
    /// The row's counts when it entered its current bucket.
    base: [u64; N],
    /// Counts finished in each bucket in earlier periods.
    own: [u64; N],
    other: [u64; N],
}

impl<const N: usize> Split<N> {
    /// A key's split before its first export: nothing counted anywhere, so
    /// its first export puts it in whichever bucket it belongs to.
    fn new() -> Self {
        Split {
            bucket: Bucket::Own,
            seen: 0,
            last: [0; N],
            now: [0; N],
            history: None,
        }
    }

    /// Moves to `bucket` (closing the current period at the previous
    /// export's counts), then records `now` as the latest counts.
    fn assign(&mut self, bucket: Bucket, now: [u64; N]) {
        if bucket != self.bucket && self.history.is_none() && self.last == [0; N] {
            // Nothing counted yet (a key's first export): no period to
            // close, so no history to keep.
            self.bucket = bucket;
        } else if bucket != self.bucket {
            let history = self.history.get_or_insert_with(|| {
                Box::new(History {
                    base: [0; N],
                    own: [0; N],
                    other: [0; N],
                })
            });
            let done = match self.bucket {
                Bucket::Own => &mut history.own,
                Bucket::Other => &mut history.other,
            };
            for ((done, last), base) in done.iter_mut().zip(&self.last).zip(&history.base) {
                *done += last.saturating_sub(*base);
            }
            history.base = self.last;
            self.bucket = bucket;
        }
        self.last = now;
    }

    /// (own series value, contribution to the other series) at `now`.
    fn values(&self, now: &[u64; N]) -> ([u64; N], [u64; N]) {
        let (mut own, mut other, base) = match &self.history {
            Some(h) => (h.own, h.other, h.base),
            None => ([0; N], [0; N], [0; N]),
        };
        let current = match self.bucket {
            Bucket::Own => &mut own,
            Bucket::Other => &mut other,
        };
        for ((value, n), b) in current.iter_mut().zip(now).zip(&base) {
            *value += n.saturating_sub(*b);
        }
        (own, other)
    }
}

/// Everything one export needs. The default is an export with nothing
/// in it (every section empty, every count zero, read at the Unix epoch):
/// a caller names the sections it has and leaves the rest to
/// `..Default::default()`.
pub struct ExportInput<'a> {
    /// Encapsulation rows (totals since attach).
    pub rows: &'a [Row],
    /// Drop rows.
    pub drops: &'a [DropRow],
    /// Interface names by index (default: none; an interface without a
    /// name is `if<index>`).
    pub ifaces: &'a HashMap<u32, String>,
    /// Kernel self counters (default: all zero).
    pub stats: KernelStats,
    /// Programs attached now (all interfaces, all hooks).
    pub programs_attached: usize,
    /// Intervals read a whole period or more late since the start.
    pub late_intervals: u64,
    /// Times the data-plane change notifications overran their socket.
    pub netlink_overruns: u64,
    /// When the counters were read. Every real export sets it: the default
    /// (the Unix epoch) is only a neutral value for inputs that do not
    /// care.
    pub at: SystemTime,
    /// Anomalies active now.
    pub anomalies: &'a [&'a Anomaly],
    /// Anomalies raised since attach, by kind (default: none).
    pub anomalies_raised: &'a BTreeMap<Kind, u64>,
    /// BGP sessions of the node's BIRD, as last read.
    pub bgp: &'a [BgpSession],
    /// BGP at the wire, totals since attach.
    pub bgp_wire: &'a [WireRow],
    /// Each BIRD control socket followed, and whether it answered.
    pub bird_sockets: &'a [(String, bool)],
    /// Anomalies raised and cleared since the previous export: the cleared
    /// ones' durations go into `observer_anomaly_duration_seconds`.
    pub events: &'a [Event],
    /// Route outages of pod blocks that ended since the previous export.
    pub route_outages: &'a [Outage],
    /// Pod blocks routed to a node before and without a route now.
    pub blocks_missing: usize,
    /// Probe runs that ended since the previous export (`attach
    /// --probe-interval`): their round-trip times go into
    /// `observer_probe_rtt_seconds`.
    pub probe_runs: &'a [Run],
    /// The latest probe run, if probing ran.
    pub probe_latest: Option<&'a Run>,
    /// This node's name and underlay addresses: every series gets a
    /// `node` label, and `observer_node_info` maps the addresses to it
    /// (default: no name, no label).
    pub node: &'a NodeIdentity,
    /// Evidence capture's userspace counters, when it runs (default:
    /// none, no evidence series).
    pub evidence: Option<EvidenceCounts>,
}

/// The interface names of an input that has none.
static NO_IFACES: LazyLock<HashMap<u32, String>> = LazyLock::new(HashMap::new);
/// The identity of an input that has none.
static NO_NODE: NodeIdentity = NodeIdentity {
    name: String::new(),
    addresses: BTreeSet::new(),
};
/// The raised anomalies of an input that has none.
static NO_ANOMALIES_RAISED: BTreeMap<Kind, u64> = BTreeMap::new();

/// Not derived: `SystemTime` and references to maps have no default.
impl Default for ExportInput<'_> {
    fn default() -> Self {
        ExportInput {
            rows: &[],
            drops: &[],
            ifaces: &NO_IFACES,
            stats: KernelStats::default(),
            programs_attached: 0,
            late_intervals: 0,
            netlink_overruns: 0,
            at: SystemTime::UNIX_EPOCH,
            anomalies: &[],
            anomalies_raised: &NO_ANOMALIES_RAISED,
            bgp: &[],
            bgp_wire: &[],
            bird_sockets: &[],
            events: &[],
            route_outages: &[],
            blocks_missing: 0,
            probe_runs: &[],
            probe_latest: None,
            node: &NO_NODE,
            evidence: None,
        }
    }
}

/// Upper bounds of `observer_anomaly_duration_seconds`'s buckets: seconds
/// to two hours, with bounds at 4 and 6 minutes so that "recovery in 4-6
/// minutes" (the second incident's target, against 40 minutes before)
/// reads straight off the buckets.
pub const DURATION_BUCKETS: [f64; 12] = [
    5.0, 15.0, 30.0, 60.0, 120.0, 240.0, 360.0, 600.0, 1200.0, 2400.0, 3600.0, 7200.0,
];

/// Upper bounds of `observer_probe_rtt_seconds`'s buckets: 100 µs (a rack)
/// to 2.5 s (beyond any sane overlay).
pub const RTT_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

/// Probe pairs (peer, encapsulation) whose series the textfile keeps.
pub const MAX_PROBE_PAIRS: usize = 1024;

/// Durations as a Prometheus histogram, cumulative since the start: how
/// long the anomalies of one kind lasted ([`DURATION_BUCKETS`]), or the
/// round-trip times of one probe pair ([`RTT_BUCKETS`]).
#[derive(Debug)]
struct DurationHistogram {
    bounds: &'static [f64],
    /// Observations at or below each bound.
    at_or_below: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Default for DurationHistogram {
    fn default() -> Self {
        DurationHistogram::with_bounds(&DURATION_BUCKETS)
    }
}

impl DurationHistogram {
    fn with_bounds(bounds: &'static [f64]) -> DurationHistogram {
        DurationHistogram {
            bounds,
            at_or_below: vec![0; bounds.len()],
            count: 0,
            sum: 0.0,
        }
    }

    fn observe(&mut self, seconds: f64) {
        for (bound, n) in self.bounds.iter().zip(&mut self.at_or_below) {
            if seconds <= *bound {
                *n += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    /// The histogram as one metric, with `labels`.
    fn metric(&self, labels: &[(&str, &str)]) -> Metric {
        let mut histogram = Histogram::default();
        histogram.set_sample_count(self.count);
        histogram.set_sample_sum(self.sum);
        histogram.set_bucket(
            self.bounds
                .iter()
                .zip(&self.at_or_below)
                .map(|(bound, n)| {
                    let mut bucket = HistogramBucket::default();
                    bucket.set_upper_bound(*bound);
                    bucket.set_cumulative_count(*n);
                    bucket
                })
                .collect(),
        );
        let mut metric = Metric::default();
        metric.set_label(
            labels
                .iter()
                .map(|(name, value)| {
                    let mut label = LabelPair::default();
                    label.set_name(name.to_string());
                    label.set_value(value.to_string());
                    label
                })
                .collect(),
        );
        metric.set_histogram(histogram);
        metric
    }
}

/// Metric state across exports: peer label caps and error counts.
pub struct Exporter {
    max_peers: usize,
    iface_names: IfaceNames,
    encap: SplitFamily<EncapSeries, 2>,
    drop_splits: SplitFamily<DropSeries, 1>,
    /// Each peer's packets plus dropped packets in the latest export, in
    /// the rows' order (see [`ReadOrderMap`]), and the export that set it.
    peer_scores: ReadOrderMap<IpAddr, (u64, u64)>,
    /// Exports so far.
    exports: u64,
    /// Export failures so far (reported in the next successful file).
    pub errors: u64,
    /// Highest eviction count exported so far.
    evictions_exported: u64,
    /// The same for the BGP map.
    bgp_evictions_exported: u64,
    /// How long the cleared anomalies lasted, per kind.
    durations: BTreeMap<Kind, DurationHistogram>,
    /// How long pod blocks had no route, per outage.
    route_outages: DurationHistogram,
    /// Round-trip times of each probe pair (at most [`MAX_PROBE_PAIRS`]).
    probe_rtts: BTreeMap<(Ipv4Addr, Encap), DurationHistogram>,
    /// Probe runs absorbed so far.
    probe_runs: u64,
}

impl Exporter {
    /// An exporter giving at most `max_peers` peers their own label value.
    pub fn new(max_peers: usize) -> Exporter {
        Exporter {
            max_peers,
            iface_names: IfaceNames::default(),
            encap: SplitFamily::new(),
            drop_splits: SplitFamily::new(),
            peer_scores: ReadOrderMap::default(),
            exports: 0,
            errors: 0,
            evictions_exported: 0,
            bgp_evictions_exported: 0,
            durations: BTreeMap::new(),
            route_outages: DurationHistogram::default(),
            probe_rtts: BTreeMap::new(),
            probe_runs: 0,
        }
    }

    /// Changes the cap (config reload); takes effect at the next export.
    pub fn set_max_peers(&mut self, max_peers: usize) {
        self.max_peers = max_peers;
    }

    /// The peers that keep their own label: the top `max_peers` by packets
    /// plus dropped packets.
    fn labeled_peers(&mut self, input: &ExportInput<'_>) -> FastSet<IpAddr> {
        self.exports += 1;
        let export = self.exports;
        let scores = &mut self.peer_scores;
        scores.rewind();
        let peers = input.rows.iter().map(|r| (r.id.peer, r.packets));
        let dropped = input.drops.iter().map(|d| (d.row.id.peer, d.row.packets));
        for (peer, packets) in peers.chain(dropped) {
            let Some(peer) = peer else { continue };
            let (score, set_by) = scores.get_or_insert_with(peer, || (0, export));
            if *set_by != export {
                (*score, *set_by) = (0, export);
            }
            *score += packets;
        }
        scores.retain(|_, (_, set_by)| *set_by == export);
        let mut ranked: Vec<(u64, IpAddr)> = scores.iter().map(|(p, (s, _))| (*s, *p)).collect();
        // The top max_peers, in no order: a selection, not a sort of every
        // peer.
        if self.max_peers < ranked.len() {
            ranked.select_nth_unstable_by(self.max_peers, |a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            ranked.truncate(self.max_peers);
        }
        ranked.into_iter().map(|(_, p)| p).collect()
    }

    /// Adds the durations of the anomalies cleared in `events`, then
    /// returns `observer_anomaly_duration_seconds`, every kind.
    fn duration_family(&mut self, events: &[Event]) -> MetricFamily {
        for event in events {
            if let Event::Cleared { anomaly, duration } = event {
                self.durations
                    .entry(anomaly.kind)
                    .or_default()
                    .observe(duration.as_secs_f64());
            }
        }
        let mut family = MetricFamily::default();
        family.set_name("observer_anomaly_duration_seconds".to_string());
        family.set_help(
            "How long the anomalies that cleared since the observer started lasted, by kind: recovery time (bgp_down: a BGP session's outage). histogram_quantile over increase() gives, e.g., the p95 recovery time of a rollout.".to_string(),
        );
        family.set_field_type(MetricType::HISTOGRAM);
        let none = DurationHistogram::default();
        family.set_metric(
            Kind::ALL
                .iter()
                .map(|kind| {
                    self.durations
                        .get(kind)
                        .unwrap_or(&none)
                        .metric(&[("kind", kind.name())])
                })
                .collect(),
        );
        family
    }

    /// Adds the outages that ended in `outages`, then returns
    /// `observer_route_outage_seconds`.
    fn route_outage_family(&mut self, outages: &[Outage]) -> MetricFamily {
        for outage in outages {
            self.route_outages.observe(outage.duration_s);
        }
        let mut family = MetricFamily::default();
        family.set_name("observer_route_outage_seconds".to_string());
        family.set_help(
            "How long pod blocks that were routed to a node had no route here, per outage that ended since the observer started (every outage, also those shorter than the anomaly window; the block and node of each are in the route_outage lines).".to_string(),
        );
        family.set_field_type(MetricType::HISTOGRAM);
        family.set_metric(vec![self.route_outages.metric(&[])]);
        family
    }

    /// Adds the round-trip times of `runs` to their pairs' histograms (new
    /// pairs only while there is room for them).
    fn absorb_probe_runs(&mut self, runs: &[Run]) {
        for run in runs {
            self.probe_runs += 1;
            for outcome in &run.outcomes {
                let key = (outcome.target.peer, outcome.target.encap);
                let room = self.probe_rtts.len() < MAX_PROBE_PAIRS;
                let histogram = match self.probe_rtts.get_mut(&key) {
                    Some(histogram) => histogram,
                    None if room => self
                        .probe_rtts
                        .entry(key)
                        .or_insert_with(|| DurationHistogram::with_bounds(&RTT_BUCKETS)),
                    None => continue,
                };
                for rtt in &outcome.rtts {
                    histogram.observe(rtt.as_secs_f64());
                }
            }
        }
    }

    /// Adds the round-trip times of the probe runs in `input`, then
    /// returns the probe families (`observer_probe_answered_ratio`,
    /// `observer_probe_rtt_seconds`, `observer_probe_max_size_bytes`,
    /// `observer_probe_runs_total`): nothing until probing ran once.
    fn probe_families(&mut self, input: &ExportInput<'_>) -> Vec<MetricFamily> {
        self.absorb_probe_runs(input.probe_runs);
        let Some(latest) = input.probe_latest else {
            return Vec::new();
        };
        let labels = |o: &Outcome| -> Labels {
            vec![
                ("peer", o.target.peer.to_string()),
                ("encap", o.target.encap.to_string()),
            ]
        };
        let kept = |o: &&Outcome| {
            self.probe_rtts
                .contains_key(&(o.target.peer, o.target.encap))
        };
        let mut rtt = MetricFamily::default();
        rtt.set_name("observer_probe_rtt_seconds".to_string());
        rtt.set_help(
            "Round-trip time of observer's encapsulated probes (attach --probe-interval), per peer node and encapsulation, since the start.".to_string(),
        );
        rtt.set_field_type(MetricType::HISTOGRAM);
        rtt.set_metric(
            self.probe_rtts
                .iter()
                .map(|((peer, encap), histogram)| {
                    histogram.metric(&[("peer", &peer.to_string()), ("encap", &encap.to_string())])
                })
                .collect(),
        );
        vec![
            family(
                "observer_probe_answered_ratio",
                "Share of the last probe run's reachability probes that the peer answered, per peer node and encapsulation (0: unanswered, the incident's silent VXLAN).",
                MetricType::GAUGE,
                latest
                    .outcomes
                    .iter()
                    .filter(kept)
                    .map(|o| (labels(o), f64::from(o.answered) / f64::from(o.sent.max(1))))
                    .collect(),
            ),
            rtt,
            family(
                "observer_probe_max_size_bytes",
                "Largest inner packet (bytes of IP) the last probe run's size ladder got answered with DF set, per peer node and encapsulation; below the tunnel device's MTU, larger packets are lost.",
                MetricType::GAUGE,
                latest
                    .outcomes
                    .iter()
                    .filter(kept)
                    .filter_map(|o| Some((labels(o), f64::from(o.max_size?))))
                    .collect(),
            ),
            family(
                "observer_probe_runs_total",
                "Probe runs completed since the start.",
                MetricType::COUNTER,
                vec![(vec![], self.probe_runs as f64)],
            ),
        ]
    }

    /// Builds the metric families for `input`, section by section in the
    /// order of the file. The sections keep state apart (peer ranks and
    /// splits, histograms, eviction high-water marks), so none depends on
    /// another having run first.
    pub fn families(&mut self, input: &ExportInput<'_>) -> Vec<MetricFamily> {
        let mut families = vec![build_info_family()];
        families.extend(self.traffic_families(input));
        families.extend(self.anomaly_families(input));
        families.extend(bgp_session_families(input));
        families.extend(bgp_wire_families(input));
        families.extend(self.kernel_families(input));
        families.extend(self.export_families(input));
        families.extend(self.probe_families(input));
        families.extend(evidence_families(input));
        families.push(node_info_family(input.node));
        families.push(peer_anomaly_family(input.anomalies));
        if !input.node.name.is_empty() {
            add_node_label(&mut families, &input.node.name);
        }
        families
    }

    /// Adds `input`'s rows to the encapsulation and drop splits, and
    /// returns the smallest path MTU per interface and peer (its label
    /// value: the peer, or "other" beyond the cap).
    fn add_rows(
        &mut self,
        input: &ExportInput<'_>,
        bucket_of: &impl Fn(Option<IpAddr>) -> Bucket,
    ) -> BTreeMap<(IfaceId, String), u32> {
        let names = &mut self.iface_names;
        let mut ids: FastMap<u32, IfaceId> = input
            .ifaces
            .iter()
            .map(|(index, name)| (*index, names.id(name)))
            .collect();
        let mut iface = |ifindex: u32| {
            *ids.entry(ifindex)
                .or_insert_with(|| names.id(&format!("if{ifindex}")))
        };

        // Rows of different ifindexes with one name (an interface deleted
        // and re-created) add up: the name is the series.
        self.encap.begin();
        for row in input
            .rows
            .iter()
            .filter(|r| r.id.reason == Unclassified::None)
        {
            let key = (
                iface(row.id.ifindex),
                row.id.direction,
                row.id.proto,
                row.id.peer,
            );
            self.encap.add(key, [row.packets, row.bytes]);
        }
        self.drop_splits.begin();
        for d in input.drops {
            let key = (
                iface(d.row.id.ifindex),
                d.row.id.proto,
                d.row.id.peer,
                d.reason.clone(),
                d.row.id.stage,
                d.row.id.direction,
            );
            self.drop_splits.add(key, [d.row.packets]);
        }

        // The smallest next-hop MTU routers reported ("fragmentation
        // needed", "packet too big") per interface and tunnel peer: what the
        // tunnel device's MTU must fit. Peers beyond the label cap share
        // "other", so the family stays bounded like the counters.
        let mut path_mtu: BTreeMap<(IfaceId, String), u32> = BTreeMap::new();
        for d in input.drops {
            let Some(mtu) = d.row.id.mtu else { continue };
            let peer = match bucket_of(d.row.id.peer) {
                Bucket::Own => peer_label(d.row.id.peer),
                Bucket::Other => OTHER_PEERS.to_string(),
            };
            let lowest = path_mtu
                .entry((iface(d.row.id.ifindex), peer))
                .or_insert(mtu);
            *lowest = (*lowest).min(mtu);
        }
        path_mtu
    }

    /// `observer_encap_packets_total`, `observer_encap_bytes_total`,
    /// `observer_drops_total` and `observer_path_mtu_bytes`.
    fn traffic_families(&mut self, input: &ExportInput<'_>) -> Vec<MetricFamily> {
        let labeled = self.labeled_peers(input);
        let bucket_of = |peer: Option<IpAddr>| match peer {
            Some(p) if !labeled.contains(&p) => Bucket::Other,
            _ => Bucket::Own,
        };
        let path_mtu = self.add_rows(input, &bucket_of);

        // Split each series between its own label and "other".
        let mut encap_series = [Series::default(), Series::default()];
        let names = &self.iface_names;
        self.encap.export(&bucket_of, names, &mut encap_series);
        let [packets, bytes] = encap_series;
        let mut drop_series = [Series::default()];
        self.drop_splits.export(&bucket_of, names, &mut drop_series);
        let [drops] = drop_series;

        let path_mtu: BTreeMap<(String, String), u32> = path_mtu
            .into_iter()
            .map(|((iface, peer), mtu)| ((names.name(iface), peer), mtu))
            .collect();
        vec![
            packets.family(
                "observer_encap_packets_total",
                "Encapsulated packets as on the wire since the observer attached, by interface, direction, encapsulation and remote peer (outer address; \"other\": peers beyond --max-peers; empty: non-tunnel IP).",
            ),
            bytes.family(
                "observer_encap_bytes_total",
                "Bytes of those packets as on the wire, Ethernet header included.",
            ),
            drops.family(
                "observer_drops_total",
                "Received packets dropped by the kernel (reason = kernel drop reason name) or flagged by the observer (calico_allow_set, vni_unknown, vxlan_no_i_flag, outer_fragment, over_mtu, path_mtu, bad_inner_checksum, bad_outer_checksum; zero_udp_checksum and outer_fragment are no drops), by interface, encapsulation, peer, stage and direction (underlay: on an attached interface, peer the outer source, direction rx; tunnel or pod: after decapsulation on a tunnel or pod device, peer the node whose pod block holds the inner source (direction rx) or, for a packet on its way out, the inner destination (tx)).",
            ),
            family(
                "observer_path_mtu_bytes",
                "Smallest next-hop MTU that routers reported for tunnel packets this node sent (path_mtu drops), by interface and tunnel peer: the tunnel device's MTU plus the encapsulation must fit in it.",
                MetricType::GAUGE,
                path_mtu
                    .into_iter()
                    .map(|((iface, peer), mtu)| (vec![("iface", iface), ("peer", peer)], f64::from(mtu)))
                    .collect(),
            ),
        ]
    }

    /// `observer_anomalies_active`, `observer_anomaly_duration_seconds`,
    /// `observer_route_outage_seconds`, `observer_route_blocks_missing` and
    /// `observer_anomalies_raised_total`.
    fn anomaly_families(&mut self, input: &ExportInput<'_>) -> Vec<MetricFamily> {
        vec![
            family(
                "observer_anomalies_active",
                "Anomalies holding now, by kind (one_way, snat_suspected, allow_set_drop, dropped_after_decap, tcp_syn_unanswered, bad_checksum, encap_mismatch, mtu, mss_exceeds_tunnel, unknown_peer, drop_spike, bgp_down, bgp_flap, route_missing, route_conflict, stale_route); the peers are in the observer's output.",
                MetricType::GAUGE,
                Kind::ALL
                    .iter()
                    .map(|k| {
                        let n = input.anomalies.iter().filter(|a| a.kind == *k).count();
                        (vec![("kind", k.name().to_string())], n as f64)
                    })
                    .collect(),
            ),
            self.duration_family(input.events),
            self.route_outage_family(input.route_outages),
            family(
                "observer_route_blocks_missing",
                "Pod blocks that this node routed to another node and that have no route here now (route_missing names them and their node).",
                MetricType::GAUGE,
                vec![(vec![], input.blocks_missing as f64)],
            ),
            family(
                "observer_anomalies_raised_total",
                "Anomalies raised since the observer attached, by kind.",
                MetricType::COUNTER,
                Kind::ALL
                    .iter()
                    .map(|k| {
                        let n = input.anomalies_raised.get(k).copied().unwrap_or(0);
                        (vec![("kind", k.name().to_string())], n as f64)
                    })
                    .collect(),
            ),
        ]
    }

    /// `observer_programs_attached`, `observer_map_entries`,
    /// `observer_probe_packets_total`, `observer_flow_cache_collisions_total`,
    /// `observer_map_evictions_total` and `observer_lost_events_total`.
    fn kernel_families(&mut self, input: &ExportInput<'_>) -> Vec<MetricFamily> {
        // The kernel's figure is an estimate (inserts minus the entries a
        // walk found, which races with traffic) and may dip; the counter
        // never goes back.
        let evictions = input.stats.flow_evictions.max(self.evictions_exported);
        self.evictions_exported = evictions;
        let bgp_evictions = input
            .stats
            .bgp_evictions(input.bgp_wire.len())
            .max(self.bgp_evictions_exported);
        self.bgp_evictions_exported = bgp_evictions;
        vec![
            family(
                "observer_programs_attached",
                "eBPF programs the observer has attached (XDP or tc ingress, and tc egress, per interface).",
                MetricType::GAUGE,
                vec![(vec![], input.programs_attached as f64)],
            ),
            family(
                "observer_map_entries",
                "Entries in the observer's kernel flow map, and flow-cache slots in use (all CPUs; never freed).",
                MetricType::GAUGE,
                vec![
                    (
                        vec![("map", "flows".to_string())],
                        input.stats.flow_entries as f64,
                    ),
                    (
                        vec![("map", "flow_cache".to_string())],
                        input.stats.flow_cache_slots as f64,
                    ),
                ],
            ),
            family(
                "observer_probe_packets_total",
                "observer probe packets (inner ICMP payload starting OBSPROBE) seen at the wire, counted apart from observer_encap_packets_total so that probing never moves the passive counters.",
                MetricType::COUNTER,
                vec![
                    (
                        vec![("direction", "rx".to_string())],
                        input.stats.probe_rx_packets as f64,
                    ),
                    (
                        vec![("direction", "tx".to_string())],
                        input.stats.probe_tx_packets as f64,
                    ),
                ],
            ),
            family(
                "observer_flow_cache_collisions_total",
                "Packets counted in the flow map because their per-CPU cache slot held another flow (the slower path; counts stay exact).",
                MetricType::COUNTER,
                vec![(vec![], input.stats.flow_cache_collisions as f64)],
            ),
            family(
                "observer_map_evictions_total",
                "Entries the kernel flow map evicted because it was full (raise --max-flows).",
                MetricType::COUNTER,
                vec![
                    (vec![("map", "flows".to_string())], evictions as f64),
                    (vec![("map", "bgp".to_string())], bgp_evictions as f64),
                ],
            ),
            family(
                "observer_lost_events_total",
                "Packets that could not be counted because their flow entry could not be inserted.",
                MetricType::COUNTER,
                vec![(vec![], input.stats.flow_insert_failures as f64)],
            ),
        ]
    }

    /// `observer_late_intervals_total`, `observer_netlink_overruns_total`,
    /// `observer_last_update_timestamp_seconds` and
    /// `observer_export_errors_total`.
    fn export_families(&self, input: &ExportInput<'_>) -> Vec<MetricFamily> {
        let seconds = input
            .at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        vec![
            family(
                "observer_late_intervals_total",
                "Intervals whose counters were read a whole --interval or more late (the observer was starved of CPU, stopped, or an interval's work took too long).",
                MetricType::COUNTER,
                vec![(vec![], input.late_intervals as f64)],
            ),
            family(
                "observer_netlink_overruns_total",
                "Times the data-plane change notifications overran their netlink socket (notifications lost; the data plane was re-read in full).",
                MetricType::COUNTER,
                vec![(vec![], input.netlink_overruns as f64)],
            ),
            family(
                "observer_last_update_timestamp_seconds",
                "Unix time at which the counters in this file were read.",
                MetricType::GAUGE,
                vec![(vec![], seconds)],
            ),
            family(
                "observer_export_errors_total",
                "Failed attempts to write this file (previous ones; see the observer's log).",
                MetricType::COUNTER,
                vec![(vec![], self.errors as f64)],
            ),
        ]
    }
}

/// Label set of one sample.
type Labels = Vec<(&'static str, String)>;

/// `observer_build_info`.
/// Active anomalies with the peers they are about, at most this many
/// series (attacker-chosen sources can raise unknown_peer for many
/// addresses); the rest are counted in `observer_peer_anomalies_omitted`.
pub const MAX_PEER_ANOMALY_SERIES: usize = 256;

/// `observer_evidence_frames_total{outcome}` and
/// `observer_evidence_files_total{event}`, with `--capture-dir` only.
/// The outcomes split every frame the programs offered as evidence:
/// `lost` and `rate_limited` never left the kernel; of the rest,
/// `written`, `not_a_drop`, `low_space` and `write_failed`.
fn evidence_families(input: &ExportInput<'_>) -> Vec<MetricFamily> {
    let Some(counts) = input.evidence else {
        return Vec::new();
    };
    let outcome = |name: &str, value: u64| (vec![("outcome", name.to_string())], value as f64);
    let event = |name: &str, value: u64| (vec![("event", name.to_string())], value as f64);
    vec![
        family(
            "observer_evidence_frames_total",
            "Frames offered as evidence (--capture-dir: flagged by the observer or dropped by the kernel), by outcome: written to the pcapng files; lost (the CPU's ring was full: raise --capture-ring-pages); rate_limited (over --capture-rate); not_a_drop (freed in the receiving socket layer after decapsulation, as the drop rows leave out); low_space (the file system had less than 256 MiB free); write_failed.",
            MetricType::COUNTER,
            vec![
                outcome("written", counts.written),
                outcome("lost", input.stats.evidence_lost),
                outcome("rate_limited", input.stats.evidence_rate_limited),
                outcome("not_a_drop", counts.not_drops),
                outcome("low_space", counts.skipped_low_space),
                outcome("write_failed", counts.failed),
            ],
        ),
        family(
            "observer_evidence_files_total",
            "Evidence files completed (renamed to observer-*.pcapng) and removed by rotation (--capture-files).",
            MetricType::COUNTER,
            vec![
                event("completed", counts.files_completed),
                event("removed", counts.files_removed),
            ],
        ),
    ]
}

/// `observer_node_info{address}`: one series per underlay address, so that
/// PromQL (and `observer cluster`) can join a peer address to the node
/// that owns it.
fn node_info_family(node: &NodeIdentity) -> MetricFamily {
    family(
        "observer_node_info",
        "This node's underlay addresses (value is always 1): joins a peer address of another node's series to this node's name.",
        MetricType::GAUGE,
        node.addresses
            .iter()
            .map(|a| (vec![("address", a.to_string())], 1.0))
            .collect(),
    )
}

/// `observer_peer_anomalies_active{kind,proto,peer,about}` (1 per active
/// anomaly; `about` is the node it is about: the peer, or for
/// snat_suspected the node whose packets a router rewrote) and
/// `observer_peer_anomalies_omitted` (those beyond the cap).
fn peer_anomaly_family(anomalies: &[&Anomaly]) -> MetricFamily {
    let series: BTreeSet<(&'static str, &'static str, IpAddr, IpAddr)> = anomalies
        .iter()
        .map(|a| (a.kind.name(), a.proto.name(), a.peer, a.node()))
        .collect();
    let omitted = series.len().saturating_sub(MAX_PEER_ANOMALY_SERIES);
    let mut samples: Vec<(Labels, f64)> = series
        .into_iter()
        .take(MAX_PEER_ANOMALY_SERIES)
        .map(|(kind, proto, peer, about)| {
            (
                vec![
                    ("kind", kind.to_string()),
                    ("proto", proto.to_string()),
                    ("peer", peer.to_string()),
                    ("about", about.to_string()),
                ],
                1.0,
            )
        })
        .collect();
    // The omitted count rides in the same family as a series without a
    // peer, so that a capped export is visible where the anomalies are.
    samples.push((vec![("kind", "omitted".to_string())], omitted as f64));
    family(
        "observer_peer_anomalies_active",
        "Anomalies holding now, one series per (kind, proto, peer) with the node address it is about (about: the peer, or for snat_suspected the node whose packets were rewritten); kind=\"omitted\" counts those beyond the cap of 256.",
        MetricType::GAUGE,
        samples,
    )
}

/// Puts `node="<name>"` first on every series: the node's identity in
/// the store whatever the scrape's target labels are.
fn add_node_label(families: &mut [MetricFamily], name: &str) {
    for family in families {
        for metric in family.mut_metric().iter_mut() {
            let mut label = LabelPair::default();
            label.set_name("node".to_string());
            label.set_value(name.to_string());
            let mut labels = metric.take_label();
            labels.insert(0, label);
            metric.set_label(labels);
        }
    }
}

fn build_info_family() -> MetricFamily {
    family(
        "observer_build_info",
        "Version of the observer that wrote this file (value is always 1).",
        MetricType::GAUGE,
        vec![(
            vec![("version", env!("CARGO_PKG_VERSION").to_string())],
            1.0,
        )],
    )
}

/// `observer_bird_socket_up`, `observer_bgp_session_established`,
/// `observer_bgp_routes_imported` and `observer_bgp_routes_exported`.
fn bgp_session_families(input: &ExportInput<'_>) -> Vec<MetricFamily> {
    vec![
        family(
            "observer_bird_socket_up",
            "1 when the BIRD control socket answered at the last read, else 0 (absent, refused, or no answer): the BGP series of a socket at 0 are in state Unknown.",
            MetricType::GAUGE,
            input
                .bird_sockets
                .iter()
                .map(|(socket, up)| (vec![("socket", socket.clone())], f64::from(u8::from(*up))))
                .collect(),
        ),
        family(
            "observer_bgp_session_established",
            "1 when the BGP session is Established, else 0, per BIRD control socket, BIRD protocol and neighbor (from show protocols all; a session down is a bgp_down anomaly).",
            MetricType::GAUGE,
            bgp_samples(input.bgp, |s| f64::from(u8::from(s.established()))),
        ),
        family(
            "observer_bgp_routes_imported",
            "Routes BIRD imported from the BGP neighbor (all channels): the pod blocks it announces.",
            MetricType::GAUGE,
            bgp_samples(input.bgp, |s| s.routes_imported as f64),
        ),
        family(
            "observer_bgp_routes_exported",
            "Routes BIRD exported to the BGP neighbor (all channels).",
            MetricType::GAUGE,
            bgp_samples(input.bgp, |s| s.routes_exported as f64),
        ),
    ]
}

/// `observer_bgp_wire_segments_total`, `observer_bgp_wire_tcp_flags_total`
/// and `observer_bgp_wire_messages_total`.
fn bgp_wire_families(input: &ExportInput<'_>) -> Vec<MetricFamily> {
    vec![
        family(
            "observer_bgp_wire_segments_total",
            "TCP segments to or from port 179 (BGP) since attach, per interface, direction and peer, as the programs counted them at the wire.",
            MetricType::COUNTER,
            wire_samples(input, |t| vec![(None, t.segments)]),
        ),
        family(
            "observer_bgp_wire_tcp_flags_total",
            "TCP/179 segments with SYN, FIN or RST since attach (connection attempts and ends of BGP sessions), per interface, direction and peer.",
            MetricType::COUNTER,
            wire_samples(input, |t| {
                vec![
                    (Some(("flag", "syn")), t.syn),
                    (Some(("flag", "fin")), t.fin),
                    (Some(("flag", "rst")), t.rst),
                ]
            }),
        ),
        family(
            "observer_bgp_wire_messages_total",
            "TCP/179 segments by the type of the BGP message they start with (open, update, notification, keepalive, route_refresh) since attach, per interface, direction and peer. A NOTIFICATION ends a session; its code is in the bgp_wire line.",
            MetricType::COUNTER,
            wire_samples(input, |t| {
                vec![
                    (Some(("type", "open")), t.open),
                    (Some(("type", "update")), t.update),
                    (Some(("type", "notification")), t.notification),
                    (Some(("type", "keepalive")), t.keepalive),
                    (Some(("type", "route_refresh")), t.route_refresh),
                ]
            }),
        ),
    ]
}

/// One sample per BGP session (bounded by `node::bird::MAX_SESSIONS` per
/// socket), labelled by socket, protocol and neighbor.
fn bgp_samples(sessions: &[BgpSession], value: impl Fn(&BgpSession) -> f64) -> Vec<(Labels, f64)> {
    sessions
        .iter()
        .map(|s| {
            let neighbor = s.neighbor.map(|n| n.to_string()).unwrap_or_default();
            let labels = vec![
                ("socket", s.socket.clone()),
                ("protocol", s.protocol.clone()),
                ("neighbor", neighbor),
            ];
            (labels, value(s))
        })
        .collect()
}

/// Samples of a BGP-at-the-wire family: per key, the values `split`
/// returns, each with its extra label; zero values of an extra label are
/// left out (a key is mostly KEEPALIVEs).
fn wire_samples(
    input: &ExportInput<'_>,
    split: impl Fn(&WireCounters) -> Vec<(Option<(&'static str, &'static str)>, u64)>,
) -> Vec<(Labels, f64)> {
    let mut samples = Vec::new();
    for row in input.bgp_wire {
        let key: Labels = vec![
            ("iface", iface_name(input.ifaces, row.id.ifindex)),
            ("direction", direction_name(row.id.direction).to_string()),
            ("peer", row.id.peer.to_string()),
        ];
        for (extra, value) in split(&row.total) {
            if extra.is_some() && value == 0 {
                continue;
            }
            let mut labels = key.clone();
            labels.extend(extra.map(|(k, v)| (k, v.to_string())));
            samples.push((labels, value as f64));
        }
    }
    samples
}

/// `peer` label value of a series with its own peer.
fn peer_label(peer: Option<IpAddr>) -> String {
    peer.map_or(String::new(), |p| p.to_string())
}

/// The splits of one metric family's series, keyed by `K`, plus the
/// "other" counts of series whose rows are gone (forgotten by the bounded
/// aggregator), so "other" never shrinks.
struct SplitFamily<K, const N: usize> {
    /// In the rows' order (see [`ReadOrderMap`]).
    splits: ReadOrderMap<K, Split<N>>,
    /// What keys gone from the rows had given to "other", per key without
    /// its peer.
    retired: FastMap<K, [u64; N]>,
    /// Exports so far (see [`Split::seen`]).
    exports: u64,
}

impl<K: SeriesKey, const N: usize> SplitFamily<K, N> {
    fn new() -> Self {
        SplitFamily {
            splits: ReadOrderMap::default(),
            retired: FastMap::default(),
            exports: 0,
        }
    }

    /// Starts an export: [`SplitFamily::add`] the rows, then
    /// [`SplitFamily::export`].
    fn begin(&mut self) {
        self.exports += 1;
        self.splits.rewind();
    }

    /// Adds one row's `values` to its series `key` (rows of one series add
    /// up). The sums live in the splits themselves: no table of the
    /// export's series is built beside them.
    fn add(&mut self, key: K, values: [u64; N]) {
        let split = self.splits.get_or_insert_with(key, Split::new);
        if split.seen != self.exports {
            split.seen = self.exports;
            split.now = [0; N];
        }
        add(&mut split.now, &values);
    }

    /// Adds the series' values (one column per entry of `out`): each key's
    /// own series while its peer is labeled, and the "other" series.
    /// Labels are built only for labeled peers and once per "other" series
    /// (labels built per key were most of an export at 100,000 peers).
    fn export(
        &mut self,
        bucket_of: &impl Fn(Option<IpAddr>) -> Bucket,
        names: &IfaceNames,
        out: &mut [Series; N],
    ) {
        let mut other: FastMap<K, [u64; N]> = FastMap::default();
        let exports = self.exports;
        let retired = &mut self.retired;
        self.splits.retain(|key, split| {
            // Keys gone from the rows: what they gave "other" stays there.
            if split.seen != exports {
                let (_, contribution) = split.values(&split.last);
                add(
                    retired.entry(key.without_peer()).or_insert([0; N]),
                    &contribution,
                );
                return false;
            }
            let now = split.now;
            split.assign(bucket_of(key.peer()), now);
            let (own, to_other) = split.values(&now);
            if split.bucket == Bucket::Own {
                let own_labels = key.labels(None, names);
                for (series, value) in out.iter_mut().zip(own) {
                    series.add(own_labels.clone(), value);
                }
            }
            // A zero adds nothing ("other" series of zero are left out).
            if to_other.iter().any(|v| *v != 0) {
                add(other.entry(key.without_peer()).or_insert([0; N]), &to_other);
            }
            true
        });
        for (group, sums) in self.retired.iter().chain(&other) {
            let labels = group.labels(Some(OTHER_PEERS.to_string()), names);
            for (series, value) in out.iter_mut().zip(sums) {
                series.add(labels.clone(), *value);
            }
        }
    }
}

/// Adds `values` to `sums`, column by column.
fn add<const N: usize>(sums: &mut [u64; N], values: &[u64; N]) {
    sums.iter_mut().zip(values).for_each(|(s, v)| *s += v);
}

/// Samples of one counter family, summed per label set.
#[derive(Default)]
struct Series(BTreeMap<Labels, u64>);

impl Series {
    fn add(&mut self, labels: Labels, value: u64) {
        *self.0.entry(labels).or_default() += value;
    }

    fn family(self, name: &str, help: &str) -> MetricFamily {
        // A "other" series that never received anything is noise.
        let samples = self
            .0
            .into_iter()
            .filter(|(labels, value)| {
                *value > 0 || !labels.iter().any(|(k, v)| *k == "peer" && v == OTHER_PEERS)
            })
            .map(|(labels, value)| (labels, value as f64))
            .collect();
        family(name, help, MetricType::COUNTER, samples)
    }
}

fn family(name: &str, help: &str, kind: MetricType, samples: Vec<(Labels, f64)>) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(name.to_string());
    family.set_help(help.to_string());
    family.set_field_type(kind);
    let metrics = samples
        .into_iter()
        .map(|(labels, value)| {
            let mut metric = Metric::default();
            metric.set_label(
                labels
                    .into_iter()
                    .map(|(k, v)| {
                        let mut pair = LabelPair::default();
                        pair.set_name(k.to_string());
                        pair.set_value(v);
                        pair
                    })
                    .collect(),
            );
            match kind {
                MetricType::COUNTER => {
                    let mut counter = Counter::default();
                    counter.set_value(value);
                    metric.set_counter(counter);
                }
                _ => {
                    let mut gauge = Gauge::default();
                    gauge.set_value(value);
                    metric.set_gauge(gauge);
                }
            }
            metric
        })
        .collect();
    family.set_metric(metrics);
    family
}

/// Classic Prometheus text of `families` (what node_exporter's textfile
/// collector reads).
/// Families without samples (no drops yet) are left out: the format has
/// no empty families.
pub fn encode(families: &[MetricFamily]) -> io::Result<String> {
    let families: Vec<MetricFamily> = families
        .iter()
        .filter(|f| !f.get_metric().is_empty())
        .cloned()
        .collect();
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&families, &mut buf)
        .map_err(io::Error::other)?;
    String::from_utf8(buf).map_err(io::Error::other)
}

/// Writes `text` as `dir/name` atomically: a temporary file in the same
/// directory (name not ending in `.prom`, so node_exporter never reads it
/// half-written), mode 0644 set on the descriptor, fsync, rename.
///
/// The directory may be writable by other users (node_exporter setups
/// often use a shared one), and the observer runs as root: the temporary
/// name is random and created with `O_CREAT|O_EXCL|O_NOFOLLOW`, so a
/// symlink planted under a guessed name is never followed (the rename
/// replaces a symlink at `dir/name` itself, not what it points to).
pub fn write_atomic(dir: &Path, name: &str, text: &str) -> io::Result<PathBuf> {
    let final_path = dir.join(name);
    let mut tmp = create_shared_temp(dir, &format!(".{name}."), ".tmp", false)?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    // On failure the temporary file is removed when `tmp` drops.
    tmp.persist(&final_path).map_err(|e| e.error)?;
    Ok(final_path)
}

/// A new file in `dir`, named `prefix`, random characters, `suffix`, for
/// a writer whose directory may be shared and who runs as root: created
/// with `O_CREAT|O_EXCL|O_NOFOLLOW` (a symlink planted under a guessed name
/// is never followed), then mode 0644 set on the descriptor whatever the
/// umask (its readers, node_exporter or Wireshark, may be other users);
/// opened for appending with `append`. Removed when the result drops,
/// unless kept or persisted.
pub fn create_shared_temp(
    dir: &Path,
    prefix: &str,
    suffix: &str,
    append: bool,
) -> io::Result<tempfile::NamedTempFile> {
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .suffix(suffix)
        .make_in(dir, |path| {
            fs::OpenOptions::new()
                .write(true)
                .append(append)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)
        })?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(0o644))?;
    Ok(tmp)
}

/// Why `dir` is unsafe to share, when users other than this process's
/// can write to it: they can replace or delete the textfile between two
/// writes, which no way of writing prevents. `None` for a directory only
/// its owner (this user or root) can write; an error when it cannot be
/// looked at (missing: it is checked again once it exists).
pub fn shared_dir_warning(dir: &Path) -> io::Result<Option<String>> {
    let meta = fs::metadata(dir)?;
    let mode = meta.mode();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let owner_is_other = meta.uid() != euid && meta.uid() != 0;
    let group_writes = mode & 0o020 != 0 && meta.gid() != 0;
    let others_write = mode & 0o002 != 0;
    if !(owner_is_other || group_writes || others_write) {
        return Ok(None);
    }
    let who = if others_write {
        "every user"
    } else if group_writes {
        "its group"
    } else {
        "its owner"
    };
    Ok(Some(format!(
        "textfile directory {} (mode {:o}, owner uid {}, gid {}) is writable by {who}: \
         they can replace or delete {TEXTFILE_NAME} between writes (the observer itself \
         never follows their links); use a directory only root can write, such as \
         /var/lib/node_exporter/textfile_collector",
        dir.display(),
        mode & 0o7777,
        meta.uid(),
        meta.gid()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::{Origin, testing};
    use observer_common::{ClassifierDrop, Proto};
    use std::collections::HashSet;

    fn row(peer: &str, packets: u64) -> Row {
        testing::row(testing::flow_id(peer), packets)
    }

    fn drop_row(peer: &str, packets: u64) -> DropRow {
        testing::drop_row(
            testing::drop_id(peer, Origin::Classifier, 1),
            packets,
            "calico_allow_set",
        )
    }

    /// A probe run of one VXLAN pair: `answered` of 5, 1 ms each, ladder
    /// up to `max_size`.
    fn probe_run(answered: u32, max_size: u32) -> Run {
        use crate::model::probe::Target;
        let peer = Ipv4Addr::new(10, 10, 60, 127);
        Run {
            at: SystemTime::UNIX_EPOCH,
            outcomes: vec![Outcome {
                target: Target {
                    peer,
                    encap: Encap::Vxlan { port: 4789 },
                    device: "vxlan.calico".into(),
                    device_mtu: 1450,
                    vni: 4096,
                    inner_src: Ipv4Addr::new(10, 244, 0, 0),
                    inner_dst: Ipv4Addr::new(10, 244, 1, 0),
                    macs: None,
                    underlay_mtu: 1500,
                },
                sent: 5,
                answered,
                rtts: vec![std::time::Duration::from_millis(1); answered as usize],
                sources: BTreeMap::new(),
                max_size: Some(max_size),
                ladder_sent: 11,
                peer_arrivals: 0,
                refused: BTreeMap::new(),
            }],
            skipped: Vec::new(),
            arrivals: BTreeMap::new(),
            arrivals_overflow: 0,
            nodes: Default::default(),
            refused: BTreeMap::new(),
            sent: 16,
            listener_drops: 0,
        }
    }

    #[test]
    fn probe_series_follow_the_latest_run_and_count_each_rtt_once() {
        let mut exporter = Exporter::new(10);
        let text = encode(&exporter.families(&ExportInput::default())).unwrap();
        assert!(!text.contains("observer_probe_answered_ratio"), "{text}");

        let run = probe_run(3, 1350);
        let with_run = ExportInput {
            probe_runs: std::slice::from_ref(&run),
            probe_latest: Some(&run),
            ..Default::default()
        };
        let text = encode(&exporter.families(&with_run)).unwrap();
        let labels = r#"{peer="10.10.60.127",encap="vxlan"}"#;
        for line in [
            format!("observer_probe_answered_ratio{labels} 0.6"),
            format!("observer_probe_max_size_bytes{labels} 1350"),
            format!("observer_probe_rtt_seconds_count{labels} 3"),
            r#"observer_probe_rtt_seconds_bucket{peer="10.10.60.127",encap="vxlan",le="0.001"} 3"#
                .to_string(),
            r#"observer_probe_rtt_seconds_bucket{peer="10.10.60.127",encap="vxlan",le="0.0005"} 0"#
                .to_string(),
            "observer_probe_runs_total 1".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        // The next export without a new run repeats the gauges and adds
        // no round-trip time twice.
        let again = ExportInput {
            probe_latest: Some(&run),
            ..Default::default()
        };
        let text = encode(&exporter.families(&again)).unwrap();
        assert!(text.contains(&format!("observer_probe_rtt_seconds_count{labels} 3")));
        assert!(text.contains("observer_probe_runs_total 1"));
    }

    fn export(exporter: &mut Exporter, rows: &[Row], drops: &[DropRow]) -> String {
        let ifaces = HashMap::from([(2, "eth0".to_string())]);
        let input = ExportInput {
            rows,
            drops,
            ifaces: &ifaces,
            at: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000),
            ..Default::default()
        };
        encode(&exporter.families(&input)).unwrap()
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
    }

    #[test]
    fn evidence_outcomes_split_every_frame_offered_and_only_when_captured() {
        let plain = encode(&Exporter::new(10).families(&ExportInput::default())).unwrap();
        assert!(!plain.contains("observer_evidence"), "{plain}");
        let input = ExportInput {
            stats: KernelStats {
                evidence_sent: 12,
                evidence_lost: 4,
                evidence_rate_limited: 3,
                ..KernelStats::default()
            },
            evidence: Some(crate::model::evidence::EvidenceCounts {
                written: 9,
                not_drops: 2,
                skipped_low_space: 1,
                failed: 0,
                files_completed: 5,
                files_removed: 2,
            }),
            ..Default::default()
        };
        let text = encode(&Exporter::new(10).families(&input)).unwrap();
        let frames = |outcome: &str| {
            value(
                &text,
                &format!("observer_evidence_frames_total{{outcome=\"{outcome}\"}}"),
            )
        };
        assert_eq!(frames("written"), Some(9.0));
        assert_eq!(frames("lost"), Some(4.0));
        assert_eq!(frames("rate_limited"), Some(3.0));
        assert_eq!(frames("not_a_drop"), Some(2.0));
        assert_eq!(frames("low_space"), Some(1.0));
        assert_eq!(frames("write_failed"), Some(0.0));
        let files = |event: &str| {
            value(
                &text,
                &format!("observer_evidence_files_total{{event=\"{event}\"}}"),
            )
        };
        assert_eq!(
            (files("completed"), files("removed")),
            (Some(5.0), Some(2.0))
        );
    }

    #[test]
    fn bgp_at_the_wire_is_series_per_interface_direction_and_peer() {
        use crate::model::bgp_wire::{WireCounters, WireId, WireRow};
        let row = WireRow {
            id: WireId {
                peer: "10.99.0.4".parse().unwrap(),
                ifindex: 2,
                direction: Direction::Rx,
            },
            total: WireCounters {
                segments: 9,
                syn: 1,
                open: 1,
                keepalive: 6,
                notification: 1,
                ..WireCounters::default()
            },
            changed: true,
        };
        let ifaces = HashMap::from([(2, "eth0".to_string())]);
        let input = ExportInput {
            ifaces: &ifaces,
            bgp_wire: std::slice::from_ref(&row),
            stats: KernelStats {
                bgp_inserts: 3,
                ..KernelStats::default()
            },
            ..Default::default()
        };
        let text = encode(&Exporter::new(10).families(&input)).unwrap();
        let key = "iface=\"eth0\",direction=\"rx\",peer=\"10.99.0.4\"";
        let series = |name: &str, extra: &str| value(&text, &format!("{name}{{{key}{extra}}}"));
        assert_eq!(series("observer_bgp_wire_segments_total", ""), Some(9.0));
        assert_eq!(
            series("observer_bgp_wire_tcp_flags_total", ",flag=\"syn\""),
            Some(1.0)
        );
        assert_eq!(
            series("observer_bgp_wire_tcp_flags_total", ",flag=\"rst\""),
            None,
            "zero flags are left out"
        );
        for (kind, n) in [("open", 1.0), ("keepalive", 6.0), ("notification", 1.0)] {
            assert_eq!(
                series(
                    "observer_bgp_wire_messages_total",
                    &format!(",type=\"{kind}\"")
                ),
                Some(n),
                "{kind}"
            );
        }
        assert_eq!(
            value(&text, "observer_map_evictions_total{map=\"bgp\"}"),
            Some(2.0),
            "three keys inserted, one live"
        );
    }

    #[test]
    fn bgp_sessions_are_series_per_socket_protocol_and_neighbor() {
        use crate::model::bgp::BgpSession;
        let session = |neighbor: &str, state: &str, imported| BgpSession {
            routes_imported: imported,
            ..crate::model::bgp::testing::session(neighbor, state)
        };
        let bgp = [
            session("10.0.0.2", "Established", 3),
            session("10.0.0.3", "Active", 0),
        ];
        let input = ExportInput {
            bgp: &bgp,
            bird_sockets: &[("/var/run/calico/bird.ctl".to_string(), true)],
            ..Default::default()
        };
        let text = encode(&Exporter::new(10).families(&input)).unwrap();
        let labels = |protocol: &str, neighbor: &str| {
            format!(
                "{{socket=\"/var/run/calico/bird.ctl\",protocol=\"{protocol}\",neighbor=\"{neighbor}\"}}"
            )
        };
        let up = labels("Mesh_10_0_0_2", "10.0.0.2");
        let down = labels("Mesh_10_0_0_3", "10.0.0.3");
        assert_eq!(
            value(&text, &format!("observer_bgp_session_established{up}")),
            Some(1.0)
        );
        assert_eq!(
            value(&text, &format!("observer_bgp_session_established{down}")),
            Some(0.0)
        );
        assert_eq!(
            value(&text, &format!("observer_bgp_routes_imported{up}")),
            Some(3.0)
        );
        assert_eq!(
            value(&text, &format!("observer_bgp_routes_exported{down}")),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                "observer_bird_socket_up{socket=\"/var/run/calico/bird.ctl\"}"
            ),
            Some(1.0)
        );
    }

    #[test]
    fn route_outages_fill_their_histogram_once_each_and_missing_blocks_are_a_gauge() {
        let outage = |seconds| Outage {
            block: "10.65.2.0/26".parse().unwrap(),
            node: "10.99.0.2".parse().unwrap(),
            now_via: Some("10.99.0.2".parse().unwrap()),
            duration_s: seconds,
        };
        let mut exporter = Exporter::new(10);
        let mut text = String::new();
        for (outages, missing) in [(&[outage(3.0)][..], 2), (&[outage(250.0)][..], 1), (&[], 0)] {
            let input = ExportInput {
                route_outages: outages,
                blocks_missing: missing,
                ..Default::default()
            };
            text = encode(&exporter.families(&input)).unwrap();
        }
        let bucket = |le: &str| {
            value(
                &text,
                &format!("observer_route_outage_seconds_bucket{{le=\"{le}\"}}"),
            )
        };
        assert_eq!(
            [bucket("5"), bucket("240"), bucket("360"), bucket("+Inf")],
            [Some(1.0), Some(1.0), Some(2.0), Some(2.0)]
        );
        assert_eq!(
            value(&text, "observer_route_outage_seconds_count"),
            Some(2.0)
        );
        assert_eq!(
            value(&text, "observer_route_outage_seconds_sum"),
            Some(253.0)
        );
        assert_eq!(value(&text, "observer_route_blocks_missing"), Some(0.0));
    }

    #[test]
    fn cleared_anomalies_fill_the_duration_histogram_once_each() {
        let anomaly = |kind| Anomaly {
            kind,
            peer: "10.0.0.2".parse().unwrap(),
            proto: Proto::Other,
            since: SystemTime::UNIX_EPOCH,
            evidence: BTreeMap::new(),
            summary: String::new(),
            hint: String::new(),
        };
        let cleared = |kind, seconds| Event::Cleared {
            anomaly: anomaly(kind),
            duration: std::time::Duration::from_secs(seconds),
        };
        let mut exporter = Exporter::new(10);
        let first = [
            Event::Raised(anomaly(Kind::Mtu)),
            cleared(Kind::BgpDown, 300),
        ];
        let second = [cleared(Kind::BgpDown, 30)];
        let mut text = String::new();
        for events in [&first[..], &second[..], &[]] {
            let input = ExportInput {
                events,
                ..Default::default()
            };
            text = encode(&exporter.families(&input)).unwrap();
        }
        let bucket = |le: &str| {
            value(
                &text,
                &format!(
                    "observer_anomaly_duration_seconds_bucket{{kind=\"bgp_down\",le=\"{le}\"}}"
                ),
            )
        };
        assert_eq!(
            [
                bucket("15"),
                bucket("30"),
                bucket("240"),
                bucket("360"),
                bucket("+Inf")
            ],
            [Some(0.0), Some(1.0), Some(1.0), Some(2.0), Some(2.0)]
        );
        let kind = |name: &str, k: &str| value(&text, &format!("{name}{{kind=\"{k}\"}}"));
        assert_eq!(
            kind("observer_anomaly_duration_seconds_count", "bgp_down"),
            Some(2.0)
        );
        assert_eq!(
            kind("observer_anomaly_duration_seconds_sum", "bgp_down"),
            Some(330.0)
        );
        // Raised but not cleared: no duration yet.
        assert_eq!(
            kind("observer_anomaly_duration_seconds_count", "mtu"),
            Some(0.0)
        );
    }

    #[test]
    fn anomaly_families_count_active_and_raised_per_kind() {
        let anomaly = Anomaly {
            kind: Kind::OneWay,
            peer: "10.10.60.127".parse().unwrap(),
            proto: Proto::Vxlan,
            since: SystemTime::UNIX_EPOCH,
            evidence: BTreeMap::new(),
            summary: String::new(),
            hint: String::new(),
        };
        let raised = BTreeMap::from([(Kind::OneWay, 3), (Kind::Mtu, 1)]);
        let input = ExportInput {
            anomalies: &[&anomaly, &anomaly],
            anomalies_raised: &raised,
            ..Default::default()
        };
        let text = encode(&Exporter::new(10).families(&input)).unwrap();
        assert_eq!(
            value(&text, r#"observer_anomalies_active{kind="one_way"}"#),
            Some(2.0)
        );
        assert_eq!(
            value(&text, r#"observer_anomalies_active{kind="mtu"}"#),
            Some(0.0)
        );
        assert_eq!(
            value(&text, r#"observer_anomalies_raised_total{kind="one_way"}"#),
            Some(3.0)
        );
        assert_eq!(
            value(
                &text,
                r#"observer_anomalies_raised_total{kind="drop_spike"}"#
            ),
            Some(0.0)
        );
    }

    #[test]
    fn every_series_names_the_node_and_node_info_maps_its_addresses() {
        let node = NodeIdentity {
            name: "gpu".to_string(),
            addresses: BTreeSet::from([
                "10.10.10.62".parse().unwrap(),
                "fd00::62".parse().unwrap(),
            ]),
        };
        let snat = Anomaly {
            kind: Kind::SnatSuspected,
            peer: "10.10.10.244".parse().unwrap(),
            proto: Proto::Vxlan,
            since: SystemTime::UNIX_EPOCH,
            evidence: BTreeMap::from([("real_node", serde_json::json!("10.10.60.127"))]),
            summary: String::new(),
            hint: String::new(),
        };
        let input = ExportInput {
            node: &node,
            anomalies: &[&snat],
            ..Default::default()
        };
        let text = encode(&Exporter::new(10).families(&input)).unwrap();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.contains(r#"{node="gpu""#), "{line}");
        }
        assert_eq!(
            value(
                &text,
                r#"observer_node_info{node="gpu",address="10.10.10.62"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                r#"observer_node_info{node="gpu",address="fd00::62"}"#
            ),
            Some(1.0)
        );
        // The rewritten packets are about cp1, not the router.
        assert_eq!(
            value(
                &text,
                r#"observer_peer_anomalies_active{node="gpu",kind="snat_suspected",proto="vxlan",peer="10.10.10.244",about="10.10.60.127"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                r#"observer_peer_anomalies_active{node="gpu",kind="omitted"}"#
            ),
            Some(0.0)
        );
        // Without a name, no label (and no addresses, no info series).
        let text = encode(&Exporter::new(10).families(&ExportInput::default())).unwrap();
        assert!(!text.contains("node="), "{text}");
        assert!(!text.contains("observer_node_info"), "{text}");
    }

    #[test]
    fn peer_anomaly_series_are_capped_and_the_rest_counted() {
        let anomalies: Vec<Anomaly> = (0..MAX_PEER_ANOMALY_SERIES as u32 + 7)
            .map(|i| Anomaly {
                kind: Kind::UnknownPeer,
                peer: IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)),
                proto: Proto::Vxlan,
                since: SystemTime::UNIX_EPOCH,
                evidence: BTreeMap::new(),
                summary: String::new(),
                hint: String::new(),
            })
            .collect();
        let refs: Vec<&Anomaly> = anomalies.iter().collect();
        let input = ExportInput {
            anomalies: &refs,
            ..Default::default()
        };
        let text = encode(&Exporter::new(10).families(&input)).unwrap();
        let series = text
            .lines()
            .filter(|l| l.starts_with("observer_peer_anomalies_active{kind=\"unknown_peer\""))
            .count();
        assert_eq!(series, MAX_PEER_ANOMALY_SERIES);
        assert_eq!(
            value(&text, r#"observer_peer_anomalies_active{kind="omitted"}"#),
            Some(7.0)
        );
    }

    #[test]
    fn path_mtu_is_a_gauge_of_the_smallest_mtu_per_peer_with_the_cap() {
        let path_mtu = |peer: &str, mtu: u32| {
            let mut id = testing::drop_id(peer, Origin::Classifier, ClassifierDrop::PathMtu as u32);
            id.vni = 0;
            id.mtu = Some(mtu);
            testing::drop_row(id, 3, "path_mtu")
        };
        let drops = [
            path_mtu("10.10.60.127", 1400),
            path_mtu("10.10.60.127", 1300),
            path_mtu("10.10.60.209", 1450),
            drop_row("10.10.60.209", 1000),
            path_mtu("10.10.60.99", 1280),
        ];
        // Two peers keep their label (most packets): .209 and .127.
        let text = export(&mut Exporter::new(2), &[], &drops);
        assert!(
            text.contains("# TYPE observer_path_mtu_bytes gauge"),
            "{text}"
        );
        let mtu = |peer: &str| {
            value(
                &text,
                &format!(r#"observer_path_mtu_bytes{{iface="eth0",peer="{peer}"}}"#),
            )
        };
        assert_eq!(mtu("10.10.60.127"), Some(1300.0));
        assert_eq!(mtu("10.10.60.209"), Some(1450.0));
        assert_eq!(mtu(OTHER_PEERS), Some(1280.0));
        assert_eq!(mtu("10.10.60.99"), None);
        // Without path_mtu drops there is no such family.
        let none = export(&mut Exporter::new(2), &[], &[drop_row("10.10.60.209", 1)]);
        assert!(!none.contains("observer_path_mtu_bytes"), "{none}");
    }

    #[test]
    fn classic_format_with_help_type_and_base_units() {
        let mut exporter = Exporter::new(10);
        let text = export(
            &mut exporter,
            &[row("10.10.60.127", 123)],
            &[drop_row("10.10.10.244", 579)],
        );
        assert!(text.ends_with('\n'));
        for family in [
            "observer_encap_packets_total",
            "observer_encap_bytes_total",
            "observer_drops_total",
            "observer_build_info",
            "observer_programs_attached",
            "observer_map_entries",
            "observer_map_evictions_total",
            "observer_lost_events_total",
            "observer_flow_cache_collisions_total",
            "observer_probe_packets_total",
            "observer_last_update_timestamp_seconds",
            "observer_export_errors_total",
        ] {
            assert!(
                text.contains(&format!("# HELP {family} ")),
                "{family}\n{text}"
            );
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "{family}\n{text}"
            );
        }
        assert!(text.contains("# TYPE observer_encap_packets_total counter"));
        assert_eq!(
            value(
                &text,
                r#"observer_encap_packets_total{iface="eth0",direction="rx",proto="vxlan",peer="10.10.60.127"}"#
            ),
            Some(123.0)
        );
        assert_eq!(
            value(
                &text,
                r#"observer_drops_total{iface="eth0",proto="vxlan",peer="10.10.10.244",reason="calico_allow_set",stage="underlay",direction="rx"}"#
            ),
            Some(579.0)
        );
        assert_eq!(
            value(&text, "observer_last_update_timestamp_seconds"),
            Some(1.7e9)
        );
        // No timestamps on samples: every sample line has exactly one space
        // outside the labels.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = match line.rfind('}') {
                Some(end) => &line[end + 1..],
                None => line.split_once(' ').unwrap().1,
            };
            assert_eq!(value.trim_start().split(' ').count(), 1, "{line}");
        }
    }

    #[test]
    fn peers_beyond_the_cap_are_summed_as_other() {
        let mut exporter = Exporter::new(2);
        let rows = [
            row("10.0.0.1", 100),
            row("10.0.0.2", 50),
            row("10.0.0.3", 7),
            row("10.0.0.4", 3),
        ];
        let text = export(&mut exporter, &rows, &[]);
        let peers: HashSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("observer_encap_packets_total"))
            .map(|l| {
                l.split("peer=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap()
            })
            .collect();
        assert_eq!(peers, HashSet::from(["10.0.0.1", "10.0.0.2", OTHER_PEERS]));
        assert_eq!(
            value(
                &text,
                r#"observer_encap_packets_total{iface="eth0",direction="rx",proto="vxlan",peer="other"}"#
            ),
            Some(10.0)
        );
    }

    #[test]
    fn only_keys_that_move_between_buckets_keep_a_history() {
        // First export beyond the cap: straight to "other", no history.
        let mut split = Split::<2>::new();
        split.assign(Bucket::Other, [5, 500]);
        assert!(split.history.is_none());
        assert_eq!(split.values(&[5, 500]), ([0, 0], [5, 500]));
        // Then among the top: its 5 packets stay in "other".
        split.assign(Bucket::Own, [7, 700]);
        assert!(split.history.is_some());
        assert_eq!(split.values(&[7, 700]), ([2, 200], [5, 500]));
    }

    #[test]
    fn counters_never_go_backwards_when_peers_change_rank() {
        let mut exporter = Exporter::new(1);
        let other = r#"observer_encap_packets_total{iface="eth0",direction="rx",proto="vxlan",peer="other"}"#;
        let a = r#"observer_encap_packets_total{iface="eth0",direction="rx",proto="vxlan",peer="10.0.0.1"}"#;
        let b = r#"observer_encap_packets_total{iface="eth0",direction="rx",proto="vxlan",peer="10.0.0.2"}"#;
        // a leads, b is folded into other.
        let t1 = export(
            &mut exporter,
            &[row("10.0.0.1", 100), row("10.0.0.2", 10)],
            &[],
        );
        assert_eq!(
            (value(&t1, a), value(&t1, other)),
            (Some(100.0), Some(10.0))
        );
        // b overtakes: b gets its own series from now on, other keeps its 10.
        let t2 = export(
            &mut exporter,
            &[row("10.0.0.1", 101), row("10.0.0.2", 500)],
            &[],
        );
        assert_eq!(value(&t2, b), Some(490.0));
        assert_eq!(
            value(&t2, other),
            Some(11.0),
            "a's new packet goes to other, b's old 10 stay"
        );
        assert_eq!(value(&t2, a), None, "a's series is no longer written");
        // a comes back on top: its series resumes where it stopped.
        let t3 = export(
            &mut exporter,
            &[row("10.0.0.1", 2000), row("10.0.0.2", 501)],
            &[],
        );
        assert_eq!(value(&t3, a), Some(100.0 + 1899.0));
        assert_eq!(value(&t3, other), Some(12.0));
        // Every total is accounted for exactly once.
        assert_eq!(
            value(&t3, a).unwrap() + value(&t3, other).unwrap() + 490.0,
            2501.0
        );
    }

    #[test]
    fn forgotten_rows_keep_other_monotonic() {
        let mut exporter = Exporter::new(1);
        let other = r#"observer_encap_packets_total{iface="eth0",direction="rx",proto="vxlan",peer="other"}"#;
        let t1 = export(
            &mut exporter,
            &[
                row("10.0.0.1", 100),
                row("10.0.0.2", 10),
                row("10.0.0.3", 5),
            ],
            &[],
        );
        assert_eq!(value(&t1, other), Some(15.0));
        // The aggregator forgot 10.0.0.3: other keeps its 5.
        let t2 = export(
            &mut exporter,
            &[row("10.0.0.1", 100), row("10.0.0.2", 12)],
            &[],
        );
        assert_eq!(value(&t2, other), Some(17.0));
        assert_eq!(
            exporter.encap.splits.len(),
            2,
            "the forgotten row's state is dropped"
        );
    }

    #[test]
    fn atomic_write_leaves_only_the_prom_file() {
        let dir = std::env::temp_dir().join(format!("observer-export-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = write_atomic(&dir, TEXTFILE_NAME, "a 1\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "a 1\n");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o644
        );
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(TEXTFILE_NAME)]);
        let missing = dir.join("missing");
        assert!(write_atomic(&missing, TEXTFILE_NAME, "x").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_planted_symlink_is_replaced_not_followed() {
        let dir =
            std::env::temp_dir().join(format!("observer-symlink-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        fs::write(&victim, "precious\n").unwrap();
        let link = dir.join(TEXTFILE_NAME);
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        write_atomic(&dir, TEXTFILE_NAME, "a 1\n").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
        let meta = fs::symlink_metadata(&link).unwrap();
        assert!(meta.file_type().is_file(), "the link itself was replaced");
        assert_eq!(fs::read_to_string(&link).unwrap(), "a 1\n");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn directories_others_can_write_are_named() {
        let dir =
            std::env::temp_dir().join(format!("observer-shared-dir-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(shared_dir_warning(&dir).unwrap(), None);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).unwrap();
        let warning = shared_dir_warning(&dir).unwrap().expect("a warning");
        assert!(warning.contains(&*dir.to_string_lossy()), "{warning}");
        assert!(warning.contains("mode 1777"), "{warning}");
        assert!(warning.contains("every user"), "{warning}");
        assert!(shared_dir_warning(&dir.join("missing")).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
