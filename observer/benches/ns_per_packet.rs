//! Nanoseconds per packet of the observer's XDP program, measured by the
//! kernel itself with BPF_PROG_TEST_RUN (`cargo xtask bench`, needs root).
//!
//! Each case runs the program 1,000,000 times on one frame; the kernel
//! reports the average time per run in `duration` (whole ns, timed with
//! preemption disabled, so scheduling noise is mostly excluded). Each case
//! is measured in 15 interleaved rounds on one pinned CPU; a case's time
//! is the median of its rounds, and a `_over_pass` figure the median of
//! its per-round differences to `xdp_pass` (`system::median_over`):
//!
//! ```text
//! bench xdp_pass 5.0 ns/pkt        a program that only returns XDP_PASS (baseline)
//! bench vxlan 14.0 ns/pkt          observer_xdp on the frames below
//! ...
//! bench vxlan_over_pass 9.0 ns/pkt what parsing + the per-CPU LRU update add
//! ```
//!
//! `xdp_pass` is the test-run harness's own cost (loop, timing, xdp_buff
//! set-up) plus a trivial program; `vxlan - xdp_pass` is what the observer
//! adds per packet. The frame's flow entry is warmed first, so the numbers
//! are for the steady state (lookup hits, no LRU insert).
//!
//! Then the whole-system figures of `system/` (snapshot and export cost per
//! peer count, replay frames per second, veth throughput and CPU against
//! tcpdump). Every figure is a `bench NAME VALUE UNIT` line on stdout, and
//! the table is also written to `target/bench.md`.

use anyhow::Context;
use std::{
    os::fd::{AsFd, BorrowedFd},
    process::ExitCode,
};

use observer::{
    bpf::testrun,
    bpf::{Hook, Observer},
};
use observer_common::{Proto, Unclassified};
use std::{collections::BTreeSet, net::Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};
use observer::model::facts::{AllowSet, AllowSets, SetSource};

#[path = "system/mod.rs"]
mod system;

const REPEAT: u32 = 1_000_000;
const ROUNDS: usize = 15;
use system::maptypes::XDP_PASS;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One measured frame.
struct Case {
    name: &'static str,
    frame: Vec<u8>,
    /// Which program runs it.
    prog: Prog,
    /// The row the observer must have recorded for this frame (checked once,
    /// so the bench cannot silently measure a path that bails out early).
    expect: Option<(Proto, Unclassified)>,
}

/// The programs the cases run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Prog {
    /// The trivial XDP_PASS program (the baseline).
    Pass,
    /// observer_xdp as loaded, with no node facts.
    Observer,
    /// observer_xdp told what a Calico node tells it: a local vxlan
    /// device's VNI (the VNI check on) and the interface MTU.
    Calico,
}

