//! Differential fuzzing of the two replay classifiers (see
//! tests/differential.rs, and the kernel suite's check): random frames of
//! every kind the parser knows and mutations of them and of the reference
//! captures, through the eBPF programs (BPF_PROG_TEST_RUN) and through the
//! native build of the same parser, compared row by row per batch.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    time::{Duration, Instant},
};

use super::frames::*;
use observer::{
    bpf::{LoadConfig, Observer},
    cmd::replay::{
        capture::{self, Frame},
        classify::{Classifier, Runts},
        kernel::{self, KernelClassifier},
        native::NativeClassifier,
    },
    model::facts::{AllowSets, Family, SetSource},
    model::ports::{PortArray, PortConfig},
    monitor::refresher::AllowSetSink,
};
use observer_common::{
    Direction, FlowKey, TcpCounts, checks, family,
    parse::{self, SliceFrame},
};

/// Frames per replayed "capture": the rows of both engines are compared at
/// the end of each.
const BATCH: usize = 500;

/// xorshift64*: small, fast and reproducible from its seed (the test must
/// replay a failure from the seed it prints; no crate needed for that).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// Fewer than `max` random bytes.
    fn some_bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max);
        self.bytes(n)
    }
}

/// The node whose capture is replayed (its frames are sent: tx).
const LOCAL4: &str = "10.0.0.1";
const LOCAL6: &str = "fd00::1";
/// Peers: the first two of each family are in the allow-sets.
const PEERS4: [&str; 4] = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "192.0.2.77"];
const PEERS6: [&str; 3] = ["fd00::1", "fd00::2", "2001:db8::9"];
/// UDP ports: the defaults of every encapsulation, and two that mean none.
const PORTS: [u16; 8] = [4789, 8472, 4790, 6081, 51820, 51821, 53, 443];

fn peer(rng: &mut Rng, v6: bool) -> IpAddr {
    if v6 {
        addr(rng.pick(&PEERS6))
    } else {
        addr(rng.pick(&PEERS4))
    }
}

/// An inner packet (IP or Ethernet) of the kind `ethertype` names, or junk.
fn inner(rng: &mut Rng) -> (u16, Vec<u8>) {
    let v6 = rng.chance(30);
    let (src, dst) = if v6 {
        (addr("fd10::1"), addr("fd10::2"))
    } else {
        (addr("172.16.0.1"), addr("172.16.0.2"))
    };
    let l4 = match rng.below(3) {
        0 => tcp(src, dst, 1000, 80, &rng.some_bytes(40)),
        1 => udp(src, dst, 1000, 53, &rng.some_bytes(40)),
        _ => icmp_packet(src, dst),
    };
    let proto = [IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMP][rng.below(3)];
    let packet = ip(src, dst, proto, &l4);
    match rng.below(4) {
        0 => (ETH_P_TEB, eth(ethertype_of(src), &packet)),
        1 => (ethertype_of(src), packet),
        2 => (ETH_P_TEB, eth(rng.next() as u16, &rng.bytes(30))),
        _ => (rng.next() as u16, rng.some_bytes(60)),
    }
}

