//! `observer probe` end to end: the lab's scenarios probed from every node
//! at once (`observer lab --probe`), with exact answers, sources and sizes,
//! and the gpu observer's count of the probes Calico drops beside the DROP
//! rule's counter; and the count and rate bounds, checked on the wire with
//! tcpdump in a two-node Calico VXLAN pair.

mod support;

use std::{collections::BTreeSet, process::Command, time::Duration};

use observer_testkit::{
    netns::run,
    pair::{NODE_A, NODE_B, Pair},
};
use serde_json::Value;
use support::{
    lab::{fact, lab_pid, leftovers, n, node_findings, run_lab_with},
    netns::Tcpdump,
};

/// How long the observers may run (the probes end them sooner).
const LAB_DURATION: Duration = Duration::from_secs(8);

const GPU: &str = "10.10.10.62";
const CP1: &str = "10.10.60.127";
const CP2: &str = "10.10.60.209";
const ROUTER: &str = "10.10.10.244";

/// Runs `observer lab --scenario S --probe` (root only: `None` without);
/// checks that it succeeded and left nothing behind.
fn probe_lab(test: &str, scenario: &str) -> Option<Vec<Value>> {
    if !support::have_root(test) {
        return None;
    }
    let (output, lines) = run_lab_with(scenario, LAB_DURATION, &["--probe"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}\n{stderr}", output.status);
    let pid = lab_pid(&lines);
    assert!(leftovers(pid).is_empty(), "{:?}", leftovers(pid));
    Some(lines)
}

/// The `probe` line of `node`'s run for (peer, encap).
fn probe<'a>(lines: &'a [Value], node: &str, peer: &str, encap: &str) -> &'a Value {
    let found: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            l["node"] == node && l["type"] == "probe" && l["peer"] == peer && l["encap"] == encap
        })
        .collect();
    assert_eq!(found.len(), 1, "{node} -> {peer} {encap}: {found:?}");
    found[0]
}

/// `node`'s `probe_summary` line.
fn summary<'a>(lines: &'a [Value], node: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["node"] == node && l["type"] == "probe_summary")
        .unwrap_or_else(|| panic!("no probe_summary from {node}"))
}

/// Asserts every probe answered from `peer` itself: 5 of 5, the answers'
/// only source the peer in the same encapsulation, and `max_size`.
fn assert_answered(line: &Value, peer: &str, proto: &str, max_size: u64) {
    assert_eq!((n(line, "sent"), n(line, "answered")), (5, 5), "{line}");
    assert_eq!(
        line["answer_sources"],
        serde_json::json!([{"from": peer, "proto": proto, "answers": 5}]),
        "{line}"
    );
    assert_eq!(n(line, "max_size"), max_size, "{line}");
    assert!(line["rtt"]["max_ms"].as_f64().unwrap() > 0.0, "{line}");
}

/// Asserts nothing was answered.
fn assert_unanswered(line: &Value) {
    assert_eq!((n(line, "sent"), n(line, "answered")), (5, 0), "{line}");
    assert_eq!(line["verdict"], "unanswered", "{line}");
    assert_eq!(line["max_size"], Value::Null, "{line}");
    assert_eq!(n(line, "ladder_sent"), 0, "{line}");
}

const NODES: [(&str, &str); 3] = [("gpu", GPU), ("cp1", CP1), ("cp2", CP2)];

