//! Classifier drop reasons through the real XDP and tc-ingress programs
//! (BPF_PROG_TEST_RUN): allow-set membership (IPv4/IPv6, VXLAN/IPIP, LPM
//! prefixes), VXLAN without the I flag, unknown VNI, outer fragments,
//! packets above the MTU. Every frame still passes.

mod support;

use std::{collections::BTreeSet, net::IpAddr, os::fd::BorrowedFd};

use ipnet::IpNet;
use observer::{
    bpf::testrun,
    bpf::{Hook, LoadConfig, Observer},
    model::facts::{AllowSet, AllowSets, SetSource},
    model::rows::Origin,
};
use observer_common::{ClassifierDrop, Proto};
use support::frames::*;

const XDP_PASS: u32 = 2;
const TC_PASS: u32 = u32::MAX;
/// BPF_PROG_TEST_RUN runs on the loopback device of the current namespace.
const TEST_RUN_IFINDEX: u32 = 1;

fn allow(prefixes: &[&str]) -> AllowSet {
    let prefixes: BTreeSet<IpNet> = prefixes.iter().map(|p| p.parse().unwrap()).collect();
    AllowSet {
        ipv4: true,
        ipv6: true,
        prefixes,
        sources: vec![SetSource::Ipset("test".into())],
    }
}

fn observer() -> Observer {
    Observer::load(&LoadConfig::default()).expect("load observer")
}

/// Runs `frame` `n` times through XDP and returns the classifier drops as
/// (proto, peer, reason, packets), sorted.
fn run(
    obs: &Observer,
    hook: Hook,
    frame: &[u8],
    n: u32,
) -> Vec<(Proto, String, ClassifierDrop, u64)> {
    let fd: BorrowedFd<'_> = obs.program_fd(hook).unwrap();
    for _ in 0..n {
        let r = testrun::run(fd, frame, None, 1).expect("test run");
        let pass = if hook == Hook::Xdp { XDP_PASS } else { TC_PASS };
        assert_eq!(r.retval, pass, "every frame passes");
    }
    let mut rows: Vec<_> = obs
        .read_drops()
        .unwrap()
        .into_iter()
        .filter(|(id, _)| id.origin == Origin::Classifier)
        .map(|(id, c)| {
            (
                id.proto,
                id.peer.map_or("-".into(), |p| p.to_string()),
                ClassifierDrop::from_u16(id.reason as u16).unwrap(),
                c.packets,
            )
        })
        .collect();
    rows.sort();
    rows
}

fn inner() -> Vec<u8> {
    icmp_eth_frame(addr("10.42.0.1"), addr("10.42.0.2"))
}

