//! Replays tcpdump's reference captures (see `support::pcaps_dir()` and its
//! README) through the XDP program with BPF_PROG_TEST_RUN, and compares the
//! observer's tunnel rows with tcpdump's own decode of the same capture
//! (`NAME.out`, produced with the flags listed in `TESTLIST.subset`).
//!
//! Ground truth nobody in this project wrote: for each packet of a `.out`
//! file, the first `A.sport > B.dport:` (or `A > B:`) address pair and the
//! text after it say whether tcpdump saw VXLAN (`vni N`), Geneve
//! (`vni 0xN`) or GRE from outer source A. Per capture, the counts per
//! (protocol, outer source, VNI) must equal the observer's tunnel rows
//! (protocol other than `other`), and every frame must be counted once.

mod support;

use std::{
    collections::BTreeMap,
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
};

use observer::{
    flows::{FlowCounters, FlowId},
    loader::{Hook, LoadConfig, Observer},
    testrun,
};
use observer_common::{Proto, Unclassified};
use pcap_file::pcap::PcapReader;

/// LINKTYPE_ETHERNET.
const LINKTYPE_ETHERNET: u32 = 1;
const XDP_PASS: u32 = 2;
/// Larger frames (BIG TCP captures of 80 KB) exceed what an XDP test run
/// can hold (17 fragments of a page); they are cut to this length, which
/// keeps every header.
const MAX_TEST_RUN_FRAME: usize = 64 * 1024;

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

/// (protocol, outer source, VNI) of a tunnel packet.
type TunnelKey = (Proto, IpAddr, u32);

/// Reads an Ethernet pcap: the frames as captured (possibly cut at the
/// snap length). The link-type field's upper bits carry FCS information in
/// some files (0x40000001): only the low 16 bits are the link type.
fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let file = fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = PcapReader::new(file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let link_type = u32::from(reader.header().datalink) & 0xffff;
    assert_eq!(
        link_type,
        LINKTYPE_ETHERNET,
        "{}: not an Ethernet capture",
        path.display()
    );
    let mut frames = Vec::new();
    // Raw packets: several captures claim an original length above their
    // snap length, which the validating reader rejects.
    while let Some(packet) = reader.next_raw_packet() {
        let packet = packet.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        frames.push(packet.data.into_owned());
    }
    frames
}

/// `capture file -> expected output file`, from TESTLIST.subset (columns:
/// test name, capture, output, flags).
fn test_list(dir: &Path) -> BTreeMap<String, String> {
    let text = fs::read_to_string(dir.join("TESTLIST.subset")).unwrap_or_default();
    let mut outputs = BTreeMap::new();
    for line in text.lines() {
        let columns: Vec<&str> = line.split_whitespace().collect();
        if columns.len() >= 3 && !line.trim_start().starts_with('#') {
            outputs
                .entry(columns[1].to_string())
                .or_insert_with(|| columns[2].to_string());
        }
    }
    outputs
}

/// Whether `line` opens a packet: `<number>  YYYY-MM-DD ...`.
fn packet_number(line: &str) -> Option<usize> {
    let line = line.trim_start();
    let (number, rest) = line.split_once(char::is_whitespace)?;
    let number: usize = number.parse().ok()?;
    let date = rest.trim_start().as_bytes();
    let is_date = date.len() >= 10
        && date[..10].iter().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                *b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    is_date.then_some(number)
}

/// An address with or without a trailing `.port`.
fn endpoint(token: &str) -> Option<IpAddr> {
    if let Ok(a) = token.parse() {
        return Some(a);
    }
    let (address, port) = token.rsplit_once('.')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    address.parse().ok()
}

/// The first `A > B:` pair of a packet's text (MAC pairs end in ','):
/// outer source A and the rest of that line.
fn first_ip_pair(block: &str) -> Option<(IpAddr, String)> {
    for line in block.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        for i in 0..tokens.len().saturating_sub(2) {
            if tokens[i + 1] != ">" {
                continue;
            }
            let Some(dst) = tokens[i + 2].strip_suffix(':') else {
                continue;
            };
            if let (Some(src), Some(_)) = (endpoint(tokens[i]), endpoint(dst)) {
                return Some((src, tokens[i + 3..].join(" ")));
            }
        }
    }
    None
}