#[test]
fn healthy_lab_every_peer_answers_both_encapsulations_at_the_device_mtu() {
    let Some(lines) = probe_lab(
        "healthy_lab_every_peer_answers_both_encapsulations_at_the_device_mtu",
        "healthy",
    ) else {
        return;
    };
    for (node, _) in NODES {
        for (_, peer) in NODES.iter().filter(|(other, _)| *other != node) {
            let vxlan = probe(&lines, node, peer, "vxlan");
            assert_answered(vxlan, peer, "vxlan", 1450);
            assert_eq!(n(vxlan, "device_mtu"), 1450);
            assert_eq!(vxlan["verdict"], "ok", "{vxlan}");
            let ipip = probe(&lines, node, peer, "ipip");
            assert_answered(ipip, peer, "ipip", 1480);
            assert_eq!(n(ipip, "device_mtu"), 1480);
            assert_eq!(ipip["verdict"], "ok", "{ipip}");
        }
        let summary = summary(&lines, node);
        assert_eq!(summary["healthy"], true, "{summary}");
        assert_eq!(n(summary, "pairs"), 4);
        assert_eq!(n(summary, "listener_drops"), 0);
    }
    // The observers count every probe and every answer (which carries the
    // probe's payload) apart from the peers' rows, exactly, and raise
    // nothing: gpu sent its own probes and an answer to each of the
    // others' (all answered here), and received as many.
    let probes = |l: &Value| n(l, "sent") + n(l, "ladder_sent");
    for (node, addr) in NODES {
        let own = n(summary(&lines, node), "probes_sent");
        let answered: u64 = NODES
            .iter()
            .filter(|(other, _)| *other != node)
            .flat_map(|(other, _)| ["vxlan", "ipip"].map(|encap| probe(&lines, other, addr, encap)))
            .map(probes)
            .sum();
        let stats = final_stats(&lines, node);
        assert_eq!(
            n(stats, "probe_tx_packets"),
            own + answered,
            "{node}: {stats}"
        );
        assert_eq!(
            n(stats, "probe_rx_packets"),
            own + answered,
            "{node}: {stats}"
        );
        assert!(node_findings(&lines, node).is_empty(), "{node}");
        assert!(
            !lines.iter().any(|l| l["node"] == node
                && l["type"] == "peer"
                && l["proto"] != "other"
                && n(l, "packets") > 0),
            "{node}: a probe reached a peer's row"
        );
    }
}

/// `node`'s observer's last stats line.
fn final_stats<'a>(lines: &'a [Value], node: &str) -> &'a Value {
    lines
        .iter()
        .rev()
        .find(|l| l["node"] == node && l["type"] == "stats" && l["final"] == true)
        .unwrap_or_else(|| panic!("no final stats line from {node}"))
}

#[test]
fn incident_lab_vxlan_is_unanswered_ipip_answers_and_udp_is_source_nated() {
    let Some(lines) = probe_lab(
        "incident_lab_vxlan_is_unanswered_ipip_answers_and_udp_is_source_nated",
        "incident",
    ) else {
        return;
    };
    // From gpu: VXLAN to cp1 unanswered, IPIP answered from cp1's own
    // address.
    let gpu_vxlan = probe(&lines, "gpu", CP1, "vxlan");
    assert_unanswered(gpu_vxlan);
    assert_answered(probe(&lines, "gpu", CP1, "ipip"), CP1, "ipip", 1480);
    // cp1's VXLAN reaches gpu (rewritten), so gpu's side is one way.
    assert_eq!(gpu_vxlan["findings"][1]["kind"], "one_way", "{gpu_vxlan}");
    // From cp1: VXLAN to gpu unanswered; IPIP answered.
    assert_unanswered(probe(&lines, "cp1", GPU, "vxlan"));
    assert_answered(probe(&lines, "cp1", GPU, "ipip"), GPU, "ipip", 1480);
    // gpu sees the control-plane nodes' VXLAN arrive from the router.
    // Calico's allow-set on gpu refuses that source: dropped there.
    let arrivals: BTreeSet<(String, String, String, String)> = lines
        .iter()
        .filter(|l| l["node"] == "gpu" && l["type"] == "probe_arrival" && l["rewritten"] == true)
        .map(|l| {
            let text = |key: &str| l[key].as_str().unwrap_or("-").to_string();
            (
                text("arrived_from"),
                text("proto"),
                text("from_node"),
                text("refused_by"),
            )
        })
        .collect();
    let refused = |cp: &str| {
        (
            ROUTER.to_string(),
            "vxlan".to_string(),
            cp.to_string(),
            "cali40all-vxlan-net".to_string(),
        )
    };
    assert_eq!(arrivals, BTreeSet::from([refused(CP1), refused(CP2)]));
    let conclusion = summary(&lines, "gpu")["conclusion"].as_str().unwrap();
    for words in [
        "VXLAN to 10.10.60.127 unanswered (5 probes)",
        "IPIP to 10.10.60.127 answered from the peer's own address",
        "The path to 10.10.60.127 carries IPIP but not VXLAN",
        "VXLAN from 10.10.60.127 arrives from 10.10.10.244, which is no node",
        "this node's allow-set cali40all-vxlan-net refuses that source, so Calico drops them here",
        "UDP is source-NATed on the way",
    ] {
        assert!(conclusion.contains(words), "{words:?} not in {conclusion}");
    }
    // gpu's observer counts every VXLAN probe of cp1 and cp2 (the router
    // rewrote their source) as a calico_allow_set drop, exactly as many as
    // Calico's DROP rule counted.
    let probes_to_gpu = n(probe(&lines, "cp1", GPU, "vxlan"), "sent")
        + n(probe(&lines, "cp2", GPU, "vxlan"), "sent");
    let drops = fact(
        &lines,
        "allow_set_drops",
        &[("node", "gpu"), ("proto", "vxlan")],
    );
    assert_eq!(n(drops, "observer_packets"), probes_to_gpu, "{drops}");
    assert_eq!(n(drops, "drop_rule_packets"), probes_to_gpu, "{drops}");
    let drop_row = lines
        .iter()
        .rev()
        .find(|l| {
            l["node"] == "gpu"
                && l["type"] == "drop"
                && l["peer"] == ROUTER
                && l["reason"] == "calico_allow_set"
        })
        .expect("a calico_allow_set drop row for the router's address on gpu");
    assert_eq!(n(drop_row, "packets"), probes_to_gpu, "{drop_row}");
}

