//! `cargo xtask fuzz`: runs the cargo-fuzz targets (`fuzz/fuzz_targets/`)
//! with the eBPF nightly, each seeded with `fuzz/seeds/<target>` (the
//! capture target also with the reference captures) and bounded in memory,
//! then the differential test of the two replay classifiers
//! (`observer/tests/differential.rs`) for as long as one target, from a new seed.
//! Never part of `cargo xtask test`, which only builds the targets and runs
//! the differential test briefly from a fixed seed.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::util;

/// The fuzz targets, each reading input that others control: capture
/// files, `iptables-save` / `iptables -v -S` text, `nft -j` output,
/// `ipset save` output, the settings file, and rtnetlink messages into the
/// data-plane view.
pub const TARGETS: [&str; 6] = ["capture", "iptables", "nft", "ipset", "settings", "netlink"];

/// Memory bound of a run, in MB (libFuzzer's `-rss_limit_mb` and
/// `-malloc_limit_mb`): a parser that needs more on inputs of a few KB
/// fails as a crash.
const MEMORY_LIMIT_MB: u32 = 512;

/// Options of `cargo xtask fuzz`.
#[derive(clap::Args)]
pub struct FuzzArgs {
    /// How long libFuzzer runs each target, and then the differential
    /// test.
    #[arg(long, default_value_t = 120)]
    pub seconds: u64,

    /// Run only this target (default: every one in turn; the differential
    /// test runs with `capture`).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    pub target: Option<String>,

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

/// Type-checks every fuzz target without building or running them: what
/// keeps a target from rotting is that it still compiles against the
/// library. The sanitizer build (`cargo fuzz build`) took 520 s of CI, and
/// `cargo xtask fuzz` makes it anyway before it runs the targets. Checked
/// with the stable toolchain in the workspace's target dir (no target
/// reads `cfg(fuzzing)`), where the libraries are already checked: `cargo
/// fuzz check` (nightly, its own target dir) compiled them all again,
/// about two minutes of CI.
pub fn build() -> Result<()> {
    let root = util::workspace_root();
    util::run(
        util::cargo()
            .args(["check", "--bins", "--manifest-path"])
            .arg(root.join("fuzz/Cargo.toml"))
            .arg("--target-dir")
            .arg(root.join("target")),
    )
}

/// What one target's run found.
struct Outcome {
    target: &'static str,
    executions: Option<u64>,
    corpus: usize,
    crashes: usize,
}

/// Runs the chosen targets for `args.seconds` each, prints one line of
/// figures per target, then the differential test; fails when a target
/// crashed (its input saved under fuzz/artifacts/TARGET/).
pub fn fuzz(args: &FuzzArgs) -> Result<()> {
    ensure_cargo_fuzz()?;
    let targets: Vec<&'static str> = TARGETS
        .into_iter()
        .filter(|t| args.target.as_deref().is_none_or(|only| only == *t))
        .collect();
    let mut outcomes = Vec::new();
    for target in &targets {
        outcomes.push(run_target(target, args.seconds)?);
    }
    for o in &outcomes {
        let executions = o.executions.map_or("?".to_string(), |n| n.to_string());
        println!(
            "xtask: fuzz {}: {} s, {executions} executions, corpus {} inputs, {} crashes",
            o.target, args.seconds, o.corpus, o.crashes
        );
    }
    let crashed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.crashes > 0)
        .map(|o| o.target)
        .collect();
    if !crashed.is_empty() {
        bail!(
            "fuzz targets crashed: {} (inputs in fuzz/artifacts/<target>/; replay one with \
             `cargo +nightly fuzz run <target> <file>`)",
            crashed.join(", ")
        );
    }
    if targets.contains(&"capture") {
        differential(args)?;
    }
    Ok(())
}

/// Runs one target for `seconds`, its output shown as it comes, and
/// gathers its figures: executions (libFuzzer's final stats), the corpus
/// size and the crash inputs saved.
fn run_target(target: &'static str, seconds: u64) -> Result<Outcome> {
    let root = util::workspace_root();
    let corpus = root.join("fuzz/corpus").join(target);
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let mut seeds = vec![root.join("fuzz/seeds").join(target)];
    if target == "capture" {
        let pcaps = std::env::var_os("OBSERVER_PCAPS")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("observer/tests/pcaps"));
        if pcaps.is_dir() {
            seeds.push(pcaps);
        }
    }
    let artifacts = root.join("fuzz/artifacts").join(target);
    let crashes_before = count_files(&artifacts);
    let mut cmd = cargo_fuzz();
    // New inputs go to the first directory; the others are read only.
    cmd.args(["run", target])
        .arg(&corpus)
        .args(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-rss_limit_mb={MEMORY_LIMIT_MB}"))
        .arg(format!("-malloc_limit_mb={MEMORY_LIMIT_MB}"))
        .arg("-print_final_stats=1")
        .stderr(Stdio::piped());
    let line = util::display(&cmd);
    println!("$ {line}");
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start `{line}`"))?;
    let mut executions = None;
    let stderr = child.stderr.take().context("libFuzzer's stderr")?;
    for text in BufReader::new(stderr).lines() {
        let text = text.with_context(|| format!("reading the output of `{line}`"))?;
        eprintln!("{text}");
        if let Some(n) = text.strip_prefix("stat::number_of_executed_units:") {
            executions = n.trim().parse().ok();
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{line}`"))?;
    let crashes = count_files(&artifacts).saturating_sub(crashes_before);
    // A crash is reported with the others; any other failure stops here.
    if !status.success() && crashes == 0 {
        bail!("`{line}` failed ({status})");
    }
    Ok(Outcome {
        target,
        executions,
        corpus: count_files(&corpus),
        crashes,
    })
}

/// Files in `dir` (0 when it does not exist).
fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| entries.flatten().count())
}

/// Runs `observer/tests/differential.rs` for `args.seconds` from `args.seed` (or
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
