//! Runs the observer's eBPF programs on hand-built frames with
//! BPF_PROG_TEST_RUN and checks the flow map row by row.
//!
//! Every frame goes through the three programs (XDP rx, tc ingress, tc
//! egress); after each run the map is read back and exactly one row must
//! have changed: the expected (direction, protocol, peer, VNI, reason) key,
//! by the number of repetitions and their bytes, with the expected inner
//! address sample. The peer is the outer source on rx and the outer
//! destination on tx.
//!
//! Kernel limits of the test-run interface: tc runs need a complete IPv4
//! (34 bytes) / IPv6 (54 bytes) header when the EtherType announces one and
//! at most ~3.7 KB; frames the kernel refuses for tc are checked on XDP only.

mod support;

use std::{collections::BTreeMap, net::IpAddr};

use observer::{
    bpf::testrun::{self, skb_gso_ctx},
    bpf::{Hook, LoadConfig, Observer, maps::MapRead},
    model::ports::PortConfig,
    model::rows::{FlowCounters, FlowId},
};
use observer_common::{Direction, Proto, Unclassified};
use support::{bgp_wire, frames::*};

const XDP_PASS: u32 = 2;
/// TC_ACT_UNSPEC (-1) as the u32 the test run reports.
const TC_ACT_UNSPEC: u32 = u32::MAX;
/// Test runs happen on the loopback device.
const LO_IFINDEX: u32 = 1;
const HOOKS: [Hook; 3] = [Hook::Xdp, Hook::TcIngress, Hook::TcEgress];

fn verdict(hook: Hook) -> u32 {
    match hook {
        Hook::Xdp => XDP_PASS,
        Hook::TcIngress | Hook::TcEgress => TC_ACT_UNSPEC,
    }
}

fn direction(hook: Hook) -> Direction {
    match hook {
        Hook::Xdp | Hook::TcIngress => Direction::Rx,
        Hook::TcEgress => Direction::Tx,
    }
}

/// Whether this kernel's skb test run takes `frame` (it insists on a full
/// IP header for IP EtherTypes, and on a linear buffer of one page).
fn tc_test_run_accepts(frame: &[u8]) -> bool {
    let min = match u16::from_be_bytes([frame[12], frame[13]]) {
        ETH_P_IP => ETH_HLEN + IPV4_HLEN,
        ETH_P_IPV6 => ETH_HLEN + IPV6_HLEN,
        _ => ETH_HLEN,
    };
    frame.len() >= min && frame.len() <= 3700
}

// ------------------------------------------------------------------ harness

/// One row a run changed: its key, the increments, and the inner sample it
/// holds afterwards.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Changed {
    id: FlowId,
    packets: u64,
    bytes: u64,
    inner: Option<(IpAddr, IpAddr)>,
}

/// A loaded observer and the map contents after the previous run.
struct Harness {
    obs: Observer,
    rows: BTreeMap<FlowId, FlowCounters>,
    runs: usize,
}

impl Harness {
    fn new(config: &LoadConfig) -> Harness {
        let obs = Observer::load(config).expect("loading the eBPF programs");
        let h = Harness {
            obs,
            rows: BTreeMap::new(),
            runs: 0,
        };
        assert!(
            h.read().is_empty(),
            "a fresh observer has an empty flow map"
        );
        h
    }

    /// Packets and bytes per row, read by `how`.
    fn counts(&self, how: MapRead) -> BTreeMap<FlowId, (u64, u64)> {
        self.obs
            .read_flows_with(how)
            .unwrap_or_else(|e| panic!("{how:?}: {:#}", anyhow::Error::from(e)))
            .into_iter()
            .map(|(id, c)| (id, (c.packets, c.bytes)))
            .collect()
    }

    fn read(&self) -> BTreeMap<FlowId, FlowCounters> {
        self.obs
            .read_flows()
            .expect("reading the flow map")
            .into_iter()
            .collect()
    }

    /// Runs `hook` on `frame` `repeat` times, checks the verdict, and
    /// returns the rows that changed. `None` when the kernel refuses this
    /// frame for a tc test run (see [`tc_test_run_accepts`]).
    fn run(
        &mut self,
        hook: Hook,
        frame: &[u8],
        ctx: Option<&[u8]>,
        repeat: u32,
    ) -> Option<Vec<Changed>> {
        self.run_unchecked(hook, frame, ctx, repeat)?;
        Some(self.changes())
    }

    /// Runs without reading the map back (for bulk runs).
    fn run_unchecked(
        &mut self,
        hook: Hook,
        frame: &[u8],
        ctx: Option<&[u8]>,
        repeat: u32,
    ) -> Option<()> {
        let fd = self.obs.program_fd(hook).expect("program fd");
        match testrun::run(fd, frame, ctx, repeat) {
            Ok(run) => assert_eq!(
                run.retval,
                verdict(hook),
                "{hook:?} must pass every frame; it returned {} on {frame:02x?}",
                run.retval
            ),
            Err(e)
                if hook != Hook::Xdp
                    && e.raw_os_error() == Some(libc::EINVAL)
                    && !tc_test_run_accepts(frame) =>
            {
                return None;
            }
            Err(e) => panic!(
                "test run of {hook:?} on a {}-byte frame failed: {e}: {frame:02x?}",
                frame.len()
            ),
        }
        self.runs += 1;
        Some(())
    }

    fn changes(&mut self) -> Vec<Changed> {
        let now = self.read();
        let mut changed = Vec::new();
        for (id, after) in &now {
            let before = self.rows.get(id).copied().unwrap_or_default();
            if (before.packets, before.bytes) != (after.packets, after.bytes) {
                changed.push(Changed {
                    id: *id,
                    packets: after.packets - before.packets,
                    bytes: after.bytes - before.bytes,
                    inner: after.inner,
                });
            }
        }
        for id in self.rows.keys() {
            assert!(now.contains_key(id), "row {id:?} disappeared from the map");
        }
        self.rows = now;
        changed
    }

    /// Runs `case` through every hook and checks the one row it must change.
    fn check(&mut self, case: &Case, repeat: u32) {
        let mut ran = 0;
        for hook in HOOKS {
            let Some(changed) = self.run(hook, &case.frame, None, repeat) else {
                continue;
            };
            ran += 1;
            let want = Changed {
                id: case.expect.id(hook),
                packets: repeat as u64,
                bytes: case.frame.len() as u64 * repeat as u64,
                inner: case.expect.inner,
            };
            assert_eq!(
                changed,
                vec![want],
                "{} ({} bytes) through {hook:?}",
                case.name,
                case.frame.len()
            );
        }
        assert!(ran >= 1, "{}: no hook ran", case.name);
    }

    /// Checks the kernel self counters against the rows seen.
    fn finish(self, test: &str) {
        let stats = self.obs.read_stats().expect("reading stats");
        let keys = self.obs.read_flows().expect("reading flows").len();
        assert_eq!(keys, self.rows.len(), "{test}: live keys");
        // Plain traffic lives in the plain counters only: it claims no
        // cache slot and no LRU entry.
        let plain = self
            .rows
            .keys()
            .filter(|id| id.proto == Proto::Other && id.reason == Unclassified::None)
            .count();
        // Other keys live in a flow-cache slot or in the LRU map (or both,
        // when the test thread moved to a CPU whose slot another key holds).
        assert!(
            stats.flow_entries + stats.flow_cache_slots >= (keys - plain) as u64,
            "{test}: {stats:?} hold fewer than {} keys",
            keys - plain
        );
        // A key reaches the LRU map only through a cache collision.
        assert!(
            stats.flow_inserts <= stats.flow_cache_collisions,
            "{test}: {stats:?}"
        );
        assert_eq!(
            stats.flow_inserts, stats.flow_entries,
            "{test}: every key inserted once"
        );
        assert_eq!(stats.flow_insert_failures, 0, "{test}: insert failures");
        eprintln!("{test}: {} test runs, {} rows", self.runs, self.rows.len());
    }
}

// ------------------------------------------------------------ expectations

/// The row one frame must produce.
#[derive(Clone, Copy, Debug)]
struct Expect {
    proto: Proto,
    reason: Unclassified,
    /// Outer (source, destination) for tunnel rows, `None` for aggregates.
    outer: Option<(IpAddr, IpAddr)>,
    vni: u32,
    inner: Option<(IpAddr, IpAddr)>,
}

impl Expect {
    fn tunnel(
        proto: Proto,
        outer: (IpAddr, IpAddr),
        vni: u32,
        inner: Option<(IpAddr, IpAddr)>,
    ) -> Expect {
        Expect {
            proto,
            reason: Unclassified::None,
            outer: Some(outer),
            vni,
            inner,
        }
    }

    /// Plain IP: protocol `other`, no peer.
    fn plain() -> Expect {
        Expect::unclassified(Unclassified::None)
    }

    fn unclassified(reason: Unclassified) -> Expect {
        Expect {
            proto: Proto::Other,
            reason,
            outer: None,
            vni: 0,
            inner: None,
        }
    }

    fn id(&self, hook: Hook) -> FlowId {
        let direction = direction(hook);
        FlowId {
            ifindex: LO_IFINDEX,
            direction,
            proto: self.proto,
            reason: self.reason,
            peer: self.outer.map(|(src, dst)| match direction {
                Direction::Rx => src,
                Direction::Tx => dst,
            }),
            vni: self.vni,
        }
    }
}

struct Case {
    name: String,
    frame: Vec<u8>,
    expect: Expect,
}

fn case(name: impl Into<String>, frame: Vec<u8>, expect: Expect) -> Case {
    Case {
        name: name.into(),
        frame,
        expect,
    }
}

fn pair(a: &str, b: &str) -> (IpAddr, IpAddr) {
    (addr(a), addr(b))
}

fn v4(a: IpAddr) -> std::net::Ipv4Addr {
    match a {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) => panic!("{a} is not IPv4"),
    }
}

fn v6(a: IpAddr) -> std::net::Ipv6Addr {
    match a {
        IpAddr::V6(a) => a,
        IpAddr::V4(_) => panic!("{a} is not IPv6"),
    }
}

/// A PPTP-style enhanced GRE (version 1) header and payload.
fn gre_v1(payload: &[u8]) -> Vec<u8> {
    let mut g = vec![0x30, 0x81, 0x88, 0x0b]; // K, S; A, version 1; PPP
    g.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    g.extend_from_slice(&7u16.to_be_bytes()); // call id
    g.extend_from_slice(&1u32.to_be_bytes()); // sequence
    g.extend_from_slice(&1u32.to_be_bytes()); // acknowledgment
    g.extend_from_slice(payload);
    g
}

