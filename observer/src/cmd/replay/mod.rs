//! `observer replay FILE...`: counts the tunnel traffic of capture files
//! with the observer's own eBPF classifier, and prints attach's rows.
//!
//! - `capture` reads pcap/pcapng into Ethernet frames (pure, fuzzed);
//! - `native` classifies them in this process with the programs' own parser
//!   and checks, compiled natively (the default: no privileges, no system
//!   call per frame);
//! - `classify` says what an engine does (frames in, per-capture rows out);
//! - `kernel` runs the frames through the loaded programs
//!   (BPF_PROG_TEST_RUN) for `--kernel`, making per-capture rows from the
//!   maps;
//! - this module checks the files and privileges, mirrors the allow-sets,
//!   tallies the observer's own evidence comments (`model::evidence`: a
//!   `--capture-dir` file says why each frame was kept), prints, and
//!   chooses the exit status ([`EXIT_DAMAGED`], [`EXIT_USAGE`]).

pub use observer_core::capture;
pub mod classify;
pub mod kernel;
pub mod native;

use std::{
    collections::HashMap,
    fs::File,
    io,
    path::Path,
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result, anyhow, bail};
use observer_common::parse::ETH_HLEN;

use crate::{
    bpf::{Hook, LoadConfig, Observer},
    cli::ReplayArgs,
    model::evidence::{EvidenceTally, Tag},
    model::rows::DropId,
    model::rows::Row,
    monitor::refresher,
    node::allowsets::AllowSetConfig,
    node::preflight,
    process::pipe,
    report::{self, Format, lines::ReplayLine, replay::Capture, view::Snapshot},
};

use capture::Frames;
use classify::{Classifier, FileCounts};
use kernel::KernelClassifier;
use native::NativeClassifier;

/// Exit status when a capture is damaged; the counts read before the
/// damage are printed.
pub const EXIT_DAMAGED: u8 = 1;
/// Exit status of usage and environment errors (missing file, not a
/// capture, unsupported link type, missing privileges).
pub const EXIT_USAGE: u8 = 2;

/// One replayed capture.
struct Replayed {
    name: String,
    format: &'static str,
    counts: FileCounts,
    first: Option<Duration>,
    last: Option<Duration>,
    /// Its frames' observer comments, counted.
    evidence: EvidenceTally,
    /// The error that ended it early, and its exit status.
    error: Option<(String, u8)>,
}

/// Runs the replay command; returns the exit status (0 or [`EXIT_DAMAGED`],
/// after naming the damaged captures). An error is [`EXIT_USAGE`].
pub fn run(args: ReplayArgs) -> Result<u8> {
    replay(&args)
}

fn open(path: &Path) -> Result<Frames<File>> {
    let name = path.display();
    let file = File::open(path).with_context(|| format!("capture {name}: cannot open"))?;
    capture::frames(file).map_err(|e| anyhow!("capture {name}: {e}"))
}

fn replay(args: &ReplayArgs) -> Result<u8> {
    // Every file is checked before anything is loaded, so a typo in the
    // last name costs nothing and prints nothing.
    for path in &args.files {
        open(path)?;
    }
    let ports = args.ports.resolve(Default::default());
    let mut engine: Box<dyn Classifier> = if args.kernel {
        preflight::check_privileges().context(
            "replay --kernel loads the eBPF programs and runs every frame through them with BPF_PROG_TEST_RUN (without --kernel the same parser runs in this process, unprivileged)",
        )?;
        let observer = Observer::load(&LoadConfig {
            max_flows: kernel::REPLAY_MAX_FLOWS,
            ports: ports.clone(),
            // Received frames run through XDP, tc ingress only where XDP
            // test runs rewrite the dispatcher.
            defer_tc_ingress: kernel::receive_hook() == Hook::Xdp,
        })?;
        Box::new(KernelClassifier::new(observer, args.local.clone())?)
    } else {
        Box::new(NativeClassifier::new(&ports, args.local.clone())?)
    };
    // ipset and nft cannot list sets without CAP_NET_ADMIN: an unprivileged
    // replay says so once and counts with --allow-cidr only, instead of
    // printing each tool's refusal.
    let skip_node_sets = (!preflight::has_net_admin()).then(|| {
        "this node's allow-sets (Calico's ipset and nftables sets) were not read: ipset and nft need CAP_NET_ADMIN; only --allow-cidr applies (run as root to include them)".to_string()
    });
    if skip_node_sets.is_some() && !args.allow_sets.is_empty() {
        bail!(
            "--allow-set reads sets with ipset and nft, which need CAP_NET_ADMIN: run as root, or give the prefixes with --allow-cidr"
        );
    }
    let allow = AllowSetConfig {
        sets: args.allow_sets.clone(),
        cidrs: args.allow_cidrs.clone(),
        skip_node_sets,
    };
    // No local VNIs are written: the capture's belong to the node that
    // captured, not to this one's vxlan devices, so vni_unknown is off.
    let (allow_sets, reports) = refresher::read_allow_sets_once(&allow, engine.as_mut())?;
    let format = Format::or_default(args.output);

    let mut replayed = Vec::new();
    let mut rows: Vec<Row> = Vec::new();
    let mut drop_rows: Vec<Row<DropId>> = Vec::new();
    for (i, path) in args.files.iter().enumerate() {
        let index = u32::try_from(i + 1).context("too many captures")?;
        let (one, file_rows) = replay_file(engine.as_mut(), path, index)?;
        rows.extend(file_rows.rows);
        drop_rows.extend(file_rows.drops);
        replayed.push(one);
    }

    let ifaces: HashMap<u32, String> = replayed
        .iter()
        .enumerate()
        .map(|(i, r)| (i as u32 + 1, r.name.clone()))
        .collect();
    // Captures hold no kernel locations: every row's is 0.
    let drops = refresher::drop_rows(
        engine.kernel_reasons(),
        drop_rows,
        Some(&allow_sets),
        &ifaces,
        |_| None,
    );
    let at = replayed
        .iter()
        .filter_map(|r| r.last)
        .max()
        .map_or_else(SystemTime::now, |last| SystemTime::UNIX_EPOCH + last);
    // No anomalies (they need the capturing node's data plane, which a
    // capture does not hold), no BGP at the wire (counted per interface,
    // not per capture), no attachments or netfilter counters.
    let snapshot = Snapshot {
        drops: &drops,
        ..Snapshot::new(&rows, engine.stats()?, &ifaces, at, true)
    };
    // A closed stdout ends here (see `process::pipe`).
    print(format, &reports, engine.name(), &replayed, &snapshot).context("writing output")?;
    let mut code = 0;
    for r in &replayed {
        if let Some((error, status)) = &r.error {
            pipe::eprintln(format_args!("observer: error: capture {}: {error}", r.name));
            code = code.max(*status);
        }
    }
    Ok(code)
}

