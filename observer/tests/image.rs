//! The OCI image `cargo xtask image` writes (`cargo xtask test` builds it
//! in its `image` step, before this runs), checked with Debian's OCI
//! tools and run by a real container runtime: skopeo reads its labels,
//! umoci unpacks exactly one file, the binary runs in an otherwise empty
//! root, and podman (crun) runs `observer check` and an `observer attach`
//! in a test namespace, with the DaemonSet's capabilities, that counts
//! VXLAN exactly as tcpdump does.

mod support;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use observer_testkit::pair::{A_IP, B_INNER, B_IP, Lower, Pair};
use serde_json::Value;
use support::netns::{ObserverRun, Tcpdump, run, temp_path, wait_timeout};

const PINGS: u32 = 20;
const VNI: u64 = 4096;

/// The oci-archive of this version, or `None` (skip) when it was not
/// built and CI is not set; under CI its absence fails.
fn archive(test: &str) -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../target/image/observer-{}.oci.tar",
        env!("CARGO_PKG_VERSION")
    ));
    if path.exists() {
        return Some(path);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!(
            "{test}: {} is missing: `cargo xtask image --profile dev` writes it (`cargo xtask \
             test` runs that before the tests)",
            path.display()
        );
    }
    eprintln!("skipping {test}: no image (cargo xtask image)");
    None
}

#[test]
fn the_image_is_the_static_observer_alone_with_its_labels() {
    let test = "the_image_is_the_static_observer_alone_with_its_labels";
    let Some(archive) = archive(test) else { return };
    let source = format!("oci-archive:{}", archive.display());
    let inspect = run("skopeo", &["inspect", &source]);
    let image: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let labels = &image["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION"),
        "{image}"
    );
    let revision = run("git", &["rev-parse", "HEAD"]);
    let head = String::from_utf8_lossy(&revision.stdout).trim().to_string();
    assert_eq!(labels["org.opencontainers.image.revision"], head.as_str());
    assert!(
        !labels["org.opencontainers.image.source"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
    );
    assert_eq!(image["Layers"].as_array().unwrap().len(), 1, "{image}");
    assert_eq!(image["Os"], "linux");
    assert_eq!(image["Architecture"], "amd64");

    // umoci unpacks the layout: one file, the observer.
    let layout = archive.with_file_name("oci");
    let bundle = temp_path("image-bundle", "d");
    run(
        "umoci",
        &[
            "unpack",
            "--image",
            &format!("{}:{}", layout.display(), env!("CARGO_PKG_VERSION")),
            bundle.to_str().unwrap(),
        ],
    );
    let rootfs = bundle.join("rootfs");
    let mut files: Vec<String> = walk(&rootfs)
        .into_iter()
        .map(|p| p.strip_prefix(&rootfs).unwrap().display().to_string())
        .collect();
    files.sort();
    assert_eq!(files, ["usr", "usr/bin", "usr/bin/observer"]);
    // Static: it runs in a root that holds nothing else (no loader, no
    // libc).
    let version = Command::new("chroot")
        .arg(&rootfs)
        .args(["/usr/bin/observer", "--version"])
        .output()
        .unwrap();
    assert!(
        version.status.success(),
        "{}",
        String::from_utf8_lossy(&version.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("observer {}", env!("CARGO_PKG_VERSION"))
    );
    std::fs::remove_dir_all(&bundle).unwrap();
}

/// Every path under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(walk(&path));
        }
        found.push(path);
    }
    found
}

/// Whether podman's default seccomp profile allows bpf() only to
/// CAP_SYS_ADMIN (Debian 12's containers-common does).
fn bpf_needs_sys_admin_in_podmans_profile() -> bool {
    let profile: Value = serde_json::from_str(
        &std::fs::read_to_string("/usr/share/containers/seccomp.json").unwrap(),
    )
    .unwrap();
    profile["syscalls"].as_array().unwrap().iter().any(|rule| {
        rule["names"].as_array().unwrap().iter().any(|n| n == "bpf")
            && rule["action"] == "SCMP_ACT_ALLOW"
            && rule["includes"]["caps"] == serde_json::json!(["CAP_SYS_ADMIN"])
    })
}

/// `podman run` of the image in namespace `netns`, with the DaemonSet's
/// capabilities and nothing else, and (`unconfined`) without seccomp.
fn podman(archive: &Path, netns: &str, unconfined: bool, args: &[&str]) -> Command {
    podman_with(archive, netns, unconfined, &[], args)
}

/// [`podman`] with more `podman run` options.
fn podman_with(
    archive: &Path,
    netns: &str,
    unconfined: bool,
    options: &[&str],
    args: &[&str],
) -> Command {
    let hard = |resource| {
        // SAFETY: getrlimit fills the struct it is given.
        unsafe {
            let mut limit: libc::rlimit = std::mem::zeroed();
            assert_eq!(libc::getrlimit(resource, &mut limit), 0);
            limit.rlim_max
        }
    };
    // Below this machine's hard limits (crun refused some set to them).
    let nofile = hard(libc::RLIMIT_NOFILE).min(16384);
    let nproc = hard(libc::RLIMIT_NPROC).min(4096);
    let mut cmd = Command::new("podman");
    cmd.args(["run", "--rm", "--pull=never"])
        .arg(format!("--network=ns:/var/run/netns/{netns}"))
        .args(["--cap-drop=all", "--cap-add=BPF,NET_ADMIN,PERFMON,NET_RAW"])
        // podman's default open-files and process limits may be above this
        // machine's hard limits, which crun may not raise: keep ours.
        .arg(format!("--ulimit=nofile={nofile}:{nofile}"))
        .arg(format!("--ulimit=nproc={nproc}:{nproc}"))
        .args(unconfined.then_some("--security-opt=seccomp=unconfined"))
        .args(options)
        .arg(format!("oci-archive:{}", archive.display()))
        .args(args)
        .stdin(Stdio::null());
    cmd
}