/// One of every encapsulation the observer knows, plus plain traffic.
/// Every tunnel case has its own outer addresses, so its row is new.
fn tunnel_cases() -> Vec<Case> {
    let mut cases = Vec::new();

    let (o, i) = (pair("192.0.2.1", "192.0.2.2"), pair("10.1.0.1", "10.1.0.2"));
    let frame = vxlan_frame(o.0, o.1, 100, &icmp_eth_frame(i.0, i.1));
    cases.push(case(
        "vxlan, ipv4 outer, inner ipv4",
        frame,
        Expect::tunnel(Proto::Vxlan, o, 100, Some(i)),
    ));

    let (o, i) = (pair("192.0.2.3", "192.0.2.4"), pair("fd00::1", "fd00::2"));
    let payload = cat(&[&vxlan_header(0xabcdef), &icmp_eth_frame(i.0, i.1)]);
    let frame = udp_frame(o.0, o.1, ENTROPY_PORT, VXLAN_LINUX_PORT, &payload);
    cases.push(case(
        "vxlan on 8472, inner ipv6",
        frame,
        Expect::tunnel(Proto::Vxlan, o, 0xabcdef, Some(i)),
    ));

    let (o, i) = (
        pair("2001:db8::1", "2001:db8::2"),
        pair("10.1.0.3", "10.1.0.4"),
    );
    let frame = vxlan_frame(o.0, o.1, 0xffffff, &icmp_eth_frame(i.0, i.1));
    cases.push(case(
        "vxlan, ipv6 outer, max vni",
        frame,
        Expect::tunnel(Proto::Vxlan, o, 0xffffff, Some(i)),
    ));

    let (o, i) = (pair("192.0.2.5", "192.0.2.6"), pair("10.1.0.5", "10.1.0.6"));
    let frame = vxlan_gpe_frame(o.0, o.1, 7, GPE_NEXT_IPV4, &icmp_packet(i.0, i.1));
    cases.push(case(
        "vxlan-gpe, next ipv4",
        frame,
        Expect::tunnel(Proto::VxlanGpe, o, 7, Some(i)),
    ));

    let (o, i) = (
        pair("2001:db8::3", "2001:db8::4"),
        pair("fd00::3", "fd00::4"),
    );
    let frame = vxlan_gpe_frame(o.0, o.1, 8, GPE_NEXT_IPV6, &icmp_packet(i.0, i.1));
    cases.push(case(
        "vxlan-gpe, next ipv6, ipv6 outer",
        frame,
        Expect::tunnel(Proto::VxlanGpe, o, 8, Some(i)),
    ));

    let (o, i) = (pair("192.0.2.7", "192.0.2.8"), pair("10.1.0.7", "10.1.0.8"));
    let frame = vxlan_gpe_frame(o.0, o.1, 9, GPE_NEXT_ETHERNET, &icmp_eth_frame(i.0, i.1));
    cases.push(case(
        "vxlan-gpe, next ethernet",
        frame,
        Expect::tunnel(Proto::VxlanGpe, o, 9, Some(i)),
    ));

    let o = pair("192.0.2.9", "192.0.2.10");
    let frame = vxlan_gpe_frame(o.0, o.1, 10, 4, &[0x0f, 0xc6, 0x01, 0x00, 0, 0, 0x01, 0xff]);
    cases.push(case(
        "vxlan-gpe, next nsh (no inner sample)",
        frame,
        Expect::tunnel(Proto::VxlanGpe, o, 10, None),
    ));

    let (o, i) = (
        pair("192.0.2.11", "192.0.2.12"),
        pair("10.1.0.11", "10.1.0.12"),
    );
    let frame = geneve_frame(o.0, o.1, 5001, ETH_P_TEB, 0, &icmp_eth_frame(i.0, i.1));
    cases.push(case(
        "geneve, ethernet, no options",
        frame,
        Expect::tunnel(Proto::Geneve, o, 5001, Some(i)),
    ));

    let (o, i) = (
        pair("192.0.2.13", "192.0.2.14"),
        pair("10.1.0.13", "10.1.0.14"),
    );
    let frame = geneve_frame(o.0, o.1, 0x123456, ETH_P_IP, 2, &icmp_packet(i.0, i.1));
    cases.push(case(
        "geneve, ipv4, 8 bytes of options",
        frame,
        Expect::tunnel(Proto::Geneve, o, 0x123456, Some(i)),
    ));

    let (o, i) = (
        pair("2001:db8::5", "2001:db8::6"),
        pair("fd00::5", "fd00::6"),
    );
    let frame = geneve_frame(o.0, o.1, 0, ETH_P_IPV6, 5, &icmp_packet(i.0, i.1));
    cases.push(case(
        "geneve, ipv6 in ipv6, vni 0",
        frame,
        Expect::tunnel(Proto::Geneve, o, 0, Some(i)),
    ));

    let (o, i) = (
        pair("192.0.2.15", "192.0.2.16"),
        pair("10.1.0.15", "10.1.0.16"),
    );
    let frame = geneve_frame(o.0, o.1, 77, ETH_P_TEB, 63, &icmp_eth_frame(i.0, i.1));
    cases.push(case(
        "geneve, 252 bytes of options",
        frame,
        Expect::tunnel(Proto::Geneve, o, 77, Some(i)),
    ));

    let o = pair("192.0.2.17", "192.0.2.18");
    let frame = geneve_frame(o.0, o.1, 78, 0x88cc, 1, &[0u8; 40]);
    cases.push(case(
        "geneve, unknown protocol",
        frame,
        Expect::tunnel(Proto::Geneve, o, 78, None),
    ));

    let (o, i) = (
        pair("192.0.2.19", "192.0.2.20"),
        pair("10.1.0.19", "10.1.0.20"),
    );
    let frame = ipip_frame(o.0, o.1, &icmp_packet(i.0, i.1));
    cases.push(case(
        "ipip, ipv4 in ipv4",
        frame,
        Expect::tunnel(Proto::Ipip, o, 0, Some(i)),
    ));

    let (o, i) = (
        pair("2001:db8::7", "2001:db8::8"),
        pair("10.1.0.21", "10.1.0.22"),
    );
    let frame = ipip_frame(o.0, o.1, &icmp_packet(i.0, i.1));
    cases.push(case(
        "ipip, ipv4 in ipv6",
        frame,
        Expect::tunnel(Proto::Ipip, o, 0, Some(i)),
    ));

    let (o, i) = (
        pair("192.0.2.23", "192.0.2.24"),
        pair("fd00::23", "fd00::24"),
    );
    let frame = ip6ip_frame(o.0, o.1, &icmp_packet(i.0, i.1));
    cases.push(case(
        "ip6ip, ipv6 in ipv4 (6in4)",
        frame,
        Expect::tunnel(Proto::Ip6ip, o, 0, Some(i)),
    ));

    let (o, i) = (
        pair("2001:db8::9", "2001:db8::a"),
        pair("fd00::25", "fd00::26"),
    );
    let frame = ip6ip_frame(o.0, o.1, &icmp_packet(i.0, i.1));
    cases.push(case(
        "ip6ip, ipv6 in ipv6",
        frame,
        Expect::tunnel(Proto::Ip6ip, o, 0, Some(i)),
    ));

    let (o, i) = (
        pair("192.0.2.27", "192.0.2.28"),
        pair("10.1.0.27", "10.1.0.28"),
    );
    let frame = gre_frame(o.0, o.1, &Gre::default(), ETH_P_IP, &icmp_packet(i.0, i.1));
    cases.push(case(
        "gre, no options, inner ipv4",
        frame,
        Expect::tunnel(Proto::Gre, o, 0, Some(i)),
    ));

    let (o, i) = (
        pair("192.0.2.29", "192.0.2.30"),
        pair("fd00::29", "fd00::30"),
    );
    let gre = Gre {
        checksum: true,
        key: Some(0xdead),
        seq: Some(42),
    };
    let frame = gre_frame(o.0, o.1, &gre, ETH_P_IPV6, &icmp_packet(i.0, i.1));
    cases.push(case(
        "gre, checksum+key+sequence, inner ipv6",
        frame,
        Expect::tunnel(Proto::Gre, o, 0, Some(i)),
    ));

    let (o, i) = (
        pair("192.0.2.31", "192.0.2.32"),
        pair("10.1.0.31", "10.1.0.32"),
    );
    let gre = Gre {
        key: Some(1),
        ..Gre::default()
    };
    let frame = gre_frame(o.0, o.1, &gre, ETH_P_TEB, &icmp_eth_frame(i.0, i.1));
    cases.push(case(
        "gre, key, inner ethernet (gretap)",
        frame,
        Expect::tunnel(Proto::Gre, o, 0, Some(i)),
    ));

    let (o, i) = (
        pair("2001:db8::b", "2001:db8::c"),
        pair("10.1.0.33", "10.1.0.34"),
    );
    let gre = Gre {
        seq: Some(9),
        ..Gre::default()
    };
    let frame = gre_frame(o.0, o.1, &gre, ETH_P_IP, &icmp_packet(i.0, i.1));
    cases.push(case(
        "gre, ipv6 outer, sequence",
        frame,
        Expect::tunnel(Proto::Gre, o, 0, Some(i)),
    ));

    let o = pair("192.0.2.35", "192.0.2.36");
    let gre = Gre {
        key: Some(0x28),
        ..Gre::default()
    };
    let frame = gre_frame(o.0, o.1, &gre, 0x8909, &[0u8; 44]);
    cases.push(case(
        "gre, unknown inner protocol",
        frame,
        Expect::tunnel(Proto::Gre, o, 0, None),
    ));

    let o = pair("192.0.2.37", "192.0.2.38");
    let frame = ip_frame(
        o.0,
        o.1,
        IPPROTO_GRE,
        &gre_v1(&[0xff, 0x03, 0x00, 0x21, 0x45]),
    );
    cases.push(case(
        "gre version 1 (pptp)",
        frame,
        Expect::tunnel(Proto::Gre, o, 0, None),
    ));

    let o = pair("192.0.2.39", "192.0.2.40");
    let frame = wireguard_frame(
        o.0,
        o.1,
        40000,
        WIREGUARD_PORT,
        &wireguard_transport(1, 2, 100),
    );
    cases.push(case(
        "wireguard, to the listen port",
        frame,
        Expect::tunnel(Proto::Wireguard, o, 0, None),
    ));

    let o = pair("192.0.2.41", "192.0.2.42");
    let frame = wireguard_frame(
        o.0,
        o.1,
        WIREGUARD_PORT,
        40000,
        &wireguard_transport(3, 4, 60),
    );
    cases.push(case(
        "wireguard, from the listen port",
        frame,
        Expect::tunnel(Proto::Wireguard, o, 0, None),
    ));

    let o = pair("2001:db8::d", "2001:db8::e");
    let frame = wireguard_frame(o.0, o.1, 51000, 51821, &wireguard_initiation(5));
    cases.push(case(
        "wireguard, ipv6 on 51821, handshake",
        frame,
        Expect::tunnel(Proto::Wireguard, o, 0, None),
    ));

    let o = pair("192.0.2.43", "192.0.2.44");
    cases.push(case(
        "plain tcp",
        tcp_frame(o.0, o.1, 40000, 443, b"hello"),
        Expect::plain(),
    ));
    let o = pair("2001:db8::f", "2001:db8::10");
    cases.push(case(
        "plain udp, ipv6",
        udp_frame(o.0, o.1, 40000, 53, b"query"),
        Expect::plain(),
    ));
    let o = pair("192.0.2.45", "192.0.2.46");
    cases.push(case(
        "plain icmp",
        ip_frame(o.0, o.1, IPPROTO_ICMP, &icmp4_echo(1, 1, b"x")),
        Expect::plain(),
    ));
    let o = pair("2001:db8::11", "2001:db8::12");
    let echo = icmp6_echo(v6(o.0), v6(o.1), 1, 1, b"x");
    cases.push(case(
        "plain icmpv6",
        ip_frame(o.0, o.1, IPPROTO_ICMPV6, &echo),
        Expect::plain(),
    ));
    let o = pair("192.0.2.47", "192.0.2.48");
    let frame = udp_frame(
        o.0,
        o.1,
        VXLAN_PORT,
        40000,
        &cat(&[&vxlan_header(1), &[0u8; 60]]),
    );
    cases.push(case(
        "udp from 4789 (only wireguard matches source ports)",
        frame,
        Expect::plain(),
    ));
    let frame = udp_frame(
        o.0,
        o.1,
        GENEVE_PORT,
        40000,
        &geneve_header(1, ETH_P_TEB, 0),
    );
    cases.push(case("udp from 6081", frame, Expect::plain()));
    let frame = ip_frame(o.0, o.1, IPPROTO_ESP, &[0u8; 40]);
    cases.push(case("plain esp", frame, Expect::plain()));
    cases
}

