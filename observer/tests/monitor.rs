//! The long-running monitor features, end to end with the observer binary
//! in network namespaces: the node_exporter textfile (read by the real
//! node_exporter and checked by promtool), interfaces deleted and
//! re-created while attached, a textfile directory that is missing or
//! read-only, or that a local attacker plants symlinks in, a flood of distinct sources against a small flow map, the
//! config file with SIGHUP reloads, and what is left after a clean exit
//! and after kill -9.
//!
//! Topology of every test (each in its own pair of namespaces):
//!
//! ```text
//!   ns A: va 198.18.0.1/24 02:00:00:00:00:0a  <-veth->  ns B: vb 198.18.0.2/24 02:00:00:00:00:0b
//!   (tests with pings) vx0 198.19.0.1/24, VNI 4096, UDP 4789  <->  vx0 198.19.0.2/24
//! ```
//!
//! The observer watches `va` with `--interval 200ms`. IPv6 is off and every
//! neighbour is static, so the only frames on the wire are the ones a test
//! sends: counts are exact. Crafted frames from B are addressed to a MAC
//! that is not va's, so A drops them at once (OTHERHOST) and answers
//! nothing; the kernel drop program counts them as drops of reason
//! OTHERHOST.
//!
//! No assertion depends on timing: every wait is for a state (a file
//! version, a JSON line) with a generous timeout.

mod support;

use std::{collections::BTreeSet, net::Ipv4Addr, path::Path, process::Command};

use observer_testkit::pair::{A_IP, B_INNER, B_IP, B_MAC_BYTES, Lower, Pair};
use serde_json::Value;
use support::{
    bgp_wire,
    exporter::{
        Exposition, FileWatcher, NODE_EXPORTER, NodeExporter, PROMTOOL, ReadOnlyBind, RssSampler,
        TempDir, decreased, have_tool, promtool_check_metrics, rss_kib, send_storm, wait_for_file,
    },
    frames::{addr, icmp_eth_frame, set_macs, vxlan_frame},
    netns::{ObserverProcess, ObserverRun, send_frames, signal},
};

/// Destination MAC of crafted frames: nobody's, so A drops them (OTHERHOST).
const NOBODY_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xee];
const VNI: u32 = 4096;

const PACKETS: &str = "observer_encap_packets_total";
const BYTES: &str = "observer_encap_bytes_total";
const DROPS: &str = "observer_drops_total";
const TEXTFILE: &str = "observer.prom";

/// Pings B's inner address from A `count` times: `count` VXLAN packets
/// each way on va.
fn ping(pair: &Pair, count: u32) {
    assert_eq!(
        pair.a.ping(B_INNER, count),
        (count, count),
        "ping through the tunnel"
    );
}

