//! The replay engines' contract ([`Classifier`]: frames in, per-capture rows
//! out) and what both engines share: the per-frame outcome, the
//! per-capture counts and rows, and how runts and rates are counted.

use std::{collections::HashMap, hash::Hash, net::IpAddr};

use anyhow::Result;
use observer_common::{Direction, Proto, TcpCounts, Unclassified};

use observer_core::capture::{self, Frame};

use crate::{
    model::aggregate::{Aggregator, DropAggregator},
    model::rows::{
        DropCounters, DropId, FlowCounters, FlowId, KernelReasons, KernelStats, Row, Tally,
    },
    monitor::refresher::AllowSetSink,
};

/// What happened to one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrameOutcome {
    /// Counted as sent (its outer source is `--local`).
    pub tx: bool,
    /// Longer than a test run takes: classified on its first bytes; its
    /// row still gets every captured byte (see `kernel`'s module docs).
    pub cut: bool,
    /// The kernel refused to test-run it (see `kernel::KernelClassifier`): counted
    /// as the parser counts every such frame.
    pub refused: bool,
}

/// Counters of one capture, beside its rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileCounts {
    /// Frames read.
    pub frames: u64,
    /// Frames counted as sent (`--local` source).
    pub tx_frames: u64,
    /// Frames cut by the snap length when captured.
    pub truncated: u64,
    /// Bytes the snap length cut off (original minus captured lengths).
    pub truncated_bytes: u64,
    /// Frames longer than a test run takes (see [`FrameOutcome::cut`]).
    pub cut: u64,
    /// Frames shorter than an Ethernet header, counted as `truncated_l2`
    /// without a test run (the kernel refuses those).
    pub runts: Runts,
    /// Frames the kernel refused to test-run (see [`FrameOutcome::refused`]).
    pub refused: u64,
}

/// Frames shorter than an Ethernet header in one capture: neither engine
/// classifies them, their row is `truncated_l2` with every captured byte.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Runts {
    /// How many.
    pub frames: u64,
    /// Their captured bytes.
    pub bytes: u64,
}

impl Runts {
    /// Counts one runt of `len` bytes.
    pub fn add(&mut self, len: usize) {
        self.frames += 1;
        self.bytes += len as u64;
    }
}

/// The rows one capture added.
pub struct FileRows {
    /// Flow rows (interface index = the capture's number).
    pub rows: Vec<Row>,
    /// Drop rows, same labelling.
    pub drops: Vec<Row<DropId>>,
}

/// Classifies frames and keeps per-capture rows.
pub trait Classifier: AllowSetSink {
    /// `native` or `bpf_test_run`, for the replay lines.
    fn name(&self) -> &'static str;

    /// Classifies and counts one frame of at least an Ethernet header
    /// (shorter ones are counted apart: [`FileCounts::runts`]).
    fn run(&mut self, frame: &Frame) -> Result<FrameOutcome>;

    /// Ends capture number `index`: its rows, with rates over `seconds`
    /// (the capture's time span; rates are 0 when it is unknown), plus
    /// `runts` as unclassified `truncated_l2`.
    fn finish_file(&mut self, index: u32, seconds: f64, runts: Runts) -> Result<FileRows>;

    /// Self counters after the last capture.
    fn stats(&self) -> Result<KernelStats>;

    /// Names of the kernel's drop reasons.
    fn kernel_reasons(&self) -> &KernelReasons;
}

/// Per-capture rows from readings of counters kept since the start of a
/// replay (the programs' maps, or the native engine's): the aggregators
/// keep the totals, and each capture's rows are what grew since the
/// previous capture, relabelled with the capture's number.
pub struct CaptureRows {
    flows: Aggregator,
    drops: DropAggregator,
    /// Totals at the end of the previous capture.
    flow_seen: HashMap<FlowId, Tally>,
    drop_seen: HashMap<DropId, Tally>,
    /// Captured bytes the classifier did not count, per row (frames cut to
    /// a test run's limit; totals since the start).
    flow_top_up: HashMap<FlowId, u64>,
    drop_top_up: HashMap<DropId, u64>,
    /// Frames counted without a classifier run in the current capture
    /// (see [`CaptureRows::add_unclassified`]).
    unclassified: Vec<Row>,
}

/// Packets and bytes per row, to see which rows one frame moved.
pub type Readings<K> = HashMap<K, (u64, u64)>;

impl Default for CaptureRows {
    fn default() -> Self {
        CaptureRows {
            // Replay keeps every row: forgetting one would lose counts.
            flows: Aggregator::new(usize::MAX),
            drops: DropAggregator::new(usize::MAX),
            flow_seen: HashMap::new(),
            drop_seen: HashMap::new(),
            flow_top_up: HashMap::new(),
            drop_top_up: HashMap::new(),
            unclassified: Vec::new(),
        }
    }
}

impl CaptureRows {
    /// Folds in one reading of the counters since the start.
    pub fn update(&mut self, flows: &[(FlowId, FlowCounters)], drops: &[(DropId, DropCounters)]) {
        self.flows.update(flows);
        self.drops.update(drops);
    }

    /// Credits the rows one frame of `frame_len` captured bytes moved
    /// between `before` and `after` (one flow row, and a drop row when it
    /// was flagged) with the bytes the classifier did not count.
    pub fn top_up(
        &mut self,
        before: &(Readings<FlowId>, Readings<DropId>),
        after: &(Readings<FlowId>, Readings<DropId>),
        frame_len: u64,
    ) {
        credit(&before.0, &after.0, frame_len, &mut self.flow_top_up);
        credit(&before.1, &after.1, frame_len, &mut self.drop_top_up);
    }