/// VLAN tags, IPv6 extension headers, IPv4 options and fragments.
fn layer_cases() -> Vec<Case> {
    let mut cases = Vec::new();

    let (o, i) = (
        pair("198.51.100.1", "198.51.100.2"),
        pair("10.2.0.1", "10.2.0.2"),
    );
    let frame = with_vlans(
        &vxlan_frame(o.0, o.1, 11, &icmp_eth_frame(i.0, i.1)),
        &[Vlan::dot1q(10)],
    );
    cases.push(case(
        "vxlan in 802.1Q",
        frame,
        Expect::tunnel(Proto::Vxlan, o, 11, Some(i)),
    ));

    let (o, i) = (
        pair("198.51.100.3", "198.51.100.4"),
        pair("10.2.0.3", "10.2.0.4"),
    );
    let frame = geneve_frame(o.0, o.1, 12, ETH_P_TEB, 1, &icmp_eth_frame(i.0, i.1));
    let frame = with_vlans(&frame, &[Vlan::dot1ad(100), Vlan::dot1q(200)]);
    cases.push(case(
        "geneve in QinQ (802.1ad + 802.1Q)",
        frame,
        Expect::tunnel(Proto::Geneve, o, 12, Some(i)),
    ));

    let o = pair("2001:db8:1::1", "2001:db8:1::2");
    let frame = wireguard_frame(
        o.0,
        o.1,
        40001,
        WIREGUARD_PORT,
        &wireguard_transport(1, 1, 0),
    );
    let frame = with_vlans(&frame, &[Vlan::dot1q(1), Vlan::dot1q(2)]);
    cases.push(case(
        "wireguard, ipv6, two 802.1Q tags",
        frame,
        Expect::tunnel(Proto::Wireguard, o, 0, None),
    ));

    let o = pair("198.51.100.5", "198.51.100.6");
    let frame = with_vlans(
        &tcp_frame(o.0, o.1, 1, 2, b"x"),
        &[Vlan::dot1ad(5), Vlan::dot1q(6)],
    );
    cases.push(case("plain tcp in QinQ", frame, Expect::plain()));

    let (o, i) = (
        pair("2001:db8:1::3", "2001:db8:1::4"),
        pair("10.2.0.5", "10.2.0.6"),
    );
    let exts = [
        Ipv6Ext::HopByHop(0),
        Ipv6Ext::Routing(1),
        Ipv6Ext::DestOpts(2),
    ];
    let vx = cat(&[&vxlan_header(13), &icmp_eth_frame(i.0, i.1)]);
    let l4 = udp(o.0, o.1, ENTROPY_PORT, VXLAN_PORT, &vx);
    let frame = eth(
        ETH_P_IPV6,
        &ipv6_ext(v6(o.0), v6(o.1), &exts, IPPROTO_UDP, &l4),
    );
    cases.push(case(
        "vxlan, ipv6 hop-by-hop + routing + dest opts",
        frame,
        Expect::tunnel(Proto::Vxlan, o, 13, Some(i)),
    ));

    let (o, i) = (
        pair("2001:db8:1::5", "2001:db8:1::6"),
        pair("10.2.0.7", "10.2.0.8"),
    );
    let exts = [Ipv6Ext::Fragment {
        offset: 0,
        more: true,
    }];
    let gnv = cat(&[&geneve_header(14, ETH_P_IP, 0), &icmp_packet(i.0, i.1)]);
    let l4 = udp(o.0, o.1, ENTROPY_PORT, GENEVE_PORT, &gnv);
    let frame = eth(
        ETH_P_IPV6,
        &ipv6_ext(v6(o.0), v6(o.1), &exts, IPPROTO_UDP, &l4),
    );
    cases.push(case(
        "geneve, ipv6 first fragment",
        frame,
        Expect::tunnel(Proto::Geneve, o, 14, Some(i)),
    ));

    let o = pair("2001:db8:1::7", "2001:db8:1::8");
    let l4 = udp(
        o.0,
        o.1,
        40002,
        WIREGUARD_PORT,
        &wireguard_transport(2, 2, 16),
    );
    let frame = eth(
        ETH_P_IPV6,
        &ipv6_ext(v6(o.0), v6(o.1), &[Ipv6Ext::Ah], IPPROTO_UDP, &l4),
    );
    cases.push(case(
        "wireguard behind an ipv6 authentication header",
        frame,
        Expect::tunnel(Proto::Wireguard, o, 0, None),
    ));

    let (o, i) = (
        pair("2001:db8:1::9", "2001:db8:1::a"),
        pair("10.2.0.9", "10.2.0.10"),
    );
    let g = Gre::default().encap(ETH_P_IP, &icmp_packet(i.0, i.1));
    let frame = eth(
        ETH_P_IPV6,
        &ipv6_ext(v6(o.0), v6(o.1), &[Ipv6Ext::HopByHop(1)], IPPROTO_GRE, &g),
    );
    cases.push(case(
        "gre behind ipv6 hop-by-hop",
        frame,
        Expect::tunnel(Proto::Gre, o, 0, Some(i)),
    ));

    let (o, i) = (
        pair("2001:db8:1::b", "2001:db8:1::c"),
        pair("10.2.0.11", "10.2.0.12"),
    );
    let inner = icmp_packet(i.0, i.1);
    let frame = eth(
        ETH_P_IPV6,
        &ipv6_ext(
            v6(o.0),
            v6(o.1),
            &[Ipv6Ext::DestOpts(0)],
            IPPROTO_IPIP,
            &inner,
        ),
    );
    cases.push(case(
        "ipip behind ipv6 dest opts",
        frame,
        Expect::tunnel(Proto::Ipip, o, 0, Some(i)),
    ));

    let o = pair("2001:db8:1::d", "2001:db8:1::e");
    let exts = [Ipv6Ext::Fragment {
        offset: 100,
        more: true,
    }];
    let fake = udp(o.0, o.1, ENTROPY_PORT, VXLAN_PORT, &vxlan_header(15));
    let frame = eth(
        ETH_P_IPV6,
        &ipv6_ext(v6(o.0), v6(o.1), &exts, IPPROTO_UDP, &fake),
    );
    cases.push(case(
        "ipv6 later fragment (looks like vxlan)",
        frame,
        Expect::plain(),
    ));

    let (o, i) = (
        pair("198.51.100.7", "198.51.100.8"),
        pair("10.2.0.13", "10.2.0.14"),
    );
    let opts = Ipv4Options {
        options: cat(&[&IPV4_OPT_ROUTER_ALERT, &[IPV4_OPT_NOP; 3]]),
        ..Ipv4Options::default()
    };
    let vx = cat(&[&vxlan_header(16), &icmp_eth_frame(i.0, i.1)]);
    let l4 = udp(o.0, o.1, ENTROPY_PORT, VXLAN_PORT, &vx);
    let frame = eth(
        ETH_P_IP,
        &ipv4_with(&opts, v4(o.0), v4(o.1), IPPROTO_UDP, &l4),
    );
    cases.push(case(
        "vxlan, ipv4 with 8 bytes of options",
        frame,
        Expect::tunnel(Proto::Vxlan, o, 16, Some(i)),
    ));

    let (o, i) = (
        pair("198.51.100.9", "198.51.100.10"),
        pair("10.2.0.15", "10.2.0.16"),
    );
    let opts = Ipv4Options {
        options: IPV4_OPT_ROUTER_ALERT.repeat(10),
        ..Ipv4Options::default()
    };
    let g = Gre::default().encap(ETH_P_IP, &icmp_packet(i.0, i.1));
    let frame = eth(
        ETH_P_IP,
        &ipv4_with(&opts, v4(o.0), v4(o.1), IPPROTO_GRE, &g),
    );
    cases.push(case(
        "gre, ipv4 with 40 bytes of options",
        frame,
        Expect::tunnel(Proto::Gre, o, 0, Some(i)),
    ));

    let (o, i) = (
        pair("198.51.100.11", "198.51.100.12"),
        pair("10.2.0.17", "10.2.0.18"),
    );
    let opts = Ipv4Options {
        more_fragments: true,
        ..Ipv4Options::default()
    };
    let vx = cat(&[&vxlan_header(17), &icmp_eth_frame(i.0, i.1)]);
    let l4 = udp(o.0, o.1, ENTROPY_PORT, VXLAN_PORT, &vx);
    let frame = eth(
        ETH_P_IP,
        &ipv4_with(&opts, v4(o.0), v4(o.1), IPPROTO_UDP, &l4),
    );
    cases.push(case(
        "vxlan, ipv4 first fragment",
        frame,
        Expect::tunnel(Proto::Vxlan, o, 17, Some(i)),
    ));

    let o = pair("198.51.100.13", "198.51.100.14");
    for (more, name) in [
        (true, "ipv4 middle fragment"),
        (false, "ipv4 last fragment"),
    ] {
        let opts = Ipv4Options {
            more_fragments: more,
            fragment_offset: 185,
            ..Ipv4Options::default()
        };
        let fake = udp(o.0, o.1, ENTROPY_PORT, VXLAN_PORT, &vxlan_header(18));
        let frame = eth(
            ETH_P_IP,
            &ipv4_with(&opts, v4(o.0), v4(o.1), IPPROTO_UDP, &fake),
        );
        cases.push(case(
            format!("{name} (looks like vxlan)"),
            frame,
            Expect::plain(),
        ));
    }
    cases
}

