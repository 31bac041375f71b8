//! Evidence capture (`attach --capture-dir`) end to end: the frames the
//! observer flags and the kernel drops, written as pcapng with their
//! reasons, byte for byte what was sent; `observer replay` of the files
//! counts what the live observer printed; and under a flood every
//! flagged frame is accounted for exactly: written, lost in the ring or
//! rate-limited. Each test builds its own namespaces (unique names).

mod support;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::AtomicBool,
};

use observer::cmd::replay::capture;
use observer_testkit::{
    pair::{
        A_IP as R_IP, A_MAC_BYTES as R_MAC_BYTES, B_MAC as S_MAC, B_MAC_BYTES as S_MAC_BYTES, Pair,
    },
    storm::Storm,
};
use serde_json::Value;
use support::{
    calico::{self, VXLAN_DROP_RULE, VXLAN_SET, drop_key, drop_packets, drops, eventually, settle},
    frames::{self, ENTROPY_PORT, ETH_P_IP, VXLAN_PORT},
    netns::{Netns, ObserverProcess, ObserverRun, VxlanDevice, send_frames},
};

/// A source in the allow-set.
const X: &str = "198.18.0.10";
/// A source outside it.
const Y: &str = "198.18.0.20";
/// The node's VXLAN VNI (Calico's default).
const VNI: u32 = 4096;
/// Frames per source (odd, so that it is not mistaken for another count).
const N: u64 = 37;

/// R and S joined by vr <-> vs, R with Calico's VTEP vx0.
struct Lab {
    r: Netns,
    s: Netns,
}

impl Lab {
    fn new(tag: &str) -> Lab {
        let Pair { a: r, b: s, .. } = Pair::with_ifaces(tag, "vr", "vs");
        for source in [X, Y] {
            r.neigh(source, S_MAC, "vr");
        }
        r.add_vxlan(&VxlanDevice {
            name: "vx0",
            mac: "02:00:00:00:02:0a",
            vni: VNI,
            port: 4789,
            local: R_IP,
            remote: None,
            lower: Some("vr"),
            learning: true,
        });
        r.ip(&["link", "set", "vx0", "up"]);
        Lab { r, s }
    }
}

/// A VXLAN frame from `src` to R, its inner frame to a MAC nobody has.
fn vxlan_from(src: &str) -> Vec<u8> {
    let inner = frames::ethernet(
        [2, 0, 0, 0, 0x77, 0x77],
        [2, 0, 0, 0, 0x66, 0x66],
        &[],
        ETH_P_IP,
        &frames::icmp4_packet(frames::addr4("198.19.0.1"), frames::addr4("198.19.0.2")),
    );
    let payload = frames::cat(&[&frames::vxlan_header(VNI), &inner]);
    let mut frame = frames::udp_frame(
        frames::addr(src),
        frames::addr(R_IP),
        ENTROPY_PORT,
        VXLAN_PORT,
        &payload,
    );
    frames::set_macs(&mut frame, R_MAC_BYTES, S_MAC_BYTES);
    frame
}

/// A fresh directory for a test's evidence.
fn evidence_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(support::netns::unique(tag));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The files in `dir`, sorted: (completed pcapng files, anything else).
fn files(dir: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut all: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    all.sort();
    all.into_iter().partition(|p| {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        name.starts_with("observer-") && name.ends_with(".pcapng")
    })
}

/// Every frame of `paths`: (its bytes, its comment).
fn read_frames(paths: &[PathBuf]) -> Vec<(Vec<u8>, u32, String)> {
    let mut all = Vec::new();
    for path in paths {
        let file = std::fs::File::open(path).unwrap();
        for frame in capture::frames(file).unwrap() {
            let frame = frame.unwrap();
            all.push((
                frame.data.clone(),
                frame.link_type,
                frame.comment.clone().unwrap_or_default(),
            ));
        }
    }
    all
}

