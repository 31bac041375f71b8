//! The kernel suite: what must hold on every supported kernel (5.10, 6.1,
//! 6.12 and newer). `cargo xtask vm-test` runs this binary inside VMs
//! booted with Debian's kernels, which have every tunnel device kind; on
//! the host it runs with the rest of the tests, leaving out the kinds the
//! host kernel lacks. Every check records its figures for the kernel
//! matrix (support/kernel_suite.rs), and compares with an outside
//! reference: tcpdump on the same interface, iptables' rule counters, the
//! kernel's own SNMP counters and `ip -d link`; a scripted BGP session
//! counted at the wire like tcpdump counts it.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use serde_json::Value;
use support::{
    bgp_wire,
    calico::{self, HOSTS_SET, IPIP_DROP_RULE},
    have_root,
    kernel_suite::{self, Checks},
    lab,
    netns::{Netns, ObserverProcess, ObserverRun, Tcpdump},
    tunnels::{A_IFACE, A4, A4_TAP, B_IFACE, B4, KINDS, Kind, Tunnels},
};

/// Pings per direction and tunnel kind.
const PINGS: u32 = 10;

/// The kinds `name`s name.
fn kinds(names: &[&str]) -> Vec<Kind> {
    KINDS
        .iter()
        .filter(|k| names.contains(&k.name))
        .copied()
        .collect()
}

/// Pings over every tunnel while the observer runs on B's underlay with
/// `args` and tcpdump captures it; returns both views.
fn count_with_tcpdump(tunnels: &Tunnels, args: &[&str]) -> (ObserverRun, support::netns::Capture) {
    let observer = ObserverProcess::start(Some(tunnels.b.name()), &[B_IFACE], args);
    let tcpdump = Tcpdump::start(&tunnels.b, B_IFACE, "ip or ip6");
    tunnels.ping_all(PINGS);
    tunnels.quiesce();
    // Replies are in flight for a moment; neither side may stop earlier.
    std::thread::sleep(Duration::from_millis(500));
    let capture = tcpdump.stop_after(0);
    let run = observer.stop();
    assert!(run.status.success(), "{}", run.stderr);
    (run, capture)
}

/// Both directions of an interface are counted from one instant: the
/// observer starts on B's underlay while A pings B over GRE, ip6ip6 and
/// VXLAN over IPv6 at once, 10 ms apart; every reply B sends answers a
/// request B received a moment before, so the replies counted leaving
/// are the requests counted arriving, plus at most the one whose request
/// was in flight at the start. Before the programs were attached paused
/// (`config::PAUSED`), XDP counted for a moment before tc egress was
/// attached: 27 to 29 of 30 GRE replies under qemu on 6.1.
#[test]
fn both_directions_are_counted_from_one_instant() {
    if !have_root("both_directions_are_counted_from_one_instant") {
        return;
    }
    let tunnels = Tunnels::new("k1", &kinds(&["gre_v4", "ip6tnl_ip6ip6", "vxlan4789_v6"]));
    let mut pings: Vec<std::process::Child> = tunnels
        .kinds
        .iter()
        .map(|kind| {
            std::process::Command::new("ip")
                .args(["netns", "exec", tunnels.a.name(), "ping", "-n", "-q"])
                .args(["-i", "0.01", "-c", "100000", kind.inner.1])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("spawning ping")
        })
        .collect();
    let observer = ObserverProcess::start(Some(tunnels.b.name()), &[B_IFACE], &[]);
    observer.wait_ready(1);
    std::thread::sleep(Duration::from_secs(1));
    for ping in &mut pings {
        support::netns::signal(ping.id(), libc::SIGINT);
        let _ = ping.wait();
    }
    // The last replies are in flight for a moment.
    std::thread::sleep(Duration::from_millis(500));
    let run = observer.stop();
    assert!(run.status.success(), "{}", run.stderr);
    let mut checks = Checks::default();
    for kind in &tunnels.kinds {
        let count = |direction| {
            run.counts(B_IFACE, direction, kind.proto, Some(kind.peer), kind.vni)
                .0
        };
        let (rx, tx) = (count("rx"), count("tx"));
        checks.holds(
            &format!("{}_started_at_once", kind.name),
            rx > 0 && (tx == rx || tx == rx + 1),
            Some(tx),
            &format!("{rx} requests received, {tx} replies sent"),
        );
    }
    for (kind, why) in &tunnels.missing {
        kernel_suite::record(kernel_suite::Check {
            name: &format!("{}_started_at_once", kind.name),
            observer: None,
            reference: None,
            reference_kind: "",
            pass: true,
            detail: format!("skipped: {why}"),
        });
    }
    checks.finish();
}

/// The observer's rx and tx of `kind` against tcpdump's count of its
/// outer packets, per direction.
fn compare_kind(
    checks: &mut Checks,
    prefix: &str,
    kind: &Kind,
    run: &ObserverRun,
    capture: &support::netns::Capture,
) {
    for (direction, filter) in [("rx", kind.rx_filter()), ("tx", kind.tx_filter())] {
        let (observer, _) = run.counts(B_IFACE, direction, kind.proto, Some(kind.peer), kind.vni);
        checks.compare(
            &format!("{prefix}{}_{direction}", kind.name),
            observer,
            capture.count(&filter),
            "tcpdump",
        );
    }
}