/// Frames that cannot be classified, each with its reason.
fn malformed_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let o = pair("203.0.113.1", "203.0.113.2");
    let o6 = pair("2001:db8:2::1", "2001:db8:2::2");
    let tcp4 = tcp_frame(o.0, o.1, 1000, 80, b"GET / HTTP/1.1");
    let udp6 = udp_frame(o6.0, o6.1, 1000, 53, b"query");

    let tagged = with_vlans(&tcp4, &[Vlan::dot1q(3)]);
    cases.push(case(
        "802.1Q tag cut short",
        tagged[..16].to_vec(),
        Expect::unclassified(Unclassified::TruncatedL2),
    ));
    let qinq = with_vlans(&tcp4, &[Vlan::dot1ad(3), Vlan::dot1q(4)]);
    cases.push(case(
        "inner QinQ tag cut short",
        qinq[..20].to_vec(),
        Expect::unclassified(Unclassified::TruncatedL2),
    ));
    let three = with_vlans(&tcp4, &[Vlan::dot1ad(3), Vlan::dot1q(4), Vlan::dot1q(5)]);
    cases.push(case(
        "three VLAN tags",
        three,
        Expect::unclassified(Unclassified::Unsupported),
    ));

    let arp = arp_request_frame(v4(o.0), v4(o.1));
    cases.push(case(
        "arp",
        arp,
        Expect::unclassified(Unclassified::Unsupported),
    ));
    cases.push(case(
        "llc / stp",
        stp_llc_frame(),
        Expect::unclassified(Unclassified::Unsupported),
    ));
    cases.push(case(
        "lldp",
        eth(0x88cc, &[0u8; 46]),
        Expect::unclassified(Unclassified::Unsupported),
    ));
    let tagged_arp = with_vlans(&arp_request_frame(v4(o.0), v4(o.1)), &[Vlan::dot1q(7)]);
    cases.push(case(
        "arp in 802.1Q",
        tagged_arp,
        Expect::unclassified(Unclassified::Unsupported),
    ));

    cases.push(case(
        "ipv4 header cut short",
        tcp4[..24].to_vec(),
        Expect::unclassified(Unclassified::TruncatedL3),
    ));
    cases.push(case(
        "ipv4 header cut short, in 802.1Q",
        tagged[..30].to_vec(),
        Expect::unclassified(Unclassified::TruncatedL3),
    ));
    let opts = Ipv4Options {
        options: IPV4_OPT_ROUTER_ALERT.repeat(3),
        ..Ipv4Options::default()
    };
    let with_opts = eth(
        ETH_P_IP,
        &ipv4_with(
            &opts,
            v4(o.0),
            v4(o.1),
            IPPROTO_UDP,
            &udp(o.0, o.1, 1, 2, b""),
        ),
    );
    cases.push(case(
        "ipv4 options cut short",
        with_opts[..ETH_HLEN + 28].to_vec(),
        Expect::unclassified(Unclassified::TruncatedL3),
    ));
    cases.push(case(
        "ipv6 header cut short",
        udp6[..50].to_vec(),
        Expect::unclassified(Unclassified::TruncatedL3),
    ));
    let exts = [Ipv6Ext::HopByHop(0), Ipv6Ext::DestOpts(0)];
    let l4 = udp(o6.0, o6.1, 1, 2, b"");
    let ext_frame = eth(
        ETH_P_IPV6,
        &ipv6_ext(v6(o6.0), v6(o6.1), &exts, IPPROTO_UDP, &l4),
    );
    cases.push(case(
        "ipv6 extension header cut short",
        ext_frame[..ETH_HLEN + IPV6_HLEN + 9].to_vec(),
        Expect::unclassified(Unclassified::TruncatedL3),
    ));

    let mut bad = tcp4.clone();
    bad[ETH_HLEN] = 0x65; // version 6 in an IPv4 EtherType
    cases.push(case(
        "ipv4 ethertype, version 6",
        bad,
        Expect::unclassified(Unclassified::MalformedL3),
    ));
    let mut bad = tcp4.clone();
    bad[ETH_HLEN] = 0x44; // IHL 4: shorter than the fixed header
    cases.push(case(
        "ipv4 ihl 4",
        bad,
        Expect::unclassified(Unclassified::MalformedL3),
    ));
    let mut bad = tcp4.clone();
    bad[ETH_HLEN] = 0x40;
    cases.push(case(
        "ipv4 ihl 0",
        bad,
        Expect::unclassified(Unclassified::MalformedL3),
    ));
    let mut bad = udp6.clone();
    bad[ETH_HLEN] = 0x45; // version 4 in an IPv6 EtherType
    cases.push(case(
        "ipv6 ethertype, version 4",
        bad,
        Expect::unclassified(Unclassified::MalformedL3),
    ));

    let udp4 = udp_frame(o.0, o.1, 1000, 53, b"query");
    cases.push(case(
        "udp header cut short",
        udp4[..ETH_HLEN + 24].to_vec(),
        Expect::unclassified(Unclassified::TruncatedL4),
    ));
    cases.push(case(
        "udp header cut short, ipv6",
        udp6[..ETH_HLEN + 46].to_vec(),
        Expect::unclassified(Unclassified::TruncatedL4),
    ));

    let short_vx = udp_frame(o.0, o.1, ENTROPY_PORT, VXLAN_PORT, &[0x08, 0, 0, 0]);
    cases.push(case(
        "udp 4789 with 4 payload bytes",
        short_vx,
        Expect::unclassified(Unclassified::TruncatedEncap),
    ));
    let vx = vxlan_frame(o.0, o.1, 1, &icmp_eth_frame(o.0, o.1));
    let cut = ETH_HLEN + IPV4_HLEN + UDP_HLEN + 7;
    cases.push(case(
        "vxlan header cut short",
        vx[..cut].to_vec(),
        Expect::unclassified(Unclassified::TruncatedEncap),
    ));
    let short_gpe = udp_frame(o6.0, o6.1, ENTROPY_PORT, VXLAN_GPE_PORT, b"");
    cases.push(case(
        "udp 4790 without payload",
        short_gpe,
        Expect::unclassified(Unclassified::TruncatedEncap),
    ));
    let short_gen = udp_frame(
        o.0,
        o.1,
        ENTROPY_PORT,
        GENEVE_PORT,
        &[0, 0, 0x65, 0x58, 0, 0, 1],
    );
    cases.push(case(
        "udp 6081 with 7 payload bytes",
        short_gen,
        Expect::unclassified(Unclassified::TruncatedEncap),
    ));
    let short_gre = ip_frame(o.0, o.1, IPPROTO_GRE, &[0, 0, 0x08]);
    cases.push(case(
        "gre with 3 bytes",
        short_gre,
        Expect::unclassified(Unclassified::TruncatedEncap),
    ));
    let short_gre6 = ip_frame(o6.0, o6.1, IPPROTO_GRE, b"");
    cases.push(case(
        "gre over ipv6 without payload",
        short_gre6,
        Expect::unclassified(Unclassified::TruncatedEncap),
    ));

    let exts = [
        Ipv6Ext::HopByHop(0),
        Ipv6Ext::DestOpts(0),
        Ipv6Ext::Routing(0),
        Ipv6Ext::DestOpts(0),
        Ipv6Ext::Fragment {
            offset: 0,
            more: false,
        },
    ];
    let vx = udp(o6.0, o6.1, ENTROPY_PORT, VXLAN_PORT, &vxlan_header(1));
    let frame = eth(
        ETH_P_IPV6,
        &ipv6_ext(v6(o6.0), v6(o6.1), &exts, IPPROTO_UDP, &vx),
    );
    cases.push(case(
        "five ipv6 extension headers",
        frame,
        Expect::unclassified(Unclassified::Unsupported),
    ));

    // Extension headers reaching past the 512 bytes the programs read: a
    // class of their own, not a cut frame (tcpdump follows them), whether
    // what lies beyond is IPIP or VXLAN; a 400-byte header still ends
    // inside the window, and the tunnel behind it is counted.
    let i = pair("10.3.0.1", "10.3.0.2");
    let inner = icmp_packet(i.0, i.1);
    let o = pair("2001:db8:2::3", "2001:db8:2::4");
    for (name, options, expect) in [
        (
            "ipip behind 2 KB of ipv6 destination options",
            255,
            Expect::unclassified(Unclassified::BeyondWindow),
        ),
        (
            "ipip behind 400 bytes of ipv6 destination options",
            49,
            Expect::tunnel(Proto::Ipip, o, 0, Some(i)),
        ),
    ] {
        let frame = eth(
            ETH_P_IPV6,
            &ipv6_ext(
                v6(o.0),
                v6(o.1),
                &[Ipv6Ext::DestOpts(options)],
                IPPROTO_IPIP,
                &inner,
            ),
        );
        cases.push(case(name, frame, expect));
    }
    let vx = udp(o6.0, o6.1, ENTROPY_PORT, VXLAN_PORT, &vxlan_header(1));
    let frame = eth(
        ETH_P_IPV6,
        &ipv6_ext(
            v6(o6.0),
            v6(o6.1),
            &[Ipv6Ext::HopByHop(0), Ipv6Ext::DestOpts(74)],
            IPPROTO_UDP,
            &vx,
        ),
    );
    cases.push(case(
        "vxlan behind 608 bytes of ipv6 extension headers",
        frame,
        Expect::unclassified(Unclassified::BeyondWindow),
    ));
    cases
}

// -------------------------------------------------------------------- tests

#[test]
fn every_encapsulation_on_every_hook() {
    if !support::have_root("every_encapsulation_on_every_hook") {
        return;
    }
    let mut h = Harness::new(&LoadConfig::default());
    for c in tunnel_cases() {
        h.check(&c, 3);
    }
    h.finish("every_encapsulation_on_every_hook");
}

#[test]
fn vlans_ipv6_extensions_ipv4_options_and_fragments() {
    if !support::have_root("vlans_ipv6_extensions_ipv4_options_and_fragments") {
        return;
    }
    let mut h = Harness::new(&LoadConfig::default());
    for c in layer_cases() {
        h.check(&c, 2);
    }
    h.finish("vlans_ipv6_extensions_ipv4_options_and_fragments");
}

#[test]
fn truncated_and_malformed_frames() {
    if !support::have_root("truncated_and_malformed_frames") {
        return;
    }
    let mut h = Harness::new(&LoadConfig::default());
    for c in malformed_cases() {
        h.check(&c, 2);
    }
    h.finish("truncated_and_malformed_frames");
}

/// Bytes of all headers up to and including the innermost TCP/UDP header,
/// which every GSO segment repeats.
struct GsoCase {
    name: &'static str,
    frame: Vec<u8>,
    expect: Expect,
    headers: usize,
}

fn gso_cases() -> Vec<GsoCase> {
    let payload = vec![0x42u8; 1400];
    let mut cases = Vec::new();

    let (o, i) = (
        pair("192.0.2.101", "192.0.2.102"),
        pair("10.3.0.1", "10.3.0.2"),
    );
    let seg = tcp_with_options(i.0, i.1, 40000, 5201, &TCP_OPT_TIMESTAMPS, &payload);
    let inner = eth(ETH_P_IP, &ip(i.0, i.1, IPPROTO_TCP, &seg));
    cases.push(GsoCase {
        name: "vxlan, inner tcp with timestamps",
        frame: vxlan_frame(o.0, o.1, 21, &inner),
        expect: Expect::tunnel(Proto::Vxlan, o, 21, Some(i)),
        headers: ETH_HLEN
            + IPV4_HLEN
            + UDP_HLEN
            + VXLAN_HLEN
            + ETH_HLEN
            + IPV4_HLEN
            + TCP_HLEN
            + 12,
    });

    let (o, i) = (
        pair("2001:db8::101", "2001:db8::102"),
        pair("fd00::101", "fd00::102"),
    );
    let seg = tcp(i.0, i.1, 40000, 5201, &payload);
    let inner = ip(i.0, i.1, IPPROTO_TCP, &seg);
    cases.push(GsoCase {
        name: "geneve with options over ipv6, inner ipv6 tcp",
        frame: geneve_frame(o.0, o.1, 22, ETH_P_IPV6, 2, &inner),
        expect: Expect::tunnel(Proto::Geneve, o, 22, Some(i)),
        headers: ETH_HLEN + IPV6_HLEN + UDP_HLEN + GENEVE_HLEN + 8 + IPV6_HLEN + TCP_HLEN,
    });

    let (o, i) = (
        pair("192.0.2.103", "192.0.2.104"),
        pair("10.3.0.3", "10.3.0.4"),
    );
    let dgram = udp(i.0, i.1, 40000, 4433, &payload);
    let inner = eth(ETH_P_IP, &ip(i.0, i.1, IPPROTO_UDP, &dgram));
    cases.push(GsoCase {
        name: "vxlan, inner udp (udp gso)",
        frame: vxlan_frame(o.0, o.1, 23, &inner),
        expect: Expect::tunnel(Proto::Vxlan, o, 23, Some(i)),
        headers: ETH_HLEN + IPV4_HLEN + UDP_HLEN + VXLAN_HLEN + ETH_HLEN + IPV4_HLEN + UDP_HLEN,
    });

    let (o, i) = (
        pair("192.0.2.105", "192.0.2.106"),
        pair("10.3.0.5", "10.3.0.6"),
    );
    let seg = tcp(i.0, i.1, 40000, 5201, &payload);
    cases.push(GsoCase {
        name: "ipip, inner tcp",
        frame: ipip_frame(o.0, o.1, &ip(i.0, i.1, IPPROTO_TCP, &seg)),
        expect: Expect::tunnel(Proto::Ipip, o, 0, Some(i)),
        headers: ETH_HLEN + IPV4_HLEN + IPV4_HLEN + TCP_HLEN,
    });

    let (o, i) = (
        pair("192.0.2.107", "192.0.2.108"),
        pair("fd00::107", "fd00::108"),
    );
    let seg = tcp_with_options(i.0, i.1, 40000, 5201, &TCP_OPT_TIMESTAMPS, &payload);
    let gre = Gre {
        key: Some(5),
        seq: Some(6),
        ..Gre::default()
    };
    cases.push(GsoCase {
        name: "gre with key and sequence, inner ipv6 tcp",
        frame: gre_frame(o.0, o.1, &gre, ETH_P_IPV6, &ip(i.0, i.1, IPPROTO_TCP, &seg)),
        expect: Expect::tunnel(Proto::Gre, o, 0, Some(i)),
        headers: ETH_HLEN + IPV4_HLEN + GRE_HLEN + 8 + IPV6_HLEN + TCP_HLEN + 12,
    });
    cases
}

