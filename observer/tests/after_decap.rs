//! End-to-end tests of drops after decapsulation: the observer attached to
//! node A's underlay veth also watches A's tunnel device (`vxlan.calico`)
//! and its pod-facing veths (`cali*`), and names the node each dropped
//! inner packet came from or was going to through the pod blocks of A's
//! data plane, with the stage, the kernel's drop reason and the kernel
//! function that dropped it. Each count is compared with the kernel's own
//! (the iptables rule's counter, ping's).
//!
//! Topology (each test has its own namespaces):
//!
//! ```text
//!   pod P: eth0 198.19.1.5/32 <-veth-> caliA1   node A: va 198.18.0.1  <-veth->  node B: vb 198.18.0.2
//!                                               vxlan.calico, block 198.19.1.0/24   vxlan.calico, block 198.19.2.0/24
//! ```
//!
//! Calico's way (`Pair::calico`): each node routes the other's block via
//! its VTEP address onlink, with permanent neighbour and FDB entries.

mod support;

use observer_testkit::pair::{B_IP, NODE_A, NODE_B};
use serde_json::Value;
use support::{
    calico::{iptables_counter, iptables_drop, settle},
    frames,
    netns::{Netns, ObserverRun},
    pods::{Lab, POD},
};

/// Packets per case (odd, so that it is not mistaken for another count).
const N: u32 = 7;
/// An IPv4 ICMP echo reply `src` -> `dst` (conntrack has no request for
/// it: INVALID).
fn echo_reply(src: &str, dst: &str) -> Vec<u8> {
    let mut icmp = frames::icmp4_echo(0x4242, 1, &[0x5a; 32]);
    icmp[0] = 0; // echo reply
    icmp[2..4].copy_from_slice(&[0, 0]);
    let sum = frames::internet_checksum(&[&icmp]);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    frames::ipv4(frames::addr4(src), frames::addr4(dst), 1, &icmp)
}

/// An IPv4 ICMP echo request `src` -> `dst`.
fn echo_request(src: &str, dst: &str) -> Vec<u8> {
    frames::ipv4(
        frames::addr4(src),
        frames::addr4(dst),
        1,
        &frames::icmp4_echo(0x4243, 1, &[0x5a; 32]),
    )
}

/// The final snapshot's drop line on `iface` at `stage` for `peer` and
/// `direction` with `reason`, or a panic showing every drop line.
fn drop_line<'a>(
    run: &'a ObserverRun,
    iface: &str,
    stage: &str,
    direction: &str,
    peer: &str,
    reason: &str,
) -> &'a Value {
    let lines = support::calico::final_snapshot(run);
    lines
        .iter()
        .find(|l| {
            l["type"] == "drop"
                && l["iface"] == iface
                && l["stage"] == stage
                && l["direction"] == direction
                && l["peer"] == peer
                && l["reason"] == reason
        })
        .unwrap_or_else(|| {
            let drops: Vec<String> = lines
                .iter()
                .filter(|l| l["type"] == "drop")
                .map(Value::to_string)
                .collect();
            panic!(
                "no {stage} drop on {iface} ({direction} {peer}, {reason}); drop lines:\n{}",
                drops.join("\n")
            )
        })
}

/// Packets of every drop line of the final snapshot on `iface` for
/// `peer` (whatever the reason or location): what the observer
/// attributes to that node there.
fn packets_on(run: &ObserverRun, iface: &str, peer: &str) -> u64 {
    support::calico::final_snapshot(run)
        .iter()
        .filter(|l| l["type"] == "drop" && l["iface"] == iface && l["peer"] == peer)
        .map(|l| l["packets"].as_u64().unwrap())
        .sum()
}

/// A netfilter DROP is freed in the netfilter core or, with reasons
/// from nftables (iptables-nft), in its rule evaluation: a kernel
/// function's name either way, never a bare address.
fn assert_netfilter_location(line: &Value) {
    let location = line["location"].as_str().unwrap_or_default();
    assert!(
        ["nf_hook_slow", "nft_do_chain", "ipt_do_table"].contains(&location),
        "location {location:?} of {line}"
    );
}

/// The kernel's name of the drop reason on this kernel: before 5.17 the
/// tracepoint reports none.
fn reason(name: &str) -> &str {
    if support::calico::kernel_drop_reasons().contains_key(name) {
        name
    } else {
        "NOT_REPORTED"
    }
}

