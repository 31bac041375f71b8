//! `observer lab` end to end: the incident's facts, exactly, from the
//! observers' own output; a healthy run without loss; and cleanup after a
//! normal end and after SIGINT. Each run names its namespaces after its
//! own pid, so these tests run in parallel with everything else.

mod support;

use std::{
    io::{BufRead, BufReader},
    process::{Command, Output, Stdio},
    time::Duration,
};

use serde_json::Value;
use support::netns::{signal, wait_timeout};

/// Runs `observer lab --scenario NAME --output json --duration 8s`.
fn run_lab(scenario: &str) -> (Output, Vec<Value>) {
    let output = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args([
            "lab",
            "--scenario",
            scenario,
            "--output",
            "json",
            "--duration",
            "8s",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("running observer lab");
    let lines = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    (output, lines)
}

/// The `{"type":"lab","fact":FACT}` lines.
fn facts<'a>(lines: &'a [Value], fact: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["type"] == "lab" && l["fact"] == fact)
        .collect()
}

/// The one lab line of `fact` whose fields equal `fields`.
fn fact<'a>(lines: &'a [Value], fact: &str, fields: &[(&str, &str)]) -> &'a Value {
    let found: Vec<&Value> = facts(lines, fact)
        .into_iter()
        .filter(|l| fields.iter().all(|(k, v)| l[*k] == *v))
        .collect();
    assert_eq!(found.len(), 1, "{fact} {fields:?}: {found:?}");
    found[0]
}

fn n(line: &Value, field: &str) -> u64 {
    line[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {line}"))
}

/// Requests sent and replies received by the steady (56-byte) ping.
fn ping(lines: &[Value], from: &str, to: &str, block: &str) -> (u64, u64) {
    let found: Vec<&Value> = facts(lines, "ping")
        .into_iter()
        .filter(|l| l["from"] == from && l["to"] == to && l["block"] == block && l["size"] == 56)
        .collect();
    assert_eq!(found.len(), 1, "ping {from} -> {to} {block}: {found:?}");
    (n(found[0], "transmitted"), n(found[0], "received"))
}

fn path<'a>(lines: &'a [Value], proto: &str, from: &str, to: &str) -> &'a Value {
    fact(
        lines,
        "path",
        &[("proto", proto), ("from", from), ("to", to)],
    )
}

/// Namespaces and processes still naming `obslab-<pid>-`.
fn leftovers(pid: u32) -> Vec<String> {
    let prefix = format!("obslab-{pid}-");
    let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let mut left: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| format!("namespace {l}"))
        .collect();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&prefix) {
                left.push(format!("process {cmdline}"));
            }
        }
    }
    left
}