#[test]
fn gso_skbs_count_their_segments() {
    if !support::have_root("gso_skbs_count_their_segments") {
        return;
    }
    let mut h = Harness::new(&LoadConfig::default());
    const SEGS: u64 = 4;
    for c in gso_cases() {
        let ctx = skb_gso_ctx(SEGS as u32, 1400);
        for hook in [Hook::TcIngress, Hook::TcEgress] {
            let changed = h
                .run(hook, &c.frame, Some(&ctx), 1)
                .expect("the kernel takes these frames");
            let len = c.frame.len() as u64;
            let want = Changed {
                id: c.expect.id(hook),
                packets: SEGS,
                bytes: len + (SEGS - 1) * c.headers as u64,
                inner: c.expect.inner,
            };
            assert_eq!(changed, vec![want], "{} through {hook:?}", c.name);
        }
        // One segment (or none declared) is one packet of the skb's length.
        for segs in [0, 1] {
            let ctx = skb_gso_ctx(segs, 0);
            let changed = h
                .run(Hook::TcEgress, &c.frame, Some(&ctx), 1)
                .expect("tc run");
            assert_eq!(
                changed
                    .iter()
                    .map(|r| (r.packets, r.bytes))
                    .collect::<Vec<_>>(),
                vec![(1, c.frame.len() as u64)],
                "{} with gso_segs {segs}",
                c.name
            );
        }
    }
    // Without a tunnel the outer TCP header bounds the repeated headers.
    let o = pair("192.0.2.109", "192.0.2.110");
    let payload = 1400;
    let frame = tcp_frame(o.0, o.1, 40000, 5201, &[0u8; 1400]);
    let headers = (frame.len() - payload) as u64;
    let changed = h
        .run(
            Hook::TcEgress,
            &frame,
            Some(&skb_gso_ctx(SEGS as u32, 1400)),
            1,
        )
        .expect("tc run");
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(changed[0].id, Expect::plain().id(Hook::TcEgress));
    assert_eq!(changed[0].packets, SEGS);
    assert_eq!(
        changed[0].bytes,
        frame.len() as u64 + (SEGS - 1) * headers,
        "{changed:?}"
    );
    h.finish("gso_skbs_count_their_segments");
}

#[test]
fn custom_udp_ports_replace_the_defaults() {
    if !support::have_root("custom_udp_ports_replace_the_defaults") {
        return;
    }
    let config = LoadConfig {
        ports: PortConfig {
            vxlan: vec![9999],
            wireguard: vec![40000],
            ..PortConfig::default()
        },
        ..LoadConfig::default()
    };
    let mut h = Harness::new(&config);
    let (o, i) = (
        pair("192.0.2.201", "192.0.2.202"),
        pair("10.4.0.1", "10.4.0.2"),
    );
    let vx = cat(&[&vxlan_header(31), &icmp_eth_frame(i.0, i.1)]);
    let cases = [
        case(
            "vxlan on custom port 9999",
            udp_frame(o.0, o.1, ENTROPY_PORT, 9999, &vx),
            Expect::tunnel(Proto::Vxlan, o, 31, Some(i)),
        ),
        case(
            "4789 is no longer vxlan",
            udp_frame(o.0, o.1, ENTROPY_PORT, VXLAN_PORT, &vx),
            Expect::plain(),
        ),
        case(
            "8472 is no longer vxlan",
            udp_frame(o.0, o.1, ENTROPY_PORT, VXLAN_LINUX_PORT, &vx),
            Expect::plain(),
        ),
        case(
            "geneve keeps its default port",
            geneve_frame(o.0, o.1, 32, ETH_P_TEB, 0, &icmp_eth_frame(i.0, i.1)),
            Expect::tunnel(Proto::Geneve, o, 32, Some(i)),
        ),
        case(
            "wireguard on custom port 40000, as source",
            wireguard_frame(o.0, o.1, 40000, 12345, &wireguard_transport(1, 1, 32)),
            Expect::tunnel(Proto::Wireguard, o, 0, None),
        ),
        case(
            "51820 is no longer wireguard",
            wireguard_frame(
                o.0,
                o.1,
                12345,
                WIREGUARD_PORT,
                &wireguard_transport(1, 1, 32),
            ),
            Expect::plain(),
        ),
    ];
    for c in &cases {
        h.check(c, 1);
    }
    h.finish("custom_udp_ports_replace_the_defaults");
}

// --------------------------------------------------------------------- fuzz

/// splitmix64: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A valid frame and where its layers end: cut before `limits[k].0`
/// bytes, it must be counted as unclassified with reason `limits[k].1`
/// (first matching limit); whole from the last limit on, it is `expect`.
/// Cuts in `unsettled` are not checked here (a parser gap test covers them).
struct Seed {
    name: &'static str,
    frame: Vec<u8>,
    expect: Expect,
    limits: Vec<(usize, Unclassified)>,
    unsettled: std::ops::Range<usize>,
}

impl Seed {
    /// Bytes that decide the row: corruption behind them must not change it.
    fn key_end(&self) -> usize {
        let last = self.limits.last().map_or(ETH_HLEN, |l| l.0);
        last.max(self.unsettled.end)
    }
}

fn seeds() -> Vec<Seed> {
    let l2 = ETH_HLEN;
    let l3_4 = l2 + IPV4_HLEN;
    let l3_6 = l2 + IPV6_HLEN;
    let mut seeds = Vec::new();
    let i = pair("10.5.0.1", "10.5.0.2");
    let inner_eth = icmp_eth_frame(i.0, i.1);

    let o = pair("192.0.2.151", "192.0.2.152");
    seeds.push(Seed {
        name: "vxlan over ipv4",
        frame: vxlan_frame(o.0, o.1, 41, &inner_eth),
        expect: Expect::tunnel(Proto::Vxlan, o, 41, Some(i)),
        limits: vec![
            (l3_4, Unclassified::TruncatedL3),
            (l3_4 + 8, Unclassified::TruncatedL4),
            (l3_4 + 16, Unclassified::TruncatedEncap),
        ],
        unsettled: 0..0,
    });

    let o = pair("2001:db8:3::1", "2001:db8:3::2");
    let t = l3_6 + VLAN_HLEN;
    seeds.push(Seed {
        name: "vxlan over ipv6 in 802.1Q",
        frame: with_vlans(&vxlan_frame(o.0, o.1, 42, &inner_eth), &[Vlan::dot1q(42)]),
        expect: Expect::tunnel(Proto::Vxlan, o, 42, Some(i)),
        limits: vec![
            (l2 + 4, Unclassified::TruncatedL2),
            (t, Unclassified::TruncatedL3),
            (t + 8, Unclassified::TruncatedL4),
            (t + 16, Unclassified::TruncatedEncap),
        ],
        unsettled: 0..0,
    });

    let o = pair("192.0.2.153", "192.0.2.154");
    let frame = geneve_frame(o.0, o.1, 43, ETH_P_TEB, 2, &inner_eth);
    let t = l3_4 + 2 * VLAN_HLEN;
    seeds.push(Seed {
        name: "geneve with options in QinQ",
        frame: with_vlans(&frame, &[Vlan::dot1ad(1), Vlan::dot1q(2)]),
        expect: Expect::tunnel(Proto::Geneve, o, 43, Some(i)),
        limits: vec![
            (l2 + 4, Unclassified::TruncatedL2),
            (l2 + 8, Unclassified::TruncatedL2),
            (t, Unclassified::TruncatedL3),
            (t + 8, Unclassified::TruncatedL4),
            (t + 16, Unclassified::TruncatedEncap),
        ],
        unsettled: 0..0,
    });

    let o = pair("2001:db8:3::3", "2001:db8:3::4");
    seeds.push(Seed {
        name: "vxlan-gpe over ipv6",
        frame: vxlan_gpe_frame(o.0, o.1, 44, GPE_NEXT_IPV4, &icmp_packet(i.0, i.1)),
        expect: Expect::tunnel(Proto::VxlanGpe, o, 44, Some(i)),
        limits: vec![
            (l3_6, Unclassified::TruncatedL3),
            (l3_6 + 8, Unclassified::TruncatedL4),
            (l3_6 + 16, Unclassified::TruncatedEncap),
        ],
        unsettled: 0..0,
    });

    let o = pair("192.0.2.155", "192.0.2.156");
    let gre = Gre {
        checksum: true,
        key: Some(1),
        seq: Some(2),
    };
    seeds.push(Seed {
        name: "gre with all options over ipv4",
        frame: gre_frame(o.0, o.1, &gre, ETH_P_TEB, &inner_eth),
        expect: Expect::tunnel(Proto::Gre, o, 0, Some(i)),
        limits: vec![
            (l3_4, Unclassified::TruncatedL3),
            (l3_4 + 4, Unclassified::TruncatedEncap),
        ],
        unsettled: 0..0,
    });

    let o = pair("2001:db8:3::5", "2001:db8:3::6");
    seeds.push(Seed {
        name: "gre over ipv6",
        frame: gre_frame(o.0, o.1, &Gre::default(), ETH_P_IP, &icmp_packet(i.0, i.1)),
        expect: Expect::tunnel(Proto::Gre, o, 0, Some(i)),
        limits: vec![
            (l3_6, Unclassified::TruncatedL3),
            (l3_6 + 4, Unclassified::TruncatedEncap),
        ],
        unsettled: 0..0,
    });

    let o = pair("192.0.2.157", "192.0.2.158");
    seeds.push(Seed {
        name: "ipip",
        frame: ipip_frame(o.0, o.1, &icmp_packet(i.0, i.1)),
        expect: Expect::tunnel(Proto::Ipip, o, 0, Some(i)),
        limits: vec![(l3_4, Unclassified::TruncatedL3)],
        unsettled: 0..0,
    });

    let (o, i6) = (
        pair("2001:db8:3::7", "2001:db8:3::8"),
        pair("fd00::7", "fd00::8"),
    );
    seeds.push(Seed {
        name: "ip6ip over ipv6",
        frame: ip6ip_frame(o.0, o.1, &icmp_packet(i6.0, i6.1)),
        expect: Expect::tunnel(Proto::Ip6ip, o, 0, Some(i6)),
        limits: vec![(l3_6, Unclassified::TruncatedL3)],
        unsettled: 0..0,
    });

    let o = pair("192.0.2.159", "192.0.2.160");
    seeds.push(Seed {
        name: "wireguard reply from the listen port",
        frame: wireguard_frame(
            o.0,
            o.1,
            WIREGUARD_PORT,
            40000,
            &wireguard_transport(1, 1, 48),
        ),
        expect: Expect::tunnel(Proto::Wireguard, o, 0, None),
        limits: vec![
            (l3_4, Unclassified::TruncatedL3),
            (l3_4 + 8, Unclassified::TruncatedL4),
        ],
        // Without its 4-byte message header: see wireguard_needs_its_message_header.
        unsettled: l3_4 + 8..l3_4 + 12,
    });

    let o = pair("192.0.2.161", "192.0.2.162");
    let opts = Ipv4Options {
        options: IPV4_OPT_ROUTER_ALERT.repeat(3),
        ..Ipv4Options::default()
    };
    let l4 = udp(
        o.0,
        o.1,
        ENTROPY_PORT,
        VXLAN_PORT,
        &cat(&[&vxlan_header(45), &inner_eth]),
    );
    let t = l3_4 + 12;
    seeds.push(Seed {
        name: "vxlan over ipv4 with options",
        frame: eth(
            ETH_P_IP,
            &ipv4_with(&opts, v4(o.0), v4(o.1), IPPROTO_UDP, &l4),
        ),
        expect: Expect::tunnel(Proto::Vxlan, o, 45, Some(i)),
        limits: vec![
            (l3_4, Unclassified::TruncatedL3),
            (t, Unclassified::TruncatedL3),
            (t + 8, Unclassified::TruncatedL4),
            (t + 16, Unclassified::TruncatedEncap),
        ],
        unsettled: 0..0,
    });

    let o = pair("192.0.2.163", "192.0.2.164");
    seeds.push(Seed {
        name: "plain tcp",
        frame: tcp_frame(o.0, o.1, 40000, 443, b"hello"),
        expect: Expect::plain(),
        limits: vec![(l3_4, Unclassified::TruncatedL3)],
        unsettled: 0..0,
    });

    let o = pair("2001:db8:3::b", "2001:db8:3::c");
    seeds.push(Seed {
        name: "plain udp over ipv6",
        frame: udp_frame(o.0, o.1, 40000, 53, b"query"),
        expect: Expect::plain(),
        limits: vec![
            (l3_6, Unclassified::TruncatedL3),
            (l3_6 + 8, Unclassified::TruncatedL4),
        ],
        unsettled: 0..0,
    });
    seeds
}

