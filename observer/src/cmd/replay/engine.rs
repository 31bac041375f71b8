//! The kernel replay engine, `observer replay --kernel`: it runs captured frames
//! through the loaded programs with BPF_PROG_TEST_RUN and turns the flow
//! and drop maps into per-capture rows. (The default engine runs the same
//! parser natively: `native`.)
//!
//! Every frame is classified in the kernel by the programs `attach` uses:
//! `observer_xdp` for received frames, and `observer_tc_out` (the same
//! parser, in the tx direction: the peer is the outer destination) for
//! frames whose outer source is a `--local` address. The maps are read
//! every [`FOLD_EVERY`] frames into the aggregators, which keep totals exact
//! when the LRU evicts a row; each capture's rows are the growth of those
//! totals while it was replayed, relabelled with the capture's number as
//! their interface index.
//!
//! A test run takes frames up to a limit (one page for skb and
//! single-buffer XDP, 64 KiB for multi-buffer XDP, which counts the
//! fragments past the first page itself): a longer frame is cut and the
//! program counts only what it was given. For such frames (jumbo frames,
//! GRO super-packets; rare) the maps are read before and after the run and
//! the row the frame went to is topped up to its captured length, so the
//! rows count every captured byte.

use std::{collections::HashMap, hash::Hash, net::IpAddr};

use anyhow::{Context, Result};

use crate::{
    bpf::features::XdpProgram,
    bpf::testrun,
    bpf::{Hook, Observer},
    cmd::checks::AllowSetSink,
    cmd::replay::capture::{self, Frame},
    cmd::replay::classify::{ETH_HLEN, Engine, FileRows, FrameOutcome, add_runts, rate},
    cmd::replay::native::NativeEngine,
    model::aggregate::{Aggregator, DropAggregator},
    model::facts::AllowSets,
    model::ports::PortConfig,
    model::rows::DropId,
    model::rows::FlowId,
    model::rows::KernelReasons,
    model::rows::KernelStats,
    model::rows::{self, Row},
};

/// Frames between two reads of the maps: far fewer than the flow map
/// holds ([`REPLAY_MAX_FLOWS`]), so no row is evicted before it was read.
pub const FOLD_EVERY: usize = 4096;
/// Capacity of the flow and drop maps for a replay.
pub const REPLAY_MAX_FLOWS: u32 = 65_536;
/// Longest frame an XDP test run of the multi-buffer program takes: one
/// page plus 17 page fragments (MAX_SKB_FRAGS); 64 KiB keeps every header
/// of a BIG TCP frame.
pub const MAX_XDP_FRAME: usize = 64 * 1024;
/// Longest frame an XDP test run of the single-buffer program takes
/// (kernels before 5.18): a 4 KiB page minus XDP_PACKET_HEADROOM (256)
/// and the skb_shared_info (320).
pub const MAX_XDP_SB_FRAME: usize = 4096 - 256 - 320;
/// Longest frame an skb (tc) test run takes: a 4 KiB page minus
/// NET_SKB_PAD (64), NET_IP_ALIGN (up to 2) and the skb_shared_info (320).
pub const MAX_TC_FRAME: usize = 4096 - 64 - 2 - 320;

/// A loaded observer fed with frames.
///
/// Kernels since about 6.13 refuse an skb test run (tc) of an IPv4 or
/// IPv6 frame shorter than its IP header (EINVAL), which the programs
/// would count as `truncated_l3`; such a frame goes to the native build of
/// the same parser instead, so that one runt does not end the replay.
pub struct Replayer {
    observer: Observer,
    refused: NativeEngine,
    local: Vec<IpAddr>,
    aggregator: Aggregator,
    drop_aggregator: DropAggregator,
    /// Totals at the end of the previous capture.
    flow_seen: HashMap<FlowId, (u64, u64)>,
    drop_seen: HashMap<DropId, (u64, u64)>,
    unfolded: usize,
    flow_entries: u64,
    /// Captured bytes of long frames the programs did not count, per row
    /// (totals since the start, like the aggregators').
    flow_top_up: HashMap<FlowId, u64>,
    drop_top_up: HashMap<DropId, u64>,
}

