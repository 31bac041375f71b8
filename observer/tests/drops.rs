//! End-to-end tests of "why packets die": the observer binary attached in a
//! receiver namespace R that has Calico's allow-sets and drop rules (real
//! ipset, iptables and nftables), with tunnel frames crafted by a sender
//! namespace S. Each test checks the observer's classifier flags
//! (`calico_allow_set`, `vni_unknown`), the kernel drop reasons it reads
//! from skb:kfree_skb (`NETFILTER_DROP`, `NO_SOCKET`, ...) and its
//! cross-check against the rule counters, against the kernel's own
//! counters, exactly.
//!
//! Topology (each test has its own pair of namespaces):
//!
//! ```text
//!   ns R: vr 198.18.0.1/24 02:00:00:00:00:0a  <-veth->  ns S: vs 198.18.0.2/24 02:00:00:00:00:0b
//!         vx0: vxlan VNI 4096, UDP 4789 (the node's VTEP)
//! ```
//!
//! S sends raw frames with any source in 198.18.0.0/24 (X, Y, ...) to R's
//! address and MAC; R has static neighbour entries for those sources, so
//! that its ICMP errors never need ARP. The observer watches `vr`.

mod support;

use std::{collections::BTreeMap, net::IpAddr};

// R is the pair's A side, S its B side.
use observer_testkit::pair::{
    A_IP as R_IP, A_MAC_BYTES as R_MAC_BYTES, B_MAC as S_MAC, B_MAC_BYTES as S_MAC_BYTES, Pair,
};
use serde_json::Value;
use support::{
    calico::{
        self, DropKey, HOSTS_SET, IPIP_DROP_RULE, ToolLog, VXLAN_ALLOW_RULE, VXLAN_DROP_RULE,
        VXLAN_SET, allow_set, drop_key, drop_packets, drops, eventually, final_snapshot,
        netfilter_lines, peer_drops, rx_packets, rx_peer, settle,
    },
    frames::{self, ENTROPY_PORT, ETH_HLEN, ETH_P_IP, VXLAN_LINUX_PORT, VXLAN_PORT},
    netns::{Netns, ObserverProcess, ObserverRun, VethEnd, VxlanDevice, send_frames, veth_pair},
};

/// Second link (test of an unwatched interface).
const R2_IP: &str = "198.18.1.1";
const S2_IP: &str = "198.18.1.2";
const R2_MAC: &str = "02:00:00:00:01:0a";
const S2_MAC: &str = "02:00:00:00:01:0b";
const R2_MAC_BYTES: [u8; 6] = [2, 0, 0, 0, 1, 0x0a];
const S2_MAC_BYTES: [u8; 6] = [2, 0, 0, 0, 1, 0x0b];

/// A source in the allow-set.
const X: &str = "198.18.0.10";
/// A source outside it.
const Y: &str = "198.18.0.20";
/// Sources of the kernel-reason tests.
const Z1: &str = "198.18.0.31";
const Z2: &str = "198.18.0.32";
const Z3: &str = "198.18.0.33";
const Z4: &str = "198.18.0.34";
/// A source on the second link.
const W2: &str = "198.18.1.41";

/// The node's VXLAN VNI (Calico's default).
const VNI: u32 = 4096;
/// Frames per source and batch (odd, so that it is not mistaken for another count).
const N: u64 = 37;

/// R and S joined by vr <-> vs: the shared two-namespace pair, R as its
/// A side and S as its B side.
struct Lab {
    r: Netns,
    s: Netns,
}

impl Lab {
    fn new(tag: &str) -> Lab {
        let Pair { a: r, b: s, .. } = Pair::with_ifaces(tag, "vr", "vs");
        for source in [X, Y, Z1, Z2, Z3, Z4] {
            r.neigh(source, S_MAC, "vr");
        }
        Lab { r, s }
    }

    /// A second link vr2 (198.18.1.1) <-> vs2, which the observer will not watch.
    fn second_link(&self) {
        veth_pair(
            &self.r,
            &VethEnd::new("vr2", R2_MAC, R2_IP),
            &self.s,
            &VethEnd::new("vs2", S2_MAC, S2_IP),
            24,
        );
        self.r.neigh(W2, S2_MAC, "vr2");
    }

    /// The node's VTEP: vx0, VNI 4096 on UDP 4789 over vr, as Calico makes it.
    fn vtep(&self) {
        self.r.add_vxlan(&VxlanDevice {
            name: "vx0",
            mac: "02:00:00:00:02:0a",
            vni: VNI,
            port: 4789,
            local: R_IP,
            remote: None,
            lower: Some("vr"),
            learning: true,
        });
        self.r.ip(&["link", "set", "vx0", "up"]);
    }

    /// Sends `copies` of each frame from S on vs (received on vr).
    fn send(&self, frames: &[(&Vec<u8>, u64)]) {
        send_frames(
            &self.s,
            "vs",
            frames
                .iter()
                .map(|(f, n)| ((*f).clone(), u32::try_from(*n).unwrap()))
                .collect(),
        );
    }
}

/// The observer on R's vr with `args`. Drops after decapsulation are not
/// counted: these tests count the underlay, whose inner frames (to no
/// MAC of vx0's) vx0 drops as OTHERHOST; tests/after_decap.rs counts the
/// tunnel devices.
fn observe(lab: &Lab, args: &[&str]) -> ObserverProcess {
    let mut all = args.to_vec();
    all.extend(["--after-decap", "none"]);
    ObserverProcess::start(Some(lab.r.name()), &["vr"], &all)
}

fn ip(text: &str) -> IpAddr {
    frames::addr(text)
}

/// An inner Ethernet frame nobody in R answers: unicast to a MAC that is
/// not vx0's, an ICMP echo between overlay addresses R does not have.
fn inner_frame() -> Vec<u8> {
    frames::ethernet(
        [2, 0, 0, 0, 0x77, 0x77],
        [2, 0, 0, 0, 0x66, 0x66],
        &[],
        ETH_P_IP,
        &frames::icmp4_packet(frames::addr4("198.19.0.1"), frames::addr4("198.19.0.2")),
    )
}

/// A VXLAN frame `src` -> `dst` on UDP `port` with the given (dst, src) MACs.
fn vxlan_to(src: &str, dst: &str, macs: ([u8; 6], [u8; 6]), vni: u32, port: u16) -> Vec<u8> {
    let payload = frames::cat(&[&frames::vxlan_header(vni), &inner_frame()]);
    let mut frame = frames::udp_frame(ip(src), ip(dst), ENTROPY_PORT, port, &payload);
    frames::set_macs(&mut frame, macs.0, macs.1);
    frame
}