#[test]
fn mtu_lab_ladder_finds_the_largest_size_through_the_1400_byte_link() {
    let Some(lines) = probe_lab(
        "mtu_lab_ladder_finds_the_largest_size_through_the_1400_byte_link",
        "mtu",
    ) else {
        return;
    };
    // Toward gpu the router forwards onto its 1400-byte link with DF set:
    // 1400 - 50 bytes of VXLAN, 1400 - 20 of IPIP.
    for cp in ["cp1", "cp2"] {
        let vxlan = probe(&lines, cp, GPU, "vxlan");
        assert_answered(vxlan, GPU, "vxlan", 1350);
        assert_eq!(vxlan["verdict"], "device_mtu_too_big", "{vxlan}");
        assert_eq!(
            vxlan["findings"],
            serde_json::json!([{"kind": "device_mtu_too_big", "max_size": 1350, "device_mtu": 1450}])
        );
        assert_answered(probe(&lines, cp, GPU, "ipip"), GPU, "ipip", 1380);
    }
    // From gpu the router's end of that link receives: a veth accepts
    // MTU + 4 bytes (room for a VLAN tag), so 1404-byte packets pass, and
    // the router fragments the answers (not DF) on the way back.
    assert_answered(probe(&lines, "gpu", CP1, "vxlan"), CP1, "vxlan", 1354);
    assert_answered(probe(&lines, "gpu", CP1, "ipip"), CP1, "ipip", 1384);
    // Between the control-plane nodes everything fits.
    assert_answered(probe(&lines, "cp1", CP2, "vxlan"), CP2, "vxlan", 1450);
    assert_answered(probe(&lines, "cp1", CP2, "ipip"), CP2, "ipip", 1480);
    let conclusion = summary(&lines, "cp1")["conclusion"].as_str().unwrap();
    assert!(
        conclusion.contains(
            "the path carries at most 1350-byte packets but vxlan.calico's MTU is 1450: packets \
             of 1351-1450 bytes are lost (set the MTU to 1350)"
        ),
        "{conclusion}"
    );
}

