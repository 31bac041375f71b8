//! Each anomaly kind produced in network namespaces, with the observer
//! attached to node A of the two-node overlay (`Pair::calico` in
//! observer_testkit::pair) and real kernel behaviour or frames sent on the
//! wire from B's side.
//! `one_way` and the 30-second healthy run are in tests/diagnose.rs; the
//! whole incident (SNAT by a real router) is in tests/lab.rs.

mod support;

use std::collections::BTreeSet;

use observer_testkit::pair::{
    A_IP, A_MAC_BYTES, B_IP, B_MAC_BYTES, NODE_A, NODE_B, Pair, ping_pod,
};
use serde_json::Value;
use support::{
    calico,
    frames::{addr, icmp_eth_frame, icmp_packet, ip_frame, set_macs, vxlan_frame},
    netns::{ObserverProcess, Tcpdump, send_frames},
};

/// Starts the observer on A's underlay with a short anomaly window.
fn observe(overlay: &Pair) -> ObserverProcess {
    ObserverProcess::start(
        Some(overlay.a.name()),
        &["va"],
        &["--anomaly-window", "2s", "--allow-set-refresh", "200ms"],
    )
}

/// (state, kind, peer) of every anomaly line, in order.
fn anomaly_events(lines: &[Value]) -> Vec<(String, String, String)> {
    lines
        .iter()
        .filter(|l| l["type"] == "anomaly")
        .map(|l| {
            (
                l["state"].as_str().unwrap().to_string(),
                l["kind"].as_str().unwrap().to_string(),
                l["peer"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Kinds raised for `peer`.
fn raised_kinds(lines: &[Value], peer: &str) -> BTreeSet<String> {
    anomaly_events(lines)
        .into_iter()
        .filter(|(state, _, p)| state == "raised" && p == peer)
        .map(|(_, kind, _)| kind)
        .collect()
}

/// The last line about (kind, peer): its latest evidence.
fn last<'a>(lines: &'a [Value], kind: &str, peer: &str) -> &'a Value {
    lines
        .iter()
        .rev()
        .find(|l| l["type"] == "anomaly" && l["kind"] == kind && l["peer"] == peer)
        .unwrap_or_else(|| panic!("no {kind} line for {peer}"))
}

/// Sends `frame` `n` times from B's side of the wire to A.
fn send_to_a(overlay: &Pair, mut frame: Vec<u8>, n: u32) {
    set_macs(&mut frame, A_MAC_BYTES, B_MAC_BYTES);
    send_frames(&overlay.b, "vb", vec![(frame, n)]);
}

/// Waits until an anomaly line satisfies `done`.
fn wait_for(observer: &ObserverProcess, what: &str, done: impl Fn(&[Value]) -> bool) {
    assert!(
        observer.wait_for_lines(|lines| done(lines)),
        "{what}: {:#?}",
        anomaly_events(&observer.lines())
    );
}

#[test]
fn snat_unknown_peer_allow_set_drop_and_drop_spike_from_a_rewritten_source() {
    if !support::have_root("snat_unknown_peer_allow_set_drop_and_drop_spike") {
        return;
    }
    let overlay = Pair::new("ans");
    overlay.calico();
    // A accepts VXLAN only from node B, as Calico's rules do.
    calico::ipset_create(&overlay.a, calico::VXLAN_SET, &[B_IP]);
    calico::iptables_vxlan_rules(&overlay.a);
    let observer = observe(&overlay);
    // What a router that source-NATs VXLAN delivers: B's pod packet, with
    // the router's address as outer source. 40 frames at once: a burst.
    let router = "198.18.0.244";
    const N: u32 = 40;
    let inner = icmp_eth_frame(addr(NODE_B.pod), addr(NODE_A.pod));
    send_to_a(
        &overlay,
        vxlan_frame(addr(router), addr(A_IP), 4096, &inner),
        N,
    );
    wait_for(&observer, "four kinds raised", |lines| {
        raised_kinds(lines, router).len() == 4
    });
    let run = observer.stop();
    let lines = &run.lines;
    assert_eq!(
        raised_kinds(lines, router),
        BTreeSet::from(
            [
                "snat_suspected",
                "unknown_peer",
                "allow_set_drop",
                "drop_spike"
            ]
            .map(String::from)
        )
    );
    // Nothing about node B itself.
    assert!(raised_kinds(lines, B_IP).is_empty());
    let snat = last(lines, "snat_suspected", router);
    assert_eq!(snat["evidence"]["real_node"], B_IP);
    assert_eq!(snat["evidence"]["inner_source"], NODE_B.pod);
    assert_eq!(snat["evidence"]["pod_block"], NODE_B.block);
    assert_eq!(snat["proto"], "vxlan");
    // Every one of the N packets: flagged by the classifier, and dropped by
    // Calico's rule, whose counter says the same.
    let drop = last(lines, "allow_set_drop", router);
    assert_eq!(drop["evidence"]["calico_allow_set"], N, "{drop}");
    assert_eq!(drop["evidence"]["netfilter_drop"], N, "{drop}");
    assert_eq!(
        calico::iptables_counter(&overlay.a, calico::VXLAN_DROP_RULE).0,
        N as u64
    );
    let spike = last(lines, "drop_spike", router);
    // The classifier's and the kernel's counts are the same packets.
    assert_eq!(spike["evidence"]["drops"], N, "{spike}");
    let unknown = last(lines, "unknown_peer", router);
    assert_eq!(unknown["evidence"]["in_allow_set"], false);
    assert_eq!(unknown["evidence"]["known_nodes"], 1);
}

#[test]
fn encap_mismatch_when_a_node_sends_ipip_but_routes_say_vxlan() {
    if !support::have_root("encap_mismatch_when_a_node_sends_ipip_but_routes_say_vxlan") {
        return;
    }
    let overlay = Pair::new("anm");
    overlay.calico();
    let observer = observe(&overlay);
    // B switched to IPIP (the pool changed on its side), A's routes to B
    // still go via vxlan.calico. (This kernel has no ipip device: the IPIP
    // packets are sent as frames.)
    const N: u32 = 12;
    let inner = icmp_packet(addr(NODE_B.pod), addr(NODE_A.pod));
    let frame = ip_frame(addr(B_IP), addr(A_IP), 4, &inner);
    send_to_a(&overlay, frame, N);
    wait_for(&observer, "encap_mismatch raised", |lines| {
        raised_kinds(lines, B_IP).contains("encap_mismatch")
    });
    let run = observer.stop();
    let m = last(&run.lines, "encap_mismatch", B_IP);
    assert_eq!(m["proto"], "ipip");
    assert_eq!(m["evidence"]["on_wire"], "ipip");
    assert_eq!(
        m["evidence"]["routes_prescribe"],
        serde_json::json!(["vxlan"])
    );
    assert_eq!(
        m["evidence"]["devices"],
        serde_json::json!(["vxlan.calico"])
    );
    assert_eq!(m["evidence"]["received"], N);
    assert_eq!(m["evidence"]["sent"], 0);
    // B is a node: not unknown, not SNAT.
    let kinds = raised_kinds(&run.lines, B_IP);
    assert!(!kinds.contains("unknown_peer") && !kinds.contains("snat_suspected"));
}

#[test]
fn mtu_from_outer_fragments_of_a_too_small_underlay() {
    if !support::have_root("mtu_from_outer_fragments_of_a_too_small_underlay") {
        return;
    }
    let overlay = Pair::new("anu");
    overlay.calico();
    // B's underlay is smaller than its tunnel MTU plus VXLAN's 50 bytes:
    // B's kernel fragments the outer packets of big pod packets (vxlan
    // sends without DF by default).
    overlay.b.ip(&["link", "set", "vb", "mtu", "1400"]);
    let observer = observe(&overlay);
    let capture = Tcpdump::start(
        &overlay.a,
        "va",
        &format!("src host {B_IP} and udp dst port 4789"),
    );
    const PINGS: u32 = 6;
    let mut big = std::process::Command::new("ip")
        .args(["netns", "exec", overlay.b.name(), "ping", "-q", "-i", "0.2"])
        .args([
            "-c",
            &PINGS.to_string(),
            "-s",
            "1380",
            "-I",
            NODE_B.pod,
            NODE_A.pod,
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    big.wait().unwrap();
    wait_for(&observer, "mtu raised", |lines| {
        raised_kinds(lines, B_IP).contains("mtu")
    });
    // Small pings are fine both ways: no one_way, only mtu.
    ping_pod(&overlay.b, &NODE_B, &NODE_A, 3).wait().unwrap();
    // tcpdump's count of first fragments (MF set, offset 0: the UDP header
    // is there). After the first one, B's kernel learns the path MTU and
    // fragments the inner packets instead, so there are fewer than pings.
    let first_fragments = capture
        .stop_after(PINGS as usize)
        .count("ip[6:2] & 0x3fff == 0x2000");
    assert!(first_fragments >= 1);
    let run = observer.stop();
    assert_eq!(
        raised_kinds(&run.lines, B_IP),
        BTreeSet::from(["mtu".to_string()])
    );
    let m = last(&run.lines, "mtu", B_IP);
    // Only first fragments carry the VXLAN header; later ones have no UDP
    // header and cannot be told from other traffic.
    assert_eq!(m["evidence"]["outer_fragments"], first_fragments, "{m}");
    assert_eq!(m["evidence"]["over_mtu"], 0);
    assert_eq!(m["evidence"]["overhead_bytes"], 50);
    assert!(m["hint"].as_str().unwrap().contains("MTU"));
}

#[test]
fn stale_route_and_route_conflict_from_the_data_planes_own_entries() {
    if !support::have_root("stale_route_and_route_conflict_from_the_data_planes_own_entries") {
        return;
    }
    let overlay = Pair::new("asr");
    overlay.calico();
    // A accepts VXLAN from nodes B and .9; BIRD routes .9's block.
    let gone = "198.18.0.9";
    let gone_block = "10.66.9.0/26";
    calico::ipset_create(&overlay.a, calico::VXLAN_SET, &[B_IP, gone]);
    overlay.a.exec_ok(&[
        "ip", "route", "add", gone_block, "via", gone, "dev", "va", "proto", "bird",
    ]);
    let observer = observe(&overlay);
    // The allow-set was read with .9 in it (a node)...
    wait_for(&observer, "the allow-set read", |lines| {
        lines
            .iter()
            .any(|l| l["type"] == "allow_set" && l["prefixes"] == 2)
    });
    // ... then .9 leaves the cluster: out of the allow-set, its route kept.
    calico::ipset_del(&overlay.a, calico::VXLAN_SET, gone);
    wait_for(&observer, "stale_route raised", |lines| {
        raised_kinds(lines, gone).contains("stale_route")
    });
    let stale = last(&observer.lines(), "stale_route", gone).clone();
    assert_eq!(stale["evidence"]["blocks"], serde_json::json!([gone_block]));
    assert_eq!(stale["evidence"]["allow_set_active"], true);

    // It is a node again: in the allow-set, no longer stale.
    calico::ipset_add(&overlay.a, calico::VXLAN_SET, gone);
    wait_for(&observer, "stale_route cleared", |lines| {
        anomaly_events(lines).contains(&("cleared".into(), "stale_route".into(), gone.into()))
    });

    // A blackhole beside the route of B's block: two owners.
    let blackhole = |op: &str| {
        overlay.a.exec_ok(&[
            "ip",
            "route",
            op,
            "blackhole",
            NODE_B.block,
            "proto",
            "bird",
            "metric",
            "100",
        ]);
    };
    blackhole("add");
    wait_for(&observer, "route_conflict raised", |lines| {
        raised_kinds(lines, B_IP).contains("route_conflict")
    });
    let conflict = last(&observer.lines(), "route_conflict", B_IP).clone();
    assert_eq!(
        conflict["evidence"]["blocks"],
        serde_json::json!([NODE_B.block])
    );
    blackhole("del");
    wait_for(&observer, "route_conflict cleared", |lines| {
        anomaly_events(lines).contains(&("cleared".into(), "route_conflict".into(), B_IP.into()))
    });
    let run = observer.stop();
    // Exactly these, once each; B (in the allow-set) was never stale.
    let events: Vec<(String, String, String)> = anomaly_events(&run.lines)
        .into_iter()
        .filter(|(_, kind, _)| kind == "stale_route" || kind == "route_conflict")
        .collect();
    let e = |state: &str, kind: &str, peer: &str| {
        (state.to_string(), kind.to_string(), peer.to_string())
    };
    assert_eq!(
        events,
        vec![
            e("raised", "stale_route", gone),
            e("cleared", "stale_route", gone),
            e("raised", "route_conflict", B_IP),
            e("cleared", "route_conflict", B_IP),
        ]
    );
}