#[test]
fn allow_set_membership_decides_calico_allow_set() {
    if !support::have_root("allow_set_membership_decides_calico_allow_set") {
        return;
    }
    let snapshot = AllowSets {
        vxlan: allow(&["198.18.1.0/24", "198.18.9.9/32", "fd00:1::/64"]),
        ipip: allow(&["198.18.2.0/24"]),
        ..AllowSets::default()
    };
    let dst = addr("198.18.0.1");
    for hook in [Hook::Xdp, Hook::TcIngress] {
        let mut obs = observer();
        obs.apply_allow_sets(&snapshot).unwrap();
        // Inside the /24, the /32 and the IPv6 /64: no drop.
        for src in ["198.18.1.77", "198.18.9.9"] {
            assert!(
                run(&obs, hook, &vxlan_frame(addr(src), dst, 4096, &inner()), 3).is_empty(),
                "{src}"
            );
        }
        assert!(
            run(
                &obs,
                hook,
                &vxlan_frame(addr("fd00:1::5"), addr("fd00:1::1"), 4096, &inner()),
                2
            )
            .is_empty()
        );
        // Outside: one count per packet, for that peer.
        let rows = run(
            &obs,
            hook,
            &vxlan_frame(addr("198.18.9.10"), dst, 4096, &inner()),
            5,
        );
        assert_eq!(
            rows,
            vec![(
                Proto::Vxlan,
                "198.18.9.10".into(),
                ClassifierDrop::CalicoAllowSet,
                5
            )]
        );
        let rows = run(
            &obs,
            hook,
            &vxlan_frame(addr("fd00:2::5"), addr("fd00:1::1"), 4096, &inner()),
            2,
        );
        assert!(
            rows.contains(&(
                Proto::Vxlan,
                "fd00:2::5".into(),
                ClassifierDrop::CalicoAllowSet,
                2
            )),
            "{rows:?}"
        );
        // IPIP is checked against its own set: a VXLAN-allowed source is not enough.
        let ipip_inner = icmp_packet(addr("10.42.0.1"), addr("10.42.0.2"));
        let before = run(
            &obs,
            hook,
            &ipip_frame(addr("198.18.2.3"), dst, &ipip_inner),
            4,
        );
        assert!(!before.iter().any(|r| r.0 == Proto::Ipip), "{before:?}");
        let rows = run(
            &obs,
            hook,
            &ipip_frame(addr("198.18.1.77"), dst, &ipip_inner),
            4,
        );
        assert!(
            rows.contains(&(
                Proto::Ipip,
                "198.18.1.77".into(),
                ClassifierDrop::CalicoAllowSet,
                4
            )),
            "{rows:?}"
        );
        // Other encapsulations are never checked against allow-sets.
        let geneve = geneve_frame(addr("203.0.113.9"), dst, 5, ETH_P_TEB, 0, &inner());
        let rows = run(&obs, hook, &geneve, 1);
        assert!(!rows.iter().any(|r| r.0 == Proto::Geneve), "{rows:?}");
    }
}

#[test]
fn removing_a_member_takes_effect_and_empty_set_flags_everyone() {
    if !support::have_root("removing_a_member_takes_effect_and_empty_set_flags_everyone") {
        return;
    }
    let mut obs = observer();
    let frame = vxlan_frame(addr("198.18.1.7"), addr("198.18.0.1"), 4096, &inner());
    // No allow-set at all: nothing is checked.
    assert!(run(&obs, Hook::Xdp, &frame, 2).is_empty());
    let with = |p: &[&str]| AllowSets {
        vxlan: allow(p),
        ..AllowSets::default()
    };
    obs.apply_allow_sets(&with(&["198.18.1.7/32"])).unwrap();
    assert!(run(&obs, Hook::Xdp, &frame, 2).is_empty());
    // An existing but empty set allows nobody.
    obs.apply_allow_sets(&with(&[])).unwrap();
    assert_eq!(run(&obs, Hook::Xdp, &frame, 3)[0].3, 3);
    // Back in: no more counts.
    obs.apply_allow_sets(&with(&["198.18.0.0/16"])).unwrap();
    assert_eq!(run(&obs, Hook::Xdp, &frame, 3)[0].3, 3);
}