/// VXLAN from `src` to R's vr address, VNI `vni`, UDP `port`.
fn vxlan_from(src: &str, vni: u32, port: u16) -> Vec<u8> {
    vxlan_to(src, R_IP, (R_MAC_BYTES, S_MAC_BYTES), vni, port)
}

/// IPIP from `src` to `dst` with the given (dst, src) MACs.
fn ipip_to(src: &str, dst: &str, macs: ([u8; 6], [u8; 6])) -> Vec<u8> {
    let inner = frames::icmp4_packet(frames::addr4("198.19.0.1"), frames::addr4("198.19.0.2"));
    let mut frame = frames::ipip_frame(ip(src), ip(dst), &inner);
    frames::set_macs(&mut frame, macs.0, macs.1);
    frame
}

/// IPIP from `src` to R's vr address.
fn ipip_from(src: &str) -> Vec<u8> {
    ipip_to(src, R_IP, (R_MAC_BYTES, S_MAC_BYTES))
}

/// Plain UDP from `src` to `dst:port` (a port nobody listens on).
fn udp_to(src: &str, dst: &str, macs: ([u8; 6], [u8; 6]), port: u16) -> Vec<u8> {
    let mut frame = frames::udp_frame(ip(src), ip(dst), ENTROPY_PORT, port, &[0x5a; 24]);
    frames::set_macs(&mut frame, macs.0, macs.1);
    frame
}

fn key(proto: &str, peer: &str, vni: u32, origin: &str, reason: &str) -> DropKey {
    drop_key("vr", proto, peer, u64::from(vni), origin, reason)
}

/// Waits until `done` holds on the observer's lines, or fails showing them.
fn wait(observer: &ObserverProcess, what: &str, done: impl Fn(&[Value]) -> bool) {
    if !observer.wait_for_lines(&done) {
        panic!("{what}: not seen; lines:\n{}", dump(&observer.lines()));
    }
}

fn dump(lines: &[Value]) -> String {
    lines
        .iter()
        .filter(|l| l["type"] != "stats")
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Drop rows of the final snapshot as key -> (packets, bytes). The final
/// snapshot must repeat every row ever printed.
fn final_drops(run: &ObserverRun) -> BTreeMap<DropKey, (u64, u64)> {
    let all = drops(&run.lines);
    let last = drops(final_snapshot(run));
    assert_eq!(
        all.keys().collect::<Vec<_>>(),
        last.keys().collect::<Vec<_>>(),
        "the final snapshot must print every drop row"
    );
    last.iter()
        .map(|(k, l)| {
            (
                k.clone(),
                (l["packets"].as_u64().unwrap(), l["bytes"].as_u64().unwrap()),
            )
        })
        .collect()
}

/// The message of a drop row in the final snapshot.
fn message(run: &ObserverRun, key: &DropKey) -> String {
    drops(final_snapshot(run))[key]["message"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The final `drops` object of an rx peer row.
fn final_peer_drops(run: &ObserverRun, proto: &str, peer: &str, vni: u32) -> BTreeMap<String, u64> {
    let row = rx_peer(final_snapshot(run), "vr", proto, peer, u64::from(vni))
        .unwrap_or_else(|| panic!("no final rx {proto} row for {peer}:\n{}", dump(&run.lines)));
    peer_drops(row)
}

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// The final netfilter line of (backend, rule).
fn final_netfilter<'a>(run: &'a ObserverRun, backend: &str, rule: &str) -> &'a Value {
    let lines = netfilter_lines(final_snapshot(run), rule);
    let mine: Vec<&&Value> = lines.iter().filter(|l| l["backend"] == backend).collect();
    assert_eq!(
        mine.len(),
        1,
        "one final netfilter line for {backend} {rule:?}: {lines:#?}"
    );
    mine[0]
}

// ---------------------------------------------------------------------------
// Calico's VXLAN allow-set, iptables and nftables data planes.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Plane {
    Iptables,
    Nftables,
}

impl Plane {
    /// Creates the allow-set holding `members` and the rule pair.
    fn setup(self, r: &Netns, members: &[&str]) {
        match self {
            Plane::Iptables => {
                calico::ipset_create(r, VXLAN_SET, members);
                calico::iptables_vxlan_rules(r);
            }
            Plane::Nftables => calico::nft_vxlan_table(r, members),
        }
    }

    /// (packets, bytes) of the rule commented `comment`.
    fn counter(self, r: &Netns, comment: &str) -> (u64, u64) {
        match self {
            Plane::Iptables => calico::iptables_counter(r, comment),
            Plane::Nftables => calico::nft_counter(r, comment),
        }
    }

    /// Adds `member` to the VXLAN allow-set.
    fn add(self, r: &Netns, member: &str) {
        match self {
            Plane::Iptables => calico::ipset_add(r, VXLAN_SET, member),
            Plane::Nftables => calico::nft_add_element(r, VXLAN_SET, member),
        }
    }

    /// `backend` of the observer's netfilter line.
    fn backend(self) -> &'static str {
        match self {
            Plane::Iptables => "iptables",
            Plane::Nftables => "nftables",
        }
    }

    /// `sources` of the observer's allow_set line.
    fn source(self) -> &'static str {
        match self {
            Plane::Iptables => "ipset cali40all-vxlan-net",
            Plane::Nftables => "nft ip calico cali40all-vxlan-net",
        }
    }
}

