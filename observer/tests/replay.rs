//! `observer replay`, the built binary, against tcpdump's counts:
//!
//! - every reference capture (`support::pcaps_dir()`), in one run: per
//!   capture, tunnel rows per (protocol, outer source, VNI) equal tcpdump's
//!   decode (`support::tcpdump`), every frame counted once;
//! - captures this test records itself with tcpdump between two network
//!   namespaces (VXLAN pings through vxlan devices, crafted IPIP frames,
//!   a snap length that cuts the VXLAN frames), replayed as pcap and as
//!   pcapng / Linux cooked v1, v2 / raw IP conversions, with and without
//!   `--local`, and with `--allow-cidr`;
//! - an evidence file (`--capture-dir`, written by `report::evidence`):
//!   its rows, and its comments tallied into `evidence` lines;
//! - damaged and foreign files: exact message, frame number and exit status;
//! - the native classifier (the default) and `--kernel` (the loaded
//!   programs, by BPF_PROG_TEST_RUN) give the same rows, byte for byte, on
//!   every capture above (`replay_both`).
//!
//! Replays run inside a namespace of their own, so allow-sets of other
//! tests on the node cannot change their drop counts.

mod support;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use observer_testkit::pair::{A_IP, A_MAC_BYTES, B_IP, B_MAC_BYTES, Lower, Pair};
use pcap_file::{
    DataLink, Endianness, TsResolution,
    pcap::{PcapHeader, PcapReader, PcapWriter, RawPcapPacket},
    pcapng::{
        PcapNgWriter,
        blocks::{
            enhanced_packet::EnhancedPacketBlock,
            interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption},
        },
    },
};
use serde_json::Value;
use support::{
    frames,
    netns::{Netns, ObserverRun, Tcpdump, send_frames, temp_path},
    tcpdump::{TunnelKey, count, describe},
};

/// A source B does not own (IPIP frames "from" a third node).
const C_IP: &str = "198.18.0.3";
const PINGS: u32 = 20;
/// ICMP payload of the pings: VXLAN frames of 492 bytes, above the
/// capture's snap length of 256 (see `support::netns::Tcpdump`).
const PING_SIZE: &str = "400";
const IPIP_FROM_A: u32 = 7;
const IPIP_FROM_C: u32 = 5;
const EXIT_DAMAGED: i32 = 1;
const EXIT_USAGE: i32 = 2;

/// Runs `observer replay --output json ARGS...` inside `ns`.
fn replay(ns: &Netns, args: &[&str]) -> ObserverRun {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns.name()]);
    replay_with(cmd, args)
}

/// Runs `observer replay --output json ARGS...` as an argument of `cmd`
/// (a namespace, another user).
fn replay_with(cmd: Command, args: &[&str]) -> ObserverRun {
    replay_binary_with(cmd, env!("CARGO_BIN_EXE_observer"), args)
}

/// [`replay_with`] of the observer binary at `binary`.
fn replay_binary_with(mut cmd: Command, binary: &str, args: &[&str]) -> ObserverRun {
    let output = cmd
        .arg(binary)
        .args(["replay", "--output", "json"])
        .args(args)
        .env("OBSERVER_LOG", "error")
        .output()
        .expect("running observer replay");
    let stdout = String::from_utf8_lossy(&output.stdout);
    ObserverRun {
        lines: stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
            .collect(),
        status: output.status,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Replays `args` with the native classifier and with `--kernel`, checks
/// that both succeed with the same rows for every capture, and returns the
/// native run.
fn replay_both(ns: &Netns, args: &[&str]) -> ObserverRun {
    let native = replay(ns, args);
    let kernel_args: Vec<&str> = std::iter::once("--kernel")
        .chain(args.iter().copied())
        .collect();
    let kernel = replay(ns, &kernel_args);
    assert!(
        native.status.success(),
        "{}: {}",
        native.status,
        native.stderr
    );
    assert!(
        kernel.status.success(),
        "--kernel {}: {}",
        kernel.status,
        kernel.stderr
    );
    let captures: Vec<&Value> = native
        .lines
        .iter()
        .filter(|l| l["type"] == "replay")
        .map(|l| &l["iface"])
        .collect();
    assert!(!captures.is_empty(), "no replay lines: {:#?}", native.lines);
    for iface in captures {
        let iface = iface.as_str().unwrap();
        assert_eq!(summary(&native, iface)["engine"], "native");
        assert_eq!(summary(&kernel, iface)["engine"], "bpf_test_run");
        assert_eq!(
            rows_of(&native, iface),
            rows_of(&kernel, iface),
            "{iface}: native rows (left) differ from the kernel's (right)"
        );
    }
    native
}

/// The `replay` line of capture `iface`.
fn summary<'a>(run: &'a ObserverRun, iface: &str) -> &'a Value {
    run.lines
        .iter()
        .find(|l| l["type"] == "replay" && l["iface"] == iface)
        .unwrap_or_else(|| panic!("no replay line for {iface}: {:#?}", run.lines))
}

/// Tunnel rows of capture `iface` as tcpdump keys, with packet counts.
fn tunnel_counts(run: &ObserverRun, iface: &str) -> BTreeMap<TunnelKey, u64> {
    let mut counts = BTreeMap::new();
    for ((file, _, proto, peer, vni), row) in run.peers() {
        if file != iface || proto == "other" {
            continue;
        }
        let proto = observer_common::Proto::ALL
            .into_iter()
            .find(|p| p.name() == proto)
            .unwrap_or_else(|| panic!("unknown proto {proto}"));
        let peer = peer.expect("tunnel row without a peer").parse().unwrap();
        *counts.entry((proto, peer, vni as u32)).or_insert(0) += row["packets"].as_u64().unwrap();
    }
    counts
}

