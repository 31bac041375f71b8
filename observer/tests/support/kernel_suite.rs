//! The kernel suite's results (tests/kernels.rs): every check appends one
//! JSON line to the file named by `$OBSERVER_KERNEL_RESULTS`, which
//! `cargo xtask vm-test` collects from each VM into the kernel matrix.
//! Without the variable nothing is written; the assertions run either way.

use std::{fs::OpenOptions, io::Write, sync::Mutex};

use serde_json::json;

/// Set (to 1) by `cargo xtask vm-test` inside the VMs: the kernel there
/// must have every tunnel kind, so a missing one fails instead of skipping.
pub const IN_VM: &str = "OBSERVER_KERNEL_SUITE_VM";
/// File the results go to.
pub const RESULTS: &str = "OBSERVER_KERNEL_RESULTS";
/// File the names of the tests go to as they start.
pub const STARTED: &str = "OBSERVER_KERNEL_STARTED";

/// Appends `test` to the file named by `$OBSERVER_KERNEL_STARTED` (when
/// there is one), so that `cargo xtask vm-test` can name the tests that
/// were running when a guest hung.
pub fn started(test: &str) {
    if let Ok(path) = std::env::var(STARTED) {
        append_line(&path, test);
    }
}

/// Appends `line` to the file at `path`, in one locked write (tests run
/// in parallel).
fn append_line(path: &str, line: &str) {
    static WRITER: Mutex<()> = Mutex::new(());
    let _guard = WRITER.lock().unwrap_or_else(|e| e.into_inner());
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("opening {path}: {e}"));
    file.write_all(format!("{line}\n").as_bytes())
        .unwrap_or_else(|e| panic!("writing {path}: {e}"));
}

/// True inside a VM of `cargo xtask vm-test`.
pub fn in_vm() -> bool {
    std::env::var(IN_VM).is_ok_and(|v| v == "1")
}

/// One check of the matrix: what the observer counted, what the outside
/// reference counted (tcpdump, an iptables counter, the kernel's own
/// view), and whether they agree.
pub struct Check<'a> {
    /// Name of the row in the matrix (`vxlan4789_v4_rx`, ...).
    pub name: &'a str,
    /// The observer's figure.
    pub observer: Option<u64>,
    /// The reference figure.
    pub reference: Option<u64>,
    /// What the reference is (`tcpdump`, `iptables DROP`, `verifier`, ...).
    pub reference_kind: &'a str,
    /// Agreement (or, for a figure without reference, success).
    pub pass: bool,
    /// Free text (a skip reason, a mismatch).
    pub detail: String,
}

/// Appends `check` to the results file (when there is one).
pub fn record(check: Check<'_>) {
    let Ok(path) = std::env::var(RESULTS) else {
        return;
    };
    let line = json!({
        "kernel": kernel_release(),
        "check": check.name,
        "observer": check.observer,
        "reference": check.reference,
        "reference_kind": check.reference_kind,
        "pass": check.pass,
        "detail": check.detail,
    });
    append_line(&path, &line.to_string());
}

/// The checks of one test: each is recorded as it is made, and
/// [`Checks::finish`] fails the test with every failed one listed (a first
/// mismatch must not hide the rest of the matrix).
#[derive(Default)]
pub struct Checks {
    failures: Vec<String>,
}

impl Checks {
    /// Records `observer` against `reference`; a difference fails.
    pub fn compare(&mut self, name: &str, observer: u64, reference: u64, reference_kind: &str) {
        let pass = observer == reference;
        record(Check {
            name,
            observer: Some(observer),
            reference: Some(reference),
            reference_kind,
            pass,
            detail: String::new(),
        });
        if !pass {
            self.failures.push(format!(
                "{name}: observer {observer} vs {reference_kind} {reference}"
            ));
        }
    }

    /// Records a condition with a figure or text; false fails.
    pub fn holds(&mut self, name: &str, pass: bool, figure: Option<u64>, detail: &str) {
        record(Check {
            name,
            observer: figure,
            reference: None,
            reference_kind: "",
            pass,
            detail: detail.to_string(),
        });
        if !pass {
            self.failures.push(format!("{name}: {detail}"));
        }
    }

    /// Panics with every failed check.
    pub fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{} check(s) failed:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

/// `uname -r`.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