/// The payload of an outer IP packet and its protocol number.
fn l4(rng: &mut Rng, src: IpAddr, dst: IpAddr) -> (u8, Vec<u8>) {
    let (ethertype, inner_bytes) = inner(rng);
    match rng.below(10) {
        0 | 1 => {
            let port = rng.pick(&PORTS);
            let sport = if rng.chance(20) {
                rng.pick(&PORTS)
            } else {
                ENTROPY_PORT
            };
            let header = match port {
                4790 => vxlan_gpe_header(rng.below(1 << 24) as u32, rng.below(5) as u8).to_vec(),
                6081 => geneve_header(rng.below(1 << 24) as u32, ethertype, rng.below(64) as u8),
                51820 | 51821 => wireguard_initiation(rng.next() as u32)[..rng.below(40)].to_vec(),
                _ => {
                    let mut h = vxlan_header(rng.below(1 << 24) as u32).to_vec();
                    if rng.chance(10) {
                        h[0] = rng.next() as u8;
                    }
                    h
                }
            };
            let payload = cat(&[&header, &inner_bytes]);
            (IPPROTO_UDP, udp(src, dst, sport, port, &payload))
        }
        2 => {
            let v6 = rng.chance(30);
            let (a, b) = (peer(rng, v6), peer(rng, v6));
            let quoted = ip(a, b, IPPROTO_ICMP, &icmp_packet(a, b));
            (if v6 { IPPROTO_IPV6 } else { IPPROTO_IPIP }, quoted)
        }
        3 => {
            let gre = Gre {
                checksum: rng.chance(30),
                key: rng.chance(30).then(|| rng.next() as u32),
                seq: rng.chance(30).then(|| rng.next() as u32),
            };
            let mut g = gre.encap(ethertype, &inner_bytes);
            if rng.chance(10) {
                g[1] = rng.next() as u8;
            }
            (IPPROTO_GRE, g)
        }
        4 => {
            // A router's "too big" about a tunnel packet this node sent.
            let tunnel_peer = peer(rng, src.is_ipv6());
            let port = rng.pick(&PORTS);
            let quoted = if rng.chance(50) {
                ip(
                    dst,
                    tunnel_peer,
                    IPPROTO_UDP,
                    &udp(dst, tunnel_peer, 1, port, &[0; 8]),
                )
            } else {
                ip(
                    dst,
                    tunnel_peer,
                    rng.pick(&[IPPROTO_IPIP, IPPROTO_GRE, 99]),
                    &[0; 8],
                )
            };
            let mtu = rng.pick(&[1280u16, 1400, 1450, 9000]);
            let (proto, kind, code) = if src.is_ipv6() {
                (IPPROTO_ICMPV6, rng.pick(&[2u8, 1, 128]), 0)
            } else {
                (IPPROTO_ICMP, rng.pick(&[3u8, 11]), rng.pick(&[4u8, 1]))
            };
            let mut m = vec![kind, code, 0, 0, 0, 0];
            m.extend_from_slice(&mtu.to_be_bytes());
            m.extend_from_slice(&quoted[..quoted.len().min(28 + rng.below(60))]);
            (proto, m)
        }
        5 => {
            // BGP's port on either side, or none.
            let (sport, dport) = rng.pick(&[(1, 2), (179, 40000), (40000, 179), (443, 33000)]);
            (
                IPPROTO_TCP,
                tcp(src, dst, sport, dport, &rng.some_bytes(100)),
            )
        }
        7 => {
            // Plain UDP (the hooks' early exit), now and then from a
            // tunnel port (a WireGuard source port names the tunnel).
            let sport = if rng.chance(20) {
                rng.pick(&PORTS)
            } else {
                rng.next() as u16
            };
            let dport = rng.next() as u16;
            (
                IPPROTO_UDP,
                udp(src, dst, sport, dport, &rng.some_bytes(100)),
            )
        }
        6 => (IPPROTO_ICMP, icmp_packet(src, dst)),
        8 => {
            // VXLAN as most tunnel traffic is (the hooks' VXLAN early
            // exit): the I flag, an inner Ethernet frame, TCP or UDP over
            // IPv4.
            let (a, b) = (addr("172.16.0.1"), addr("172.16.0.2"));
            let (proto, l4) = if rng.chance(50) {
                // Handshakes and resets (inner TCP signals) take the full
                // path; a SYN with Linux's MSS option first, or none.
                let options: &[u8] = if rng.chance(50) {
                    &[2, 4, 0x05, 0xb4]
                } else {
                    &[]
                };
                let mut segment = tcp_with_options(a, b, 1000, 80, options, &rng.some_bytes(40));
                segment[13] = rng.pick(&[0x18, 0x10, 0x02, 0x12, 0x04, 0x14, 0x11]);
                (IPPROTO_TCP, segment)
            } else {
                (IPPROTO_UDP, udp(a, b, 1000, 53, &rng.some_bytes(40)))
            };
            let inner = eth(ETH_P_IP, &ip(a, b, proto, &l4));
            // Few VNIs, so that flows repeat: a flow's first frame takes
            // the full path in the programs, the next ones the exit.
            let vxlan = vxlan_header(rng.pick(&[1, 4096, 0xff_ffff]));
            let port = rng.pick(&[4789, 8472]);
            (
                IPPROTO_UDP,
                udp(src, dst, ENTROPY_PORT, port, &cat(&[&vxlan, &inner])),
            )
        }
        _ => (rng.next() as u8, rng.some_bytes(100)),
    }
}