/// A crafted VXLAN frame from `source` to A, sent by B to a MAC nobody has.
fn vxlan_from(source: &str) -> Vec<u8> {
    let inner = icmp_eth_frame(addr("198.19.9.1"), addr("198.19.9.2"));
    let mut frame = vxlan_frame(addr(source), addr(A_IP), VNI, &inner);
    set_macs(&mut frame, NOBODY_MAC, B_MAC_BYTES);
    frame
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// The observer on va exporting to `dir`, plus `extra` options; ready.
fn observer_exporting(pair: &Pair, dir: &Path, extra: &[&str]) -> ObserverProcess {
    let mut args = vec!["--textfile-dir", path_str(dir)];
    args.extend_from_slice(extra);
    ObserverProcess::start(Some(pair.a.name()), &["va"], &args)
}

/// Exported packets of one va series (`None` when the series is absent).
fn packets(e: &Exposition, direction: &str, proto: &str, peer: &str) -> Option<f64> {
    e.value(
        PACKETS,
        &[
            ("iface", "va"),
            ("direction", direction),
            ("proto", proto),
            ("peer", peer),
        ],
    )
}

/// Sum of a family over every peer (own and "other") of va, one direction
/// (`None`: both) and protocol.
fn sum_over_peers(e: &Exposition, family: &str, direction: Option<&str>, proto: &str) -> f64 {
    let mut filter = vec![("iface", "va"), ("proto", proto)];
    if let Some(direction) = direction {
        filter.push(("direction", direction));
    }
    e.sum(family, &filter)
}

/// The latest `peer` line of (va, direction, vxlan, peer, 4096) in `lines`:
/// (packets, bytes), (0, 0) when none.
fn json_counts(lines: &[Value], direction: &str, peer: &str) -> (u64, u64) {
    lines
        .iter()
        .rev()
        .find(|l| {
            l["type"] == "peer"
                && l["iface"] == "va"
                && l["direction"] == direction
                && l["proto"] == "vxlan"
                && l["peer"] == peer
                && l["vni"] == u64::from(VNI)
        })
        .map_or((0, 0), |l| {
            (l["packets"].as_u64().unwrap(), l["bytes"].as_u64().unwrap())
        })
}

fn stats_lines(lines: &[Value]) -> usize {
    lines.iter().filter(|l| l["type"] == "stats").count()
}

/// Waits until the observer has printed `more` further stats lines: it has
/// gone through that many more intervals (read, export, print).
fn wait_intervals(observer: &ObserverProcess, more: usize) {
    let target = stats_lines(&observer.lines()) + more;
    assert!(
        observer.wait_for_lines(|lines| stats_lines(lines) >= target),
        "the observer stopped printing stats lines"
    );
}

/// Waits until the JSON lines show `packets` in both directions for B.
fn wait_json_both_ways(observer: &ObserverProcess, packets: u64) {
    let ok = observer.wait_for_lines(|lines| {
        json_counts(lines, "rx", B_IP).0 == packets && json_counts(lines, "tx", B_IP).0 == packets
    });
    assert!(
        ok,
        "JSON never showed {packets} packets each way: rx {:?} tx {:?}",
        json_counts(&observer.lines(), "rx", B_IP),
        json_counts(&observer.lines(), "tx", B_IP)
    );
}

/// Names in `dir` (sorted).
fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Consecutive versions in which a counter series went down.
fn backwards(versions: &[Exposition]) -> Vec<String> {
    versions
        .windows(2)
        .enumerate()
        .flat_map(|(i, w)| {
            decreased(&w[0], &w[1])
                .into_iter()
                .map(move |d| format!("version {i} -> {}: {d}", i + 1))
        })
        .collect()
}

/// The observer's `peer` lines of its final snapshot (after the last
/// non-final stats line).
fn final_snapshot(run: &ObserverRun) -> Vec<&Value> {
    let start = run
        .lines
        .iter()
        .rposition(|l| l["type"] == "stats" && l["final"] == false)
        .map_or(0, |i| i + 1);
    run.lines[start..]
        .iter()
        .filter(|l| l["type"] == "peer")
        .collect()
}

// ---------------------------------------------------------------------------

/// The real node_exporter (textfile collector only) serves what the
/// observer counted: the scraped series equal the observer's JSON totals
/// and the pings (and a BGP session's segments at the wire), node_exporter reports no textfile error, and promtool
/// finds nothing to say about the scrape nor about the file.
#[test]
fn node_exporter_serves_the_exact_counts() {
    let test = "node_exporter_serves_the_exact_counts";
    if !support::have_root(test)
        || !have_tool(test, NODE_EXPORTER, "prometheus-node-exporter")
        || !have_tool(test, PROMTOOL, "prometheus")
    {
        return;
    }
    const N: u32 = 40;
    let pair = Pair::new("ne");
    pair.vxlan(Lower::Route);
    let dir = TempDir::new("ne");
    let file = dir.join(TEXTFILE);
    let observer = observer_exporting(&pair, dir.path(), &[]);
    let node_exporter = NodeExporter::start(&pair.a, dir.path());

    ping(&pair, N);
    // And a BGP session from B to A's port 179, counted at the wire.
    bgp_wire::exchange(&pair.b, &pair.a, A_IP.parse().unwrap());
    let n = f64::from(N);
    let bgp = |e: &Exposition, name: &str, direction: &str, extra: (&str, &str)| {
        let labels = [
            ("iface", "va"),
            ("direction", direction),
            ("peer", B_IP),
            extra,
        ];
        e.value(
            name,
            if extra.0.is_empty() {
                &labels[..3]
            } else {
                &labels
            },
        )
    };
    let written = wait_for_file(&file, "showing the pings and the BGP session", |e| {
        packets(e, "rx", "vxlan", B_IP) == Some(n)
            && packets(e, "tx", "vxlan", B_IP) == Some(n)
            && bgp(
                e,
                "observer_bgp_wire_tcp_flags_total",
                "rx",
                ("flag", "fin"),
            ) == Some(1.0)
            && bgp(
                e,
                "observer_bgp_wire_tcp_flags_total",
                "tx",
                ("flag", "fin"),
            ) == Some(1.0)
    });
    wait_json_both_ways(&observer, u64::from(N));
    let lines = observer.lines();
    let (rx, tx) = (
        json_counts(&lines, "rx", B_IP),
        json_counts(&lines, "tx", B_IP),
    );

    let body = node_exporter.scrape();
    let scraped = Exposition::parse(&body);
    for (direction, (json_packets, json_bytes)) in [("rx", rx), ("tx", tx)] {
        let labels = [
            ("iface", "va"),
            ("direction", direction),
            ("proto", "vxlan"),
            ("peer", B_IP),
        ];
        assert_eq!(
            scraped.value(PACKETS, &labels),
            Some(json_packets as f64),
            "{direction} packets: scrape vs JSON\n{body}"
        );
        assert_eq!(json_packets, u64::from(N), "{direction}: JSON vs pings");
        assert_eq!(
            scraped.value(BYTES, &labels),
            Some(json_bytes as f64),
            "{direction} bytes: scrape vs JSON\n{body}"
        );
    }
    // BGP at the wire: the scrape says what a bgp_wire line of the same
    // interval says (waited for: the line follows the file's write).
    let scraped_bgp = |direction: &str, key: &str| -> u64 {
        let value = match key {
            "segments" => bgp(
                &scraped,
                "observer_bgp_wire_segments_total",
                direction,
                ("", ""),
            ),
            "syn" | "fin" | "rst" => bgp(
                &scraped,
                "observer_bgp_wire_tcp_flags_total",
                direction,
                ("flag", key),
            ),
            _ => bgp(
                &scraped,
                "observer_bgp_wire_messages_total",
                direction,
                ("type", key),
            ),
        };
        value.unwrap_or(0.0) as u64
    };
    let same_as_scrape = |line: &Value, direction: &str| {
        line["type"] == "bgp_wire"
            && line["iface"] == "va"
            && line["direction"] == direction
            && line["peer"] == B_IP
            && bgp_wire::COUNTERS
                .iter()
                .all(|key| line[*key].as_u64() == Some(scraped_bgp(direction, key)))
    };
    assert!(
        observer.wait_for_lines(|lines| ["rx", "tx"]
            .iter()
            .all(|d| lines.iter().any(|l| same_as_scrape(l, d)))),
        "no bgp_wire lines equal to the scrape\n{body}\n{:?}",
        observer
            .lines()
            .iter()
            .filter(|l| l["type"] == "bgp_wire")
            .collect::<Vec<_>>()
    );
    // The session as scripted: B's OPEN and KEEPALIVE in, A's OPEN and
    // NOTIFICATION out.
    for (direction, kind) in [
        ("rx", "open"),
        ("rx", "keepalive"),
        ("tx", "open"),
        ("tx", "notification"),
    ] {
        assert_eq!(
            bgp(
                &scraped,
                "observer_bgp_wire_messages_total",
                direction,
                ("type", kind)
            ),
            Some(1.0),
            "{direction} {kind}\n{body}"
        );
    }
    // No other tunnel was counted: one rx and one tx VXLAN series (BGP is
    // plain traffic, `proto="other"`), no drops.
    assert_eq!(
        scraped.select(PACKETS, &[("proto", "vxlan")]).count(),
        2,
        "{body}"
    );
    assert_eq!(
        scraped.label_values(PACKETS, "proto"),
        BTreeSet::from(["other".to_string(), "vxlan".to_string()]),
        "{body}"
    );
    assert_eq!(scraped.select(DROPS, &[]).count(), 0, "{body}");
    assert_eq!(
        scraped.value("node_textfile_scrape_error", &[]),
        Some(0.0),
        "{body}\nnode_exporter log:\n{}",
        node_exporter.log_text()
    );
    assert!(
        scraped
            .value("node_textfile_mtime_seconds", &[("file", path_str(&file))])
            .is_some(),
        "node_exporter did not read {}:\n{body}",
        file.display()
    );
    // Every observer sample of the file is served as is (the timestamp
    // excepted: the file is rewritten every interval).
    let observer_samples = |e: &Exposition| -> Vec<String> {
        e.samples
            .iter()
            .filter(|s| {
                s.name.starts_with("observer_")
                    && s.name != "observer_last_update_timestamp_seconds"
            })
            .map(|s| format!("{} {:?} {}", s.name, s.labels, s.value))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    assert_eq!(observer_samples(&scraped), observer_samples(&written));
    assert_eq!(written.value("observer_programs_attached", &[]), Some(3.0));
    assert_eq!(
        written.value("observer_export_errors_total", &[]),
        Some(0.0)
    );
    // Nothing churns in this namespace: no notification was lost.
    assert_eq!(
        written.value("observer_netlink_overruns_total", &[]),
        Some(0.0)
    );

    for (what, text) in [("the scrape", body.clone()), ("the textfile", written.text)] {
        let (status, printed) = promtool_check_metrics(&text);
        assert!(
            status.success() && printed.is_empty(),
            "promtool check metrics on {what}: {status}\n{printed}\n{text}"
        );
    }
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o644, "mode of {}", file.display());

    drop(node_exporter);
    observer.stop_ok();
    assert_eq!(
        dir_names(dir.path()),
        Vec::<String>::new(),
        "a clean exit removes the textfile and leaves no temporary file"
    );
}

/// va is deleted and re-created while attached: JSON says gone, then
/// reattached (new ifindex); the exported series of va, keyed by name, go
/// on from the counts before the deletion: N1 + N2, never lower in any
/// version of the file.
#[test]
fn recreated_interface_is_reattached_and_counters_keep_growing() {
    let test = "recreated_interface_is_reattached_and_counters_keep_growing";
    if !support::have_root(test) {
        return;
    }
    const N1: u32 = 30;
    const N2: u32 = 25;
    let pair = Pair::new("re");
    pair.vxlan(Lower::Route);
    let dir = TempDir::new("re");
    let file = dir.join(TEXTFILE);
    let observer = observer_exporting(&pair, dir.path(), &[]);
    let old_ifindex = observer.attach_lines()[0]["ifindex"].as_u64().unwrap();
    let watcher = FileWatcher::start(&file);

    let both = |e: &Exposition, n: u32| {
        packets(e, "rx", "vxlan", B_IP) == Some(f64::from(n))
            && packets(e, "tx", "vxlan", B_IP) == Some(f64::from(n))
    };
    ping(&pair, N1);
    wait_for_file(&file, "showing N1", |e| {
        both(e, N1) && e.value("observer_programs_attached", &[]) == Some(3.0)
    });

    pair.a.ip(&["link", "del", "va"]);
    let gone = |lines: &[Value]| {
        lines
            .iter()
            .any(|l| l["type"] == "interface" && l["event"] == "gone" && l["iface"] == "va")
    };
    assert!(observer.wait_for_lines(gone), "no gone event");
    // Only the kfree_skb program is left; the rows of the old ifindex stay.
    wait_for_file(&file, "showing va gone", |e| {
        e.value("observer_programs_attached", &[]) == Some(1.0) && both(e, N1)
    });

    pair.underlay();
    let reattached = |lines: &[Value]| {
        lines
            .iter()
            .any(|l| l["type"] == "interface" && l["event"] == "reattached" && l["iface"] == "va")
    };
    assert!(observer.wait_for_lines(reattached), "no reattached event");
    wait_for_file(&file, "showing va attached again", |e| {
        e.value("observer_programs_attached", &[]) == Some(3.0)
    });

    ping(&pair, N2);
    let last = wait_for_file(&file, "showing N1 + N2", |e| both(e, N1 + N2));
    // The bytes grew by the same frames: 148 bytes per ping packet
    // (98-byte inner frame + 50 bytes of VXLAN, UDP, IPv4, Ethernet).
    for direction in ["rx", "tx"] {
        assert_eq!(
            last.value(
                BYTES,
                &[
                    ("iface", "va"),
                    ("direction", direction),
                    ("proto", "vxlan"),
                    ("peer", B_IP)
                ]
            ),
            Some(148.0 * f64::from(N1 + N2)),
            "{direction} bytes"
        );
    }
    let versions = watcher.stop();
    assert!(versions.len() >= 3, "too few versions seen");
    let went_back = backwards(&versions);
    assert!(
        went_back.is_empty(),
        "counters went backwards: {went_back:#?}"
    );
    assert!(
        versions
            .iter()
            .any(|e| e.value("observer_programs_attached", &[]) == Some(1.0)),
        "no version written while va was gone"
    );

    let run = observer.stop_ok();
    let events: Vec<(String, u64)> = run
        .lines
        .iter()
        .filter(|l| l["type"] == "interface")
        .map(|l| {
            assert_eq!(l["iface"], "va", "{l}");
            (
                l["event"].as_str().unwrap().to_string(),
                l["ifindex"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], ("gone".to_string(), old_ifindex));
    assert_eq!(events[1].0, "reattached");
    assert_ne!(events[1].1, old_ifindex, "re-created va has a new ifindex");
    assert!(run.stderr.contains("interface gone"), "{}", run.stderr);

    // The final JSON snapshot has a row per ifindex; for one name they add
    // up to N1 + N2 (see the report: the lines do not say which ifindex).
    for direction in ["rx", "tx"] {
        let rows: Vec<u64> = final_snapshot(&run)
            .into_iter()
            .filter(|l| {
                l["iface"] == "va"
                    && l["direction"] == direction
                    && l["proto"] == "vxlan"
                    && l["peer"] == B_IP
            })
            .map(|l| l["packets"].as_u64().unwrap())
            .collect();
        eprintln!("re-attach: final JSON rows of va {direction} vxlan {B_IP}: {rows:?}");
        assert_eq!(
            rows.iter().sum::<u64>(),
            u64::from(N1 + N2),
            "{direction}: {rows:?}"
        );
    }
}

/// The textfile directory is first missing, then read-only (a read-only
/// bind mount: root bypasses permission bits, not EROFS), then writable.
/// The observer counts exactly throughout, logs each failed write, and the
/// first file it manages to write reports every failure so far.
#[test]
fn unwritable_textfile_dir_is_logged_counted_and_survived() {
    let test = "unwritable_textfile_dir_is_logged_counted_and_survived";
    if !support::have_root(test) {
        return;
    }
    const N1: u32 = 20;
    const N2: u32 = 15;
    const N3: u32 = 10;
    let pair = Pair::new("ro");
    pair.vxlan(Lower::Route);
    let base = TempDir::new("ro");
    let source = base.join("src");
    std::fs::create_dir(&source).unwrap();
    let mount = ReadOnlyBind::new(&source, &base.join("ro"));
    // Missing until created through `source`; read-only until remounted.
    let dir = base.join("ro").join("export");
    let file = dir.join(TEXTFILE);

    // Missing: the first interval (before the first stats line) failed.
    let observer = observer_exporting(&pair, &dir, &[]);
    ping(&pair, N1);
    wait_json_both_ways(&observer, u64::from(N1));
    assert!(!dir.exists());

    // Read-only: at least one interval tries and fails.
    std::fs::create_dir(source.join("export")).unwrap();
    assert!(dir.is_dir());
    wait_intervals(&observer, 2);
    ping(&pair, N2);
    wait_json_both_ways(&observer, u64::from(N1 + N2));
    assert_eq!(
        dir_names(&dir),
        Vec::<String>::new(),
        "nothing written, no temporary file left"
    );

    // Writable: the next interval writes the file with every count.
    mount.make_writable();
    let n12 = f64::from(N1 + N2);
    let first = wait_for_file(&file, "written with N1 + N2", |e| {
        packets(e, "rx", "vxlan", B_IP) == Some(n12) && packets(e, "tx", "vxlan", B_IP) == Some(n12)
    });
    let errors = first
        .value("observer_export_errors_total", &[])
        .expect("observer_export_errors_total");
    assert!(
        errors >= 2.0,
        "one missing and one read-only interval at least: {errors}"
    );
    ping(&pair, N3);
    let n = f64::from(N1 + N2 + N3);
    let last = wait_for_file(&file, "showing N1 + N2 + N3", |e| {
        packets(e, "rx", "vxlan", B_IP) == Some(n) && packets(e, "tx", "vxlan", B_IP) == Some(n)
    });
    assert_eq!(
        last.value("observer_export_errors_total", &[]),
        Some(errors),
        "no failure since"
    );

    let run = observer.stop_ok();
    eprintln!("unwritable: observer_export_errors_total {errors}");
    let failures: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("cannot write the textfile"))
        .collect();
    assert_eq!(
        failures.len() as f64,
        errors,
        "one log line per failed interval, as counted in the file:\n{}",
        run.stderr
    );
    assert!(
        failures.iter().any(|l| l.contains("os error 2")),
        "ENOENT logged: {failures:#?}"
    );
    assert!(
        failures.iter().any(|l| l.contains("os error 30")),
        "EROFS logged: {failures:#?}"
    );
    assert!(
        failures.iter().all(|l| l.contains(path_str(&dir))),
        "the directory is named: {failures:#?}"
    );
    assert!(
        failures
            .last()
            .unwrap()
            .contains(&format!("errors={errors}")),
        "{failures:#?}"
    );
    for direction in ["rx", "tx"] {
        assert_eq!(
            json_counts(&run.lines, direction, B_IP).0,
            u64::from(N1 + N2 + N3),
            "{direction}"
        );
    }
    assert!(!file.exists(), "removed on exit");
    drop(mount);
}

/// Sources of the flood: 1,000,000 consecutive IPv4 addresses from here.
/// They only ever exist as outer sources of frames on the veth between the
/// test's namespaces, which A drops at once.
const FLOOD_FIRST_SOURCE: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 0);
const FLOOD_FRAMES: u32 = 1_000_000;
const FLOOD_MAX_FLOWS: u64 = 4096;
const FLOOD_MAX_PEERS: usize = 50;
/// Upper bound of the observer's resident memory during the flood. What
/// it holds is bounded by --max-flows: at most 4 x 4096 flow rows and as
/// many drop rows (a few hundred bytes each with their exporter state:
/// ~10 MiB), one interval's JSON and textfile text, the copies of the
/// kernel maps read each interval (4096 keys x 2 CPUs), and the binary
/// with its BTF parse (~30 MiB measured at rest). 200 MiB leaves room for
/// allocator slack, and is far below what 1e6 remembered rows would take.
const FLOOD_RSS_LIMIT_KIB: u64 = 200 * 1024;

/// A million distinct sources against `--max-flows 4096 --max-peers 50`:
/// the observer survives with bounded memory, the file never names more
/// than 50 peers per family, counters never go back, the kernel's
/// insert/evict accounting is exact, and a peer that sends after the flood
/// is counted exactly.
///
/// Not asserted here: that the file's sum over peers equals the frames
/// sent. It does not today (keys the LRU evicts between two reads take
/// their packets with them, and peers that lose their label take theirs);
/// the ignored reproducers at the end of this file show each gap.
#[test]
fn million_sources_keep_memory_labels_and_accounting_bounded() {
    let test = "million_sources_keep_memory_labels_and_accounting_bounded";
    if !support::have_root(test) {
        return;
    }
    let pair = Pair::new("fl");
    let dir = TempDir::new("fl");
    let file = dir.join(TEXTFILE);
    let max_flows = FLOOD_MAX_FLOWS.to_string();
    let max_peers = FLOOD_MAX_PEERS.to_string();
    let observer = observer_exporting(
        &pair,
        dir.path(),
        &["--max-flows", &max_flows, "--max-peers", &max_peers],
    );
    let pid = observer.pid();
    let rss_start = rss_kib(pid);
    let sampler = RssSampler::start(pid);
    let watcher = FileWatcher::start(&file);

    let mut template = vxlan_from("10.64.0.0");
    // UDP checksum 0 (none): the storm rewrites the source address.
    template[14 + 20 + 6..14 + 20 + 8].copy_from_slice(&[0, 0]);
    let before = pair.b.link_stats("vb");
    let storm = send_storm(&pair.b, "vb", template, FLOOD_FIRST_SOURCE, FLOOD_FRAMES);
    let after = pair.b.link_stats("vb");
    eprintln!(
        "flood: {} frames in {:.2?} ({:.0} frames/s), {} sendmmsg retries; vb tx_packets +{} tx_dropped +{}",
        storm.frames,
        storm.elapsed,
        storm.frames as f64 / storm.elapsed.as_secs_f64(),
        storm.retries,
        after.tx_packets - before.tx_packets,
        after.tx_dropped - before.tx_dropped,
    );

    // After the flood, one known peer: counted exactly.
    const K: u32 = 100;
    let known = "198.18.0.2";
    send_frames(&pair.b, "vb", vec![(vxlan_from(known), K)]);
    let settled = wait_for_file(&file, "showing the known peer", |e| {
        packets(e, "rx", "vxlan", known) == Some(f64::from(K))
    });
    let rss_settled = rss_kib(pid);
    let rss_max = sampler.stop();
    let run = observer.stop_ok();
    let versions = watcher.stop();

    let stats = run.final_stats();
    let entries = stats["flow_entries"].as_u64().unwrap();
    let evictions = stats["flow_evictions"].as_u64().unwrap();
    let failures = stats["flow_insert_failures"].as_u64().unwrap();
    let cache_slots = stats["flow_cache_slots"].as_u64().unwrap();
    let forgotten = stats["rows_forgotten"].as_u64().unwrap();
    let rows_read: BTreeSet<&str> = run
        .lines
        .iter()
        .filter(|l| l["type"] == "peer" && l["direction"] == "rx" && l["proto"] == "vxlan")
        .filter_map(|l| l["peer"].as_str())
        .collect();
    let exported = sum_over_peers(&settled, PACKETS, Some("rx"), "vxlan");
    let sent = u64::from(FLOOD_FRAMES) + 1;
    eprintln!(
        "flood: rss start {rss_start} KiB, max {rss_max} KiB, settled {rss_settled} KiB; \
         final stats {stats}; {} file versions; {} distinct rx peers ever printed; \
         exported rx vxlan packets over all peers {exported} of {} frames",
        versions.len(),
        rows_read.len(),
        u64::from(FLOOD_FRAMES) + u64::from(K),
    );

    assert!(
        rss_max < FLOOD_RSS_LIMIT_KIB,
        "RSS {rss_max} KiB >= {FLOOD_RSS_LIMIT_KIB} KiB"
    );
    // Kernel accounting: every frame had a new key (distinct sources) plus
    // the known peer's one key. Each flood key took a free flow-cache slot
    // on the CPU that saw it, or was inserted into the map (and is still
    // there or was evicted), or failed to insert and was counted. The
    // known peer's key is placed once on each CPU that handled its frames
    // (a slot there, or the map), so it may be placed up to twice per CPU.
    // Per-CPU maps have a value for every possible CPU ("0-1", "0-3,8").
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let cpus: u64 = 1 + possible
        .trim()
        .rsplit(['-', ','])
        .next()
        .and_then(|last| last.parse::<u64>().ok())
        .unwrap();
    let placements = cache_slots + evictions + entries + failures;
    assert!(entries <= FLOOD_MAX_FLOWS, "{stats}");
    assert!(
        (sent..sent + 2 * cpus).contains(&placements),
        "cache slots + evictions + entries + insert failures = {placements}, \
         distinct keys {sent} (+ the known key's extra placements): {stats}"
    );
    assert!(
        cache_slots <= u64::from(observer_common::FLOW_CACHE_SLOTS) * cpus,
        "{stats}"
    );
    assert!(
        evictions + FLOOD_MAX_FLOWS + failures + cache_slots >= sent,
        "{stats}"
    );
    // The userspace table is bounded too: once more distinct rows were
    // read than it holds (4 x --max-flows; how many are read depends on
    // how many intervals the flood spans), it forgets some.
    if rows_read.len() as u64 > 4 * FLOOD_MAX_FLOWS {
        assert!(
            forgotten > 0,
            "more rows than 4 x --max-flows were read: {stats}"
        );
    }
    // The peer label cap, in every version of the file.
    for (i, e) in versions.iter().enumerate() {
        for family in [PACKETS, BYTES, DROPS] {
            let named: Vec<String> = e
                .label_values(family, "peer")
                .into_iter()
                .filter(|p| p != "other" && !p.is_empty())
                .collect();
            assert!(
                named.len() <= FLOOD_MAX_PEERS,
                "version {i}: {} peers named in {family}",
                named.len()
            );
        }
    }
    let went_back = backwards(&versions);
    assert!(
        went_back.is_empty(),
        "counters went backwards: {went_back:#?}"
    );
    assert!(
        exported <= f64::from(FLOOD_FRAMES + K),
        "more exported than sent: {exported}"
    );
    // The final stats line is exact (no traffic since). The file's counter
    // is that, unless an estimate made during the flood (a map walk racing
    // with evictions) was higher: a counter never goes back.
    let exported_before = versions[..versions.len() - 1]
        .iter()
        .filter_map(|e| e.value("observer_map_evictions_total", &[("map", "flows")]))
        .fold(0.0, f64::max);
    let last = versions.last().unwrap();
    assert_eq!(
        last.value("observer_map_evictions_total", &[("map", "flows")]),
        Some((evictions as f64).max(exported_before)),
        "the file's evictions are the final stats line's, or an earlier higher estimate"
    );
}

/// `--config FILE`: interfaces, max_peers, textfile_dir and xdp_mode come
/// from the file, the command line's `--interval 200ms` wins over the
/// file's `1h`. SIGHUP moves the textfile from A to B (A's removed) with
/// the new peer cap; a broken file on SIGHUP is logged and changes nothing.
#[test]
fn config_file_and_sighup_reload() {
    let test = "config_file_and_sighup_reload";
    if !support::have_root(test) {
        return;
    }
    let pair = Pair::new("cf");
    let base = TempDir::new("cf");
    let (dir_a, dir_b) = (base.join("a"), base.join("b"));
    std::fs::create_dir(&dir_a).unwrap();
    std::fs::create_dir(&dir_b).unwrap();
    let (file_a, file_b) = (dir_a.join(TEXTFILE), dir_b.join(TEXTFILE));
    let config = base.join("observer.toml");
    let write_config = |max_peers: usize, dir: &Path, extra: &str| {
        std::fs::write(
            &config,
            format!(
                "interfaces = [\"va\"]\ninterval = \"1h\"\nxdp_mode = \"off\"\n\
                 max_peers = {max_peers}\ntextfile_dir = \"{}\"\n{extra}",
                dir.display()
            ),
        )
        .unwrap();
    };
    write_config(1, &dir_a, "");

    // With the file's 1h interval no stats line would come for an hour:
    // being ready proves the command line's 200ms won.
    let observer = ObserverProcess::spawn(Some(pair.a.name()), &["--config", path_str(&config)]);
    let attach = observer.wait_ready(1);
    assert_eq!(attach[0]["iface"], "va", "interfaces from the file");
    assert_eq!(
        attach[0]["rx_hook"], "tcx",
        "xdp_mode from the file: {}",
        attach[0]
    );
    assert_eq!(attach[0]["xdp_fallback_reason"], "--xdp-mode off");

    // Two peers; with max_peers = 1 the smaller one is "other".
    let (p1, p2, p3) = ("198.18.0.2", "198.18.0.3", "198.18.0.4");
    send_frames(&pair.b, "vb", vec![(vxlan_from(p1), 30)]);
    send_frames(&pair.b, "vb", vec![(vxlan_from(p2), 20)]);
    let in_a = wait_for_file(&file_a, "showing p1 and other", |e| {
        packets(e, "rx", "vxlan", p1) == Some(30.0)
            && packets(e, "rx", "vxlan", "other") == Some(20.0)
    });
    assert_eq!(packets(&in_a, "rx", "vxlan", p2), None, "{}", in_a.text);
    // The kernel dropped them (OTHERHOST), counted per peer with the same cap.
    assert_eq!(
        sum_over_peers(&in_a, DROPS, None, "vxlan"),
        50.0,
        "{}",
        in_a.text
    );
    assert_eq!(
        in_a.label_values(DROPS, "peer"),
        BTreeSet::from([p1.to_string(), "other".to_string()])
    );

    // Reload: B, max_peers 5 (max_flows needs a restart: named, ignored).
    write_config(5, &dir_b, "max_flows = 1000\n");
    signal(observer.pid(), libc::SIGHUP);
    let in_b = wait_for_file(&file_b, "written with both peers named", |e| {
        packets(e, "rx", "vxlan", p1) == Some(30.0) && packets(e, "rx", "vxlan", p2).is_some()
    });
    assert!(!file_a.exists(), "the old directory's file is removed");
    // p2's 20 packets stay in "other" (counters never go back); its own
    // series starts at its promotion.
    assert_eq!(
        packets(&in_b, "rx", "vxlan", p2),
        Some(0.0),
        "{}",
        in_b.text
    );
    assert_eq!(
        packets(&in_b, "rx", "vxlan", "other"),
        Some(20.0),
        "{}",
        in_b.text
    );
    send_frames(&pair.b, "vb", vec![(vxlan_from(p2), 7)]);
    let in_b = wait_for_file(&file_b, "showing p2's new packets", |e| {
        packets(e, "rx", "vxlan", p2) == Some(7.0)
    });
    assert_eq!(packets(&in_b, "rx", "vxlan", p1), Some(30.0));
    assert_eq!(packets(&in_b, "rx", "vxlan", "other"), Some(20.0));
    assert_eq!(sum_over_peers(&in_b, PACKETS, Some("rx"), "vxlan"), 57.0);

    // A broken file: logged, settings kept (B, max_peers 5).
    std::fs::write(
        &config,
        "max_peers = \"many\"\ntextfile_dir = \"/nonexistent\"\n",
    )
    .unwrap();
    signal(observer.pid(), libc::SIGHUP);
    // Two more intervals: the select loop has handled the signal by then.
    wait_intervals(&observer, 2);
    send_frames(&pair.b, "vb", vec![(vxlan_from(p3), 5)]);
    let in_b = wait_for_file(&file_b, "showing p3 under its own label", |e| {
        packets(e, "rx", "vxlan", p3) == Some(5.0)
    });
    assert_eq!(sum_over_peers(&in_b, PACKETS, Some("rx"), "vxlan"), 62.0);
    assert!(!file_a.exists());

    let run = observer.stop_ok();
    assert!(!file_b.exists(), "removed on exit");
    let logged = |text: &str| run.stderr.lines().filter(|l| l.contains(text)).count();
    assert_eq!(logged("settings reloaded"), 1, "{}", run.stderr);
    assert_eq!(
        logged("reload failed; keeping the current settings"),
        1,
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .lines()
            .any(|l| l.contains("need a restart") && l.contains("max_flows")),
        "{}",
        run.stderr
    );
    // The message (TOML's, over several lines) names the bad key and value.
    let failed: String = run
        .stderr
        .lines()
        .skip_while(|l| !l.contains("reload failed"))
        .take_while(|l| !l.contains("settings reloaded") && !l.contains(" INFO "))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        failed.contains("max_peers") && failed.contains("many"),
        "the bad key is named: {failed}"
    );
}

