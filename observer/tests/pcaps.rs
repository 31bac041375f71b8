//! Replays tcpdump's reference captures (see `support::pcaps_dir()` and its
//! README) through the XDP program with BPF_PROG_TEST_RUN, and compares the
//! observer's tunnel rows with tcpdump's own decode of the same capture
//! (`NAME.out`, produced with the flags listed in `TESTLIST.subset`).
//!
//! Ground truth nobody in this project wrote (parsed by
//! `support::tcpdump`): per capture, the counts per (protocol, outer
//! source, VNI) must equal the observer's tunnel rows (protocol other than
//! `other`), and every frame must be counted once. Frame by frame here;
//! `replay.rs` checks the same through `observer replay`.

mod support;

use std::{collections::BTreeMap, fs, net::IpAddr, path::Path};

use observer::{
    bpf::testrun,
    bpf::{Hook, LoadConfig, Observer},
    cmd::replay::{capture, kernel::MAX_XDP_FRAME},
    model::rows::{FlowCounters, FlowId},
};
use observer_common::{Proto, Unclassified};
use support::tcpdump::{TunnelKey, count, describe, parse_tcpdump_output};

const XDP_PASS: u32 = 2;

/// Captures whose frames are deliberately broken (they once crashed
/// tcpdump): the observer must never report a protocol tcpdump did not see.
const MALFORMED: &[&str] = &[
    "gre-heapoverflow-1",
    "gre-heapoverflow-2",
    "ip6_frag_asan",
    "ipv6_frag6_negative_len",
    "esp_truncated",
    "mpls-over-udp",
];

/// The frames of an Ethernet pcap as captured (possibly cut at the snap
/// length), read by replay's own reader.
fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let file = fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    capture::frames(file)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .map(|frame| {
            let frame = frame.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(
                frame.link_type,
                capture::LINKTYPE_ETHERNET,
                "{}",
                path.display()
            );
            frame.data
        })
        .collect()
}

/// Runs one frame through XDP and returns the row it changed.
fn run_frame(obs: &Observer, rows: &mut BTreeMap<FlowId, FlowCounters>, frame: &[u8]) -> FlowId {
    let frame = &frame[..frame.len().min(MAX_XDP_FRAME)];
    let fd = obs.program_fd(Hook::Xdp).expect("xdp program fd");
    let run = testrun::run(fd, frame, None, 1)
        .unwrap_or_else(|e| panic!("XDP test run of a {}-byte frame: {e}", frame.len()));
    assert_eq!(run.retval, XDP_PASS, "XDP must pass every frame");
    let now: BTreeMap<FlowId, FlowCounters> = obs
        .read_flows()
        .expect("reading the flow map")
        .into_iter()
        .collect();
    let changed: Vec<(FlowId, u64, u64)> = now
        .iter()
        .filter_map(|(id, c)| {
            let before = rows.get(id).copied().unwrap_or_default();
            (before.packets, before.bytes)
                .ne(&(c.packets, c.bytes))
                .then(|| (*id, c.packets - before.packets, c.bytes - before.bytes))
        })
        .collect();
    assert_eq!(changed.len(), 1, "one frame changes one row: {changed:?}");
    assert_eq!(
        (changed[0].1, changed[0].2),
        (1, frame.len() as u64),
        "{changed:?}"
    );
    *rows = now;
    changed[0].0
}

fn tunnel_key(id: &FlowId) -> Option<TunnelKey> {
    if id.proto == Proto::Other {
        return None;
    }
    let peer = id
        .peer
        .unwrap_or_else(|| panic!("tunnel row without a peer: {id:?}"));
    Some((id.proto, peer, id.vni))
}

