//! `cargo xtask setup`: installs what building and testing the observer
//! need, and checks the toolchains agree. Idempotent, and fast when nothing
//! is missing: every item is checked first and installed only if absent.
//! See ../shared/TOOLCHAIN.md for why these versions.

use std::{process::Command, time::Instant};

use anyhow::{Context, Result, bail};

use crate::util::{self, is_root, secs};

/// Debian packages: LLVM 22 for building bpf-linker, and the network tools
/// the integration tests and `cargo xtask lab` use.
const DEB_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
    "iptables",
    "ipset",
    "nftables",
    "tcpdump",
    "iputils-ping",
    "iproute2",
    "bpftool",
];

/// The bpf-linker release pinned by the project (built against LLVM 22).
const BPF_LINKER_VERSION: &str = "0.13.0";
/// LLVM major version of bpf-linker, which the eBPF nightly must share.
const LLVM_MAJOR: &str = "22";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

fn item(name: &str, state: &str) {
    println!("setup: {name:<28} {state}");
}

/// Runs every check and installs what is missing.
pub fn setup() -> Result<()> {
    let start = Instant::now();
    if !is_root() {
        bail!(
            "cargo xtask must run as root: setup installs Debian packages, and the tests, \
             `lab` and `bench` load eBPF programs and create network namespaces \
             (try `sudo -E env PATH=$PATH cargo xtask ...`)"
        );
    }
    debian_packages()?;
    rust_src()?;
    nightly_llvm()?;
    bpf_linker()?;
    println!("setup: done in {}", secs(start.elapsed()));
    Ok(())
}

fn deb_installed(package: &str) -> Result<bool> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .context("cannot run dpkg-query (is this a Debian system?)")?;
    // Exit status 1 and no output: the package is unknown to dpkg.
    Ok(out.status.success()
        && String::from_utf8_lossy(&out.stdout).trim() == "install ok installed")
}

fn debian_packages() -> Result<()> {
    let mut missing = Vec::new();
    for package in DEB_PACKAGES {
        if deb_installed(package)? {
            item(package, "present");
        } else {
            missing.push(*package);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    println!("setup: installing Debian packages: {}", missing.join(" "));
    util::run(Command::new("apt-get").arg("update"))?;
    util::run(
        Command::new("apt-get")
            .args(["install", "-y"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    for package in missing {
        if !deb_installed(package)? {
            bail!("apt-get reported success but {package} is still not installed");
        }
        item(package, "installed");
    }
    Ok(())
}

fn rust_src() -> Result<()> {
    let name = "rust-src (nightly)";
    let installed = util::output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))
    .context(
        "cannot list the nightly toolchain's components: the eBPF programs are built with the \
         `nightly` toolchain (LLVM 22), which this machine should have preinstalled",
    )?;
    let has = String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|line| line.trim() == "rust-src" || line.trim().starts_with("rust-src-"));
    if has {
        item(name, "present");
        return Ok(());
    }
    util::run(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        "nightly",
    ]))?;
    item(name, "installed");
    Ok(())
}

fn nightly_llvm() -> Result<()> {
    let out = util::output(Command::new("rustc").args(["+nightly", "-vV"]))
        .context("cannot run `rustc +nightly -vV`")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .lines()
        .find_map(|line| line.strip_prefix("LLVM version:"))
        .map(str::trim)
        .unwrap_or("unknown");
    if version.split('.').next() != Some(LLVM_MAJOR) {
        bail!(
            "the nightly toolchain uses LLVM {version}, but bpf-linker {BPF_LINKER_VERSION} is built \
             against Debian's LLVM {LLVM_MAJOR} and the nightly that compiles the eBPF programs must \
             use the same LLVM major (a mismatch fails at link time with `Invalid record`). Install \
             a nightly whose `rustc +nightly -vV` reports `LLVM version: {LLVM_MAJOR}.x` (e.g. \
             nightly-2026-05-20) and make it the `nightly` toolchain"
        );
    }
    item(
        "nightly LLVM",
        &format!("{version} (matches bpf-linker's LLVM {LLVM_MAJOR})"),
    );
    Ok(())
}

fn bpf_linker() -> Result<()> {
    let name = "bpf-linker";
    let wanted = format!("bpf-linker {BPF_LINKER_VERSION}");
    let current = bpf_linker_version();
    if current.as_deref() == Some(wanted.as_str()) {
        item(name, &format!("present ({BPF_LINKER_VERSION})"));
        return Ok(());
    }
    println!(
        "setup: bpf-linker is {}; installing {BPF_LINKER_VERSION} against LLVM {LLVM_MAJOR} (about a minute)",
        current.as_deref().unwrap_or("missing")
    );
    let path = format!(
        "{LLVM_PREFIX}/bin:{}",
        std::env::var("PATH").unwrap_or_default()
    );
    util::run(
        util::cargo()
            .args([
                "install",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                "--locked",
                "--no-default-features",
                "--features",
                &format!("llvm-{LLVM_MAJOR}"),
            ])
            .env("LLVM_PREFIX", LLVM_PREFIX)
            .env("PATH", path),
    )?;
    let now = bpf_linker_version();
    if now.as_deref() != Some(wanted.as_str()) {
        bail!(
            "bpf-linker {BPF_LINKER_VERSION} was installed into cargo's bin directory, but the \
             `bpf-linker` found on PATH is {}: put ~/.cargo/bin (or $CARGO_INSTALL_ROOT/bin) first on PATH",
            now.as_deref().unwrap_or("missing")
        );
    }
    item(name, &format!("installed ({BPF_LINKER_VERSION})"));
    Ok(())
}

/// `bpf-linker --version` as printed (e.g. `bpf-linker 0.13.0`), if it runs.
fn bpf_linker_version() -> Option<String> {
    Command::new("bpf-linker")
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
