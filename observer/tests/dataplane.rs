//! The data-plane reader against the real kernel: a namespace set up like
//! a Calico + flannel node (vxlan devices, routes, neighbours, FDB entries,
//! an IPv6 vxlan), read with `dataplane::read()` from inside it, and
//! compared field by field (its `vxlan_vnis()` are what the VNI check
//! writes into the programs). Also the change watcher, and the view kept
//! current by it (`LiveView`) through a route storm that overruns it.
//!
//! Topology:
//!
//! ```text
//!   ns A (the node)                              ns B (the wire)
//!   va 198.18.0.1/24 2001:db8:1::1/64 mtu 1600 <-veth-> vb 198.18.0.2/24
//!   vc 198.18.1.1/24                            <-veth-> vd 198.18.1.2/24
//!   vxlan.calico  vni 4096 port 4789 local 198.18.0.1 dev va mtu 1450
//!   flannel.1     vni 1    port 8472 local 198.18.0.1 dev va mtu 1450
//!   vxlan.v6      vni 4096 port 4789 local 2001:db8:1::1 dev va mtu 1430
//! ```
//!
//! Peer nodes: 198.18.0.2 (Calico, three blocks, one in table 100),
//! 198.18.0.4 (flannel), 198.18.0.5 (flannel default remote, routed via
//! vc), 2001:db8:1::2 (IPv6 vxlan). 10.42.3.0/26 has a neighbour but no
//! FDB entry: unresolved. This kernel has no ipip/geneve devices; when it
//! has, `ipip0` (198.18.0.3) and `gnv0` (remote 198.18.0.6) are added and
//! checked too.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Debug,
    io::Write,
    net::IpAddr,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use ipnet::IpNet;
use observer::{
    model::dataplane::{
        DataPlane, ExpectedPeer, FdbEntry, MacAddr, PeerRoute, TunnelDevice, TunnelRoute,
        UnderlayInterface,
    },
    node::{
        dataplane,
        dataplane::{ChangeWatcher, LiveView},
    },
};
use observer_common::Proto;
use support::netns::{Netns, VethEnd, in_netns, try_run, veth_pair};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

const CALICO_VTEP: MacAddr = MacAddr([0x66, 0, 0, 0, 0, 0x01]);
const NO_FDB_VTEP: MacAddr = MacAddr([0x66, 0, 0, 0, 0, 0x03]);
const FLANNEL_VTEP: MacAddr = MacAddr([0x66, 0, 0, 0, 0, 0xf1]);
const V6_VTEP: MacAddr = MacAddr([0x66, 0, 0, 0, 0, 0x06]);

/// Runs `ip -n NS args`; whether it succeeded (for device kinds this
/// kernel may lack).
fn try_ip(ns: &Netns, args: &[&str]) -> bool {
    let mut all = vec!["-n", ns.name()];
    all.extend_from_slice(args);
    try_run("ip", &all).status.success()
}