/// SIGTERM (a clean exit) removes the textfile; kill -9 cannot, and leaves
/// the last complete version behind (with its timestamp, for staleness
/// alerts), but no temporary file.
#[test]
fn metrics_listen_serves_what_the_textfile_holds() {
    let test = "metrics_listen_serves_what_the_textfile_holds";
    if !support::have_root(test) || !have_tool(test, PROMTOOL, "prometheus") {
        return;
    }
    const N: u32 = 12;
    let pair = Pair::new("ml");
    pair.vxlan(Lower::Route);
    let dir = TempDir::new("ml");
    let file = dir.join(TEXTFILE);
    let port = pair.a.run(|| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    });
    let listen = format!("127.0.0.1:{port}");
    let observer = observer_exporting(&pair, dir.path(), &["--metrics-listen", &listen]);
    ping(&pair, N);
    let n = f64::from(N);
    let written = wait_for_file(&file, "showing the pings", |e| {
        packets(e, "rx", "vxlan", B_IP) == Some(n) && packets(e, "tx", "vxlan", B_IP) == Some(n)
    });
    // What /metrics serves is an interval's export: the same counts, the
    // same families, valid for promtool.
    let served = pair.a.run(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&listen).expect("connect to /metrics");
        write!(stream, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    });
    let (head, body) = served.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    let exposition = Exposition::parse(body);
    assert_eq!(packets(&exposition, "rx", "vxlan", B_IP), Some(n));
    assert_eq!(packets(&exposition, "tx", "vxlan", B_IP), Some(n));
    let names =
        |e: &Exposition| -> BTreeSet<String> { e.samples.iter().map(|s| s.name.clone()).collect() };
    assert_eq!(names(&exposition), names(&written));
    let (status, printed) = promtool_check_metrics(body);
    assert!(status.success(), "{printed}");
    let run = observer.stop_with(libc::SIGTERM);
    assert!(run.status.success(), "{}: {}", run.status, run.stderr);
}

