//! The data-plane reader against the real kernel: a namespace set up like
//! a Calico + flannel node (vxlan devices, routes, neighbours, FDB entries,
//! an IPv6 vxlan), read with `dataplane::read()` from inside it, and
//! compared field by field (its `vxlan_vnis()` are what the VNI check
//! writes into the programs). Also the change watcher.
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
    net::IpAddr,
    time::{Duration, Instant},
};

use ipnet::IpNet;
use observer::{
    model::dataplane::{
        DataPlane, ExpectedPeer, FdbEntry, MacAddr, PeerRoute, TunnelDevice, TunnelRoute,
        UnderlayInterface,
    },
    node::{dataplane, dataplane::ChangeWatcher},
};
use observer_common::Proto;
use support::netns::{Netns, VethEnd, try_run, veth_pair};

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
