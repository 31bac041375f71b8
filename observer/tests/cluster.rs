//! `observer cluster` end to end against real components the test starts:
//! the lab's nodes each run an observer writing its textfile, one real
//! node_exporter per node serves it, a real Prometheus scrapes them with
//! deploy/'s rules loaded; the pairs `observer cluster` prints are the
//! lab's own facts, exactly, and the one-way alert fires through the
//! alerts API (or, in the healthy lab, nothing does).

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    time::Duration,
};

use observer_core::report::mesh::{self, Mesh};
use serde_json::Value;
use support::{
    lab::{n, path, ping, run_lab_with},
    prometheus::{Stack, with_fast_alerts},
};

const NODES: [&str; 3] = ["gpu", "cp1", "cp2"];
const LAB_DURATION: Duration = Duration::from_secs(8);

/// An alert as (alertname, from, to, proto).
type Alert = (String, String, String, String);

/// Runs `scenario` with the observers' textfiles in `stack`, checks the
/// lab ran, and returns its JSON lines and every alert the alerts API
/// showed firing while it ran (polled twice a second: once the
/// observers exit, their series go stale and the pair alerts resolve).
fn run_lab(stack: &Stack, scenario: &'static str) -> (Vec<Value>, BTreeSet<Alert>) {
    let root = stack.textfile_root();
    let lab = std::thread::spawn(move || {
        run_lab_with(
            scenario,
            LAB_DURATION,
            &["--textfile-dir", root.to_str().unwrap()],
        )
    });
    let mut fired = BTreeSet::new();
    while !lab.is_finished() {
        fired.extend(stack.firing());
        std::thread::sleep(Duration::from_millis(500));
    }
    let (output, lines) = lab.join().unwrap();
    assert!(
        output.status.success(),
        "{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    (lines, fired)
}

/// `observer cluster --output json`: its exit code, the pairs by (from,
/// to, proto), and the summary line.
fn cluster_json(stack: &Stack) -> (i32, BTreeMap<(String, String, String), Value>, Value) {
    let output = stack.cluster(&["--output", "json"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let pairs = lines
        .iter()
        .filter(|l| l["type"] == "pair")
        .map(|p| {
            let s = |k: &str| p[k].as_str().unwrap().to_string();
            ((s("from"), s("to"), s("proto")), p.clone())
        })
        .collect();
    let summary = lines
        .iter()
        .find(|l| l["type"] == "cluster_summary")
        .unwrap_or_else(|| {
            panic!(
                "no summary: {stdout}\n{}\n{}",
                String::from_utf8_lossy(&output.stderr),
                stack.log()
            )
        })
        .clone();
    (output.status.code().unwrap_or(-1), pairs, summary)
}

fn key(from: &str, to: &str, proto: &str) -> (String, String, String) {
    (from.to_string(), to.to_string(), proto.to_string())
}

/// The (from, to, proto) of every series of the pair rule `record` that
/// Prometheus recorded between `start` and `end`, with its highest value.
fn recorded_pairs(
    stack: &Stack,
    record: &str,
    start: f64,
    end: f64,
) -> BTreeMap<(String, String, String), f64> {
    stack
        .query_range(record, start, end)
        .iter()
        .map(|series| {
            let label = |k: &str| series["metric"][k].as_str().unwrap_or_default();
            let highest = series["values"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|point| point[1].as_str()?.parse::<f64>().ok())
                .fold(f64::MIN, f64::max);
            (key(label("from"), label("to"), label("proto")), highest)
        })
        .collect()
}

#[test]
fn the_incident_lab_seen_from_prometheus_names_each_pair_exactly() {
    if !support::have_root("the_incident_lab_seen_from_prometheus_names_each_pair_exactly") {
        return;
    }
    let stack = Stack::start(&NODES);
    let started = unix_now();
    let (lines, fired) = run_lab(&stack, "incident");
    let (code, pairs, summary) = cluster_json(&stack);
    assert_eq!(code, 1, "{summary}");

    // VXLAN gpu -> cp1: every request gpu's ping sent, none received.
    let (gpu_sent, _) = ping(&lines, "gpu", "cp1", "vxlan");
    let one_way = &pairs[&key("gpu", "cp1", "vxlan")];
    assert_eq!(n(one_way, "sent"), gpu_sent, "{one_way}");
    assert_eq!(n(one_way, "received"), 0, "{one_way}");
    assert_eq!(one_way["loss"], 1.0, "{one_way}");
    assert_eq!(one_way["verdict"], "one_way", "{one_way}");
    assert_eq!(one_way["from_address"], "10.10.10.62");
    assert_eq!(one_way["to_address"], "10.10.60.127");

    // VXLAN cp1 -> gpu: arrives from the router's address and is dropped
    // by the allow-set, every packet (the lab's own count).
    let (cp1_sent, _) = ping(&lines, "cp1", "gpu", "vxlan");
    let policy = &pairs[&key("cp1", "gpu", "vxlan")];
    assert_eq!(n(policy, "sent"), cp1_sent, "{policy}");
    assert_eq!(n(policy, "received"), cp1_sent, "{policy}");
    assert_eq!(policy["arrived_from"], serde_json::json!(["10.10.10.244"]));
    assert_eq!(
        n(&policy["drops"], "calico_allow_set"),
        cp1_sent,
        "{policy}"
    );
    assert_eq!(n(&policy["drops"], "NETFILTER_DROP"), cp1_sent, "{policy}");
    assert_eq!(policy["verdict"], "policy_drop", "{policy}");
    assert!(
        policy["next_step"]
            .as_str()
            .unwrap()
            .contains("from 10.10.10.244, which is no node"),
        "{policy}"
    );

    // IPIP healthy both ways, exactly as the lab's observers counted.
    for (from, to) in [
        ("gpu", "cp1"),
        ("cp1", "gpu"),
        ("gpu", "cp2"),
        ("cp2", "gpu"),
    ] {
        let pair = &pairs[&key(from, to, "ipip")];
        let lab = path(&lines, "ipip", from, to);
        assert_eq!(n(pair, "sent"), n(lab, "sent"), "{pair} {lab}");
        assert_eq!(n(pair, "received"), n(lab, "sent"), "{pair}");
        assert!(n(pair, "sent") > 0, "{pair}");
        assert_eq!(pair["verdict"], "healthy", "{pair}");
    }
    // Every other pair is healthy; nothing fits no pair.
    let problems: Vec<_> = pairs
        .iter()
        .filter(|(_, p)| p["verdict"] != "healthy")
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(
        problems,
        [key("cp1", "gpu", "vxlan"), key("gpu", "cp1", "vxlan")]
    );
    assert_eq!(summary["nodes"], 3, "{summary}");
    assert_eq!(summary["problems"], 2, "{summary}");
    assert_eq!(
        summary["foreign_sources"],
        serde_json::json!([]),
        "{summary}"
    );

    // The table says the same for people.
    let table = stack.cluster(&["--output", "table"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert_eq!(table.status.code(), Some(1), "{text}");
    assert!(
        text.lines().any(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.get(..7)
                == Some(&[
                    "gpu",
                    "cp1",
                    "vxlan",
                    &gpu_sent.to_string(),
                    "0",
                    "100%",
                    "one-way",
                ])
        }),
        "{text}"
    );

    // The one-way alert fired through the alerts API, for both VXLAN
    // directions (gpu receives cp1's VXLAN only from the router's
    // address), and no other alert did.
    let pair_alert = |from: &str, to: &str| {
        (
            "ObserverOneWayPair".to_string(),
            from.to_string(),
            to.to_string(),
            "vxlan".to_string(),
        )
    };
    assert_eq!(
        fired,
        BTreeSet::from([pair_alert("cp1", "gpu"), pair_alert("gpu", "cp1")]),
        "{}",
        stack.log()
    );

    // The pair rules record the two VXLAN directions as losing everything
    // (gpu's drops are of the router's address, no node's), receiving
    // nothing at any time. (Healthy pairs may be recorded for a moment: over
    // a lab of seconds, two rates scraped at different times differ by more
    // than the 0.05 % the rules record from; the mesh test below shows a
    // steady cluster records exactly its broken pair.)
    let end = unix_now();
    let loss = recorded_pairs(&stack, "observer:pair_loss:ratio5m", started, end);
    let received = recorded_pairs(
        &stack,
        "observer:pair_received_packets:rate5m",
        started,
        end,
    );
    for pair in [key("cp1", "gpu", "vxlan"), key("gpu", "cp1", "vxlan")] {
        assert_eq!(loss.get(&pair), Some(&1.0), "{pair:?}: {loss:?}");
        assert_eq!(received.get(&pair), Some(&0.0), "{pair:?}: {received:?}");
    }

    // Every panel of the Grafana dashboard shows data over the lab's run
    // (the BGP panel's sessions need a BIRD, which the incident lab's
    // nodes do not run: the BGP lab below fills them; its sockets query
    // answers here).
    let (empty_panels, empty_queries) = without_data(&stack, started, unix_now());
    assert_eq!(empty_panels, Vec::<String>::new());
    assert_eq!(
        empty_queries,
        [r#"observer_bgp_session_established{cluster=~".*", node=~".*"}"#]
    );
}

/// Runs every query of every panel of the Grafana dashboard over `start`
/// to `end` with the variables at "All": the titles of the panels that
/// show no series, and the queries that return none.
fn without_data(stack: &Stack, start: f64, end: f64) -> (Vec<String>, Vec<String>) {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/observer-dashboard.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(dashboard["uid"], "observer-node-pairs");
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["datasource", "cluster", "node"]);
    let mut empty = Vec::new();
    let mut empty_panels = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let mut shown = 0;
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$cluster", ".*")
                .replace("$node", ".*")
                .replace("$__range", &format!("{}s", (end - start).ceil()));
            let series = stack.query_range(&expr, start, end);
            if series.is_empty() {
                empty.push(expr);
            }
            shown += series.len();
        }
        if shown == 0 {
            empty_panels.push(panel["title"].as_str().unwrap().to_string());
        }
    }
    (empty_panels, empty)
}

/// The BGP lab (n4's BIRD stops, its sessions and its block's route go
/// and come back) through node_exporters into Prometheus: the
/// dashboard's BGP and route panels show it, sessions down included.
#[test]
fn the_bgp_lab_fills_the_dashboards_bgp_and_route_panels() {
    if !support::have_root("the_bgp_lab_fills_the_dashboards_bgp_and_route_panels") {
        return;
    }
    let stack = Stack::start(&["n1", "n2", "n3", "n4"]);
    let started = unix_now();
    let root = stack.textfile_root();
    let (output, _) = run_lab_with(
        "bgp-down",
        Duration::from_secs(6),
        &["--textfile-dir", root.to_str().unwrap()],
    );
    assert!(
        output.status.success(),
        "{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let end = unix_now();
    // The BGP and route panels show data, every query of theirs (the lab
    // has no tunnel traffic between its nodes: the pair panels stay empty).
    let (empty_panels, empty_queries) = without_data(&stack, started, end);
    for panel in [
        "BGP: BIRD control sockets answering, sessions established",
        "Route outages: pod blocks without a route",
    ] {
        assert!(!empty_panels.iter().any(|p| p == panel), "{empty_panels:?}");
    }
    assert!(
        !empty_queries
            .iter()
            .any(|q| q.contains("observer_bgp_") || q.contains("observer_route")),
        "{empty_queries:?}"
    );
    // Each other node's session with n4 is seen established (1) and, while
    // n4's BIRD is stopped, down (0).
    let sessions = stack.query_range(
        r#"max by (node) (observer_bgp_session_established{neighbor="10.99.0.4"})"#,
        started,
        end,
    );
    let seen: BTreeMap<&str, BTreeSet<&str>> = sessions
        .iter()
        .map(|s| {
            let values = s["values"].as_array().unwrap();
            (
                s["metric"]["node"].as_str().unwrap(),
                values
                    .iter()
                    .map(|point| point[1].as_str().unwrap())
                    .collect(),
            )
        })
        .collect();
    for node in ["n1", "n2", "n3"] {
        assert_eq!(
            seen.get(node),
            Some(&BTreeSet::from(["0", "1"])),
            "{node}: {sessions:?}"
        );
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn the_healthy_lab_seen_from_prometheus_is_healthy_everywhere() {
    if !support::have_root("the_healthy_lab_seen_from_prometheus_is_healthy_everywhere") {
        return;
    }
    let stack = Stack::start(&NODES);
    let (lines, fired) = run_lab(&stack, "healthy");
    let (code, pairs, summary) = cluster_json(&stack);
    assert_eq!(code, 0, "{summary}");
    // The lab's four paths both ways, nothing else.
    let mut expected = Vec::new();
    for (proto, a, b) in [
        ("vxlan", "gpu", "cp1"),
        ("vxlan", "cp1", "cp2"),
        ("ipip", "gpu", "cp1"),
        ("ipip", "gpu", "cp2"),
    ] {
        expected.push(key(a, b, proto));
        expected.push(key(b, a, proto));
        for (from, to) in [(a, b), (b, a)] {
            let pair = &pairs[&key(from, to, proto)];
            let lab = path(&lines, proto, from, to);
            assert_eq!(n(pair, "sent"), n(lab, "sent"), "{pair} {lab}");
            assert_eq!(n(pair, "received"), n(lab, "received"), "{pair} {lab}");
            assert_eq!(pair["verdict"], "healthy", "{pair}");
            assert_eq!(pair["loss"], 0.0, "{pair}");
        }
    }
    expected.sort();
    assert_eq!(pairs.keys().cloned().collect::<Vec<_>>(), expected);
    assert_eq!(summary["healthy"], true, "{summary}");
    assert_eq!(fired, BTreeSet::new(), "{}", stack.log());
}

#[test]
fn an_unreachable_prometheus_is_named_and_exits_2() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_observer"))
        .args([
            "cluster",
            "--prometheus",
            "http://127.0.0.1:1",
            "--timeout",
            "5s",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot reach http://127.0.0.1:1")
            && stderr.contains("is Prometheus running there"),
        "{stderr}"
    );
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["cluster", "--prometheus", "prometheus:9090"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("not an http:// or https:// URL"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

#[test]
fn only_the_pair_alerts_lose_their_wait_in_the_test_rules() {
    let rules = "      - alert: ObserverOneWayPair\n        for: 10m\n      - alert: ObserverTextfileStale\n        for: 5m\n";
    assert_eq!(
        with_fast_alerts(rules),
        "      - alert: ObserverOneWayPair\n        for: 3s\n      - alert: ObserverTextfileStale\n        for: 5m\n"
    );
}

/// The simulated mesh loaded into Prometheus, samples a minute and a
/// second ago: the rules' 5-minute rates see both until 4 minutes from
/// now, time enough to load 1,000 nodes and evaluate the rules once.
fn mesh_stack(mesh: &Mesh) -> Stack {
    let now = unix_now() as i64;
    Stack::with_blocks(&mesh.openmetrics(now - 60, now - 1))
}

#[test]
fn a_300_node_mesh_with_one_broken_pair_names_that_pair_and_no_other() {
    let test = "a_300_node_mesh_with_one_broken_pair_names_that_pair_and_no_other";
    if !support::have_root(test) {
        return;
    }
    let mesh = Mesh {
        nodes: 300,
        broken: (17, 242),
    };
    let stack = mesh_stack(&mesh);
    let (code, pairs, summary) = cluster_json(&stack);
    assert_eq!(code, 1, "{summary}");
    assert_eq!(summary["nodes"], 300, "{summary}");
    assert_eq!(pairs.len(), 300 * 299, "{summary}");
    let problems: Vec<(&(String, String, String), &Value)> = pairs
        .iter()
        .filter(|(_, p)| p["verdict"] != "healthy")
        .collect();
    assert_eq!(problems.len(), 1, "{summary}");
    let (pair, line) = problems[0];
    assert_eq!(pair, &key(&mesh::name(17), &mesh::name(242), "vxlan"));
    assert_eq!(line["verdict"], "one_way", "{line}");
    assert_eq!(n(line, "sent"), mesh::PACKETS, "{line}");
    assert_eq!(n(line, "received"), 0, "{line}");
    for (_, p) in pairs.iter().filter(|(k, _)| *k != pair) {
        assert_eq!(n(p, "sent"), mesh::PACKETS, "{p}");
        assert_eq!(n(p, "received"), mesh::PACKETS, "{p}");
    }

    // The pair rules record that pair alone, not 89,700 pairs: wait for
    // their first evaluation (every second, each taking seconds here).
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let recorded = |record: &str| {
        let now = unix_now();
        recorded_pairs(&stack, record, now - 60.0, now)
    };
    while recorded("observer:pair_received_packets:rate5m").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no pair recorded in 3 minutes: {}",
            stack.log()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(
        recorded("observer:pair_loss:ratio5m"),
        BTreeMap::from([(pair.clone(), 1.0)])
    );
    let sent = recorded("observer:pair_sent_packets:rate5m");
    assert_eq!(sent.keys().collect::<Vec<_>>(), [pair], "{sent:?}");
    assert!(sent[pair] > 0.0, "{sent:?}");
    assert_eq!(
        recorded("observer:pair_received_packets:rate5m"),
        BTreeMap::from([(pair.clone(), 0.0)])
    );
}

/// `cargo xtask bench` runs it (not CI): `observer cluster`'s wall time
/// and peak RSS over a mesh of 300 and of 1,000 nodes, the rules'
/// evaluation time as Prometheus reports it, Prometheus's RSS, and the
/// series one node exports, as `bench NAME VALUE UNIT` lines.
#[test]
#[ignore = "a bench: cargo xtask bench runs it"]
fn cluster_scale_bench() {
    for nodes in [300, 1_000] {
        let mesh = Mesh {
            nodes,
            broken: (1, 2),
        };
        let started = std::time::Instant::now();
        let stack = mesh_stack(&mesh);
        let loaded = started.elapsed().as_secs_f64();
        // Each group runs every second, one evaluation after the other:
        // wait for the node-pair group's first to end (at most 5 minutes).
        let group_seconds = |group: &str| -> f64 {
            stack
                .own_metrics()
                .lines()
                .filter(|l| l.starts_with("prometheus_rule_group_last_duration_seconds{"))
                .filter(|l| l.contains(&format!(";{group}\"")))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        let pair_rules_s = loop {
            let seconds = group_seconds("observer-node-pairs");
            if seconds > 0.0 || std::time::Instant::now() >= deadline {
                break seconds;
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        let node_rules_s = group_seconds("observer");
        let now = unix_now();
        let recorded = recorded_pairs(&stack, "observer:pair_loss:ratio5m", now - 30.0, now);
        // The broken pair alone (none: the samples left the rules' window).
        assert_eq!(
            recorded.into_keys().collect::<Vec<_>>(),
            [key(&mesh::name(1), &mesh::name(2), "vxlan")],
            "{nodes} nodes"
        );
        let (wall, rss_kib, code) = timed_cluster(&stack);
        assert_eq!(
            code, 1,
            "observer cluster over {nodes} nodes (its stderr is above)"
        );
        println!(
            "bench cluster_series_per_node_{nodes} {} series",
            mesh.series_per_node()
        );
        println!("bench cluster_load_{nodes} {loaded:.1} s");
        println!("bench cluster_pair_rules_eval_{nodes} {pair_rules_s:.3} s");
        println!("bench cluster_node_rules_eval_{nodes} {node_rules_s:.3} s");
        println!("bench cluster_recorded_pairs_{nodes} 1 pairs");
        println!("bench cluster_wall_{nodes} {wall:.2} s");
        println!("bench cluster_rss_{nodes} {} MiB", rss_kib / 1024);
        match support::exporter::try_rss_kib(stack.pid()) {
            Some(kib) => println!("bench cluster_prometheus_rss_{nodes} {} MiB", kib / 1024),
            None => println!("bench cluster_prometheus_rss_{nodes} exited -"),
        }
    }
}

/// `observer cluster --output json` in the stack's namespace: wall time,
/// peak RSS (KiB) and exit code. The peak comes from GNU time, whose
/// child starts small: a child of this process would start with this
/// process's RSS (the mesh's text), and wait4's maxrss would report that.
fn timed_cluster(stack: &Stack) -> (f64, u64, i32) {
    let peak = stack.dir().join("cluster.maxrss");
    let started = std::time::Instant::now();
    let status = std::process::Command::new("/usr/bin/time")
        .args(["-f", "%M", "-o"])
        .arg(&peak)
        .args(["ip", "netns", "exec", stack.netns_name()])
        .arg(env!("CARGO_BIN_EXE_observer"))
        .args(["cluster", "--prometheus", &stack.url(), "--output", "json"])
        .args(["--timeout", "600s"])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("GNU time (/usr/bin/time: cargo xtask setup installs it)");
    let wall = started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&peak).unwrap();
    // On failure GNU time writes "Command exited with non-zero status N"
    // before the figure.
    let kib = text
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("GNU time wrote {text:?}"));
    (wall, kib, status.code().unwrap_or(-1))
}

/// A command's exit code, stdout and stderr.
fn outcome(out: std::process::Output) -> (Option<i32>, String, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A store behind a gateway that wants a bearer token (nginx in front of
/// Prometheus): read with `--bearer-token-file`; a wrong token or none is
/// the gateway's 401, named, exit 2.
#[test]
fn a_store_behind_a_bearer_token_gateway_is_read_with_the_token_file() {
    let test = "a_store_behind_a_bearer_token_gateway_is_read_with_the_token_file";
    if !support::have_root(test) {
        return;
    }
    let mesh = Mesh {
        nodes: 3,
        broken: (0, 1),
    };
    let stack = mesh_stack(&mesh);
    let proxy = stack.behind_bearer_proxy("t0ken-of-the-gateway");
    let good = stack.dir().join("token");
    std::fs::write(&good, "t0ken-of-the-gateway\n").unwrap();
    let bad = stack.dir().join("bad-token");
    std::fs::write(&bad, "another\n").unwrap();
    let run = |args: &[&str]| outcome(stack.cluster_at(&proxy.url(), args));
    let (code, stdout, stderr) = run(&[
        "--bearer-token-file",
        good.to_str().unwrap(),
        "--output",
        "json",
    ]);
    assert_eq!(code, Some(1), "{stdout}{stderr}{}", proxy.log());
    assert!(
        stdout.contains(r#""from":"n0000","to":"n0001","#)
            && stdout.contains(r#""verdict":"one_way""#),
        "{stdout}"
    );
    for args in [&["--bearer-token-file", bad.to_str().unwrap()][..], &[]] {
        let (code, _, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("answered HTTP 401 (check --basic-auth-file / --bearer-token-file)"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn a_store_behind_tls_and_basic_auth_is_read_with_the_ca_and_credential_files() {
    let test = "a_store_behind_tls_and_basic_auth_is_read_with_the_ca_and_credential_files";
    if !support::have_root(test) {
        return;
    }
    let mesh = Mesh {
        nodes: 3,
        broken: (2, 0),
    };
    let now = unix_now() as i64;
    let stack = Stack::secured_with_blocks(&mesh.openmetrics(now - 240, now - 60));
    let ca = stack.dir().join("ca.pem");
    let auth = stack.dir().join("auth");
    std::fs::write(&auth, "observer:s3cret\n").unwrap();
    let (ca, auth) = (ca.to_str().unwrap(), auth.to_str().unwrap());
    let run = |args: &[&str]| outcome(stack.cluster(args));
    // CA and password: the broken pair, named.
    let (code, stdout, stderr) = run(&[
        "--ca-file",
        ca,
        "--basic-auth-file",
        auth,
        "--output",
        "json",
    ]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains(r#""from":"n0002","to":"n0000","#)
            && stdout.contains(r#""verdict":"one_way""#),
        "{stdout}"
    );
    // An hour earlier (--at, Unix seconds) no observer had exported yet:
    // named, exit 2.
    let earlier = (now - 3600).to_string();
    let (code, _, stderr) = run(&["--ca-file", ca, "--basic-auth-file", auth, "--at", &earlier]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("holds no observer_node_info in the 5m up to"),
        "{stderr}"
    );
    // Without the CA the certificate is not trusted; without the password
    // the store says 401: both named, exit 2.
    let (code, _, stderr) = run(&["--basic-auth-file", auth]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot reach https://127.0.0.1:"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["--ca-file", ca]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("answered HTTP 401 (check --basic-auth-file / --bearer-token-file)"),
        "{stderr}"
    );
}