fn parse_vni(text: &str) -> Option<u32> {
    let (_, after) = text.split_once("vni ")?;
    let token = after
        .split(|c: char| c.is_whitespace() || c == ',')
        .next()?;
    match token.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => token.parse().ok(),
    }
}

/// tcpdump's verdict on one packet: the tunnel it decoded, if any.
fn classify_block(block: &str) -> Option<TunnelKey> {
    let (src, rest) = first_ip_pair(block)?;
    // Skip notes such as "[bad udp cksum 0xa0a5 -> 0xd93a!]" or "[no cksum]".
    let mut rest = rest.trim_start();
    while rest.starts_with('[') {
        rest = rest.split_once(']').map_or("", |(_, r)| r).trim_start();
    }
    let vni = || parse_vni(rest).unwrap_or_else(|| panic!("no vni in {rest:?}"));
    if rest.starts_with("VXLAN-GPE") {
        Some((Proto::VxlanGpe, src, vni()))
    } else if rest.starts_with("VXLAN") {
        Some((Proto::Vxlan, src, vni()))
    } else if rest.starts_with("Geneve") {
        Some((Proto::Geneve, src, vni()))
    } else if rest.starts_with("GRE") {
        Some((Proto::Gre, src, 0))
    } else {
        None
    }
}

/// One verdict per packet of a tcpdump output, in order.
fn parse_tcpdump_output(text: &str) -> Vec<Option<TunnelKey>> {
    let mut blocks: Vec<String> = Vec::new();
    for line in text.lines() {
        if let Some(number) = packet_number(line) {
            assert_eq!(
                number,
                blocks.len() + 1,
                "packets are numbered in order: {line}"
            );
            blocks.push(String::new());
        }
        if let Some(block) = blocks.last_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    blocks.iter().map(|b| classify_block(b)).collect()
}

fn count(keys: impl IntoIterator<Item = TunnelKey>) -> BTreeMap<TunnelKey, u64> {
    let mut counts = BTreeMap::new();
    for key in keys {
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

/// Runs one frame through XDP and returns the row it changed.
fn run_frame(obs: &Observer, rows: &mut BTreeMap<FlowId, FlowCounters>, frame: &[u8]) -> FlowId {
    let frame = &frame[..frame.len().min(MAX_TEST_RUN_FRAME)];
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

fn describe(counts: &BTreeMap<TunnelKey, u64>) -> String {
    if counts.is_empty() {
        return "none".to_string();
    }
    counts
        .iter()
        .map(|((proto, peer, vni), n)| format!("{}/{peer}/vni {vni}: {n}", proto.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn captures_match_tcpdump() {
    if !support::have_root("captures_match_tcpdump") {
        return;
    }
    let dir = support::pcaps_dir();
    if !dir.is_dir() {
        if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
            panic!(
                "reference captures missing at {} and CI=true",
                dir.display()
            );
        }
        eprintln!(
            "skipping captures_match_tcpdump: no captures at {} (set OBSERVER_PCAPS)",
            dir.display()
        );
        return;
    }
    let outputs = test_list(&dir);
    let mut captures: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("listing the captures")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    captures.sort();
    assert!(!captures.is_empty(), "no *.pcap in {}", dir.display());

    let obs = Observer::load(&LoadConfig::default()).expect("loading the eBPF programs");
    let mut rows = BTreeMap::new();
    let mut failures = Vec::new();
    let mut total_frames = 0u64;
    for path in &captures {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let name = file.trim_end_matches(".pcap").to_string();
        let out = outputs
            .get(&file)
            .cloned()
            .unwrap_or_else(|| format!("{name}.out"));
        let text = fs::read_to_string(dir.join(&out))
            .unwrap_or_else(|e| panic!("{file}: expected output {out}: {e}"));
        let expected = parse_tcpdump_output(&text);
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
        let cut = frames
            .iter()
            .filter(|f| f.len() > MAX_TEST_RUN_FRAME)
            .count();
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