/// A well-formed frame of a random kind (before mutation).
fn structured(rng: &mut Rng) -> Vec<u8> {
    let v6 = rng.chance(35);
    let (src, dst) = (peer(rng, v6), peer(rng, v6));
    let (proto, payload) = l4(rng, src, dst);
    let packet = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let options = Ipv4Options {
                options: {
                    let n = rng.pick(&[0, 0, 0, 4, 12, 40]);
                    rng.bytes(n)
                },
                more_fragments: rng.chance(5),
                fragment_offset: if rng.chance(5) { 185 } else { 0 },
                ..Ipv4Options::default()
            };
            ipv4_with(&options, s, d, proto, &payload)
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let all = [
                Ipv6Ext::HopByHop(0),
                Ipv6Ext::DestOpts(1),
                Ipv6Ext::Routing(0),
                Ipv6Ext::Ah,
                Ipv6Ext::Fragment {
                    offset: 0,
                    more: true,
                },
                Ipv6Ext::Fragment {
                    offset: 100,
                    more: false,
                },
            ];
            let exts: Vec<Ipv6Ext> = (0..rng.pick(&[0, 0, 1, 2, 4, 5]))
                .map(|_| rng.pick(&all))
                .collect();
            ipv6_ext(s, d, &exts, proto, &payload)
        }
        _ => unreachable!("one family"),
    };
    let mut frame = eth(ethertype_of(src), &packet);
    if rng.chance(15) {
        let tags = [Vlan::dot1ad(100), Vlan::dot1q(200), Vlan::dot1q(300)];
        frame = with_vlans(&frame, &tags[..1 + rng.below(3)]);
    }
    if rng.chance(2) {
        // Jumbo and GRO-sized frames: beyond a test run's length limit.
        frame.resize(rng.pick(&[4_000, 9_100, 70_000]), 0);
    }
    frame
}

/// `frame` with one to four random edits.
fn mutate(rng: &mut Rng, mut frame: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        if frame.is_empty() {
            break;
        }
        // Most edits land in the headers, where the parser looks.
        let window = if rng.chance(80) { 120 } else { 600 };
        let at = rng.below(frame.len().min(window));
        match rng.below(6) {
            0 => frame[at] ^= 1 << rng.below(8),
            1 => frame[at] = rng.pick(&[0, 0xff, 0x08, 0x45, 0x4f, 0x60, 0x81, 0x86, 0xdd, 0x11]),
            2 => frame.truncate(at),
            3 => {
                let n = 1 + rng.below(8);
                let bytes = rng.bytes(n);
                frame.splice(at..at, bytes);
            }
            4 => {
                let end = (at + 1 + rng.below(8)).min(frame.len());
                frame.drain(at..end);
            }
            _ => {
                let value: u16 = rng.pick(&[0, 1, 0xffff, 4789, 6081, 0x0800, 0x86dd, 0x8100]);
                if at + 2 <= frame.len() {
                    frame[at..at + 2].copy_from_slice(&value.to_be_bytes());
                }
            }
        }
    }
    frame
}

/// Frames of the reference captures, as seeds for mutation.
fn reference_frames() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for path in super::reference_captures() {
        let Ok(file) = std::fs::File::open(&path) else {
            continue;
        };
        let Ok(frames) = capture::frames(file) else {
            continue;
        };
        seeds.extend(frames.map_while(Result::ok).map(|f| f.data).take(200));
    }
    seeds
}