/// `observer replay --output json` of `paths`, parsed.
fn replay(paths: &[PathBuf]) -> Vec<Value> {
    let output = Command::new(ObserverProcess::binary())
        .arg("replay")
        .args(["--output", "json"])
        .args(paths)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "replay: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Frames per (peer, origin, reason) of replay's `evidence` lines.
fn evidence_lines(lines: &[Value]) -> BTreeMap<(String, String, String), u64> {
    let mut found = BTreeMap::new();
    for line in lines.iter().filter(|l| l["type"] == "evidence") {
        let key = (
            line["peer"].as_str().unwrap_or("null").to_string(),
            line["origin"].as_str().unwrap().to_string(),
            line["reason"].as_str().unwrap().to_string(),
        );
        *found.entry(key).or_default() += line["frames"].as_u64().unwrap();
    }
    found
}

/// The final stats line's `evidence` counters.
fn evidence_stats(run: &ObserverRun) -> Value {
    run.final_stats()["evidence"].clone()
}

fn n(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
}

#[test]
fn flagged_and_dropped_frames_are_written_and_replay_to_the_live_counts_tc() {
    if !support::have_root(
        "flagged_and_dropped_frames_are_written_and_replay_to_the_live_counts_tc",
    ) {
        return;
    }
    flagged_and_dropped("evt", "auto");
}

#[test]
fn flagged_and_dropped_frames_are_written_and_replay_to_the_live_counts_xdp() {
    if !support::have_root(
        "flagged_and_dropped_frames_are_written_and_replay_to_the_live_counts_xdp",
    ) {
        return;
    }
    flagged_and_dropped("evx", "native");
}

/// Y's VXLAN frames, outside Calico's allow-set, are flagged and then
/// dropped by its iptables rule: each is written twice, byte for byte,
/// from the wire (Ethernet) and from where the kernel freed it (its IP
/// packet), commented with its reasons; X's frames pass and are not
/// written. `observer replay` of the files counts per peer and reason
/// exactly what the live observer's drop lines said. `xdp_mode`: auto
/// (tc ingress on a veth with tcx) or native (XDP).
fn flagged_and_dropped(tag: &str, xdp_mode: &str) {
    let lab = Lab::new(tag);
    calico::ipset_create(&lab.r, VXLAN_SET, &[X]);
    calico::iptables_vxlan_rules(&lab.r);
    let dir = evidence_dir(tag);
    let observer = ObserverProcess::start(
        Some(lab.r.name()),
        &["vr"],
        &[
            "--capture-dir",
            dir.to_str().unwrap(),
            "--xdp-mode",
            xdp_mode,
            "--after-decap",
            "none",
        ],
    );
    let allowed = vxlan_from(X);
    let denied = vxlan_from(Y);
    send_frames(
        &lab.s,
        "vs",
        vec![(allowed.clone(), N as u32), (denied.clone(), N as u32)],
    );
    assert!(eventually(|| calico::iptables_counter(
        &lab.r,
        VXLAN_DROP_RULE
    )
    .0 >= N));
    let flagged = drop_key(
        "vr",
        "vxlan",
        Y,
        VNI.into(),
        "classifier",
        "calico_allow_set",
    );
    let dropped = drop_key("vr", "vxlan", Y, VNI.into(), "kernel", "NETFILTER_DROP");
    assert!(observer.wait_for_lines(|lines| {
        drop_packets(lines, &flagged) >= N && drop_packets(lines, &dropped) >= N
    }));
    settle(&observer);
    let run = observer.stop_ok();
    let rx = run.attach_lines()[0]["rx_hook"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(rx.starts_with("xdp"), xdp_mode == "native", "{rx}");

    // The live counts: N flagged and N dropped, nothing else.
    let live: BTreeMap<(String, String, String), u64> = drops(&run.lines)
        .into_iter()
        .map(|(k, line)| ((k.2, k.4, k.5), line["packets"].as_u64().unwrap()))
        .collect();
    let expected = BTreeMap::from([
        (
            (
                Y.to_string(),
                "classifier".into(),
                "calico_allow_set".into(),
            ),
            N,
        ),
        ((Y.to_string(), "kernel".into(), "NETFILTER_DROP".into()), N),
    ]);
    assert_eq!(live, expected);
    assert_eq!(calico::iptables_counter(&lab.r, VXLAN_DROP_RULE).0, N);

    // Every record written, none lost or rate-limited; one file, completed.
    let stats = evidence_stats(&run);
    assert_eq!(n(&stats, "sent"), 2 * N, "{stats}");
    assert_eq!(n(&stats, "written"), 2 * N, "{stats}");
    assert_eq!(n(&stats, "lost"), 0, "{stats}");
    assert_eq!(n(&stats, "rate_limited"), 0, "{stats}");
    let (pcapng, other) = files(&dir);
    assert_eq!(pcapng.len(), 1, "{pcapng:?} {other:?}");
    assert!(other.is_empty(), "left behind: {other:?}");

    // Byte for byte the frame as sent, twice: flagged on the wire, and
    // from its Ethernet header where the kernel freed it; one link type
    // (Ethernet), as libpcap needs.
    let written = read_frames(&pcapng);
    assert_eq!(written.len() as u64, 2 * N);
    assert!(written.iter().all(|f| f.1 == 1 && f.0 == denied));
    let with = |origin: &str| {
        written
            .iter()
            .filter(|f| f.2.contains(&format!("origin={origin} ")))
            .map(|f| f.2.as_str())
            .collect::<Vec<_>>()
    };
    let (flagged_frames, dropped_frames) = (with("classifier"), with("kernel"));
    assert_eq!(
        (flagged_frames.len() as u64, dropped_frames.len() as u64),
        (N, N)
    );
    for comment in flagged_frames {
        assert!(
            comment.contains("reason=calico_allow_set")
                && comment.contains(&format!("peer={Y}"))
                && comment.contains("stage=underlay")
                && comment.contains("interface=vr"),
            "{comment}"
        );
    }
    for comment in dropped_frames {
        assert!(
            comment.contains("reason=NETFILTER_DROP")
                && comment.contains(&format!("peer={Y}"))
                && comment.contains("location="),
            "{comment}"
        );
    }
    // tcpdump, the outside reference, reads every frame of the file.
    let tcpdump = Command::new("tcpdump")
        .args(["-nn", "-r"])
        .arg(&pcapng[0])
        .output()
        .unwrap();
    assert!(tcpdump.status.success(), "{tcpdump:?}");
    let decoded = String::from_utf8_lossy(&tcpdump.stdout)
        .lines()
        .filter(|l| l.contains(&format!("IP {Y}.")) && l.contains("VXLAN"))
        .count() as u64;
    assert_eq!(decoded, 2 * N);

    // Replay: the evidence lines are the live drop lines; the rows count
    // every frame of the file (each of Y's packets twice), none of X's.
    let replayed = replay(&pcapng);
    assert_eq!(evidence_lines(&replayed), expected);
    let rows: BTreeMap<String, u64> = replayed
        .iter()
        .filter(|l| l["type"] == "peer" && l["proto"] == "vxlan")
        .map(|l| {
            (
                l["peer"].as_str().unwrap().to_string(),
                l["packets"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows, BTreeMap::from([(Y.to_string(), 2 * N)]));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The observer on R's vr, only X allowed (`--allow-cidr`), capturing
/// into `dir` with the `capture` options.
fn observe_capturing(lab: &Lab, dir: &Path, capture: &[&str]) -> ObserverProcess {
    let allowed = format!("{X}/32");
    let mut args = vec![
        "--allow-cidr",
        &allowed,
        "--capture-dir",
        dir.to_str().unwrap(),
    ];
    args.extend(capture);
    args.extend(["--after-decap", "none"]);
    ObserverProcess::start(Some(lab.r.name()), &["vr"], &args)
}

/// Stops `observer` once it flagged `frames` of Y's, and nothing else;
/// returns the final `stats` line's evidence counters and (sent, lost,
/// rate-limited), which add up to `frames`.
fn stop_after_flagged(observer: ObserverProcess, frames: u64) -> (Value, (u64, u64, u64)) {
    let flagged = drop_key(
        "vr",
        "vxlan",
        Y,
        VNI.into(),
        "classifier",
        "calico_allow_set",
    );
    assert!(observer.wait_for_lines(|lines| drop_packets(lines, &flagged) >= frames));
    settle(&observer);
    let run = observer.stop_ok();
    assert_eq!(drop_packets(&run.lines, &flagged), frames);
    // Nothing else is flagged or dropped (the kernel passes these frames
    // to vx0, whose drops are not watched here).
    assert_eq!(drops(&run.lines).len(), 1, "{:?}", drops(&run.lines));
    let stats = evidence_stats(&run);
    eprintln!("evidence: {stats}");
    let outcomes = (
        n(&stats, "sent"),
        n(&stats, "lost"),
        n(&stats, "rate_limited"),
    );
    assert_eq!(outcomes.0 + outcomes.1 + outcomes.2, frames, "{stats}");
    assert_eq!(n(&stats, "written"), outcomes.0, "{stats}");
    (stats, outcomes)
}

/// A flood of flagged frames into a one-page ring: most records cannot be
/// written, and every frame is accounted for exactly: what the drop line
/// counted = sent + lost in the ring + rate-limited, sent = written, and
/// the files hold exactly the written frames.
#[test]
fn a_flood_is_accounted_for_exactly() {
    if !support::have_root("a_flood_is_accounted_for_exactly") {
        return;
    }
    const FLOOD: u64 = 20_000;
    let lab = Lab::new("evf");
    let dir = evidence_dir("evf");
    let observer = observe_capturing(
        &lab,
        &dir,
        &["--capture-rate", "1000000", "--capture-ring-pages", "1"],
    );
    let (sent, _) = lab.s.run(|| {
        let stop = AtomicBool::new(false);
        let mut storm = Storm::open("vs", vxlan_from(Y)).unwrap();
        storm
            .send(u32::from(frames::addr4(Y)), 0, FLOOD, 1, &stop)
            .unwrap()
    });
    assert_eq!(sent, FLOOD);
    let (stats, (sent, lost, _)) = stop_after_flagged(observer, FLOOD);
    assert!(lost > 0, "a one-page ring held a flood of {FLOOD}: {stats}");
    let (pcapng, other) = files(&dir);
    assert!(other.is_empty(), "left behind: {other:?}");
    assert_eq!(read_frames(&pcapng).len() as u64, sent);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--capture-rate`: each CPU sends at most that many records a second,
/// and counts the rest as rate-limited.
#[test]
fn the_rate_limit_counts_what_it_holds_back() {
    if !support::have_root("the_rate_limit_counts_what_it_holds_back") {
        return;
    }
    const RATE: u64 = 5;
    let lab = Lab::new("evr");
    let dir = evidence_dir("evr");
    let observer = observe_capturing(&lab, &dir, &["--capture-rate", &RATE.to_string()]);
    send_frames(&lab.s, "vs", vec![(vxlan_from(Y), N as u32)]);
    let (stats, (sent, lost, _)) = stop_after_flagged(observer, N);
    assert_eq!(lost, 0, "{stats}");
    // One burst: within one second on each CPU that received part of it
    // (the sender's, mostly; at most every CPU's budget, or two seconds'
    // if the burst straddled one).
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    assert!(
        (RATE..=2 * RATE * cpus).contains(&sent),
        "{sent} sent of {N} at {RATE}/s per CPU on {cpus} CPUs: {stats}"
    );
    let (pcapng, _) = files(&dir);
    assert_eq!(read_frames(&pcapng).len() as u64, sent);
    std::fs::remove_dir_all(&dir).unwrap();
}
