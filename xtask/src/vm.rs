//! `cargo xtask vm-test [--kernel 5.10|6.1|6.12|host|all]`: the kernel
//! suite (observer/tests/kernels.rs, the `kernels` test binary) on Debian's own
//! kernels, each booted in a qemu VM (TCG: no KVM here) by virtme-ng with
//! this machine's root filesystem shared read-only, and on the host itself;
//! then the matrix of what every check measured on every kernel.
//!
//! ```text
//! target/vm/
//!   apt/                       private apt sources, lists and cache (the machine's apt is untouched)
//!   kernels/<package>/         an extracted linux-image-*-unsigned .deb, depmod run
//!   kernels/<series>.package   "<pinned package> <package used>": no network once extracted
//!   results/<series|host>/     run.sh (the guest script), console.log (the VM's console),
//!                              suite.log (the suite's output), results.jsonl (one JSON line
//!                              per check), booted (uname -r), status (the suite's exit code)
//!   results/<series>.patching-trap.console.log
//!                              the console of a first run the guest kernel died of (see
//!                              `run_vm_past_a_patching_trap`), when the suite ran twice
//!   matrix.md                  the matrix of the last run
//! ```
//!
//! The suite's contract: every check appends one JSON line to
//! `$OBSERVER_KERNEL_RESULTS`; inside a VM `OBSERVER_KERNEL_SUITE_VM=1` and
//! `OBSERVER_TEST_TIME_SCALE=12` (TCG is slow) are set; `CI=true` and
//! `RUST_BACKTRACE=1` everywhere. The suite runs from the workspace root,
//! two tests at a time in a VM (its tests are independent, and each mostly
//! waits on processes it spawned; the VM has two vCPUs), one at a time on
//! the host (`cargo test` already runs other test binaries beside it).

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    fs::{self, File},
    io::{BufRead, BufReader},
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        Once,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{
    hang::{self, Console, Progress},
    setup,
    util::{self, secs, workspace_root},
};

/// Options of `cargo xtask vm-test`.
#[derive(clap::Args)]
pub struct VmTestArgs {
    /// Where to run the kernel suite: a Debian kernel series in a VM, the
    /// host, or all four; repeat or separate with commas (`5.10,6.12`).
    #[arg(
        long = "kernel",
        value_enum,
        value_delimiter = ',',
        default_value = "all"
    )]
    kernels: Vec<Choice>,
    /// Minutes one VM (boot and suite), or the host's run, may take before
    /// it is killed.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_MINUTES, value_parser = clap::value_parser!(u64).range(1..=600))]
    timeout: u64,
}

/// A value of `--kernel`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Choice {
    /// Debian 11's 5.10 in a VM.
    #[value(name = "5.10")]
    V5_10,
    /// Debian 12's 6.1 in a VM.
    #[value(name = "6.1")]
    V6_1,
    /// Debian 13's 6.12 in a VM.
    #[value(name = "6.12")]
    V6_12,
    /// The running kernel, no VM.
    Host,
    /// 5.10, 6.1, 6.12 and host.
    All,
}

impl Choice {
    /// The matrix columns this choice selects.
    fn labels(self) -> &'static [&'static str] {
        match self {
            Choice::V5_10 => &["5.10"],
            Choice::V6_1 => &["6.1"],
            Choice::V6_12 => &["6.12"],
            Choice::Host => &[HOST],
            Choice::All => &COLUMNS,
        }
    }
}

/// A Debian kernel the suite boots: its series, the release it comes from,
/// and the exact package (ABI) pinned, so every run tests the same kernel.
struct Kernel {
    series: &'static str,
    debian: &'static str,
    pinned: &'static str,
    /// The Debian tag a fallback package must carry after the upstream
    /// version (`6.12.117+deb13`), when the series' packages have one.
    tag: Option<&'static str>,
}

const KERNELS: [Kernel; 3] = [
    Kernel {
        series: "5.10",
        debian: "bullseye",
        pinned: "linux-image-5.10.0-32-amd64-unsigned",
        tag: None,
    },
    Kernel {
        series: "6.1",
        debian: "bookworm",
        pinned: "linux-image-6.1.0-50-amd64-unsigned",
        tag: None,
    },
    Kernel {
        series: "6.12",
        debian: "trixie",
        pinned: "linux-image-6.12.117+deb13-amd64-unsigned",
        tag: Some("deb13"),
    },
];

/// The host's column.
const HOST: &str = "host";
/// The matrix columns, in order.
const COLUMNS: [&str; 4] = ["5.10", "6.1", "6.12", HOST];
/// What `cargo xtask test` runs: the VMs (its `test` step covers the host).
const VM_COLUMNS: [&str; 3] = ["5.10", "6.1", "6.12"];

/// Why 30: on this kind of shared machine the same 5.10 suite took 602 s
/// in one run and more than 1,200 s an hour later (TCG speed follows the
/// host's load); CI's 90 minutes still hold three VMs at that pace.
const DEFAULT_TIMEOUT_MINUTES: u64 = 30;
/// The suite's timeouts are multiplied by this inside a VM (TCG): there,
/// verifying the programs an attach loads takes most of a minute (all
/// seven: 61 s on 6.12, 4 s on the host), more with two tests loading at
/// once.
const TIME_SCALE: &str = "12";

/// Debian packages vm-test needs: qemu (TCG), depmod for the extracted
/// kernels, the static busybox virtme-ng builds its initramfs from, `wg`
/// for the suite's WireGuard checks, and `file`, which virtme-ng uses to
/// read a kernel image's version (without it, no modules in the guest).
const VM_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "kmod",
    "busybox-static",
    "wireguard-tools",
    "file",
];
/// virtme-ng from PyPI: boots a kernel with the host's root filesystem.
const VIRTME_NG: &str = "virtme-ng";
const VIRTME_NG_VERSION: &str = "1.42";

/// Debian archives searched for the kernels (private to vm-test).
const APT_SOURCES: &str = "\
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bullseye main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bullseye-security main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security trixie-security main
";