/// Verified instructions any one program may take: a third of the
/// verifier's 1,000,000 limit. Above it, each load takes seconds on a node
/// and most of a minute in a TCG VM, and the next feature hits the limit.
/// Before `maps::settle` in the programs, tc took 480,000 on 6.18 and
/// 575,000 on 5.10.
const VERIFIED_INSNS_BUDGET: u64 = 333_333;

/// `observer check` loads every program this kernel needs, says which,
/// and each within [`VERIFIED_INSNS_BUDGET`].
#[test]
fn check_loads_every_program() {
    if !have_root("check_loads_every_program") {
        return;
    }
    let output = std::process::Command::new(ObserverProcess::binary())
        .args(["check", "--output", "json"])
        .output()
        .expect("running observer check");
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("check printed no JSON ({e}): {output:?}"));
    let status = output.status.code().unwrap_or(-1);
    let mut checks = Checks::default();
    checks.holds(
        "check_verdict",
        status == 0 || status == 1,
        Some(status as u64),
        report["verdict"].as_str().unwrap_or_default(),
    );
    for program in report["programs"].as_array().expect("programs") {
        let loaded = program["loaded"] == true;
        checks.holds(
            &format!("load_{}", program["hook"].as_str().unwrap()),
            loaded,
            program["verified_insns"].as_u64(),
            program["program"].as_str().unwrap_or_default(),
        );
        if let Some(insns) = program["verified_insns"].as_u64() {
            checks.holds(
                &format!("verified_{}", program["hook"].as_str().unwrap()),
                insns <= VERIFIED_INSNS_BUDGET,
                Some(insns),
                &format!("at most {VERIFIED_INSNS_BUDGET} verified instructions"),
            );
        }
    }
    let fallbacks: Vec<&str> = report["fallbacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["hook"].as_str().unwrap())
        .collect();
    checks.holds(
        "fallbacks",
        status == if fallbacks.is_empty() { 0 } else { 1 },
        Some(fallbacks.len() as u64),
        &fallbacks.join(", "),
    );
    // The kernel whose XDP test runs rewrite the dispatcher (5.10 hung
    // on it) is told so: check names the replay fallback there only.
    let release = report["kernel"].as_str().unwrap_or_default();
    let affected = observer::bpf::features::xdp_test_run_rewrites_dispatcher(release);
    checks.holds(
        "replay_fallback_named",
        fallbacks.contains(&"replay --kernel") == affected,
        Some(u64::from(affected)),
        "check names `replay --kernel` exactly where XDP test runs rewrite the dispatcher",
    );
    checks.finish();
}