/// The node namespace (and its wire namespace); whether ipip0 and gnv0
/// could be created.
fn node() -> (Netns, Netns, bool, bool) {
    let a = Netns::new("dp");
    let b = Netns::new("dpb");
    // IPv6 on for the IPv6 vxlan, without link-local addresses (their
    // interface identifiers would be random) and without DAD.
    a.exec_ok(&[
        "sysctl",
        "-qw",
        "net.ipv6.conf.default.addr_gen_mode=1",
        "net.ipv6.conf.all.addr_gen_mode=1",
        "net.ipv6.conf.all.disable_ipv6=0",
        "net.ipv6.conf.default.disable_ipv6=0",
    ]);
    veth_pair(
        &a,
        &VethEnd::new("va", "02:00:00:00:00:0a", "198.18.0.1"),
        &b,
        &VethEnd::new("vb", "02:00:00:00:00:0b", "198.18.0.2"),
        24,
    );
    veth_pair(
        &a,
        &VethEnd::new("vc", "02:00:00:00:00:0c", "198.18.1.1"),
        &b,
        &VethEnd::new("vd", "02:00:00:00:00:0d", "198.18.1.2"),
        24,
    );
    a.ip(&["link", "set", "va", "mtu", "1600"]);
    a.ip(&["addr", "add", "2001:db8:1::1/64", "dev", "va", "nodad"]);

    // Calico: vxlan.calico with its /32 address, blocks of node .2, a block
    // whose VTEP has no FDB entry, a block in another table.
    a.ip(&[
        "link",
        "add",
        "vxlan.calico",
        "mtu",
        "1450",
        "type",
        "vxlan",
        "id",
        "4096",
        "dstport",
        "4789",
        "local",
        "198.18.0.1",
        "dev",
        "va",
        "nolearning",
    ]);
    a.ip(&["link", "set", "vxlan.calico", "up"]);
    a.ip(&["addr", "add", "10.42.0.0/32", "dev", "vxlan.calico"]);
    let onlink = |dst: &str, via: &str, dev: &str, extra: &[&str]| {
        let mut args = vec!["route", "add", dst, "via", via, "dev", dev, "onlink"];
        args.extend_from_slice(extra);
        a.ip(&args);
    };
    onlink("10.42.1.0/26", "10.42.1.0", "vxlan.calico", &[]);
    onlink(
        "10.42.1.64/26",
        "10.42.1.0",
        "vxlan.calico",
        &["mtu", "1400"],
    );
    onlink(
        "10.42.5.0/26",
        "10.42.1.0",
        "vxlan.calico",
        &["table", "100"],
    );
    onlink("10.42.3.0/26", "10.42.3.0", "vxlan.calico", &[]);
    a.neigh("10.42.1.0", &CALICO_VTEP.to_string(), "vxlan.calico");
    a.neigh("10.42.3.0", &NO_FDB_VTEP.to_string(), "vxlan.calico");
    let fdb = |mac: MacAddr, dev: &str, dst: &str| {
        a.bridge(&[
            "fdb",
            "append",
            &mac.to_string(),
            "dev",
            dev,
            "dst",
            dst,
            "self",
            "permanent",
        ]);
    };
    fdb(CALICO_VTEP, "vxlan.calico", "198.18.0.2");

    // Flannel: flannel.1, a /24 of node .4 and a default remote .5 that is
    // reached through vc.
    a.ip(&[
        "link",
        "add",
        "flannel.1",
        "mtu",
        "1450",
        "type",
        "vxlan",
        "id",
        "1",
        "dstport",
        "8472",
        "local",
        "198.18.0.1",
        "dev",
        "va",
        "nolearning",
    ]);
    a.ip(&["link", "set", "flannel.1", "up"]);
    onlink("10.244.1.0/24", "10.244.1.0", "flannel.1", &[]);
    a.neigh("10.244.1.0", &FLANNEL_VTEP.to_string(), "flannel.1");
    fdb(FLANNEL_VTEP, "flannel.1", "198.18.0.4");
    fdb(MacAddr::ZERO, "flannel.1", "198.18.0.5");
    a.ip(&[
        "route",
        "add",
        "198.18.0.5/32",
        "via",
        "198.18.1.2",
        "dev",
        "vc",
    ]);

    // IPv6: same VNI and port as vxlan.calico (another socket family).
    a.ip(&[
        "link",
        "add",
        "vxlan.v6",
        "mtu",
        "1430",
        "type",
        "vxlan",
        "id",
        "4096",
        "dstport",
        "4789",
        "local",
        "2001:db8:1::1",
        "dev",
        "va",
        "nolearning",
    ]);
    a.ip(&["link", "set", "vxlan.v6", "up"]);
    onlink("fd42:1::/122", "fd42:1::", "vxlan.v6", &[]);
    a.neigh("fd42:1::", &V6_VTEP.to_string(), "vxlan.v6");
    fdb(V6_VTEP, "vxlan.v6", "2001:db8:1::2");

    // Kernels with the modules: Calico's IPIP and a Geneve device.
    let ipip = try_ip(
        &a,
        &[
            "link",
            "add",
            "ipip0",
            "type",
            "ipip",
            "local",
            "198.18.0.1",
            "dev",
            "va",
        ],
    );
    if ipip {
        a.ip(&["link", "set", "ipip0", "mtu", "1480", "up"]);
        onlink("10.42.2.0/26", "198.18.0.3", "ipip0", &[]);
    }
    let geneve = try_ip(
        &a,
        &[
            "link",
            "add",
            "gnv0",
            "mtu",
            "1400",
            "type",
            "geneve",
            "id",
            "77",
            "remote",
            "198.18.0.6",
        ],
    );
    if geneve {
        a.ip(&["link", "set", "gnv0", "up"]);
    }
    (a, b, ipip, geneve)
}

