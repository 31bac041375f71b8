//! `cargo xtask setup`: installs what building and testing the observer
//! need, and checks the toolchains agree. Idempotent, and fast when nothing
//! is missing: every item is checked first and installed only if absent.
//! docs/development.md says why these versions.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

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
    // The image test (`cargo xtask image`, observer/tests/image.rs): OCI
    // tools and a container runtime from Debian.
    "skopeo",
    "umoci",
    "crun",
    // ring's C for the static musl binary of `cargo xtask image`.
    "musl-tools",
    // GNU time: the cluster bench's peak RSS of `observer cluster` alone
    // (a child forked from the bench starts with the bench's own).
    "time",
];

/// Debian packages that ship a service which must not run here, with its
/// systemd unit: `prometheus` for promtool (the deploy/ rule checks and
/// tests), `prometheus-node-exporter` for its textfile collector, `bird2`
/// for BIRD. They are
/// installed without recommends, with service starts denied, and their
/// units disabled, so nothing listens on :9090 or :9100 afterwards.
const SERVICE_PACKAGES: &[(&str, &str)] = &[
    ("prometheus", "prometheus.service"),
    (
        "prometheus-node-exporter",
        "prometheus-node-exporter.service",
    ),
    // BIRD 2 for the BGP tests and the lab, which start their own BIRD per
    // namespace: the package's own daemon would speak BGP on the host.
    ("bird2", "bird.service"),
    // The image test runs the image with podman (crun); its API service
    // stays off.
    ("podman", "podman.service"),
    // A reverse proxy that wants a bearer token in front of the cluster
    // test's Prometheus (observer cluster --bearer-token-file), as gateways
    // in front of Thanos or Mimir do; the test starts its own.
    ("nginx-light", "nginx.service"),
];

/// kubernetes-validate from PyPI validates deploy/'s manifests against the
/// Kubernetes OpenAPI schemas it bundles (no network at validation time).
const KUBERNETES_VALIDATE: &str = "kubernetes-validate";
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";

/// Debian's hook that init-script and systemd helpers ask before starting a
/// service during package installation (exit 101: "do not start").
const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