#[test]
fn podman_runs_check_and_attach_counts_vxlan_as_tcpdump_does() {
    let test = "podman_runs_check_and_attach_counts_vxlan_as_tcpdump_does";
    if !support::have_root(test) {
        return;
    }
    let Some(archive) = archive(test) else { return };
    let pair = Pair::new("img");
    pair.vxlan(Lower::Route);

    // Debian 12's podman seccomp profile lets bpf() through only with
    // CAP_SYS_ADMIN: the observer, holding CAP_BPF, says so and how out.
    // (A newer profile that allows it to CAP_BPF loads.)
    let confined = podman(
        &archive,
        pair.a.name(),
        false,
        &["check", "--output", "json"],
    )
    .output()
    .unwrap();
    let confined = String::from_utf8_lossy(&confined.stdout);
    let refused_here = confined
        .contains("although CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON are held")
        && confined.contains("seccomp=unconfined");
    assert_eq!(
        refused_here,
        bpf_needs_sys_admin_in_podmans_profile(),
        "{confined}"
    );

    // Without seccomp: observer check in the container, the programs load.
    let check = podman(
        &archive,
        pair.a.name(),
        true,
        &["check", "--output", "json"],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&check.stdout);
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&check.stderr)));
    assert!(
        report["missing_privileges"].as_array().unwrap().is_empty(),
        "{report}"
    );
    for program in report["programs"].as_array().unwrap() {
        assert_eq!(program["loaded"], true, "{program}");
    }

    // observer attach on va, in the container, while A pings B through
    // the tunnel; tcpdump on the same interface, outside.
    let tcpdump = Tcpdump::start(&pair.a, "va", "udp port 4789");
    let mut attach = podman(
        &archive,
        pair.a.name(),
        true,
        &[
            "attach",
            "va",
            "--output",
            "json",
            "--interval",
            "1s",
            "--duration",
            "30s",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = Vec::new();
    let mut reader = BufReader::new(attach.stdout.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !lines.iter().any(|l: &Value| l["type"] == "stats") {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0 && Instant::now() < deadline,
            "the container's observer ended before its first interval"
        );
        lines.push(serde_json::from_str(&line).unwrap());
    }
    assert_eq!(pair.a.ping(B_INNER, PINGS), (PINGS, PINGS));
    let capture = tcpdump.stop_after(2 * PINGS as usize);
    // SIGINT to podman is forwarded to the observer (--sig-proxy), which
    // prints its final counters and exits 0.
    support::netns::signal(attach.id(), libc::SIGINT);
    for line in reader.lines() {
        lines.push(serde_json::from_str(&line.unwrap()).unwrap());
    }
    let status = wait_timeout(&mut attach, Duration::from_secs(30)).expect("podman ends");
    let run = ObserverRun {
        lines,
        status,
        stderr: String::new(),
    };
    assert!(run.status.success(), "{}", run.status);
    run.final_stats();

    let tx_filter = format!("udp dst port 4789 and src host {A_IP} and dst host {B_IP}");
    let rx_filter = format!("udp dst port 4789 and src host {B_IP} and dst host {A_IP}");
    let (tx, rx) = (capture.totals(&tx_filter), capture.totals(&rx_filter));
    assert_eq!(
        (tx.0, rx.0),
        (u64::from(PINGS), u64::from(PINGS)),
        "tcpdump saw the pings"
    );
    let counted = (
        run.counts("va", "tx", "vxlan", Some(B_IP), VNI),
        run.counts("va", "rx", "vxlan", Some(B_IP), VNI),
    );
    eprintln!(
        "podman: observer check {}; attach tx {:?} rx {:?}, tcpdump tx {tx:?} rx {rx:?} (packets, bytes)",
        report["verdict"], counted.0, counted.1
    );
    assert_eq!(counted, (tx, rx));
}

#[test]
fn the_image_reads_calicos_allow_set_with_the_hosts_ipset() {
    let test = "the_image_reads_calicos_allow_set_with_the_hosts_ipset";
    if !support::have_root(test) {
        return;
    }
    let Some(archive) = archive(test) else { return };
    let pair = Pair::new("imh");
    support::calico::ipset_create(&pair.a, "cali40all-vxlan-net", &[B_IP, "198.51.100.0/24"]);
    let attach = |options: &[&str], extra: &[&str]| -> Vec<Value> {
        let mut args = vec!["attach", "va", "--output", "json", "--duration", "3s"];
        args.extend_from_slice(extra);
        let out = podman_with(&archive, pair.a.name(), true, options, &args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    // The image has no ipset: the set is not found.
    let alone = attach(&[], &[]);
    let line = support::calico::allow_set(&alone, "vxlan").expect("an allow_set line");
    assert_eq!(line["active"], false, "{line}");
    // With the host's / mounted read-only and --host-root, the host's own
    // ipset reads it (chrooted there, in the pod's network namespace).
    let hosted = attach(
        &["--volume=/:/host:ro", "--cap-add=SYS_CHROOT"],
        &["--host-root", "/host"],
    );
    let line = support::calico::allow_set(&hosted, "vxlan").expect("an allow_set line");
    assert_eq!(line["active"], true, "{line}");
    assert_eq!(line["prefixes"], 2, "{line}");
    assert_eq!(
        line["sources"],
        serde_json::json!(["ipset cali40all-vxlan-net"]),
        "{line}"
    );
}
