//! Developer tasks of the observer, run as `cargo xtask <command>` (the
//! alias lives in .cargo/config.toml). Every command except `setup` itself
//! runs `setup` first, so a fresh machine needs nothing but `cargo xtask test`.

mod fuzz;
mod hang;
mod image;
mod lab;
mod layers;
mod setup;
mod soak;
mod util;
mod vm;

use std::{process::Command, time::Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

use crate::util::secs;

/// Developer tasks of the observer (run as root).
#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    after_help = "Each command other than `setup` runs `setup` first. \
                  CI runs `.ci/run`, which is `cargo xtask test`."
)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need, when missing: Debian packages
    /// (LLVM 22 dev files, iproute2, iptables, ipset, nftables, tcpdump, ping,
    /// bpftool; skopeo, umoci, crun and musl-tools for the image; prometheus
    /// for promtool, prometheus-node-exporter, bird2 and podman, with their
    /// services kept from running), kubernetes-validate from PyPI, the
    /// nightly's rust-src, the musl target, and bpf-linker 0.13.0; moves
    /// cgroup2's controllers to v1 on a hybrid layout (crun refuses them);
    /// for `vm-test`, qemu,
    /// kmod, busybox-static, wireguard-tools and file (no recommends) and
    /// virtme-ng 1.42 from PyPI. Checks that the nightly's LLVM is 22, like
    /// bpf-linker's. Needs root.
    Setup,
    /// Build the release binary: target/release/observer (eBPF object embedded).
    Build,
    /// Everything CI checks: rustfmt, clippy (-D warnings, all targets, eBPF
    /// crate included), the deploy/ files (promtool check and test of the
    /// alert rules, the PrometheusRule and the privileged DaemonSet in sync,
    /// kubernetes-validate --strict of the manifests), a `cargo check`
    /// of every fuzz target (type-checked, not run), that
    /// observer/src imports only downwards and without cycles (`layers`), the
    /// OCI image (`image --profile dev`, which observer/tests/image.rs
    /// inspects and runs with podman), and `cargo test --workspace`, then `vm-test --kernel 5.10,6.1,6.12` (the kernel
    /// suite in VMs; the host's run is part of `cargo test`). The
    /// integration tests load eBPF programs and create network namespaces,
    /// so they need root; with CI=true in the environment they fail instead
    /// of skipping without it. Prints the time of each step; exits non-zero
    /// if any failed.
    Test {
        /// Stop at the first failing step instead of running the others.
        #[arg(long)]
        fail_fast: bool,
        /// Run only these steps (comma-separated names as the summary
        /// prints them, e.g. `--only fmt,layers`); setup always runs.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
    /// The kernel suite (observer/tests/kernels.rs) on Debian's own kernels, 5.10
    /// (bullseye), 6.1 (bookworm) and 6.12 (trixie), each booted in a qemu
    /// VM (TCG, 2 vCPUs, 2 GiB) by virtme-ng with this machine's root
    /// filesystem shared read-only, and on the host; then a matrix of every
    /// check on every kernel. The kernels (230 MB of .debs) are fetched once
    /// with a private apt state and kept extracted in target/vm/kernels.
    /// Fetching them takes ~35 s. A VM boots in 10-15 s; under TCG the suite
    /// runs 10-15 times slower than on the host (its timeouts are scaled by
    /// 6): 7-11 min per kernel on 2 cores in December 2026, one kernel after
    /// the other; --timeout (minutes, default 15) kills a VM that takes
    /// longer. Per kernel, the VM's console,
    /// the suite's output and its results.jsonl land in
    /// target/vm/results/<kernel>/; the matrix is printed and written to
    /// target/vm/matrix.md. Exits non-zero if a suite failed, a check
    /// failed, or a suite recorded nothing.
    VmTest(vm::VmTestArgs),
    /// The incident lab: build the release observer, then run `observer lab`
    /// (a GPU node behind a NATing router and two control-plane nodes in
    /// network namespaces, VXLAN and IPIP pings, the observer on every node,
    /// and a diagnosis from what they saw). Options after `lab` go to
    /// `observer lab` (--scenario incident|udp-block|mtu|encap-mismatch|healthy|bgp-down|new-node|stale-route,
    /// --duration, --output text|json). Everything is removed at the end,
    /// also on Ctrl-C.
    Lab(lab::LabArgs),
    /// Nanoseconds per packet of the XDP program, measured in the kernel with
    /// BPF_PROG_TEST_RUN (1,000,000 runs, 15 rounds, paired medians) on hand-built VXLAN,
    /// IPIP, Geneve, plain UDP and truncated frames, against a program that
    /// only returns XDP_PASS; then `observer cluster` and the node-pair
    /// rules over simulated meshes of 300 and 1,000 nodes in a real
    /// Prometheus (wall time, RSS, rule evaluation time, series per node).
    Bench,
    /// Not in CI: the release observer for N minutes (--minutes, default 10)
    /// against VXLAN pings plus a stream of new outer sources that churns
    /// its flow map, with the textfile export on. Prints the observer's RSS
    /// and textfile size every 10 s and a final `soak minutes=N
    /// rss_start_kib=.. rss_max_kib=.. rss_end_kib=.. file_bytes_max=..
    /// evictions=..` line. Namespaces are removed at the end, also on Ctrl-C.
    Soak(soak::SoakArgs),
    /// Not in CI: run every cargo-fuzz target (`capture`, `iptables`,
    /// `nft`, `ipset`, `settings`, `netlink`: the inputs others control;
    /// with the nightly, installing cargo-fuzz when missing) for --seconds
    /// each (default 120), or only --target NAME, seeded from
    /// fuzz/seeds/NAME, within 512 MB; then the differential test of
    /// replay's native classifier against the eBPF programs for as long,
    /// from a new seed (or --seed). Prints per target executions, corpus
    /// size and crashes; corpora grow in fuzz/corpus/NAME, crashes land in
    /// fuzz/artifacts/NAME; a classifier difference fails with its frame
    /// saved as a pcap.
    Fuzz(fuzz::FuzzArgs),
    /// The observer as an OCI image, without a container daemon: a static
    /// binary (musl, eBPF object inside) at /usr/bin/observer, the only
    /// file of one layer on an empty base, written as an OCI image layout
    /// (target/image/oci) and an oci-archive tar
    /// (target/image/observer-VERSION.oci.tar) with the
    /// org.opencontainers.image labels (source, version, revision, created).
    /// Timestamps are the commit's: the same commit gives the same digest.
    /// Push with `skopeo copy oci-archive:FILE docker://REGISTRY/observer:VERSION`.
    Image(image::ImageArgs),
    /// Regenerate docs/reference.md (every command's --help) and the man
    /// page docs/observer.1 from the clap definition; `test` fails when they
    /// differ from it.
    Docs,
    /// Check observer-core/src's and observer/src's layering (what `cargo xtask test` checks in its
    /// `layers` step): model imports no other layer, report and node only
    /// model, bpf model and node, cli all but cmd; no two modules import
    /// each other, directly or through others. Lists every violation.
    Layers,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli.command) {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(task: Task) -> Result<()> {
    match task {
        Task::Setup => setup::setup(),
        Task::Build => {
            setup::setup()?;
            build_release()
        }
        Task::Test { fail_fast, only } => test(fail_fast, &only),
        Task::VmTest(args) => {
            setup::setup()?;
            vm::vm_test(&args)
        }
        Task::Lab(args) => {
            setup::setup()?;
            lab::lab(&args)
        }
        Task::Bench => {
            setup::setup()?;
            util::run(util::cargo().args(["bench", "-p", "observer", "--bench", "ns_per_packet"]))?;
            // `observer cluster` and the node-pair rules over simulated
            // meshes of 300 and 1,000 nodes in a real Prometheus.
            util::run(util::cargo().args([
                "test",
                "--release",
                "-p",
                "observer",
                "--test",
                "cluster",
                "cluster_scale_bench",
                "--",
                "--ignored",
                "--nocapture",
            ]))
        }
        Task::Soak(args) => {
            setup::setup()?;
            soak::soak(&args)
        }
        Task::Fuzz(args) => {
            setup::setup()?;
            fuzz::fuzz(&args)
        }
        Task::Docs => util::run(
            util::cargo()
                .args([
                    "test",
                    "-p",
                    "observer",
                    "--lib",
                    "cli::tests::generated_docs_match_the_help",
                ])
                .env("OBSERVER_WRITE_DOCS", "1"),
        ),
        Task::Layers => layers::check(),
        Task::Image(args) => {
            setup::setup()?;
            image::image(&args).map(|_| ())
        }
    }
}

/// `cargo build --release -p observer`.
pub fn build_release() -> Result<()> {
    util::run(util::cargo().args(["build", "--release", "-p", "observer"]))
}

fn test(fail_fast: bool, only: &[String]) -> Result<()> {
    let total = Instant::now();
    match std::env::var("CI") {
        Ok(ci) => println!("xtask: CI={ci} (passed on to the tests)"),
        Err(_) => println!("xtask: CI is not set (tests needing root skip without it)"),
    }
    type Step = (&'static str, fn() -> Result<()>);
    let steps: [Step; 12] = [
        ("setup", setup::setup),
        ("fmt", || {
            util::run(util::cargo().args(["fmt", "--all", "--", "--check"]))
        }),
        ("clippy", || {
            util::run(util::cargo().args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))
        }),
        // Type-checks (never runs) every fuzz target, so none can rot.
        ("fuzz-build", fuzz::build),
        ("rules", || {
            util::run(deploy_command("promtool").args([
                "check",
                "rules",
                "deploy/prometheus-rules.yaml",
            ]))
        }),
        ("rules-test", || {
            util::run(deploy_command("promtool").args([
                "test",
                "rules",
                "deploy/tests/rules_test.yaml",
            ]))
        }),
        ("deploy-sync", || {
            util::run(deploy_command("python3").arg("deploy/tests/check_deploy.py"))
        }),
        ("manifests", validate_manifests),
        // observer/src imports only downwards, without cycles (ARCHITECTURE.md).
        ("layers", layers::check),
        // The OCI image (dev profile: faster; the release image is the same
        // recipe) that observer/tests/image.rs inspects and runs.
        ("image", || {
            image::image(&image::ImageArgs {
                source: None,
                profile: "dev".to_string(),
            })
            .map(|_| ())
        }),
        ("test", || {
            util::run(util::cargo().args(["test", "--workspace"]))
        }),
        // The kernel suite on 5.10, 6.1 and 6.12 in qemu (TCG) VMs, ~30 min
        // on 2 cores; the host's run is in `test`. Kernels are fetched once
        // into target/vm.
        ("vm-test", vm::vm_test_vms),
    ];
    if let Some(unknown) = only.iter().find(|o| !steps.iter().any(|(n, _)| n == o)) {
        let names: Vec<&str> = steps.iter().map(|(n, _)| *n).collect();
        bail!("no step {unknown:?}; the steps are {}", names.join(", "));
    }
    let mut results = Vec::new();
    for (name, step) in steps {
        if !only.is_empty() && name != "setup" && !only.iter().any(|o| o == name) {
            continue;
        }
        println!("\n==> xtask test: {name}");
        let start = Instant::now();
        let result = step();
        let took = start.elapsed();
        match &result {
            Ok(()) => println!("<== {name}: ok in {}", secs(took)),
            Err(e) => println!("<== {name}: FAILED in {}: {e:#}", secs(took)),
        }
        let failed = result.is_err();
        results.push((name, result, took));
        // Nothing else can run without the toolchain.
        if failed && (fail_fast || name == "setup") {
            break;
        }
    }
    println!("\nxtask test summary:");
    for (name, result, took) in &results {
        let state = if result.is_ok() { "ok" } else { "FAILED" };
        println!("  {name:<12} {state:<7} {:>9}", secs(*took));
    }
    println!("  {:<12} {:<7} {:>9}", "total", "", secs(total.elapsed()));
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, r, _)| r.is_err())
        .map(|(n, _, _)| *n)
        .collect();
    if !failed.is_empty() {
        bail!("failed step(s): {}", failed.join(", "));
    }
    Ok(())
}