/// The bpf-linker release pinned by the project (built against LLVM 22).
const BPF_LINKER_VERSION: &str = "0.13.0";
/// LLVM major version of bpf-linker, which the eBPF nightly must share.
const LLVM_MAJOR: &str = "22";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// One line of the setup report: `setup: NAME  STATE`.
pub fn item(name: &str, state: &str) {
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
    python_packages()?;
    rust_src()?;
    nightly_llvm()?;
    bpf_linker()?;
    musl_target()?;
    container_cgroups()?;
    kubectl()?;
    // `cargo xtask test` ends with `vm-test`: qemu, virtme-ng and the rest.
    crate::vm::setup()?;
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
    let mut missing_services = Vec::new();
    for &(package, unit) in SERVICE_PACKAGES {
        if deb_installed(package)? {
            item(package, "present");
        } else {
            missing_services.push((package, unit));
        }
    }
    if missing.is_empty() && missing_services.is_empty() {
        return Ok(());
    }
    util::run(Command::new("apt-get").arg("update"))?;
    if !missing.is_empty() {
        println!("setup: installing Debian packages: {}", missing.join(" "));
        util::run(
            Command::new("apt-get")
                .args(["install", "-y"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    if !missing_services.is_empty() {
        install_without_services(&missing_services)?;
    }
    for package in missing
        .iter()
        .copied()
        .chain(missing_services.iter().map(|(package, _)| *package))
    {
        if !deb_installed(package)? {
            bail!("apt-get reported success but {package} is still not installed");
        }
        item(package, "installed");
    }
    Ok(())
}

/// Installs those of `packages` that are missing, without their
/// recommends, and checks they are installed afterwards.
pub fn debian_packages_without_recommends(packages: &[&str]) -> Result<()> {
    let mut missing = Vec::new();
    for package in packages {
        if deb_installed(package)? {
            item(package, "present");
        } else {
            missing.push(*package);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    util::run(Command::new("apt-get").arg("update"))?;
    println!("setup: installing Debian packages: {}", missing.join(" "));
    util::run(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
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

/// Installs packages that come with a daemon (prometheus, node_exporter)
/// without letting it run: no recommends, service starts denied through
/// policy-rc.d during the installation (this is what keeps the postinst's
/// invoke-rc.d / deb-systemd-invoke from starting them), and the units
/// disabled afterwards, since the postinst enables them for the next boot.
fn install_without_services(packages: &[(&str, &str)]) -> Result<()> {
    let names: Vec<&str> = packages.iter().map(|(package, _)| *package).collect();
    println!(
        "setup: installing Debian packages without starting their services: {}",
        names.join(" ")
    );
    {
        let _deny = DenyServiceStarts::install()?;
        util::run(
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends"])
                .args(&names)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    // Their postinst enabled the units for the next boot: disable them (and
    // stop them, should anything have started them, when systemd runs).
    let units: Vec<&str> = packages.iter().map(|(_, unit)| *unit).collect();
    if Path::new("/run/systemd/system").exists() {
        util::run(
            Command::new("systemctl")
                .args(["disable", "--now"])
                .args(&units),
        )?;
        item(&units.join(", "), "disabled and stopped");
    } else if Command::new("systemctl").arg("--version").output().is_ok() {
        // No systemd running (a container): edit the links offline.
        util::run(
            Command::new("systemctl")
                .args(["--no-reload", "disable"])
                .args(&units),
        )?;
        item(&units.join(", "), "disabled (systemd not running)");
    }
    Ok(())
}

/// A policy-rc.d that denies every service start, in place while it lives;
/// the one it replaced (Docker images ship one) is put back when dropped.
struct DenyServiceStarts {
    saved: Option<PathBuf>,
}

impl DenyServiceStarts {
    fn install() -> Result<DenyServiceStarts> {
        let path = Path::new(POLICY_RC_D);
        let backup = PathBuf::from(format!("{POLICY_RC_D}.xtask-saved"));
        let saved = if backup.exists() {
            // Left by an interrupted run: the file in place is ours.
            Some(backup)
        } else if path.symlink_metadata().is_ok() {
            fs::rename(path, &backup)
                .with_context(|| format!("cannot move {POLICY_RC_D} aside"))?;
            Some(backup)
        } else {
            None
        };
        let guard = DenyServiceStarts { saved };
        fs::write(
            path,
            "#!/bin/sh\n# cargo xtask setup: no service starts while it installs packages.\nexit 101\n",
        )
        .with_context(|| format!("cannot write {POLICY_RC_D}"))?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o755))
            .with_context(|| format!("cannot make {POLICY_RC_D} executable"))?;
        Ok(guard)
    }
}

impl Drop for DenyServiceStarts {
    fn drop(&mut self) {
        let restored = match &self.saved {
            Some(backup) => fs::rename(backup, POLICY_RC_D),
            None => fs::remove_file(POLICY_RC_D),
        };
        if let Err(e) = restored {
            eprintln!("setup: warning: cannot restore {POLICY_RC_D}: {e}");
        }
    }
}

/// PyPI packages, installed with the `python3` on PATH (the one that runs
/// them in `cargo xtask test`).
fn python_packages() -> Result<()> {
    let name = format!("{KUBERNETES_VALIDATE} (PyPI)");
    let current = pip_version(KUBERNETES_VALIDATE);
    if current.as_deref() == Some(KUBERNETES_VALIDATE_VERSION) {
        item(&name, &format!("present ({KUBERNETES_VALIDATE_VERSION})"));
        return Ok(());
    }
    println!(
        "setup: {KUBERNETES_VALIDATE} is {}; installing {KUBERNETES_VALIDATE_VERSION}",
        current.as_deref().unwrap_or("missing")
    );
    pip_install(KUBERNETES_VALIDATE, KUBERNETES_VALIDATE_VERSION)?;
    let now = pip_version(KUBERNETES_VALIDATE);
    if now.as_deref() != Some(KUBERNETES_VALIDATE_VERSION) {
        bail!(
            "pip installed {KUBERNETES_VALIDATE} {KUBERNETES_VALIDATE_VERSION}, but `python3 -m pip show \
             {KUBERNETES_VALIDATE}` reports {}",
            now.as_deref().unwrap_or("nothing")
        );
    }
    item(&name, &format!("installed ({KUBERNETES_VALIDATE_VERSION})"));
    Ok(())
}

/// `python3 -m pip install PACKAGE==VERSION` with the `python3` on PATH,
/// first installing Debian's python3-pip if that python has no pip, and
/// overriding PEP 668 on a distribution-managed python.
pub fn pip_install(package: &str, version: &str) -> Result<()> {
    if !python_has_pip() {
        println!("setup: `python3 -m pip` does not run; installing Debian's python3-pip");
        util::run(Command::new("apt-get").arg("update"))?;
        util::run(
            Command::new("apt-get")
                .args(["install", "-y", "python3-pip"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    let mut pip = Command::new("python3");
    pip.args([
        "-m",
        "pip",
        "install",
        "--root-user-action=ignore",
        "--disable-pip-version-check",
    ]);
    if python_externally_managed() {
        // Debian's own python3 (PEP 668): this is a throwaway build machine.
        pip.arg("--break-system-packages");
    }
    util::run(pip.arg(format!("{package}=={version}")))
}

/// The version `python3 -m pip show` reports for `package`, if installed.
fn pip_version(package: &str) -> Option<String> {
    let out = Command::new("python3")
        .args(["-m", "pip", "show", package])
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .output()
        .ok()
        .filter(|out| out.status.success())?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("Version:"))
        .map(|version| version.trim().to_string())
}

fn python_has_pip() -> bool {
    Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// True when `python3` is an interpreter whose packages its distribution
/// manages (PEP 668), where pip refuses to install without
/// --break-system-packages.
fn python_externally_managed() -> bool {
    Command::new("python3")
        .args([
            "-c",
            "import os, sys, sysconfig; \
             sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')) else 1)",
        ])
        .status()
        .is_ok_and(|status| status.success())
}

/// A kubectl with `kustomize` (the `manifests` step renders deploy/ with
/// it): the machine's own, else Debian's kubernetes-client.
fn kubectl() -> Result<()> {
    let name = "kubectl kustomize";
    let works = Command::new("kubectl")
        .args(["kustomize", "--help"])
        .output()
        .is_ok_and(|o| o.status.success());
    if works {
        item(name, "present");
        return Ok(());
    }
    util::run(Command::new("apt-get").arg("update"))?;
    util::run(
        Command::new("apt-get")
            .args([
                "install",
                "-y",
                "--no-install-recommends",
                "kubernetes-client",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    item(name, "installed (kubernetes-client)");
    Ok(())
}

/// The Rust standard library for musl: `cargo xtask image` builds the
/// static binary with it.
fn musl_target() -> Result<()> {
    let name = "rust target x86_64-unknown-linux-musl";
    let installed = util::output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == crate::image::MUSL)
    {
        item(name, "present");
        return Ok(());
    }
    util::run(Command::new("rustup").args(["target", "add", crate::image::MUSL]))?;
    item(name, "installed");
    Ok(())
}

/// crun (podman's runtime, the image test's) refuses to start containers
/// on a hybrid cgroup layout whose cgroup2 hierarchy holds a controller
/// ("cgroups in hybrid mode not supported, drop all controllers from
/// cgroupv2"), as machines of this kind have with hugetlb. Mounting each
/// such controller's v1 hierarchy beside the others moves it off cgroup2;
/// nothing else on the machine uses it.
fn container_cgroups() -> Result<()> {
    let name = "cgroup2 controllers (crun)";
    let unified = Path::new("/sys/fs/cgroup/unified/cgroup.controllers");
    let Ok(controllers) = fs::read_to_string(unified) else {
        item(name, "no hybrid layout");
        return Ok(());
    };
    let controllers: Vec<&str> = controllers.split_whitespace().collect();
    if controllers.is_empty() {
        item(name, "none on cgroup2");
        return Ok(());
    }
    for controller in &controllers {
        let dir = Path::new("/sys/fs/cgroup").join(controller);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        util::run(
            Command::new("mount")
                .args(["-t", "cgroup", "-o", controller, "cgroup"])
                .arg(&dir),
        )?;
    }
    item(
        name,
        &format!("moved to cgroup v1: {}", controllers.join(", ")),
    );
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