/// What a seed cut to `len` bytes must be counted as.
fn expect_cut(seed: &Seed, len: usize) -> Expect {
    match seed.limits.iter().find(|(end, _)| len < *end) {
        Some((_, reason)) => Expect::unclassified(*reason),
        None => seed.expect,
    }
}

/// Runs every truncation of every seed through every hook and checks that
/// one row changes, by one packet of the cut length, under the key the
/// seed's layer limits predict.
fn sweep_truncations(test: &str, seeds: &[Seed]) {
    let mut h = Harness::new(&LoadConfig::default());
    for seed in seeds {
        for len in ETH_HLEN..=seed.frame.len() {
            if seed.unsettled.contains(&len) {
                continue;
            }
            let frame = &seed.frame[..len];
            let want = expect_cut(seed, len);
            for hook in HOOKS {
                let Some(changed) = h.run(hook, frame, None, 1) else {
                    continue;
                };
                assert_eq!(
                    changed.len(),
                    1,
                    "{} cut to {len} through {hook:?}: {changed:?}",
                    seed.name
                );
                let row = &changed[0];
                assert_eq!(
                    (row.id, row.packets, row.bytes),
                    (want.id(hook), 1, len as u64),
                    "{} cut to {len} bytes through {hook:?}",
                    seed.name
                );
            }
        }
    }
    h.finish(test);
}

/// Every truncation of every seed: in particular no frame shorter than its
/// encapsulation header is ever counted as a tunnel.
#[test]
fn every_truncation_is_classified_by_its_last_complete_layer() {
    let test = "every_truncation_is_classified_by_its_last_complete_layer";
    if !support::have_root(test) {
        return;
    }
    sweep_truncations(test, &seeds());
}

/// Random corruption of valid frames: every hook passes every frame and
/// counts it exactly once. Corruption behind the bytes that make the key
/// (inner headers, payload) never changes the key.
#[test]
fn random_corruptions_pass_and_are_counted_once() {
    if !support::have_root("random_corruptions_pass_and_are_counted_once") {
        return;
    }
    let mut h = Harness::new(&LoadConfig::default());
    let seeds = seeds();
    let mut rng = Rng(0x5eed_0b5e_4e4e_0001);

    // Behind the key (first, while the map is small): the row is the seed's.
    const BEHIND: usize = 600;
    for n in 0..BEHIND {
        let seed = &seeds[n % seeds.len()];
        let key_end = seed.key_end();
        if key_end >= seed.frame.len() {
            continue;
        }
        let mut frame = seed.frame.clone();
        for _ in 0..1 + rng.below(8) {
            let at = key_end + rng.below(frame.len() - key_end);
            frame[at] = rng.next() as u8;
        }
        frame.truncate(key_end + rng.below(frame.len() - key_end + 1));
        for hook in HOOKS {
            let Some(changed) = h.run(hook, &frame, None, 1) else {
                continue;
            };
            let ids: Vec<_> = changed.iter().map(|c| (c.id, c.packets, c.bytes)).collect();
            assert_eq!(
                ids,
                vec![(seed.expect.id(hook), 1, frame.len() as u64)],
                "{} corrupted behind byte {key_end} through {hook:?}: {frame:02x?}",
                seed.name
            );
        }
    }
    // Anywhere in the headers, plus a random cut: only totals can be
    // checked (read once at the end: the map grows with corrupted peers).
    const ANYWHERE: usize = 2000;
    let totals = |rows: &BTreeMap<FlowId, FlowCounters>| {
        rows.values()
            .fold((0, 0), |(p, b), c| (p + c.packets, b + c.bytes))
    };
    let (mut packets, mut bytes) = totals(&h.rows);
    for _ in 0..ANYWHERE {
        let seed = &seeds[rng.below(seeds.len())];
        let mut frame = seed.frame.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(frame.len().min(120));
            frame[at] = match rng.below(3) {
                0 => rng.next() as u8,
                1 => frame[at] ^ (1 << rng.below(8)),
                _ => [0x00, 0xff, 0x08, 0x86, 0x11, 0x2f][rng.below(6)],
            };
        }
        if rng.below(2) == 0 {
            frame.truncate(ETH_HLEN + rng.below(frame.len() - ETH_HLEN + 1));
        }
        for hook in HOOKS {
            if h.run_unchecked(hook, &frame, None, 1).is_some() {
                packets += 1;
                bytes += frame.len() as u64;
            }
        }
    }
    h.changes();
    assert_eq!(
        totals(&h.rows),
        (packets, bytes),
        "every corrupted frame is counted exactly once"
    );
    h.finish("random_corruptions_pass_and_are_counted_once");
}

// ------------------------------------------------------------- edge cases
//
// Limits of the parser that the documentation of `Unclassified` promises.

/// Seeds with IPv6 extension headers; every cut inside an extension header
/// must be `truncated_l3` ("shorter than its IPv6 header or extension headers").
fn ipv6_extension_seeds() -> Vec<Seed> {
    let l3_6 = ETH_HLEN + IPV6_HLEN;
    let i = pair("10.6.0.1", "10.6.0.2");
    let mut seeds = Vec::new();

    let o = pair("2001:db8:4::1", "2001:db8:4::2");
    let exts = [
        Ipv6Ext::Fragment {
            offset: 0,
            more: true,
        },
        Ipv6Ext::Routing(0),
    ];
    let g = Gre::default().encap(ETH_P_IP, &icmp_packet(i.0, i.1));
    seeds.push(Seed {
        name: "gre over ipv6 with fragment + routing headers",
        frame: eth(
            ETH_P_IPV6,
            &ipv6_ext(v6(o.0), v6(o.1), &exts, IPPROTO_GRE, &g),
        ),
        expect: Expect::tunnel(Proto::Gre, o, 0, Some(i)),
        limits: vec![
            (l3_6 + 16, Unclassified::TruncatedL3),
            (l3_6 + 20, Unclassified::TruncatedEncap),
        ],
        unsettled: 0..0,
    });

    let o = pair("2001:db8:4::3", "2001:db8:4::4");
    let exts = [Ipv6Ext::HopByHop(0), Ipv6Ext::DestOpts(2)];
    let vx = cat(&[&vxlan_header(51), &icmp_eth_frame(i.0, i.1)]);
    let l4 = udp(o.0, o.1, ENTROPY_PORT, VXLAN_PORT, &vx);
    let frame = eth(
        ETH_P_IPV6,
        &ipv6_ext(v6(o.0), v6(o.1), &exts, IPPROTO_UDP, &l4),
    );
    let t = l3_6 + VLAN_HLEN + 32;
    seeds.push(Seed {
        name: "vxlan over ipv6 with hop-by-hop + dest opts, in 802.1Q",
        frame: with_vlans(&frame, &[Vlan::dot1q(9)]),
        expect: Expect::tunnel(Proto::Vxlan, o, 51, Some(i)),
        limits: vec![
            (ETH_HLEN + VLAN_HLEN, Unclassified::TruncatedL2),
            (t, Unclassified::TruncatedL3),
            (t + 8, Unclassified::TruncatedL4),
            (t + 16, Unclassified::TruncatedEncap),
        ],
        unsettled: 0..0,
    });

    let o = pair("2001:db8:4::5", "2001:db8:4::6");
    let inner = icmp_packet(i.0, i.1);
    seeds.push(Seed {
        name: "ipip over ipv6 with an authentication header",
        frame: eth(
            ETH_P_IPV6,
            &ipv6_ext(v6(o.0), v6(o.1), &[Ipv6Ext::Ah], IPPROTO_IPIP, &inner),
        ),
        expect: Expect::tunnel(Proto::Ipip, o, 0, Some(i)),
        limits: vec![(l3_6 + 24, Unclassified::TruncatedL3)],
        unsettled: 0..0,
    });

    let o = pair("2001:db8:4::7", "2001:db8:4::8");
    let seg = tcp(o.0, o.1, 40000, 443, b"hello");
    seeds.push(Seed {
        name: "plain tcp over ipv6 with hop-by-hop",
        frame: eth(
            ETH_P_IPV6,
            &ipv6_ext(v6(o.0), v6(o.1), &[Ipv6Ext::HopByHop(1)], IPPROTO_TCP, &seg),
        ),
        expect: Expect::plain(),
        limits: vec![(l3_6 + 16, Unclassified::TruncatedL3)],
        unsettled: 0..0,
    });
    seeds
}

/// Fix: in `ipv6_payload` (observer-ebpf/src/parse.rs), after computing the
/// new offset of a hop-by-hop / routing / destination options / AH header,
/// probe its last two bytes as the IPv4 branch does for options:
/// `if f.read::<[u8; 2]>(off - 2).is_none() { return Err(Unclassified::TruncatedL3); }`
/// and for the fragment header read all 8 bytes (`[u16; 4]`) instead of 4.
#[test]
fn ipv6_extension_header_cuts_are_truncated_l3() {
    let test = "ipv6_extension_header_cuts_are_truncated_l3";
    if !support::have_root(test) {
        return;
    }
    sweep_truncations(test, &ipv6_extension_seeds());
}