#[test]
fn clean_exit_removes_the_textfile_kill9_leaves_it() {
    let test = "clean_exit_removes_the_textfile_kill9_leaves_it";
    if !support::have_root(test) {
        return;
    }
    let pair = Pair::new("ex");
    let dir = TempDir::new("ex");
    let file = dir.join(TEXTFILE);

    let observer = observer_exporting(&pair, dir.path(), &[]);
    wait_for_file(&file, "written", |_| true);
    // `observer health`, the DaemonSet's probe: alive and attached.
    let (code, said) = health(dir.path());
    assert_eq!(code, 0, "{said}");
    assert!(said.starts_with("healthy: "), "{said}");
    let run = observer.stop_with(libc::SIGTERM);
    assert!(run.status.success(), "{}: {}", run.status, run.stderr);
    assert_eq!(dir_names(dir.path()), Vec::<String>::new());
    // No file: the probe cannot read one (exit 2, the cause named).
    let (code, said) = health(dir.path());
    assert_eq!(code, 2, "{said}");
    assert!(said.contains("no textfile there"), "{said}");

    let observer = observer_exporting(&pair, dir.path(), &[]);
    let written = wait_for_file(&file, "written again", |_| true);
    let status = observer.kill9();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    assert_eq!(dir_names(dir.path()), vec![TEXTFILE.to_string()]);
    let left = Exposition::read(&file).expect("left behind");
    assert_eq!(
        left.value(
            "observer_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
    let stamp = left
        .value("observer_last_update_timestamp_seconds", &[])
        .expect("timestamp");
    assert!(
        stamp
            >= written
                .value("observer_last_update_timestamp_seconds", &[])
                .unwrap(),
        "the last version written"
    );
    // Left behind by kill -9 and no longer rewritten: the probe fails once
    // it is older than --max-age (here made an hour old).
    let touched = Command::new("touch")
        .args(["-d", "1 hour ago"])
        .arg(&file)
        .status()
        .unwrap();
    assert!(touched.success());
    let (code, said) = health(dir.path());
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("stopped updating it"), "{said}");
    // A recent file whose programs are detached fails too.
    let text = std::fs::read_to_string(&file).unwrap();
    let detached: String = text
        .lines()
        .map(|l| {
            if l.starts_with("observer_programs_attached") {
                format!("{} 0\n", l.rsplit_once(' ').unwrap().0)
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(&file, detached).unwrap();
    let (code, said) = health(dir.path());
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("programs are detached"), "{said}");
}

/// `observer health --textfile-dir DIR`: its exit code, and what it printed
/// on stdout and stderr.
fn health(dir: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["health", "--textfile-dir", path_str(dir)])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Plants `link -> target` as the user `nobody` (uid and gid 65534), as a
/// local attacker would.
fn plant_symlink_as_nobody(target: &Path, link: &Path) {
    use std::os::unix::process::CommandExt;
    let status = std::process::Command::new("ln")
        .arg("-s")
        .arg(target)
        .arg(link)
        .uid(65534)
        .gid(65534)
        .status()
        .expect("running ln as nobody");
    assert!(
        status.success(),
        "nobody could not plant {}",
        link.display()
    );
}

/// A local user attacks a textfile directory everyone can write: `nobody`
/// plants symlinks to a root-owned file at the final name before the first
/// write, and at the temporary name an observer used to write every
/// interval (`.observer.prom.<pid>.tmp`, predictable from `ps`). The
/// observer, root, never writes through them: the victim is untouched, the
/// textfile is a regular file with the exact counts, and one warning names
/// the directory.
#[test]
fn symlinks_planted_in_a_shared_textfile_dir_are_never_followed() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let test = "symlinks_planted_in_a_shared_textfile_dir_are_never_followed";
    if !support::have_root(test) {
        return;
    }
    const N: u32 = 12;
    const VICTIM_TEXT: &str = "root's own file\n";
    let pair = Pair::new("sl");
    pair.vxlan(Lower::Route);
    let base = TempDir::new("sl");
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let victim = base.join("victim");
    std::fs::write(&victim, VICTIM_TEXT).unwrap();
    // World-writable without the sticky bit: fs.protected_symlinks does not
    // guard such a directory, so a followed link would reach the victim
    // whatever this host's sysctl says.
    let dir = base.join("shared");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let file = dir.join(TEXTFILE);
    plant_symlink_as_nobody(&victim, &file);

    let observer = observer_exporting(&pair, &dir, &[]);
    let predictable = format!(".{TEXTFILE}.{}.tmp", observer.pid());
    plant_symlink_as_nobody(&victim, &dir.join(&predictable));
    ping(&pair, N);
    wait_json_both_ways(&observer, u64::from(N));
    // Intervals that write after both links are in place.
    wait_intervals(&observer, 3);
    let n = f64::from(N);
    let written = wait_for_file(&file, "the exact counts", |e| {
        packets(e, "rx", "vxlan", B_IP) == Some(n) && packets(e, "tx", "vxlan", B_IP) == Some(n)
    });
    let meta = std::fs::symlink_metadata(&file).unwrap();
    assert!(meta.file_type().is_file(), "the textfile is a regular file");
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o644));
    assert_eq!(
        written.value("observer_export_errors_total", &[]),
        Some(0.0),
        "no write failed"
    );
    let run = observer.stop_ok();

    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        VICTIM_TEXT,
        "the victim is untouched"
    );
    assert_eq!(
        dir_names(&dir),
        vec![predictable.clone()],
        "only nobody's link is left: the textfile removed on exit, no temporary file"
    );
    let link = std::fs::symlink_metadata(dir.join(&predictable)).unwrap();
    assert!(link.file_type().is_symlink() && link.uid() == 65534);
    let warnings: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("is writable by every user"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning:\n{}", run.stderr);
    assert!(
        warnings[0].contains(path_str(&dir)) && warnings[0].contains("mode 777"),
        "{}",
        warnings[0]
    );
    eprintln!("{test}: {}", warnings[0]);
}