fn run() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        anyhow::bail!(
            "loading eBPF programs needs root (CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON): run `cargo xtask bench` as root"
        );
    }
    match std::env::var("OBSERVER_BENCH_ONLY").as_deref() {
        Ok("monitor") => {
            system::monitor::run()?;
            return system::write_table();
        }
        Ok("snapshot") => {
            system::snapshot::run(&frames::vxlan())?;
            return system::write_table();
        }
        Ok("replay") => {
            system::replay::run(&frames::vxlan())?;
            return system::write_table();
        }
        _ => {}
    }
    let observer = Observer::load(&Default::default())?;
    let mut calico = Observer::load(&Default::default())?;
    // What a Calico node tells the programs: its vxlan.calico VNI, and the
    // MTU of the interface (the test run's, loopback).
    calico.apply_local_vnis(&[4096])?;
    calico.set_mtu(TEST_RUN_IFINDEX, 1500)?;
    let pass = system::maptypes::load_xdp_pass()?;
    let xdp = observer.program_fd(Hook::Xdp)?;
    let progs = Progs {
        pass: pass.as_fd(),
        observer: xdp,
        calico: calico.program_fd(Hook::Xdp)?,
    };

    let vxlan = frames::vxlan();
    let cases = [
        Case {
            name: "xdp_pass",
            frame: vxlan.clone(),
            prog: Prog::Pass,
            expect: None,
        },
        Case {
            name: "vxlan",
            frame: vxlan.clone(),
            prog: Prog::Observer,
            expect: Some((Proto::Vxlan, Unclassified::None)),
        },
        Case {
            name: "ipip",
            frame: frames::ipip(),
            prog: Prog::Observer,
            expect: Some((Proto::Ipip, Unclassified::None)),
        },
        Case {
            name: "geneve",
            frame: frames::geneve(),
            prog: Prog::Observer,
            expect: Some((Proto::Geneve, Unclassified::None)),
        },
        Case {
            name: "plain",
            frame: frames::plain_udp(),
            prog: Prog::Observer,
            expect: Some((Proto::Other, Unclassified::None)),
        },
        Case {
            name: "plain_tcp",
            frame: frames::plain_tcp(),
            prog: Prog::Observer,
            expect: Some((Proto::Other, Unclassified::None)),
        },
        Case {
            name: "bgp",
            frame: frames::bgp_keepalive(),
            prog: Prog::Observer,
            expect: Some((Proto::Other, Unclassified::None)),
        },
        Case {
            // A full-size frame on a Calico node: VNI check on (a local
            // vxlan device), interface MTU known (set below).
            name: "vxlan_calico_1500",
            frame: frames::vxlan_of_len(1514),
            prog: Prog::Calico,
            expect: Some((Proto::Vxlan, Unclassified::None)),
        },
        Case {
            // Ethernet + IPv4 + half a UDP header.
            name: "malformed",
            frame: vxlan[..14 + 20 + 4].to_vec(),
            prog: Prog::Observer,
            expect: Some((Proto::Other, Unclassified::TruncatedL4)),
        },
    ];

    // Warm-up: inserts each frame's LRU entry, so the measured runs only hit.
    for case in &cases {
        let r = testrun::run(progs.of(case.prog), &case.frame, None, 1)?;
        if r.retval != XDP_PASS {
            anyhow::bail!(
                "{}: program returned {} instead of XDP_PASS",
                case.name,
                r.retval
            );
        }
    }
    let (flows, calico_flows) = (observer.read_flows()?, calico.read_flows()?);
    for case in &cases {
        let Some((proto, reason)) = case.expect else {
            continue;
        };
        let flows = if case.prog == Prog::Calico {
            &calico_flows
        } else {
            &flows
        };
        if !flows
            .iter()
            .any(|(id, _)| id.proto == proto && id.reason == reason)
        {
            anyhow::bail!(
                "{}: warm-up left no {} / {} row in the flow map; the frame is not parsed as intended",
                case.name,
                proto.name(),
                reason.name()
            );
        }
    }

    let jit = std::fs::read_to_string("/proc/sys/net/core/bpf_jit_enable")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    eprintln!(
        "bench: BPF_PROG_TEST_RUN, repeat {REPEAT}, median of {ROUNDS} interleaved rounds, \
         kernel resolution 1 ns, bpf_jit_enable={jit}"
    );

    let plain = cases.iter().find(|c| c.name == "plain").expect("a case");
    // On a thread of its own, pinned: every round on the same CPU (and the
    // processes the traffic bench starts later keep their affinity).
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> anyhow::Result<()> {
                testrun::pin_to_this_cpu()?;
                measure(&cases, &progs)?;
                anyhow::ensure!(
                    calico.read_drops()?.is_empty(),
                    "vxlan_calico_1500 was flagged; the bench measures the wrong path"
                );
                system::maptypes::floors(&plain.frame, &vxlan, pass.as_fd(), (REPEAT, ROUNDS))?;
                // Context for the figures above: what one lookup in each
                // map type costs, measured the same way.
                system::maptypes::run(&vxlan, pass.as_fd(), REPEAT, ROUNDS)?;
                allow_set_cases(&vxlan, xdp)
            })
            .join()
            .map_err(|_| anyhow::anyhow!("packet bench panicked"))?
    })?;
    let only = std::env::var("OBSERVER_BENCH_ONLY").unwrap_or_default();
    let traffic_only = match only.as_str() {
        "traffic" => Some(system::traffic::Parts::ALL),
        "throughput" | "floor" => Some(system::traffic::Parts {
            throughput: only == "throughput",
            floor: only == "floor",
            cpu: false,
        }),
        _ => None,
    };
    if let Some(parts) = traffic_only {
        system::traffic::run(&vxlan, pass.as_fd(), parts)?;
        return system::write_table();
    }
    // The kfree_skb cost is measured on real drops in namespaces, on a
    // thread of its own because it enters a network namespace.
    std::thread::spawn(kfree_skb_cost)
        .join()
        .map_err(|_| anyhow::anyhow!("kfree_skb bench panicked"))??;
    if only == "packets" {
        return system::write_table();
    }
    system::verifier::run()?;
    system::snapshot::run_apart()?;
    system::monitor::run()?;
    system::replay::run(&vxlan)?;
    system::traffic::run(&vxlan, pass.as_fd(), system::traffic::Parts::ALL)?;
    system::write_table()
}

/// BPF_PROG_TEST_RUN's device: the loopback of the current namespace.
const TEST_RUN_IFINDEX: u32 = 1;

