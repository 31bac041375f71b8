//! `observer lab` end to end: the incident's facts, exactly, from the
//! observers' own output; a healthy run without loss; the BGP mesh whose
//! node loses its BIRD, named by every other node; and cleanup after a
//! normal end and after SIGINT. Each run names its namespaces after its
//! own pid, so these tests run in parallel with everything else.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use support::{
    lab::{
        assert_incident, fact, facts, lab_pid, leftovers, n, node_findings, node_verdicts, pairs,
        path, ping, run_lab, run_lab_with,
    },
    netns::{signal, wait_timeout},
};

/// How long each lab scenario runs.
const LAB_DURATION: Duration = Duration::from_secs(8);

/// Also: each node's evidence (`--capture-dir`) replays to the drops its
/// observer printed, per peer, origin and reason.
#[test]
fn incident_lab_reports_the_incident_exactly() {
    if !support::have_root("incident_lab_reports_the_incident_exactly") {
        return;
    }
    let evidence = std::env::temp_dir().join(support::netns::unique("labev"));
    let (output, lines) = run_lab_with(
        "incident",
        LAB_DURATION,
        &["--capture-dir", evidence.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}\n{stderr}", output.status);
    assert!(
        leftovers(lab_pid(&lines)).is_empty(),
        "{:?}",
        leftovers(lab_pid(&lines))
    );
    assert_incident(&lines);
    // Per node pair: gpu's packets from cp1 are dropped by policy once
    // rewritten (the router's address too); cp2 is fine.
    let verdicts = |node: &str| node_verdicts(&lines, node);
    let gpu = verdicts("gpu");
    assert_eq!(gpu["10.10.60.127"], "policy_drop", "{gpu:?}");
    assert_eq!(gpu["10.10.10.244"], "policy_drop", "{gpu:?}");
    assert_eq!(gpu["10.10.60.209"], "healthy", "{gpu:?}");
    assert_eq!(
        verdicts("cp2").values().collect::<BTreeSet<_>>(),
        BTreeSet::from([&"healthy".to_string()])
    );
    for node in ["gpu", "cp1", "cp2"] {
        let printed = node_drops(&lines, node);
        let replayed = replayed_evidence(&evidence.join(node));
        assert_eq!(replayed, printed, "{node}");
    }
    // The incident's drops are gpu's, of cp1's rewritten traffic.
    assert!(!node_drops(&lines, "gpu").is_empty());
    std::fs::remove_dir_all(&evidence).unwrap();
}

/// Packets per (peer, origin, reason) of `node`'s last drop lines.
fn node_drops(lines: &[Value], node: &str) -> BTreeMap<(String, String, String), u64> {
    let mut last = BTreeMap::new();
    for l in lines
        .iter()
        .filter(|l| l["type"] == "drop" && l["node"] == node)
    {
        let row = (
            l["iface"].to_string(),
            l["peer"].to_string(),
            l["origin"].to_string(),
            l["reason"].to_string(),
            l["stage"].to_string(),
            l["direction"].to_string(),
        );
        last.insert(row, l["packets"].as_u64().unwrap());
    }
    let mut drops = BTreeMap::new();
    for ((_, peer, origin, reason, _, _), packets) in last {
        *drops.entry((peer, origin, reason)).or_default() += packets;
    }
    drops
}

/// Frames per (peer, origin, reason) of `observer replay`'s evidence
/// lines for the pcapng files in `dir`.
fn replayed_evidence(dir: &std::path::Path) -> BTreeMap<(String, String, String), u64> {
    let files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let mut found = BTreeMap::new();
    if files.is_empty() {
        return found;
    }
    let output = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["replay", "--output", "json"])
        .args(&files)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let l: Value = serde_json::from_str(line).unwrap();
        if l["type"] == "evidence" {
            let key = (
                l["peer"].to_string(),
                l["origin"].to_string(),
                l["reason"].to_string(),
            );
            *found.entry(key).or_default() += l["frames"].as_u64().unwrap();
        }
    }
    found
}