/// Every tunnel kind the kernel has, received and sent, counted per peer
/// exactly as tcpdump counts its outer packets on the same interface; the
/// observer's data-plane view of each device equal to `ip -d link`'s; IPIP
/// from a source outside Calico's `cali40all-hosts-net` counted as
/// `calico_allow_set` and as a kernel drop, both equal to the DROP rule's
/// counter; and UDP to a closed port counted under the kernel's own reason
/// name (from its BTF; `NOT_REPORTED` before 5.17) as often as the kernel's
/// `Udp: NoPorts` counter says. One observer run for all of it: in the
/// emulated VMs each start costs tens of seconds.
#[test]
fn every_tunnel_kind_counts_like_tcpdump() {
    if !have_root("every_tunnel_kind_counts_like_tcpdump") {
        return;
    }
    let tunnels = Tunnels::new("kt", KINDS);
    let routes = add_block_routes(&tunnels);
    let blocked = tunnels
        .kinds
        .iter()
        .any(|k| k.name == "ipip_v4")
        .then(|| BlockedIpip::new(&tunnels));
    let observer = ObserverProcess::start(Some(tunnels.b.name()), &[B_IFACE], &[]);
    let tcpdump = Tcpdump::start(&tunnels.b, B_IFACE, "ip or ip6");
    let no_ports_before = udp_no_ports(&tunnels.b);
    tunnels.ping_all(PINGS);
    let blocked_sent = blocked
        .as_ref()
        .map(|_| tunnels_ping_dropped(&tunnels.a, BLOCKED_INNER_B));
    tunnels.a.exec_ok(&[
        "bash",
        "-c",
        &format!("for i in $(seq {DATAGRAMS}); do printf x > /dev/udp/{B4}/9; done"),
    ]);
    bgp_wire::exchange(&tunnels.a, &tunnels.b, B4.parse().unwrap());
    tunnels.quiesce();
    // Replies are in flight for a moment; neither side may stop earlier.
    std::thread::sleep(Duration::from_millis(500));
    let capture = tcpdump.stop_after(0);
    let no_ports = udp_no_ports(&tunnels.b) - no_ports_before;
    let drop_rule = blocked
        .as_ref()
        .map(|_| calico::iptables_counter(&tunnels.b, IPIP_DROP_RULE).0);
    let run = observer.stop();
    assert!(run.status.success(), "{}", run.stderr);

    let mut checks = Checks::default();
    for kind in &tunnels.kinds {
        compare_kind(&mut checks, "", kind, &run, &capture);
    }
    let lines = calico::final_snapshot(&run);
    let reported = drop_reasons_reported(&run);
    if let (Some(sent), Some(drop_rule)) = (blocked_sent, drop_rule) {
        checks.compare("ipip_drops_sent", drop_rule, sent, "pings sent");
        let classifier = calico::drop_packets(
            lines,
            &calico::drop_key(
                B_IFACE,
                "ipip",
                BLOCKED_SOURCE,
                0,
                "classifier",
                "calico_allow_set",
            ),
        );
        checks.compare("ipip_allow_set", classifier, drop_rule, "iptables DROP");
        let reason = if reported {
            "NETFILTER_DROP"
        } else {
            "NOT_REPORTED"
        };
        let kernel = calico::drop_packets(
            lines,
            &calico::drop_key(B_IFACE, "ipip", BLOCKED_SOURCE, 0, "kernel", reason),
        );
        checks.compare(
            &format!("ipip_kernel_{reason}"),
            kernel,
            drop_rule,
            "iptables DROP",
        );
    }
    let reason = if reported {
        "NO_SOCKET"
    } else {
        "NOT_REPORTED"
    };
    let kernel_drops = lines
        .iter()
        .filter(|l| {
            l["type"] == "drop"
                && l["origin"] == "kernel"
                && l["stage"] == "underlay"
                && l["reason"] == reason
                && l["peer"].is_null()
        })
        .filter_map(|l| l["packets"].as_u64())
        .sum();
    checks.compare(
        &format!("kernel_drop_{reason}"),
        kernel_drops,
        no_ports,
        "Udp NoPorts",
    );
    checks.compare("kernel_drop_sent", no_ports, DATAGRAMS, "datagrams sent");
    for (kind, why) in &tunnels.missing {
        kernel_suite::record(kernel_suite::Check {
            name: &format!("{}_rx", kind.name),
            observer: None,
            reference: None,
            reference_kind: "tcpdump",
            pass: true,
            detail: format!("kernel lacks it: {why}"),
        });
    }
    let attach = run.attach_lines()[0].clone();
    // `auto` on a veth: tc where tcx exists (tx uses it then), else
    // native XDP (a clsact filter would outlive a killed observer).
    let (auto_rx, why) = if attach["tx_hook"] == "tcx" {
        (
            "tcx",
            attach["xdp_fallback_reason"].as_str().unwrap_or_default(),
        )
    } else {
        ("xdp-native", "veth")
    };
    checks.holds(
        "attach_hooks",
        attach["rx_hook"] == auto_rx && attach["tx_hook"].is_string() && why.contains("veth"),
        None,
        &format!(
            "rx {} ({}), tx {}, drops {}",
            attach["rx_hook"], attach["programs"]["rx"], attach["tx_hook"], attach["drop_hook"]
        ),
    );
    dataplane_checks(&mut checks, &tunnels, &run, &routes);
    bgp_wire_checks(&mut checks, &run, &capture);
    checks.finish();
}

/// The scripted BGP session from A: each `bgp_wire` counter of B's
/// underlay, per direction, equal to tcpdump's count of the same TCP/179
/// segments (by flag, by first BGP message).
fn bgp_wire_checks(checks: &mut Checks, run: &ObserverRun, capture: &support::netns::Capture) {
    let lines = &run.lines;
    let a: std::net::IpAddr = A4.parse().unwrap();
    for (direction, host) in [
        ("rx", format!("src host {A4}")),
        ("tx", format!("dst host {A4}")),
    ] {
        let line = bgp_wire::last_line(lines, B_IFACE, direction, a).unwrap_or_default();
        let reference = bgp_wire::reference(capture, &host);
        let observed: Vec<(&str, u64)> = reference
            .iter()
            .map(|(name, _)| (*name, line[*name].as_u64().unwrap_or(u64::MAX)))
            .collect();
        let segments = |counts: &[(&str, u64)]| counts[0].1;
        checks.compare(
            &format!("bgp_wire_{direction}_segments"),
            segments(&observed),
            segments(&reference),
            "tcpdump",
        );
        let detail = observed
            .iter()
            .zip(&reference)
            .filter(|(o, _)| o.1 > 0)
            .map(|(o, r)| format!("{} {}/{}", o.0, o.1, r.1))
            .collect::<Vec<_>>()
            .join(", ");
        checks.holds(
            &format!("bgp_wire_{direction}_messages"),
            observed == reference && segments(&reference) > 0,
            None,
            &format!("observer/tcpdump: {detail}"),
        );
    }
}

/// A pod block routed through each L3 and fixed-remote L2 device on B
/// (not through vxlan, whose peers come from FDB entries, nor WireGuard,
/// whose peers rtnetlink does not show): block -> (peer, proto).
fn add_block_routes(tunnels: &Tunnels) -> BTreeMap<String, (String, String)> {
    let mut routes = BTreeMap::new();
    for (i, kind) in tunnels.kinds.iter().enumerate() {
        if kind.proto == "vxlan" || kind.proto == "wireguard" {
            continue;
        }
        let block = if kind.inner_v6() {
            format!("fd10:{i}::/64")
        } else {
            format!("10.210.{i}.0/24")
        };
        tunnels.b.ip(&["route", "add", &block, "dev", kind.dev]);
        routes.insert(block, (kind.peer.to_string(), kind.proto.to_string()));
    }
    routes
}