/// Fix: `ipv6_payload` gives up after MAX_IPV6_EXT headers without looking
/// at the protocol the last one announces; loop `0..=MAX_IPV6_EXT` (the
/// extra round only returns the upper-layer protocol or fails), or check
/// `next` once more after the loop before returning `Unsupported`.
#[test]
fn four_ipv6_extension_headers_are_followed() {
    let test = "four_ipv6_extension_headers_are_followed";
    if !support::have_root(test) {
        return;
    }
    let mut h = Harness::new(&LoadConfig::default());
    let (o, i) = (
        pair("2001:db8:4::11", "2001:db8:4::12"),
        pair("10.6.0.11", "10.6.0.12"),
    );
    let exts = [
        Ipv6Ext::HopByHop(0),
        Ipv6Ext::DestOpts(0),
        Ipv6Ext::Routing(0),
        Ipv6Ext::Fragment {
            offset: 0,
            more: true,
        },
    ];
    let vx = cat(&[&vxlan_header(52), &icmp_eth_frame(i.0, i.1)]);
    let l4 = udp(o.0, o.1, ENTROPY_PORT, VXLAN_PORT, &vx);
    let frame = eth(
        ETH_P_IPV6,
        &ipv6_ext(v6(o.0), v6(o.1), &exts, IPPROTO_UDP, &l4),
    );
    h.check(
        &case(
            "vxlan behind four ipv6 extension headers",
            frame,
            Expect::tunnel(Proto::Vxlan, o, 52, Some(i)),
        ),
        1,
    );
    h.finish(test);
}

/// Fix: in `udp` (parse.rs), the WireGuard branch returns before reading
/// anything behind the UDP header; require the message type and reserved
/// bytes first: `if f.read::<[u8; 4]>(hdr_off).is_none() { return Err(Unclassified::TruncatedEncap); }`.
#[test]
fn wireguard_needs_its_message_header() {
    let test = "wireguard_needs_its_message_header";
    if !support::have_root(test) {
        return;
    }
    let mut h = Harness::new(&LoadConfig::default());
    let o = pair("192.0.2.171", "192.0.2.172");
    let message = wireguard_transport(1, 1, 0);
    for len in 0..4 {
        let frame = wireguard_frame(o.0, o.1, 40000, WIREGUARD_PORT, &message[..len]);
        let expect = Expect::unclassified(Unclassified::TruncatedEncap);
        h.check(
            &case(format!("wireguard with {len} payload bytes"), frame, expect),
            1,
        );
    }
    let frame = wireguard_frame(o.0, o.1, 40000, WIREGUARD_PORT, &message[..4]);
    let expect = Expect::tunnel(Proto::Wireguard, o, 0, None);
    h.check(
        &case("wireguard message type and reserved bytes", frame, expect),
        1,
    );
    h.finish(test);
}

/// Plain traffic is counted exactly on every hook, in the per-CPU plain
/// counters: it claims no flow-cache slot and no LRU entry, so tunnel
/// keys keep the cache and the map to themselves.
#[test]
fn plain_traffic_takes_no_cache_slot_and_no_map_entry() {
    let test = "plain_traffic_takes_no_cache_slot_and_no_map_entry";
    if !support::have_root(test) {
        return;
    }
    let mut h = Harness::new(&LoadConfig::default());
    let o = pair("192.0.2.181", "192.0.2.182");
    let frames = [
        ("tcp", tcp_frame(o.0, o.1, 40000, 443, &[0xab; 100])),
        ("udp", udp_frame(o.0, o.1, 40000, 53, &[0xab; 60])),
    ];
    for (name, frame) in frames {
        h.check(&case(format!("plain {name}"), frame, Expect::plain()), 7);
    }
    let stats = h.obs.read_stats().expect("reading stats");
    assert_eq!(
        (stats.flow_cache_slots, stats.flow_entries),
        (0, 0),
        "{test}: plain traffic took a cache slot or a map entry: {stats:?}"
    );
    h.finish(test);
}

/// `observer probe`'s packets (inner ICMP payload starting with
/// `PROBE_MAGIC`) take no row on any hook: they are counted in the probe
/// stats of their direction; the same frame with another payload is an
/// ordinary tunnel row.
#[test]
fn probe_packets_are_counted_apart_from_the_rows() {
    let test = "probe_packets_are_counted_apart_from_the_rows";
    if !support::have_root(test) {
        return;
    }
    let mut h = Harness::new(&LoadConfig::default());
    let o = pair("192.0.2.191", "192.0.2.192");
    let i = pair("10.9.0.1", "10.9.0.2");
    let inner = |payload: &[u8]| ipv4(v4(i.0), v4(i.1), IPPROTO_ICMP, &icmp4_echo(9, 1, payload));
    let mut marked = observer_common::PROBE_MAGIC.to_vec();
    marked.extend_from_slice(&[0; 48]);
    let frames = [
        (
            "vxlan",
            vxlan_frame(o.0, o.1, 4096, &eth(ETH_P_IP, &inner(&marked))),
        ),
        ("ipip", ipip_frame(o.0, o.1, &inner(&marked))),
    ];
    let mut expected = (0, 0);
    for (name, frame) in &frames {
        for hook in HOOKS {
            let Some(changed) = h.run(hook, frame, None, 3) else {
                continue;
            };
            assert!(
                changed.is_empty(),
                "{test}: {name} probe through {hook:?}: {changed:?}"
            );
            match direction(hook) {
                Direction::Rx => expected.0 += 3,
                Direction::Tx => expected.1 += 3,
            }
        }
    }
    let stats = h.obs.read_stats().expect("reading stats");
    assert_eq!(
        (stats.probe_rx_packets, stats.probe_tx_packets),
        expected,
        "{test}: {stats:?}"
    );
    assert!(expected.0 >= 4 && expected.1 >= 2, "{expected:?}");
    // One byte off the mark: an ordinary VXLAN row.
    let mut unmarked = marked.clone();
    unmarked[7] ^= 1;
    let frame = vxlan_frame(o.0, o.1, 4096, &eth(ETH_P_IP, &inner(&unmarked)));
    let changed = h.run(Hook::Xdp, &frame, None, 1).expect("xdp runs");
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(changed[0].id.proto, Proto::Vxlan);
    h.finish(test);
}

// ------------------------------------------- builders checked by etherparse

/// The builders produce frames an independent parser accepts, with correct
/// IPv4 header and UDP/TCP checksums (no kernel needed).
#[test]
fn frame_builders_produce_valid_frames() {
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    let mut checked = 0;
    let mut frames: Vec<(String, Vec<u8>)> = Vec::new();
    for c in tunnel_cases().into_iter().chain(layer_cases()) {
        frames.push((c.name, c.frame));
    }
    for g in gso_cases() {
        frames.push((g.name.to_string(), g.frame));
    }
    for s in seeds().into_iter().chain(ipv6_extension_seeds()) {
        frames.push((s.name.to_string(), s.frame));
    }
    for (name, frame) in &frames {
        let p = SlicedPacket::from_ethernet(frame).unwrap_or_else(|e| panic!("{name}: {e}"));
        let net = p
            .net
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: no IP layer"));
        let (src, dst) = match net {
            NetSlice::Ipv4(ip) => {
                let h = ip.header();
                assert_eq!(
                    h.header_checksum(),
                    h.to_header().calc_header_checksum(),
                    "{name}: ipv4 checksum"
                );
                assert_eq!(
                    h.total_len() as usize,
                    h.slice().len() + ip.payload().payload.len(),
                    "{name}"
                );
                (
                    IpAddr::V4(h.source_addr()),
                    IpAddr::V4(h.destination_addr()),
                )
            }
            NetSlice::Ipv6(ip) => {
                let h = ip.header();
                (
                    IpAddr::V6(h.source_addr()),
                    IpAddr::V6(h.destination_addr()),
                )
            }
        };
        if p.is_ip_payload_fragmented() {
            continue;
        }
        match &p.transport {
            Some(TransportSlice::Udp(u)) => {
                let sum = match (src, dst) {
                    (IpAddr::V4(s), IpAddr::V4(d)) => {
                        u.to_header()
                            .calc_checksum_ipv4_raw(s.octets(), d.octets(), u.payload())
                    }
                    (IpAddr::V6(s), IpAddr::V6(d)) => {
                        u.to_header()
                            .calc_checksum_ipv6_raw(s.octets(), d.octets(), u.payload())
                    }
                    _ => unreachable!(),
                }
                .unwrap();
                assert_eq!(u.checksum(), sum, "{name}: udp checksum");
                assert_eq!(u.length() as usize, u.slice().len(), "{name}: udp length");
            }
            Some(TransportSlice::Tcp(t)) => {
                let sum = match (src, dst) {
                    (IpAddr::V4(s), IpAddr::V4(d)) => t.calc_checksum_ipv4(s.octets(), d.octets()),
                    (IpAddr::V6(s), IpAddr::V6(d)) => t.calc_checksum_ipv6(s.octets(), d.octets()),
                    _ => unreachable!(),
                }
                .unwrap();
                assert_eq!(t.checksum(), sum, "{name}: tcp checksum");
            }
            _ => {}
        }
        checked += 1;
    }
    // The GRE checksum covers the GRE header and payload.
    let g = Gre {
        checksum: true,
        ..Gre::default()
    }
    .encap(
        ETH_P_IP,
        &icmp4_packet(addr4("10.0.0.1"), addr4("10.0.0.2")),
    );
    assert_eq!(internet_checksum(&[&g]), 0, "gre checksum verifies");
    assert!(checked > 40, "checked {checked} frames");
}

/// The two ways of reading the maps, batch lookups (BPF_MAP_LOOKUP_BATCH,
/// a few system calls for a whole map) and the key-by-key walk, read the
/// same rows, exactly: 5,000 VXLAN peers, peer `i` sending `i % 7 + 1`
/// frames, so the flow map needs several batch calls (1,024 entries each)
/// and the flow cache's slots fill too.
/// Between two first uses of a flow-cache or plain slot, reads by batch
/// read only the slots in use (`bpf::slots`): every read must still equal
/// the key-by-key walk of everything, as slots are put to use on each
/// hook and frames repeat on the slots in use.
#[test]
fn reads_of_the_slots_in_use_equal_the_walk_of_all() {
    if !support::have_root("reads_of_the_slots_in_use_equal_the_walk_of_all") {
        return;
    }
    let mut h = Harness::new(&LoadConfig::default());
    let local = IpAddr::from([10, 0, 0, 1]);
    let inner = udp_frame(
        [192, 168, 0, 1].into(),
        [192, 168, 0, 2].into(),
        40000,
        5201,
        b"x",
    );
    let vxlan = |i: u8| vxlan_frame(IpAddr::from([10, 9, 0, i]), local, 42, &inner);
    let plain = udp_frame(IpAddr::from([10, 9, 1, 1]), local, 5000, 53, b"q");
    let same = |h: &Harness, step: &str| {
        // By batch twice: the second read plans on the first.
        let batch = h.counts(MapRead::Batch);
        assert_eq!(batch, h.counts(MapRead::Batch), "{step}");
        assert_eq!(batch, h.counts(MapRead::Walk), "{step}");
        batch
    };
    let mut expected = 0u64;
    for (step, hook, frame, repeat) in [
        ("first VXLAN peers", Hook::Xdp, vxlan(1), 3),
        ("a second peer", Hook::Xdp, vxlan(2), 1),
        ("repeats on slots in use", Hook::Xdp, vxlan(1), 5),
        ("plain traffic's first packet", Hook::Xdp, plain.clone(), 1),
        ("plain repeats", Hook::Xdp, plain.clone(), 4),
        ("tc ingress, same peer", Hook::TcIngress, vxlan(2), 2),
        ("tc egress", Hook::TcEgress, vxlan(3), 2),
        ("repeats again", Hook::Xdp, vxlan(2), 2),
    ] {
        for _ in 0..repeat {
            h.run_unchecked(hook, &frame, None, 1);
        }
        expected += repeat;
        let rows = same(&h, step);
        assert_eq!(
            rows.values().map(|(packets, _)| packets).sum::<u64>(),
            expected,
            "{step}: every frame in one row"
        );
    }
}