/// Kubernetes versions whose schemas the manifests in deploy/ must satisfy
/// (bundled with kubernetes-validate, so no network is needed): 1.30, an
/// older release clusters still run, and 1.37, the newest that
/// kubernetes-validate 1.37.0 knows.
const KUBE_VERSIONS: &[&str] = &["1.30.0", "1.37.0"];

/// `program` in the workspace root, so deploy/ paths are relative.
fn deploy_command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(util::workspace_root());
    cmd
}

/// `kubernetes-validate --strict` (unknown fields are errors) of what
/// `kubectl kustomize deploy/` renders (what `kubectl apply -k deploy/`
/// applies) and of the privileged DaemonSet that can replace its
/// DaemonSet, against each of KUBE_VERSIONS. The PrometheusRule in the
/// rendering is a CRD kind it has no schema for (a warning): the
/// `deploy-sync` step checks it is the rule file wrapped, and the `rules`
/// steps run promtool on its groups.
fn validate_manifests() -> Result<()> {
    let root = util::workspace_root();
    // The base with the optional ServiceMonitor component, as a user who
    // adds `components: [servicemonitor]` renders it.
    let with_component = root.join("target/deploy-servicemonitor");
    std::fs::create_dir_all(&with_component)?;
    std::fs::write(
        with_component.join("kustomization.yaml"),
        "resources:\n  - ../../deploy\ncomponents:\n  - ../../deploy/servicemonitor\n",
    )?;
    let mut rendered = Vec::new();
    for (name, dir) in [
        ("deploy", "deploy"),
        ("deploy-servicemonitor", "target/deploy-servicemonitor"),
    ] {
        let out = util::output(deploy_command("kubectl").args(["kustomize", dir]))
            .with_context(|| format!("`kubectl kustomize {dir}` (kubectl 1.22+ for components)"))?;
        let objects = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("kind: "))
            .count();
        if objects == 0 {
            bail!("`kubectl kustomize {dir}` rendered no object");
        }
        let path = root.join(format!("target/{name}-rendered.yaml"));
        std::fs::write(&path, &out.stdout)?;
        println!("kubectl kustomize {dir}: {objects} objects");
        rendered.push(path);
    }
    for version in KUBE_VERSIONS {
        util::run(
            deploy_command("python3")
                .args(["-m", "kubernetes_validate", "--strict", "--quiet", "-k"])
                .arg(version)
                .args(&rendered)
                .arg("deploy/daemonset-privileged.yaml"),
        )?;
        println!(
            "the renderings and deploy/daemonset-privileged.yaml are valid for Kubernetes {version}"
        );
    }
    Ok(())
}