/// N VXLAN frames from allowed X and N from disallowed Y: Y is flagged
/// `calico_allow_set` N times and the kernel drops it N times with
/// NETFILTER_DROP; X passes without a single drop; the drop rule counted N
/// and the observer's netfilter line agrees.
fn vxlan_allow_set_drops(tag: &str, plane: Plane) {
    let lab = Lab::new(tag);
    lab.vtep();
    plane.setup(&lab.r, &[X]);
    // Every netfilter tool the observer runs is logged, and the counters
    // are read often: each read must list only the chain holding the rule.
    let tools = ToolLog::new(tag);
    let observer = ObserverProcess::spawn_with_env(
        Some(lab.r.name()),
        &[
            "--allow-set-refresh",
            "100ms",
            "--after-decap",
            "none",
            "vr",
        ],
        &[("PATH", &tools.path())],
    );
    observer.wait_ready(1);

    let vxlan = allow_set(&observer.lines(), "vxlan").cloned();
    let vxlan = vxlan.unwrap_or_else(|| panic!("no allow_set line:\n{}", dump(&observer.lines())));
    assert_eq!(vxlan["active"], true, "{vxlan}");
    assert_eq!(
        vxlan["sources"],
        serde_json::json!([plane.source()]),
        "{vxlan}"
    );
    assert_eq!(vxlan["prefixes"], 1, "{vxlan}");

    let allowed = vxlan_from(X, VNI, VXLAN_PORT);
    let denied = vxlan_from(Y, VNI, VXLAN_PORT);
    lab.send(&[(&allowed, N), (&denied, N)]);

    // The rule counters move as the stack handles the frames: once both
    // reached N, every frame has been accepted or dropped.
    assert!(
        eventually(|| plane.counter(&lab.r, VXLAN_ALLOW_RULE).0 >= N
            && plane.counter(&lab.r, VXLAN_DROP_RULE).0 >= N),
        "rule counters: accept {:?}, drop {:?}",
        plane.counter(&lab.r, VXLAN_ALLOW_RULE),
        plane.counter(&lab.r, VXLAN_DROP_RULE)
    );
    let flagged = key("vxlan", Y, VNI, "classifier", "calico_allow_set");
    let dropped = key("vxlan", Y, VNI, "kernel", "NETFILTER_DROP");
    wait(&observer, "Y's drops and X's packets", |lines| {
        drop_packets(lines, &flagged) >= N
            && drop_packets(lines, &dropped) >= N
            && rx_packets(lines, "vr", "vxlan", X, VNI.into()) >= N
    });
    settle(&observer);
    let run = observer.stop_ok();

    let len = denied.len() as u64;
    assert_eq!(allowed.len(), denied.len());
    let found = final_drops(&run);
    eprintln!("{tag}: drops {found:?}");
    assert_eq!(
        found,
        BTreeMap::from([
            (flagged.clone(), (N, N * len)),
            (dropped.clone(), (N, N * len))
        ]),
        "exactly Y's flags and kernel drops, nothing for X"
    );
    assert_eq!(
        message(&run, &flagged),
        format!("{N} VXLAN packets from {Y} dropped: source not in {VXLAN_SET}")
    );
    // Drop lines are printed when they change (and all at the end), the
    // allow_set line at start only (its content never changed).
    let before_final = &run.lines[..run.lines.len() - final_snapshot(&run).len()];
    for k in [&flagged, &dropped] {
        let repeats = before_final
            .iter()
            .filter(|l| l["type"] == "drop" && drops(&[(*l).clone()]).contains_key(k))
            .filter(|l| l["packets"] == N)
            .count();
        assert_eq!(repeats, 1, "{k:?} printed once at its total before the end");
    }
    let allow_lines = run
        .lines
        .iter()
        .filter(|l| l["type"] == "allow_set" && l["proto"] == "vxlan")
        .count();
    assert_eq!(allow_lines, 1, "allow_set printed once");
    assert!(
        message(&run, &dropped).contains("NETFILTER_DROP"),
        "{}",
        message(&run, &dropped)
    );

    // Peer rows: the same counts by reason on Y's row, none on X's.
    assert_eq!(
        run.counts("vr", "rx", "vxlan", Some(Y), VNI.into()),
        (N, N * len)
    );
    assert_eq!(
        run.counts("vr", "rx", "vxlan", Some(X), VNI.into()),
        (N, N * len)
    );
    assert_eq!(
        final_peer_drops(&run, "vxlan", Y, VNI),
        counts(&[("calico_allow_set", N), ("NETFILTER_DROP", N)])
    );
    assert_eq!(final_peer_drops(&run, "vxlan", X, VNI), BTreeMap::new());

    // The kernel's rule counters: N each, bytes of the IP packets.
    let ip_len = len - ETH_HLEN as u64;
    let accept = plane.counter(&lab.r, VXLAN_ALLOW_RULE);
    let drop = plane.counter(&lab.r, VXLAN_DROP_RULE);
    eprintln!("{tag}: accept rule {accept:?}, drop rule {drop:?}");
    assert_eq!(accept, (N, N * ip_len), "accept rule counter");
    assert_eq!(drop, (N, N * ip_len), "drop rule counter");

    // The observer's cross-check, from the same rule counter.
    let check = final_netfilter(&run, plane.backend(), VXLAN_DROP_RULE);
    eprintln!("{tag}: {check}");
    assert_eq!(check["proto"], "vxlan", "{check}");
    assert_eq!(check["packets"], N, "{check}");
    assert_eq!(check["observer_packets"], N, "{check}");
    assert_eq!(check["agree"], true, "{check}");
    // Each rule is read from one backend only (iptables-nft rules are
    // nftables rules too: they must not be counted twice).
    let all = netfilter_lines(final_snapshot(&run), VXLAN_DROP_RULE);
    assert_eq!(all.len(), 1, "{all:#?}");
    // A netfilter line whenever the counters were read: every refresh
    // period and at the end, never more than once an interval.
    let printed = netfilter_lines(&run.lines, VXLAN_DROP_RULE).len();
    assert!(
        (1..=calico::intervals(&run.lines)).contains(&printed),
        "{printed} netfilter lines in {} intervals",
        calico::intervals(&run.lines)
    );

    // What was run to read the counters: every rule listed once (the first
    // read, which finds the rule's chain; the run is far shorter than the
    // 5 minutes after which it is searched again), then only that chain,
    // once per read: the cost of a read does not grow with the node's rules.
    let commands = tools.commands();
    let ran = |prefix: &str| commands.iter().filter(|c| c.starts_with(prefix)).count();
    for search in [
        "iptables-save -c -t filter",
        "ip6tables-save -c -t filter",
        "nft -j list chains",
    ] {
        assert_eq!(ran(search), 1, "{search}: {commands:#?}");
    }
    assert_eq!(ran("nft -j -t list ruleset"), 0, "{commands:#?}");
    let (chain, other) = match plane {
        // iptables-nft's chains are nftables chains too: the search lists
        // its INPUT chains once (nft shows no comment on their rules).
        Plane::Iptables => ("iptables -t filter -v -S cali-INPUT", "nft -j list chain "),
        Plane::Nftables => (
            "nft -j list chain ip calico filter-INPUT",
            "iptables -t filter -v -S",
        ),
    };
    // At least the final read and one periodic one (how many periodic
    // ones fit in the run depends on the machine; for nftables the search
    // lists the chain too).
    let chain_reads = ran(chain);
    assert!(
        chain_reads >= 2,
        "{chain_reads} listings of the chain: {commands:#?}"
    );
    let mut searched: Vec<&String> = commands.iter().filter(|c| c.starts_with(other)).collect();
    let listings = searched.len();
    searched.sort();
    searched.dedup();
    assert_eq!(
        searched.len(),
        listings,
        "{other}: only by the one search: {commands:#?}"
    );
    assert_eq!(ran("ip6tables -t filter -v -S"), 0, "{commands:#?}");
}