/// The loaded programs of [`Prog`].
struct Progs<'a> {
    pass: BorrowedFd<'a>,
    observer: BorrowedFd<'a>,
    calico: BorrowedFd<'a>,
}

impl<'a> Progs<'a> {
    fn of(&self, prog: Prog) -> BorrowedFd<'a> {
        match prog {
            Prog::Pass => self.pass,
            Prog::Observer => self.observer,
            Prog::Calico => self.calico,
        }
    }
}

/// Runs every case in interleaved rounds; reports each case's median and
/// the `_over_pass` figures (first case: the baseline).
fn measure(cases: &[Case], progs: &Progs<'_>) -> anyhow::Result<()> {
    let mut samples = vec![Vec::with_capacity(ROUNDS); cases.len()];
    for _ in 0..ROUNDS {
        for (case, samples) in cases.iter().zip(&mut samples) {
            let r = testrun::run(progs.of(case.prog), &case.frame, None, REPEAT)?;
            samples.push(f64::from(r.duration_ns));
        }
    }
    for (case, s) in cases.iter().zip(&samples) {
        let ns = system::median(&mut s.clone());
        system::report(case.name, format!("{ns:.1}"), "ns/pkt");
    }
    for name in ["vxlan", "vxlan_calico_1500", "plain", "plain_tcp", "bgp"] {
        let at = cases.iter().position(|c| c.name == name).expect("a case");
        system::report(
            &format!("{name}_over_pass"),
            format!("{:.1}", system::median_over(&samples[at], &samples[0])),
            "ns/pkt",
        );
    }
    Ok(())
}

/// Average cost of the kfree_skb program per kernel drop event, from the
/// kernel's own BPF run-time statistics, while iptables drops UDP sent
/// from a second namespace: first over a veth pair the observer does not
/// watch (the common case on a node: `kfree_skb_unwatched_per_event`),
/// then over the watched one (`kfree_skb_per_event`), then over the first
/// pair watched as a tunnel device (`kfree_skb_after_decap_per_event`:
/// the inner header read and the pod-block lookup).
fn kfree_skb_cost() -> anyhow::Result<()> {
    const DROPS: u64 = 20_000;
    let tag = format!("obsb{}", std::process::id());
    let (a, b) = (format!("{tag}a"), format!("{tag}b"));
    let _guard = system::Namespaces(vec![a.clone(), b.clone()]);
    system::sh(&["ip", "netns", "add", &a])?;
    system::sh(&["ip", "netns", "add", &b])?;
    for (here, there, net) in [("va", "vb", "198.18.0"), ("vc", "vd", "198.18.1")] {
        system::sh(&[
            "ip", "-n", &a, "link", "add", here, "type", "veth", "peer", "name", there, "netns", &b,
        ])?;
        system::sh(&[
            "ip",
            "-n",
            &a,
            "addr",
            "add",
            &format!("{net}.1/30"),
            "dev",
            here,
        ])?;
        system::sh(&[
            "ip",
            "-n",
            &b,
            "addr",
            "add",
            &format!("{net}.2/30"),
            "dev",
            there,
        ])?;
        system::sh(&["ip", "-n", &a, "link", "set", here, "up"])?;
        system::sh(&["ip", "-n", &b, "link", "set", there, "up"])?;
    }
    system::sh(&[
        "ip", "netns", "exec", &a, "iptables", "-A", "INPUT", "-p", "udp", "--dport", "9", "-j",
        "DROP",
    ])?;

    system::enter_netns(&a)?;
    let mut observer = Observer::load(&Default::default())?;
    observer.attach(
        &observer::bpf::Interface::resolve("va")?,
        observer::bpf::XdpMode::Auto,
    )?;
    let (_floor, floor_id, _floor_link) = system::maptypes::attach_kfree_skb_floor()?;
    let floor_info = || -> anyhow::Result<aya::programs::ProgramInfo> {
        aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .find(|info| info.id() == floor_id)
            .context("the kfree_skb floor program is not loaded")
    };
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)?;
    let watched_drops = |observer: &Observer| -> anyhow::Result<u64> {
        Ok(observer
            .read_drops()?
            .iter()
            .filter(|(id, _)| {
                id.origin == observer::model::rows::Origin::Kernel
                    && observer.kernel_reasons().name(id.reason) == "NETFILTER_DROP"
            })
            .map(|(_, c)| c.packets)
            .sum())
    };
    for (name, source, destination, watched) in [
        ("kfree_skb_unwatched", "198.18.1.2:0", "198.18.1.1:9", 0),
        ("kfree_skb", "198.18.0.2:0", "198.18.0.1:9", DROPS),
        (
            "kfree_skb_after_decap",
            "198.18.1.2:0",
            "198.18.1.1:9",
            2 * DROPS,
        ),
    ] {
        if name == "kfree_skb_after_decap" {
            // vc watched as a tunnel device, the sender's address in a
            // pod block of a node: every drop there is parsed from its
            // inner (here: only) IP header and attributed through the
            // block trie, as on vxlan.calico.
            let vc = observer::bpf::Interface::resolve("vc")?;
            observer.watch_after_decap(vc.ifindex, observer_common::stage::TUNNEL)?;
            observer.set_block_peers(&[(
                "198.18.1.0/30".parse()?,
                "10.10.60.127".parse()?,
                Some(Proto::Vxlan),
            )])?;
        }
        let before = observer.drop_hook_info()?;
        let floor_before = floor_info()?;
        let namespace = b.clone();
        let sender = std::thread::spawn(move || -> anyhow::Result<()> {
            system::enter_netns(&namespace)?;
            let socket = std::net::UdpSocket::bind(source)?;
            for _ in 0..DROPS {
                socket.send_to(b"drop me", destination)?;
            }
            Ok(())
        });
        sender
            .join()
            .map_err(|_| anyhow::anyhow!("sender panicked"))??;
        std::thread::sleep(std::time::Duration::from_millis(300));
        let after = observer.drop_hook_info()?;
        let floor_after = floor_info()?;
        let events = after.run_count() - before.run_count();
        if watched == 0 {
            let floor_events = floor_after.run_count() - floor_before.run_count();
            let floor_ns = (floor_after.run_time() - floor_before.run_time()).as_nanos() as f64;
            system::report(
                "kfree_skb_floor_per_event",
                format!("{:.1}", floor_ns / floor_events.max(1) as f64),
                "ns/event",
            );
        }
        let ns = (after.run_time() - before.run_time()).as_nanos() as f64;
        let counted = watched_drops(&observer)?;
        anyhow::ensure!(
            counted == watched,
            "{name}: kfree_skb counted {counted} NETFILTER_DROP drops on va and vc, expected {watched}"
        );
        system::report(
            &format!("{name}_per_event"),
            format!("{:.1}", ns / events.max(1) as f64),
            "ns/event",
        );
        system::report(&format!("{name}_events"), events, "events");
    }
    Ok(())
}