fn next_frame(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    match rng.below(10) {
        0..=3 => structured(rng),
        4..=7 => {
            let frame = structured(rng);
            mutate(rng, frame)
        }
        8 if !seeds.is_empty() => {
            let seed = seeds[rng.below(seeds.len())].clone();
            mutate(rng, seed)
        }
        _ => rng.some_bytes(120),
    }
}

fn frame(number: u64, data: Vec<u8>) -> Frame {
    let len = data.len() as u32;
    Frame {
        number,
        timestamp: Duration::from_secs(number),
        data,
        link_type: 1,
        captured_len: len,
        original_len: len,
        comment: None,
    }
}

/// Both engines' rows of one batch, as comparable text keyed by row.
type Rows = BTreeMap<String, String>;

fn run_batch(engine: &mut dyn Classifier, frames: &[Frame], index: u32) -> Rows {
    let mut runts = Runts::default();
    for f in frames {
        // As `observer replay` does: runts are counted, not run.
        if f.data.len() < ETH_HLEN {
            runts.add(f.data.len());
            continue;
        }
        engine
            .run(f)
            .unwrap_or_else(|e| panic!("{e:#}\nframe {}:{}", f.number, hex(&f.data)));
    }
    let rows = engine.finish_file(index, 1.0, runts).expect("finish");
    let mut out = Rows::new();
    let mut add = |key: String, value: String| {
        let name = engine.name();
        assert!(
            out.insert(key.clone(), value).is_none(),
            "{name}: two rows {key}"
        );
    };
    for r in rows.rows {
        add(
            format!("flow {:?}", r.id),
            format!("{} pkts {} bytes inner {:?}", r.packets, r.bytes, r.inner),
        );
    }
    for r in rows.drops {
        add(
            format!("drop {:?}", r.id),
            format!("{} pkts {} bytes", r.packets, r.bytes),
        );
    }
    out
}

/// Allow-set configurations the batches cycle through: both families
/// checked, IPv4 only, sets that exist but are empty (nobody allowed), a
/// /0, none at all. A change between batches makes the programs decide
/// their cached verdicts again (a new generation).
fn allow_sets(variant: usize) -> AllowSets {
    let mut sets = AllowSets::default();
    let (vxlan, ipip, family): (&[&str], &[&str], _) = match variant % 5 {
        0 => (
            &["10.0.0.1/32", "10.0.0.2/32", "fd00::/127"],
            &["10.0.0.0/30", "10.0.0.2/32", "fd00::2/128"],
            None,
        ),
        1 => (&["10.0.0.1/32"], &["10.0.0.3/32"], Some(Family::V4)),
        2 => (&[], &[], Some(Family::V6)),
        3 => (&["0.0.0.0/0"], &["fd00::/16"], None),
        _ => return sets,
    };
    for (set, prefixes) in [(&mut sets.vxlan, vxlan), (&mut sets.ipip, ipip)] {
        set.add(
            SetSource::AllowCidr,
            family,
            prefixes.iter().map(|p| p.parse().unwrap()),
        );
    }
    sets
}

