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
pub mod tcpdump;
pub mod tunnels;

/// True when the test may use the kernel (root). Without root the test is
/// skipped with a message, except under CI (`CI=true`), where it fails:
/// CI runs as root, so a skip there would hide a broken setup.
pub fn have_root(test: &str) -> bool {
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

/// Directory of the reference captures: $OBSERVER_PCAPS, else ../shared/pcaps
/// beside the repository.
pub fn pcaps_dir() -> std::path::PathBuf {
    if let Ok(dir) = std::env::var("OBSERVER_PCAPS") {
        return dir.into();
    }
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/pcaps")
}

/// The reference captures (`*.pcap` of [`pcaps_dir`], sorted); `None`, and
/// the test `name` skips, when there are none outside CI. With CI=true
/// missing captures fail the test.
pub fn reference_captures(name: &str) -> Option<Vec<std::path::PathBuf>> {
    let dir = pcaps_dir();
    if !dir.is_dir() {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
            "reference captures missing at {} and CI=true",
            dir.display()
        );
        eprintln!(
            "skipping {name}: no captures at {} (set OBSERVER_PCAPS)",
            dir.display()
        );
        return None;
    }
    let mut captures: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .expect("listing the captures")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    captures.sort();
    assert!(!captures.is_empty(), "no *.pcap in {}", dir.display());
    Some(captures)
}
