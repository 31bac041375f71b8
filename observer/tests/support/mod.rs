//! Helpers shared by the integration tests: frame builders and what runs
//! in network namespaces. Each test file uses a subset. The namespaces and
//! the two-namespace pair most tests use are in the `observer-testkit`
//! crate (`observer_testkit::pair`), shared with the benches and xtask.
#![allow(dead_code)]

pub mod bgp_wire;
pub mod calico;
pub mod differential;
pub mod exporter;
pub mod frames;
pub mod kernel_suite;
pub mod lab;
pub mod netns;
pub mod pods;
pub mod prometheus;
pub mod tcpdump;
pub mod tunnels;
pub mod unprivileged;

/// True when the test may use the kernel (root). Without root the test is
/// skipped with a message, except under CI (`CI=true`), where it fails:
/// CI runs as root, so a skip there would hide a broken setup. Every
/// kernel test calls it first, so it also notes the test's start for
/// `cargo xtask vm-test`, which names the tests running when a VM hangs.
pub fn have_root(test: &str) -> bool {
    kernel_suite::started(test);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{test} needs root (CAP_BPF, CAP_NET_ADMIN) and CI=true: refusing to skip");
    }
    eprintln!("skipping {test}: needs root");
    false
}

/// Directory of the reference captures: $OBSERVER_PCAPS, else the copy in
/// the repository (`observer/tests/pcaps`, tcpdump's BSD-licensed test
/// captures with their expected decodes).
pub fn pcaps_dir() -> std::path::PathBuf {
    if let Ok(dir) = std::env::var("OBSERVER_PCAPS") {
        return dir.into();
    }
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pcaps")
}

/// The reference captures (`*.pcap` of [`pcaps_dir`], sorted). They are
/// in the repository, so a missing or empty directory fails the test
/// instead of skipping it.
pub fn reference_captures() -> Vec<std::path::PathBuf> {
    let dir = pcaps_dir();
    let mut captures: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("listing the reference captures in {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    captures.sort();
    assert!(!captures.is_empty(), "no *.pcap in {}", dir.display());
    captures
}
