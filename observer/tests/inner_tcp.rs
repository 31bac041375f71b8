//! End-to-end tests of inner TCP health: real TCP connections from a pod
//! behind node A to a server on node B's pod address, through Calico's
//! VXLAN overlay (`support::pods`), counted by the observer on A's
//! underlay veth and by tcpdump on the same veth.
//!
//! - SYN-ACKs dropped on B (iptables): the observer counts exactly the
//!   SYNs tcpdump sees leave A, no SYN-ACK back, and raises
//!   `tcp_syn_unanswered`; an answered connection raises nothing.
//! - The pod's MTU (1500) above the tunnel's (vxlan.calico, 1450) without
//!   MSS clamping: the SYN's MSS (1460) makes 1,550-byte packets on a
//!   1,500-byte underlay, `mss_exceeds_tunnel`; clamping (`TCPMSS
//!   --clamp-mss-to-pmtu`) makes the next SYN's MSS 1410, which fits, and
//!   the anomaly clears.
//! - Checksums: crafted VXLAN SYNs from B with a wrong inner TCP checksum,
//!   sent from a raw socket, raise `bad_checksum` with their exact count;
//!   right ones, and the real connections above (whose segments cross the
//!   veth with their checksums still pending, offloaded), never do.

mod support;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use observer_testkit::pair::B_IP;
use serde_json::Value;
use support::{
    calico::{final_snapshot, iptables_counter},
    frames::{TCP_SYN, TCP_SYN_ACK},
    netns::{Netns, ObserverRun, Tcpdump, in_netns},
    pods::{Lab, POD, connect_from, drop_syn_acks, listen_on_b_pod, syn_from_b_pod, tcp_of},
};

/// tcpdump's filter for VXLAN frames (outer IPv4 without options, UDP
/// 4789) whose inner IPv4 packet (without options) is TCP with `flags` of
/// SYN and ACK: offsets from the UDP header: 8 UDP + 8 VXLAN + 14 inner
/// Ethernet, then the inner IPv4 header (protocol at 9) and TCP's flags
/// at 20 + 13.
fn vxlan_tcp(flags: u8) -> String {
    format!("udp port 4789 and udp[30 + 9] == 6 and udp[30 + 33] & 0x12 == {flags:#04x}")
}

/// Pod P sends `bytes` to B's `listener` (at `addr`) over one connection,
/// through the overlay: what B read.
fn transfer_from_pod(pod: &Netns, listener: &TcpListener, addr: SocketAddr, bytes: usize) -> usize {
    let server = listener.try_clone().expect("listener");
    let reader = std::thread::spawn(move || {
        let (mut stream, _) = server.accept().expect("accept on B");
        let mut read = Vec::new();
        stream.read_to_end(&mut read).expect("read on B");
        read.len()
    });
    in_netns(pod.name(), move || {
        let mut stream =
            TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        stream
            .write_all(&vec![0x5a; bytes])
            .expect("send from the pod");
    });
    reader.join().expect("reader")
}

/// Packets of the final snapshot's drop lines on `iface` for B with
/// `reason`.
fn flagged(run: &ObserverRun, iface: &str, reason: &str) -> u64 {
    final_snapshot(run)
        .iter()
        .filter(|l| {
            l["type"] == "drop" && l["iface"] == iface && l["peer"] == B_IP && l["reason"] == reason
        })
        .map(|l| l["packets"].as_u64().unwrap())
        .sum()
}

/// A real connection's segments are never flagged for their checksums
/// (their inner checksums cross the veth still pending, offloaded, and
/// vxlan computes the outer one, `udpcsum`): no `bad_*_checksum` drop
/// line, no `bad_checksum` anomaly.
fn assert_checksums_clean(run: &ObserverRun, iface: &str) {
    for reason in ["bad_inner_checksum", "bad_outer_checksum"] {
        assert_eq!(flagged(run, iface, reason), 0, "{reason}: {:#?}", run.lines);
    }
    assert!(anomalies(run, "bad_checksum", "raised").is_empty());
}

/// Anomaly lines of `kind` about B in `state`.
fn anomalies<'a>(run: &'a ObserverRun, kind: &str, state: &str) -> Vec<&'a Value> {
    run.lines
        .iter()
        .filter(|l| {
            l["type"] == "anomaly" && l["kind"] == kind && l["state"] == state && l["peer"] == B_IP
        })
        .collect()
}

