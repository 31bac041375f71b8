//! `observer diagnose` end to end: exit status and findings on a healthy and
//! a broken two-node VXLAN overlay (`Pair::calico` in
//! observer_testkit::pair), and its errors.

mod support;

use std::{
    io::{BufRead, BufReader, Read},
    process::{Child, Command, Output, Stdio},
};

use observer_testkit::pair::{A_IP, B_IP, NODE_A, NODE_B, Pair, ping_pod};
use serde_json::Value;
use support::netns::{Netns, ObserverProcess};

/// Runs `observer diagnose --output json ARGS...` to the end, no traffic.
fn diagnose(args: &[&str]) -> Output {
    Command::new(ObserverProcess::binary())
        .args(["diagnose", "--output", "json", "--interval", "500ms"])
        .args(args)
        .env("OBSERVER_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("running observer diagnose")
}

fn lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
        .collect()
}

fn diagnosis(out: &Output) -> Value {
    let lines = lines(out);
    let last = lines.last().cloned().unwrap_or_default();
    assert_eq!(
        last["type"],
        "diagnosis",
        "last line is the diagnosis\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    last
}

/// Runs `observer diagnose --output json ARGS...`; once it printed its
/// attach line, runs `traffic` (which must end before the run does), then
/// collects the whole output. Traffic that starts after attaching is
/// counted whole, so counts can be exact.
fn diagnose_with(args: &[&str], traffic: impl FnOnce() -> Vec<Child>) -> Output {
    let mut child = Command::new(ObserverProcess::binary())
        .args(["diagnose", "--output", "json", "--interval", "500ms"])
        .args(args)
        .env("OBSERVER_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running observer diagnose");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        seen.push_str(&line);
        if line.contains(r#""type":"attach""#) {
            // ping's own status says whether replies came, which the
            // broken cases expect not to: only its end matters here.
            for mut t in traffic() {
                t.wait().expect("traffic");
            }
            break;
        }
    }
    stdout.read_to_string(&mut seen).unwrap();
    let mut out = child.wait_with_output().expect("waiting for diagnose");
    out.stdout = seen.into_bytes();
    out
}

#[test]
fn healthy_overlay_for_30_seconds_exits_0_without_findings() {
    if !support::have_root("healthy_overlay_for_30_seconds_exits_0_without_findings") {
        return;
    }
    let overlay = Pair::new("dgh");
    overlay.calico();
    // No interface named: diagnose finds va from the routes to node B.
    // 100 pings each way, 20 s, inside the 30 s run.
    let out = diagnose_with(
        &[
            "--netns",
            overlay.a.name(),
            "--duration",
            "30s",
            "--anomaly-window",
            "3s",
        ],
        || {
            vec![
                ping_pod(&overlay.a, &NODE_A, &NODE_B, 100),
                ping_pod(&overlay.b, &NODE_B, &NODE_A, 100),
            ]
        },
    );
    let d = diagnosis(&out);
    assert_eq!(out.status.code(), Some(0), "{d}");
    assert_eq!(d["healthy"], true);
    assert_eq!(d["interfaces"], serde_json::json!(["va"]));
    assert_eq!(d["findings"], serde_json::json!([]));
    assert!(
        lines(&out).iter().all(|l| l["type"] != "anomaly"),
        "no anomaly line"
    );
    // Measured both ways with node B, which the data plane names.
    let measured = &d["measured"][0];
    assert_eq!(measured["peer"], B_IP);
    assert_eq!(measured["proto"], "vxlan");
    assert_eq!(measured["role"], "node");
    // Requests one way, replies the other: 200 VXLAN packets each way.
    assert_eq!(measured["sent"], 200, "{measured}");
    assert_eq!(measured["received"], 200, "{measured}");
    assert_eq!(measured["dropped"], 0, "{measured}");
    assert_eq!(
        measured["loss"], 0.0,
        "both ways, nothing dropped: {measured}"
    );
    // The data-plane line names B with its block and encapsulation.
    let view = lines(&out)
        .into_iter()
        .find(|l| l["type"] == "dataplane")
        .expect("a dataplane line");
    assert_eq!(
        view["expected_peers"][B_IP]["blocks"],
        serde_json::json!([NODE_B.block])
    );
    assert_eq!(
        view["expected_peers"][B_IP]["encaps"],
        serde_json::json!(["vxlan"])
    );
    assert!(d["text"].as_str().unwrap().contains("Healthy: no anomaly"));
}