/// Files in a results directory.
const RESULTS_FILE: &str = "results.jsonl";
const SUITE_LOG: &str = "suite.log";
const CONSOLE_LOG: &str = "console.log";
const BOOTED: &str = "booted";
const STATUS: &str = "status";
/// The names of the tests as they start, one a line (the suite's
/// `have_root` writes them to `$OBSERVER_KERNEL_STARTED`).
const STARTED: &str = "started";
const GUEST_SCRIPT: &str = "run.sh";

/// How often the wait for a VM looks at its results directory.
const POLL: Duration = Duration::from_millis(200);
/// How often a line says a VM is still running.
const PROGRESS_EVERY: Duration = Duration::from_secs(60);
/// How long a VM may take to power off once the suite has finished.
const POWEROFF_GRACE: Duration = Duration::from_secs(60);
/// How long a stopped process group gets between SIGTERM and SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(10);
/// Lines of a log shown when something failed.
const TAIL_LINES: usize = 60;

/// `target/vm`, where kernels, results and the matrix live. Under the
/// workspace, so the guest sees it (virtme-ng hides /var/cache from it).
fn vm_dir() -> PathBuf {
    workspace_root().join("target/vm")
}

/// Installs what vm-test needs, when missing: VM_PACKAGES (without
/// recommends) and virtme-ng VIRTME_NG_VERSION from PyPI. Fast when done.
pub fn setup() -> Result<()> {
    setup::debian_packages_without_recommends(VM_PACKAGES)?;
    let name = format!("{VIRTME_NG} (PyPI)");
    let current = vng().and_then(|vng| vng_version(&vng));
    if current.as_deref() == Some(VIRTME_NG_VERSION) {
        setup::item(&name, &format!("present ({VIRTME_NG_VERSION})"));
        return Ok(());
    }
    println!(
        "setup: vng is {}; installing {VIRTME_NG} {VIRTME_NG_VERSION}",
        current.as_deref().unwrap_or("missing")
    );
    setup::pip_install(VIRTME_NG, VIRTME_NG_VERSION)?;
    let now = vng().and_then(|vng| vng_version(&vng));
    if now.as_deref() != Some(VIRTME_NG_VERSION) {
        bail!(
            "pip installed {VIRTME_NG} {VIRTME_NG_VERSION}, but the `vng` found (in python3's \
             scripts directory, then on PATH) reports {}: remove the other virtme-ng or put \
             python3's scripts directory first on PATH",
            now.as_deref().unwrap_or("nothing")
        );
    }
    setup::item(&name, &format!("installed ({VIRTME_NG_VERSION})"));
    Ok(())
}

/// The `vng` of the `python3` on PATH (its scripts directory, where pip
/// puts it: with pyenv that works before `pyenv rehash` makes a shim),
/// else the first `vng` on PATH.
fn vng() -> Option<PathBuf> {
    let scripts = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    scripts
        .into_iter()
        .chain(on_path)
        .map(|dir| dir.join("vng"))
        .find(|vng| vng.is_file())
}

/// The version `vng --version` prints (`virtme-ng 1.42` gives `1.42`).
fn vng_version(vng: &Path) -> Option<String> {
    let out = Command::new(vng).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .strip_prefix("virtme-ng ")
        .map(|version| version.trim().to_string())
}

/// Runs vm-test for `cargo xtask vm-test` (after `setup`).
pub fn vm_test(args: &VmTestArgs) -> Result<()> {
    let selected: Vec<&str> = args
        .kernels
        .iter()
        .flat_map(|c| c.labels())
        .copied()
        .collect();
    let columns: Vec<&'static str> = COLUMNS
        .into_iter()
        .filter(|c| selected.contains(c))
        .collect();
    run_columns(&columns, Duration::from_secs(args.timeout * 60))
}

/// The `vm-test` step of `cargo xtask test` (after its `setup` step): the
/// three VMs, with the default timeout.
pub fn vm_test_vms() -> Result<()> {
    run_columns(
        &VM_COLUMNS,
        Duration::from_secs(DEFAULT_TIMEOUT_MINUTES * 60),
    )
}

/// Fetches the kernels, builds the suite, runs it in every column, prints
/// and writes the matrix; fails if anything failed.
fn run_columns(columns: &[&'static str], timeout: Duration) -> Result<()> {
    let total = Instant::now();
    catch_interrupts()?;
    let vng = vng().with_context(|| {
        format!("no `vng` (virtme-ng) found: run `cargo xtask setup`, which installs {VIRTME_NG} {VIRTME_NG_VERSION}")
    })?;
    let mut apt = Apt::new(vm_dir().join("apt"));
    let mut kernels = BTreeMap::new();
    let fetch = Instant::now();
    for kernel in KERNELS.iter().filter(|k| columns.contains(&k.series)) {
        let found = ensure_kernel(kernel, &mut apt);
        // A Ctrl-C also reached apt-get or dpkg-deb: say that, not their error.
        interrupted()?;
        kernels.insert(kernel.series, found?);
    }
    if !kernels.is_empty() {
        println!("vm-test: kernels ready in {}", secs(fetch.elapsed()));
    }
    let suite = build_suite();
    interrupted()?;
    let suite = suite?;
    let mut outcomes = Vec::new();
    for &column in columns {
        interrupted()?;
        let outcome = match kernels.get(column) {
            Some(kernel) => run_vm_past_a_patching_trap(&vng, &suite, column, kernel, timeout)?,
            None => run_host(&suite, timeout)?,
        };
        outcome.report();
        outcomes.push(outcome);
    }
    let matrix = Matrix::new(&outcomes);
    println!("\n{}", matrix.text());
    let path = vm_dir().join("matrix.md");
    fs::write(&path, matrix.markdown()).with_context(|| format!("writing {}", path.display()))?;
    println!(
        "vm-test: matrix written to {}; total {}",
        path.display(),
        secs(total.elapsed())
    );
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.failures().is_empty())
        .map(|o| format!("{} ({})", o.label, o.failures().join("; ")))
        .collect();
    if !failed.is_empty() {
        bail!("the kernel suite failed on {}", failed.join(", "));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Ctrl-C and child processes

/// Set by SIGINT, SIGTERM or SIGHUP while vm-test runs.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Turns SIGINT, SIGTERM and SIGHUP into INTERRUPTED, so the wait loops stop
/// the VM (its process group) before vm-test exits.
fn catch_interrupts() -> Result<()> {
    static HANDLER: Once = Once::new();
    let mut result = Ok(());
    HANDLER.call_once(|| {
        result = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst));
    });
    result.context("cannot install the Ctrl-C handler")
}