/// The VXLAN case with the allow-set check on, for sets of 10, 1,000 and
/// 10,000 prefixes (the frame's source is a member, the common case), and
/// what the check adds to `vxlan` (the observer without sets, `xdp`,
/// measured in the same rounds).
fn allow_set_cases(vxlan: &[u8], xdp: BorrowedFd<'_>) -> anyhow::Result<()> {
    for size in [10usize, 1_000, 10_000] {
        let mut observer = Observer::load(&Default::default())?;
        let mut prefixes: BTreeSet<IpNet> = (0..size - 1)
            .map(|i| {
                let i = i as u32;
                IpNet::V4(
                    Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 | (i << 8)), 24).expect("valid /24"),
                )
            })
            .collect();
        prefixes.insert(IpNet::V4(Ipv4Net::new(
            Ipv4Addr::from(frames::UNDERLAY_SRC),
            32,
        )?));
        let snapshot = AllowSets {
            vxlan: AllowSet {
                prefixes,
                sources: vec![SetSource::Ipset("bench".into())],
                ipv4: true,
                ipv6: false,
            },
            ..AllowSets::default()
        };
        observer.apply_allow_sets(&snapshot)?;
        let checked = observer.program_fd(Hook::Xdp)?;
        testrun::run(checked, vxlan, None, 1)?;
        let (mut with_set, mut without) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            without.push(f64::from(
                testrun::run(xdp, vxlan, None, REPEAT)?.duration_ns,
            ));
            with_set.push(f64::from(
                testrun::run(checked, vxlan, None, REPEAT)?.duration_ns,
            ));
        }
        if !observer.read_drops()?.is_empty() {
            anyhow::bail!(
                "vxlan_allow_{size}: the member source was flagged; the bench measures the wrong path"
            );
        }
        let ns = system::median(&mut with_set.clone());
        system::report(&format!("vxlan_allow_{size}"), format!("{ns:.1}"), "ns/pkt");
        system::report(
            &format!("vxlan_allow_{size}_over_vxlan"),
            format!("{:.1}", system::median_over(&with_set, &without)),
            "ns/pkt",
        );
    }
    Ok(())
}

