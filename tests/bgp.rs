//! BGP sessions from a real BIRD: two namespaces peer over a veth in an
//! iBGP mesh (AS 64512, each announcing its pod block), the observer in
//! one follows its BIRD over the control socket. Checked against birdc's
//! own answer: the session Established with exactly the one route the
//! peer announces; then the peer's BIRD stops (bgp_down raised for that
//! neighbor, with BIRD's state and error) and starts again (cleared, with
//! its duration, and a bgp_flap with the threshold at 0); an absent socket
//! is reported once.

mod support;

use std::net::Ipv4Addr;

use observer_testkit::{
    bird::{Bird, MeshNode},
    netns::{Netns, VethEnd, temp_path, veth_pair},
};
use serde_json::Value;
use support::netns::ObserverProcess;

const A: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

/// The `bgp` lines printed for `neighbor`.
fn bgp_lines(lines: &[Value], neighbor: Ipv4Addr) -> Vec<&Value> {
    lines
        .iter()
        .filter(|l| l["type"] == "bgp" && l["neighbor"] == neighbor.to_string())
        .collect()
}

/// The `bgp_down` anomaly lines for `neighbor` in `state` (raised, cleared).
fn bgp_down(lines: &[Value], neighbor: Ipv4Addr, state: &str) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| {
            l["type"] == "anomaly"
                && l["kind"] == "bgp_down"
                && l["state"] == state
                && l["peer"] == neighbor.to_string()
        })
        .cloned()
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
    if !support::have_root(test) {
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
        block: "10.65.1.0/26".into(),
        peers: vec![B],
    };
    let node_b = MeshNode {
        address: B,
        block: "10.65.2.0/26".into(),
        peers: vec![A],
    };
    let bird_a = Bird::start(&a, &node_a).expect("starting BIRD in a");
    let bird_b = Bird::start(&b, &node_b).expect("starting BIRD in b");
    let protocol = MeshNode::protocol_name(B);
    let absent = temp_path("nobird", "ctl");
    let socket = bird_a.socket().display().to_string();
    let observer = ObserverProcess::start(
        Some(a.name()),
        &["va"],
        &[
            "--bird-socket",
            &socket,
            "--bird-socket",
            &absent.display().to_string(),
            // Any re-establishment is a flap here: b's restart is one.
            "--bgp-flaps",
            "0",
        ],
    );

    // Established, with the one route b announces.
    let up = observer.wait_for_lines(|lines| {
        bgp_lines(lines, B)
            .last()
            .is_some_and(|l| l["bgp_state"] == "Established" && l["routes_imported"] == 1)
    });
    let lines = observer.lines();
    assert!(
        up,
        "no Established bgp line for {B}: {:?}",
        bgp_lines(&lines, B)
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

    // b's BIRD is back: Established again, bgp_down cleared with its duration.
    bird_b.restart().expect("restarting BIRD in b");
    // Established comes before b's UPDATE: wait for its route too.
    let cleared = observer.wait_for_lines(|lines| {
        !bgp_down(lines, B, "cleared").is_empty()
            && bgp_lines(lines, B)
                .last()
                .is_some_and(|l| l["bgp_state"] == "Established" && l["routes_imported"] == 1)
    });
    let run = observer.stop_ok();
    assert!(
        cleared,
        "bgp_down for {B} not cleared, or b's route not back"
    );
    let cleared = bgp_down(&run.lines, B, "cleared");
    assert_eq!(cleared.len(), 1, "{cleared:?}");
    assert_eq!(bgp_down(&run.lines, B, "raised").len(), 1);
    // Raised after a whole window (5 s) down, it lasted at least that.
    assert!(
        cleared[0]["duration_s"].as_f64().unwrap() >= 5.0,
        "{}",
        cleared[0]
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