#[test]
fn healthy_lab_delivers_everything_both_ways() {
    if !support::have_root("healthy_lab_delivers_everything_both_ways") {
        return;
    }
    let (output, lines) = run_lab("healthy", LAB_DURATION);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}\n{stderr}", output.status);
    assert!(leftovers(lab_pid(&lines)).is_empty());
    let pings = facts(&lines, "ping");
    assert_eq!(pings.len(), 8);
    for p in &pings {
        assert!(n(p, "transmitted") >= 10, "{p}");
        assert_eq!(n(p, "received"), n(p, "transmitted"), "{p}");
    }
    for (proto, a, b) in [
        ("vxlan", "gpu", "cp1"),
        ("vxlan", "cp1", "cp2"),
        ("ipip", "gpu", "cp1"),
        ("ipip", "gpu", "cp2"),
    ] {
        for (from, to) in [(a, b), (b, a)] {
            let p = path(&lines, proto, from, to);
            assert!(n(p, "sent") > 0, "{p}");
            assert_eq!(n(p, "received"), n(p, "sent"), "{p}");
        }
    }
    assert!(facts(&lines, "foreign_source").is_empty());
    // No node's observer raised anything.
    for node in ["gpu", "cp1", "cp2"] {
        assert!(node_findings(&lines, node).is_empty(), "{node}");
    }
    let diagnosis = fact(&lines, "diagnosis", &[("scenario", "healthy")]);
    assert_eq!(diagnosis["healthy"], true, "{diagnosis}");
}

/// Runs a BGP scenario for 6 s (root only: `None` without); checks that
/// it succeeded and left nothing behind; its lines.
fn run_bgp_lab(test: &str, scenario: &str) -> Option<Vec<Value>> {
    run_bgp_lab_with(test, scenario, &[])
}

/// [`run_bgp_lab`] with `extra` options.
fn run_bgp_lab_with(test: &str, scenario: &str, extra: &[&str]) -> Option<Vec<Value>> {
    if !support::have_root(test) {
        return None;
    }
    let (output, lines) = run_lab_with(scenario, Duration::from_secs(6), extra);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}\n{stderr}", output.status);
    let pid = lab_pid(&lines);
    assert!(leftovers(pid).is_empty(), "{:?}", leftovers(pid));
    Some(lines)
}