fn interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// A child in a process group of its own (vng and the qemu it starts, or
/// the host's suite and what it starts): stopped as a whole when dropped,
/// so no qemu outlives vm-test, whatever way it ends.
struct Group {
    child: Child,
    status: Option<ExitStatus>,
}

impl Group {
    fn spawn(cmd: &mut Command) -> Result<Group> {
        let line = util::display(cmd);
        println!("$ {line}");
        let child = cmd
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start `{line}`"))?;
        Ok(Group {
            child,
            status: None,
        })
    }

    fn pgid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// The leader's exit status once it has exited. What is left of its
    /// group is killed before the leader is reaped (while it is a zombie
    /// the group id cannot be reused).
    fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        if self.status.is_some() {
            return Ok(self.status);
        }
        // SAFETY: an all-zero siginfo_t is valid; waitid fills it in.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child; WNOWAIT leaves it unreaped.
        let ret = unsafe {
            libc::waitid(
                libc::P_PID,
                self.pgid() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if ret != 0 {
            return Err(std::io::Error::last_os_error()).context("waitid on a child");
        }
        // SAFETY: si_pid is set by waitid (0 when the child still runs).
        if unsafe { info.si_pid() } == 0 {
            return Ok(None);
        }
        self.signal(libc::SIGKILL);
        let status = self.child.wait().context("reaping a child")?;
        self.status = Some(status);
        Ok(Some(status))
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) of the process group whose leader is our unreaped
        // child; ESRCH (nothing left) is fine.
        unsafe { libc::killpg(self.pgid(), signal) };
    }

    fn exited(&mut self) -> bool {
        matches!(self.try_wait(), Ok(Some(_)))
    }