/// The last `dataplane` line against `ip -d -j link show` and the routes
/// the test added.
fn dataplane_checks(
    checks: &mut Checks,
    tunnels: &Tunnels,
    run: &ObserverRun,
    routes: &BTreeMap<String, (String, String)>,
) {
    let Some(view) = run.lines.iter().rev().find(|l| l["type"] == "dataplane") else {
        checks.holds("dataplane_line", false, None, "no dataplane line");
        return;
    };
    let links = tunnels.kernel_links();
    for kind in &tunnels.kinds {
        let device = view["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == kind.dev);
        let Some(device) = device else {
            checks.holds(
                &format!("view_{}", kind.name),
                false,
                None,
                "device missing from the view",
            );
            continue;
        };
        let kernel = &links[kind.dev];
        let differences = device_differences(device, kernel, &links);
        checks.holds(
            &format!("view_{}", kind.name),
            differences.is_empty(),
            None,
            &if differences.is_empty() {
                format!("{} equal to ip -d link", device)
            } else {
                differences.join("; ")
            },
        );
    }
    // Every block routed through a device is expected from the device's
    // remote, with the device's encapsulation: exactly.
    let mut want: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for (block, (peer, proto)) in routes {
        let entry = want.entry(peer.clone()).or_default();
        entry.0.insert(block.clone());
        entry.1.insert(proto.clone());
    }
    for kind in tunnels.kinds.iter().filter(|k| k.proto == "vxlan") {
        // A vxlan remote is a default FDB entry: a peer without blocks.
        want.entry(kind.peer.to_string())
            .or_default()
            .1
            .insert("vxlan".to_string());
    }
    let got: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = view["expected_peers"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(peer, p)| {
            let strings = |v: &Value| -> BTreeSet<String> {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_string())
                    .collect()
            };
            (peer.clone(), (strings(&p["blocks"]), strings(&p["encaps"])))
        })
        .collect();
    checks.holds(
        "view_expected_peers",
        got == want,
        Some(got.values().map(|(b, _)| b.len() as u64).sum()),
        &format!("observer {got:?} vs routes {want:?}"),
    );
}

/// Fields where the observer's device and the kernel's `ip -d -j link`
/// object disagree (kind, VNI, GRE key, port, local, remote, MTU, lower).
fn device_differences(
    device: &Value,
    kernel: &Value,
    links: &BTreeMap<String, Value>,
) -> Vec<String> {
    let data = &kernel["linkinfo"]["info_data"];
    let addr = |v: &Value| -> Value {
        match v.as_str() {
            // iproute2 prints an unset address as "any".
            Some("any") | Some("::") | Some("0.0.0.0") | None => Value::Null,
            Some(a) => Value::String(a.to_string()),
        }
    };
    let lower = data["link"]
        .as_str()
        .and_then(|name| links.get(name))
        .map_or(Value::Null, |l| l["ifindex"].clone());
    let key = match &data["okey"] {
        Value::String(dotted) => dotted
            .parse::<std::net::Ipv4Addr>()
            .map_or(Value::Null, |a| u32::from(a).into()),
        Value::Number(n) => Value::Number(n.clone()),
        _ => Value::Null,
    };
    let expect = [
        ("kind", kernel["linkinfo"]["info_kind"].clone()),
        ("vni", data["id"].clone()),
        ("key", key),
        ("port", data["port"].clone()),
        // vxlan names its IPv6 addresses local6/remote6.
        ("local", addr(first(&data["local"], &data["local6"]))),
        ("remote", addr(first(&data["remote"], &data["remote6"]))),
        ("mtu", kernel["mtu"].clone()),
        ("lower", lower),
    ];
    expect
        .into_iter()
        .filter(|(field, want)| &device[*field] != want)
        .map(|(field, want)| format!("{field}: observer {} vs ip {want}", device[field]))
        .collect()
}

/// `a` unless it is absent, else `b`.
fn first<'a>(a: &'a Value, b: &'a Value) -> &'a Value {
    if a.is_null() { b } else { a }
}

/// Without privileges `observer check` says what is missing and exits 2.
#[test]
fn check_without_privileges_cannot_run() {
    if !have_root("check_without_privileges_cannot_run") {
        return;
    }
    let binary = support::unprivileged::BinaryCopy::observer();
    let output = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(binary.path())
        .args(["check", "--output", "json"])
        .output()
        .expect("running observer check as nobody");
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("check printed no JSON ({e}): {output:?}"));
    let mut checks = Checks::default();
    checks.holds(
        "check_unprivileged",
        output.status.code() == Some(2)
            && report["verdict"] == "cannot_run"
            && report["missing_privileges"]
                == serde_json::json!(["CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"]),
        output.status.code().map(|c| c as u64),
        &report["missing_privileges"].to_string(),
    );
    checks.finish();
}