/// (kind, peer, blocks, cleared) of each anomaly `node`'s observer raised,
/// from the lab's facts.
fn anomaly_facts(lines: &[Value], node: &str) -> BTreeSet<(String, String, Vec<String>, bool)> {
    facts(lines, "anomaly")
        .into_iter()
        .filter(|f| f["node"] == node)
        .map(|f| {
            let blocks = f["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_str().unwrap().to_string())
                .collect();
            (
                f["kind"].as_str().unwrap().to_string(),
                f["peer"].as_str().unwrap().to_string(),
                blocks,
                f["cleared"] == true,
            )
        })
        .collect()
}

/// n4 and its block in the BGP scenarios.
const N4: &str = "10.99.0.4";
const N4_BLOCK: &str = "10.65.4.0/26";

/// `node` raised exactly bgp_down and route_missing for n4 (the latter
/// with n4's block), and both cleared.
fn assert_names_n4_outage(lines: &[Value], node: &str) {
    let s = |x: &str| x.to_string();
    assert_eq!(
        anomaly_facts(lines, node),
        BTreeSet::from([
            (s("bgp_down"), s(N4), vec![], true),
            (s("route_missing"), s(N4), vec![s(N4_BLOCK)], true),
        ]),
        "{node}"
    );
}

#[test]
fn bgp_down_lab_is_named_for_the_right_peer_and_block_on_every_node() {
    let Some(lines) = run_bgp_lab(
        "bgp_down_lab_is_named_for_the_right_peer_and_block_on_every_node",
        "bgp-down",
    ) else {
        return;
    };
    // No BIRD left running on the lab's sockets.
    let start = fact(&lines, "start", &[("scenario", "bgp-down")]);
    for socket in start["bird_sockets"].as_array().unwrap() {
        let socket = socket.as_str().unwrap();
        assert!(
            !std::path::Path::new(socket).exists(),
            "{socket} left behind"
        );
    }

    let (n4, n4_block) = (N4, N4_BLOCK);
    let s = |x: &str| x.to_string();
    // Every other node: bgp_down and route_missing for n4 and its block,
    // both cleared; nothing else.
    for node in ["n1", "n2", "n3"] {
        assert_names_n4_outage(&lines, node);
        // One outage of n4's block, as long as its route_missing.
        let outages: Vec<&Value> = facts(&lines, "route_outage")
            .into_iter()
            .filter(|f| f["node"] == node)
            .collect();
        assert_eq!(outages.len(), 1, "{node}: {outages:?}");
        assert_eq!(
            (outages[0]["block"].as_str(), outages[0]["via"].as_str()),
            (Some(n4_block), Some(n4))
        );
        let missing = facts(&lines, "anomaly")
            .into_iter()
            .find(|f| f["node"] == node && f["kind"] == "route_missing")
            .unwrap();
        let (outage_s, missing_s) = (
            outages[0]["duration_s"].as_f64().unwrap(),
            missing["duration_s"].as_f64().unwrap(),
        );
        assert!(outage_s >= 5.0, "{node}: {outage_s}");
        assert!(
            (outage_s - missing_s).abs() < 0.2,
            "{node}: outage {outage_s}, route_missing {missing_s}"
        );
    }
    // Per node pair: route loss with n4, the other pairs healthy.
    for node in ["n1", "n2", "n3", "n4"] {
        let verdicts: BTreeSet<(String, String)> = facts(&lines, "verdict")
            .into_iter()
            .filter(|f| f["node"] == node)
            .map(|f| {
                (
                    s(f["peer"].as_str().unwrap()),
                    s(f["verdict"].as_str().unwrap()),
                )
            })
            .collect();
        let expected: BTreeSet<(String, String)> = (1..=4)
            .map(|i| format!("10.99.0.{i}"))
            .filter(|peer| !peer.ends_with(&node[1..]))
            .map(|peer| {
                let loss = node == "n4" || peer == n4;
                let verdict = if loss { "route_loss" } else { "healthy" };
                (peer, s(verdict))
            })
            .collect();
        assert_eq!(verdicts, expected, "{node}");
    }
    // n4, whose BIRD stopped, lost every session and every route.
    let mut on_n4 = BTreeSet::new();
    for (peer, block) in [
        ("10.99.0.1", "10.65.1.0/26"),
        ("10.99.0.2", "10.65.2.0/26"),
        ("10.99.0.3", "10.65.3.0/26"),
    ] {
        on_n4.insert((s("bgp_down"), s(peer), vec![], true));
        on_n4.insert((s("route_missing"), s(peer), vec![s(block)], true));
    }
    assert_eq!(anomaly_facts(&lines, "n4"), on_n4);

    // The pings to n4 died during the outage and came back; the pair it
    // did not touch lost nothing.
    for from in ["n1", "n2", "n3"] {
        let p = fact(&lines, "ping", &[("from", from), ("to", "n4")]);
        assert!(
            n(p, "received") > 0 && n(p, "received") < n(p, "transmitted"),
            "{p}"
        );
    }
    let control = fact(&lines, "ping", &[("from", "n1"), ("to", "n2")]);
    assert!(n(control, "transmitted") >= 50, "{control}");
    assert_eq!(
        n(control, "received"),
        n(control, "transmitted"),
        "{control}"
    );
    let stopped = fact(&lines, "bird_started", &[("node", "n4")]);
    assert!(n(stopped, "down_ms") >= 6000, "{stopped}");
    // At the wire: each peer saw n4's session end (its NOTIFICATION as
    // BIRD shut down, then RSTs to the reconnects) and open again.
    for node in ["n1", "n2", "n3"] {
        let wire = fact(&lines, "wire", &[("node", node), ("peer", "10.99.0.4")]);
        assert!(
            n(wire, "open") >= 1 && n(wire, "notification") + n(wire, "rst") >= 1,
            "{wire}"
        );
    }
    assert!(
        facts(&lines, "wire")
            .iter()
            .any(|f| f["last_notification"] == "Cease/Administrative Shutdown"),
        "{:?}",
        facts(&lines, "wire")
    );
}

/// `bgp-down` in Calico's IPIP mode: BIRD installs the learned blocks via
/// tunl0 onlink, pod traffic is IPIP on the wire (the kernel's tunnel, or
/// the lab's userspace one), and each node names the same outage as with
/// direct routing, with the route it lost through tunl0.
#[test]
fn bgp_down_lab_over_ipip_names_the_same_outage() {
    let Some(lines) = run_bgp_lab_with(
        "bgp_down_lab_over_ipip_names_the_same_outage",
        "bgp-down",
        &["--bgp-encap", "ipip"],
    ) else {
        return;
    };
    let start = fact(&lines, "start", &[("scenario", "bgp-down")]);
    assert_eq!(start["bgp_encap"], "ipip");
    assert!(
        start["ipip"] == "kernel" || start["ipip"] == "userspace",
        "{start}"
    );
    let n4 = N4;
    for node in ["n1", "n2", "n3"] {
        assert_names_n4_outage(&lines, node);
        let missing = lines
            .iter()
            .find(|l| {
                l["node"] == node
                    && l["type"] == "anomaly"
                    && l["kind"] == "route_missing"
                    && l["state"] == "raised"
            })
            .unwrap();
        assert_eq!(
            missing["evidence"]["last_route"],
            format!("via {n4} dev tunl0 proto bird"),
            "{missing}"
        );
        // The pings to n4 travelled as IPIP both ways on this node's wire.
        for direction in ["rx", "tx"] {
            let ipip: u64 = lines
                .iter()
                .filter(|l| {
                    l["node"] == node
                        && l["type"] == "peer"
                        && l["proto"] == "ipip"
                        && l["peer"] == n4
                        && l["direction"] == direction
                })
                .filter_map(|l| l["packets"].as_u64())
                .max()
                .unwrap_or(0);
            assert!(ipip > 0, "{node} {direction}: no IPIP with {n4}");
        }
        assert_eq!(
            fact(&lines, "verdict", &[("node", node), ("peer", n4)])["verdict"],
            "route_loss"
        );
    }
    for from in ["n1", "n2", "n3"] {
        let p = fact(&lines, "ping", &[("from", from), ("to", "n4")]);
        assert!(
            n(p, "received") > 0 && n(p, "received") < n(p, "transmitted"),
            "{p}"
        );
    }
    // After the outage, `observer probe` on every node: each of the three
    // others answers IPIP from its own address, up to tunl0's MTU.
    let mesh = ["10.99.0.1", "10.99.0.2", "10.99.0.3", N4];
    for (node, addr) in ["n1", "n2", "n3", "n4"].into_iter().zip(mesh) {
        let probes: BTreeSet<(String, u64, u64, u64, String)> = lines
            .iter()
            .filter(|l| l["node"] == node && l["type"] == "probe")
            .map(|l| {
                (
                    format!("{} {}", l["encap"], l["peer"]),
                    n(l, "sent"),
                    n(l, "answered"),
                    n(l, "max_size"),
                    l["answer_sources"][0]["from"].to_string(),
                )
            })
            .collect();
        let expected: BTreeSet<(String, u64, u64, u64, String)> = mesh
            .into_iter()
            .filter(|peer| *peer != addr)
            .map(|peer| {
                (
                    format!("\"ipip\" \"{peer}\""),
                    5,
                    5,
                    1480,
                    format!("\"{peer}\""),
                )
            })
            .collect();
        assert_eq!(probes, expected, "{node}");
    }
}

#[test]
fn new_node_lab_names_the_filtered_block_on_the_filtering_peer_only() {
    let Some(lines) = run_bgp_lab(
        "new_node_lab_names_the_filtered_block_on_the_filtering_peer_only",
        "new-node",
    ) else {
        return;
    };
    let s = |x: &str| x.to_string();
    // n1, whose import filter rejects n4's block: route_missing for n4,
    // still active at the end (the filter stays); nobody else raised
    // anything.
    assert_eq!(
        anomaly_facts(&lines, "n1"),
        BTreeSet::from([(s("route_missing"), s("10.99.0.4"), vec![], false)])
    );
    let n1 = lines
        .iter()
        .find(|l| {
            l["node"] == "n1"
                && l["type"] == "anomaly"
                && l["kind"] == "route_missing"
                && l["state"] == "raised"
        })
        .unwrap();
    assert!(n(&n1["evidence"], "updates_filtered") >= 1, "{n1}");
    for node in ["n2", "n3", "n4"] {
        assert!(anomaly_facts(&lines, node).is_empty(), "{node}");
    }
    let verdict = |node: &str, peer: &str| {
        fact(&lines, "verdict", &[("node", node), ("peer", peer)])["verdict"].clone()
    };
    assert_eq!(verdict("n1", "10.99.0.4"), "route_loss");
    assert_eq!(verdict("n1", "10.99.0.2"), "healthy");
    assert_eq!(verdict("n2", "10.99.0.4"), "healthy");
    // n4's pings to n1 get no reply (n1 cannot route back); n2's to n4 do.
    let to_n1 = fact(&lines, "ping", &[("from", "n4"), ("to", "n1")]);
    assert!(n(to_n1, "transmitted") >= 50, "{to_n1}");
    assert_eq!(n(to_n1, "received"), 0, "{to_n1}");
    let n2_n4 = fact(&lines, "ping", &[("from", "n2"), ("to", "n4")]);
    assert_eq!(n(n2_n4, "received"), n(n2_n4, "transmitted"), "{n2_n4}");
}

#[test]
fn stale_route_lab_names_the_leftover_route_on_its_node_only() {
    let Some(lines) = run_bgp_lab(
        "stale_route_lab_names_the_leftover_route_on_its_node_only",
        "stale-route",
    ) else {
        return;
    };
    let s = |x: &str| x.to_string();
    // n1 kept a route to the block of n4, which left: stale_route, with
    // the block; n2 and n3 dropped n4 cleanly and raise nothing.
    assert_eq!(
        anomaly_facts(&lines, "n1"),
        BTreeSet::from([(
            s("stale_route"),
            s("10.99.0.4"),
            vec![s("10.65.4.0/26")],
            false
        )])
    );
    for node in ["n2", "n3"] {
        assert!(anomaly_facts(&lines, node).is_empty(), "{node}");
    }
    // n4 itself, whose BIRD stopped and link went down, lost everything.
    let mut on_n4 = BTreeSet::new();
    for (peer, block) in [
        ("10.99.0.1", "10.65.1.0/26"),
        ("10.99.0.2", "10.65.2.0/26"),
        ("10.99.0.3", "10.65.3.0/26"),
    ] {
        on_n4.insert((s("bgp_down"), s(peer), vec![], false));
        on_n4.insert((s("route_missing"), s(peer), vec![s(block)], false));
    }
    assert_eq!(anomaly_facts(&lines, "n4"), on_n4);
    let verdict = fact(&lines, "verdict", &[("node", "n1"), ("peer", "10.99.0.4")]);
    assert_eq!(verdict["verdict"], "route_loss");
    // n2 no longer counts n4 as a node at all.
    assert!(
        facts(&lines, "verdict")
            .iter()
            .all(|f| !(f["node"] == "n2" && f["peer"] == "10.99.0.4"))
    );
    let left = fact(&lines, "left", &[("node", "n4")]);
    assert_eq!(left["route"], "10.65.4.0/26 via 10.99.0.4");
}

#[test]
fn udp_block_lab_is_one_way_without_snat() {
    if !support::have_root("udp_block_lab_is_one_way_without_snat") {
        return;
    }
    let (output, lines) = run_lab("udp-block", LAB_DURATION);
    assert!(output.status.success(), "{}", output.status);
    let (gpu_sent, _) = ping(&lines, "gpu", "cp1", "vxlan");
    let (cp1_sent, _) = ping(&lines, "cp1", "gpu", "vxlan");
    assert_eq!(n(path(&lines, "vxlan", "gpu", "cp1"), "received"), 0);
    // The other way arrives with cp1's own address: nothing to flag there.
    assert_eq!(n(path(&lines, "vxlan", "cp1", "gpu"), "received"), cp1_sent);
    assert!(gpu_sent > 0);
    assert!(facts(&lines, "foreign_source").is_empty());
    // gpu sends (its requests, its replies) and receives (cp1's requests):
    // from gpu both directions look alive. cp1 sends and never receives
    // anything from gpu: only cp1 sees the one-way tunnel.
    assert!(node_findings(&lines, "gpu").is_empty());
    assert_eq!(
        node_findings(&lines, "cp1"),
        pairs(&[("one_way", "10.10.10.62")])
    );
    assert!(node_findings(&lines, "cp2").is_empty());
}

#[test]
fn mtu_and_encap_mismatch_labs_raise_their_kinds() {
    if !support::have_root("mtu_and_encap_mismatch_labs_raise_their_kinds") {
        return;
    }
    let (output, lines) = run_lab("mtu", LAB_DURATION);
    assert!(output.status.success(), "{}", output.status);
    let kinds = |node: &str| -> Vec<String> {
        node_findings(&lines, node)
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    assert!(
        kinds("gpu").contains(&"mtu".to_string()),
        "{:?}",
        kinds("gpu")
    );
    // The router's "fragmentation needed" for cp1's IPIP (DF set) to gpu.
    assert!(
        node_findings(&lines, "cp1").contains(&("mtu".to_string(), "10.10.10.62".to_string())),
        "{:?}",
        node_findings(&lines, "cp1")
    );
    assert!(node_findings(&lines, "cp2").iter().all(|(k, _)| k != "mtu"));
    assert_eq!(node_verdicts(&lines, "gpu")["10.10.60.127"], "mtu");
    assert_eq!(node_verdicts(&lines, "cp1")["10.10.10.62"], "mtu");
    assert_eq!(node_verdicts(&lines, "cp1")["10.10.60.209"], "healthy");

    let (output, lines) = run_lab("encap-mismatch", LAB_DURATION);
    assert!(output.status.success(), "{}", output.status);
    let gpu = node_findings(&lines, "gpu");
    assert!(
        gpu.contains(&("encap_mismatch".to_string(), "10.10.60.127".to_string())),
        "{gpu:?}"
    );
    let mismatch = lines
        .iter()
        .find(|l| {
            l["node"] == "gpu"
                && l["type"] == "anomaly"
                && l["kind"] == "encap_mismatch"
                && l["state"] == "raised"
        })
        .expect("an encap_mismatch line from gpu");
    assert_eq!(mismatch["evidence"]["on_wire"], "vxlan", "{mismatch}");
    assert_eq!(
        mismatch["evidence"]["routes_prescribe"],
        serde_json::json!(["ipip"]),
        "{mismatch}"
    );
}

#[test]
fn sigint_removes_the_lab_and_its_observers() {
    if !support::have_root("sigint_removes_the_lab_and_its_observers") {
        return;
    }
    let mut lab = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["lab", "--output", "json", "--duration", "60s"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting observer lab");
    let pid = lab.id();
    // Wait until the observers print: namespaces, devices, rules and the
    // observers' bpf links all exist then.
    let stdout = lab.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let attached = lines.by_ref().map_while(Result::ok).any(|l| {
        serde_json::from_str::<Value>(&l).is_ok_and(|v| v["node"] == "gpu" && v["type"] == "attach")
    });
    assert!(attached, "the lab ended before the gpu observer attached");
    // Keep reading, so that the lab never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    assert!(
        leftovers(pid).iter().any(|l| l.starts_with("namespace")),
        "no namespaces while the lab runs"
    );
    signal(pid, libc::SIGINT);
    let status = wait_timeout(&mut lab, Duration::from_secs(30)).expect("the lab did not stop");
    assert!(!status.success(), "an interrupted lab reports it: {status}");
    assert!(leftovers(pid).is_empty(), "{:?}", leftovers(pid));
}