    /// SIGTERM to the group, SIGKILL after TERM_GRACE; returns once reaped.
    fn stop(&mut self) {
        if self.exited() {
            return;
        }
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + TERM_GRACE;
        while Instant::now() < deadline {
            if self.exited() {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---------------------------------------------------------------------------
// Kernels

/// apt-get and apt-cache with a private sources list, lists and cache under
/// `dir`: the machine's apt configuration and state are never touched.
struct Apt {
    dir: PathBuf,
    updated: bool,
}

impl Apt {
    fn new(dir: PathBuf) -> Apt {
        Apt {
            dir,
            updated: false,
        }
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        let option = |name: &str, value: &Path| format!("{name}={}", value.display());
        for setting in [
            option("Dir::Etc::SourceList", &self.dir.join("sources.list")),
            option("Dir::Etc::SourceParts", Path::new("/dev/null")),
            option("Dir::State::Lists", &self.dir.join("lists")),
            option("Dir::Cache", &self.dir.join("cache")),
            "Debug::NoLocking=1".to_string(),
            // Files under target/ are root's: no download as _apt.
            "APT::Sandbox::User=root".to_string(),
            // Only the package lists: no translations, no AppStream data.
            "Acquire::Languages=none".to_string(),
            "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".to_string(),
        ] {
            cmd.arg("-o").arg(setting);
        }
        cmd
    }

    /// `apt-get update` of the private lists, once per vm-test.
    fn update(&mut self) -> Result<()> {
        if self.updated {
            return Ok(());
        }
        for sub in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(self.dir.join(sub))
                .with_context(|| format!("creating {}", self.dir.join(sub).display()))?;
        }
        fs::write(self.dir.join("sources.list"), APT_SOURCES)?;
        util::run(self.command("apt-get").arg("update").arg("-q"))
            .context("cannot read Debian's package lists (is deb.debian.org reachable?)")?;
        self.updated = true;
        Ok(())
    }

    /// Every package name starting with `prefix` in the private lists.
    fn names(&self, prefix: &str) -> Result<Vec<String>> {
        let out = util::output(self.command("apt-cache").args(["pkgnames", prefix]))?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// `apt-get download PACKAGE` into `dir`; returns the .deb.
    fn download(&self, package: &str, dir: &Path) -> Result<PathBuf> {
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        util::run(
            self.command("apt-get")
                .args(["download", "-q", package])
                .current_dir(dir),
        )
        .with_context(|| format!("cannot download {package}"))?;
        let deb = fs::read_dir(dir)?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .find(|path| path.extension() == Some(OsStr::new("deb")))
            .with_context(|| {
                format!(
                    "apt-get download left no .deb of {package} in {}",
                    dir.display()
                )
            })?;
        Ok(deb)
    }
}

/// An extracted kernel package, ready to boot.
struct Extracted {
    package: String,
    /// `uname -r` of the kernel (`5.10.0-32-amd64`).
    release: String,
    vmlinuz: PathBuf,
}

/// The kernel package extracted in `tree`, if complete: boot/vmlinuz-REL
/// and a modules.dep under (usr/)lib/modules/REL.
fn extracted(tree: &Path, package: &str) -> Option<Extracted> {
    let boot = fs::read_dir(tree.join("boot")).ok()?;
    let (vmlinuz, release) = boot.filter_map(|e| e.ok()).find_map(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        let release = name.strip_prefix("vmlinuz-")?.to_string();
        Some((entry.path(), release))
    })?;
    let root = module_root(tree)?;
    root.join("lib/modules")
        .join(&release)
        .join("modules.dep")
        .is_file()
        .then(|| Extracted {
            package: package.to_string(),
            release,
            vmlinuz,
        })
}

/// Where `depmod -b` and virtme-ng look for lib/modules: the tree itself,
/// or its usr/ (newer packages ship the modules in usr/lib/modules only).
fn module_root(tree: &Path) -> Option<PathBuf> {
    [tree.to_path_buf(), tree.join("usr")]
        .into_iter()
        .find(|root| root.join("lib/modules").is_dir())
}

/// The package for `kernel` in the private lists: the pinned one, or if
/// Debian dropped it, the newest of the same series and flavour.
fn resolve(kernel: &Kernel, apt: &Apt) -> Result<String> {
    let prefix = format!("linux-image-{}.", kernel.series);
    let names = apt.names(&prefix)?;
    if names.iter().any(|name| name == kernel.pinned) {
        return Ok(kernel.pinned.to_string());
    }
    let newest = names
        .iter()
        .filter(|name| is_fallback(kernel, name))
        .max_by_key(|name| numbers(name))
        .with_context(|| {
            format!(
                "neither {} nor any other linux-image-{}*-amd64-unsigned is in Debian {}'s lists \
                 (see {}): update the pinned package in xtask/src/vm.rs",
                kernel.pinned,
                kernel.series,
                kernel.debian,
                apt.dir.join("sources.list").display()
            )
        })?;
    println!(
        "vm-test: {} is no longer in Debian {}; using the newest of the series, {newest}",
        kernel.pinned, kernel.debian
    );
    Ok(newest.clone())
}

/// True for `linux-image-<series>.<numbers>[+<tag>[.N]]-amd64-unsigned`: the
/// generic flavour (not cloud, rt or a backport) of the series.
fn is_fallback(kernel: &Kernel, name: &str) -> bool {
    let Some(abi) = name
        .strip_prefix("linux-image-")
        .and_then(|rest| rest.strip_suffix("-amd64-unsigned"))
        .and_then(|abi| abi.strip_prefix(kernel.series))
        .and_then(|abi| abi.strip_prefix('.'))
    else {
        return false;
    };
    let (version, tag) = match abi.split_once('+') {
        Some((version, tag)) => (version, Some(tag)),
        None => (abi, None),
    };
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == '-')
    };
    let tag_ok = match (kernel.tag, tag) {
        (None, None) => true,
        (Some(want), Some(tag)) => {
            tag == want
                || tag
                    .strip_prefix(want)
                    .and_then(|t| t.strip_prefix('.'))
                    .is_some_and(plain)
        }
        _ => false,
    };
    plain(version) && tag_ok
}

/// The numbers in `name`, in order, to compare versions.
fn numbers(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The extracted `kernel`, downloading and extracting it first if needed.
/// Once extracted (and still pinned), no network is needed.
fn ensure_kernel(kernel: &Kernel, apt: &mut Apt) -> Result<Extracted> {
    let dir = vm_dir().join("kernels");
    let marker = dir.join(format!("{}.package", kernel.series));
    // "<pinned> <used>": what the last fetch of this series resolved to.
    if let Ok(text) = fs::read_to_string(&marker)
        && let Some((pinned, used)) = text.trim().split_once(' ')
        && pinned == kernel.pinned
        && let Some(found) = extracted(&dir.join(used), used)
    {
        println!(
            "vm-test: kernel {} cached: {} ({})",
            kernel.series,
            found.package,
            dir.join(used).display()
        );
        return Ok(found);
    }
    let start = Instant::now();
    apt.update()?;
    let package = resolve(kernel, apt)?;
    let tree = dir.join(&package);
    let found = match extracted(&tree, &package) {
        Some(found) => found,
        None => fetch_kernel(apt, &package, &tree)?,
    };
    fs::write(&marker, format!("{} {package}\n", kernel.pinned))
        .with_context(|| format!("writing {}", marker.display()))?;
    println!(
        "vm-test: kernel {} ready in {}: {package} ({})",
        kernel.series,
        secs(start.elapsed()),
        found.release
    );
    Ok(found)
}

/// Downloads `package`, extracts it into `tree` and runs depmod there (in
/// a `.partial` directory renamed at the end, so a half-done extraction is
/// never taken for a kernel). The .deb is deleted afterwards.
fn fetch_kernel(apt: &Apt, package: &str, tree: &Path) -> Result<Extracted> {
    let debs = vm_dir().join("debs");
    let deb = apt.download(package, &debs)?;
    let mut partial = tree.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let _ = fs::remove_dir_all(tree);
    util::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    let release = fs::read_dir(partial.join("boot"))
        .with_context(|| format!("{package} has no boot/ directory"))?
        .filter_map(|e| e.ok())
        .find_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_prefix("vmlinuz-")
                .map(str::to_string)
        })
        .with_context(|| format!("{package} has no boot/vmlinuz-*"))?;
    let root = module_root(&partial)
        .with_context(|| format!("{package} has no lib/modules or usr/lib/modules"))?;
    util::run(Command::new("depmod").arg("-b").arg(&root).arg(&release))
        .context("depmod failed on the extracted kernel (is Debian's kmod installed?)")?;
    fs::rename(&partial, tree)
        .with_context(|| format!("renaming {} to {}", partial.display(), tree.display()))?;
    let _ = fs::remove_dir_all(&debs);
    extracted(tree, package).with_context(|| {
        format!(
            "{} has no boot/vmlinuz-{release} or modules.dep after extraction",
            tree.display()
        )
    })
}

// ---------------------------------------------------------------------------
// The suite

/// Builds the kernel suite (and the debug observer it runs) and returns the
/// test executable, from cargo's `compiler-artifact` message.
fn build_suite() -> Result<PathBuf> {
    let mut cmd = util::cargo();
    cmd.args([
        "test",
        "-p",
        "observer",
        "--test",
        "kernels",
        "--no-run",
        "--message-format=json",
    ])
    .stdout(Stdio::piped());
    let line = util::display(&cmd);
    println!("$ {line}");
    let out = cmd
        .output()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}): the kernel suite does not build (see the errors above; \
             if someone is editing observer/, retry in a minute)",
            out.status
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|msg| {
            msg["reason"] == "compiler-artifact"
                && msg["target"]["name"] == "kernels"
                && msg["profile"]["test"] == true
        })
        .and_then(|msg| msg["executable"].as_str().map(PathBuf::from))
        .with_context(|| {
            format!("`{line}` reported no test executable named `kernels` (is observer/tests/kernels.rs still there?)")
        })
}