/// The maps' packets and bytes per row, to see which rows one frame moved.
type Readings<K> = HashMap<K, (u64, u64)>;

impl Replayer {
    /// Feeds `observer`, loaded with the UDP ports of `ports`; frames
    /// whose outer source is in `local` count as sent. Pins the calling
    /// thread to its CPU (see `testrun::pin_to_this_cpu`): the replay's
    /// inner samples are then the latest frame's, as the native engine's.
    pub fn new(observer: Observer, ports: &PortConfig, local: Vec<IpAddr>) -> Result<Replayer> {
        testrun::pin_to_this_cpu().context("pinning the replay to one CPU")?;
        Ok(Replayer {
            observer,
            refused: NativeEngine::new(ports, local.clone())?,
            local,
            // Replay keeps every row: forgetting one would lose counts.
            aggregator: Aggregator::new(usize::MAX),
            drop_aggregator: DropAggregator::new(usize::MAX),
            flow_seen: HashMap::new(),
            drop_seen: HashMap::new(),
            unfolded: 0,
            flow_entries: 0,
            flow_top_up: HashMap::new(),
            drop_top_up: HashMap::new(),
        })
    }

    fn readings(&self) -> Result<(Readings<FlowId>, Readings<DropId>)> {
        let flows = self.observer.read_flows()?;
        let drops = self.observer.read_drops()?;
        Ok((
            flows
                .into_iter()
                .map(|(id, c)| (id, (c.packets, c.bytes)))
                .collect(),
            drops
                .into_iter()
                .map(|(id, c)| (id, (c.packets, c.bytes)))
                .collect(),
        ))
    }

    /// Credits the rows one frame of `frame_len` captured bytes moved (one
    /// flow row, and a drop row when it was flagged) with the bytes the
    /// program did not count.
    fn top_up(
        &mut self,
        before: &(Readings<FlowId>, Readings<DropId>),
        frame_len: u64,
    ) -> Result<()> {
        let after = self.readings()?;
        credit(&before.0, &after.0, frame_len, &mut self.flow_top_up);
        credit(&before.1, &after.1, frame_len, &mut self.drop_top_up);
        Ok(())
    }

    /// Reads the maps into the aggregators.
    fn fold(&mut self) -> Result<()> {
        let flows = self.observer.read_flows()?;
        self.flow_entries = rows::map_entries(&flows);
        self.aggregator.update(&flows);
        self.drop_aggregator.update(&self.observer.read_drops()?);
        self.unfolded = 0;
        Ok(())
    }
}

impl AllowSetSink for Replayer {
    fn apply_allow_sets(&mut self, snapshot: &AllowSets) -> Result<()> {
        self.refused.apply_allow_sets(snapshot)?;
        self.observer.apply_allow_sets(snapshot)
    }
}

