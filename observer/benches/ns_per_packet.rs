//! Nanoseconds per packet of the observer's XDP program, measured by the
//! kernel itself with BPF_PROG_TEST_RUN (`cargo xtask bench`, needs root).
//!
//! Each case runs the program 1,000,000 times on one frame; the kernel
//! reports the average time per run in `duration` (whole ns, timed with
//! preemption disabled, so scheduling noise is mostly excluded). Each case
//! is measured 5 times, rounds interleaved, and the median is printed:
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
use std::{io, os::fd::AsFd, process::ExitCode};

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
const ROUNDS: usize = 5;
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
    /// Runs the trivial program instead of observer_xdp.
    baseline: bool,
    /// The row the observer must have recorded for this frame (checked once,
    /// so the bench cannot silently measure a path that bails out early).
    expect: Option<(Proto, Unclassified)>,
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
    let pass = system::maptypes::load_xdp_pass()?;
    let xdp = observer.program_fd(Hook::Xdp)?;

    let vxlan = frames::vxlan();
    let cases = [
        Case {
            name: "xdp_pass",
            frame: vxlan.clone(),
            baseline: true,
            expect: None,
        },
        Case {
            name: "vxlan",
            frame: vxlan.clone(),
            baseline: false,
            expect: Some((Proto::Vxlan, Unclassified::None)),
        },
        Case {
            name: "ipip",
            frame: frames::ipip(),
            baseline: false,
            expect: Some((Proto::Ipip, Unclassified::None)),
        },
        Case {
            name: "geneve",
            frame: frames::geneve(),
            baseline: false,
            expect: Some((Proto::Geneve, Unclassified::None)),
        },
        Case {
            name: "plain",
            frame: frames::plain_udp(),
            baseline: false,
            expect: Some((Proto::Other, Unclassified::None)),
        },
        Case {
            name: "plain_tcp",
            frame: frames::plain_tcp(),
            baseline: false,
            expect: Some((Proto::Other, Unclassified::None)),
        },
        Case {
            name: "bgp",
            frame: frames::bgp_keepalive(),
            baseline: false,
            expect: Some((Proto::Other, Unclassified::None)),
        },
        Case {
            // Ethernet + IPv4 + half a UDP header.
            name: "malformed",
            frame: vxlan[..14 + 20 + 4].to_vec(),
            baseline: false,
            expect: Some((Proto::Other, Unclassified::TruncatedL4)),
        },
    ];

    // Warm-up: inserts each frame's LRU entry, so the measured runs only hit.
    for case in &cases {
        let prog = if case.baseline { pass.as_fd() } else { xdp };
        let r = testrun::run(prog, &case.frame, None, 1)?;
        if r.retval != XDP_PASS {
            anyhow::bail!(
                "{}: program returned {} instead of XDP_PASS",
                case.name,
                r.retval
            );
        }
    }
    let flows = observer.read_flows()?;
    for case in &cases {
        let Some((proto, reason)) = case.expect else {
            continue;
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

    let mut samples = vec![Vec::with_capacity(ROUNDS); cases.len()];
    for _ in 0..ROUNDS {
        for (case, samples) in cases.iter().zip(&mut samples) {
            let prog = if case.baseline { pass.as_fd() } else { xdp };
            let r = testrun::run(prog, &case.frame, None, REPEAT)?;
            samples.push(f64::from(r.duration_ns));
        }
    }
    let medians: Vec<f64> = samples.iter_mut().map(|s| system::median(s)).collect();
    for (case, ns) in cases.iter().zip(&medians) {
        system::report(case.name, format!("{ns:.1}"), "ns/pkt");
    }
    let over_pass = |name: &str| {
        let at = cases.iter().position(|c| c.name == name).expect("a case");
        format!("{:.1}", medians[at] - medians[0])
    };
    system::report("vxlan_over_pass", over_pass("vxlan"), "ns/pkt");
    system::report("plain_over_pass", over_pass("plain"), "ns/pkt");
    system::report("plain_tcp_over_pass", over_pass("plain_tcp"), "ns/pkt");
    system::report("bgp_over_pass", over_pass("bgp"), "ns/pkt");
    let plain = cases.iter().find(|c| c.name == "plain").expect("a case");
    system::maptypes::floors(&plain.frame, &vxlan, pass.as_fd(), (REPEAT, ROUNDS))?;
    // Context for the figures above: what one lookup in each map type
    // costs, measured the same way.
    system::maptypes::run(&vxlan, pass.as_fd(), REPEAT, ROUNDS)?;
    let only = std::env::var("OBSERVER_BENCH_ONLY").unwrap_or_default();
    if only == "traffic" {
        system::traffic::run(&vxlan, pass.as_fd())?;
        return system::write_table();
    }
    allow_set_cases(&vxlan, medians[1])?;
    // The kfree_skb cost is measured on real drops in namespaces, on a
    // thread of its own because it enters a network namespace.
    std::thread::spawn(kfree_skb_cost)
        .join()
        .map_err(|_| anyhow::anyhow!("kfree_skb bench panicked"))??;
    if only == "packets" {
        return system::write_table();
    }
    system::verifier::run()?;
    system::snapshot::run(&vxlan)?;
    system::monitor::run()?;
    system::replay::run(&vxlan)?;
    system::traffic::run(&vxlan, pass.as_fd())?;
    system::write_table()
}

/// Average cost of the kfree_skb program per kernel drop event, from the
/// kernel's own BPF run-time statistics, while iptables drops UDP sent
/// from a second namespace: first over a veth pair the observer does not
/// watch (the common case on a node: `kfree_skb_unwatched_per_event`),
/// then over the watched one (`kfree_skb_per_event`).
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
    observer.attach("va", observer::bpf::XdpMode::Auto)?;
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
    ] {
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
            "{name}: kfree_skb counted {counted} NETFILTER_DROP drops on va, expected {watched}"
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
/// what the check adds to `vxlan` (`vxlan_ns`, measured in the same run).
fn allow_set_cases(vxlan: &[u8], vxlan_ns: f64) -> anyhow::Result<()> {
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
        let xdp = observer.program_fd(Hook::Xdp)?;
        testrun::run(xdp, vxlan, None, 1)?;
        let mut samples: Vec<f64> = (0..ROUNDS)
            .map(|_| testrun::run(xdp, vxlan, None, REPEAT).map(|r| f64::from(r.duration_ns)))
            .collect::<io::Result<_>>()?;
        if !observer.read_drops()?.is_empty() {
            anyhow::bail!(
                "vxlan_allow_{size}: the member source was flagged; the bench measures the wrong path"
            );
        }
        let ns = system::median(&mut samples);
        system::report(&format!("vxlan_allow_{size}"), format!("{ns:.1}"), "ns/pkt");
        system::report(
            &format!("vxlan_allow_{size}_over_vxlan"),
            format!("{:.1}", ns - vxlan_ns),
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
        let mut encap = vec![0x08, 0, 0, 0];
        encap.extend_from_slice(&(4096u32 << 8).to_be_bytes());
        encap.extend_from_slice(&eth(ETH_P_IP, &inner_ipv4()));
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
