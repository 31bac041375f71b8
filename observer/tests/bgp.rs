//! BGP sessions from a real BIRD: two namespaces peer over a veth in an
//! iBGP mesh (AS 64512, each announcing its pod block), the observer in
//! one follows its BIRD over the control socket. Checked against birdc's
//! own answer: the session Established with exactly the one route the
//! peer announces; then the peer's BIRD stops (bgp_down raised for that
//! neighbor, with BIRD's state and error) and starts again (cleared, with
//! its duration, and a bgp_flap with the threshold at 0, cleared when the
//! re-establishment leaves its 10 s window); an absent socket
//! is reported once. The pod blocks' routes follow (checked against `ip
//! route`): b's block withdrawn is a `route_missing` for b naming the
//! block, cleared when the route is back, with a `route_outage` line of
//! the same duration; both durations, as the real node_exporter serves
//! the histograms `observer_anomaly_duration_seconds` and
//! `observer_route_outage_seconds`, equal to the JSON lines'.
//!
//! BGP at the wire: every TCP/179 segment the programs counted, by flags
//! and first BGP message, equal to tcpdump's count of the same segments
//! (its own BPF filters on the raw bytes), over a session's whole life:
//! up, the peer's BIRD stopped (a NOTIFICATION Cease / Administrative
//! Shutdown, then refused reconnects: `bgp_down` from the wire alone, no
//! BIRD socket given), up again (cleared), both stopped.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use observer::lab::bird::{Bird, MeshNode};
use observer_testkit::netns::{Netns, VethEnd, temp_path, veth_pair};
use serde_json::Value;
use support::{
    bgp_wire,
    exporter::{Exposition, NODE_EXPORTER, NodeExporter, TempDir, have_tool},
    netns::{ObserverProcess, Tcpdump},
};

const A: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
const A_BLOCK: &str = "10.65.1.0/26";
const B_BLOCK: &str = "10.65.2.0/26";

/// The `bgp` lines printed for `neighbor`.
fn bgp_lines(lines: &[Value], neighbor: Ipv4Addr) -> Vec<&Value> {
    lines
        .iter()
        .filter(|l| l["type"] == "bgp" && l["neighbor"] == neighbor.to_string())
        .collect()
}

/// The anomaly lines of `kind` for `peer` in `state` (raised, cleared).
fn anomalies(lines: &[Value], kind: &str, peer: Ipv4Addr, state: &str) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| {
            l["type"] == "anomaly"
                && l["kind"] == kind
                && l["state"] == state
                && l["peer"] == peer.to_string()
        })
        .cloned()
        .collect()
}

/// The `bgp_down` anomaly lines for `neighbor` in `state`.
fn bgp_down(lines: &[Value], neighbor: Ipv4Addr, state: &str) -> Vec<Value> {
    anomalies(lines, "bgp_down", neighbor, state)
}

/// The block routes as the `routes` lines say, after all of them: each
/// line adds or replaces its `blocks` and removes its `withdrawn`.
fn routed_blocks(lines: &[Value]) -> BTreeMap<String, Value> {
    let mut view = BTreeMap::new();
    for line in lines.iter().filter(|l| l["type"] == "routes") {
        for block in line["blocks"].as_array().unwrap() {
            view.insert(block["block"].as_str().unwrap().to_string(), block.clone());
        }
        for gone in line["withdrawn"].as_array().unwrap() {
            view.remove(gone.as_str().unwrap());
        }
    }
    view
}

/// The prefixes BIRD installed in `ns`'s main table, as `ip route` lists
/// them: the reference for the `routes` lines.
fn ip_route_bird(ns: &Netns) -> BTreeSet<String> {
    let out = ns.exec_ok(&["ip", "-j", "route", "show", "proto", "bird"]);
    let routes: Vec<Value> = serde_json::from_slice(&out.stdout).expect("ip -j route");
    routes
        .iter()
        .map(|r| r["dst"].as_str().unwrap().to_string())
        .collect()
}