#[test]
fn one_way_overlay_exits_1_and_names_the_direction() {
    if !support::have_root("one_way_overlay_exits_1_and_names_the_direction") {
        return;
    }
    let overlay = Pair::new("dgb");
    overlay.calico();
    // B's path drops VXLAN from A: A's packets leave and nothing comes back.
    overlay.b.exec_ok(&[
        "iptables", "-A", "INPUT", "-p", "udp", "--dport", "4789", "-s", A_IP, "-j", "DROP",
    ]);
    let out = diagnose_with(
        &[
            "--netns",
            overlay.a.name(),
            "va",
            "--duration",
            "9s",
            "--anomaly-window",
            "3s",
        ],
        || vec![ping_pod(&overlay.a, &NODE_A, &NODE_B, 25)],
    );
    let d = diagnosis(&out);
    assert_eq!(out.status.code(), Some(1), "{d}");
    assert_eq!(d["healthy"], false);
    let findings = d["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{findings:?}");
    let f = &findings[0];
    assert_eq!(f["kind"], "one_way");
    assert_eq!(f["peer"], B_IP);
    assert_eq!(f["proto"], "vxlan");
    assert_eq!(f["evidence"]["direction"], "tx_only");
    assert_eq!(f["evidence"]["received"], 0);
    // The pings end 5 s into the 9 s run: 3 s (the window) later the
    // condition has ended, and the finding says for how long it lasted.
    assert_eq!(f["active"], false, "{f}");
    let lasted = f["duration_s"].as_f64().expect("a duration");
    assert!(lasted > 0.0 && lasted < 9.0, "{f}");
    // It was streamed as lines while it ran: raised, then cleared.
    let events: Vec<(String, String)> = lines(&out)
        .into_iter()
        .filter(|l| l["type"] == "anomaly")
        .map(|l| {
            (
                l["state"].as_str().unwrap().into(),
                l["kind"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            ("raised".into(), "one_way".into()),
            ("cleared".into(), "one_way".into())
        ]
    );
    let text = d["text"].as_str().unwrap();
    assert!(text.contains("[one_way] VXLAN to 198.18.0.2:"), "{text}");
    assert!(text.contains("Problem found. Exit status 1."), "{text}");
    assert!(text.contains("then cleared"), "{text}");
    // B's iptables rule saw every packet the observer counted as sent.
    let sent = d["measured"][0]["sent"].as_u64().unwrap();
    let rule = String::from_utf8_lossy(
        &overlay
            .b
            .exec_ok(&["iptables", "-L", "INPUT", "-v", "-x", "-n"])
            .stdout,
    )
    .into_owned();
    let counted: u64 = rule
        .lines()
        .find(|l| l.contains("DROP"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("DROP rule counter");
    assert_eq!(sent, 25);
    assert!(
        d["measured"][0]["loss"].is_null(),
        "one way: no loss figure"
    );
    assert_eq!(counted, sent, "B's DROP rule against A's observer");
}

#[test]
fn errors_exit_2_and_say_what_to_do() {
    if !support::have_root("errors_exit_2_and_say_what_to_do") {
        return;
    }
    let ns = Netns::new("dge");
    let out = diagnose(&["--netns", ns.name(), "nosuch0", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nosuch0"), "{err}");
    // No tunnel device, no interface named: nothing to watch.
    let out = diagnose(&["--netns", ns.name(), "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no interface carries tunnel traffic here"),
        "{err}"
    );
    let out = diagnose(&["--netns", "obs-no-such-netns", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(2));
    // A usage error is clap's exit status 2 as well.
    let out = diagnose(&["--anomaly-window", "soon"]);
    assert_eq!(out.status.code(), Some(2));
}

/// B's pods ping A's pod address, whose packets A's INPUT chain drops
/// after decapsulation: `diagnose` on A says they arrive and are dropped
/// on vxlan.calico, by which function and from which node, with the
/// verdict `after_decap`, not a one-way path or a policy on the wire.
#[test]
fn drops_after_decapsulation_are_the_verdict_with_device_and_function() {
    if !support::have_root("drops_after_decapsulation_are_the_verdict") {
        return;
    }
    let overlay = Pair::new("dgd");
    overlay.calico();
    support::calico::iptables_drop(
        &overlay.a,
        &["-A", "INPUT", "-i", "vxlan.calico", "-p", "icmp"],
        "observer test: input on the tunnel",
    );
    let out = diagnose_with(
        &[
            "--netns",
            overlay.a.name(),
            "va",
            "--duration",
            "9s",
            "--anomaly-window",
            "3s",
        ],
        || vec![ping_pod(&overlay.b, &NODE_B, &NODE_A, 25)],
    );
    let d = diagnosis(&out);
    assert_eq!(out.status.code(), Some(1), "{d}");
    let pair = d["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["peer"] == B_IP)
        .unwrap_or_else(|| panic!("no pair for {B_IP}: {d}"));
    assert_eq!(pair["verdict"], "after_decap", "{pair}");
    let finding = d["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "dropped_after_decap")
        .unwrap_or_else(|| panic!("no dropped_after_decap finding: {d}"));
    assert_eq!(finding["peer"], B_IP, "{finding}");
    // Counted since the engine tracked the tunnel (its first read); the
    // whole run's count is the measured line's.
    let causes = finding["evidence"]["since_tracked"][0].as_str().unwrap();
    assert!(
        causes.starts_with("NETFILTER_DROP ")
            && causes.contains(" on vxlan.calico at ")
            && causes.ends_with(", from its pods"),
        "{causes}"
    );
    let measured = d["measured"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["peer"] == B_IP)
        .unwrap_or_else(|| panic!("nothing measured for {B_IP}: {d}"));
    assert_eq!(measured["received"], 25, "{measured}");
    assert_eq!(measured["dropped"], 25, "{measured}");
    let text = d["text"].as_str().unwrap();
    let pair_line = text
        .lines()
        .find(|l| l.trim_start().starts_with(B_IP) && l.contains("dropped after decapsulation: "))
        .unwrap_or_else(|| panic!("no verdict line for {B_IP}: {text}"));
    assert!(pair_line.contains("dropped_after_decap"), "{pair_line}");
    assert!(
        !d["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "allow_set_drop"),
        "{d}"
    );
}
