//! `vm-test`'s watch for a guest that hangs: a soft lockup, an RCU stall
//! or a hung task on the VM's console, or a suite that makes no progress.
//! Either fails that kernel within minutes, naming the tests that were
//! running and the console's lines, instead of waiting for `--timeout`
//! (30 minutes: a third of CI's budget for one hang).

use std::{
    collections::BTreeSet,
    fs::{self, File},
    io::{Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// How long the console is still read after the first sign of a hang, so
/// that the report holds the stack traces the kernel prints after it.
pub const HANG_GRACE: Duration = Duration::from_secs(30);
/// How long a suite may go without finishing a test or recording a check
/// before the VM is taken as hung. The slowest test of the suite under TCG
/// (the incident lab on 5.10) records a check every few minutes at most.
pub const SILENCE_LIMIT: Duration = Duration::from_secs(12 * 60);
/// Console lines kept for the report, from the first sign of the hang.
const KEPT_LINES: usize = 40;

/// What the kernel prints when a CPU or a task stops making progress.
const MARKERS: [&str; 6] = [
    "soft lockup",
    "hard LOCKUP",
    "self-detected stall",
    "detected stalls on CPUs",
    "blocked for more than",
    "Kernel panic",
];

/// True if `line` of a kernel console says a CPU or a task is stuck.
pub fn is_hang(line: &str) -> bool {
    MARKERS.iter().any(|marker| line.contains(marker))
}

/// The console of one VM, read as it grows.
pub struct Console {
    path: PathBuf,
    offset: u64,
    partial: String,
    first_sign: Option<Instant>,
    kept: Vec<String>,
}

impl Console {
    pub fn new(path: PathBuf) -> Console {
        Console {
            path,
            offset: 0,
            partial: String::new(),
            first_sign: None,
            kept: Vec::new(),
        }
    }

    /// Reads what the console gained since the last call.
    pub fn poll(&mut self) {
        let Ok(mut file) = File::open(&self.path) else {
            return;
        };
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut bytes = Vec::new();
        let Ok(read) = file.read_to_end(&mut bytes) else {
            return;
        };
        self.offset += read as u64;
        self.partial.push_str(&String::from_utf8_lossy(&bytes));
        let Some(end) = self.partial.rfind('\n') else {
            return;
        };
        let complete: String = self.partial.drain(..=end).collect();
        for line in complete.lines() {
            self.take(line);
        }
    }

    fn take(&mut self, line: &str) {
        if self.first_sign.is_none() && is_hang(line) {
            self.first_sign = Some(Instant::now());
        }
        if self.first_sign.is_some() && self.kept.len() < KEPT_LINES {
            self.kept.push(line.trim_end().to_string());
        }
    }

    /// The console's lines from the first sign of a hang, once
    /// [`HANG_GRACE`] has passed since it.
    pub fn hang(&self) -> Option<&[String]> {
        self.first_sign
            .filter(|at| at.elapsed() >= HANG_GRACE)
            .map(|_| self.kept.as_slice())
    }
}

/// When any of `files` last grew.
pub struct Progress {
    files: Vec<PathBuf>,
    sizes: Vec<u64>,
    since: Instant,
}

impl Progress {
    pub fn new(files: Vec<PathBuf>) -> Progress {
        let sizes = vec![0; files.len()];
        Progress {
            files,
            sizes,
            since: Instant::now(),
        }
    }

    /// How long none of the files has grown.
    pub fn silent_for(&mut self) -> Duration {
        for (path, size) in self.files.iter().zip(&mut self.sizes) {
            let now = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            if now != *size {
                *size = now;
                self.since = Instant::now();
            }
        }
        self.since.elapsed()
    }
}

/// The tests that started (one name a line in `started`, written by the
/// suite's `have_root`) and have no result line (`test NAME ... ok`) in
/// the suite's log.
pub fn running_tests(started: &Path, suite_log: &Path) -> Vec<String> {
    let started = fs::read_to_string(started).unwrap_or_default();
    let log = fs::read_to_string(suite_log).unwrap_or_default();
    running(&started, &log)
}

fn running(started: &str, log: &str) -> Vec<String> {
    let finished: BTreeSet<&str> = log
        .lines()
        .filter_map(|line| line.strip_prefix("test "))
        .filter_map(|rest| rest.split_once(" ... ").map(|(name, _)| name))
        .collect();
    let mut seen = BTreeSet::new();
    started
        .lines()
        .map(str::trim)
        .filter(|name| !name.is_empty() && !finished.contains(name) && seen.insert(*name))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines of the 5.10 guest's console when the suite hung there.
    #[test]
    fn the_consoles_signs_of_a_hang() {
        for line in [
            "[  512.1] watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [native_replay_c:846]",
            "[  600.2] rcu: INFO: rcu_sched self-detected stall on CPU",
            "[  600.2] rcu: INFO: rcu_sched detected stalls on CPUs/tasks:",
            "[  900.0] INFO: task ping:812 blocked for more than 120 seconds.",
        ] {
            assert!(is_hang(line), "{line}");
        }
        for line in [
            "[    1.0] Booting paravirtualized kernel on bare hardware",
            "[    2.0] rcu: Hierarchical RCU implementation.",
            "test every_tunnel_kind_counts_like_tcpdump ... ok",
        ] {
            assert!(!is_hang(line), "{line}");
        }
    }

    #[test]
    fn running_tests_are_started_and_not_finished() {
        let started = "a_test\nnative_replay_counts\nincident_lab\n";
        let log = "running 3 tests\ntest a_test ... ok\n";
        assert_eq!(
            running(started, log),
            ["native_replay_counts", "incident_lab"]
        );
        assert_eq!(running(started, "test incident_lab ... FAILED\n").len(), 2);
        assert!(running("", log).is_empty());
    }

    #[test]
    fn the_console_is_read_as_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        fs::write(&path, "boot\nwatchdog: BUG: soft lo").unwrap();
        let mut console = Console::new(path.clone());
        console.poll();
        assert!(console.first_sign.is_none(), "half a line is not read");
        fs::write(&path, "boot\nwatchdog: BUG: soft lockup - CPU#1\nRIP: x\n").unwrap();
        console.poll();
        assert!(console.first_sign.is_some());
        assert_eq!(
            console.kept,
            ["watchdog: BUG: soft lockup - CPU#1", "RIP: x"]
        );
        assert!(console.hang().is_none(), "the grace has not passed");
    }
}