#[test]
fn udp_block_lab_vxlan_is_lost_one_way_only_and_ipip_is_fine() {
    let Some(lines) = probe_lab(
        "udp_block_lab_vxlan_is_lost_one_way_only_and_ipip_is_fine",
        "udp-block",
    ) else {
        return;
    };
    // gpu's VXLAN is blocked; cp1's reaches gpu (from cp1's own address)
    // but gpu's answers are blocked too: unanswered from both ends, and
    // only gpu sees the peer's VXLAN arrive: the lost way is gpu's.
    let gpu_vxlan = probe(&lines, "gpu", CP1, "vxlan");
    assert_unanswered(gpu_vxlan);
    assert_eq!(gpu_vxlan["findings"][1]["kind"], "one_way", "{gpu_vxlan}");
    let cp1_vxlan = probe(&lines, "cp1", GPU, "vxlan");
    assert_unanswered(cp1_vxlan);
    assert_eq!(
        cp1_vxlan["findings"],
        serde_json::json!([{"kind": "unanswered"}]),
        "{cp1_vxlan}"
    );
    // No address is rewritten: nothing arrives from another source.
    for (node, _) in NODES {
        assert!(
            !lines.iter().any(|l| l["node"] == node
                && l["type"] == "probe_arrival"
                && l["rewritten"] == true),
            "{node}"
        );
    }
    for (node, peer) in [("gpu", CP1), ("cp1", GPU), ("gpu", CP2), ("cp2", GPU)] {
        let ipip = probe(&lines, node, peer, "ipip");
        assert_answered(ipip, peer, "ipip", 1480);
        assert_eq!(ipip["verdict"], "ok", "{ipip}");
    }
    assert_answered(probe(&lines, "cp1", CP2, "vxlan"), CP2, "vxlan", 1450);
    assert!(
        summary(&lines, "gpu")["conclusion"]
            .as_str()
            .unwrap()
            .contains("the way from this node to the peer loses it (one way)")
    );
}

