//! The replay engines' contract ([`Engine`]: frames in, per-capture rows
//! out) and what both engines share: the per-frame outcome, the
//! per-capture counts and rows, and how runts and rates are counted.

use anyhow::Result;
use observer_common::{Direction, Proto, Unclassified};

use crate::{
    cmd::checks::AllowSetSink,
    cmd::replay::capture::Frame,
    model::rows::{DropId, FlowId, KernelReasons, KernelStats, Row},
};

/// The kernel refuses test runs of frames shorter than an Ethernet header;
/// neither engine classifies them (see [`FileCounts::runts`]).
pub const ETH_HLEN: usize = 14;

/// What happened to one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrameOutcome {
    /// Counted as sent (its outer source is `--local`).
    pub tx: bool,
    /// Longer than a test run takes: classified on its first bytes; its
    /// row still gets every captured byte (see `engine`'s module docs).
    pub cut: bool,
    /// The kernel refused to test-run it (see `engine::Replayer`): classified by
    /// the native build of the same parser.
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
    pub runts: u64,
    /// Frames the kernel refused to test-run (see [`FrameOutcome::refused`]).
    pub refused: u64,
}

/// The rows one capture added.
pub struct FileRows {
    /// Flow rows (interface index = the capture's number).
    pub rows: Vec<Row>,
    /// Drop rows, same labelling.
    pub drops: Vec<Row<DropId>>,
}

/// Classifies frames and keeps per-capture rows.
pub trait Engine: AllowSetSink {
    /// `native` or `bpf_test_run`, for the replay lines.
    fn name(&self) -> &'static str;

    /// Classifies and counts one frame. Frames shorter than an Ethernet
    /// header are not classified (see [`FileCounts::runts`]): `None`.
    fn run(&mut self, frame: &Frame) -> Result<Option<FrameOutcome>>;

    /// Ends capture number `index`: its rows, with rates over `seconds`
    /// (the capture's time span; rates are 0 when it is unknown), plus
    /// `runts` frames as unclassified `truncated_l2`.
    fn finish_file(&mut self, index: u32, seconds: f64, runts: u64) -> Result<FileRows>;

    /// Self counters after the last capture.
    fn stats(&self) -> Result<KernelStats>;

    /// Names of the kernel's drop reasons.
    fn kernel_reasons(&self) -> &KernelReasons;
}

/// Adds `runts` frames of capture `index`, too short to classify, to its
/// `truncated_l2` row (made when the classifier made none: frames of 14
/// bytes or more can be `truncated_l2` too, when a VLAN tag is cut).
pub fn add_runts(rows: &mut Vec<Row>, index: u32, seconds: f64, runts: u64) {
    if runts == 0 {
        return;
    }
    let id = FlowId {
        ifindex: index,
        direction: Direction::Rx,
        proto: Proto::Other,
        reason: Unclassified::TruncatedL2,
        peer: None,
        vni: 0,
    };
    match rows.iter_mut().find(|row| row.id == id) {
        Some(row) => {
            row.packets += runts;
            row.pps = rate(row.packets, seconds);
        }
        None => rows.push(Row {
            id,
            packets: runts,
            bytes: 0,
            pps: rate(runts, seconds),
            bps: 0.0,
            inner: None,
            changed: true,
        }),
    }
}

/// `count` per second over `seconds` (0 when the span is unknown).
pub fn rate(count: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}