#[test]
fn vxlan_flags_vni_fragments_and_mtu() {
    if !support::have_root("vxlan_flags_vni_fragments_and_mtu") {
        return;
    }
    let mut obs = observer();
    let src = addr("198.18.5.5");
    let dst = addr("198.18.0.1");
    // Without local vxlan devices the VNI is not checked.
    assert!(run(&obs, Hook::Xdp, &vxlan_frame(src, dst, 777, &inner()), 1).is_empty());
    obs.apply_local_vnis(&[4096, 1]).unwrap();
    assert!(run(&obs, Hook::Xdp, &vxlan_frame(src, dst, 4096, &inner()), 2).is_empty());
    let rows = run(&obs, Hook::Xdp, &vxlan_frame(src, dst, 777, &inner()), 2);
    assert_eq!(
        rows,
        vec![(
            Proto::Vxlan,
            "198.18.5.5".into(),
            ClassifierDrop::VniUnknown,
            2
        )]
    );

    // VXLAN without the I flag.
    let mut no_i = vxlan_frame(addr("198.18.5.6"), dst, 4096, &inner());
    no_i[ETH_HLEN + IPV4_HLEN + UDP_HLEN] = 0;
    let rows = run(&obs, Hook::Xdp, &no_i, 3);
    assert!(
        rows.contains(&(
            Proto::Vxlan,
            "198.18.5.6".into(),
            ClassifierDrop::VxlanNoIFlag,
            3
        )),
        "{rows:?}"
    );

    // Outer fragments: first fragment of VXLAN, later fragment of IPIP.
    let udp = udp(
        src,
        dst,
        ENTROPY_PORT,
        VXLAN_PORT,
        &cat(&[&vxlan_header(4096), &inner()]),
    );
    let first = eth(
        ETH_P_IP,
        &ipv4_with(
            &Ipv4Options {
                more_fragments: true,
                ..Ipv4Options::default()
            },
            addr4("198.18.5.7"),
            addr4("198.18.0.1"),
            IPPROTO_UDP,
            &udp,
        ),
    );
    let rows = run(&obs, Hook::Xdp, &first, 2);
    assert!(
        rows.contains(&(
            Proto::Vxlan,
            "198.18.5.7".into(),
            ClassifierDrop::OuterFragment,
            2
        )),
        "{rows:?}"
    );
    let later = eth(
        ETH_P_IP,
        &ipv4_with(
            &Ipv4Options {
                fragment_offset: 100,
                ..Ipv4Options::default()
            },
            addr4("198.18.5.8"),
            addr4("198.18.0.1"),
            IPPROTO_IPIP,
            &[0u8; 40],
        ),
    );
    let rows = run(&obs, Hook::Xdp, &later, 1);
    assert!(
        rows.contains(&(
            Proto::Ipip,
            "198.18.5.8".into(),
            ClassifierDrop::OuterFragment,
            1
        )),
        "{rows:?}"
    );

    // Above the MTU: the outer IP packet (frame minus Ethernet) is larger.
    // (Packets up to IPv6's minimum MTU, 1280, are never checked.)
    let big_inner = cat(&[&inner(), &[0u8; 1400]]);
    let frame = vxlan_frame(addr("198.18.5.9"), dst, 4096, &big_inner);
    let ip_len = (frame.len() - ETH_HLEN) as u32;
    obs.set_mtu(TEST_RUN_IFINDEX, ip_len).unwrap();
    assert!(
        !run(&obs, Hook::Xdp, &frame, 1)
            .iter()
            .any(|r| r.2 == ClassifierDrop::OverMtu)
    );
    obs.set_mtu(TEST_RUN_IFINDEX, ip_len - 1).unwrap();
    let rows = run(&obs, Hook::Xdp, &frame, 2);
    assert!(
        rows.contains(&(
            Proto::Vxlan,
            "198.18.5.9".into(),
            ClassifierDrop::OverMtu,
            2
        )),
        "{rows:?}"
    );
}