/// A stopped observer (SIGSTOP for three intervals) reads the next
/// interval late, once: the stats lines and the textfile's
/// `observer_late_intervals_total` say 1, and the intervals after it are
/// on time again.
#[test]
fn a_stopped_observer_counts_one_late_interval() {
    let test = "a_stopped_observer_counts_one_late_interval";
    if !support::have_root(test) {
        return;
    }
    let pair = Pair::new("li");
    let dir = TempDir::new("li");
    let observer = observer_exporting(&pair, dir.path(), &["--interval", "1s"]);
    let late = |lines: &[Value]| {
        lines
            .iter()
            .rev()
            .find(|l| l["type"] == "stats")
            .and_then(|l| l["late_intervals"].as_u64())
    };
    assert_eq!(late(&observer.lines()), Some(0));
    signal(observer.pid(), libc::SIGSTOP);
    std::thread::sleep(std::time::Duration::from_millis(3500));
    signal(observer.pid(), libc::SIGCONT);
    wait_intervals(&observer, 3);
    assert_eq!(late(&observer.lines()), Some(1));
    let exposition = Exposition::read(&dir.path().join(TEXTFILE)).expect("the textfile");
    assert_eq!(
        exposition.value("observer_late_intervals_total", &[]),
        Some(1.0)
    );
    let run = observer.stop_ok();
    assert_eq!(late(&run.lines), Some(1));
}