#[test]
fn conntrack_invalid_on_the_tunnel_device_is_attributed_to_the_sending_node() {
    if !support::have_root("conntrack_invalid_on_the_tunnel_device") {
        return;
    }
    let lab = Lab::new("adct");
    let a = &lab.pair.a;
    let comment = "observer test: conntrack INVALID";
    iptables_drop(
        a,
        &[
            "-t",
            "mangle",
            "-A",
            "PREROUTING",
            "-i",
            "vxlan.calico",
            "-m",
            "conntrack",
            "--ctstate",
            "INVALID",
        ],
        comment,
    );
    let observer = lab.observe();
    lab.send_from_b(&echo_reply(NODE_B.pod, NODE_A.pod), N);
    settle(&observer);
    let run = observer.stop_ok();

    let (rule_packets, _) = iptables_counter(a, comment);
    assert_eq!(rule_packets, u64::from(N), "the rule's own counter");
    let line = drop_line(
        &run,
        "vxlan.calico",
        "tunnel",
        "rx",
        B_IP,
        reason("NETFILTER_DROP"),
    );
    assert_eq!(line["packets"].as_u64(), Some(rule_packets), "{line}");
    assert_eq!(line["proto"], "vxlan", "{line}");
    assert_eq!(line["origin"], "kernel", "{line}");
    assert_netfilter_location(line);
    assert_eq!(packets_on(&run, "vxlan.calico", B_IP), rule_packets);
    let message = line["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "{N} VXLAN packets from a pod of {B_IP} dropped on vxlan.calico (tunnel) at {}",
            line["location"].as_str().unwrap()
        )),
        "{message}"
    );
    // The anomaly says where and why, and it is no allow-set drop (the
    // NETFILTER_DROP is not Calico's allow-set rule).
    let raised: Vec<&Value> = run
        .lines
        .iter()
        .filter(|l| l["type"] == "anomaly" && l["state"] == "raised" && l["peer"] == B_IP)
        .collect();
    let kinds: Vec<&str> = raised.iter().filter_map(|l| l["kind"].as_str()).collect();
    assert!(kinds.contains(&"dropped_after_decap"), "{raised:#?}");
    assert!(!kinds.contains(&"allow_set_drop"), "{raised:#?}");
    let anomaly = run
        .lines
        .iter()
        .rev()
        .find(|l| l["type"] == "anomaly" && l["kind"] == "dropped_after_decap")
        .unwrap();
    assert_eq!(
        anomaly["evidence"]["since_tracked"][0],
        format!(
            "{} {N} on vxlan.calico at {}, from its pods",
            reason("NETFILTER_DROP"),
            line["location"].as_str().unwrap()
        ),
        "{anomaly}"
    );
    // Nothing of it is an underlay drop: the VXLAN packets arrived.
    assert!(
        !support::calico::final_snapshot(&run)
            .iter()
            .any(|l| l["type"] == "drop" && l["stage"] == "underlay"),
        "no underlay drop expected"
    );
}

#[test]
fn rp_filter_drops_after_decapsulation_are_attributed_to_the_block_owner() {
    if !support::have_root("rp_filter_drops_after_decapsulation") {
        return;
    }
    let lab = Lab::new("adrp");
    let a = &lab.pair.a;
    // A routes part of B's block another way: what arrives from there on
    // vxlan.calico fails the strict reverse-path check.
    a.ip(&[
        "route",
        "add",
        "198.19.2.64/26",
        "via",
        B_IP,
        "dev",
        lab.pair.a_iface(),
    ]);
    for conf in ["all", "vxlan.calico"] {
        a.exec_ok(&[
            "sysctl",
            "-qw",
            &format!("net/ipv4/conf/{conf}/rp_filter=1"),
        ]);
    }
    let before = rp_filter_counter(a);
    let observer = lab.observe();
    lab.send_from_b(&echo_request("198.19.2.77", NODE_A.pod), N);
    settle(&observer);
    let run = observer.stop_ok();

    let dropped = rp_filter_counter(a) - before;
    assert_eq!(
        dropped,
        u64::from(N),
        "the kernel's IPReversePathFilter counter"
    );
    let line = drop_line(
        &run,
        "vxlan.calico",
        "tunnel",
        "rx",
        B_IP,
        reason("IP_RPFILTER"),
    );
    assert_eq!(line["packets"].as_u64(), Some(dropped), "{line}");
    assert_eq!(packets_on(&run, "vxlan.calico", B_IP), dropped);
}

/// `TcpExt: IPReversePathFilter` of `ns` (/proc/net/netstat): packets
/// the reverse-path check dropped.
fn rp_filter_counter(ns: &Netns) -> u64 {
    support::calico::snmp_counter(ns, "TcpExt", "IPReversePathFilter")
}