/// Packets of every row (peer and unclassified) of capture `iface`.
fn all_packets(run: &ObserverRun, iface: &str) -> u64 {
    run.lines
        .iter()
        .filter(|l| (l["type"] == "peer" || l["type"] == "unclassified") && l["iface"] == iface)
        .map(|l| l["packets"].as_u64().unwrap())
        .sum()
}

/// The rows of capture `iface` without it: (direction, proto, peer, vni)
/// -> (packets, bytes, drops), to compare two replays of the same frames.
fn rows_of(run: &ObserverRun, iface: &str) -> BTreeMap<String, String> {
    run.lines
        .iter()
        .filter(|l| l["iface"] == iface && l["type"] != "replay")
        .map(|l| {
            let key = format!(
                "{} {} {} {} {} {}",
                l["type"], l["direction"], l["proto"], l["peer"], l["vni"], l["reason"]
            );
            let value = format!("{} {} {}", l["packets"], l["bytes"], l["drops"]);
            (key, value)
        })
        .collect()
}

#[test]
fn reference_captures_replay_as_tcpdump_decodes_them() {
    if !support::have_root("reference_captures_replay_as_tcpdump_decodes_them") {
        return;
    }
    let captures = support::reference_captures();
    let dir = support::pcaps_dir();
    let ns = Netns::new("rpr");
    let paths: Vec<&str> = captures.iter().map(|p| p.to_str().unwrap()).collect();
    let run = replay_both(&ns, &paths);
    assert!(run.status.success(), "{}: {}", run.status, run.stderr);
    run.final_stats();

    let mut failures = Vec::new();
    for path in &captures {
        let file = path.file_name().unwrap().to_str().unwrap();
        let iface = path.to_str().unwrap();
        let (out, verdicts) = support::tcpdump::expected(&dir, file);
        let line = summary(&run, iface);
        let frames = line["frames"].as_u64().unwrap();
        // Frames the snap length cut, straight from the records.
        let truncated = support::netns::pcap_records(path)
            .iter()
            .filter(|(data, orig)| (data.len() as u32) < *orig)
            .count() as u64;
        let want = count(verdicts.iter().flatten().copied());
        let got = tunnel_counts(&run, iface);
        eprintln!("{file:<32} {frames:>3} frames  {}", describe(&got));
        if frames != verdicts.len() as u64 {
            failures.push(format!(
                "{file}: {frames} frames, {out} has {}",
                verdicts.len()
            ));
        }
        if want != got {
            failures.push(format!(
                "{file}: tcpdump {}; replay {}",
                describe(&want),
                describe(&got)
            ));
        }
        if all_packets(&run, iface) != frames {
            failures.push(format!("{file}: rows do not add up to {frames} frames"));
        }
        if line["truncated"] != truncated {
            failures.push(format!(
                "{file}: truncated {} != {truncated}",
                line["truncated"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The shared two-namespace pair, va (A) <-> vb (B), with VXLAN devices
/// (VNI 4096, port 4789) whose inner addresses are 198.19.0.1 and .2.
struct Lab {
    a: Netns,
    b: Netns,
}

impl Lab {
    fn new() -> Lab {
        let pair = Pair::new("rp");
        pair.vxlan(Lower::Veth);
        let Pair { a, b, .. } = pair;
        Lab { a, b }
    }

    /// Records on vb: PINGS VXLAN pings A -> B (and their replies), and
    /// crafted IPIP frames from A and from C. Returns the capture.
    fn record(&self) -> support::netns::Capture {
        let tcpdump = Tcpdump::start(&self.b, "vb", "udp port 4789 or ip proto 4");
        let count = PINGS.to_string();
        let ping = self.a.exec(&[
            "ping",
            "-n",
            "-q",
            "-c",
            &count,
            "-i",
            "0.01",
            "-s",
            PING_SIZE,
            "-W",
            "2",
            "198.19.0.2",
        ]);
        let text = String::from_utf8_lossy(&ping.stdout);
        assert!(
            text.contains(&format!("{PINGS} packets transmitted, {PINGS} received")),
            "ping through the tunnel: {text}"
        );
        let inner = frames::icmp4_packet(frames::addr4("198.19.0.1"), frames::addr4("198.19.0.2"));
        let ipip = |src: &str| {
            let mut frame = frames::ipip_frame(frames::addr(src), frames::addr(B_IP), &inner);
            frames::set_macs(&mut frame, B_MAC_BYTES, A_MAC_BYTES);
            frame
        };
        send_frames(
            &self.a,
            "va",
            vec![(ipip(A_IP), IPIP_FROM_A), (ipip(C_IP), IPIP_FROM_C)],
        );
        tcpdump.stop_after((2 * PINGS + IPIP_FROM_A + IPIP_FROM_C) as usize)
    }
}

/// The records of a pcap with their timestamps.
fn raw_records(path: &Path) -> (PcapHeader, Vec<RawPcapPacket<'static>>) {
    let mut reader = PcapReader::new(fs::File::open(path).unwrap()).unwrap();
    let header = reader.header();
    let mut records = Vec::new();
    while let Some(record) = reader.next_raw_packet() {
        let record = record.unwrap();
        records.push(RawPcapPacket {
            data: std::borrow::Cow::Owned(record.data.into_owned()),
            ..record
        });
    }
    (header, records)
}

/// The capture as pcapng (nanosecond timestamps), written with pcap-file's
/// writer: tcpdump writes only pcap.
fn to_pcapng(path: &Path) -> PathBuf {
    let (header, records) = raw_records(path);
    assert_eq!(header.ts_resolution, TsResolution::MicroSecond);
    let out = temp_path("replay", "pcapng");
    let mut writer = PcapNgWriter::new(fs::File::create(&out).unwrap()).unwrap();
    writer
        .write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: header.snaplen,
            options: vec![InterfaceDescriptionOption::IfTsResol(9)],
        })
        .unwrap();
    for r in &records {
        writer
            .write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                // In the interface's units: nanoseconds.
                timestamp: Duration::new(u64::from(r.ts_sec), r.ts_frac * 1000),
                original_len: r.orig_len,
                data: r.data.clone(),
                options: vec![],
            })
            .unwrap();
    }
    out
}

/// The capture with its Ethernet headers replaced by `link_type`'s.
fn relink(path: &Path, link_type: DataLink) -> PathBuf {
    let (header, records) = raw_records(path);
    let out = temp_path("replay", "pcap");
    let mut writer = PcapWriter::with_header(
        fs::File::create(&out).unwrap(),
        PcapHeader {
            datalink: link_type,
            endianness: Endianness::Little,
            ..header
        },
    )
    .unwrap();
    for r in &records {
        let (ethertype, payload) = (&r.data[12..14], &r.data[14..]);
        let link_header: Vec<u8> = match link_type {
            // Packet type 0 (to us), ARPHRD_ETHER, 6-byte address, protocol.
            DataLink::LINUX_SLL => {
                [&[0, 0, 0, 1, 0, 6][..], &r.data[6..12], &[0, 0], ethertype].concat()
            }
            // Protocol, reserved, ifindex, ARPHRD_ETHER, type, address.
            DataLink::LINUX_SLL2 => [
                ethertype,
                &[0, 0, 0, 0, 0, 2, 0, 1, 0, 6][..],
                &r.data[6..12],
                &[0, 0],
            ]
            .concat(),
            DataLink::RAW => Vec::new(),
            // The address family: host order (little-endian here), then
            // network order; the captures are IPv4.
            DataLink::NULL => 2u32.to_le_bytes().to_vec(),
            DataLink::LOOP => 2u32.to_be_bytes().to_vec(),
            // AF_INET, version 0, resource 0; one NFULA_PAYLOAD attribute
            // whose length is the packet's on the wire, as the kernel logs
            // it (the snap length may cut the record).
            DataLink::NFLOG => {
                let logged = (r.orig_len - 14 + 4) as u16;
                [
                    &[2, 0, 0, 0][..],
                    &logged.to_le_bytes(),
                    &9u16.to_le_bytes(),
                ]
                .concat()
            }
            other => panic!("{other:?}"),
        };
        let data = [&link_header[..], payload].concat();
        let grown = link_header.len() as u32;
        writer
            .write_raw_packet(&RawPcapPacket {
                incl_len: data.len() as u32,
                orig_len: r.orig_len - 14 + grown,
                data: data.into(),
                ..r.clone()
            })
            .unwrap();
    }
    out
}

/// Removes the files on drop.
struct TempFiles(Vec<PathBuf>);

impl Drop for TempFiles {
    fn drop(&mut self) {
        for f in &self.0 {
            let _ = fs::remove_file(f);
        }
    }
}

#[test]
fn recorded_vxlan_and_ipip_replay_as_tcpdump_counts_them() {
    if !support::have_root("recorded_vxlan_and_ipip_replay_as_tcpdump_counts_them") {
        return;
    }
    let lab = Lab::new();
    let capture = lab.record();
    let path = capture.path().to_str().unwrap().to_string();
    let vxlan_from = |src: &str| capture.count(&format!("udp dst port 4789 and src host {src}"));
    let ipip_from = |src: &str| capture.totals(&format!("ip proto 4 and src host {src}"));
    let (from_a, from_b) = (vxlan_from(A_IP), vxlan_from(B_IP));
    assert_eq!((from_a, from_b), (u64::from(PINGS), u64::from(PINGS)));
    let frames = capture.count("ip");
    let truncated = capture.count("greater 257");
    assert_eq!(
        truncated,
        2 * u64::from(PINGS),
        "the snap length cuts the pings"
    );

    // Received by B: every frame is rx, the peer is the outer source.
    let ns = Netns::new("rpr");
    let run = replay_both(&ns, &[&path]);
    assert!(run.status.success(), "{}: {}", run.status, run.stderr);
    let line = summary(&run, &path);
    assert_eq!(line["frames"], frames);
    assert_eq!(line["truncated"], truncated);
    assert_eq!(line["tx_frames"], 0);
    assert_eq!(
        line["truncated_bytes"],
        truncated * (492 - 256),
        "original 492-byte frames cut to 256"
    );
    let rx = |peer: &str, proto: &str, vni: u64| run.counts(&path, "rx", proto, Some(peer), vni);
    assert_eq!(rx(A_IP, "vxlan", 4096), (from_a, from_a * 256));
    assert_eq!(rx(B_IP, "vxlan", 4096), (from_b, from_b * 256));
    assert_eq!(rx(A_IP, "ipip", 0), ipip_from(A_IP));
    assert_eq!(rx(C_IP, "ipip", 0), ipip_from(C_IP));
    assert_eq!(ipip_from(C_IP).0, u64::from(IPIP_FROM_C));
    assert_eq!(all_packets(&run, &path), frames);
    let inner = &run.peers()[&(
        path.clone(),
        "rx".to_string(),
        "vxlan".to_string(),
        Some(A_IP.to_string()),
        4096,
    )];
    assert_eq!(
        (&inner["inner_src"], &inner["inner_dst"]),
        (&"198.19.0.1".into(), &"198.19.0.2".into())
    );

    // --local B: B's own frames are tx, with the outer destination as peer.
    let local = replay_both(&ns, &["--local", B_IP, &path]);
    assert!(local.status.success(), "{}", local.stderr);
    assert_eq!(summary(&local, &path)["tx_frames"], from_b);
    assert_eq!(
        local.counts(&path, "tx", "vxlan", Some(A_IP), 4096),
        (from_b, from_b * 256)
    );
    assert_eq!(
        local.counts(&path, "rx", "vxlan", Some(A_IP), 4096),
        (from_a, from_a * 256)
    );
    assert_eq!(local.counts(&path, "rx", "vxlan", Some(B_IP), 4096), (0, 0));
    assert_eq!(
        local.counts(&path, "rx", "ipip", Some(C_IP), 0),
        ipip_from(C_IP)
    );
    assert_eq!(all_packets(&local, &path), frames);

    // Allow-sets: only B may send VXLAN, only A IPIP.
    let allowed = replay_both(
        &ns,
        &[
            "--allow-cidr",
            &format!("{B_IP}/32"),
            "--allow-cidr",
            &format!("ipip={A_IP}/32"),
            &path,
        ],
    );
    assert!(allowed.status.success(), "{}", allowed.stderr);
    let drops = |peer: &str, proto: &str, vni: u64| {
        allowed.peers()[&(
            path.clone(),
            "rx".to_string(),
            proto.to_string(),
            Some(peer.to_string()),
            vni,
        )]["drops"]["calico_allow_set"]
            .as_u64()
            .unwrap_or(0)
    };
    assert_eq!(drops(A_IP, "vxlan", 4096), from_a);
    assert_eq!(drops(B_IP, "vxlan", 4096), 0);
    assert_eq!(drops(C_IP, "ipip", 0), u64::from(IPIP_FROM_C));
    assert_eq!(drops(A_IP, "ipip", 0), 0);
    let messages: Vec<&str> = allowed
        .lines
        .iter()
        .filter(|l| l["type"] == "drop")
        .map(|l| l["message"].as_str().unwrap())
        .collect();
    assert!(
        messages.contains(
            &format!("{from_a} VXLAN packets from {A_IP} dropped: source not in --allow-cidr")
                .as_str()
        ),
        "{messages:?}"
    );

    // The same frames as pcapng, Linux cooked v1 and v2, raw IP, BSD
    // loopback (NULL, LOOP) and NFLOG: the same rows (their frames get a
    // 14-byte Ethernet header back, so even the bytes agree) and the same
    // times.
    let converted = TempFiles(vec![
        to_pcapng(capture.path()),
        relink(capture.path(), DataLink::LINUX_SLL),
        relink(capture.path(), DataLink::LINUX_SLL2),
        relink(capture.path(), DataLink::RAW),
        relink(capture.path(), DataLink::NULL),
        relink(capture.path(), DataLink::LOOP),
        relink(capture.path(), DataLink::NFLOG),
    ]);
    let mut args = vec![path.as_str()];
    args.extend(converted.0.iter().map(|p| p.to_str().unwrap()));
    let all = replay(&ns, &args);
    assert!(all.status.success(), "{}", all.stderr);
    let reference = rows_of(&all, &path);
    assert_eq!(reference, rows_of(&run, &path));
    for other in &converted.0 {
        let other = other.to_str().unwrap();
        assert_eq!(rows_of(&all, other), reference, "{other}");
        let (a, b) = (summary(&all, &path), summary(&all, other));
        for field in ["frames", "truncated", "first_ts", "last_ts"] {
            assert_eq!(a[field], b[field], "{other}: {field}");
        }
    }
    assert_eq!(
        summary(&all, converted.0[0].to_str().unwrap())["format"],
        "pcapng"
    );
}

// ---------------------------------------------------------------------------
// Long frames.

/// Writes `frames` whole as a little-endian pcap at `path` with snap
/// length `snaplen`, a second apart.
fn write_pcap<'a>(path: &Path, snaplen: u32, frames: impl IntoIterator<Item = &'a Vec<u8>>) {
    let mut writer = PcapWriter::with_header(
        fs::File::create(path).unwrap(),
        PcapHeader {
            snaplen,
            ..PcapHeader::default()
        },
    )
    .unwrap();
    for (i, frame) in frames.into_iter().enumerate() {
        writer
            .write_raw_packet(&RawPcapPacket {
                ts_sec: 1_700_000_000 + i as u32,
                ts_frac: 0,
                incl_len: frame.len() as u32,
                orig_len: frame.len() as u32,
                data: frame.as_slice().into(),
            })
            .unwrap();
    }
}

/// A VXLAN frame from `src` to `dst` (VNI 42) of exactly `len` bytes: an
/// ICMP inner frame padded with zeros.
fn vxlan_of_len(src: &str, dst: &str, len: usize) -> Vec<u8> {
    let inner = frames::icmp_eth_frame(frames::addr("198.19.0.2"), frames::addr("198.19.0.1"));
    let outer = frames::vxlan_frame(frames::addr(src), frames::addr(dst), 42, &inner).len();
    let padded = frames::cat(&[&inner, &vec![0; len - outer]]);
    let frame = frames::vxlan_frame(frames::addr(src), frames::addr(dst), 42, &padded);
    assert_eq!(frame.len(), len);
    frame
}

/// Frames longer than a test run holds (a 9,100-byte jumbo frame, one of
/// 65,549 bytes: IPv4's largest packet, above the 64 KiB an XDP test run
/// takes) are classified on their first bytes but count every captured
/// byte, received and sent alike.
#[test]
fn long_frames_count_every_captured_byte() {
    if !support::have_root("long_frames_count_every_captured_byte") {
        return;
    }
    let received = [
        vxlan_of_len(B_IP, A_IP, 9_100),
        vxlan_of_len(B_IP, A_IP, 65_549),
        vxlan_of_len(B_IP, A_IP, 1_000),
    ];
    let sent = [
        vxlan_of_len(A_IP, B_IP, 9_100),
        vxlan_of_len(A_IP, B_IP, 5_000),
    ];
    let path = temp_path("long", "pcap");
    let files = TempFiles(vec![path.clone()]);
    write_pcap(&path, 262_144, received.iter().chain(&sent));
    let ns = Netns::new("rpl");
    let file = files.0[0].to_str().unwrap();
    let total = |frames: &[Vec<u8>]| frames.iter().map(|f| f.len() as u64).sum::<u64>();
    for kernel in [false, true] {
        let mut args = vec!["--local", A_IP, file];
        if kernel {
            args.insert(0, "--kernel");
        }
        let run = replay(&ns, &args);
        assert!(run.status.success(), "{}: {}", run.status, run.stderr);
        assert_eq!(
            run.counts(file, "rx", "vxlan", Some(B_IP), 42),
            (received.len() as u64, total(&received)),
            "kernel: {kernel}"
        );
        assert_eq!(
            run.counts(file, "tx", "vxlan", Some(B_IP), 42),
            (sent.len() as u64, total(&sent)),
            "kernel: {kernel}"
        );
        // Cut (kernel only: the native classifier takes any length): the
        // sent frames above an skb test run and the 65,549-byte one; also
        // the received jumbo frame on kernels without multi-buffer XDP.
        let cut = summary(&run, file)["cut"].as_u64().unwrap();
        if kernel {
            assert!(cut == 3 || cut == 4, "cut {cut}");
        } else {
            assert_eq!(cut, 0);
        }
    }
}

/// IPv6 frames whose extension headers reach past the 512 bytes the
/// parser reads (a 2 KB destination-options header before IPIP; 608 bytes
/// of them before VXLAN) replay as `beyond_window`, not as cut frames,
/// with the native classifier and the loaded programs alike; one whose
/// 400-byte header ends inside the window replays as the IPIP it is.
#[test]
fn long_ipv6_extension_headers_are_beyond_the_window_in_both_engines() {
    if !support::have_root("long_ipv6_extension_headers_are_beyond_the_window_in_both_engines") {
        return;
    }
    use frames::{Ipv6Ext, addr, addr6, eth, icmp_packet, ipv6_ext, udp, vxlan_header};
    let (a, b) = ("2001:db8:7::1", "2001:db8:7::2");
    let inner = icmp_packet(addr("10.3.0.1"), addr("10.3.0.2"));
    let ipip = |options: u8| {
        eth(
            0x86dd,
            &ipv6_ext(addr6(a), addr6(b), &[Ipv6Ext::DestOpts(options)], 4, &inner),
        )
    };
    let vxlan = eth(
        0x86dd,
        &ipv6_ext(
            addr6(a),
            addr6(b),
            &[Ipv6Ext::HopByHop(0), Ipv6Ext::DestOpts(74)],
            17,
            &udp(addr(a), addr(b), 40_000, 4789, &vxlan_header(1)),
        ),
    );
    let frames = [ipip(255), vxlan, ipip(49)];
    let path = temp_path("ext", "pcap");
    let files = TempFiles(vec![path.clone()]);
    write_pcap(&path, 65_535, &frames);
    let ns = Netns::new("rplx");
    let file = files.0[0].to_str().unwrap();
    let run = replay_both(&ns, &[file]);
    let beyond: u64 = run
        .lines
        .iter()
        .filter(|l| l["type"] == "unclassified" && l["reason"] == "beyond_window")
        .map(|l| l["packets"].as_u64().unwrap())
        .sum();
    assert_eq!(beyond, 2, "{:#?}", run.lines);
    assert_eq!(
        run.counts(file, "rx", "ipip", Some(a), 0),
        (1, frames[2].len() as u64)
    );
    assert_eq!(all_packets(&run, file), 3);
}

/// An evidence file (`--capture-dir`), as `report::evidence` writes it:
/// replay counts its frames as any capture's (a drop on a tunnel device is
/// the inner packet behind a synthetic Ethernet header, zero MACs, as the
/// monitor writes it) and prints one `evidence` line
/// per (peer, stage, direction, origin, reason) the comments name, a frame
/// with two reasons under each; the `replay` line says how many frames
/// carried a comment.
#[test]
fn evidence_files_replay_with_their_reasons() {
    use observer::{
        model::{
            evidence::{Evidence, Origin},
            rows::Stage,
        },
        report::evidence::{EvidenceFiles, FilesSettings},
    };
    use observer_common::Direction;
    if !support::have_root("evidence_files_replay_with_their_reasons") {
        return;
    }
    let (a, b) = (frames::addr(A_IP), frames::addr(B_IP));
    let (pod_b, pod_a) = (frames::addr("198.19.0.2"), frames::addr("198.19.0.1"));
    let vxlan = frames::vxlan_frame(b, a, 42, &frames::icmp_eth_frame(pod_b, pod_a));
    let inner = frames::icmp_packet(pod_b, pod_a);
    let decapsulated = frames::ethernet([0; 6], [0; 6], &[], frames::ETH_P_IP, &inner);
    let flagged = |n: u64, reasons: &[&str]| Evidence {
        timestamp: Duration::new(1_700_000_000 + n, 0),
        ifindex: 2,
        interface: "eth0".to_string(),
        direction: Direction::Rx,
        stage: Stage::Underlay,
        origin: Origin::Classifier,
        peer: Some(b),
        reasons: reasons.iter().map(|r| r.to_string()).collect(),
        location: None,
        wire_len: vxlan.len() as u32,
        data: vxlan.clone(),
    };
    let dropped = |n: u64, stage: Stage| Evidence {
        origin: Origin::Kernel,
        location: Some("nf_hook_slow".to_string()),
        ..match stage {
            Stage::Underlay => flagged(n, &["NETFILTER_DROP"]),
            _ => Evidence {
                interface: "vxlan.calico".to_string(),
                stage,
                wire_len: decapsulated.len() as u32,
                data: decapsulated.clone(),
                ..flagged(n, &["NETFILTER_DROP"])
            },
        }
    };
    let evidence = [
        flagged(0, &["calico_allow_set"]),
        flagged(1, &["calico_allow_set", "bad_outer_checksum"]),
        flagged(2, &["calico_allow_set"]),
        dropped(3, Stage::Underlay),
        dropped(4, Stage::Tunnel),
        flagged(5, &["calico_allow_set"]),
        dropped(6, Stage::Underlay),
    ];
    let dir = tempfile::Builder::new()
        .prefix("observer-evidence-")
        .tempdir()
        .unwrap();
    let mut files = EvidenceFiles::open(FilesSettings {
        min_free_bytes: 0,
        ..FilesSettings::new(dir.path())
    })
    .unwrap();
    for e in &evidence {
        files.write(e).unwrap();
    }
    let path = files.finish().unwrap().expect("a completed file");
    let file = path.to_str().unwrap();
    let ns = Netns::new("rpev");
    let run = replay(&ns, &[file]);
    assert!(run.status.success(), "{}: {}", run.status, run.stderr);

    let replayed = summary(&run, file);
    assert_eq!(replayed["format"], "pcapng");
    assert_eq!(replayed["frames"], evidence.len() as u64);
    assert_eq!(replayed["evidence_frames"], evidence.len() as u64);
    assert!(replayed.get("evidence_overflow").is_none(), "{replayed}");
    // The six VXLAN frames from B, and the decapsulated packet as plain IP
    // behind its synthetic Ethernet header.
    assert_eq!(
        run.counts(file, "rx", "vxlan", Some(B_IP), 42),
        (6, 6 * vxlan.len() as u64)
    );
    let other: Vec<(u64, u64)> = run
        .peers()
        .into_iter()
        .filter(|((f, _, proto, _, _), _)| f == file && proto != "vxlan")
        .map(|(_, row)| {
            (
                row["packets"].as_u64().unwrap(),
                row["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(other, [(1, (frames::ETH_HLEN + inner.len()) as u64)]);
    assert_eq!(all_packets(&run, file), evidence.len() as u64);

    let lines: Vec<&Value> = run
        .lines
        .iter()
        .filter(|l| l["type"] == "evidence")
        .collect();
    let line = |stage: &str, origin: &str, reason: &str, frames: u64| {
        serde_json::json!({
            "type": "evidence", "capture": file, "peer": B_IP, "stage": stage,
            "direction": "rx", "origin": origin, "reason": reason, "frames": frames,
        })
    };
    assert_eq!(
        lines,
        [
            &line("underlay", "classifier", "bad_outer_checksum", 1),
            &line("underlay", "classifier", "calico_allow_set", 4),
            &line("underlay", "kernel", "NETFILTER_DROP", 2),
            &line("tunnel", "kernel", "NETFILTER_DROP", 1),
        ]
    );
    // Right after their capture's replay line.
    let at = |t: &str| run.lines.iter().position(|l| l["type"] == t).unwrap();
    assert_eq!(at("evidence"), at("replay") + 1);
}

// ---------------------------------------------------------------------------
// Damaged and foreign files.

/// Frames of the hand-made capture.
const FRAMES: usize = 10;

/// A little-endian pcap of FRAMES VXLAN frames from 198.18.0.2 (VNI 42),
/// every record the same length; and that length.
fn small_pcap() -> (Vec<u8>, usize) {
    let inner = frames::icmp_eth_frame(frames::addr("198.19.0.2"), frames::addr("198.19.0.1"));
    let frame = frames::vxlan_frame(frames::addr(B_IP), frames::addr(A_IP), 42, &inner);
    let mut file = Vec::new();
    for word in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 65535, 1] {
        file.extend_from_slice(&word.to_le_bytes());
    }
    for i in 0..FRAMES as u32 {
        for word in [1_700_000_000 + i, 0, frame.len() as u32, frame.len() as u32] {
            file.extend_from_slice(&word.to_le_bytes());
        }
        file.extend_from_slice(&frame);
    }
    (file, 16 + frame.len())
}

/// Offset of record `n` (from 1) in [`small_pcap`].
fn record_offset(n: usize, record: usize) -> usize {
    24 + (n - 1) * record
}

/// Replays `bytes` written to a file; returns the run and the file's path.
fn replay_bytes(ns: &Netns, bytes: &[u8], ext: &str) -> (ObserverRun, TempFiles) {
    let path = temp_path("damaged", ext);
    fs::write(&path, bytes).unwrap();
    let run = replay(ns, &[path.to_str().unwrap()]);
    (run, TempFiles(vec![path]))
}

/// Asserts exit `status`, that stderr is exactly `observer: error:
/// capture PATH: MESSAGE`, and returns the VXLAN packets printed.
fn check_failure(run: &ObserverRun, files: &TempFiles, status: i32, message: &str) -> u64 {
    let path = files.0[0].to_str().unwrap();
    assert_eq!(run.status.code(), Some(status), "{}", run.stderr);
    assert_eq!(
        run.stderr.trim_end(),
        format!("observer: error: capture {path}: {message}")
    );
    run.counts(path, "rx", "vxlan", Some(B_IP), 42).0
}

#[test]
fn damaged_and_foreign_files_name_the_file_frame_and_exit_status() {
    if !support::have_root("damaged_and_foreign_files_name_the_file_frame_and_exit_status") {
        return;
    }
    let ns = Netns::new("rpd");
    let (good, record) = small_pcap();
    let (run, files) = replay_bytes(&ns, &good, "pcap");
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(
        run.counts(files.0[0].to_str().unwrap(), "rx", "vxlan", Some(B_IP), 42)
            .0,
        FRAMES as u64
    );

    let truncated_record =
        "record truncated (the file ends inside it, or its length field is damaged)";
    // The file ends in the middle of frame 7: frames 1-6 are printed.
    let cut = &good[..record_offset(7, record) + 30];
    let (run, files) = replay_bytes(&ns, cut, "pcap");
    let counted = check_failure(
        &run,
        &files,
        EXIT_DAMAGED,
        &format!("frame 7: {truncated_record}"),
    );
    assert_eq!(counted, 6);
    let line = summary(&run, files.0[0].to_str().unwrap());
    assert_eq!(line["frames"], 6);
    assert_eq!(line["error"], format!("frame 7: {truncated_record}"));
    run.final_stats();

    // Frame 4 claims 2 GB: a length beyond the end of the file.
    let mut long = good.clone();
    let at = record_offset(4, record) + 8;
    long[at..at + 4].copy_from_slice(&0x7fff_0000u32.to_le_bytes());
    let (run, files) = replay_bytes(&ns, &long, "pcap");
    assert_eq!(
        check_failure(
            &run,
            &files,
            EXIT_DAMAGED,
            &format!("frame 4: {truncated_record}")
        ),
        3
    );

    // Frame 5's original length claims 4 GB and its microseconds are out
    // of range (as in a fuzzed capture libpcap refuses): damage, not 4 GB
    // of bytes the snap length cut.
    let mut claims = good.clone();
    let at = record_offset(5, record);
    claims[at + 4..at + 8].copy_from_slice(&2_000_000u32.to_le_bytes());
    claims[at + 12..at + 16].copy_from_slice(&4_093_509_154u32.to_le_bytes());
    let (run, files) = replay_bytes(&ns, &claims, "pcap");
    assert_eq!(
        check_failure(
            &run,
            &files,
            EXIT_DAMAGED,
            "frame 5: record header damaged: its timestamp's microseconds field is 2000000 \
             (at most 999999)"
        ),
        4
    );
    claims[at + 4..at + 8].copy_from_slice(&0u32.to_le_bytes());
    let (run, files) = replay_bytes(&ns, &claims, "pcap");
    assert_eq!(
        check_failure(
            &run,
            &files,
            EXIT_DAMAGED,
            "frame 5: record's length field damaged: it claims 4093509154 bytes on the wire \
             (no packet is longer than 1048576)"
        ),
        4
    );
    assert_eq!(
        summary(&run, files.0[0].to_str().unwrap())["truncated_bytes"],
        0
    );

    // A runt (10 bytes) and a frame cut inside its VLAN tag (16 bytes):
    // one truncated_l2 row with both frames and all 26 bytes, from either
    // engine (it used to be two lines for one key, without the runt's bytes).
    let mut stubs = good[..24].to_vec();
    let vlan_cut = [[2u8; 12].as_slice(), &[0x81, 0x00, 0x00, 0x05]].concat();
    for (i, data) in [vec![2u8; 10], vlan_cut].iter().enumerate() {
        let len = data.len() as u32;
        for word in [1_700_000_000 + i as u32, 0, len, len] {
            stubs.extend_from_slice(&word.to_le_bytes());
        }
        stubs.extend_from_slice(data);
    }
    let path = temp_path("stubs", "pcap");
    fs::write(&path, &stubs).unwrap();
    let _files = TempFiles(vec![path.clone()]);
    let run = replay_both(&ns, &[path.to_str().unwrap()]);
    let lines: Vec<&Value> = run
        .lines
        .iter()
        .filter(|l| l["type"] == "unclassified" || l["type"] == "peer")
        .collect();
    assert_eq!(lines.len(), 1, "one row: {lines:#?}");
    assert_eq!(
        (
            &lines[0]["reason"],
            &lines[0]["packets"],
            &lines[0]["bytes"]
        ),
        (
            &Value::from("truncated_l2"),
            &Value::from(2),
            &Value::from(26)
        ),
        "{}",
        lines[0]
    );

    // Not captures at all: nothing is printed.
    let hint = "; record one with `tcpdump -i IFACE -w FILE`";
    let usage = |bytes: &[u8], message: &str| {
        let (run, files) = replay_bytes(&ns, bytes, "pcap");
        check_failure(&run, &files, EXIT_USAGE, message);
        assert!(run.lines.is_empty(), "{:?}", run.lines);
    };
    usage(
        b"GET / HTTP/1.1\r\n",
        &format!("not a pcap or pcapng capture (unknown magic number 47455420){hint}"),
    );
    let mut wrong_magic = good.clone();
    wrong_magic[..4].copy_from_slice(&[0xd4, 0xc3, 0xb2, 0xa0]);
    usage(
        &wrong_magic,
        &format!("not a pcap or pcapng capture (unknown magic number d4c3b2a0){hint}"),
    );
    usage(
        &good[..20],
        &format!("not a pcap or pcapng capture (pcap file header truncated){hint}"),
    );
    usage(
        b"",
        &format!("not a pcap or pcapng capture (shorter than a capture header){hint}"),
    );
    let mut token_ring = good.clone();
    token_ring[20..24].copy_from_slice(&6u32.to_le_bytes());
    usage(
        &token_ring,
        "link type 6 is not supported (supported: Ethernet (1), Linux cooked v1 (113) and v2 (276), raw IP (12, 14, 101, 228, 229), BSD loopback (0, 108), NFLOG (239)); capture on the underlay interface itself (`tcpdump -i eth0`)",
    );
    let missing = replay(&ns, &["/nonexistent/x.pcap"]);
    assert_eq!(missing.status.code(), Some(EXIT_USAGE));
    assert_eq!(
        missing.stderr.trim_end(),
        "observer: error: capture /nonexistent/x.pcap: cannot open: No such file or directory (os error 2)"
    );

    // Snap length cuts and runts are counted, not errors: frame 2 cut to 46
    // bytes (inside its VXLAN header), frame 3 to 10 (less than an Ethernet header).
    let mut snapped = good[..record_offset(4, record)].to_vec();
    let third = snapped.split_off(record_offset(3, record));
    let second = snapped.split_off(record_offset(2, record));
    for (record_bytes, keep) in [(second, 46usize), (third, 10)] {
        let mut header = record_bytes[..16].to_vec();
        header[8..12].copy_from_slice(&(keep as u32).to_le_bytes());
        snapped.extend_from_slice(&header);
        snapped.extend_from_slice(&record_bytes[16..16 + keep]);
    }
    let (run, files) = replay_bytes(&ns, &snapped, "pcap");
    let path = files.0[0].to_str().unwrap();
    assert!(run.status.success(), "{}", run.stderr);
    let line = summary(&run, path);
    assert_eq!(
        (line["frames"].as_u64(), line["truncated"].as_u64()),
        (Some(3), Some(2))
    );
    assert_eq!(run.counts(path, "rx", "vxlan", Some(B_IP), 42).0, 1);
    let unclassified = run.unclassified();
    let reason = |r: &str| {
        unclassified
            .get(&(path.to_string(), "rx".to_string(), r.to_string()))
            .map(|l| l["packets"].as_u64().unwrap())
    };
    assert_eq!(reason("truncated_encap"), Some(1), "{unclassified:#?}");
    assert_eq!(reason("truncated_l2"), Some(1), "{unclassified:#?}");
    let l2 = &unclassified[&(
        path.to_string(),
        "rx".to_string(),
        "truncated_l2".to_string(),
    )];
    assert_eq!(l2["bytes"], 10, "the runt's captured bytes: {l2}");

    // pcapng: a packet of an interface no block declares.
    let mut writer = PcapNgWriter::with_endianness(Vec::new(), Endianness::Little).unwrap();
    let inner = frames::icmp_eth_frame(frames::addr("198.19.0.2"), frames::addr("198.19.0.1"));
    let frame = frames::vxlan_frame(frames::addr(B_IP), frames::addr(A_IP), 42, &inner);
    writer
        .write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: 0,
            options: vec![],
        })
        .unwrap();
    let mut third = 0;
    for _ in 0..3 {
        third = writer.get_ref().len();
        writer
            .write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: Duration::from_secs(1),
                original_len: frame.len() as u32,
                data: frame.as_slice().into(),
                options: vec![],
            })
            .unwrap();
    }
    // The writer refuses unknown interfaces: patch the third block's
    // interface id (after the block type and length).
    let mut ng = writer.into_inner();
    ng[third + 8..third + 12].copy_from_slice(&5u32.to_le_bytes());
    let (run, files) = replay_bytes(&ns, &ng, "pcapng");
    let counted = check_failure(
        &run,
        &files,
        EXIT_DAMAGED,
        "frame 3: packet of interface 5, which no interface description block declares",
    );
    assert_eq!(counted, 2);
}