/// A flow's node facts (allow-set verdict, unknown VNI, interface MTU) are
/// cached in its cache slot, where common VXLAN frames read them without
/// a map lookup: every change of those facts must reach the packets of a
/// flow already cached. UDP inside, so the frames take the VXLAN early
/// exit after the flow's first; above 1,294 bytes, so the MTU is checked.
#[test]
fn node_fact_changes_reach_flows_already_cached() {
    if !support::have_root("node_fact_changes_reach_flows_already_cached") {
        return;
    }
    let (src, dst) = (addr("198.18.6.6"), addr("198.18.0.1"));
    let inner_udp = udp_frame(
        addr("10.42.0.1"),
        addr("10.42.0.2"),
        40000,
        5201,
        &[0xab; 1300],
    );
    let frame = vxlan_frame(src, dst, 4096, &inner_udp);
    let ip_len = (frame.len() - ETH_HLEN) as u32;
    assert!(ip_len > 1280, "{ip_len}: large enough for the MTU check");
    let flagged = |rows: &[(Proto, String, ClassifierDrop, u64)], reason| {
        rows.iter()
            .filter(|r| r.0 == Proto::Vxlan && r.1 == "198.18.6.6" && r.2 == reason)
            .map(|r| r.3)
            .sum::<u64>()
    };
    for hook in [Hook::Xdp, Hook::TcIngress] {
        let mut obs = observer();
        let mut sent = 0u64;
        let mut send = |obs: &Observer, n: u32| {
            sent += u64::from(n);
            run(obs, hook, &frame, n)
        };
        assert!(send(&obs, 3).is_empty(), "{hook:?}: no facts, no flags");

        obs.apply_local_vnis(&[1]).unwrap();
        let rows = send(&obs, 2);
        assert_eq!(
            flagged(&rows, ClassifierDrop::VniUnknown),
            2,
            "{hook:?}: {rows:?}"
        );
        obs.apply_local_vnis(&[4096, 1]).unwrap();
        let rows = send(&obs, 2);
        assert_eq!(
            flagged(&rows, ClassifierDrop::VniUnknown),
            2,
            "{hook:?}: {rows:?}"
        );

        obs.set_mtu(TEST_RUN_IFINDEX, ip_len).unwrap();
        assert!(send(&obs, 1).iter().all(|r| r.2 != ClassifierDrop::OverMtu));
        obs.set_mtu(TEST_RUN_IFINDEX, ip_len - 1).unwrap();
        let rows = send(&obs, 2);
        assert_eq!(
            flagged(&rows, ClassifierDrop::OverMtu),
            2,
            "{hook:?}: {rows:?}"
        );
        obs.set_mtu(TEST_RUN_IFINDEX, 9000).unwrap();
        let rows = send(&obs, 2);
        assert_eq!(
            flagged(&rows, ClassifierDrop::OverMtu),
            2,
            "{hook:?}: {rows:?}"
        );

        let with = |p: &[&str]| AllowSets {
            vxlan: allow(p),
            ..AllowSets::default()
        };
        obs.apply_allow_sets(&with(&["198.18.7.0/24"])).unwrap();
        let rows = send(&obs, 2);
        assert_eq!(
            flagged(&rows, ClassifierDrop::CalicoAllowSet),
            2,
            "{hook:?}: {rows:?}"
        );
        obs.apply_allow_sets(&with(&["198.18.6.6/32"])).unwrap();
        let rows = send(&obs, 3);
        assert_eq!(
            flagged(&rows, ClassifierDrop::CalicoAllowSet),
            2,
            "{hook:?}: {rows:?}"
        );

        // Every frame in the flow's row, once.
        let counted: Vec<_> = obs
            .read_flows()
            .unwrap()
            .into_iter()
            .filter(|(id, _)| id.proto == Proto::Vxlan && id.peer == Some(src))
            .map(|(id, c)| (id.vni, c.packets, c.bytes))
            .collect();
        assert_eq!(
            counted,
            vec![(4096, sent, sent * frame.len() as u64)],
            "{hook:?}"
        );
    }
}

#[test]
fn egress_and_plain_traffic_are_never_flagged() {
    if !support::have_root("egress_and_plain_traffic_are_never_flagged") {
        return;
    }
    let mut obs = observer();
    obs.apply_allow_sets(&AllowSets {
        vxlan: allow(&[]),
        ipip: allow(&[]),
        ..AllowSets::default()
    })
    .unwrap();
    obs.apply_local_vnis(&[1]).unwrap();
    let frame = vxlan_frame(addr("198.18.5.5"), addr("198.18.0.1"), 4096, &inner());
    assert!(run(&obs, Hook::TcEgress, &frame, 3).is_empty());
    let plain = udp_frame(addr("198.18.5.5"), addr("198.18.0.1"), 1000, 2000, b"x");
    assert!(run(&obs, Hook::Xdp, &plain, 3).is_empty());
}