/// `dir`, emptied (created if missing).
fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// The shell script virtme-ng runs as root in the guest: the suite's
/// environment, `booted` once the guest runs it, the suite's output in
/// suite.log, and its exit code in `status` (written whole, by rename).
fn guest_script(suite: &Path, dir: &Path) -> String {
    let q = |path: &Path| util::quote(path.as_os_str());
    let file = |name: &str| q(&dir.join(name));
    format!(
        "#!/bin/sh\n\
         # Written by `cargo xtask vm-test`: runs the kernel suite in the VM.\n\
         export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         export HOME=/root CI=true RUST_BACKTRACE=1\n\
         export OBSERVER_KERNEL_SUITE_VM=1 OBSERVER_TEST_TIME_SCALE={TIME_SCALE}\n\
         export OBSERVER_KERNEL_RESULTS={results} OBSERVER_KERNEL_STARTED={started}\n\
         uname -r > {booted}\n\
         cd {root} || exit 1\n\
         {suite} --test-threads=2 > {log} 2>&1\n\
         echo $? > {status}.partial\n\
         mv {status}.partial {status}\n",
        results = file(RESULTS_FILE),
        started = file(STARTED),
        booted = file(BOOTED),
        root = q(&workspace_root()),
        suite = q(suite),
        log = file(SUITE_LOG),
        status = file(STATUS),
    )
}

/// [`run_vm`], and once more when the guest kernel died of a breakpoint
/// trap that live code patching left behind ([`patching_trap`]): the
/// kernel flips static keys (tc, XDP, tracepoints) by writing an int3
/// over the branch, then the new instruction, and a CPU that still runs
/// the int3 once the patch is complete has no handler for it. The suite
/// attaches programs while traffic flows on two emulated vCPUs; this
/// killed a 6.12 guest in `__dev_queue_xmit` once (docs/development.md,
/// "The 6.12 patching trap"). The first run's console is kept beside the
/// results and the summary says the suite ran twice; any other death, or
/// a second trap, fails as before.
fn run_vm_past_a_patching_trap(
    vng: &Path,
    suite: &Path,
    label: &'static str,
    kernel: &Extracted,
    timeout: Duration,
) -> Result<Outcome> {
    let kept = vm_dir()
        .join("results")
        .join(format!("{label}.patching-trap.console.log"));
    // Only this run's trap may be found there.
    let _ = fs::remove_file(&kept);
    let first = run_vm(vng, suite, label, kernel, timeout)?;
    let console = fs::read_to_string(first.dir.join(CONSOLE_LOG)).unwrap_or_default();
    let trap = match (first.status, patching_trap(&console)) {
        (None, Some(trap)) => trap,
        _ => return Ok(first),
    };
    first.report();
    fs::write(&kept, &console).with_context(|| format!("writing {}", kept.display()))?;
    println!(
        "vm-test {label}: the guest kernel died of a breakpoint trap left by live code patching \
         ({trap}; its console: {}); running the suite on {label} once more",
        kept.display()
    );
    let mut second = run_vm(vng, suite, label, kernel, timeout)?;
    second.ran_again = Some(trap);
    Ok(second)
}

/// The trap, when a guest's `console` shows the kernel dying of an int3
/// in its own text where the byte is no longer an int3 (`Oops: int3`,
/// then the `RIP` in a kernel function, then the `Code:` bytes, the trap's
/// own marked `<..>` after the byte that was executed): code patched
/// under a running CPU, not an int3 compiled into the kernel or filling a
/// JIT image (whose byte would still read `cc`). Returns
/// `Oops: int3 at <function+offset>`.
fn patching_trap(console: &str) -> Option<String> {
    let mut lines = console
        .lines()
        .skip_while(|line| !line.contains("Oops: int3"));
    lines.next()?;
    let mut rip = None;
    for line in lines.take(8) {
        if let Some((_, at)) = line.split_once("RIP: 0010:") {
            let at = at.trim();
            if at.starts_with("0x") || at.starts_with("bpf_prog_") {
                return None;
            }
            rip = Some(at.to_string());
        } else if let Some((_, code)) = line.split_once("Code: ") {
            let (before, _) = code.split_once('<')?;
            let trapped = before.split_whitespace().last()?;
            return rip
                .filter(|_| trapped != "cc")
                .map(|rip| format!("Oops: int3 at {rip}"));
        }
    }
    None
}

/// Boots `kernel` with virtme-ng and runs the suite inside.
fn run_vm(
    vng: &Path,
    suite: &Path,
    label: &'static str,
    kernel: &Extracted,
    timeout: Duration,
) -> Result<Outcome> {
    let dir = vm_dir().join("results").join(label);
    fresh_dir(&dir)?;
    let script = dir.join(GUEST_SCRIPT);
    fs::write(&script, guest_script(suite, &dir))?;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
    let console = File::create(dir.join(CONSOLE_LOG))?;
    println!(
        "\n==> vm-test {label}: booting {} ({}) under qemu TCG; console in {}",
        kernel.package,
        kernel.release,
        dir.join(CONSOLE_LOG).display()
    );
    let mut cmd = Command::new(vng);
    cmd.arg("--run")
        .arg(&kernel.vmlinuz)
        .args([
            "--disable-kvm",
            "--force-9p",
            "--memory",
            "2G",
            "--cpus",
            "2",
        ])
        .arg("--verbose")
        .arg("--rwdir")
        .arg(&dir)
        .arg("--exec")
        .arg(format!("sh {}", util::quote(script.as_os_str())))
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console);
    let mut vm = Group::spawn(&mut cmd)?;
    let watch = watch(&mut vm, &dir, label, timeout, true)?;
    Ok(Outcome::read(label, dir, watch))
}

/// Runs the suite on the host, without a VM.
fn run_host(suite: &Path, timeout: Duration) -> Result<Outcome> {
    let dir = vm_dir().join("results").join(HOST);
    fresh_dir(&dir)?;
    fs::write(dir.join(BOOTED), format!("{}\n", host_release()))?;
    let log = File::create(dir.join(SUITE_LOG))?;
    println!("\n==> vm-test {HOST}: the suite on this machine's kernel");
    let mut cmd = Command::new(suite);
    cmd.arg("--test-threads=1")
        .current_dir(workspace_root())
        .env("CI", "true")
        .env("RUST_BACKTRACE", "1")
        .env("OBSERVER_KERNEL_RESULTS", dir.join(RESULTS_FILE))
        .env_remove("OBSERVER_KERNEL_SUITE_VM")
        .env_remove("OBSERVER_TEST_TIME_SCALE")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let mut host = Group::spawn(&mut cmd)?;
    let mut watch = watch(&mut host, &dir, HOST, timeout, false)?;
    match host.status.and_then(|status| status.code()) {
        Some(code) => fs::write(dir.join(STATUS), format!("{code}\n"))?,
        None if watch.problem.is_none() => {
            watch.problem = host
                .status
                .map(|status| format!("the suite was killed ({status})"));
        }
        None => {}
    }
    Ok(Outcome::read(HOST, dir, watch))
}