/// `ping -c count` from `ns` to `dst`, each request sent once whether
/// answered or not (no `-w`): (transmitted, received).
fn ping(ns: &Netns, dst: &str, count: u32) -> (u32, u32) {
    let output = ns.exec(&[
        "ping",
        "-n",
        "-q",
        "-c",
        &count.to_string(),
        "-i",
        "0.05",
        "-W",
        "1",
        dst,
    ]);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let summary = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary:\n{text}"));
    // "7 packets transmitted, 0 received, 100% packet loss, time 301ms"
    let number = |word: &str| -> u32 {
        summary
            .split(',')
            .find(|part| part.contains(word))
            .and_then(|part| part.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {word} count in {summary:?}"))
    };
    (number("transmitted"), number("received"))
}

#[test]
fn a_forward_drop_towards_a_pod_and_from_a_pod_name_the_peer_and_stage() {
    if !support::have_root("a_forward_drop_towards_a_pod") {
        return;
    }
    let lab = Lab::new("adfw");
    let a = &lab.pair.a;
    let to_pod = "observer test: forward to the pod";
    let from_pod = "observer test: forward from the pod";
    for (dir, comment) in [("-o", to_pod), ("-i", from_pod)] {
        iptables_drop(a, &["-A", "FORWARD", dir, "caliA1"], comment);
    }
    let observer = lab.observe();
    // B's pod pings A's pod P through the real overlay: A forwards it from
    // vxlan.calico towards caliA1, where the policy drops it.
    let (sent, received) = ping(&lab.pair.b, POD, N);
    assert_eq!((sent, received), (N, 0), "ping through the overlay");
    // P pings B's pod: A drops it as it comes from caliA1.
    let (sent, received) = ping(&lab.pod, NODE_B.pod, N);
    assert_eq!((sent, received), (N, 0), "ping from the pod");
    settle(&observer);
    let run = observer.stop_ok();

    let netfilter = reason("NETFILTER_DROP");
    let (towards, _) = iptables_counter(a, to_pod);
    assert_eq!(towards, u64::from(N));
    // Forwarded packets are dropped while their device is still the one
    // they arrived on: vxlan.calico, sent by B.
    let line = drop_line(&run, "vxlan.calico", "tunnel", "rx", B_IP, netfilter);
    assert_eq!(line["packets"].as_u64(), Some(towards), "{line}");
    assert_netfilter_location(line);
    let (from, _) = iptables_counter(a, from_pod);
    assert_eq!(from, u64::from(N));
    // From the pod: on caliA1, on its way to B.
    let line = drop_line(&run, "caliA1", "pod", "tx", B_IP, netfilter);
    assert_eq!(line["packets"].as_u64(), Some(from), "{line}");
    assert_eq!(line["proto"], "vxlan", "{line}");
    let message = line["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "{N} VXLAN packets to a pod of {B_IP} dropped on caliA1 (pod) at {}",
            line["location"].as_str().unwrap()
        )),
        "{message}"
    );
}

#[test]
fn a_removed_fdb_entry_drops_on_the_way_out_to_the_node_it_named() {
    if !support::have_root("a_removed_fdb_entry_drops") {
        return;
    }
    let lab = Lab::new("adfd");
    let a = &lab.pair.a;
    let observer = lab.observe();
    lab.pair.forget_peer_vtep();
    let (sent, received) = ping(a, NODE_B.pod, N);
    assert_eq!((sent, received), (N, 0), "ping without an FDB entry");
    settle(&observer);
    let run = observer.stop_ok();

    // vxlan_xmit finds no remote for B's VTEP MAC: every echo request is
    // dropped on vxlan.calico, on its way to B (whose block the view
    // still names, though the route can no longer resolve it). The
    // reason's name differs between kernels (NO_TX_TARGET on 6.18).
    let line = every_ping_out_to_b(&run);
    assert_eq!(line["location"], "vxlan_xmit", "{line}");
}

/// The final snapshot's drop line on vxlan.calico on the way out, which
/// must hold A's [`N`] pings to B's pod, attributed to B, and be all that
/// is attributed to B there.
fn every_ping_out_to_b(run: &ObserverRun) -> &Value {
    let line = support::calico::final_snapshot(run)
        .iter()
        .find(|l| l["type"] == "drop" && l["iface"] == "vxlan.calico" && l["direction"] == "tx")
        .expect("a drop on the way out");
    assert_eq!(line["peer"], B_IP, "{line}");
    assert_eq!(line["stage"], "tunnel", "{line}");
    assert_eq!(line["packets"].as_u64(), Some(u64::from(N)), "{line}");
    assert_eq!(packets_on(run, "vxlan.calico", B_IP), u64::from(N));
    line
}

#[test]
fn a_removed_neighbour_entry_drops_on_the_way_out_once_resolution_fails() {
    if !support::have_root("a_removed_neighbour_entry_drops") {
        return;
    }
    let lab = Lab::new("adne");
    let a = &lab.pair.a;
    let observer = lab.observe();
    a.ip(&["neigh", "del", NODE_B.vtep_ip, "dev", "vxlan.calico"]);
    let (sent, received) = ping(a, NODE_B.pod, N);
    assert_eq!((sent, received), (N, 0), "ping without a neighbour entry");
    // The requests wait for ARP, which vxlan.calico cannot send anywhere
    // (no default FDB entry), and are freed when resolution fails, seconds
    // after ping ends: on the way out to B, which the view still names.
    let all_dropped = |lines: &[Value]| {
        lines.iter().any(|l| {
            l["type"] == "drop"
                && l["iface"] == "vxlan.calico"
                && l["direction"] == "tx"
                && l["peer"] == B_IP
                && l["packets"].as_u64() == Some(u64::from(N))
        })
    };
    assert!(
        observer.wait_for_lines(all_dropped),
        "no {N} drops on the way to {B_IP}: {:#?}",
        observer
            .lines()
            .iter()
            .filter(|l| l["type"] == "drop")
            .collect::<Vec<_>>()
    );
    settle(&observer);
    let run = observer.stop_ok();
    // The ARP requests themselves (no IP header) name no node.
    let line = every_ping_out_to_b(&run);
    assert_eq!(line["reason"], reason("NEIGH_FAILED"), "{line}");
}