/// Native XDP, generic XDP and tc alone each count the same VXLAN and
/// IPIP traffic as tcpdump (`every_tunnel_kind_counts_like_tcpdump` runs
/// `auto`, which is tc on a veth where tcx exists, native XDP before).
#[test]
fn every_rx_hook_counts_like_tcpdump() {
    if !have_root("every_rx_hook_counts_like_tcpdump") {
        return;
    }
    let tunnels = Tunnels::new("km", &kinds(&["vxlan4789_v4", "ipip_v4"]));
    let mut checks = Checks::default();
    for (mode, hook) in [
        ("native", "xdp-native"),
        ("generic", "xdp-generic"),
        ("off", "tc"),
    ] {
        let (run, capture) = count_with_tcpdump(&tunnels, &["--xdp-mode", mode]);
        let attach = run.attach_lines()[0].clone();
        let rx_hook = attach["rx_hook"].as_str().unwrap_or_default();
        let attached =
            rx_hook == hook || (hook == "tc" && (rx_hook == "tcx" || rx_hook == "clsact"));
        checks.holds(
            &format!("mode_{mode}_attach"),
            attached,
            None,
            &format!("rx {rx_hook} ({})", attach["programs"]["rx"]),
        );
        for kind in &tunnels.kinds {
            compare_kind(&mut checks, &format!("mode_{mode}_"), kind, &run, &capture);
        }
    }
    checks.finish();
}

/// A second IPIP tunnel from A, from an address outside the allow-set:
/// Calico's set on B holds A's node addresses, and its rule drops IPIP
/// from anyone else.
struct BlockedIpip;

/// The source address of the blocked tunnel (A's, outside the set).
const BLOCKED_SOURCE: &str = "10.99.0.21";
/// B's inner address as the blocked tunnel routes it.
const BLOCKED_INNER_B: &str = "10.201.30.2";
/// UDP datagrams sent to a closed port of B.
const DATAGRAMS: u64 = 25;

impl BlockedIpip {
    fn new(tunnels: &Tunnels) -> BlockedIpip {
        let a = &tunnels.a;
        a.ip(&[
            "addr",
            "add",
            &format!("{BLOCKED_SOURCE}/24"),
            "dev",
            A_IFACE,
        ]);
        a.ip(&[
            "link",
            "add",
            "ipipx",
            "type",
            "ipip",
            "local",
            BLOCKED_SOURCE,
            "remote",
            B4,
        ]);
        a.ip(&["addr", "add", "10.201.30.1/24", "dev", "ipipx"]);
        a.ip(&["link", "set", "ipipx", "up"]);
        calico::ipset_create(&tunnels.b, HOSTS_SET, &[A4, A4_TAP]);
        calico::iptables_ipip_rule(&tunnels.b);
        BlockedIpip
    }
}

/// Pings that Calico's rule drops: all go unanswered; returns how many.
fn tunnels_ping_dropped(from: &Netns, to: &str) -> u64 {
    // No deadline (-w): ping would keep sending until it, unanswered.
    let output = from.exec(&[
        "ping",
        "-n",
        "-q",
        "-c",
        &PINGS.to_string(),
        "-i",
        "0.02",
        "-W",
        "1",
        to,
    ]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains(&format!("{PINGS} packets transmitted, 0 received")),
        "the DROP rule let pings through, or ping failed: {text}"
    );
    u64::from(PINGS)
}

/// Whether this kernel's skb:kfree_skb reports drop reasons, as the
/// observer found: its attach line names the kfree_skb variant in use.
fn drop_reasons_reported(run: &ObserverRun) -> bool {
    let attach = run.attach_lines()[0];
    match attach["programs"]["drops"].as_str() {
        Some("observer_kfree") => true,
        Some("observer_kfree2") => false,
        other => panic!("no kernel drop program in {attach}: {other:?}"),
    }
}