/// (kind, peer) of the findings in `node`'s own diagnosis.
fn node_findings(lines: &[Value], node: &str) -> std::collections::BTreeSet<(String, String)> {
    let own = lines
        .iter()
        .find(|l| l["node"] == node && l["type"] == "diagnosis")
        .unwrap_or_else(|| panic!("no diagnosis from {node}"));
    own["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_string(),
                f["peer"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> std::collections::BTreeSet<(String, String)> {
    list.iter()
        .map(|(k, p)| (k.to_string(), p.to_string()))
        .collect()
}

fn lab_pid(lines: &[Value]) -> u32 {
    let start = fact(lines, "start", &[]);
    let gpu = start["namespaces"]["gpu"].as_str().unwrap();
    gpu.trim_start_matches("obslab-")
        .split('-')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn incident_lab_reports_the_incident_exactly() {
    if !support::have_root("incident_lab_reports_the_incident_exactly") {
        return;
    }
    let (output, lines) = run_lab("incident");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}\n{stderr}", output.status);
    assert!(
        leftovers(lab_pid(&lines)).is_empty(),
        "{:?}",
        leftovers(lab_pid(&lines))
    );

    // Cause A: VXLAN from the GPU node never reaches cp1. Every request
    // gpu's ping sent left gpu's eth0 (no replies come back to send).
    let (gpu_sent, gpu_answered) = ping(&lines, "gpu", "cp1", "vxlan");
    assert!(gpu_sent >= 10, "{gpu_sent}");
    assert_eq!(gpu_answered, 0);
    let vxlan = path(&lines, "vxlan", "gpu", "cp1");
    assert_eq!(n(vxlan, "sent"), gpu_sent, "{vxlan}");
    assert_eq!(n(vxlan, "received"), 0, "{vxlan}");

    // Cause B: cp1's VXLAN arrives from the router's address; the inner
    // source the gpu observer sampled names cp1 as the real sender.
    let (cp1_sent, _) = ping(&lines, "cp1", "gpu", "vxlan");
    let foreign = fact(
        &lines,
        "foreign_source",
        &[("node", "gpu"), ("proto", "vxlan")],
    );
    assert_eq!(foreign["outer_src"], "10.10.10.244", "{foreign}");
    assert_eq!(n(foreign, "packets"), cp1_sent, "{foreign}");
    assert_eq!(foreign["senders"].as_array().unwrap().len(), 1, "{foreign}");
    assert_eq!(foreign["senders"][0]["node"], "cp1", "{foreign}");
    assert_eq!(foreign["senders"][0]["addr"], "10.10.60.127", "{foreign}");
    let rx_244 = lines
        .iter()
        .rev()
        .find(|l| l["node"] == "gpu" && l["type"] == "peer" && l["peer"] == "10.10.10.244")
        .expect("a gpu peer row for 10.10.10.244");
    assert_eq!(rx_244["inner_src"], "10.42.168.210", "{rx_244}");
    assert_eq!(n(path(&lines, "vxlan", "cp1", "gpu"), "received"), 0);

    // Calico drops every one of them: the observer's count equals the
    // DROP rule's counter, read with iptables -L at the end.
    let drops = fact(
        &lines,
        "allow_set_drops",
        &[("node", "gpu"), ("proto", "vxlan")],
    );
    assert_eq!(n(drops, "observer_packets"), cp1_sent, "{drops}");
    assert_eq!(n(drops, "drop_rule_packets"), cp1_sent, "{drops}");
    assert_eq!(n(drops, "allow_rule_packets"), 0, "{drops}");
    assert_eq!(drops["agree"], true);

    // The decisive experiment: IPIP arrives with the real node addresses,
    // each request and each reply.
    for cp in ["cp1", "cp2"] {
        let (requests, _) = ping(&lines, cp, "gpu", "ipip");
        let (_, replies) = ping(&lines, "gpu", cp, "ipip");
        assert_eq!(replies, requests, "IPIP between gpu and {cp} is lossless");
        let ipip = path(&lines, "ipip", cp, "gpu");
        assert_eq!(n(ipip, "received"), requests + replies, "{ipip}");
        assert_eq!(n(ipip, "sent"), requests + replies, "{ipip}");
    }

    // Each node's observer ended with its own write-up.
    for node in ["gpu", "cp1", "cp2"] {
        let own = lines
            .iter()
            .find(|l| l["node"] == node && l["type"] == "diagnosis")
            .unwrap_or_else(|| panic!("no diagnosis from {node}"));
        assert!(own["text"].as_str().is_some_and(|t| !t.is_empty()), "{own}");
    }

    // The nodes' own anomalies: on gpu, VXLAN to cp1 one way, and the
    // rewritten source flagged four ways; on cp1, VXLAN to gpu one way;
    // cp2 (no VXLAN with gpu) healthy. IPIP raises nothing.
    assert_eq!(
        node_findings(&lines, "gpu"),
        pairs(&[
            ("one_way", "10.10.60.127"),
            ("snat_suspected", "10.10.10.244"),
            ("allow_set_drop", "10.10.10.244"),
            ("unknown_peer", "10.10.10.244"),
            ("drop_spike", "10.10.10.244"),
        ])
    );
    assert_eq!(
        node_findings(&lines, "cp1"),
        pairs(&[("one_way", "10.10.10.62")])
    );
    assert!(node_findings(&lines, "cp2").is_empty());

    let diagnosis = fact(&lines, "diagnosis", &[("scenario", "incident")]);
    assert_eq!(diagnosis["healthy"], false);
    let findings: Vec<&str> = diagnosis["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    let text = findings.join("\n");
    assert!(
        text.contains(&format!(
            "VXLAN gpu 10.10.10.62 -> cp1 10.10.60.127 never arrives: {gpu_sent} sent by gpu, 0 received at cp1"
        )),
        "{text}"
    );
    assert!(text.contains("cp1 10.10.60.127 sent them"), "{text}");
    assert!(text.contains(": equal."), "{text}");
}

#[test]
fn healthy_lab_delivers_everything_both_ways() {
    if !support::have_root("healthy_lab_delivers_everything_both_ways") {
        return;
    }
    let (output, lines) = run_lab("healthy");
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

#[test]
fn udp_block_lab_is_one_way_without_snat() {
    if !support::have_root("udp_block_lab_is_one_way_without_snat") {
        return;
    }
    let (output, lines) = run_lab("udp-block");
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
    let (output, lines) = run_lab("mtu");
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

    let (output, lines) = run_lab("encap-mismatch");
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