impl Engine for Replayer {
    fn name(&self) -> &'static str {
        "bpf_test_run"
    }

    fn run(&mut self, frame: &Frame) -> Result<Option<FrameOutcome>> {
        if frame.data.len() < ETH_HLEN {
            return Ok(None);
        }
        let tx = capture::outer_source(&frame.data).is_some_and(|src| self.local.contains(&src));
        let (hook, max) = if tx {
            (Hook::TcEgress, MAX_TC_FRAME)
        } else if self.observer.plan().xdp == XdpProgram::MultiBuffer {
            (Hook::Xdp, MAX_XDP_FRAME)
        } else {
            (Hook::Xdp, MAX_XDP_SB_FRAME)
        };
        let data = &frame.data[..frame.data.len().min(max)];
        // A cut frame is counted up to the cut: its row is topped up.
        let cut = data.len() < frame.data.len();
        let before = if cut { Some(self.readings()?) } else { None };
        let ran = testrun::run(self.observer.program_fd(hook)?, data, None, 1);
        if hook == Hook::TcEgress
            && shorter_than_its_ip_header(data)
            && ran
                .as_ref()
                .is_err_and(|e| e.raw_os_error() == Some(libc::EINVAL))
        {
            let outcome = self.refused.run(frame)?;
            return Ok(outcome.map(|o| FrameOutcome { refused: true, ..o }));
        }
        ran.with_context(|| {
            format!(
                "BPF_PROG_TEST_RUN of {} on frame {} ({} bytes)",
                self.observer.program_name(hook),
                frame.number,
                data.len()
            )
        })?;
        if let Some(before) = before {
            self.top_up(&before, frame.data.len() as u64)?;
        }
        self.unfolded += 1;
        if self.unfolded >= FOLD_EVERY {
            self.fold()?;
        }
        Ok(Some(FrameOutcome {
            tx,
            cut,
            refused: false,
        }))
    }

    /// Ends capture number `index`: its rows, with rates over `seconds`
    /// (the capture's time span; rates are 0 when it is unknown), plus
    /// `runts` frames as unclassified `truncated_l2`.
    fn finish_file(&mut self, index: u32, seconds: f64, runts: u64) -> Result<FileRows> {
        self.fold()?;
        let rows = grown(
            topped_up(self.aggregator.finish_interval(1.0), &self.flow_top_up),
            &mut self.flow_seen,
            seconds,
            |id| FlowId {
                ifindex: index,
                ..id
            },
        );
        let refused = self.refused.finish_file(index, seconds, 0)?;
        let mut rows = merged(rows, refused.rows);
        add_runts(&mut rows, index, seconds, runts);
        let drops = grown(
            topped_up(self.drop_aggregator.finish_interval(1.0), &self.drop_top_up),
            &mut self.drop_seen,
            seconds,
            |id| DropId {
                ifindex: index,
                ..id
            },
        );
        Ok(FileRows {
            rows,
            drops: merged(drops, refused.drops),
        })
    }

    /// The kernel's self counters after the last read.
    fn stats(&self) -> Result<KernelStats> {
        self.observer.stats_for(self.flow_entries)
    }

    fn kernel_reasons(&self) -> &KernelReasons {
        self.observer.kernel_reasons()
    }
}

/// Whether an untagged IPv4/IPv6 frame ends inside its IP header: the
/// frames newer kernels refuse to run through an skb test run.
fn shorter_than_its_ip_header(frame: &[u8]) -> bool {
    const IPV4_HLEN: usize = 20;
    const IPV6_HLEN: usize = 40;
    match frame.get(12..14) {
        Some([0x08, 0x00]) => frame.len() < ETH_HLEN + IPV4_HLEN,
        Some([0x86, 0xdd]) => frame.len() < ETH_HLEN + IPV6_HLEN,
        _ => false,
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

/// `rows` and `more` as one list: rows of the same identity add up.
fn merged<K: Copy + Eq + Hash>(rows: Vec<Row<K>>, more: Vec<Row<K>>) -> Vec<Row<K>> {
    if more.is_empty() {
        return rows;
    }
    let mut by_id: HashMap<K, Row<K>> = HashMap::new();
    for row in rows.into_iter().chain(more) {
        match by_id.get_mut(&row.id) {
            Some(sum) => {
                sum.packets += row.packets;
                sum.bytes += row.bytes;
                sum.pps += row.pps;
                sum.bps += row.bps;
                sum.inner = row.inner.or(sum.inner);
            }
            None => {
                by_id.insert(row.id, row);
            }
        }
    }
    by_id.into_values().collect()
}

/// The rows whose totals grew since `seen`, as rows of the growth only
/// (relabelled by `label`); updates `seen`.
fn grown<K: Copy + Eq + Hash>(
    totals: Vec<Row<K>>,
    seen: &mut HashMap<K, (u64, u64)>,
    seconds: f64,
    label: impl Fn(K) -> K,
) -> Vec<Row<K>> {
    totals
        .into_iter()
        .filter_map(|row| {
            let before = seen
                .insert(row.id, (row.packets, row.bytes))
                .unwrap_or((0, 0));
            let (packets, bytes) = (row.packets - before.0, row.bytes - before.1);
            (packets > 0 || bytes > 0).then(|| Row {
                id: label(row.id),
                packets,
                bytes,
                pps: rate(packets, seconds),
                bps: rate(bytes * 8, seconds),
                inner: row.inner,
                changed: true,
            })
        })
        .collect()
}