#[test]
fn unanswered_syns_are_counted_as_tcpdump_sees_them_and_raise_tcp_syn_unanswered() {
    if !support::have_root("unanswered_syns_raise_tcp_syn_unanswered") {
        return;
    }
    let lab = Lab::new("itsyn");
    let (a, b) = (&lab.pair.a, &lab.pair.b);
    let iface = lab.pair.a_iface();
    let (_listener, addr) = listen_on_b_pod(b);
    let observer = lab.observe_with(&["--anomaly-window", "20s"]);
    let tcpdump = Tcpdump::start(a, iface, "udp port 4789");

    // Answered: one SYN out, one SYN-ACK back.
    assert!(connect_from(&lab.pod, addr, Duration::from_secs(5)));
    // Then B's SYN-ACKs are dropped as they leave its socket.
    drop_syn_acks(b, "observer drops SYN-ACKs");
    // The kernel retries the SYN (1 s apart, then doubling, from 6.5 on;
    // doubling from 1 s before): tcpdump counts them.
    assert!(!connect_from(&lab.pod, addr, Duration::from_secs(8)));
    let dropped = iptables_counter(b, "observer drops SYN-ACKs").0;
    support::calico::settle(&observer);
    let run = observer.stop_ok();
    let capture = tcpdump.stop_after(0);

    let syns = capture.count(&format!("dst host {B_IP} and {}", vxlan_tcp(TCP_SYN)));
    let syn_acks = capture.count(&format!("src host {B_IP} and {}", vxlan_tcp(TCP_SYN_ACK)));
    // One answered SYN, then the failing attempt's first SYN and its
    // retries (at least 1, 3 and 7 s later), whose answers B dropped
    // (with its own SYN-ACK retransmissions: at least one per SYN).
    assert!(syns >= 4, "tcpdump saw {syns} SYNs");
    assert_eq!(syn_acks, 1);
    assert!(dropped >= 3, "the SYN-ACK rule dropped {dropped}");
    let [syn_tx, syn_ack_tx, _, _] = tcp_of(&run, iface, "tx");
    let [syn_rx, syn_ack_rx, _, _] = tcp_of(&run, iface, "rx");
    assert_eq!((syn_tx, syn_ack_rx), (syns, syn_acks));
    assert_eq!((syn_rx, syn_ack_tx), (0, 0));

    let raised = anomalies(&run, "tcp_syn_unanswered", "raised");
    assert_eq!(raised.len(), 1, "{:#?}", run.lines);
    let evidence = &raised[0]["evidence"];
    // Raised on the third unanswered SYN (the second retry).
    assert_eq!(
        (
            evidence["syn_sent"].as_u64(),
            evidence["answers_received"].as_u64()
        ),
        (Some(4), Some(1)),
        "{}",
        raised[0]
    );
    let summary = raised[0]["summary"].as_str().unwrap();
    assert!(
        summary.contains("4 SYNs sent to its pods, 1 answered"),
        "{summary}"
    );
    assert_checksums_clean(&run, iface);
}