/// The rows on which `kernel` and `native` differ, one per line.
fn differences(kernel: &Rows, native: &Rows) -> String {
    let mut out = String::new();
    let keys: std::collections::BTreeSet<&String> = kernel.keys().chain(native.keys()).collect();
    for key in keys {
        let (k, n) = (kernel.get(key), native.get(key));
        if k != n {
            let _ = writeln!(out, "  {key}\n    kernel {k:?}\n    native {n:?}");
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::new();
    for (i, b) in bytes.iter().take(256).enumerate() {
        let sep = if i % 16 == 0 { "\n  " } else { " " };
        let _ = write!(s, "{sep}{b:02x}");
    }
    s
}

/// Writes `data` as a one-frame pcap under target/; says where, or why not
/// (a VM's root file system is read-only).
fn save(data: &[u8], seed: u64) -> String {
    use pcap_file::pcap::{PcapHeader, PcapWriter, RawPcapPacket};
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("diff-{seed:x}.pcap"));
    let written = std::fs::File::create(&path)
        .map_err(pcap_file::PcapError::IoError)
        .and_then(|file| {
            let header = PcapHeader {
                snaplen: 262_144,
                ..PcapHeader::default()
            };
            PcapWriter::with_header(file, header)?.write_raw_packet(&RawPcapPacket {
                ts_sec: 0,
                ts_frac: 0,
                incl_len: data.len() as u32,
                orig_len: data.len() as u32,
                data: data.into(),
            })
        });
    match written {
        Ok(_) => format!(
            "saved as {} (observer replay [--kernel] --local {LOCAL4} --local {LOCAL6} FILE)",
            path.display()
        ),
        Err(e) => format!("not saved: {}: {e}", path.display()),
    }
}

/// When to stop.
#[derive(Clone, Copy, Debug)]
pub enum Budget {
    /// After this many frames.
    Frames(u64),
    /// At this time.
    Until(Instant),
}

/// The hooks' early exits (`parse::early`) take only frames the full
/// parse agrees with, in both directions. The rows comparison cannot see
/// all of it: the programs take the exits, the native engine never does,
/// so a wrong exit shows there only when it changes a count. `true` when
/// the frame takes the VXLAN exit on receive.
fn early_exits_agree(table: &PortArray, f: &Frame) -> Result<bool, String> {
    let frame = SliceFrame(&f.data);
    let mut vxlan = false;
    for direction in [Direction::Rx, Direction::Tx] {
        let early = parse::early(&frame, direction, table);
        if early.exit == parse::Exit::Full {
            continue;
        }
        let c = parse::classify(&frame, direction, table);
        if early.exit == parse::Exit::Plain {
            plain_exit_agrees(f, &frame, direction, &c, early.ip_end)?;
        } else {
            vxlan_exit_agrees(f, direction, &c, &early)?;
            vxlan |= direction == Direction::Rx;
        }
    }
    Ok(vxlan)
}

/// The plain exit: the full parse calls the frame plain traffic that
/// needs nothing more, ending where the exit says.
fn plain_exit_agrees(
    f: &Frame,
    frame: &SliceFrame<'_>,
    direction: Direction,
    c: &parse::Classified,
    end: usize,
) -> Result<(), String> {
    // The key the programs count plain traffic under.
    let plain = FlowKey::of(1, direction, c) == FlowKey::plain(1, direction);
    if plain && c.ip_end == end && !parse::needs_checks(c) && !parse::plain_bgp(frame, c) {
        return Ok(());
    }
    Err(format!(
        "frame {} ({direction:?}) takes the plain early exit (ending at {end}), but the full parse says {:?} / {:?}, ending at {}, needs checks {}, BGP {}:{}",
        f.number,
        c.proto,
        c.reason,
        c.ip_end,
        parse::needs_checks(c),
        parse::plain_bgp(frame, c),
        hex(&f.data)
    ))
}

/// The VXLAN exit: the full parse calls the frame VXLAN with the same key,
/// end and inner sample; and on receive, on a flow whose source is inside
/// its allow-set, the exit skips the drop checks only when they would flag
/// nothing, whatever the node's VNIs and MTU (`checks::common_vxlan_clean`).
fn vxlan_exit_agrees(
    f: &Frame,
    direction: Direction,
    c: &parse::Classified,
    early: &parse::Early,
) -> Result<(), String> {
    let v = &early.vxlan;
    let same = FlowKey::of(1, direction, c) == FlowKey::common_vxlan(1, direction, v)
        && c.ip_end == early.ip_end
        && c.inner_family == family::V4
        && c.inner_src == [v.inner_src, 0, 0, 0]
        && c.inner_dst == [v.inner_dst, 0, 0, 0]
        && !c.probe
        // The exit counts no inner TCP signal: it must take none.
        && parse::inner_tcp(&SliceFrame(&f.data), c).flags & (parse::TCP_SYN | parse::TCP_RST) == 0;
    if !same {
        return Err(format!(
            "frame {} ({direction:?}) takes the VXLAN early exit as {early:?}, but the full parse says \
             {:?} / {:?}, peer {:x?} ({}), VNI {}, inner {:x?} -> {:x?} ({}), ending at {}, probe {}:{}",
            f.number,
            c.proto,
            c.reason,
            c.peer,
            c.peer_family,
            c.vni,
            c.inner_src,
            c.inner_dst,
            c.inner_family,
            c.ip_end,
            c.probe,
            hex(&f.data)
        ));
    }
    if direction == Direction::Tx {
        return Ok(());
    }
    for vni_unknown in [false, true] {
        for mtu in [None, Some(1200), Some(1500), Some(9000)] {
            let mut facts = NodeFacts { vni_unknown, mtu };
            for wire_len in [f.data.len() as u64, 1400, 1514, 1515, 9100] {
                let mut flagged = Vec::new();
                checks::classifier_drops(c, wire_len, &mut facts, |r| flagged.push(r));
                let clean = checks::common_vxlan_clean(v, wire_len, &facts);
                if clean != flagged.is_empty() {
                    return Err(format!(
                        "frame {}: the VXLAN early exit says clean={clean} for {wire_len} bytes \
                         (VNI unknown {vni_unknown}, MTU {mtu:?}), the checks flag {flagged:?}:{}",
                        f.number,
                        hex(&f.data)
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The hooks skip their checks program when a flow's facts say the checks
/// flag nothing on a received frame (`checks::flags_nothing`): for any
/// facts and length, a frame it calls clean earns no classifier reason,
/// no checksum reason and no `path_mtu` quote. Like the early exits, the
/// rows comparison would see a wrong skip only when the flow's facts were
/// current in the programs. `true` when the frame is clean with its own
/// length on a node without checks that flag it (the skip is reached).
fn checks_skip_agrees(table: &PortArray, f: &Frame) -> Result<bool, String> {
    let frame = SliceFrame(&f.data);
    let c = parse::classify(&frame, Direction::Rx, table);
    if !parse::needs_checks(&c) {
        return Ok(false);
    }
    let tcp = TcpCounts::of(&parse::inner_tcp(&frame, &c), 0);
    let own_length = f.data.len() as u64;
    let mut reached = false;
    for outside_allow_set in [false, true] {
        for vni_unknown in [false, true] {
            for mtu in [0, 1200, 1500, 9000] {
                let facts = checks::FlowFacts {
                    outside_allow_set,
                    vni_unknown,
                    mtu,
                };
                for wire_len in [own_length, 1400, 1514, 1515, 9100] {
                    if !checks::flags_nothing(&c, wire_len, facts, &tcp) {
                        continue;
                    }
                    reached |= wire_len == own_length && facts == checks::FlowFacts::default();
                    let mut flagged = Vec::new();
                    let mut checked = facts;
                    checks::classifier_drops(&c, wire_len, &mut checked, |r| flagged.push(r));
                    checks::checksum_drops(&frame, &c, |r| flagged.push(r));
                    let quotes = parse::too_big(&frame, &c, table).is_some();
                    if !flagged.is_empty() || quotes {
                        return Err(format!(
                            "frame {}: the checks program is skipped for {wire_len} bytes with \
                             {facts:?}, but the checks flag {flagged:?}, path_mtu quote {quotes}:{}",
                            f.number,
                            hex(&f.data)
                        ));
                    }
                }
            }
        }
    }
    Ok(reached)
}

/// Node facts for [`vxlan_exit_agrees`]: every source inside its
/// allow-set (the early exit's precondition).
struct NodeFacts {
    vni_unknown: bool,
    mtu: Option<u32>,
}

impl checks::CheckFacts for NodeFacts {
    fn outside_allow_set(&mut self, _: &parse::Classified) -> bool {
        false
    }

    fn vni_unknown(&self, _: u32) -> bool {
        self.vni_unknown
    }

    fn iface_mtu(&self) -> Option<u32> {
        self.mtu
    }
}

/// What a run compared.
#[derive(Clone, Copy, Debug)]
pub struct Agreement {
    /// Frames run through both classifiers.
    pub frames: u64,
    /// Rows compared (summed over batches).
    pub rows: usize,
    /// Frames the VXLAN early exit took (received), each checked against
    /// the full parse and checks.
    pub common_vxlan: u64,
    /// Received frames a hook would pass without its checks program on a
    /// flow whose facts flag nothing, each checked against the checks.
    pub checks_skipped: u64,
}

/// Runs frames generated from `seed` through the programs and the native
/// classifier until `budget` is spent. The calling thread is pinned to its
/// CPU. `Err` describes the first difference: the frame (hex-dumped and
/// saved as a pcap) and the rows that differ.
pub fn fuzz(seed: u64, budget: Budget) -> Result<Agreement, String> {
    let ports = PortConfig::default();
    let local: Vec<IpAddr> = vec![
        IpAddr::V4(LOCAL4.parse::<Ipv4Addr>().unwrap()),
        IpAddr::V6(LOCAL6.parse::<Ipv6Addr>().unwrap()),
    ];
    let observer = Observer::load(&LoadConfig {
        max_flows: kernel::REPLAY_MAX_FLOWS,
        ports: ports.clone(),
        defer_tc_ingress: kernel::receive_hook() == observer::bpf::Hook::Xdp,
    })
    .map_err(|e| format!("loading the programs: {:#}", anyhow::Error::from(e)))?;
    let mut kernel =
        KernelClassifier::new(observer, local.clone()).map_err(|e| format!("{e:#}"))?;
    let mut native = NativeClassifier::new(&ports, local).map_err(|e| format!("{e:#}"))?;

    let table = PortArray::new(&ports)?;
    let seeds = reference_frames();
    let mut rng = Rng(seed | 1);
    let mut tried = 0u64;
    let mut index = 0u32;
    let mut rows_compared = 0usize;
    let mut common_vxlan = 0u64;
    let mut checks_skipped = 0u64;
    loop {
        let done = match budget {
            Budget::Until(at) => Instant::now() >= at,
            Budget::Frames(frames) => tried >= frames,
        };
        if done {
            break;
        }
        let batch: Vec<Frame> = (0..BATCH)
            .map(|i| frame(tried + i as u64 + 1, next_frame(&mut rng, &seeds)))
            .collect();
        tried += BATCH as u64;
        index += 1;
        let sets = allow_sets(rng.below(5));
        kernel
            .apply_allow_sets(&sets)
            .map_err(|e| format!("{e:#}"))?;
        native
            .apply_allow_sets(&sets)
            .map_err(|e| format!("{e:#}"))?;
        for f in &batch {
            if early_exits_agree(&table, f).map_err(|e| format!("seed 0x{seed:x}: {e}"))? {
                common_vxlan += 1;
            }
            if checks_skip_agrees(&table, f).map_err(|e| format!("seed 0x{seed:x}: {e}"))? {
                checks_skipped += 1;
            }
        }
        let from_kernel = run_batch(&mut kernel, &batch, index);
        let from_native = run_batch(&mut native, &batch, index);
        rows_compared += from_kernel.len();
        if from_kernel == from_native {
            continue;
        }
        // Find the first frame that differs on its own.
        for f in &batch {
            index += 1;
            let one = std::slice::from_ref(f);
            let (k, n) = (
                run_batch(&mut kernel, one, index),
                run_batch(&mut native, one, index),
            );
            if k != n {
                let saved = save(&f.data, seed);
                return Err(format!(
                    "seed 0x{seed:x}, frame {} ({} bytes) differs:\n{}frame:{}\n{saved}",
                    f.number,
                    f.data.len(),
                    differences(&k, &n),
                    hex(&f.data),
                ));
            }
        }
        return Err(format!(
            "seed 0x{seed:x}: batch {index} differs, but no frame does alone:\n{}",
            differences(&from_kernel, &from_native)
        ));
    }
    Ok(Agreement {
        frames: tried,
        rows: rows_compared,
        common_vxlan,
        checks_skipped,
    })
}