/// Minimal hand-built frames: Ethernet + IPv4 outer headers around the
/// encapsulations, an inner IPv4/UDP packet with 64 bytes of payload.
/// Checksums are left zero: the programs never check them.
mod frames {
    const ETH_P_IP: u16 = 0x0800;
    const ETH_P_TEB: u16 = 0x6558;
    pub const UNDERLAY_SRC: [u8; 4] = [198, 18, 0, 2];
    const UNDERLAY_DST: [u8; 4] = [198, 18, 0, 1];

    fn eth(ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn ipv4(proto: u8, src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let total = (20 + payload.len()) as u16;
        let mut p = vec![0x45, 0];
        p.extend_from_slice(&total.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]); // id, DF, ttl, proto, csum
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.extend_from_slice(payload);
        p
    }

    /// A TCP segment, PSH|ACK, no options (the checksum is not read).
    fn tcp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&[
            0, 0, 0x10, 0, 0, 0, 0x20, 0, 0x50, 0x18, 0xfa, 0xf0, 0, 0, 0, 0,
        ]);
        p.extend_from_slice(payload);
        p
    }

    fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(payload);
        p
    }

    /// The tenant's packet: 198.19.1.1 -> 198.19.1.2, UDP, 64 bytes of data.
    fn inner_ipv4() -> Vec<u8> {
        ipv4(
            17,
            [198, 19, 1, 1],
            [198, 19, 1, 2],
            &udp(40000, 5201, &[0xab; 64]),
        )
    }

    /// VXLAN, UDP 4789, VNI 4096, inner Ethernet frame.
    pub fn vxlan() -> Vec<u8> {
        vxlan_around(&inner_ipv4())
    }

    /// [`vxlan`] of `len` bytes on the wire (the tenant's UDP payload
    /// grown), from another source (a flow of its own).
    pub fn vxlan_of_len(len: usize) -> Vec<u8> {
        let outer = vxlan().len() - 64;
        let inner = ipv4(
            17,
            [198, 19, 1, 1],
            [198, 19, 1, 2],
            &udp(40000, 5201, &vec![0xab; len - outer]),
        );
        let mut frame = vxlan_around(&inner);
        frame[14 + 12..14 + 16].copy_from_slice(&[198, 18, 0, 3]);
        frame
    }

    fn vxlan_around(inner: &[u8]) -> Vec<u8> {
        let mut encap = vec![0x08, 0, 0, 0];
        encap.extend_from_slice(&(4096u32 << 8).to_be_bytes());
        encap.extend_from_slice(&eth(ETH_P_IP, inner));
        eth(
            ETH_P_IP,
            &ipv4(17, UNDERLAY_SRC, UNDERLAY_DST, &udp(49152, 4789, &encap)),
        )
    }

    /// IPv4 in IPv4 (protocol 4).
    pub fn ipip() -> Vec<u8> {
        eth(
            ETH_P_IP,
            &ipv4(4, UNDERLAY_SRC, UNDERLAY_DST, &inner_ipv4()),
        )
    }

    /// Geneve, UDP 6081, VNI 4096, no options, inner Ethernet frame.
    pub fn geneve() -> Vec<u8> {
        let mut encap = vec![0, 0];
        encap.extend_from_slice(&ETH_P_TEB.to_be_bytes());
        encap.extend_from_slice(&(4096u32 << 8).to_be_bytes());
        encap.extend_from_slice(&eth(ETH_P_IP, &inner_ipv4()));
        eth(
            ETH_P_IP,
            &ipv4(17, UNDERLAY_SRC, UNDERLAY_DST, &udp(49152, 6081, &encap)),
        )
    }

    /// Plain TCP (HTTPS port), not a tunnel: the frames that go on to
    /// the BGP program only when they are TCP/179.
    pub fn plain_tcp() -> Vec<u8> {
        eth(
            ETH_P_IP,
            &ipv4(6, UNDERLAY_SRC, UNDERLAY_DST, &tcp(53000, 443, &[0xab; 64])),
        )
    }

    /// A BGP KEEPALIVE (TCP/179), counted by the BGP program too.
    pub fn bgp_keepalive() -> Vec<u8> {
        let mut keepalive = vec![0xff; 16];
        keepalive.extend_from_slice(&[0, 19, 4]);
        eth(
            ETH_P_IP,
            &ipv4(6, UNDERLAY_SRC, UNDERLAY_DST, &tcp(53000, 179, &keepalive)),
        )
    }

    /// Plain UDP (DNS port), not a tunnel.
    pub fn plain_udp() -> Vec<u8> {
        eth(
            ETH_P_IP,
            &ipv4(17, UNDERLAY_SRC, UNDERLAY_DST, &udp(53000, 53, &[0xab; 64])),
        )
    }
}
