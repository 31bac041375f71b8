//! `observer replay` speed: the built binary on a generated capture of
//! 1,000,000 VXLAN frames from 16 sources (written under target/, removed
//! afterwards), wall time from start to exit; with the native classifier
//! (`replay_fps`, the default) and with `--kernel` (`replay_kernel_fps`,
//! one BPF_PROG_TEST_RUN per frame).

use std::{
    fs,
    io::BufWriter,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, ensure};
use pcap_file::{
    Endianness,
    pcap::{PcapHeader, PcapWriter, RawPcapPacket},
};

use super::{report, target_dir};

const FRAMES: u32 = 1_000_000;
const SOURCES: u32 = 16;
const IPV4_SOURCE: std::ops::Range<usize> = 26..30;

/// Replays copies of `vxlan` (an untagged IPv4 frame).
pub fn run(vxlan: &[u8]) -> anyhow::Result<()> {
    let path = target_dir().join("bench-replay.pcap");
    let file = fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut writer = PcapWriter::with_header(
        BufWriter::new(file),
        PcapHeader {
            endianness: Endianness::Little,
            ..PcapHeader::default()
        },
    )?;
    let mut frame = vxlan.to_vec();
    for i in 0..FRAMES {
        frame[IPV4_SOURCE].copy_from_slice(&(0x0a00_0000 + i % SOURCES).to_be_bytes());
        writer.write_raw_packet(&RawPcapPacket {
            ts_sec: 1_700_000_000 + i / 1_000_000,
            ts_frac: i % 1_000_000,
            incl_len: frame.len() as u32,
            orig_len: frame.len() as u32,
            data: frame.as_slice().into(),
        })?;
    }
    drop(writer);
    let measured = [
        ("replay_fps", &[][..]),
        ("replay_kernel_fps", &["--kernel"][..]),
    ]
    .into_iter()
    .try_for_each(|(name, extra)| replay(&path, name, extra));
    let _ = fs::remove_file(&path);
    measured
}

/// Replays `path` with `extra` arguments and reports frames per second as `name`.
fn replay(path: &std::path::Path, name: &str, extra: &[&str]) -> anyhow::Result<()> {
    let start = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["replay", "--output", "json"])
        .args(extra)
        .arg(path)
        .env("OBSERVER_LOG", "error")
        .stderr(Stdio::inherit())
        .output()?;
    let seconds = start.elapsed().as_secs_f64();
    ensure!(
        output.status.success(),
        "observer replay {extra:?} failed ({})",
        output.status
    );
    let counted: u64 = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["type"] == "peer")
        .filter_map(|l| l["packets"].as_u64())
        .sum();
    ensure!(
        counted == u64::from(FRAMES),
        "replay {extra:?} counted {counted} of {FRAMES} frames"
    );
    report(
        name,
        format!("{:.0}", f64::from(FRAMES) / seconds),
        "frames/s",
    );
    Ok(())
}