/// `uname -r` of this machine.
fn host_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// What the host saw of one run: when the guest came up, when the suite
/// ended, and why the run was cut short, if it was.
#[derive(Default)]
struct Watch {
    booted: Option<Duration>,
    finished: Option<Duration>,
    problem: Option<String>,
}

/// Waits for the run in `group` to end, noting when `booted` and `status`
/// appear in `dir` (`vm`: they are the guest's; else the run ends with the
/// child). Kills the group on timeout or Ctrl-C, or when a VM does not
/// power off after the suite.
fn watch(group: &mut Group, dir: &Path, label: &str, timeout: Duration, vm: bool) -> Result<Watch> {
    let start = Instant::now();
    let mut watch = Watch::default();
    let mut progress = PROGRESS_EVERY;
    let mut console = Console::new(dir.join(CONSOLE_LOG));
    let mut suite_progress = Progress::new(
        [RESULTS_FILE, SUITE_LOG, STARTED]
            .iter()
            .map(|name| dir.join(name))
            .collect(),
    );
    loop {
        if INTERRUPTED.load(Ordering::SeqCst) {
            println!("vm-test {label}: interrupted; stopping it");
            group.stop();
            bail!("interrupted");
        }
        let elapsed = start.elapsed();
        let exited = group.try_wait()?.is_some();
        if vm && watch.booted.is_none() && dir.join(BOOTED).exists() {
            watch.booted = Some(elapsed);
            println!("vm-test {label}: booted in {}", secs(elapsed));
        }
        if watch.finished.is_none() && (dir.join(STATUS).exists() || (exited && !vm)) {
            watch.finished = Some(elapsed);
        }
        if exited {
            break;
        }
        if let Some(finished) = watch.finished
            && elapsed > finished + POWEROFF_GRACE
        {
            println!("vm-test {label}: the VM did not power off after the suite; killing it");
            group.stop();
            break;
        }
        if vm && watch.finished.is_none() {
            console.poll();
            let running = || hang::running_tests(&dir.join(STARTED), &dir.join(SUITE_LOG));
            let hung = if let Some(lines) = console.hang() {
                Some(format!(
                    "the guest hung (its console, from the first sign):\n    {}",
                    lines.join("\n    ")
                ))
            } else if watch.booted.is_some() && suite_progress.silent_for() >= hang::SILENCE_LIMIT {
                Some(format!(
                    "no test finished and no check was recorded for {}",
                    secs(hang::SILENCE_LIMIT)
                ))
            } else {
                None
            };
            if let Some(hung) = hung {
                let running = running();
                watch.problem = Some(format!(
                    "{hung}\n  tests running then: {}; killed after {}",
                    if running.is_empty() {
                        "none recorded".to_string()
                    } else {
                        running.join(", ")
                    },
                    secs(elapsed)
                ));
                println!(
                    "vm-test {label}: {}",
                    watch.problem.as_deref().unwrap_or_default()
                );
                group.stop();
                break;
            }
        }
        if elapsed >= timeout {
            watch.problem = Some(format!(
                "timed out after {} (--timeout); killed",
                secs(timeout)
            ));
            println!(
                "vm-test {label}: {}",
                watch.problem.as_deref().unwrap_or_default()
            );
            group.stop();
            break;
        }
        if elapsed >= progress {
            println!(
                "vm-test {label}: still running after {:.0} s",
                elapsed.as_secs_f64()
            );
            progress += PROGRESS_EVERY;
        }
        thread::sleep(POLL);
    }
    Ok(watch)
}

// ---------------------------------------------------------------------------
// Results

/// One line of results.jsonl.
struct Record {
    check: String,
    observer: Option<u64>,
    reference: Option<u64>,
    pass: bool,
    detail: String,
}

impl Record {
    fn parse(line: &str) -> Option<Record> {
        let v: Value = serde_json::from_str(line).ok()?;
        Some(Record {
            check: v["check"].as_str()?.to_string(),
            observer: v["observer"].as_u64(),
            reference: v["reference"].as_u64(),
            pass: v["pass"].as_bool()?,
            detail: v["detail"].as_str().unwrap_or_default().to_string(),
        })
    }

    /// The matrix cell: `50=50 ok`, `FAIL 49≠50`, `12345` (no reference).
    fn cell(&self) -> String {
        let figure = |v: Option<u64>| v.map_or_else(|| "null".to_string(), |v| v.to_string());
        match (self.observer, self.reference, self.pass) {
            (Some(o), Some(r), true) if o == r => format!("{o}={r} ok"),
            (o, Some(r), true) => format!("{}~{r} ok", figure(o)),
            (o, Some(r), false) => format!("FAIL {}≠{r}", figure(o)),
            (Some(o), None, true) => o.to_string(),
            (Some(o), None, false) => format!("FAIL {o}"),
            (None, None, true) => "ok".to_string(),
            (None, None, false) => "FAIL".to_string(),
        }
    }
}

/// One column of the matrix: a run of the suite and what it left.
struct Outcome {
    label: &'static str,
    dir: PathBuf,
    release: Option<String>,
    status: Option<i32>,
    records: Vec<Record>,
    unreadable: usize,
    watch: Watch,
    /// The trap that ended the first run, when the suite ran twice
    /// ([`run_vm_past_a_patching_trap`]).
    ran_again: Option<String>,
}

