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

use std::net::IpAddr;

use anyhow::{Context, Result};
use observer_common::{Direction, Unclassified, parse::ETH_HLEN};

use observer_core::capture::Frame;

use crate::{
    bpf::features::{self, XdpProgram},
    bpf::testrun,
    bpf::{Hook, Observer},
    cmd::replay::classify::{
        CaptureRows, Classifier, FileRows, FrameOutcome, Readings, Runts, sent_by, unclassified_id,
    },
    model::facts::AllowSets,
    model::kernel::REPLAY_KERNEL,
    model::rows::{self, DropId, FlowId, KernelReasons, KernelStats},
    monitor::refresher::AllowSetSink,
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
/// IPv6 frame shorter than its IP header (EINVAL). The parser classifies
/// every such frame alike (its IP header read fails: `truncated_l3`, no
/// peer), so a refused frame is counted in that row, and one runt does not
/// end the replay; the differential test checks the row against the
/// native parser.
pub struct KernelClassifier {
    observer: Observer,
    /// The program received frames run through ([`receive_hook`]).
    rx: Hook,
    local: Vec<IpAddr>,
    rows: CaptureRows,
    unfolded: usize,
    flow_entries: u64,
}

impl KernelClassifier {
    /// Feeds `observer`; frames whose outer source is in `local` count as
    /// sent. Pins the calling thread to its CPU (see
    /// `testrun::pin_to_this_cpu`): the replay's inner samples are then the
    /// latest frame's, as the native engine's.
    pub fn new(observer: Observer, local: Vec<IpAddr>) -> Result<KernelClassifier> {
        testrun::pin_to_this_cpu().context("pinning the replay to one CPU")?;
        // The kernel the programs were loaded into, as probed then; the
        // plan names the fallback with what it costs.
        let rx = receive_hook_of(&observer.features().release);
        let plan = observer.plan();
        for fallback in plan.fallbacks.iter().filter(|f| f.hook == REPLAY_KERNEL) {
            tracing::warn!("{fallback}");
        }
        Ok(KernelClassifier {
            observer,
            rx,
            local,
            rows: CaptureRows::default(),
            unfolded: 0,
            flow_entries: 0,
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

    /// Reads the maps into the capture rows.
    fn fold(&mut self) -> Result<()> {
        let flows = self.observer.read_flows()?;
        self.flow_entries = rows::map_entries(&flows);
        self.rows.update(&flows, &self.observer.read_drops()?);
        self.unfolded = 0;
        Ok(())
    }
}

/// The program received frames run through: the XDP program `attach`
/// uses, or tc ingress (the same parser and checks in an skb test run,
/// which never touches the XDP dispatcher) on kernels where XDP test runs
/// rewrite it ([`features::xdp_test_run_rewrites_dispatcher`]).
pub fn receive_hook() -> Hook {
    receive_hook_of(&features::kernel_release())
}

/// [`receive_hook`] on the kernel `release`.
fn receive_hook_of(release: &str) -> Hook {
    if features::xdp_test_run_rewrites_dispatcher(release) {
        Hook::TcIngress
    } else {
        Hook::Xdp
    }
}

impl AllowSetSink for KernelClassifier {
    fn apply_allow_sets(&mut self, snapshot: &AllowSets) -> Result<()> {
        Ok(self.observer.apply_allow_sets(snapshot)?)
    }
}

impl Classifier for KernelClassifier {
    fn name(&self) -> &'static str {
        "bpf_test_run"
    }

    fn run(&mut self, frame: &Frame) -> Result<FrameOutcome> {
        let tx = sent_by(&frame.data, &self.local);
        let (hook, max) = if tx {
            (Hook::TcEgress, MAX_TC_FRAME)
        } else if self.rx == Hook::TcIngress {
            (Hook::TcIngress, MAX_TC_FRAME)
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
        if hook != Hook::Xdp
            && shorter_than_its_ip_header(data)
            && ran
                .as_ref()
                .is_err_and(|e| e.raw_os_error() == Some(libc::EINVAL))
        {
            let id = unclassified_id(Direction::Tx, Unclassified::TruncatedL3);
            self.rows.add_unclassified(id, 1, frame.data.len() as u64);
            return Ok(FrameOutcome {
                tx,
                cut: false,
                refused: true,
            });
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
            let after = self.readings()?;
            self.rows.top_up(&before, &after, frame.data.len() as u64);
        }
        self.unfolded += 1;
        if self.unfolded >= FOLD_EVERY {
            self.fold()?;
        }
        Ok(FrameOutcome {
            tx,
            cut,
            refused: false,
        })
    }

    /// Ends capture number `index`: its rows, with rates over `seconds`
    /// (the capture's time span; rates are 0 when it is unknown), plus
    /// `runts` as unclassified `truncated_l2`.
    fn finish_file(&mut self, index: u32, seconds: f64, runts: Runts) -> Result<FileRows> {
        self.fold()?;
        Ok(self.rows.finish(index, seconds, runts))
    }

    /// The kernel's self counters after the last read.
    fn stats(&self) -> Result<KernelStats> {
        Ok(self.observer.stats_for(self.flow_entries)?)
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
