//! Userspace cost of one interval with many peers in the kernel map: read
//! the flow map into the aggregator (`for_each_flow`, `Aggregator::add`;
//! the stage `read` includes the folding, `aggregate` the rates), judge it
//! (`anomalies::Engine`), build and encode
//! the textfile (`Exporter`, `textfile::encode`), with 1,000, 10,000 and
//! 100,000 peers put there by XDP test runs of frames from distinct
//! sources. Also the RSS afterwards of a process that ran only this part
//! ([`run_apart`]), with the observer's heap policy (`process::heap`).

use std::{
    collections::HashMap,
    process::{Command, Stdio},
    time::{Instant, SystemTime},
};

use anyhow::ensure;
use observer::{
    bpf::testrun,
    bpf::{Hook, LoadConfig, Observer, maps::MapRead},
    model::aggregate::Aggregator,
    model::anomalies::{Engine, Known, Thresholds},
    report::textfile::{self, ExportInput, Exporter},
};

use super::{median, report, report_child_lines, rss_kib};

/// Offset of the outer IPv4 source in an untagged frame.
const IPV4_SOURCE: std::ops::Range<usize> = 26..30;
const ROUNDS: usize = 7;

/// Runs [`run`] in a child process of the bench
/// (`OBSERVER_BENCH_ONLY=snapshot`) and reports its lines as this
/// process's. Why: `rss_N_peers` is a whole process's RSS, and in the full
/// bench this process also holds what the parts before loaded (80.6 MiB
/// against 57.0 MiB alone at 100,000 peers, one run each).
pub fn run_apart() -> anyhow::Result<()> {
    let output = Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .env("OBSERVER_BENCH_ONLY", "snapshot")
        .stderr(Stdio::inherit())
        .output()?;
    ensure!(
        output.status.success(),
        "the snapshot bench (a child process) failed: {}",
        output.status
    );
    report_child_lines(&String::from_utf8_lossy(&output.stdout));
    Ok(())
}

/// Runs the snapshot benches on copies of `vxlan` (an untagged IPv4 frame).
pub fn run(vxlan: &[u8]) -> anyhow::Result<()> {
    // As the observer's own main does.
    observer::process::heap::return_large_frees();
    for peers in [1_000u32, 10_000, 100_000] {
        // Twice the peers: the per-CPU LRU must evict nothing.
        let observer = Observer::load(&LoadConfig {
            max_flows: 2 * peers,
            ..LoadConfig::default()
        })?;
        let xdp = observer.program_fd(Hook::Xdp)?;
        let mut frame = vxlan.to_vec();
        for i in 0..peers {
            frame[IPV4_SOURCE].copy_from_slice(&(0x0a00_0000 + i).to_be_bytes());
            testrun::run(xdp, &frame, None, 1)?;
        }
        let ifaces = HashMap::from([(1, "lo".to_string())]);
        let mut aggregator = Aggregator::new(4 * 2 * peers as usize);
        let mut exporter = Exporter::new(200);
        let mut engine = Engine::new(Thresholds::default(), 0.0);
        let known = Known::default();
        let (mut read, mut encode) = (Vec::new(), Vec::new());
        // Where the time goes, per stage: read, aggregate, anomalies,
        // families, encode.
        let mut stages: [Vec<f64>; 5] = Default::default();
        let ms = |from: Instant, to: Instant| (to - from).as_secs_f64() * 1e3;
        let mut bytes = 0;
        // One round more than measured: the first creates every row.
        for round in 0..=ROUNDS {
            let start = Instant::now();
            // As the monitor reads: rows go into the aggregator as the
            // map is read.
            aggregator.begin_read();
            let mut read_rows = 0;
            let map_entries = observer.for_each_flow(MapRead::Batch, |id, counters| {
                read_rows += 1;
                aggregator.add(id, counters);
            })?;
            aggregator.end_read();
            let read_at = Instant::now();
            ensure!(
                read_rows == peers as usize,
                "{read_rows} rows in the flow map, {peers} expected"
            );
            let rows = aggregator.finish_interval(1.0);
            let aggregated_at = Instant::now();
            engine.observe(round as f64 + 1.0, SystemTime::now(), &rows, &[], &known);
            let read_done = Instant::now();
            let input = ExportInput {
                rows: &rows,
                ifaces: &ifaces,
                stats: observer.stats_for(map_entries)?,
                programs_attached: 3,
                at: SystemTime::now(),
                anomalies: &engine.active(),
                anomalies_raised: engine.raised(),
                ..Default::default()
            };
            let families = exporter.families(&input);
            let families_at = Instant::now();
            let text = textfile::encode(&families)?;
            let done = Instant::now();
            bytes = text.len();
            if round > 0 {
                read.push(ms(start, read_done));
                encode.push(ms(read_done, done));
                let marks = [start, read_at, aggregated_at, read_done, families_at, done];
                for (stage, pair) in stages.iter_mut().zip(marks.windows(2)) {
                    stage.push(ms(pair[0], pair[1]));
                }
            }
        }
        report(
            &format!("snapshot_{peers}_peers"),
            format!("{:.2}", median(&mut read)),
            "ms",
        );
        report(
            &format!("export_{peers}_peers"),
            format!("{:.2}", median(&mut encode)),
            "ms",
        );
        if peers == 100_000 {
            let names = ["read", "aggregate", "anomalies", "families", "encode"];
            for (name, stage) in names.iter().zip(&mut stages) {
                report(
                    &format!("stage_{name}_{peers}_peers"),
                    format!("{:.2}", median(stage)),
                    "ms",
                );
            }
        }
        report(&format!("textfile_{peers}_peers"), bytes, "bytes");
        report(
            &format!("rss_{peers}_peers"),
            format!("{:.1}", rss_kib() as f64 / 1024.0),
            "MiB",
        );
    }
    Ok(())
}