    /// Counts `packets` frames of `bytes` that were not run through a
    /// classifier in the row `id` of the current capture (its ifindex is
    /// set when the capture ends); the row says how the parser classifies
    /// every such frame.
    pub fn add_unclassified(&mut self, id: FlowId, packets: u64, bytes: u64) {
        match self.unclassified.iter_mut().find(|row| row.id == id) {
            Some(row) => {
                row.packets += packets;
                row.bytes += bytes;
            }
            None => self.unclassified.push(Row {
                id,
                packets,
                bytes,
                pps: 0.0,
                bps: 0.0,
                inner: None,
                interval_packets: packets,
                tcp: TcpCounts::NONE,
                interval_tcp: TcpCounts::NONE,
            }),
        }
    }

    /// Ends capture number `index`: the rows that grew since the previous
    /// capture, with rates over `seconds` (the capture's time span; 0 when
    /// it is unknown), plus `runts` as unclassified `truncated_l2`.
    pub fn finish(&mut self, index: u32, seconds: f64, runts: Runts) -> FileRows {
        if runts.frames > 0 {
            self.add_unclassified(
                unclassified_id(Direction::Rx, Unclassified::TruncatedL2),
                runts.frames,
                runts.bytes,
            );
        }
        let mut rows = grown(
            topped_up(self.flows.finish_interval(1.0), &self.flow_top_up),
            &mut self.flow_seen,
            seconds,
            |id| FlowId {
                ifindex: index,
                ..id
            },
        );
        for extra in self.unclassified.drain(..) {
            let id = FlowId {
                ifindex: index,
                ..extra.id
            };
            match rows.iter_mut().find(|row| row.id == id) {
                Some(row) => {
                    row.packets += extra.packets;
                    row.bytes += extra.bytes;
                    row.pps = rate(row.packets, seconds);
                    row.bps = rate(row.bytes * 8, seconds);
                }
                None => rows.push(Row {
                    id,
                    pps: rate(extra.packets, seconds),
                    bps: rate(extra.bytes * 8, seconds),
                    ..extra
                }),
            }
        }
        let drops = grown(
            topped_up(self.drops.finish_interval(1.0), &self.drop_top_up),
            &mut self.drop_seen,
            seconds,
            |id| DropId {
                ifindex: index,
                ..id
            },
        );
        FileRows { rows, drops }
    }
}

/// The identity of frames not classified in `direction` for `reason`
/// (interface index 0, set per capture).
pub fn unclassified_id(direction: Direction, reason: Unclassified) -> FlowId {
    FlowId {
        ifindex: 0,
        direction,
        proto: Proto::Other,
        reason,
        peer: None,
        vni: 0,
    }
}

/// Adds to `top_up` the bytes a frame of `frame_len` was short in each
/// row whose packets grew between `before` and `after`.
fn credit<K: Copy + Eq + Hash>(
    before: &Readings<K>,
    after: &Readings<K>,
    frame_len: u64,
    top_up: &mut HashMap<K, u64>,
) {
    for (id, (packets, bytes)) in after {
        let (packets_before, bytes_before) = before.get(id).copied().unwrap_or((0, 0));
        if *packets > packets_before {
            let counted = bytes.saturating_sub(bytes_before);
            *top_up.entry(*id).or_default() += frame_len.saturating_sub(counted);
        }
    }
}

/// `rows` with the bytes of `top_up` added.
fn topped_up<K: Eq + Hash>(mut rows: Vec<Row<K>>, top_up: &HashMap<K, u64>) -> Vec<Row<K>> {
    for row in &mut rows {
        row.bytes += top_up.get(&row.id).copied().unwrap_or(0);
    }
    rows
}

/// The rows whose totals grew since `seen`, as rows of the growth only
/// (relabelled by `label`); updates `seen`.
fn grown<K: Copy + Eq + Hash>(
    totals: Vec<Row<K>>,
    seen: &mut HashMap<K, Tally>,
    seconds: f64,
    label: impl Fn(K) -> K,
) -> Vec<Row<K>> {
    totals
        .into_iter()
        .filter_map(|row| {
            let now = Tally {
                packets: row.packets,
                bytes: row.bytes,
                tcp: row.tcp,
            };
            let before = seen.insert(row.id, now).unwrap_or_default();
            // Totals since the start only grow.
            let grew = now.since(&before).unwrap_or(now);
            (grew.packets > 0 || grew.bytes > 0).then(|| Row {
                id: label(row.id),
                packets: grew.packets,
                bytes: grew.bytes,
                pps: rate(grew.packets, seconds),
                bps: rate(grew.bytes * 8, seconds),
                inner: row.inner,
                interval_packets: grew.packets,
                tcp: grew.tcp,
                interval_tcp: grew.tcp,
            })
        })
        .collect()
}

/// Whether `frame` (at least an Ethernet header long) was sent by the
/// capturing node: its outer source is one of `local`. Without `--local`
/// no frame is parsed for it.
pub fn sent_by(frame: &[u8], local: &[IpAddr]) -> bool {
    !local.is_empty() && capture::outer_source(frame).is_some_and(|src| local.contains(&src))
}

/// `count` per second over `seconds` (0 when the span is unknown).
fn rate(count: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}