#[test]
fn batch_lookups_and_the_walk_read_the_same_rows() {
    const PEERS: u32 = 5_000;
    let mut h = Harness::new(&LoadConfig {
        max_flows: 2 * PEERS,
        ..LoadConfig::default()
    });
    let local = IpAddr::from([10, 0, 0, 1]);
    let inner = icmp_eth_frame([192, 168, 0, 1].into(), [192, 168, 0, 2].into());
    let mut sent = BTreeMap::new();
    for i in 0..PEERS {
        let peer = IpAddr::from((0x0a01_0000 + i).to_be_bytes());
        let frame = vxlan_frame(peer, local, 42, &inner);
        let frames = i % 7 + 1;
        // One run per frame: a repeated test run costs this kernel
        // milliseconds per call.
        for _ in 0..frames {
            h.run_unchecked(Hook::Xdp, &frame, None, 1);
        }
        sent.insert(
            peer,
            (u64::from(frames), frames as u64 * frame.len() as u64),
        );
    }
    let batch = h.counts(MapRead::Batch);
    assert_eq!(batch, h.counts(MapRead::Walk));
    let by_peer: BTreeMap<IpAddr, (u64, u64)> = batch
        .iter()
        .map(|(id, counts)| (id.peer.expect("a peer row"), *counts))
        .collect();
    assert_eq!(batch.len(), PEERS as usize, "one row per peer");
    assert_eq!(by_peer, sent);
}

// ------------------------------------------------------ BGP at the wire

/// A TCP frame from `from` to `to` with the flags byte `flags`.
fn tcp_flags_frame(from: (IpAddr, u16), to: (IpAddr, u16), flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = tcp_frame(from.0, to.0, from.1, to.1, payload);
    let ip_len = if from.0.is_ipv4() {
        IPV4_HLEN
    } else {
        IPV6_HLEN
    };
    frame[ETH_HLEN + ip_len + 13] = flags;
    frame
}

/// Each TCP/179 segment is counted once per hook by its flags and the
/// first BGP message it starts with, keyed by (interface, direction,
/// peer); other TCP is not; a NOTIFICATION keeps its code and an OPEN its
/// hold time; a GSO skb counts its segments.
#[test]
fn bgp_segments_are_counted_by_flags_and_first_message() {
    use observer::model::bgp_wire::{Notification, WireCounters, WireId};
    let test = "bgp_segments_are_counted_by_flags_and_first_message";
    if !support::have_root(test) {
        return;
    }
    const ACK: u8 = 0x10;
    const PSH_ACK: u8 = 0x18;
    let keepalive = bgp_wire::keepalive();
    let open = bgp_wire::open(9);
    let notification = bgp_wire::cease();
    let update_then_keepalive = [bgp_wire::message(2, &[0, 0, 0, 0]), keepalive.clone()].concat();
    for (local, remote) in [
        pair("192.0.2.1", "192.0.2.2"),
        pair("2001:db8::1", "2001:db8::2"),
    ] {
        let mut h = Harness::new(&LoadConfig::default());
        // Frames as the remote peer sends them; on tc egress the peer is
        // the destination, so the addresses are swapped there.
        let segments: Vec<(u8, Vec<u8>)> = vec![
            (0x02, vec![]),          // SYN
            (PSH_ACK, open.clone()), // OPEN, hold time 9
            (PSH_ACK, keepalive.clone()),
            (PSH_ACK, update_then_keepalive.clone()), // counts as UPDATE
            (ACK, vec![]),                            // pure ACK: no message
            (PSH_ACK, vec![0xab; 40]),                // the middle of a message: none
            (PSH_ACK, keepalive[..18].to_vec()),      // a cut header: none
            (PSH_ACK, notification.clone()),          // Cease/Administrative Shutdown
            (0x11, vec![]),                           // FIN
            (0x04, vec![]),                           // RST
        ];
        for hook in HOOKS {
            let (src, dst) = match direction(hook) {
                Direction::Rx => (remote, local),
                Direction::Tx => (local, remote),
            };
            for (i, (flags, payload)) in segments.iter().enumerate() {
                // The peer listens on 179 for some, connects from it for others.
                let (sport, dport) = if i % 2 == 0 {
                    (40000, 179)
                } else {
                    (179, 40000)
                };
                let frame = tcp_flags_frame((src, sport), (dst, dport), *flags, payload);
                h.run_unchecked(hook, &frame, None, 2)
                    .expect("the kernel runs TCP frames");
            }
            // Not BGP: another port, though it carries a KEEPALIVE.
            let other = tcp_flags_frame((src, 40000), (dst, 1790), PSH_ACK, &keepalive);
            h.run_unchecked(hook, &other, None, 5).unwrap();
            // A GSO skb of 3 segments starting with a KEEPALIVE (tc only).
            if hook != Hook::Xdp {
                let frame = tcp_flags_frame((src, 40000), (dst, 179), PSH_ACK, &keepalive);
                let ctx = skb_gso_ctx(3, 19);
                h.run_unchecked(hook, &frame, Some(&ctx), 1).unwrap();
            }
        }
        let wire: BTreeMap<WireId, WireCounters> = h
            .obs
            .read_bgp_wire()
            .expect("reading BGP")
            .into_iter()
            .collect();
        let rx = WireId {
            peer: remote,
            ifindex: LO_IFINDEX,
            direction: Direction::Rx,
        };
        let tx = WireId {
            direction: Direction::Tx,
            ..rx
        };
        assert_eq!(
            wire.keys().copied().collect::<Vec<_>>(),
            vec![rx, tx],
            "{test}"
        );
        // Rx: XDP and tc ingress each ran every segment twice, tc ingress
        // the GSO skb once more; tx: tc egress alone.
        let expected = |hooks: u64, gso: u64| WireCounters {
            created_ns: 0,
            segments: 20 * hooks + 3 * gso,
            syn: 2 * hooks,
            fin: 2 * hooks,
            rst: 2 * hooks,
            open: 2 * hooks,
            update: 2 * hooks,
            notification: 2 * hooks,
            keepalive: 2 * hooks + gso,
            route_refresh: 0,
            last_notification: Some(Notification {
                code: 6,
                subcode: 2,
            }),
            hold_time_s: Some(9),
        };
        // The creation time only tells a re-created key.
        let counted = |id| WireCounters {
            created_ns: 0,
            ..wire[&id]
        };
        assert_ne!(wire[&rx].created_ns, 0, "{test}");
        assert_eq!(counted(rx), expected(2, 1), "{test}: rx from {remote}");
        assert_eq!(counted(tx), expected(1, 1), "{test}: tx to {remote}");
        let stats = h.obs.read_stats().unwrap();
        assert_eq!(stats.bgp_inserts, 2, "{test}: one insert per key");
    }
}

// ------------------------------------------------- inner TCP and checksums

/// A VXLAN frame `o.0` -> `o.1` carrying the IPv4 TCP `segment` `i.0` ->
/// `i.1` (outer UDP checksum computed over it).
fn vxlan_tcp(o: (IpAddr, IpAddr), i: (IpAddr, IpAddr), segment: &[u8]) -> Vec<u8> {
    let inner = ipv4(v4(i.0), v4(i.1), IPPROTO_TCP, segment);
    vxlan_frame(o.0, o.1, 4096, &eth(ETH_P_IP, &inner))
}

/// Where a [`vxlan_tcp`] frame keeps its outer UDP checksum and its inner
/// TCP checksum (untagged, IPv4 headers without options).
const OUTER_UDP_CHECK: usize = 14 + 20 + 6;
const INNER_TCP_CHECK: usize = 14 + 20 + 8 + 8 + 14 + 20 + 16;

/// Handshake and reset segments' checksums are verified on receive: a
/// wrong inner TCP or outer UDP checksum is flagged, a zero outer one
/// counted apart, a pending one (the pseudo-header sum a sender with
/// checksum offload leaves for the device) and a right one never flagged;
/// every inner SYN, SYN-ACK and RST is counted in its row either way.
#[test]
fn handshake_checksums_are_verified_and_pending_ones_left_alone() {
    use observer_common::{ClassifierDrop, TcpCounts};
    let test = "handshake_checksums_are_verified_and_pending_ones_left_alone";
    if !support::have_root(test) {
        return;
    }
    let mut h = Harness::new(&LoadConfig::default());
    let o = pair("192.0.2.201", "192.0.2.202");
    let i = pair("10.9.1.1", "10.9.1.2");
    let segment = |flags, options: &[u8]| tcp_segment(i.0, i.1, [40000, 80], flags, options, &[]);
    let syn = segment(TCP_SYN, &TCP_OPT_MSS_1460);
    let good = vxlan_tcp(o, i, &syn);
    let mut bad_inner = syn.clone();
    bad_inner[16] ^= 0x5a;
    let bad_inner = vxlan_tcp(o, i, &bad_inner);
    let mut bad_outer = good.clone();
    bad_outer[OUTER_UDP_CHECK] ^= 0x5a;
    let mut zero_outer = vxlan_tcp(o, i, &segment(TCP_SYN_ACK, &TCP_OPT_MSS_1460));
    zero_outer[OUTER_UDP_CHECK..OUTER_UDP_CHECK + 2].copy_from_slice(&[0, 0]);
    // What a sender with checksum offload writes: the folded sum of the
    // pseudo-header, not complemented.
    let mut pending = vxlan_tcp(o, i, &segment(TCP_RST, &[]));
    let seed = !internet_checksum(&[&pseudo_header(i.0, i.1, IPPROTO_TCP, 20)]);
    pending[INNER_TCP_CHECK..INNER_TCP_CHECK + 2].copy_from_slice(&seed.to_be_bytes());
    // A data segment: no signal, never verified.
    let mut data = vxlan_tcp(o, i, &segment(TCP_PSH_ACK, &[]));
    data[INNER_TCP_CHECK] ^= 0x5a;

    let frames = [&good, &bad_inner, &bad_outer, &zero_outer, &pending, &data];
    let mut rx_runs = 0;
    for hook in [Hook::Xdp, Hook::TcIngress] {
        for frame in frames {
            h.run(hook, frame, None, 3).expect("runs");
        }
        rx_runs += 3;
    }
    let drops: BTreeMap<u32, u64> = h
        .obs
        .read_drops()
        .expect("reading drops")
        .into_iter()
        .filter(|(id, _)| id.peer == Some(o.0))
        .map(|(id, c)| (id.reason, c.packets))
        .collect();
    let reason = |r: ClassifierDrop| drops.get(&(r as u32)).copied().unwrap_or(0);
    assert_eq!(
        (
            reason(ClassifierDrop::BadInnerChecksum),
            reason(ClassifierDrop::BadOuterChecksum),
            reason(ClassifierDrop::ZeroUdpChecksum),
        ),
        (rx_runs, rx_runs, rx_runs),
        "{test}: {drops:?}"
    );
    assert_eq!(drops.len(), 3, "{test}: nothing else flagged: {drops:?}");
    let rows = h.obs.read_flows().expect("reading flows");
    let (_, row) = rows
        .iter()
        .find(|(id, _)| id.peer == Some(o.0) && id.direction == Direction::Rx)
        .expect("the tunnel's rx row");
    // SYNs: good, bad inner, bad outer; the SYN-ACK; the RST. No MTU is
    // known for the test runs' loopback, so no MSS is judged.
    let per_run = TcpCounts {
        syn: 3,
        syn_ack: 1,
        rst: 1,
        mss_over: 0,
    };
    assert_eq!(
        row.tcp,
        TcpCounts {
            syn: per_run.syn * rx_runs,
            syn_ack: per_run.syn_ack * rx_runs,
            rst: per_run.rst * rx_runs,
            mss_over: 0,
        },
        "{test}"
    );
}