#[test]
fn iptables_vxlan_allow_set_drops_are_counted_and_agree() {
    if !support::have_root("iptables_vxlan_allow_set_drops_are_counted_and_agree") {
        return;
    }
    vxlan_allow_set_drops("ipt", Plane::Iptables);
}

#[test]
fn nftables_vxlan_allow_set_drops_are_counted_and_agree() {
    if !support::have_root("nftables_vxlan_allow_set_drops_are_counted_and_agree") {
        return;
    }
    vxlan_allow_set_drops("nft", Plane::Nftables);
}

// ---------------------------------------------------------------------------
// IPIP and cali40all-hosts-net.

#[test]
fn ipip_from_non_calico_hosts_is_flagged_and_dropped() {
    if !support::have_root("ipip_from_non_calico_hosts_is_flagged_and_dropped") {
        return;
    }
    let lab = Lab::new("ipip");
    calico::ipset_create(&lab.r, HOSTS_SET, &[X]);
    calico::iptables_ipip_rule(&lab.r);
    let observer = observe(&lab, &[]);
    let ipip = allow_set(&observer.lines(), "ipip").cloned().unwrap();
    assert_eq!(ipip["active"], true, "{ipip}");
    assert_eq!(
        ipip["sources"],
        serde_json::json!(["ipset cali40all-hosts-net"])
    );
    assert_eq!(ipip["prefixes"], 1, "{ipip}");

    let allowed = ipip_from(X);
    let denied = ipip_from(Y);
    lab.send(&[(&allowed, N), (&denied, N)]);
    assert!(
        eventually(|| calico::iptables_counter(&lab.r, IPIP_DROP_RULE).0 >= N),
        "{:?}",
        calico::iptables_counter(&lab.r, IPIP_DROP_RULE)
    );
    let flagged = key("ipip", Y, 0, "classifier", "calico_allow_set");
    let dropped = key("ipip", Y, 0, "kernel", "NETFILTER_DROP");
    // X's packets pass the rules and die for want of an IPIP handler (this
    // kernel has no ipip module): wait for as many kernel drops as frames.
    wait(&observer, "Y's drops and X's kernel drops", |lines| {
        let x_kernel: u64 = drops(lines)
            .iter()
            .filter(|(k, _)| k.2 == X && k.4 == "kernel")
            .map(|(_, l)| l["packets"].as_u64().unwrap())
            .sum();
        drop_packets(lines, &flagged) >= N && drop_packets(lines, &dropped) >= N && x_kernel >= N
    });
    settle(&observer);
    let run = observer.stop_ok();

    let len = denied.len() as u64;
    let found = final_drops(&run);
    eprintln!("ipip: drops {found:?}");
    let y_rows: BTreeMap<&DropKey, &(u64, u64)> = found.iter().filter(|(k, _)| k.2 == Y).collect();
    assert_eq!(
        y_rows,
        BTreeMap::from([(&flagged, &(N, N * len)), (&dropped, &(N, N * len))])
    );
    assert_eq!(
        message(&run, &flagged),
        format!("{N} IPIP packets from {Y} dropped: source not in {HOSTS_SET}")
    );

    // X: no flag, no netfilter drop; the kernel's reason for the rest is
    // named as the running kernel's BTF names it.
    let x_rows: Vec<(&DropKey, &(u64, u64))> = found.iter().filter(|(k, _)| k.2 == X).collect();
    assert_eq!(x_rows.len(), 1, "one kernel reason for X: {x_rows:?}");
    let (x_key, x_counts) = x_rows[0];
    assert_eq!(x_key.4, "kernel", "{x_key:?}");
    let reason = &x_key.5;
    let btf = calico::kernel_drop_reasons();
    assert!(
        btf.contains_key(reason.as_str()),
        "kernel reason {reason:?} is not a name of this kernel's enum skb_drop_reason"
    );
    assert_ne!(reason, "NETFILTER_DROP");
    eprintln!("ipip: allowed X dies in the kernel as {reason} ({x_counts:?})");
    assert_eq!(*x_counts, (N, N * len));
    assert_eq!(
        final_peer_drops(&run, "ipip", X, 0),
        counts(&[(reason.as_str(), N)])
    );
    assert_eq!(
        final_peer_drops(&run, "ipip", Y, 0),
        counts(&[("calico_allow_set", N), ("NETFILTER_DROP", N)])
    );

    let rule = calico::iptables_counter(&lab.r, IPIP_DROP_RULE);
    assert_eq!(
        rule,
        (N, N * (len - ETH_HLEN as u64)),
        "IPIP drop rule counter"
    );
    let check = final_netfilter(&run, "iptables", IPIP_DROP_RULE);
    assert_eq!(check["proto"], "ipip", "{check}");
    assert_eq!(check["packets"], N, "{check}");
    assert_eq!(check["observer_packets"], N, "{check}");
    assert_eq!(check["agree"], true, "{check}");
}

// ---------------------------------------------------------------------------
// Membership changes while attached.

/// Waits for the latest vxlan allow_set line to show `prefixes`.
fn wait_prefixes(observer: &ObserverProcess, prefixes: u64) {
    wait(
        observer,
        &format!("allow_set vxlan with {prefixes} prefixes"),
        |lines| allow_set(lines, "vxlan").is_some_and(|l| l["prefixes"] == prefixes),
    );
}

