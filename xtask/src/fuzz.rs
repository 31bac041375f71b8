//! `cargo xtask fuzz`: runs the cargo-fuzz target of the capture reader
//! (`fuzz/fuzz_targets/capture.rs`) with the eBPF nightly, seeded with
//! `fuzz/seeds` and the reference captures, then the differential test of
//! the two replay classifiers (`tests/differential.rs`) for as long, from a
//! new seed. Never part of `cargo xtask test`, which runs the differential
//! test briefly from a fixed seed.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::util;

/// Options of `cargo xtask fuzz`.
#[derive(clap::Args)]
pub struct FuzzArgs {
    /// How long libFuzzer runs, and then the differential test.
    #[arg(long, default_value_t = 300)]
    pub seconds: u64,

    /// Seed of the differential test, decimal or 0x hex as printed
    /// (default: from the clock; printed, so that a failure can be
    /// replayed with it).
    #[arg(long, value_parser = parse_seed)]
    pub seed: Option<u64>,
}

/// A seed as the test prints it (`0x...`) or in decimal.
fn parse_seed(text: &str) -> Result<u64, String> {
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    }
    .map_err(|e| format!("{text:?}: {e}"))
}

/// The fuzz target.
const TARGET: &str = "capture";

/// `cargo +nightly fuzz ARGS...` in the workspace root (cargo-fuzz finds
/// `fuzz/` there). `+nightly` needs the rustup proxy, not `$CARGO`.
fn cargo_fuzz() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.args(["+nightly", "fuzz"])
        .current_dir(util::workspace_root());
    cmd
}

/// Installs cargo-fuzz when `cargo fuzz` is missing.
fn ensure_cargo_fuzz() -> Result<()> {
    let present = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        util::run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
            .context("installing cargo-fuzz")?;
    }
    Ok(())
}

/// Builds the fuzz target (sanitizer build) without running it.
pub fn build() -> Result<()> {
    ensure_cargo_fuzz()?;
    util::run(cargo_fuzz().args(["build", TARGET]))
}

/// Runs the target for `args.seconds`; libFuzzer prints executions and
/// stops at the first crash (saved under fuzz/artifacts/capture/).
pub fn fuzz(args: &FuzzArgs) -> Result<()> {
    ensure_cargo_fuzz()?;
    let root = util::workspace_root();
    let corpus = root.join("fuzz/corpus").join(TARGET);
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let mut seeds = vec![root.join("fuzz/seeds")];
    let pcaps = std::env::var_os("OBSERVER_PCAPS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("../shared/pcaps"));
    if pcaps.is_dir() {
        seeds.push(pcaps);
    }
    // New inputs go to the first directory; the others are read only.
    util::run(
        cargo_fuzz()
            .args(["run", TARGET])
            .arg(&corpus)
            .args(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={}", args.seconds))
            .arg("-print_final_stats=1"),
    )?;
    differential(args)
}

/// Runs `tests/differential.rs` for `args.seconds` from `args.seed` (or
/// the clock's nanoseconds). A difference fails with the frame, saved as a
/// pcap, and the seed.
fn differential(args: &FuzzArgs) -> Result<()> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    println!(
        "xtask: differential replay classifiers, seed 0x{seed:x}, {} s",
        args.seconds
    );
    util::run(
        util::cargo()
            .args([
                "test",
                "-p",
                "observer",
                "--test",
                "differential",
                "--",
                "--nocapture",
            ])
            .env("OBSERVER_DIFF_SEED", format!("0x{seed:x}"))
            .env("OBSERVER_DIFF_SECONDS", args.seconds.to_string()),
    )
}