// ---------------------------------------------------------------------------
// Without privileges.

/// A checkout in a folder only root may enter (mode 0700, like root's home
/// or a `mktemp -d` folder): nobody cannot even start the binary there,
/// and the copy that every unprivileged test runs
/// (`support::unprivileged::BinaryCopy`) starts, and is removed after.
#[test]
fn unprivileged_tests_run_a_copy_nobody_can_reach() {
    use std::os::unix::{fs::PermissionsExt, process::CommandExt};
    use support::unprivileged::{BinaryCopy, NOBODY};
    if !support::have_root("unprivileged_tests_run_a_copy_nobody_can_reach") {
        return;
    }
    let private = tempfile::Builder::new()
        .prefix("observer-private-")
        .tempdir()
        .unwrap();
    fs::set_permissions(private.path(), fs::Permissions::from_mode(0o700)).unwrap();
    let inside = private.path().join("observer");
    fs::copy(env!("CARGO_BIN_EXE_observer"), &inside).unwrap();
    fs::set_permissions(&inside, fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = |binary: &std::path::Path| {
        Command::new(binary)
            .arg("--version")
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
    };
    let refused = as_nobody(&inside).expect_err("nobody ran a binary in a mode-0700 folder");
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::PermissionDenied,
        "{refused}"
    );
    let copy = BinaryCopy::of(&inside);
    let ran = as_nobody(copy.path()).expect("running the copy as nobody");
    assert!(ran.status.success(), "{ran:?}");
    assert!(
        String::from_utf8_lossy(&ran.stdout).starts_with("observer "),
        "{ran:?}"
    );
    let dir = copy.dir().to_owned();
    drop(copy);
    assert!(!dir.exists(), "the copy's directory is removed");
}

