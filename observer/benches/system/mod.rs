//! Whole-system benches beside the per-packet ones: what the observer costs
//! a node (veth throughput and CPU against tcpdump), its userspace snapshot
//! and export with many peers, its own cost between packets (with Calico's
//! rules at scale), and replay speed. Also the reporting every
//! bench shares: `bench NAME VALUE UNIT` lines and `target/bench.md`.

pub mod maptypes;
pub mod monitor;
pub mod replay;
pub mod snapshot;
pub mod traffic;
pub mod verifier;

pub use observer_testkit::storm;

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

/// Reports, as this process's, the `bench NAME VALUE UNIT` lines that
/// [`report`] printed in `stdout` of a child bench process; prints its
/// other lines as they are.
pub fn report_child_lines(stdout: &str) {
    for line in stdout.lines() {
        let row = line.strip_prefix("bench ").and_then(|rest| {
            let mut words = rest.splitn(3, ' ');
            Some((words.next()?, words.next()?, words.next()?))
        });
        match row {
            Some((name, value, unit)) => report(name, value, unit),
            None => println!("{line}"),
        }
    }
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

/// CPU time (user + system, all threads) of process `pid` so far, in
/// seconds, from its CPU-time clock (nanosecond resolution, unlike the
/// tick-sampled utime/stime of /proc/PID/stat).
pub fn process_cpu(pid: u32) -> anyhow::Result<f64> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: valid out pointer.
    let err = unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) };
    anyhow::ensure!(
        err == 0,
        "clock_getcpuclockid {pid}: {}",
        io::Error::from_raw_os_error(err)
    );
    // SAFETY: zeroed timespec is valid; valid out pointer.
    let mut now: libc::timespec = unsafe { std::mem::zeroed() };
    anyhow::ensure!(
        unsafe { libc::clock_gettime(clock, &mut now) } == 0,
        "CPU clock of {pid}: {}",
        io::Error::last_os_error()
    );
    Ok(now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9)
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

/// Median over rounds of `samples[i] - baseline[i]`: what a case adds to
/// the baseline measured in the same round. Paired per round, so that the
/// shared host's drift between rounds (the test-run harness alone moved
/// from 21 to 27 ns between runs here) cancels instead of adding to the
/// difference of two medians.
pub fn median_over(samples: &[f64], baseline: &[f64]) -> f64 {
    median(
        &mut samples
            .iter()
            .zip(baseline)
            .map(|(s, b)| s - b)
            .collect::<Vec<_>>(),
    )
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

/// Busy time of all online CPUs together since boot, in ns: for each CPU,
/// its monotonic clock minus its idle residency (cpuidle `state*/time`,
/// microseconds) minus its steal time (/proc/stat, what the hypervisor
/// gave to others). Each CPU is read while this thread runs on it, so its
/// idle figure is up to date (an idle CPU only adds an idle period when it
/// leaves it). Without cpuidle, falls back to /proc/stat's busy fields
/// (USER_HZ ticks). Only differences are meaningful.
pub fn cpu_busy_ns() -> anyhow::Result<f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let stat = std::fs::read_to_string("/proc/stat")?;
    // cpuN user nice system idle iowait irq softirq steal ...
    let per_cpu: Vec<(usize, Vec<f64>)> = stat
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let cpu = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            Some((cpu, f.filter_map(|v| v.parse().ok()).collect()))
        })
        .collect();
    let tick_ns = 1e9 / hz;
    let cpuidle = |cpu: usize| -> Option<f64> {
        let dir = std::fs::read_dir(format!("/sys/devices/system/cpu/cpu{cpu}/cpuidle")).ok()?;
        let mut us = 0.0;
        let mut states = 0;
        for state in dir.flatten() {
            let time = std::fs::read_to_string(state.path().join("time")).ok()?;
            us += time.trim().parse::<f64>().ok()?;
            states += 1;
        }
        (states > 0).then_some(us * 1e3)
    };
    if per_cpu.iter().any(|(cpu, _)| cpuidle(*cpu).is_none()) {
        return Ok(per_cpu
            .iter()
            .map(|(_, f)| {
                let busy: f64 = [0, 1, 2, 5, 6].iter().map(|&i| f[i]).sum();
                busy * tick_ns
            })
            .sum());
    }
    // SAFETY: zeroed cpu_set_t is valid; the calls get/set this thread's.
    let mut saved: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    anyhow::ensure!(
        unsafe { libc::sched_getaffinity(0, size, &mut saved) } == 0,
        "sched_getaffinity: {}",
        io::Error::last_os_error()
    );
    let mut busy = 0.0;
    let mut result = Ok(());
    for (cpu, fields) in &per_cpu {
        if let Err(e) = observer::bpf::testrun::pin_to_cpu(*cpu) {
            result = Err(anyhow::anyhow!("sched_setaffinity cpu {cpu}: {e}"));
            break;
        }
        let mut now: libc::timespec = unsafe { std::mem::zeroed() };
        // SAFETY: valid timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let now = now.tv_sec as f64 * 1e9 + now.tv_nsec as f64;
        let idle = cpuidle(*cpu).unwrap_or(0.0);
        busy += now - idle - fields[7] * tick_ns;
    }
    // SAFETY: as above.
    unsafe { libc::sched_setaffinity(0, size, &saved) };
    result.map(|()| busy)
}