/// `Udp: NoPorts` of namespace `ns` (/proc/net/snmp).
fn udp_no_ports(ns: &Netns) -> u64 {
    let output = ns.exec_ok(&["cat", "/proc/net/snmp"]);
    let text = String::from_utf8_lossy(&output.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let names: Vec<&str> = udp.next().unwrap().split_whitespace().collect();
    let values: Vec<&str> = udp.next().unwrap().split_whitespace().collect();
    let at = names.iter().position(|n| *n == "NoPorts").unwrap();
    values[at].parse().unwrap()
}

/// `observer probe` on this kernel, then drops after decapsulation, in one
/// observer run (in the emulated VMs each start costs tens of seconds):
/// from A of a Calico VXLAN pair, with the observer attached to A's
/// underlay. Every probe is answered, and the programs count probes and
/// answers apart (probe stats), never in the peer's row. Then B's pings to
/// A's pod are dropped by an INPUT rule on vxlan.calico, and A's pings to
/// B's pod once A's FDB entry for B's VTEP is gone (dropped by
/// vxlan_xmit): both counted on vxlan.calico, attributed to B through its
/// pod block, each with the kernel function that dropped it; the first
/// exactly as the rule's counter, the second as ping's.
#[test]
fn probes_are_answered_and_counted_apart_and_drops_after_decapsulation_name_the_node() {
    if !have_root("probes_are_answered_and_counted_apart_and_drops_after_decapsulation") {
        return;
    }
    use observer_testkit::pair::{B_IP, NODE_A, NODE_B, Pair};
    let pair = Pair::new("kpr");
    pair.calico();
    let a = &pair.a;
    let evidence = std::env::temp_dir().join(support::netns::unique("kev"));
    let observer = ObserverProcess::start(
        Some(a.name()),
        &[pair.a_iface()],
        &[
            "--interval",
            "200ms",
            "--capture-dir",
            evidence.to_str().unwrap(),
            "--capture-rate",
            "100000",
        ],
    );
    let output = std::process::Command::new(ObserverProcess::binary())
        .args(["probe", "--netns", a.name(), "--count", "3", "--no-ladder"])
        .args(["--output", "json"])
        .output()
        .expect("running observer probe");
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let answered = lines
        .iter()
        .find(|l| l["type"] == "probe")
        .and_then(|l| l["answered"].as_u64())
        .unwrap_or(0);
    // The peer rows as the probes left them, before the pings below.
    calico::settle(&observer);
    let mut latest: BTreeMap<(String, String), u64> = BTreeMap::new();
    for row in observer
        .lines()
        .iter()
        .filter(|l| l["type"] == "peer" && l["proto"] == "vxlan")
    {
        let key = (row["direction"].to_string(), row["peer"].to_string());
        latest.insert(key, row["packets"].as_u64().unwrap_or(0));
    }
    let in_rows: u64 = latest.values().sum();
    let handshakes = tcp_handshakes(&pair);
    let checksum_errors = wrong_checksums_to_a(&pair);

    let comment = "observer kernel suite: input on the tunnel";
    calico::iptables_drop(
        a,
        &["-A", "INPUT", "-i", "vxlan.calico", "-p", "icmp"],
        comment,
    );
    let dropped_in = tunnels_ping_dropped(&pair.b, NODE_A.pod);
    pair.forget_peer_vtep();
    let dropped_out = tunnels_ping_dropped(a, NODE_B.pod);
    calico::settle(&observer);
    let run = observer.stop();
    assert!(run.status.success(), "{}", run.stderr);

    let stats = run.final_stats();
    let stat = |key: &str| stats[key].as_u64().unwrap_or(u64::MAX);
    let mut checks = Checks::default();
    checks.compare("probe_answered", answered, 3, "probes sent");
    checks.compare("probe_tx_apart", stat("probe_tx_packets"), 3, "probes sent");
    checks.compare(
        "probe_rx_apart",
        stat("probe_rx_packets"),
        answered,
        "answers",
    );
    checks.compare("probe_in_rows", in_rows, 0, "nothing");
    tcp_checks(&mut checks, &run, pair.a_iface(), &handshakes);
    let flagged: u64 = calico::final_snapshot(&run)
        .iter()
        .filter(|l| l["type"] == "drop" && l["reason"] == "bad_inner_checksum" && l["peer"] == B_IP)
        .filter_map(|l| l["packets"].as_u64())
        .sum();
    checks.compare(
        "bad_inner_checksum_rx",
        flagged,
        checksum_errors,
        "Tcp:InCsumErrors",
    );
    checks.compare("bad_inner_checksum_sent", checksum_errors, 5, "frames sent");

    let last = calico::final_snapshot(&run);
    let line = |direction: &str| {
        last.iter().find(|l| {
            l["type"] == "drop"
                && l["iface"] == "vxlan.calico"
                && l["stage"] == "tunnel"
                && l["direction"] == direction
                && l["peer"] == B_IP
        })
    };
    let packets = |l: Option<&Value>| l.and_then(|l| l["packets"].as_u64()).unwrap_or(0);
    let location = |l: Option<&Value>| {
        l.and_then(|l| l["location"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let (rule, _) = calico::iptables_counter(a, comment);
    checks.compare(
        "after_decap_input_rx",
        packets(line("rx")),
        rule,
        "iptables DROP",
    );
    checks.compare("after_decap_input_pings", rule, dropped_in, "pings sent");
    let input_at = location(line("rx"));
    checks.holds(
        "after_decap_input_location",
        ["nf_hook_slow", "nft_do_chain", "ipt_do_table"].contains(&input_at.as_str()),
        None,
        &input_at,
    );
    checks.compare(
        "after_decap_fdb_tx",
        packets(line("tx")),
        dropped_out,
        "pings sent",
    );
    let fdb_at = location(line("tx"));
    checks.holds(
        "after_decap_fdb_location",
        fdb_at == "vxlan_xmit",
        None,
        &fdb_at,
    );
    evidence_checks(&mut checks, &run, &evidence, flagged, packets(line("rx")));
    let _ = std::fs::remove_dir_all(&evidence);
    checks.finish();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The evidence files of the probe check's run (`--capture-dir`): the
/// frames flagged `bad_inner_checksum` and the drops on vxlan.calico
/// attributed to B, as many as the drop lines counted; and every record
/// the programs sent handled, none lost or held back.
fn evidence_checks(
    checks: &mut Checks,
    run: &ObserverRun,
    dir: &std::path::Path,
    flagged: u64,
    dropped_in: u64,
) {
    use observer::{cmd::replay::capture, model::evidence::Tag, model::rows::Origin};
    use observer_testkit::pair::B_IP;
    let mut tags = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the evidence directory") {
        let path = entry.unwrap().path();
        let file = std::fs::File::open(&path).unwrap();
        for frame in capture::frames(file).unwrap() {
            let comment = frame.unwrap().comment.unwrap_or_default();
            tags.push(Tag::parse(&comment).expect("an observer comment"));
        }
    }
    let b = Some(B_IP.parse().unwrap());
    let bad_checksum = tags
        .iter()
        .filter(|t| t.reasons.iter().any(|r| r == "bad_inner_checksum") && t.peer == b)
        .count() as u64;
    checks.compare(
        "evidence_bad_inner_checksum",
        bad_checksum,
        flagged,
        "drop line",
    );
    let after_decap = tags
        .iter()
        .filter(|t| {
            t.origin == Origin::Kernel
                && t.interface == "vxlan.calico"
                && t.direction == observer_common::Direction::Rx
                && t.peer == b
        })
        .count() as u64;
    checks.compare(
        "evidence_after_decap_input",
        after_decap,
        dropped_in,
        "drop line",
    );
    let stats = &run.final_stats()["evidence"];
    let stat = |key: &str| stats[key].as_u64().unwrap_or(u64::MAX);
    checks.compare(
        "evidence_not_sent",
        stat("lost") + stat("rate_limited"),
        0,
        "nothing lost or held back",
    );
    checks.compare(
        "evidence_handled",
        stat("written") + stat("not_drops"),
        stat("sent"),
        "records sent",
    );
    checks.compare(
        "evidence_files",
        tags.len() as u64,
        stat("written"),
        "frames written",
    );
}

/// What A's TCP stack counted of two connections from A to B's pod
/// address through the overlay: one answered, one whose SYN-ACKs B drops.
struct Handshakes {
    /// SYNs A sent: connections opened (`Tcp:ActiveOpens`) and SYNs
    /// retransmitted (`TcpExt:TCPSynRetrans`).
    syns: u64,
    /// Whether the first connection was answered and the second not.
    answered: (bool, bool),
}

/// Two TCP connections from A to a listener on B's pod address
/// ([`observer_testkit::pair::Pair::calico`]'s overlay), the second after
/// B drops its SYN-ACKs.
fn tcp_handshakes(pair: &observer_testkit::pair::Pair) -> Handshakes {
    use support::pods::{connect_from, drop_syn_acks, listen_on_b_pod};
    let (a, b) = (&pair.a, &pair.b);
    let (_listener, addr) = listen_on_b_pod(b);
    let opened = |ns: &Netns| {
        calico::snmp_counter(ns, "Tcp", "ActiveOpens")
            + calico::snmp_counter(ns, "TcpExt", "TCPSynRetrans")
    };
    let before = opened(a);
    let first = connect_from(a, addr, Duration::from_secs(10));
    drop_syn_acks(b, "observer kernel suite: SYN-ACKs");
    // The first SYN and its retries at 1 and 3 s (1, 2, 3 s from 6.5 on).
    let second = connect_from(a, addr, Duration::from_millis(3500));
    Handshakes {
        syns: opened(a) - before,
        answered: (first, second),
    }
}

/// Five VXLAN SYNs with a wrong inner TCP checksum and three right ones
/// from B to A's pod address: what A's TCP stack then counted as checksum
/// errors (`Tcp:InCsumErrors`).
fn wrong_checksums_to_a(pair: &observer_testkit::pair::Pair) -> u64 {
    use observer_testkit::pair::NODE_A;
    use support::pods::{send_vxlan_from_b, syn_from_b_pod};
    let before = calico::snmp_counter(&pair.a, "Tcp", "InCsumErrors");
    send_vxlan_from_b(pair, &syn_from_b_pod(NODE_A.pod, true), 5);
    send_vxlan_from_b(pair, &syn_from_b_pod(NODE_A.pod, false), 3);
    calico::snmp_counter(&pair.a, "Tcp", "InCsumErrors") - before
}

/// The inner TCP signals of [`tcp_handshakes`] on A's underlay interface
/// `iface`: every SYN A's stack sent counted, one SYN-ACK, and
/// `tcp_syn_unanswered` raised.
fn tcp_checks(checks: &mut Checks, run: &ObserverRun, iface: &str, h: &Handshakes) {
    use observer_testkit::pair::B_IP;
    checks.holds(
        "tcp_answered_then_not",
        h.answered == (true, false),
        None,
        &format!("{:?}", h.answered),
    );
    let [syn_tx, ..] = support::pods::tcp_of(run, iface, "tx");
    let [_, syn_ack_rx, ..] = support::pods::tcp_of(run, iface, "rx");
    checks.compare(
        "tcp_syn_tx",
        syn_tx,
        h.syns,
        "Tcp:ActiveOpens + TcpExt:TCPSynRetrans",
    );
    checks.compare("tcp_syn_ack_rx", syn_ack_rx, 1, "connections answered");
    let raised = run.lines.iter().any(|l| {
        l["type"] == "anomaly"
            && l["state"] == "raised"
            && l["kind"] == "tcp_syn_unanswered"
            && l["peer"] == B_IP
    });
    checks.holds("tcp_syn_unanswered_raised", raised, None, "anomaly line");
}

/// The lab's incident, with the kernel's own tunl0 where the kernel has
/// IPIP: the same facts as tests/lab.rs.
#[test]
fn incident_lab_holds_on_this_kernel() {
    if !have_root("incident_lab_holds_on_this_kernel") {
        return;
    }
    // The pings' time counts from the first observer's attach (whose
    // timeout is scaled). In a VM the other observers attach up to tens of
    // seconds later (13 s on 6.12 in CI, verifying their programs beside
    // the first's), and their intervals come late: 40 s leaves enough pings
    // and drop_spike its full window of drops.
    let seconds = if kernel_suite::in_vm() { 40 } else { 8 };
    let (output, lines) = lab::run_lab("incident", Duration::from_secs(seconds));
    assert!(
        output.status.success(),
        "{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let start = lab::fact(&lines, "start", &[]);
    let ipip = start["ipip"].as_str().unwrap_or_default().to_string();
    let mut checks = Checks::default();
    checks.holds(
        "lab_tunl0",
        !kernel_suite::in_vm() || ipip == "kernel",
        None,
        &format!("tunl0: {ipip}"),
    );
    let facts = lab::incident_facts(&lines);
    for (name, observer, reference, kind) in &facts {
        checks.compare(name, *observer, *reference, kind);
    }
    checks.finish();
    lab::assert_incident(&lines);
}

/// The flow maps read by batch lookups (BPF_MAP_LOOKUP_BATCH, how
/// `attach` reads each map where the kernel has it for that map, else key
/// by key) hold exactly the rows the key-by-key walk reads: 3,000 VXLAN
/// peers put there by test runs, peer `i` sending `i % 5 + 1` frames. The
/// runs go through the program `replay --kernel` uses: tc ingress on
/// kernels where XDP test runs rewrite the XDP dispatcher (before 5.16),
/// where 9,000 of them beside the suite's XDP traffic locked 5.10 up.
#[test]
fn batch_lookups_read_what_the_walk_reads() {
    use observer::bpf::{Hook, LoadConfig, Observer, maps::MapRead, testrun};
    use support::frames::{icmp_eth_frame, vxlan_frame};
    if !have_root("batch_lookups_read_what_the_walk_reads") {
        return;
    }
    const PEERS: u32 = 3_000;
    let rx = observer::cmd::replay::kernel::receive_hook();
    let observer = Observer::load(&LoadConfig {
        max_flows: 2 * PEERS,
        defer_tc_ingress: rx == Hook::Xdp,
        ..LoadConfig::default()
    })
    .expect("loading the eBPF programs");
    let program = observer.program_fd(rx).expect("the receive program");
    let inner = icmp_eth_frame([192, 168, 0, 1].into(), [192, 168, 0, 2].into());
    let mut sent_packets = 0;
    for i in 0..PEERS {
        let peer = std::net::IpAddr::from((0x0a01_0000 + i).to_be_bytes());
        let frame = vxlan_frame(peer, [10, 0, 0, 1].into(), 42, &inner);
        for _ in 0..i % 5 + 1 {
            testrun::run(program, &frame, None, 1).expect("a test run");
            sent_packets += 1;
        }
    }
    let rows = |how| -> BTreeMap<_, (u64, u64)> {
        observer
            .read_flows_with(how)
            .unwrap_or_else(|e| panic!("{how:?}: {:#}", anyhow::Error::from(e)))
            .into_iter()
            .map(|(id, c)| (id, (c.packets, c.bytes)))
            .collect()
    };
    let (batch, walk) = (rows(MapRead::Batch), rows(MapRead::Walk));
    let packets = |rows: &BTreeMap<_, (u64, u64)>| rows.values().map(|c| c.0).sum::<u64>();
    let mut checks = Checks::default();
    checks.compare(
        "batch_rows",
        batch.len() as u64,
        u64::from(PEERS),
        "peers sent",
    );
    checks.compare("batch_packets", packets(&batch), sent_packets, "frames run");
    checks.compare("walk_packets", packets(&walk), sent_packets, "frames run");
    checks.holds(
        "batch_equals_walk",
        batch == walk,
        Some(batch.len() as u64),
        "every row and count",
    );
    checks.finish();
}

/// `observer replay`'s native classifier counts what this kernel's
/// programs count: random and mutated frames through both (a short run of
/// `tests/differential.rs`; these VMs emulate their CPU, so 3,000 frames).
/// Here the skb test run takes frames shorter than their IP header, which
/// newer kernels refuse, and before 5.18 XDP test runs are single-buffer.
#[test]
fn native_replay_counts_what_the_programs_count() {
    use support::differential::{Budget, fuzz};
    if !have_root("native_replay_counts_what_the_programs_count") {
        return;
    }
    const FRAMES: u64 = 3_000;
    let result = fuzz(0x5eed_0000_0000_0510, Budget::Frames(FRAMES));
    let mut checks = Checks::default();
    checks.holds(
        "native_equals_kernel",
        result.is_ok(),
        result.as_ref().ok().map(|a| a.frames),
        &result.map_or_else(|difference| difference, |a| format!("{} rows", a.rows)),
    );
    checks.finish();
}