/// Replays one capture as number `index`.
fn replay_file(
    engine: &mut dyn Classifier,
    path: &Path,
    index: u32,
) -> Result<(Replayed, classify::FileRows)> {
    let mut frames = open(path)?;
    let mut one = Replayed {
        name: path.display().to_string(),
        format: frames.format(),
        counts: FileCounts::default(),
        first: None,
        last: None,
        evidence: EvidenceTally::new(),
        error: None,
    };
    for frame in frames.by_ref() {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                let status = if e.is_damage() {
                    EXIT_DAMAGED
                } else {
                    EXIT_USAGE
                };
                one.error = Some((e.to_string(), status));
                break;
            }
        };
        let counts = &mut one.counts;
        counts.frames += 1;
        if frame.truncated() {
            counts.truncated += 1;
            counts.truncated_bytes += u64::from(frame.original_len - frame.captured_len);
        }
        one.first.get_or_insert(frame.timestamp);
        one.last = Some(frame.timestamp);
        // Evidence files say why the observer kept each frame; other
        // comments (typed in Wireshark) are not ours.
        if let Some(tag) = frame.comment.as_deref().and_then(Tag::parse) {
            one.evidence.add(&tag);
        }
        // Neither engine classifies a frame shorter than an Ethernet
        // header (the kernel refuses to test-run one).
        if frame.data.len() < ETH_HLEN {
            counts.runts.add(frame.data.len());
        } else {
            let outcome = engine.run(&frame)?;
            counts.tx_frames += u64::from(outcome.tx);
            counts.cut += u64::from(outcome.cut);
            counts.refused += u64::from(outcome.refused);
        }
    }
    let seconds = match (one.first, one.last) {
        (Some(first), Some(last)) => last.saturating_sub(first).as_secs_f64(),
        _ => 0.0,
    };
    let rows = engine.finish_file(index, seconds, one.counts.runts)?;
    Ok((one, rows))
}

fn timestamp(since_epoch: Duration) -> String {
    humantime::format_rfc3339_micros(SystemTime::UNIX_EPOCH + since_epoch).to_string()
}

/// Prints the allow-set reports, one summary per capture with its
/// evidence, then the rows (`report::replay`).
fn print(
    format: Format,
    reports: &[crate::report::lines::AllowSetLine],
    engine: &'static str,
    replayed: &[Replayed],
    snapshot: &Snapshot<'_>,
) -> io::Result<()> {
    let captures = replayed
        .iter()
        .enumerate()
        .map(|(i, r)| Capture {
            summary: ReplayLine {
                iface: &r.name,
                ifindex: i as u32 + 1,
                format: r.format,
                engine,
                frames: r.counts.frames,
                tx_frames: r.counts.tx_frames,
                truncated: r.counts.truncated,
                truncated_bytes: r.counts.truncated_bytes,
                cut: r.counts.cut,
                refused: r.counts.refused,
                first_ts: r.first.map(timestamp),
                last_ts: r.last.map(timestamp),
                error: r.error.as_ref().map(|(e, _)| e.as_str()),
                evidence_frames: r.evidence.frames(),
                evidence_overflow: r.evidence.overflow(),
            },
            evidence: &r.evidence,
        })
        .collect();
    report::replay::write(
        &mut io::stdout().lock(),
        format,
        reports,
        captures,
        snapshot,
    )
}
