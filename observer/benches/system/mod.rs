//! Whole-system benches beside the per-packet ones: what the observer costs
//! a node (veth throughput and CPU against tcpdump), its userspace snapshot
//! and export with many peers, and replay speed. Also the reporting every
//! bench shares: `bench NAME VALUE UNIT` lines and `target/bench.md`.

pub mod replay;
pub mod snapshot;
pub mod traffic;

#[path = "../../../tests/support/storm.rs"]
pub mod storm;

use std::{fmt::Display, io, os::fd::AsRawFd, path::PathBuf, process::Command, sync::Mutex};

/// Every reported figure, in order: (name, value, unit).
static TABLE: Mutex<Vec<(String, String, String)>> = Mutex::new(Vec::new());

/// Prints `bench NAME VALUE UNIT` and keeps it for [`write_table`].
pub fn report(name: &str, value: impl Display, unit: &str) {
    let value = value.to_string();
    println!("bench {name} {value} {unit}");
    TABLE.lock().unwrap_or_else(|e| e.into_inner()).push((
        name.to_string(),
        value,
        unit.to_string(),
    ));
}

/// The cargo target directory (`CARGO_TARGET_DIR`, else the workspace's).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")))
}

/// Writes every reported figure as a Markdown table to `target/bench.md`.
pub fn write_table() -> anyhow::Result<()> {
    let mut text = String::from("| bench | value | unit |\n| --- | ---: | --- |\n");
    for (name, value, unit) in TABLE.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        text.push_str(&format!("| {name} | {value} | {unit} |\n"));
    }
    let path = target_dir().join("bench.md");
    std::fs::write(&path, text)?;
    eprintln!("bench: table written to {}", path.display());
    Ok(())
}

/// Deletes the bench's namespaces, also on error.
pub struct Namespaces(pub Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Runs a command, failing when it does.
pub fn sh(args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new(args[0]).args(&args[1..]).status()?;
    anyhow::ensure!(status.success(), "{} failed", args.join(" "));
    Ok(())
}

/// Moves the calling thread into network namespace `name`.
pub fn enter_netns(name: &str) -> anyhow::Result<()> {
    let file = std::fs::File::open(format!("/run/netns/{name}"))?;
    // SAFETY: valid fd; only this thread moves.
    anyhow::ensure!(
        unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } == 0,
        "setns {name}: {}",
        io::Error::last_os_error()
    );
    Ok(())
}

/// CPU time (user + system) of process `pid` so far, in seconds.
pub fn process_cpu(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow::anyhow!("odd /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5): 12 and 13 here.
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

/// Resident set size of this process, in KiB.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Median of `samples` (sorted in place).
pub fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let mid = samples.len() / 2;
    if samples.len() % 2 == 1 {
        samples[mid]
    } else {
        (samples[mid - 1] + samples[mid]) / 2.0
    }
}