/// The native engine needs no privileges: as user nobody, a replay counts
/// every frame, says once that this node's allow-sets were not read, and
/// applies --allow-cidr; --allow-set (which needs ipset and nft) and
/// --kernel (which loads programs) are refused with exit status 2.
#[test]
fn replay_without_privileges_counts_with_the_native_engine() {
    use std::os::unix::fs::PermissionsExt;
    if !support::have_root("replay_without_privileges_counts_with_the_native_engine") {
        return;
    }
    let (bytes, record) = small_pcap();
    let path = temp_path("unpriv", "pcap");
    let files = TempFiles(vec![path.clone()]);
    fs::write(&path, &bytes).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let file = files.0[0].to_str().unwrap();
    let binary = support::unprivileged::BinaryCopy::observer();
    let as_nobody = |args: &[&str]| {
        let mut setpriv = Command::new("setpriv");
        setpriv.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
        replay_binary_with(setpriv, binary.as_str(), args)
    };
    let run = as_nobody(&["--allow-cidr", "198.18.0.0/24", file]);
    assert!(run.status.success(), "{}: {}", run.status, run.stderr);
    assert_eq!(summary(&run, file)["engine"], "native");
    assert_eq!(
        run.counts(file, "rx", "vxlan", Some(B_IP), 42),
        (FRAMES as u64, (FRAMES * (record - 16)) as u64)
    );
    let vxlan_set = run
        .lines
        .iter()
        .find(|l| l["type"] == "allow_set" && l["proto"] == "vxlan")
        .expect("an allow_set line");
    assert_eq!(vxlan_set["active"], true, "--allow-cidr applies");
    assert!(
        vxlan_set["problems"][0]
            .as_str()
            .unwrap()
            .contains("were not read: ipset and nft need CAP_NET_ADMIN"),
        "{vxlan_set}"
    );
    for refused in [
        &["--allow-set", "cali40all-vxlan-net", file][..],
        &["--kernel", file],
    ] {
        let run = as_nobody(refused);
        assert_eq!(
            run.status.code(),
            Some(EXIT_USAGE),
            "{refused:?}: {}",
            run.stderr
        );
        assert!(run.lines.is_empty(), "{refused:?}: nothing printed");
    }
}