impl Outcome {
    fn read(label: &'static str, dir: PathBuf, watch: Watch) -> Outcome {
        let read = |name: &str| fs::read_to_string(dir.join(name)).ok();
        let release = read(BOOTED)
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        let status = read(STATUS).and_then(|s| s.trim().parse().ok());
        let (mut records, mut unreadable) = (Vec::new(), 0);
        for line in read(RESULTS_FILE).unwrap_or_default().lines() {
            match Record::parse(line) {
                Some(record) => records.push(record),
                None if line.trim().is_empty() => {}
                None => unreadable += 1,
            }
        }
        Outcome {
            label,
            dir,
            release,
            status,
            records,
            unreadable,
            watch,
            ran_again: None,
        }
    }

    /// Why this run counts as failed; empty when it passed.
    fn failures(&self) -> Vec<String> {
        let mut why = Vec::new();
        if let Some(problem) = &self.watch.problem {
            why.push(problem.clone());
        }
        match self.status {
            Some(0) => {}
            Some(code) => why.push(format!("suite exit {code}")),
            None if self.release.is_none() => why.push("the VM never ran the suite".to_string()),
            None => why.push("no exit status: the suite was killed, or the VM died".to_string()),
        }
        if self.records.is_empty() {
            why.push("no results".to_string());
        }
        let failed: Vec<&str> = self
            .records
            .iter()
            .filter(|r| !r.pass)
            .map(|r| r.check.as_str())
            .collect();
        if !failed.is_empty() {
            why.push(format!(
                "{} failed check(s): {}",
                failed.len(),
                failed.join(", ")
            ));
        }
        if self.unreadable > 0 {
            why.push(format!(
                "{} unreadable line(s) in {RESULTS_FILE}",
                self.unreadable
            ));
        }
        why
    }

    /// `passed, 5 checks` or `FAILED: ...`, with the times.
    fn summary(&self) -> String {
        let failures = self.failures();
        let verdict = if failures.is_empty() {
            format!("passed, {} checks", self.records.len())
        } else {
            format!(
                "FAILED, {} checks: {}",
                self.records.len(),
                failures.join("; ")
            )
        };
        let mut times = Vec::new();
        if let Some(booted) = self.watch.booted {
            times.push(format!("booted in {}", secs(booted)));
            if let Some(finished) = self.watch.finished {
                times.push(format!("suite took {}", secs(finished - booted)));
            }
        } else if let Some(finished) = self.watch.finished {
            times.push(format!("suite took {}", secs(finished)));
        }
        let verdict = match &self.ran_again {
            Some(trap) => format!("{verdict} (second run: the first died of {trap})"),
            None => verdict,
        };
        if times.is_empty() {
            verdict
        } else {
            format!("{}; {verdict}", times.join(", "))
        }
    }

    /// Prints the summary, and on failure where the logs are and their end.
    fn report(&self) {
        println!("<== vm-test {}: {}", self.label, self.summary());
        if self.failures().is_empty() {
            return;
        }
        let suite_log = self.dir.join(SUITE_LOG);
        let log = if suite_log.exists() {
            suite_log
        } else {
            self.dir.join(CONSOLE_LOG)
        };
        println!("--- last {TAIL_LINES} lines of {} ---", log.display());
        for line in tail(&log, TAIL_LINES) {
            println!("{line}");
        }
        println!("--- end of {} ---", log.display());
        if self.label != HOST {
            println!(
                "(the VM's console: {})",
                self.dir.join(CONSOLE_LOG).display()
            );
        }
    }
}

/// The last `n` lines of the file at `path` (none if unreadable).
fn tail(path: &Path, n: usize) -> Vec<String> {
    let Ok(file) = File::open(path) else {
        return Vec::new();
    };
    let lines: Vec<String> = BufReader::new(file).lines().map_while(|l| l.ok()).collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

/// The kernel matrix: a row per check, a column per kernel.
struct Matrix<'a> {
    outcomes: BTreeMap<&'static str, &'a Outcome>,
    /// Check names, in the order they were first recorded.
    checks: Vec<String>,
}

impl<'a> Matrix<'a> {
    fn new(outcomes: &'a [Outcome]) -> Matrix<'a> {
        let mut checks: Vec<String> = Vec::new();
        for record in outcomes.iter().flat_map(|o| &o.records) {
            if !checks.contains(&record.check) {
                checks.push(record.check.clone());
            }
        }
        Matrix {
            outcomes: outcomes.iter().map(|o| (o.label, o)).collect(),
            checks,
        }
    }

    /// The cell of `check` on `column`: its failing record if any, else its
    /// last one; `-` when not run.
    fn cell(&self, check: &str, column: &str) -> String {
        let Some(outcome) = self.outcomes.get(column) else {
            return "-".to_string();
        };
        let records: Vec<&Record> = outcome
            .records
            .iter()
            .filter(|r| r.check == check)
            .collect();
        records
            .iter()
            .find(|r| !r.pass)
            .or(records.last())
            .map_or_else(|| "-".to_string(), |r| r.cell())
    }

    /// Header, then one row per check.
    fn rows(&self) -> Vec<Vec<String>> {
        let mut rows = vec![
            std::iter::once("check".to_string())
                .chain(COLUMNS.iter().map(|c| c.to_string()))
                .collect::<Vec<_>>(),
        ];
        for check in &self.checks {
            rows.push(
                std::iter::once(check.clone())
                    .chain(COLUMNS.iter().map(|c| self.cell(check, c)))
                    .collect(),
            );
        }
        rows
    }

    /// A line per kernel: its release and verdict.
    fn footer(&self) -> Vec<String> {
        COLUMNS
            .iter()
            .map(|column| match self.outcomes.get(column) {
                Some(o) => format!(
                    "{column:<5} {:<28} {}",
                    o.release.as_deref().unwrap_or("(no release: never booted)"),
                    o.summary()
                ),
                None => format!("{column:<5} not run"),
            })
            .collect()
    }

    /// Every failing record, with its detail.
    fn failing(&self) -> Vec<String> {
        COLUMNS
            .iter()
            .filter_map(|column| self.outcomes.get(column).map(|o| (column, o)))
            .flat_map(|(column, o)| {
                o.records
                    .iter()
                    .filter(|r| !r.pass)
                    .map(move |r| format!("{column} {}: {} {}", r.check, r.cell(), r.detail))
            })
            .collect()
    }

    fn text(&self) -> String {
        let rows = self.rows();
        let widths: Vec<usize> = (0..rows[0].len())
            .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::from("kernel matrix\n");
        for row in &rows {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, &w)| format!("{cell}{}", " ".repeat(w - cell.chars().count())))
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        out.push('\n');
        for line in self.footer() {
            out.push_str(&line);
            out.push('\n');
        }
        let failing = self.failing();
        if !failing.is_empty() {
            out.push_str("\nfailing checks:\n");
            for line in failing {
                out.push_str(&format!("  {line}\n"));
            }
        }
        out
    }