/// Y outside the set: flagged and dropped. Y added: its next frames are
/// neither. (iptables plane) X removed: X's next frames are flagged.
fn membership_change(tag: &str, plane: Plane) {
    let lab = Lab::new(tag);
    lab.vtep();
    plane.setup(&lab.r, &[X]);
    let observer = observe(&lab, &["--allow-set-refresh", "1s"]);
    wait_prefixes(&observer, 1);
    let from_x = vxlan_from(X, VNI, VXLAN_PORT);
    let from_y = vxlan_from(Y, VNI, VXLAN_PORT);
    let flagged_y = key("vxlan", Y, VNI, "classifier", "calico_allow_set");
    let dropped_y = key("vxlan", Y, VNI, "kernel", "NETFILTER_DROP");

    // 1. Y is not in the set.
    lab.send(&[(&from_y, N)]);
    wait(&observer, "Y flagged and dropped", |lines| {
        drop_packets(lines, &flagged_y) == N && drop_packets(lines, &dropped_y) == N
    });

    // 2. Y joins the set: the observer re-reads it, and the node accepts Y.
    plane.add(&lab.r, Y);
    wait_prefixes(&observer, 2);
    let sources = allow_set(&observer.lines(), "vxlan").unwrap()["sources"].clone();
    assert_eq!(sources, serde_json::json!([plane.source()]));
    lab.send(&[(&from_y, N)]);
    assert!(
        eventually(|| plane.counter(&lab.r, VXLAN_ALLOW_RULE).0 >= N),
        "accept rule: {:?}",
        plane.counter(&lab.r, VXLAN_ALLOW_RULE)
    );
    wait(&observer, "Y's second batch", |lines| {
        rx_packets(lines, "vr", "vxlan", Y, VNI.into()) == 2 * N
    });
    settle(&observer);
    let lines = observer.lines();
    assert_eq!(
        drop_packets(&lines, &flagged_y),
        N,
        "Y flagged after joining"
    );
    assert_eq!(
        drop_packets(&lines, &dropped_y),
        N,
        "Y dropped after joining"
    );
    assert_eq!(plane.counter(&lab.r, VXLAN_DROP_RULE).0, N);
    assert_eq!(plane.counter(&lab.r, VXLAN_ALLOW_RULE).0, N);

    // 3. (ipset) X leaves the set: its frames are flagged and dropped.
    let flagged_x = key("vxlan", X, VNI, "classifier", "calico_allow_set");
    let dropped_x = key("vxlan", X, VNI, "kernel", "NETFILTER_DROP");
    let mut rule_total = N;
    if plane == Plane::Iptables {
        calico::ipset_del(&lab.r, VXLAN_SET, X);
        wait_prefixes(&observer, 1);
        lab.send(&[(&from_x, N)]);
        wait(&observer, "X flagged and dropped after leaving", |lines| {
            drop_packets(lines, &flagged_x) >= N && drop_packets(lines, &dropped_x) >= N
        });
        rule_total += N;
    }
    settle(&observer);
    let run = observer.stop_ok();

    let len = from_y.len() as u64;
    let mut expected = BTreeMap::from([
        (flagged_y.clone(), (N, N * len)),
        (dropped_y.clone(), (N, N * len)),
    ]);
    if plane == Plane::Iptables {
        expected.insert(flagged_x, (N, N * len));
        expected.insert(dropped_x, (N, N * len));
    }
    let found = final_drops(&run);
    eprintln!("{tag}: drops {found:?}");
    assert_eq!(found, expected);
    assert_eq!(
        run.counts("vr", "rx", "vxlan", Some(Y), VNI.into()).0,
        2 * N
    );
    assert_eq!(plane.counter(&lab.r, VXLAN_DROP_RULE).0, rule_total);
    let check = final_netfilter(&run, plane.backend(), VXLAN_DROP_RULE);
    eprintln!("{tag}: {check}");
    assert_eq!(check["packets"], rule_total, "{check}");
    assert_eq!(check["observer_packets"], rule_total, "{check}");
    assert_eq!(check["agree"], true, "{check}");
    // One allow_set line per content: at start, then one per change.
    let prefixes: Vec<u64> = run
        .lines
        .iter()
        .filter(|l| l["type"] == "allow_set" && l["proto"] == "vxlan")
        .map(|l| l["prefixes"].as_u64().unwrap())
        .collect();
    let expected: &[u64] = match plane {
        Plane::Iptables => &[1, 2, 1],
        Plane::Nftables => &[1, 2],
    };
    assert_eq!(
        prefixes, expected,
        "allow_set vxlan prefix counts over the run"
    );
}

#[test]
fn ipset_membership_changes_are_followed() {
    if !support::have_root("ipset_membership_changes_are_followed") {
        return;
    }
    membership_change("ism", Plane::Iptables);
}

#[test]
fn nft_set_element_add_is_followed() {
    if !support::have_root("nft_set_element_add_is_followed") {
        return;
    }
    membership_change("nsm", Plane::Nftables);
}

// ---------------------------------------------------------------------------
// Kernel reasons beyond netfilter.