/// `BGP state` and imported routes as birdc prints them for `protocol`.
fn birdc_view(bird: &Bird, protocol: &str) -> (String, u64) {
    let text = bird
        .birdc(&["show", "protocols", "all", protocol])
        .expect("birdc");
    let state = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("BGP state:"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let imported = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Routes:"))
        .filter_map(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    (state, imported)
}

#[test]
fn bird_sessions_are_followed_and_a_lost_peer_is_bgp_down() {
    let test = "bird_sessions_are_followed_and_a_lost_peer_is_bgp_down";
    if !support::have_root(test) || !have_tool(test, NODE_EXPORTER, "prometheus-node-exporter") {
        return;
    }
    let (a, b) = (Netns::new("bga"), Netns::new("bgb"));
    veth_pair(
        &a,
        &VethEnd::new("va", "02:00:00:00:63:01", &A.to_string()),
        &b,
        &VethEnd::new("vb", "02:00:00:00:63:02", &B.to_string()),
        24,
    );
    let node_a = MeshNode {
        address: A,
        block: A_BLOCK.into(),
        peers: vec![B],
        rejects: Vec::new(),
        tunnel: None,
    };
    let node_b = MeshNode {
        address: B,
        block: B_BLOCK.into(),
        peers: vec![A],
        rejects: Vec::new(),
        tunnel: None,
    };
    let bird_a = Bird::start_in(a.name(), &node_a).expect("starting BIRD in a");
    let bird_b = Bird::start_in(b.name(), &node_b).expect("starting BIRD in b");
    let protocol = MeshNode::protocol_name(B);
    let absent = temp_path("nobird", "ctl");
    let socket = bird_a.socket().display().to_string();
    let textfile_dir = TempDir::new("bgp");
    let observer = ObserverProcess::start(
        Some(a.name()),
        &["va"],
        &[
            "--bird-socket",
            &socket,
            "--bird-socket",
            &absent.display().to_string(),
            // Any re-establishment is a flap here: b's restart is one,
            // which leaves the window 10 s later.
            "--bgp-flaps",
            "0",
            "--bgp-flap-window",
            "10s",
            "--textfile-dir",
            &textfile_dir.path().display().to_string(),
        ],
    );
    let node_exporter = NodeExporter::start(&a, textfile_dir.path());

    // Established, with the one route b announces, in the kernel.
    let up = observer.wait_for_lines(|lines| {
        bgp_lines(lines, B)
            .last()
            .is_some_and(|l| l["bgp_state"] == "Established" && l["routes_imported"] == 1)
            && routed_blocks(lines).contains_key(B_BLOCK)
    });
    let lines = observer.lines();
    assert!(
        up,
        "no Established bgp line for {B}, or {B_BLOCK} not routed: {:?} {:?}",
        bgp_lines(&lines, B),
        routed_blocks(&lines)
    );
    let last = bgp_lines(&lines, B).last().copied().cloned().unwrap();
    assert_eq!(
        (
            last["protocol"].as_str(),
            last["socket"].as_str(),
            last["neighbor_as"].as_u64()
        ),
        (Some(protocol.as_str()), Some(socket.as_str()), Some(64512))
    );
    assert_eq!(
        birdc_view(&bird_a, &protocol),
        ("Established".to_string(), 1),
        "birdc's own view"
    );
    assert_eq!(bgp_down(&lines, B, "raised"), Vec::<Value>::new());
    let blocks = routed_blocks(&lines);
    assert_eq!(
        blocks.keys().cloned().collect::<BTreeSet<_>>(),
        ip_route_bird(&a),
        "the routes lines against ip route"
    );
    assert_eq!(
        blocks[A_BLOCK],
        serde_json::json!({"block": A_BLOCK, "origin": "bird", "blackhole": true, "next_hops": []}),
        "a's own block: the blackhole"
    );
    assert_eq!(
        blocks[B_BLOCK],
        serde_json::json!({
            "block": B_BLOCK, "origin": "bird", "blackhole": false,
            "next_hops": [{"device": "va", "gateway": B.to_string(), "encap": "none", "node": B.to_string()}]
        })
    );

    // b's BIRD stops: a's session leaves Established, bgp_down for b.
    bird_b.stop();
    let raised = observer.wait_for_lines(|lines| !bgp_down(lines, B, "raised").is_empty());
    let lines = observer.lines();
    assert!(raised, "no bgp_down for {B}: {:?}", bgp_lines(&lines, B));
    let anomaly = &bgp_down(&lines, B, "raised")[0];
    assert_eq!(anomaly["evidence"]["protocol"], protocol.as_str());
    assert_ne!(anomaly["evidence"]["bgp_state"], "Established");
    assert!(
        anomaly["evidence"]["last_error"].is_string(),
        "BIRD's last error as evidence: {anomaly}"
    );
    let down_line = bgp_lines(&lines, B)
        .into_iter()
        .find(|l| l["bgp_state"] != "Established")
        .cloned()
        .expect("a bgp line leaving Established");
    assert_eq!(down_line["routes_imported"], 0, "b's block withdrawn");
    // ... from the kernel too: route_missing for b, naming its block.
    let missing =
        observer.wait_for_lines(|lines| !anomalies(lines, "route_missing", B, "raised").is_empty());
    let lines = observer.lines();
    assert!(missing, "no route_missing for {B}");
    assert!(!routed_blocks(&lines).contains_key(B_BLOCK));
    assert!(
        !ip_route_bird(&a).contains(B_BLOCK),
        "ip route still has it"
    );
    let raised = &anomalies(&lines, "route_missing", B, "raised")[0];
    assert_eq!(raised["evidence"]["blocks"], serde_json::json!([B_BLOCK]));
    assert_eq!(
        raised["evidence"]["last_route"],
        format!("via {B} dev va proto bird")
    );
    assert_eq!(raised["evidence"]["bgp_protocol"], protocol.as_str());

    // b's BIRD is back: Established again, bgp_down cleared with its duration.
    bird_b.restart().expect("restarting BIRD in b");
    // Established comes before b's UPDATE: wait for its route too.
    let cleared = observer.wait_for_lines(|lines| {
        !bgp_down(lines, B, "cleared").is_empty()
            && !anomalies(lines, "route_missing", B, "cleared").is_empty()
            && bgp_lines(lines, B)
                .last()
                .is_some_and(|l| l["bgp_state"] == "Established" && l["routes_imported"] == 1)
    });
    assert!(
        cleared,
        "bgp_down for {B} not cleared, or b's route not back"
    );
    // The recovery times as the real node_exporter serves them: the
    // histograms hold the outage the JSON lines report (waited for: the
    // file is written with the interval's lines).
    let histograms_scraped = || {
        let lines = observer.lines();
        let cleared = bgp_down(&lines, B, "cleared");
        let outage = lines.iter().find(|l| l["type"] == "route_outage");
        let (Some(cleared), Some(outage)) = (cleared.first(), outage) else {
            return Err("no cleared bgp_down or route_outage line yet".to_string());
        };
        let body = node_exporter.scrape();
        let scraped = Exposition::parse(&body);
        let bgp_down = [("kind", "bgp_down")];
        // The lines round to 10 ms (anomalies) and 1 ms (outages).
        let round = |v: Option<f64>, per_s: f64| v.map(|v| (v * per_s).round() / per_s);
        let got = (
            scraped.value("observer_anomaly_duration_seconds_count", &bgp_down),
            round(
                scraped.value("observer_anomaly_duration_seconds_sum", &bgp_down),
                100.0,
            ),
            scraped.value("observer_route_outage_seconds_count", &[]),
            round(
                scraped.value("observer_route_outage_seconds_sum", &[]),
                1000.0,
            ),
            scraped.value(
                "observer_anomaly_duration_seconds_bucket",
                &[("kind", "bgp_down"), ("le", "5")],
            ),
            scraped.value(
                "observer_anomaly_duration_seconds_bucket",
                &[("kind", "bgp_down"), ("le", "60")],
            ),
        );
        let want = (
            Some(1.0),
            cleared["duration_s"].as_f64(),
            Some(1.0),
            outage["duration_s"].as_f64(),
            // Raised after a whole window (5 s), it lasted longer.
            Some(0.0),
            Some(1.0),
        );
        if got == want {
            Ok(())
        } else {
            Err(format!("scraped {got:?}, JSON says {want:?}\n{body}"))
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut last = histograms_scraped();
    while last.is_err() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
        last = histograms_scraped();
    }
    if let Err(e) = last {
        panic!("the histograms as node_exporter serves them: {e}");
    }
    drop(node_exporter);
    // The flap leaves its window: bgp_flap cleared.
    let flap_cleared = observer.wait_for_lines(|lines| {
        lines
            .iter()
            .any(|l| l["type"] == "anomaly" && l["kind"] == "bgp_flap" && l["state"] == "cleared")
    });
    assert!(flap_cleared, "bgp_flap for {B} not cleared");
    let run = observer.stop_ok();
    let cleared = bgp_down(&run.lines, B, "cleared");
    assert_eq!(cleared.len(), 1, "{cleared:?}");
    assert_eq!(bgp_down(&run.lines, B, "raised").len(), 1);
    // Raised after a whole window (5 s) down, it lasted at least that.
    assert!(
        cleared[0]["duration_s"].as_f64().unwrap() >= 5.0,
        "{}",
        cleared[0]
    );
    // The route's outage: one, as long as the route_missing it raised
    // (both count from the read that first missed the route).
    let outages: Vec<&Value> = run
        .lines
        .iter()
        .filter(|l| l["type"] == "route_outage")
        .collect();
    assert_eq!(outages.len(), 1, "{outages:?}");
    assert_eq!(
        (outages[0]["block"].as_str(), outages[0]["node"].as_str()),
        (Some(B_BLOCK), Some(B.to_string().as_str()))
    );
    let route_cleared = anomalies(&run.lines, "route_missing", B, "cleared");
    assert_eq!(route_cleared.len(), 1, "{route_cleared:?}");
    let (outage_s, missing_s) = (
        outages[0]["duration_s"].as_f64().unwrap(),
        route_cleared[0]["duration_s"].as_f64().unwrap(),
    );
    assert!(outage_s >= 5.0, "{}", outages[0]);
    assert!(
        (outage_s - missing_s).abs() < 0.2,
        "outage {outage_s} s, route_missing {missing_s} s"
    );
    assert!(routed_blocks(&run.lines).contains_key(B_BLOCK));
    assert_eq!(
        routed_blocks(&run.lines)
            .keys()
            .cloned()
            .collect::<BTreeSet<_>>(),
        ip_route_bird(&a)
    );
    let final_line = bgp_lines(&run.lines, B).last().copied().cloned().unwrap();
    assert_eq!(
        (
            final_line["bgp_state"].as_str(),
            final_line["routes_imported"].as_u64()
        ),
        (Some("Established"), Some(1))
    );

    // b's restart re-established the session once: a bgp_flap (the
    // session's first sighting, already up, is not one).
    let flaps: Vec<&Value> = run
        .lines
        .iter()
        .filter(|l| l["type"] == "anomaly" && l["kind"] == "bgp_flap" && l["state"] == "raised")
        .collect();
    assert_eq!(flaps.len(), 1, "{flaps:?}");
    assert_eq!(
        (
            flaps[0]["peer"].as_str(),
            flaps[0]["evidence"]["re_established"].as_u64()
        ),
        (Some(B.to_string().as_str()), Some(1))
    );

    // The absent socket: said once, the rest kept working.
    let absent_lines: Vec<&Value> = run
        .lines
        .iter()
        .filter(|l| l["type"] == "bird_socket" && l["socket"] == absent.display().to_string())
        .collect();
    assert_eq!(absent_lines.len(), 1, "{absent_lines:?}");
    assert_eq!(absent_lines[0]["status"], "absent");
}

#[test]
fn bgp_messages_at_the_wire_match_tcpdump_and_a_lost_session_is_bgp_down() {
    let test = "bgp_messages_at_the_wire_match_tcpdump_and_a_lost_session_is_bgp_down";
    if !support::have_root(test) {
        return;
    }
    let (a, b) = (Netns::new("bwa"), Netns::new("bwb"));
    veth_pair(
        &a,
        &VethEnd::new("va", "02:00:00:00:64:01", &A.to_string()),
        &b,
        &VethEnd::new("vb", "02:00:00:00:64:02", &B.to_string()),
        24,
    );
    let node = |address, block: &str, peer| MeshNode {
        address,
        block: block.into(),
        peers: vec![peer],
        rejects: Vec::new(),
        tunnel: None,
    };
    // The observer and tcpdump first: both see the session from its SYN.
    // No BIRD socket: the session is judged from the wire alone.
    let observer = ObserverProcess::start(Some(a.name()), &["va"], &[]);
    let tcpdump = Tcpdump::start(&a, "va", "tcp port 179");
    let bird_a = Bird::start_in(a.name(), &node(A, A_BLOCK, B)).expect("starting BIRD in a");
    let bird_b = Bird::start_in(b.name(), &node(B, B_BLOCK, A)).expect("starting BIRD in b");
    let wire =
        |lines: &[Value], direction: &str| bgp_wire::last_line(lines, "va", direction, B.into());
    // Up: OPENs both ways, then KEEPALIVEs (every 2 s).
    let up = observer.wait_for_lines(|lines| {
        wire(lines, "rx")
            .is_some_and(|l| l["open"].as_u64() >= Some(1) && l["keepalive"].as_u64() >= Some(2))
    });
    assert!(
        up,
        "no session at the wire: {:?}",
        wire(&observer.lines(), "rx")
    );

    // b's BIRD stops: its NOTIFICATION, then a's reconnects refused.
    bird_b.stop();
    let down = observer.wait_for_lines(|lines| !bgp_down(lines, B, "raised").is_empty());
    assert!(down, "no bgp_down from the wire for {B}");
    let lines = observer.lines();
    let raised = &bgp_down(&lines, B, "raised")[0];
    assert_eq!(raised["evidence"]["source"], "wire", "{raised}");
    assert_eq!(
        raised["evidence"]["ended_by"], "NOTIFICATION Cease/Administrative Shutdown from the peer",
        "{raised}"
    );
    assert_eq!(raised["evidence"]["hold_time_s"], 6, "both OPENs say 6 s");

    // Back: cleared once the peer is heard again.
    bird_b.restart().expect("restarting BIRD in b");
    let cleared = observer.wait_for_lines(|lines| !bgp_down(lines, B, "cleared").is_empty());
    assert!(cleared, "bgp_down for {B} not cleared");
    // Heard is not yet Established: a's BIRD says when it is, so that
    // a's stop ends the session with a NOTIFICATION.
    let protocol = MeshNode::protocol_name(B);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while birdc_view(&bird_a, &protocol).0 != "Established" {
        assert!(
            std::time::Instant::now() < deadline,
            "a's session with {B} not Established again"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    // Both stop; nothing moves on TCP/179 after that.
    bird_a.stop();
    bird_b.stop();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let capture = tcpdump.stop_after(0);
    let run = observer.stop_ok();
    assert_eq!(bgp_down(&run.lines, B, "raised").len(), 1);

    for (direction, host) in [
        ("rx", format!("src host {B}")),
        ("tx", format!("dst host {B}")),
    ] {
        let line = wire(&run.lines, direction).unwrap_or_else(|| panic!("no {direction} line"));
        let reference: BTreeMap<&str, u64> =
            bgp_wire::reference(&capture, &host).into_iter().collect();
        let observed: BTreeMap<&str, u64> = reference
            .keys()
            .map(|k| (*k, line[*k].as_u64().unwrap_or(u64::MAX)))
            .collect();
        assert_eq!(
            observed, reference,
            "{direction}: observer vs tcpdump; {line}"
        );
        // The session went through: opened twice (more when the two BIRDs'
        // connections collided), KEEPALIVEs between.
        assert!(observed["open"] >= 2, "{direction}: {line}");
        assert!(observed["keepalive"] >= 2, "{direction}: {line}");
        // b's stop ended it with a NOTIFICATION in a segment of its own
        // (the wire's bgp_down above named it). a's may follow a KEEPALIVE
        // in one segment, where only the first message is read.
        if direction == "rx" {
            assert!(observed["notification"] >= 1, "{line}");
            assert_eq!(
                line["last_notification"],
                serde_json::json!({"code": 6, "subcode": 2, "name": "Cease/Administrative Shutdown"}),
            );
        }
        assert_eq!(line["hold_time_s"], 6);
    }
}