fn ifindex(view: &DataPlane, name: &str) -> u32 {
    view.links
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no link {name} in {:?}", view.links))
        .ifindex
}

#[test]
fn reads_the_node_data_plane_exactly() {
    if !support::have_root("reads_the_node_data_plane_exactly") {
        return;
    }
    let (a, _b, ipip, geneve) = node();
    let view = a.run(|| dataplane::read().unwrap());
    let va = ifindex(&view, "va");
    let vc = ifindex(&view, "vc");

    // Links: exactly ours (plus the fallback devices of tunnel modules,
    // which a kernel with them creates in every namespace).
    let mut ours = vec!["lo", "va", "vc", "vxlan.calico", "flannel.1", "vxlan.v6"];
    ours.extend(ipip.then_some("ipip0"));
    ours.extend(geneve.then_some("gnv0"));
    let fallback = [
        "tunl0", "sit0", "ip6tnl0", "gre0", "gretap0", "erspan0", "ip6gre0",
    ];
    for link in &view.links {
        assert!(
            ours.contains(&link.name.as_str()) || fallback.contains(&link.name.as_str()),
            "unexpected link {link:?}"
        );
    }
    assert_eq!(
        view.links.len()
            - view
                .links
                .iter()
                .filter(|l| fallback.contains(&l.name.as_str()))
                .count(),
        ours.len()
    );
    let va_link = view.links.iter().find(|l| l.name == "va").unwrap();
    assert_eq!(
        (va_link.mtu, va_link.kind.as_deref(), va_link.up),
        (1600, Some("veth"), true)
    );

    // Tunnel devices, field by field.
    let vxlan = |name: &str, vni, port, local: &str, mtu| TunnelDevice {
        name: name.into(),
        ifindex: ifindex(&view, name),
        proto: Proto::Vxlan,
        kind: "vxlan".into(),
        vni: Some(vni),
        key: None,
        port: Some(port),
        local: Some(ip(local)),
        remote: None,
        lower: Some(va),
        mtu,
        up: true,
    };
    let mut devices = vec![
        vxlan("vxlan.calico", 4096, 4789, "198.18.0.1", 1450),
        vxlan("flannel.1", 1, 8472, "198.18.0.1", 1450),
        vxlan("vxlan.v6", 4096, 4789, "2001:db8:1::1", 1430),
    ];
    if ipip {
        devices.push(TunnelDevice {
            name: "ipip0".into(),
            ifindex: ifindex(&view, "ipip0"),
            proto: Proto::Ipip,
            kind: "ipip".into(),
            vni: None,
            key: None,
            port: None,
            local: Some(ip("198.18.0.1")),
            remote: None,
            lower: Some(va),
            mtu: 1480,
            up: true,
        });
    }
    if geneve {
        devices.push(TunnelDevice {
            name: "gnv0".into(),
            ifindex: ifindex(&view, "gnv0"),
            proto: Proto::Geneve,
            kind: "geneve".into(),
            vni: Some(77),
            key: None,
            port: Some(6081),
            local: None,
            remote: Some(ip("198.18.0.6")),
            lower: None,
            mtu: 1400,
            up: true,
        });
    }
    devices.sort_by_key(|d| d.ifindex);
    let found: Vec<TunnelDevice> = view
        .devices
        .iter()
        .filter(|d| !fallback.contains(&d.name.as_str()))
        .cloned()
        .collect();
    assert_eq!(found, devices);

    // Routes through tunnels: all tables, IPv4 and IPv6, without the
    // kernel's connected and link-local routes.
    let route = |dst: &str, dev: &str, gw: &str, mtu, table, mac, node: Option<&str>| TunnelRoute {
        dst: net(dst),
        device: dev.into(),
        ifindex: ifindex(&view, dev),
        proto: if dev == "ipip0" {
            Proto::Ipip
        } else {
            Proto::Vxlan
        },
        gateway: Some(ip(gw)),
        mtu,
        table,
        vtep_mac: mac,
        node: node.map(ip),
    };
    let mut routes = vec![
        route(
            "10.42.1.0/26",
            "vxlan.calico",
            "10.42.1.0",
            None,
            254,
            Some(CALICO_VTEP),
            Some("198.18.0.2"),
        ),
        route(
            "10.42.1.64/26",
            "vxlan.calico",
            "10.42.1.0",
            Some(1400),
            254,
            Some(CALICO_VTEP),
            Some("198.18.0.2"),
        ),
        route(
            "10.42.3.0/26",
            "vxlan.calico",
            "10.42.3.0",
            None,
            254,
            Some(NO_FDB_VTEP),
            None,
        ),
        route(
            "10.42.5.0/26",
            "vxlan.calico",
            "10.42.1.0",
            None,
            100,
            Some(CALICO_VTEP),
            Some("198.18.0.2"),
        ),
        route(
            "10.244.1.0/24",
            "flannel.1",
            "10.244.1.0",
            None,
            254,
            Some(FLANNEL_VTEP),
            Some("198.18.0.4"),
        ),
        route(
            "fd42:1::/122",
            "vxlan.v6",
            "fd42:1::",
            None,
            254,
            Some(V6_VTEP),
            Some("2001:db8:1::2"),
        ),
    ];
    if ipip {
        routes.push(route(
            "10.42.2.0/26",
            "ipip0",
            "198.18.0.3",
            None,
            254,
            None,
            Some("198.18.0.3"),
        ));
    }
    routes.sort_by_key(|r| r.dst);
    let mut found = view.routes.clone();
    found.sort_by_key(|r| r.dst);
    assert_eq!(found, routes);
    assert_eq!(
        view.unresolved_routes()
            .iter()
            .map(|r| r.dst)
            .collect::<Vec<_>>(),
        vec![net("10.42.3.0/26")]
    );

    // FDB entries with a remote, vxlan devices only (not va's multicast
    // entries).
    let entry = |dev: &str, mac, dst: &str| FdbEntry {
        device: dev.into(),
        ifindex: ifindex(&view, dev),
        mac,
        dst: ip(dst),
        vni: None,
        port: None,
    };
    let mut fdb = vec![
        entry("vxlan.calico", CALICO_VTEP, "198.18.0.2"),
        entry("flannel.1", FLANNEL_VTEP, "198.18.0.4"),
        entry("flannel.1", MacAddr::ZERO, "198.18.0.5"),
        entry("vxlan.v6", V6_VTEP, "2001:db8:1::2"),
    ];
    let key = |e: &FdbEntry| (e.ifindex, e.mac, e.dst);
    fdb.sort_by_key(key);
    let mut found = view.fdb.clone();
    found.sort_by_key(key);
    assert_eq!(found, fdb);

    // Expected peers.
    let peer = |blocks: &[&str], encaps: &[Proto], devices: &[&str], route_mtu| ExpectedPeer {
        blocks: blocks.iter().map(|b| net(b)).collect(),
        encaps: encaps.iter().copied().collect(),
        devices: devices.iter().map(|d| d.to_string()).collect(),
        route_mtu,
    };
    let mut peers = BTreeMap::from([
        (
            ip("198.18.0.2"),
            peer(
                &["10.42.1.0/26", "10.42.1.64/26", "10.42.5.0/26"],
                &[Proto::Vxlan],
                &["vxlan.calico"],
                Some(1400),
            ),
        ),
        (
            ip("198.18.0.4"),
            peer(&["10.244.1.0/24"], &[Proto::Vxlan], &["flannel.1"], None),
        ),
        (
            ip("198.18.0.5"),
            peer(&[], &[Proto::Vxlan], &["flannel.1"], None),
        ),
        (
            ip("2001:db8:1::2"),
            peer(&["fd42:1::/122"], &[Proto::Vxlan], &["vxlan.v6"], None),
        ),
    ]);
    if ipip {
        peers.insert(
            ip("198.18.0.3"),
            peer(&["10.42.2.0/26"], &[Proto::Ipip], &["ipip0"], None),
        );
    }
    if geneve {
        peers.insert(
            ip("198.18.0.6"),
            peer(&[], &[Proto::Geneve], &["gnv0"], None),
        );
    }
    assert_eq!(view.expected_peers(), peers);

    // Which node owns an inner address.
    for (addr, node) in [
        ("10.42.1.5", Some("198.18.0.2")),
        ("10.42.1.100", Some("198.18.0.2")),
        ("10.42.5.63", Some("198.18.0.2")),
        ("10.42.3.7", None),
        ("10.244.1.200", Some("198.18.0.4")),
        ("fd42:1::3f", Some("2001:db8:1::2")),
        ("fd42:1::40", None),
        ("10.42.9.9", None),
        ("198.18.0.2", None),
    ] {
        assert_eq!(view.node_owning(ip(addr)), node.map(ip), "{addr}");
    }

    // The kernel's route to each peer, and the underlay: va (lower device
    // of every tunnel) and vc (the route to the default remote .5).
    let via_va = |node: &str| PeerRoute {
        node: ip(node),
        ifindex: va,
        gateway: None,
    };
    let mut peer_routes = vec![
        via_va("198.18.0.2"),
        via_va("198.18.0.4"),
        PeerRoute {
            node: ip("198.18.0.5"),
            ifindex: vc,
            gateway: Some(ip("198.18.1.2")),
        },
        via_va("2001:db8:1::2"),
    ];
    if ipip {
        peer_routes.push(via_va("198.18.0.3"));
    }
    if geneve {
        peer_routes.push(via_va("198.18.0.6"));
    }
    peer_routes.sort_by_key(|r| r.node);
    assert_eq!(view.peer_routes, peer_routes);
    assert_eq!(
        view.underlay,
        vec![
            UnderlayInterface {
                name: "va".into(),
                ifindex: va,
                mtu: 1600
            },
            UnderlayInterface {
                name: "vc".into(),
                ifindex: vc,
                mtu: 1500
            },
        ]
    );

    assert_eq!(
        view.local_addresses(),
        BTreeSet::from([
            ip("127.0.0.1"),
            ip("::1"),
            ip("198.18.0.1"),
            ip("198.18.1.1"),
            ip("2001:db8:1::1"),
            ip("10.42.0.0"),
        ])
    );
    assert_eq!(view.vxlan_vnis(), vec![1, 4096]);
}