/// VXLAN with a VNI no local device has: flagged vni_unknown, dropped by
/// the kernel as VXLAN_VNI_NOT_FOUND. UDP to 8472 (VXLAN to the observer)
/// where no device listens: NO_SOCKET. Names as the kernel's BTF has them.
/// Also the other classifier checks the node can show on a veth: a VXLAN
/// header without the I flag, and an outer packet above vr's MTU.
#[test]
fn unknown_vni_and_closed_vxlan_port_name_kernel_reasons() {
    if !support::have_root("unknown_vni_and_closed_vxlan_port_name_kernel_reasons") {
        return;
    }
    let lab = Lab::new("vni");
    lab.vtep();
    // vs may send 4 bytes above vr's MTU (veth forwards up to MTU + 14 +
    // 4), and AF_PACKET only sends frames that fit vs's own MTU.
    lab.s.ip(&["link", "set", "vs", "mtu", "1504"]);
    let observer = observe(&lab, &[]);
    let unknown_vni = vxlan_from(Z1, 777, VXLAN_PORT);
    let closed_port = vxlan_from(Z2, VNI, VXLAN_LINUX_PORT);
    // A VXLAN header with the I flag cleared (the UDP checksum covers it:
    // built by hand rather than patched).
    let no_i_flag = {
        let mut header = frames::vxlan_header(VNI);
        header[0] = 0;
        let payload = frames::cat(&[&header, &inner_frame()]);
        let mut frame = frames::udp_frame(ip(Z3), ip(R_IP), ENTROPY_PORT, VXLAN_PORT, &payload);
        frames::set_macs(&mut frame, R_MAC_BYTES, S_MAC_BYTES);
        frame
    };
    let over_mtu = {
        let inner = frames::ethernet(
            [2, 0, 0, 0, 0x77, 0x77],
            [2, 0, 0, 0, 0x66, 0x66],
            &[],
            ETH_P_IP,
            &frames::ipv4(
                frames::addr4("198.19.0.1"),
                frames::addr4("198.19.0.2"),
                253,
                &[0x5a; 1504 - 20 - 8 - 8 - 14 - 20],
            ),
        );
        let payload = frames::cat(&[&frames::vxlan_header(VNI), &inner]);
        let mut frame = frames::udp_frame(ip(Z4), ip(R_IP), ENTROPY_PORT, VXLAN_PORT, &payload);
        frames::set_macs(&mut frame, R_MAC_BYTES, S_MAC_BYTES);
        assert_eq!(frame.len(), ETH_HLEN + 1504);
        frame
    };
    let udp_no_ports = || udp_counter(&lab.r, "NoPorts");
    let no_ports_before = udp_no_ports();
    lab.send(&[
        (&unknown_vni, N),
        (&no_i_flag, N),
        (&over_mtu, N),
        (&closed_port, N),
    ]);
    assert!(
        eventually(|| udp_no_ports() >= no_ports_before + N),
        "Udp NoPorts {} -> {}",
        no_ports_before,
        udp_no_ports()
    );
    let vni_flag = key("vxlan", Z1, 777, "classifier", "vni_unknown");
    let not_found = key("vxlan", Z1, 777, "kernel", "VXLAN_VNI_NOT_FOUND");
    let no_socket = key("vxlan", Z2, VNI, "kernel", "NO_SOCKET");
    let i_flag = key("vxlan", Z3, VNI, "classifier", "vxlan_no_i_flag");
    let mtu_flag = key("vxlan", Z4, VNI, "classifier", "over_mtu");
    wait(&observer, "kernel reasons", |lines| {
        let z3_kernel: u64 = drops(lines)
            .iter()
            .filter(|(k, _)| k.2 == Z3 && k.4 == "kernel")
            .map(|(_, l)| l["packets"].as_u64().unwrap())
            .sum();
        drop_packets(lines, &vni_flag) >= N
            && drop_packets(lines, &not_found) >= N
            && drop_packets(lines, &no_socket) >= N
            && drop_packets(lines, &i_flag) >= N
            && drop_packets(lines, &mtu_flag) >= N
            && z3_kernel >= N
    });
    settle(&observer);
    let run = observer.stop_ok();

    let mut found = final_drops(&run);
    eprintln!("vni: drops {found:?}");
    // Z3: the kernel's reason for a VXLAN header without the I flag.
    let z3_kernel: Vec<DropKey> = found
        .keys()
        .filter(|k| k.2 == Z3 && k.4 == "kernel")
        .cloned()
        .collect();
    assert_eq!(
        z3_kernel.len(),
        1,
        "one kernel reason for Z3: {z3_kernel:?}"
    );
    let no_i_reason = z3_kernel[0].5.clone();
    eprintln!("vni: VXLAN without the I flag dies as {no_i_reason}");
    let z3_counts = found.remove(&z3_kernel[0]).unwrap();
    let len = unknown_vni.len() as u64;
    assert_eq!(closed_port.len(), unknown_vni.len());
    assert_eq!(no_i_flag.len(), unknown_vni.len());
    assert_eq!(z3_counts, (N, N * len));
    let big = over_mtu.len() as u64;
    assert_eq!(
        found,
        BTreeMap::from([
            (vni_flag.clone(), (N, N * len)),
            (not_found.clone(), (N, N * len)),
            (no_socket.clone(), (N, N * len)),
            (i_flag.clone(), (N, N * len)),
            (mtu_flag.clone(), (N, N * big)),
        ])
    );
    // The names are the kernel's, not numbers.
    let btf = calico::kernel_drop_reasons();
    for name in ["VXLAN_VNI_NOT_FOUND", "NO_SOCKET", no_i_reason.as_str()] {
        assert!(btf.contains_key(name), "{name} not in this kernel's BTF");
    }
    for reason in calico::reasons(&run.lines) {
        assert!(
            !reason.starts_with("reason_") && reason.parse::<u64>().is_err(),
            "unnamed reason {reason}"
        );
    }
    assert!(
        message(&run, &not_found).starts_with(&format!("{N} VXLAN packets from {Z1} ")),
        "{}",
        message(&run, &not_found)
    );
    assert_eq!(
        final_peer_drops(&run, "vxlan", Z1, 777),
        counts(&[("vni_unknown", N), ("VXLAN_VNI_NOT_FOUND", N)])
    );
    assert_eq!(
        final_peer_drops(&run, "vxlan", Z2, VNI),
        counts(&[("NO_SOCKET", N)])
    );
    assert_eq!(
        final_peer_drops(&run, "vxlan", Z3, VNI),
        counts(&[("vxlan_no_i_flag", N), (no_i_reason.as_str(), N)])
    );
    assert_eq!(
        final_peer_drops(&run, "vxlan", Z4, VNI),
        counts(&[("over_mtu", N)])
    );
    assert_eq!(
        run.counts("vr", "rx", "vxlan", Some(Z4), VNI.into()),
        (N, N * big)
    );
}

/// A field of the `Udp:` lines of /proc/net/snmp in `ns`.
fn udp_counter(ns: &Netns, field: &str) -> u64 {
    snmp_counter(ns, "Udp:", field)
}