/// A hung tool (here `nft`, as when Calico holds the xtables lock) never
/// delays an interval: the periodic allow-set and rule-counter reads wait
/// on a thread of their own, the intervals stay on time
/// (`late_intervals` 0) while nft hangs, and the run ends normally once it
/// answers again.
#[test]
fn a_hung_tool_never_delays_an_interval() {
    let test = "a_hung_tool_never_delays_an_interval";
    if !support::have_root(test) || !have_tool(test, "/usr/sbin/nft", "nftables") {
        return;
    }
    let pair = Pair::new("ht");
    let bin = TempDir::new("ht");
    let hang = bin.path().join("hang");
    let script = format!(
        "#!/bin/sh\nif [ -e {} ]; then exec sleep 30; fi\nexec /usr/sbin/nft \"$@\"\n",
        hang.display()
    );
    let fake = bin.path().join("nft");
    std::fs::write(&fake, script).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap()
    );
    let observer = ObserverProcess::spawn_with_env(
        Some(pair.a.name()),
        &["--allow-set-refresh", "200ms", "va"],
        &[("PATH", &path)],
    );
    observer.wait_ready(1);
    std::fs::write(&hang, b"").unwrap();
    // 15 intervals of 200 ms: 3 s, during which every nft call hangs.
    wait_intervals(&observer, 15);
    let late = observer
        .lines()
        .iter()
        .rev()
        .find(|l| l["type"] == "stats")
        .and_then(|l| l["late_intervals"].as_u64());
    assert_eq!(late, Some(0), "an interval waited for the hung nft");
    std::fs::remove_file(&hang).unwrap();
    observer.stop_ok();
}