#[test]
fn vxlan_vnis_of_a_namespace_without_vxlan_is_empty() {
    if !support::have_root("vxlan_vnis_of_a_namespace_without_vxlan_is_empty") {
        return;
    }
    let ns = Netns::new("dpe");
    let view = ns.run(|| dataplane::read().unwrap());
    assert_eq!(view.vxlan_vnis(), Vec::<u32>::new());
    assert!(view.routes.is_empty() && view.fdb.is_empty() && view.underlay.is_empty());
    assert!(view.expected_peers().is_empty());
}

/// Polls `take_changed` for up to 2 s.
fn changed_within(watcher: &ChangeWatcher) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if watcher.take_changed() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn change_watcher_sees_links_addresses_routes_and_neighbours() {
    if !support::have_root("change_watcher_sees_links_addresses_routes_and_neighbours") {
        return;
    }
    let ns = Netns::new("dpw");
    ns.ip(&["link", "add", "w0", "type", "veth", "peer", "name", "w1"]);
    let watcher = ns.run(|| ChangeWatcher::new().unwrap());
    assert!(watcher.take_changed(), "the first call reports a change");
    let changes: [(&str, &[&str]); 5] = [
        ("MTU", &["link", "set", "w0", "mtu", "1400"]),
        ("link up", &["link", "set", "w0", "up"]),
        ("address", &["addr", "add", "198.18.7.1/24", "dev", "w0"]),
        (
            "route",
            &["route", "add", "198.18.8.0/24", "via", "198.18.7.2"],
        ),
        (
            "neighbour",
            &[
                "neigh",
                "add",
                "198.18.7.3",
                "lladdr",
                "02:00:00:00:00:73",
                "dev",
                "w0",
                "nud",
                "permanent",
            ],
        ),
    ];
    for (what, args) in changes {
        // Let the notifications of the previous change arrive, then nothing
        // more happens in this namespace until the next change.
        std::thread::sleep(Duration::from_millis(100));
        watcher.take_changed();
        assert!(
            !watcher.take_changed(),
            "no change before the {what} change"
        );
        ns.ip(args);
        assert!(changed_within(&watcher), "the {what} change was not seen");
    }
    // A change in another namespace is not seen.
    std::thread::sleep(Duration::from_millis(100));
    watcher.take_changed();
    let other = Netns::new("dpo");
    other.ip(&["link", "set", "lo", "mtu", "1500"]);
    std::thread::sleep(Duration::from_millis(200));
    assert!(!watcher.take_changed(), "a change in another namespace");
    // Dropping ends the thread at once.
    let start = Instant::now();
    drop(watcher);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

/// Routes added in the storm: `10.60.x.y/32`, one per index.
const STORM_ROUTES: u32 = 6000;
/// Neighbour and FDB entries added in the storm (each).
const STORM_ENTRIES: u32 = 1500;

/// The `i`th address of the overlay block `10.<block>.0.0/16`.
fn storm_addr(block: u8, i: u32) -> String {
    format!("10.{block}.{}.{}", i / 256, i % 256)
}

/// The `i`th MAC of family `family`: `66:00:00:<family>:<i>`.
fn storm_mac(family: u8, i: u32) -> MacAddr {
    let [.., high, low] = i.to_be_bytes();
    MacAddr([0x66, 0, 0, family, high, low])
}

/// The storm as (`ip` commands, `bridge` commands): every route, neighbour
/// and FDB entry added, then three of four removed again, and half of the
/// remaining routes moved to a gateway without an FDB entry (unresolved).
/// What is left: routes `i % 4 == 0` (`i % 8 == 0` via 10.42.3.0, the
/// others via 10.42.1.0), neighbours and FDB entries `j % 4 == 0`.
fn storm_commands() -> (String, String) {
    let mut ip = String::new();
    let mut bridge = String::new();
    let route = |verb: &str, i: u32, via: &str| {
        format!(
            "route {verb} {}/32 via {via} dev vxlan.calico onlink\n",
            storm_addr(60, i)
        )
    };
    for i in 0..STORM_ROUTES {
        ip += &route("add", i, "10.42.1.0");
    }
    for j in 0..STORM_ENTRIES {
        ip += &format!(
            "neigh add {} lladdr {} dev vxlan.calico nud permanent\n",
            storm_addr(61, j),
            storm_mac(1, j)
        );
        bridge += &format!(
            "fdb add {} dev vxlan.calico dst 198.18.0.2 self permanent\n",
            storm_mac(2, j)
        );
    }
    for i in 0..STORM_ROUTES {
        match (i % 4, i % 8) {
            (0, 0) => ip += &route("replace", i, "10.42.3.0"),
            (0, _) => {}
            _ => ip += &route("del", i, "10.42.1.0"),
        }
    }
    for j in (0..STORM_ENTRIES).filter(|j| j % 4 != 0) {
        ip += &format!("neigh del {} dev vxlan.calico\n", storm_addr(61, j));
        bridge += &format!(
            "fdb del {} dev vxlan.calico dst 198.18.0.2 self\n",
            storm_mac(2, j)
        );
    }
    (ip, bridge)
}

/// Runs `tool -n NS -batch -` on `commands`, as fast as the tool goes.
fn batch(ns: &Netns, tool: &str, commands: &str) {
    let mut child = Command::new(tool)
        .args(["-n", ns.name(), "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {tool}: {e}"));
    // Written then closed, so that the tool ends at the end of the script.
    let written = child.stdin.take().unwrap().write_all(commands.as_bytes());
    let output = child.wait_with_output().expect("waiting for the batch");
    written.unwrap_or_else(|e| panic!("writing the {tool} batch: {e}"));
    assert!(
        output.status.success(),
        "{tool} -batch failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `live` equals `fresh`, field by field (naming the first difference),
/// then as a whole (for fields added later).
fn assert_same_view(live: &DataPlane, fresh: &DataPlane) {
    fn same<T: PartialEq + Debug>(what: &str, live: &[T], fresh: &[T]) {
        assert_eq!(
            live.len(),
            fresh.len(),
            "{what}: {} in the live view, {} in a fresh dump",
            live.len(),
            fresh.len()
        );
        if let Some(i) = (0..live.len()).find(|&i| live[i] != fresh[i]) {
            panic!(
                "{what}[{i}]: {:?} in the live view, {:?} in a fresh dump",
                live[i], fresh[i]
            );
        }
    }
    same("links", &live.links, &fresh.links);
    same("addresses", &live.addresses, &fresh.addresses);
    same("devices", &live.devices, &fresh.devices);
    same("routes", &live.routes, &fresh.routes);
    same("neighbours", &live.neighbours, &fresh.neighbours);
    same("fdb", &live.fdb, &fresh.fdb);
    same("peer_routes", &live.peer_routes, &fresh.peer_routes);
    same("underlay", &live.underlay, &fresh.underlay);
    same("blocks", &live.blocks, &fresh.blocks);
    assert!(live == fresh, "the live view differs from a fresh dump");
}

/// Raises its flag when dropped, also while a failing test unwinds, so
/// that the refresh loop ends.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// What the live view's refresh loop ends with.
struct Followed {
    view: DataPlane,
    overruns: u64,
    refreshes: u64,
}

/// A flapping BGP session's worth of churn, as fast as `ip -batch` and
/// `bridge -batch` go (thousands of routes, neighbour and FDB entries added
/// and removed on vxlan.calico) while the monitor's `LiveView` refreshes
/// every 10 ms, its notification socket at the kernel's smallest receive
/// buffer so that the storm overruns it. The overrun is counted, and once
/// the storm is over the view equals a fresh dump exactly and holds the
/// storm's end state.
#[test]
fn a_route_storm_overruns_the_watcher_and_the_live_view_ends_exact() {
    if !support::have_root("a_route_storm_overruns_the_watcher_and_the_live_view_ends_exact") {
        return;
    }
    let (a, _b, _, _) = node();
    let before = a.run(|| dataplane::read().unwrap());
    let (ip_commands, bridge_commands) = storm_commands();

    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let follower = {
        let (name, stop) = (a.name().to_string(), stop.clone());
        std::thread::spawn(move || {
            in_netns(&name, move || {
                // 0: the kernel raises it to its minimum, a few messages.
                let mut live = LiveView::new(Vec::new(), ChangeWatcher::with_receive_buffer(0));
                let mut refreshes = 0;
                live.refresh();
                ready_tx.send(()).unwrap();
                // After the stop, one more refresh: the monitor's next
                // interval after the storm. Whether it reads again is the
                // watcher's call, as in the monitor.
                loop {
                    let last = stop.load(Ordering::Acquire);
                    std::thread::sleep(Duration::from_millis(10));
                    live.refresh();
                    refreshes += 1;
                    if last {
                        break;
                    }
                }
                Followed {
                    view: live.view().expect("the live view was never read").clone(),
                    overruns: live.overruns(),
                    refreshes,
                }
            })
        })
    };
    let stop = StopOnDrop(stop);
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the live view did not start");

    let started = Instant::now();
    std::thread::scope(|scope| {
        scope.spawn(|| batch(&a, "ip", &ip_commands));
        scope.spawn(|| batch(&a, "bridge", &bridge_commands));
    });
    let storm = started.elapsed();
    // The notifications still queued are read within microseconds.
    std::thread::sleep(Duration::from_millis(100));
    drop(stop);
    let followed = follower
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    let fresh = a.run(|| dataplane::read().unwrap());
    eprintln!(
        "storm of {} ip and {} bridge commands in {storm:?}: {} overruns, {} refreshes",
        ip_commands.lines().count(),
        bridge_commands.lines().count(),
        followed.overruns,
        followed.refreshes
    );

    assert!(
        followed.overruns > 0,
        "the storm did not overrun the watcher's socket: the overrun path was not exercised"
    );
    assert_same_view(&followed.view, &fresh);

    // The storm's end state, exactly: every route, neighbour and FDB entry
    // of the view before, plus those the storm left.
    let storm_block = net("10.60.0.0/16");
    let storm_routes: Vec<&TunnelRoute> = fresh
        .routes
        .iter()
        .filter(|r| storm_block.contains(&r.dst))
        .collect();
    let expected: BTreeSet<(IpNet, IpAddr, Option<IpAddr>)> = (0..STORM_ROUTES)
        .filter(|i| i % 4 == 0)
        .map(|i| {
            let (via, node) = if i % 8 == 0 {
                ("10.42.3.0", None)
            } else {
                ("10.42.1.0", Some(ip("198.18.0.2")))
            };
            (net(&format!("{}/32", storm_addr(60, i))), ip(via), node)
        })
        .collect();
    assert_eq!(storm_routes.len(), expected.len(), "one route per prefix");
    let got: BTreeSet<(IpNet, IpAddr, Option<IpAddr>)> = storm_routes
        .iter()
        .map(|r| (r.dst, r.gateway.unwrap(), r.node))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(
        fresh.routes.len(),
        before.routes.len() + expected.len(),
        "the routes from before the storm are all there"
    );

    let storm_neighbours: BTreeSet<(IpAddr, MacAddr)> = fresh
        .neighbours
        .iter()
        .filter(|n| net("10.61.0.0/16").contains(&n.addr))
        .map(|n| (n.addr, n.mac.unwrap()))
        .collect();
    let storm_fdb: BTreeSet<MacAddr> = fresh
        .fdb
        .iter()
        .filter(|f| f.mac.0[..4] == [0x66, 0, 0, 2])
        .map(|f| {
            assert_eq!(f.dst, ip("198.18.0.2"), "{f:?}");
            f.mac
        })
        .collect();
    let left: Vec<u32> = (0..STORM_ENTRIES).filter(|j| j % 4 == 0).collect();
    assert_eq!(
        storm_neighbours,
        left.iter()
            .map(|&j| (ip(&storm_addr(61, j)), storm_mac(1, j)))
            .collect()
    );
    assert_eq!(storm_fdb, left.iter().map(|&j| storm_mac(2, j)).collect());
    assert_eq!(fresh.neighbours.len(), before.neighbours.len() + left.len());
    assert_eq!(fresh.fdb.len(), before.fdb.len() + left.len());
}