fn snmp_counter(ns: &Netns, prefix: &str, field: &str) -> u64 {
    let output = ns.exec_ok(&["cat", "/proc/net/snmp"]);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut rows = text.lines().filter(|l| l.starts_with(prefix));
    let (names, values) = (rows.next().unwrap(), rows.next().unwrap());
    let at = names.split_whitespace().position(|n| n == field).unwrap();
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

// ---------------------------------------------------------------------------
// Only watched interfaces.

#[test]
fn drops_on_unwatched_interfaces_are_not_counted() {
    if !support::have_root("drops_on_unwatched_interfaces_are_not_counted") {
        return;
    }
    let lab = Lab::new("uw");
    lab.vtep();
    lab.second_link();
    let observer = observe(&lab, &[]);
    let macs2 = (R2_MAC_BYTES, S2_MAC_BYTES);
    // On vr2: NO_SOCKET, IP_NOPROTO (IPIP without handler) and a VNI no
    // device has. On vr: NO_SOCKET only.
    let closed2 = udp_to(W2, R2_IP, macs2, VXLAN_LINUX_PORT);
    let ipip2 = ipip_to(W2, R2_IP, macs2);
    let vni2 = vxlan_to(W2, R2_IP, macs2, 777, VXLAN_PORT);
    let closed = vxlan_from(Z2, VNI, VXLAN_LINUX_PORT);
    let no_ports = || udp_counter(&lab.r, "NoPorts");
    let unknown_protos = || snmp_counter(&lab.r, "Ip:", "InUnknownProtos");
    let before = (no_ports(), unknown_protos());
    send_frames(&lab.s, "vs2", vec![(closed2, 11), (ipip2, 13), (vni2, 17)]);
    lab.send(&[(&closed, N)]);
    assert!(
        eventually(|| no_ports() >= before.0 + 11 + N && unknown_protos() >= before.1 + 13),
        "NoPorts {} -> {}, InUnknownProtos {} -> {}",
        before.0,
        no_ports(),
        before.1,
        unknown_protos()
    );
    let no_socket = key("vxlan", Z2, VNI, "kernel", "NO_SOCKET");
    wait(&observer, "vr's NO_SOCKET", |lines| {
        drop_packets(lines, &no_socket) >= N
    });
    settle(&observer);
    let run = observer.stop_ok();

    let found = final_drops(&run);
    eprintln!("unwatched: drops {found:?}");
    assert_eq!(
        found,
        BTreeMap::from([(no_socket, (N, N * closed.len() as u64))]),
        "only vr's drops"
    );
    // vr2 is not observed at all.
    assert!(
        run.peers()
            .keys()
            .all(|k| k.0 == "vr" && k.3.as_deref() != Some(W2)),
        "{:#?}",
        run.peers().keys()
    );
}

// ---------------------------------------------------------------------------
// Missing tools, absent sets, command-line sets.

#[test]
fn missing_tools_and_absent_sets_only_warn() {
    if !support::have_root("missing_tools_and_absent_sets_only_warn") {
        return;
    }
    let lab = Lab::new("mt");
    lab.vtep();
    let frame = vxlan_from(X, VNI, VXLAN_PORT);

    // ipset, nft and iptables-save live in /usr/sbin.
    let observer = ObserverProcess::spawn_with_env(
        Some(lab.r.name()),
        &["--after-decap", "none", "vr"],
        &[("PATH", "/usr/bin:/bin")],
    );
    assert!(
        observer.wait_for_lines(|lines| lines.iter().any(|l| l["type"] == "stats")),
        "observer not ready: {:?}",
        observer.lines()
    );
    lab.send(&[(&frame, N)]);
    assert!(
        observer.wait_for_lines(|lines| rx_packets(lines, "vr", "vxlan", X, VNI.into()) >= N),
        "{:?}",
        observer.lines()
    );
    let run = observer.stop();
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    final_snapshot(&run);
    assert_eq!(
        run.counts("vr", "rx", "vxlan", Some(X), VNI.into()),
        (N, N * frame.len() as u64),
        "packets are counted exactly without the tools"
    );
    assert!(drops(&run.lines).is_empty(), "{:#?}", drops(&run.lines));
    for (proto, set) in [("vxlan", VXLAN_SET), ("ipip", HOSTS_SET)] {
        let line = allow_set(&run.lines, proto)
            .unwrap_or_else(|| panic!("no allow_set {proto}: {:#?}", run.lines));
        eprintln!("missing tools: {line}");
        assert_eq!(line["active"], false, "{line}");
        assert_eq!(line["prefixes"], 0, "{line}");
        assert_eq!(line["sources"], serde_json::json!([]), "{line}");
        assert!(
            line["looked_for"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n == set),
            "{line}"
        );
        assert!(
            line["problems"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p.as_str().unwrap().contains("ipset is not installed")),
            "{line}"
        );
    }
    for tool in [
        "ipset is not installed",
        "nft is not installed",
        "iptables-save is not installed",
    ] {
        assert!(
            run.stderr.contains(tool),
            "stderr lacks {tool:?}: {}",
            run.stderr
        );
    }
    assert!(
        run.lines.iter().all(|l| l["type"] != "netfilter"),
        "no rule counters without iptables-save and nft"
    );

    // With the tools but without any set: inactive, nothing flagged, a
    // warning naming the sets looked for.
    let observer = observe(&lab, &[]);
    lab.send(&[(&frame, N)]);
    wait(&observer, "X's frames", |lines| {
        rx_packets(lines, "vr", "vxlan", X, VNI.into()) >= N
    });
    let run = observer.stop_ok();
    assert_eq!(run.counts("vr", "rx", "vxlan", Some(X), VNI.into()).0, N);
    assert!(drops(&run.lines).is_empty(), "{:#?}", drops(&run.lines));
    let line = allow_set(&run.lines, "vxlan").unwrap();
    assert_eq!(line["active"], false, "{line}");
    assert!(
        line["looked_for"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == VXLAN_SET),
        "{line}"
    );
    assert!(
        run.stderr.contains(VXLAN_SET),
        "stderr does not name the absent set: {}",
        run.stderr
    );
}

/// `--allow-cidr` for VXLAN and `--allow-set ipip=NAME` for IPIP, without
/// any of Calico's sets.
#[test]
fn command_line_allow_sets_and_cidrs() {
    if !support::have_root("command_line_allow_sets_and_cidrs") {
        return;
    }
    let lab = Lab::new("cl");
    lab.vtep();
    let hosts = support::netns::unique("h");
    calico::ipset_create(&lab.r, &hosts, &["198.18.0.8/29"]);
    let observer = observe(
        &lab,
        &[
            "--allow-cidr",
            &format!("{X}/32"),
            "--allow-set",
            &format!("ipip={hosts}"),
        ],
    );
    let lines = observer.lines();
    let vxlan = allow_set(&lines, "vxlan").unwrap();
    assert_eq!(vxlan["active"], true, "{vxlan}");
    assert_eq!(
        vxlan["sources"],
        serde_json::json!(["--allow-cidr"]),
        "{vxlan}"
    );
    assert_eq!(vxlan["prefixes"], 1, "{vxlan}");
    let ipip = allow_set(&lines, "ipip").unwrap();
    assert_eq!(ipip["active"], true, "{ipip}");
    assert_eq!(
        ipip["sources"],
        serde_json::json!([format!("ipset {hosts}")])
    );
    assert!(
        ipip["looked_for"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == hosts.as_str()),
        "{ipip}"
    );

    let frames = [
        vxlan_from(X, VNI, VXLAN_PORT),
        vxlan_from(Y, VNI, VXLAN_PORT),
        ipip_from(X),
        ipip_from(Y),
    ];
    lab.send(&frames.iter().map(|f| (f, N)).collect::<Vec<_>>());
    let vxlan_y = key("vxlan", Y, VNI, "classifier", "calico_allow_set");
    let ipip_y = key("ipip", Y, 0, "classifier", "calico_allow_set");
    wait(&observer, "Y flagged for both", |lines| {
        drop_packets(lines, &vxlan_y) >= N
            && drop_packets(lines, &ipip_y) >= N
            && rx_packets(lines, "vr", "vxlan", X, VNI.into()) >= N
            && rx_packets(lines, "vr", "ipip", X, 0) >= N
    });
    settle(&observer);
    let run = observer.stop_ok();
    let classifier: BTreeMap<DropKey, (u64, u64)> = final_drops(&run)
        .into_iter()
        .filter(|(k, _)| k.4 == "classifier")
        .collect();
    assert_eq!(
        classifier,
        BTreeMap::from([
            (vxlan_y.clone(), (N, N * frames[1].len() as u64)),
            (ipip_y.clone(), (N, N * frames[3].len() as u64)),
        ])
    );
    assert_eq!(
        message(&run, &ipip_y),
        format!("{N} IPIP packets from {Y} dropped: source not in {hosts}")
    );
}

// ---------------------------------------------------------------------------
// Hostile node state: sets and rules that others control.

/// Members of the hostile allow-set beyond X: more than the programs'
/// tries hold (`ALLOW_SET_MAX_PREFIXES`, 65,536).
const HOSTILE_MEMBERS: u32 = 100_000;
/// Rules with hostile comments in Calico's own chain.
const HOSTILE_RULES: usize = 200;
/// Bound of the observer's resident memory while it reads them (the
/// monitor's target; at rest it holds about 10 MiB).
const HOSTILE_RSS_LIMIT_KIB: u64 = 64 * 1024;

/// A comment iptables takes at its longest (255 bytes) that is not UTF-8:
/// Calico writes Kubernetes object names there, and anyone who can create
/// a policy chooses them.
fn hostile_comment(i: usize) -> Vec<u8> {
    let mut comment = format!("policy {i} ").into_bytes();
    while comment.len() < 255 {
        comment.extend_from_slice(&[0xff, 0xfe, b' ', 0xc3, b'x']);
    }
    comment.truncate(255);
    comment
}

/// Calico's VXLAN allow-set grown to 100,000 prefixes (X among them), and
/// 200 rules with 255-byte comments of invalid UTF-8 after Calico's two in
/// cali-INPUT: the observer says once that the set is larger than its
/// programs hold and checks nothing against it (a part of it would flag
/// allowed sources), still reads the drop rule's counter exactly, counts
/// the traffic exactly, and stays within bounded memory.
#[test]
fn hostile_sets_and_rule_comments_are_read_within_bounds() {
    use std::os::unix::ffi::OsStrExt;
    let tag = "hostile";
    if !support::have_root(tag) {
        return;
    }
    let lab = Lab::new(tag);
    lab.vtep();
    let files = support::exporter::TempDir::new(tag);

    let mut restore = format!("create {VXLAN_SET} hash:net family inet maxelem 262144\n");
    restore.push_str(&format!("add {VXLAN_SET} {X}\n"));
    for i in 0..HOSTILE_MEMBERS {
        let [_, b, c, d] = (0x0a80_0000 + i).to_be_bytes();
        restore.push_str(&format!("add {VXLAN_SET} 10.{b}.{c}.{d}\n"));
    }
    let sets = files.join("sets.ipset");
    std::fs::write(&sets, restore).unwrap();
    lab.r
        .exec_ok(&["ipset", "restore", "-file", sets.to_str().unwrap()]);
    calico::iptables_vxlan_rules(&lab.r);
    let mut rules = b"*filter\n".to_vec();
    for i in 0..HOSTILE_RULES {
        rules.extend_from_slice(b"-A cali-INPUT -s 192.0.2.1/32 -m comment --comment \"");
        rules.extend_from_slice(&hostile_comment(i));
        rules.extend_from_slice(b"\" -j RETURN\n");
    }
    rules.extend_from_slice(b"COMMIT\n");
    let rules_file = files.join("rules.iptables");
    std::fs::write(&rules_file, &rules).unwrap();
    lab.r.exec_ok(&[
        "iptables-restore",
        "-w",
        "--noflush",
        rules_file.to_str().unwrap(),
    ]);
    // What iptables-save gives back holds the bytes as written.
    let saved = lab.r.exec_ok(&["iptables-save", "-t", "filter"]).stdout;
    let comment = hostile_comment(7);
    assert!(
        saved
            .windows(comment.len())
            .any(|w| w == comment.as_slice()),
        "the comment survives in iptables-save: {}",
        std::ffi::OsStr::from_bytes(&saved[..saved.len().min(2000)]).to_string_lossy()
    );

    let observer = ObserverProcess::spawn(
        Some(lab.r.name()),
        &[
            "--allow-set-refresh",
            "200ms",
            "--after-decap",
            "none",
            "vr",
        ],
    );
    observer.wait_ready(1);
    // From the first interval: the loader's own peak (kernel BTF) is not
    // what this test is about; every 200 ms read of the set after it is.
    let rss = support::exporter::RssSampler::start(observer.pid());
    let vxlan = allow_set(&observer.lines(), "vxlan").cloned();
    let vxlan = vxlan.unwrap_or_else(|| panic!("no allow_set line:\n{}", dump(&observer.lines())));
    assert_eq!(vxlan["active"], false, "the set is not checked: {vxlan}");

    lab.send(&[
        (&vxlan_from(X, VNI, VXLAN_PORT), N),
        (&vxlan_from(Y, VNI, VXLAN_PORT), N),
    ]);
    assert!(
        eventually(|| calico::iptables_counter(&lab.r, VXLAN_DROP_RULE).0 >= N),
        "drop rule counter {:?}",
        calico::iptables_counter(&lab.r, VXLAN_DROP_RULE)
    );
    let dropped = key("vxlan", Y, VNI, "kernel", "NETFILTER_DROP");
    wait(&observer, "Y's kernel drops and X's packets", |lines| {
        drop_packets(lines, &dropped) >= N && rx_packets(lines, "vr", "vxlan", X, VNI.into()) >= N
    });
    settle(&observer);
    let peak_kib = rss.stop();
    let run = observer.stop_ok();

    let len = vxlan_from(Y, VNI, VXLAN_PORT).len() as u64;
    assert_eq!(
        final_drops(&run),
        BTreeMap::from([(dropped, (N, N * len))]),
        "the kernel's drops only: no source is judged against the set"
    );
    for peer in [X, Y] {
        assert_eq!(
            run.counts("vr", "rx", "vxlan", Some(peer), VNI.into()),
            (N, N * len),
            "{peer}"
        );
    }
    let check = final_netfilter(&run, "iptables", VXLAN_DROP_RULE);
    assert_eq!(
        check["packets"], N,
        "the drop rule's counter, read past the comments: {check}"
    );
    assert_eq!(
        calico::iptables_counter(&lab.r, VXLAN_DROP_RULE).0,
        N,
        "iptables' own counter"
    );
    let too_big: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("holds more than 65536 prefixes of one family"))
        .collect();
    assert_eq!(
        too_big.len(),
        1,
        "said once, over many reads:\n{}",
        run.stderr
    );
    assert!(too_big[0].contains(VXLAN_SET), "{}", too_big[0]);
    eprintln!(
        "{tag}: peak RSS {peak_kib} KiB over {} intervals",
        calico::intervals(&run.lines)
    );
    assert!(
        peak_kib < HOSTILE_RSS_LIMIT_KIB,
        "peak RSS {peak_kib} KiB reading {HOSTILE_MEMBERS} members"
    );
}