#[test]
fn captures_match_tcpdump() {
    if !support::have_root("captures_match_tcpdump") {
        return;
    }
    let captures = support::reference_captures();
    let dir = support::pcaps_dir();

    let obs = Observer::load(&LoadConfig::default()).expect("loading the eBPF programs");
    let mut rows = BTreeMap::new();
    let mut failures = Vec::new();
    let mut total_frames = 0u64;
    for path in &captures {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let name = file.trim_end_matches(".pcap").to_string();
        let (out, expected) = support::tcpdump::expected(&dir, &file);
        let frames = read_pcap(path);
        assert_eq!(
            frames.len(),
            expected.len(),
            "{file}: frames in the capture vs packets in {out}"
        );

        let mut observed = Vec::new();
        let mut reasons: BTreeMap<&str, u64> = BTreeMap::new();
        for frame in &frames {
            let id = run_frame(&obs, &mut rows, frame);
            if id.proto == Proto::Other {
                let reason = match id.reason {
                    Unclassified::None => "plain ip",
                    reason => reason.name(),
                };
                *reasons.entry(reason).or_insert(0) += 1;
            }
            observed.push(tunnel_key(&id));
        }
        total_frames += frames.len() as u64;

        let want = count(expected.iter().flatten().copied());
        let got = count(observed.iter().flatten().copied());
        let mut problems = Vec::new();
        if want != got {
            problems.push(format!(
                "tcpdump: {}; observer: {}",
                describe(&want),
                describe(&got)
            ));
        }
        if MALFORMED.contains(&name.as_str()) {
            for (n, (theirs, ours)) in expected.iter().zip(&observed).enumerate() {
                if let Some(ours) = ours
                    && theirs.map(|t| t.0) != Some(ours.0)
                {
                    problems.push(format!(
                        "packet {}: observer says {ours:?}, tcpdump {theirs:?}",
                        n + 1
                    ));
                }
            }
        }
        let cut = frames.iter().filter(|f| f.len() > MAX_XDP_FRAME).count();
        let mut other: Vec<String> = reasons.iter().map(|(r, n)| format!("{r} {n}")).collect();
        if other.is_empty() {
            other.push("-".to_string());
        }
        eprintln!(
            "{name:<24} {:>3} frames{}  tunnels: {}  not tunnels: {}",
            frames.len(),
            if cut > 0 {
                format!(" ({cut} cut to 64 KiB)")
            } else {
                String::new()
            },
            describe(&got),
            other.join(", ")
        );
        if !problems.is_empty() {
            failures.push(format!("{name} (expected {out}): {}", problems.join("; ")));
        }
    }
    let packets: u64 = rows.values().map(|c| c.packets).sum();
    assert_eq!(packets, total_frames, "every frame is counted once");
    assert!(
        failures.is_empty(),
        "captures disagreeing with tcpdump:\n{}",
        failures.join("\n")
    );
}

/// The .out parser itself, on excerpts of the reference outputs.
#[test]
fn tcpdump_output_parser() {
    let text = "    1  2013-05-18 20:21:44.837063 36:dc:85:1e:b3:40 > 00:16:3e:08:71:cf, ethertype IPv4 (0x0800), length 148: 192.168.203.1.45149 > 192.168.202.1.4789: VXLAN, flags [I] (0x08), vni 100
00:16:3e:37:f6:04 > 00:30:88:01:00:02, ethertype IPv4 (0x0800), length 98: 192.168.203.3 > 192.168.203.5: ICMP echo request, id 1292, seq 1, length 64
    2  2025-10-03 14:05:54.176759 IP6 (hlim 64, next-header UDP (17), payload length 0) [real length 80142, presumed BIG TCP] 2604:1380:4091:ce00::d.23733 > 2604:1380:4091:ce00::b.6081: [bad udp cksum 0xc93c -> 0x5da5!] Geneve, Flags [none], vni 0x1389
\tIP6 (flowlabel 0xe4292, hlim 64, next-header TCP (6), payload length 0) fd00::1.38339 > fd00::2.43997: Flags [P.], length 80000
    3  2017-06-16 09:45:07.471682 IP (tos 0xc0, ttl 255, id 164, offset 0, flags [none], proto GRE (47), length 64)
    10.172.64.7 > 10.172.64.6: GREv0, Flags [key present], key=0x28, length 44
\tgre-proto-0x8909
    4  2017-06-16 09:45:01.623859 STP 802.1d, Config, Flags [none], bridge-id 84bd.aa:bb:cc:00:03:00.8002, length 42
    5  2020-02-08 19:10:12.233047 IP 10.100.12.170.58699 > 10.100.13.157.6635: MPLS (label 21, tc 0, [S], ttl 63) IP 10.3.0.10 > 10.1.0.10: ICMP echo request
    6  1995-08-15 05:27:12.999999 30:30:30:30:30:30 > 30:30:30:30:30:30, ethertype Unknown (0x3030), length 262144: 
\t0x0000:  3030 3030 3030 3030 3030 3030 3030 3030  0000000000000000
";
    let a = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(
        parse_tcpdump_output(text),
        vec![
            Some((Proto::Vxlan, a("192.168.203.1"), 100)),
            Some((Proto::Geneve, a("2604:1380:4091:ce00::d"), 0x1389)),
            Some((Proto::Gre, a("10.172.64.7"), 0)),
            None,
            None,
            None,
        ]
    );
}