    fn markdown(&self) -> String {
        let rows = self.rows();
        let mut out = String::from(
            "# Kernel matrix\n\nWritten by `cargo xtask vm-test`: the kernel suite \
             (observer/tests/kernels.rs) on Debian's kernels in qemu VMs and on the host.\n\n",
        );
        for (i, row) in rows.iter().enumerate() {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
            if i == 0 {
                out.push_str(&format!("|{}\n", " --- |".repeat(row.len())));
            }
        }
        out.push('\n');
        for line in self.footer() {
            out.push_str(&format!("- `{}`\n", line.trim_end()));
        }
        let failing = self.failing();
        if !failing.is_empty() {
            out.push_str("\nFailing checks:\n\n");
            for line in failing {
                out.push_str(&format!("- {line}\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 6.12 guest's console when it died during the suite (shortened).
    const PATCHING_TRAP: &str = "\
[   19.186158] ip_gre: GRE over IPv4 tunneling driver
[   37.904036] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI
[   37.904536] CPU: 1 UID: 0 PID: 231 Comm: ping Not tainted 6.12.117+deb13-amd64 #1  Debian 6.12.117-1
[   37.904712] Hardware name: QEMU Standard PC (Q35 + ICH9, 2009), BIOS 1.16.2-debian-1.16.2-1 04/01/2014
[   37.905252] RIP: 0010:__dev_queue_xmit+0x18a/0xf10
[   37.906151] Code: f9 0c 0f 84 ab 07 00 00 0f b7 80 ac 02 00 00 3b 42 10 73 0d 89 c0 8b 44 82 14 41 89 86 90 00 00 00 41 80 a6 81 00 00 00 fb e9 <b4> 00 00 00 49 8b 7e 58
[   37.906263] RSP: 0018:ff44b16801e0f4e0 EFLAGS: 00000246
[   37.912099] Kernel panic - not syncing: Fatal exception in interrupt
";

    #[test]
    fn a_trap_left_by_code_patching_is_told_from_other_deaths() {
        assert_eq!(
            patching_trap(PATCHING_TRAP).as_deref(),
            Some("Oops: int3 at __dev_queue_xmit+0x18a/0xf10")
        );
        // The int3 is still there: a real one (padding, a JIT image's fill).
        let still_int3 = PATCHING_TRAP.replace("fb e9 <b4>", "fb cc <b4>");
        assert_eq!(patching_trap(&still_int3), None);
        // In a BPF program or an unnamed address: not the kernel's patching.
        let in_bpf = PATCHING_TRAP.replace("__dev_queue_xmit", "bpf_prog_1234abcd_observer_xdp");
        assert_eq!(patching_trap(&in_bpf), None);
        let unnamed = PATCHING_TRAP.replace("__dev_queue_xmit+0x18a/0xf10", "0xffffffffc0001234");
        assert_eq!(patching_trap(&unnamed), None);
        // Other oopses and a clean console.
        let null = PATCHING_TRAP.replace(
            "Oops: int3: 0000",
            "BUG: kernel NULL pointer dereference, address: 0000000000000000\n[   37.904036] Oops: 0000",
        );
        assert_eq!(patching_trap(&null), None);
        assert_eq!(patching_trap("[ 1.0] virtme-ng-init: done\n"), None);
        // Cut short before the code bytes: not told.
        let cut: String = PATCHING_TRAP.lines().take(5).collect::<Vec<_>>().join("\n");
        assert_eq!(patching_trap(&cut), None);
    }

    #[test]
    fn fallbacks_are_the_generic_flavour_of_the_series() {
        let [k510, k61, k612] = &KERNELS;
        assert!(is_fallback(k510, "linux-image-5.10.0-46-amd64-unsigned"));
        assert!(!is_fallback(
            k510,
            "linux-image-5.10.0-46-cloud-amd64-unsigned"
        ));
        assert!(!is_fallback(
            k510,
            "linux-image-5.10.0-46-rt-amd64-unsigned"
        ));
        assert!(is_fallback(k61, "linux-image-6.1.0-50-amd64-unsigned"));
        assert!(!is_fallback(
            k61,
            "linux-image-6.1.0-0.deb11.50-amd64-unsigned"
        ));
        assert!(!is_fallback(
            k61,
            "linux-image-6.12.117+deb13-amd64-unsigned"
        ));
        assert!(is_fallback(
            k612,
            "linux-image-6.12.118+deb13-amd64-unsigned"
        ));
        assert!(is_fallback(
            k612,
            "linux-image-6.12.115+deb13.1-amd64-unsigned"
        ));
        assert!(!is_fallback(
            k612,
            "linux-image-6.12.117+deb12-amd64-unsigned"
        ));
        assert!(!is_fallback(
            k612,
            "linux-image-6.12.117+deb13-cloud-amd64-unsigned"
        ));
        assert!(numbers("6.12.118+deb13") > numbers("6.12.115+deb13.1"));
        assert!(numbers("5.10.0-46") > numbers("5.10.0-9"));
    }

    #[test]
    fn cells() {
        let record = |observer, reference, pass| Record {
            check: "c".into(),
            observer,
            reference,
            pass,
            detail: String::new(),
        };
        assert_eq!(record(Some(50), Some(50), true).cell(), "50=50 ok");
        assert_eq!(record(Some(49), Some(50), false).cell(), "FAIL 49≠50");
        assert_eq!(record(Some(12345), None, true).cell(), "12345");
        assert_eq!(record(None, Some(3), false).cell(), "FAIL null≠3");
    }
}