/// Seconds since the epoch of each frame `filter` selects in `capture`
/// (`tcpdump -tt -nr`).
fn timestamps(capture: &std::path::Path, filter: &str) -> Vec<f64> {
    let output = run(
        "tcpdump",
        &["-tt", "-nr", capture.to_str().unwrap(), filter],
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
fn probes_stay_within_their_count_and_rate_on_the_wire() {
    if !support::have_root("probes_stay_within_their_count_and_rate_on_the_wire") {
        return;
    }
    let pair = Pair::new("prb");
    pair.calico();
    let filter = format!("udp dst port 4789 and src host {}", NODE_A.underlay);
    let tcpdump = Tcpdump::start(&pair.b, "vb", &filter);
    let (code, lines, stderr) = observer(&[
        "probe",
        "--netns",
        pair.a.name(),
        "--count",
        "7",
        "--rate",
        "10",
        "--timeout",
        "500ms",
        "--output",
        "json",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let [probe, summary] = &lines[..] else {
        panic!("{lines:?}")
    };
    assert_eq!(probe["peer"], NODE_B.underlay);
    assert_eq!((n(probe, "sent"), n(probe, "answered")), (7, 7), "{probe}");
    // The ladder from 84 to 1450 bytes: one probe per halving.
    assert_eq!(n(probe, "ladder_sent"), 11, "{probe}");
    assert_eq!(n(probe, "max_size"), 1450, "{probe}");
    assert_eq!(n(summary, "probes_sent"), 18, "{summary}");

    // On the wire: exactly the probes the run counted, paced at the rate:
    // never faster over the run (17 gaps of 1/10 s), and no two closer
    // than 80 ms (a send the kernel delays by more than 20 ms could bring
    // the next one closer on the wire; tcpdump's timestamps are the
    // receiving kernel's).
    let capture = tcpdump.stop_after(18);
    assert_eq!(capture.count(&filter), 18);
    let times = timestamps(capture.path(), &filter);
    assert_eq!(times.len(), 18);
    let span = times[17] - times[0];
    assert!(span >= 1.7 * 0.99, "18 probes in {span:.4} s at --rate 10");
    let closest = times
        .windows(2)
        .map(|w| w[1] - w[0])
        .fold(f64::INFINITY, f64::min);
    assert!(
        closest >= 0.08,
        "two probes {closest:.4} s apart at --rate 10"
    );
    // Every probe carries the observer's mark, "OBSP(ROBE)", after the
    // UDP, VXLAN, Ethernet, IPv4 and ICMP headers (8 + 8 + 14 + 20 + 8).
    assert_eq!(
        capture.count(&format!("{filter} and udp[58:4] = 0x4f425350")),
        18
    );
}

#[test]
fn probe_refuses_without_peers_and_names_what_to_do() {
    if !support::have_root("probe_refuses_without_peers_and_names_what_to_do") {
        return;
    }
    let pair = Pair::new("prn");
    let (code, _, stderr) = observer(&["probe", "--netns", pair.a.name()]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("nothing to probe"), "{stderr}");
    assert!(stderr.contains("name a peer"), "{stderr}");
}

/// Runs `observer ARGS` to its end; (exit code, JSON lines, stderr).
fn observer(args: &[&str]) -> (Option<i32>, Vec<Value>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(args)
        .output()
        .expect("running observer");
    let lines = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    (
        output.status.code(),
        lines,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn diagnose_probe_folds_the_probes_into_the_verdict() {
    if !support::have_root("diagnose_probe_folds_the_probes_into_the_verdict") {
        return;
    }
    let pair = Pair::new("prd");
    pair.calico();
    let a = pair.a.name().to_string();
    let diagnose = [
        "diagnose",
        "--netns",
        &a,
        "--probe",
        "--duration",
        "4s",
        "--output",
        "json",
    ];
    let (code, lines, stderr) = observer(&diagnose);
    assert_eq!(code, Some(0), "{stderr}");
    let probe = lines
        .iter()
        .find(|l| l["type"] == "probe")
        .expect("a probe line");
    assert_eq!((n(probe, "sent"), n(probe, "answered")), (5, 5), "{probe}");
    let diagnosis = lines.last().unwrap();
    assert_eq!(diagnosis["type"], "diagnosis");
    assert_eq!(diagnosis["healthy"], true, "{diagnosis}");
    assert_eq!(diagnosis["probe"]["healthy"], true, "{diagnosis}");
    assert!(
        diagnosis["text"]
            .as_str()
            .unwrap()
            .contains("Probes (observer probe")
    );

    // B drops VXLAN: no anomaly (no pod traffic flows), but the probes go
    // unanswered, and that is the diagnosis's finding.
    pair.b.exec_ok(&[
        "iptables", "-A", "INPUT", "-p", "udp", "--dport", "4789", "-j", "DROP",
    ]);
    let (code, lines, stderr) = observer(&diagnose);
    assert_eq!(code, Some(1), "{stderr}");
    let probe = lines
        .iter()
        .find(|l| l["type"] == "probe")
        .expect("a probe line");
    assert_eq!(probe["verdict"], "unanswered", "{probe}");
    let diagnosis = lines.last().unwrap();
    assert_eq!(diagnosis["healthy"], false, "{diagnosis}");
    assert_eq!(diagnosis["findings"], serde_json::json!([]), "{diagnosis}");
    let conclusion = diagnosis["probe"]["conclusion"].as_str().unwrap();
    assert!(
        conclusion.starts_with(&format!(
            "VXLAN to {} unanswered (5 probes)",
            NODE_B.underlay
        )),
        "{conclusion}"
    );
}

#[test]
fn attach_probe_interval_exports_the_probe_series() {
    if !support::have_root("attach_probe_interval_exports_the_probe_series") {
        return;
    }
    let pair = Pair::new("pri");
    pair.calico();
    let dir = tempfile::tempdir().expect("a textfile directory");
    let textfile = dir.path().join("observer.prom");
    let attach = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["attach", "--netns", pair.a.name(), pair.a_iface()])
        .args([
            "--probe-interval",
            "3s",
            "--interval",
            "500ms",
            "--output",
            "json",
        ])
        .args(["--bird-socket", "/nonexistent/bird.ctl", "--node-name", "a"])
        .arg("--textfile-dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting observer attach");
    // The textfile once two probe runs are in it (it is removed at exit).
    let deadline = std::time::Instant::now() + support::netns::scaled(Duration::from_secs(30));
    let text = loop {
        let text = std::fs::read_to_string(&textfile).unwrap_or_default();
        if text
            .lines()
            .any(|l| l.starts_with("observer_probe_runs_total") && l.ends_with(" 2"))
        {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no second probe run:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    support::netns::signal(attach.id(), libc::SIGINT);
    let output = attach.wait_with_output().expect("observer attach ends");
    assert!(output.status.success());

    let peer = NODE_B.underlay;
    for series in [
        format!("observer_probe_answered_ratio{{node=\"a\",peer=\"{peer}\",encap=\"vxlan\"}} 1"),
        format!("observer_probe_max_size_bytes{{node=\"a\",peer=\"{peer}\",encap=\"vxlan\"}} 1450"),
        // Five reachability probes per run, each answered, each timed.
        format!(
            "observer_probe_rtt_seconds_count{{node=\"a\",peer=\"{peer}\",encap=\"vxlan\"}} 10"
        ),
        format!(
            "observer_probe_rtt_seconds_bucket{{node=\"a\",peer=\"{peer}\",encap=\"vxlan\",le=\"+Inf\"}} 10"
        ),
    ] {
        assert!(text.lines().any(|l| l == series), "{series} not in\n{text}");
    }
    // promtool reads the file as it was (the observer removed it at exit).
    let copy = dir.path().join("copy.prom");
    std::fs::write(&copy, &text).unwrap();
    let check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&copy).unwrap())
        .output()
        .expect("running promtool");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );

    // The JSON lines carry every run; the probes and their answers are
    // counted apart, exactly (five plus eleven ladder probes a run).
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let runs: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"] == "probe_summary")
        .collect();
    assert!(runs.len() >= 2, "{runs:?}");
    let sent: u64 = runs.iter().map(|r| n(r, "probes_sent")).sum();
    let stats = lines
        .iter()
        .rev()
        .find(|l| l["type"] == "stats" && l["final"] == true)
        .expect("final stats");
    assert_eq!(n(stats, "probe_tx_packets"), sent, "{stats}");
    assert_eq!(n(stats, "probe_rx_packets"), sent, "{stats}");
}

#[test]
fn probe_without_cap_net_raw_says_what_it_needs() {
    use std::os::unix::process::CommandExt;
    if !support::have_root("probe_without_cap_net_raw_says_what_it_needs") {
        return;
    }
    // As nobody (no capabilities), a named peer over IPIP: the run gets
    // as far as opening its sockets.
    let binary = support::unprivileged::BinaryCopy::observer();
    let output = Command::new(binary.path())
        .args(["probe", "192.0.2.1", "--encap", "ipip", "--output", "json"])
        .uid(support::unprivileged::NOBODY)
        .gid(support::unprivileged::NOBODY)
        .output()
        .expect("running observer probe as nobody");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("needs CAP_NET_RAW"), "{stderr}");
    assert!(output.stdout.is_empty());
}

#[test]
fn udp_port_probes_say_whether_plain_udp_crosses() {
    if !support::have_root("udp_port_probes_say_whether_plain_udp_crosses") {
        return;
    }
    let pair = Pair::new("pru");
    pair.calico();
    let probe = [
        "probe",
        "--netns",
        pair.a.name(),
        "--encap",
        "udp:9999",
        "--output",
        "json",
    ];
    let (code, lines, stderr) = observer(&probe);
    assert_eq!(code, Some(0), "{stderr}");
    let udp = lines
        .iter()
        .find(|l| l["type"] == "probe" && l["encap"] == "udp:9999")
        .expect("a udp:9999 line");
    // B's kernel answers each with "port unreachable" from its address.
    assert_eq!((n(udp, "sent"), n(udp, "answered")), (5, 5), "{udp}");
    assert_eq!(
        udp["answer_sources"],
        serde_json::json!([{"from": NODE_B.underlay, "proto": "other", "answers": 5}])
    );
    assert_eq!(udp["max_size"], Value::Null, "{udp}");
    assert_eq!(n(udp, "ladder_sent"), 0, "{udp}");

    // B drops UDP to 9999: VXLAN still answers, plain UDP/9999 does not.
    pair.b.exec_ok(&[
        "iptables", "-A", "INPUT", "-p", "udp", "--dport", "9999", "-j", "DROP",
    ]);
    let (code, lines, stderr) = observer(&probe);
    assert_eq!(code, Some(1), "{stderr}");
    let verdicts: BTreeSet<(String, String)> = lines
        .iter()
        .filter(|l| l["type"] == "probe")
        .map(|l| (l["encap"].to_string(), l["verdict"].to_string()))
        .collect();
    assert_eq!(
        verdicts,
        BTreeSet::from([
            ("\"udp:9999\"".to_string(), "\"unanswered\"".to_string()),
            ("\"vxlan\"".to_string(), "\"ok\"".to_string()),
        ])
    );
    let summary = lines.last().unwrap();
    let conclusion = summary["conclusion"].as_str().unwrap();
    assert!(
        conclusion.contains(&format!(
            "The path to {} carries VXLAN but not UDP/9999",
            NODE_B.underlay
        )),
        "{conclusion}"
    );
}