/// A router's ICMP error quoting the first bytes of `quoted` (an IP packet
/// this node sent): type 3 code 4 for IPv4, type 2 for IPv6, with `mtu`.
fn too_big_frame(router: IpAddr, node: IpAddr, quoted: &[u8], mtu: u32) -> Vec<u8> {
    // RFC 792 quotes the IP header and 8 bytes; RFC 4443 as much as fits.
    let quoted = &quoted[..quoted.len().min(ip_hlen(node) + 8 + 16)];
    match (router, node) {
        (IpAddr::V4(r), IpAddr::V4(n)) => {
            let mut icmp = cat(&[&[3, 4, 0, 0, 0, 0], &(mtu as u16).to_be_bytes(), quoted]);
            let sum = internet_checksum(&[&icmp]);
            icmp[2..4].copy_from_slice(&sum.to_be_bytes());
            eth(ETH_P_IP, &ipv4(r, n, 1, &icmp))
        }
        (IpAddr::V6(r), IpAddr::V6(n)) => {
            // The checksum is not verified by the classifier.
            let icmp = cat(&[&[2, 0, 0, 0], &mtu.to_be_bytes(), quoted]);
            eth(ETH_P_IPV6, &ipv6(r, n, 58, &icmp))
        }
        _ => panic!("mixed families"),
    }
}

#[test]
fn too_big_errors_about_tunnel_packets_count_as_path_mtu() {
    if !support::have_root("too_big_errors_about_tunnel_packets_count_as_path_mtu") {
        return;
    }
    let node = addr("198.18.0.1");
    let router = addr("198.18.0.254");
    let peer = addr("198.18.7.7");
    let ipip = ip(
        node,
        peer,
        4,
        &icmp_packet(addr("10.42.0.1"), addr("10.42.0.2")),
    );
    let vxlan = vxlan_frame(node, peer, 4096, &inner())[ETH_HLEN..].to_vec();
    let not_tunnel = ip(node, peer, 6, &[0u8; 20]);
    let node6 = addr("fd00:7::1");
    let peer6 = addr("fd00:7::7");
    let vxlan6 = vxlan_frame(node6, peer6, 4096, &inner())[ETH_HLEN..].to_vec();
    // Both ingress hooks: tc ingress reaches the check through its
    // tail-called checks program.
    for hook in [Hook::Xdp, Hook::TcIngress] {
        let obs = observer();
        // About other traffic, an echo request, an ICMP of another kind: nothing.
        assert!(
            run(
                &obs,
                hook,
                &too_big_frame(router, node, &not_tunnel, 1400),
                2
            )
            .is_empty()
        );
        assert!(run(&obs, hook, &icmp_eth_frame(router, node), 2).is_empty());
        run(&obs, hook, &too_big_frame(router, node, &ipip, 1400), 3);
        run(&obs, hook, &too_big_frame(router, node, &vxlan, 1400), 2);
        // Truncated quote: the UDP ports are missing, so it is not counted.
        let short = too_big_frame(router, node, &vxlan[..20], 1400);
        let rows = run(&obs, hook, &short, 1);
        let rows6 = run(
            &obs,
            hook,
            &too_big_frame(addr("fd00:7::fe"), node6, &vxlan6, 1280),
            4,
        );
        assert_eq!(
            rows6,
            vec![
                (
                    Proto::Vxlan,
                    "198.18.7.7".into(),
                    ClassifierDrop::PathMtu,
                    2
                ),
                (Proto::Vxlan, "fd00:7::7".into(), ClassifierDrop::PathMtu, 4),
                (Proto::Ipip, "198.18.7.7".into(), ClassifierDrop::PathMtu, 3),
            ],
            "{hook:?}"
        );
        assert_eq!(rows.len(), 2);
        // The reported next-hop MTU is kept with the row, in its own field.
        let mtus: BTreeSet<(String, u32, u32)> = obs
            .read_drops()
            .unwrap()
            .into_iter()
            .map(|(id, _)| (id.peer.unwrap().to_string(), id.vni, id.mtu.unwrap()))
            .collect();
        assert_eq!(
            mtus,
            BTreeSet::from([
                ("198.18.7.7".into(), 0, 1400),
                ("fd00:7::7".into(), 0, 1280)
            ]),
            "{hook:?}"
        );
    }
}