#[test]
fn an_mss_larger_than_the_tunnel_carries_raises_mss_exceeds_tunnel_until_clamped() {
    if !support::have_root("an_mss_larger_than_the_tunnel_carries") {
        return;
    }
    let lab = Lab::new("itmss");
    let (a, b) = (&lab.pair.a, &lab.pair.b);
    let iface = lab.pair.a_iface();
    let (listener, addr) = listen_on_b_pod(b);
    let observer = lab.observe_with(&["--anomaly-window", "2s"]);
    let tcpdump = Tcpdump::start(a, iface, "udp port 4789");

    // Pod P's MTU is 1500: its SYN says MSS 1460, 1460 + 40 + 50 > 1500.
    // A real transfer (its full segments do not fit vxlan.calico: A
    // answers "fragmentation needed" and P's stack lowers its path MTU);
    // its checksums, offloaded, must never be flagged.
    const TRANSFER: usize = 1 << 20;
    assert_eq!(
        transfer_from_pod(&lab.pod, &listener, addr, TRANSFER),
        TRANSFER
    );
    assert!(
        observer.wait_for_lines(|lines| lines
            .iter()
            .any(|l| l["type"] == "anomaly" && l["kind"] == "mss_exceeds_tunnel")),
        "no mss_exceeds_tunnel: {:#?}",
        observer.lines()
    );
    // Clamped to the route's MTU (vxlan.calico's 1450): MSS 1410.
    a.exec_ok(&[
        "iptables",
        "-w",
        "-t",
        "mangle",
        "-A",
        "FORWARD",
        "-p",
        "tcp",
        "--tcp-flags",
        "SYN,RST",
        "SYN",
        "-j",
        "TCPMSS",
        "--clamp-mss-to-pmtu",
    ]);
    assert!(connect_from(&lab.pod, addr, Duration::from_secs(5)));
    assert!(
        observer.wait_for_lines(|lines| lines.iter().any(|l| l["type"] == "anomaly"
            && l["kind"] == "mss_exceeds_tunnel"
            && l["state"] == "cleared")),
        "mss_exceeds_tunnel did not clear: {:#?}",
        observer.lines()
    );
    let run = observer.stop_ok();
    let capture = tcpdump.stop_after(0);

    // tcpdump's reading of the two SYNs' MSS options (the inner TCP header
    // without options is 20 bytes; MSS is the first option).
    let mss = |value: u16| {
        capture.count(&format!(
            "dst host {B_IP} and {} and udp[30 + 40 : 2] == 0x0204 and udp[30 + 42 : 2] == {value}",
            vxlan_tcp(TCP_SYN)
        ))
    };
    assert_eq!((mss(1460), mss(1410)), (1, 1));
    // Only the first SYN is over; B's SYN-ACKs (its route's MTU, 1450:
    // MSS 1410) fit.
    let [syn_tx, _, _, over_tx] = tcp_of(&run, iface, "tx");
    let [_, syn_ack_rx, _, over_rx] = tcp_of(&run, iface, "rx");
    assert_eq!((syn_tx, over_tx, syn_ack_rx, over_rx), (2, 1, 2, 0));
    let raised = anomalies(&run, "mss_exceeds_tunnel", "raised");
    assert_eq!(raised.len(), 1, "{:#?}", run.lines);
    assert_eq!(raised[0]["evidence"]["handshakes"], 1, "{}", raised[0]);
    assert!(anomalies(&run, "tcp_syn_unanswered", "raised").is_empty());
    assert_checksums_clean(&run, iface);
}

#[test]
fn wrong_inner_checksums_raise_bad_checksum_with_their_count_and_right_ones_do_not() {
    if !support::have_root("wrong_inner_checksums_raise_bad_checksum") {
        return;
    }
    const RIGHT: u32 = 5;
    const WRONG: u32 = 7;
    let lab = Lab::new("itsum");
    let iface = lab.pair.a_iface();
    let observer = lab.observe();
    let errors = || support::calico::snmp_counter(&lab.pod, "Tcp", "InCsumErrors");
    let before = errors();
    lab.send_from_b(&syn_from_b_pod(POD, false), RIGHT);
    lab.send_from_b(&syn_from_b_pod(POD, true), WRONG);
    support::calico::settle(&observer);
    let run = observer.stop_ok();
    // The pod's stack is the outside reference: it drops exactly those.
    assert_eq!(errors() - before, u64::from(WRONG));

    assert_eq!(
        flagged(&run, iface, "bad_inner_checksum"),
        u64::from(WRONG),
        "{:#?}",
        run.lines
    );
    // The frames carry a computed outer UDP checksum, which is right.
    assert_eq!(flagged(&run, iface, "bad_outer_checksum"), 0);
    assert_eq!(flagged(&run, iface, "zero_udp_checksum"), 0);
    let [syn, ..] = tcp_of(&run, iface, "rx");
    assert_eq!(syn, u64::from(RIGHT + WRONG));
    let raised = anomalies(&run, "bad_checksum", "raised");
    assert_eq!(raised.len(), 1, "{:#?}", run.lines);
    assert_eq!(raised[0]["evidence"]["bad"], WRONG, "{}", raised[0]);
    assert!(
        raised[0]["hint"]
            .as_str()
            .unwrap()
            .contains("tx-checksum-ip-generic off"),
        "{}",
        raised[0]
    );
}
