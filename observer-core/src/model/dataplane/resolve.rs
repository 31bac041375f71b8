//! Pure functions over dumped records: which route leads to which node,
//! which node owns an address, which interfaces are the underlay. Kept
//! apart from the netlink code so that they are tested on hand-built input.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
};

use observer_common::Proto;

use super::{
    Address, BlockRoute, ExpectedPeer, FdbEntry, Link, MAIN_TABLE, MacAddr, Neighbour, NextHop,
    PeerRoute, Route, TunnelDevice, TunnelRoute, UnderlayInterface,
};

/// rtm_protocol of the routes BIRD installs.
const ORIGIN_BIRD: u8 = 12;
/// rtm_protocol of the routes Felix installs (its VXLAN routes, and in
/// CrossSubnet mode the direct ones to nodes of its own subnet).
const ORIGIN_FELIX: u8 = 80;

/// VNIs of the vxlan devices, sorted and deduplicated.
pub(super) fn vxlan_vnis(devices: &[TunnelDevice]) -> Vec<u32> {
    let vnis: BTreeSet<u32> = devices
        .iter()
        .filter(|d| d.proto == Proto::Vxlan)
        .filter_map(|d| d.vni)
        .collect();
    vnis.into_iter().collect()
}

/// The routes whose output device is a tunnel device, each with the peer
/// node it leads to.
pub(super) fn tunnel_routes(
    devices: &[TunnelDevice],
    routes: &[Route],
    neighbours: &[Neighbour],
    fdb: &[FdbEntry],
) -> Vec<TunnelRoute> {
    routes
        .iter()
        .filter_map(|route| {
            let device = devices.iter().find(|d| d.ifindex == route.ifindex)?;
            let (vtep_mac, node) = route_node(device, route.gateway, neighbours, fdb);
            Some(TunnelRoute {
                dst: route.dst,
                device: device.name.clone(),
                ifindex: device.ifindex,
                proto: device.proto,
                gateway: route.gateway,
                mtu: route.mtu,
                table: route.table,
                vtep_mac,
                node,
            })
        })
        .collect()
}

/// The routes of pod blocks in the main table, by block: blackholes
/// (Calico's for the blocks this node owns), routes BIRD or Felix
/// installed, and routes through tunnel devices; not default or host routes, which are
/// no blocks. Each next hop with the node it leads to: the tunnel route's
/// resolved peer, or the gateway of a direct route.
pub(super) fn blocks(
    links: &[Link],
    routes: &[Route],
    tunnel_routes: &[TunnelRoute],
) -> Vec<BlockRoute> {
    // Indexed, not searched per route: a node has thousands of routes, and
    // a route storm re-reads them every interval.
    let mut by_route: HashMap<(ipnet::IpNet, u32, u32), &TunnelRoute> = HashMap::new();
    for tunnel in tunnel_routes {
        by_route
            .entry((tunnel.dst, tunnel.ifindex, tunnel.table))
            .or_insert(tunnel);
    }
    let mut blocks: BTreeMap<ipnet::IpNet, BlockRoute> = BTreeMap::new();
    for route in routes {
        let host_len = route.dst.max_prefix_len();
        let through_tunnel = by_route
            .get(&(route.dst, route.ifindex, route.table))
            .copied();
        if route.table != MAIN_TABLE
            || route.dst.prefix_len() == 0
            || route.dst.prefix_len() == host_len
            || !(route.blackhole
                || route.origin == ORIGIN_BIRD
                || route.origin == ORIGIN_FELIX
                || through_tunnel.is_some())
        {
            continue;
        }
        let block = blocks.entry(route.dst).or_insert_with(|| BlockRoute {
            block: route.dst,
            origin: route.origin,
            blackhole: false,
            next_hops: Vec::new(),
        });
        if route.blackhole {
            block.blackhole = true;
            continue;
        }
        let device = links
            .iter()
            .find(|l| l.ifindex == route.ifindex)
            .map_or_else(|| route.ifindex.to_string(), |l| l.name.clone());
        block.next_hops.push(NextHop {
            device,
            gateway: route.gateway,
            encap: through_tunnel.map(|t| t.proto),
            node: match through_tunnel {
                Some(tunnel) => tunnel.node,
                None => route.gateway,
            },
        });
    }
    blocks.into_values().collect()
}

/// (remote VTEP MAC, peer node) of a route through `device` via `gateway`.
fn route_node(
    device: &TunnelDevice,
    gateway: Option<IpAddr>,
    neighbours: &[Neighbour],
    fdb: &[FdbEntry],
) -> (Option<MacAddr>, Option<IpAddr>) {
    match device.kind.as_str() {
        // The gateway is the remote VTEP's overlay address: its neighbour
        // entry gives the VTEP MAC, the FDB entry for that MAC the node.
        // No fallback to the default (all-zero) remotes: a route that needs
        // the flood entries is a finding, not a peer.
        "vxlan" => {
            let Some(gateway) = gateway else {
                return (None, None);
            };
            let mac = neighbours
                .iter()
                .find(|n| n.ifindex == device.ifindex && n.addr == gateway)
                .and_then(|n| n.mac);
            let node = mac.and_then(|mac| {
                fdb.iter()
                    .find(|e| e.ifindex == device.ifindex && e.mac == mac)
                    .map(|e| e.dst)
            });
            (mac, node)
        }
        // Layer-2 tunnels: the gateway is an overlay address; only a fixed
        // remote names the node.
        "geneve" | "gretap" | "ip6gretap" | "erspan" | "ip6erspan" => (None, device.remote),
        // WireGuard peers' endpoints are in its generic netlink family, not
        // in rtnetlink: the node is unknown here.
        "wireguard" => (None, None),
        // Layer-3 tunnels (ipip, ip6tnl, sit, gre, ip6gre): a point-to-point
        // device sends everything to its remote; an NBMA one (Calico's
        // `tunl0`, remote any) to the route's on-link gateway.
        _ => (None, device.remote.or(gateway)),
    }
}

/// Peer nodes by underlay address: the nodes of the tunnel routes, the
/// default (all-zero MAC) vxlan FDB remotes and fixed tunnel remotes.
pub(super) fn expected_peers(
    devices: &[TunnelDevice],
    routes: &[TunnelRoute],
    fdb: &[FdbEntry],
) -> BTreeMap<IpAddr, ExpectedPeer> {
    let mut peers: BTreeMap<IpAddr, ExpectedPeer> = BTreeMap::new();
    for route in routes {
        let Some(node) = route.node else { continue };
        let peer = peers.entry(node).or_default();
        peer.blocks.push(route.dst);
        peer.encaps.insert(route.proto);
        peer.devices.push(route.device.clone());
        if let Some(mtu) = route.mtu {
            peer.route_mtu = Some(peer.route_mtu.map_or(mtu, |m| m.min(mtu)));
        }
    }
    for entry in fdb.iter().filter(|e| e.mac == MacAddr::ZERO) {
        let peer = peers.entry(entry.dst).or_default();
        peer.encaps.insert(Proto::Vxlan);
        peer.devices.push(entry.device.clone());
    }
    for device in devices {
        let Some(remote) = device.remote else {
            continue;
        };
        let peer = peers.entry(remote).or_default();
        peer.encaps.insert(device.proto);
        peer.devices.push(device.name.clone());
    }
    for peer in peers.values_mut() {
        peer.blocks.sort();
        peer.blocks.dedup();
        peer.devices.sort();
        peer.devices.dedup();
    }
    peers
}

/// Interfaces that carry tunnel traffic, sorted by name: each tunnel
/// device's lower device, else the interface holding its local address;
/// plus the interfaces the routes to peer nodes leave by. Loopback and
/// tunnel devices themselves are never underlay.
pub(super) fn underlay(
    links: &[Link],
    addresses: &[Address],
    devices: &[TunnelDevice],
    peer_routes: &[PeerRoute],
) -> Vec<UnderlayInterface> {
    let mut ifindexes = BTreeSet::new();
    for device in devices {
        if let Some(lower) = device.lower {
            ifindexes.insert(lower);
        } else if let Some(local) = device.local {
            ifindexes.extend(
                addresses
                    .iter()
                    .filter(|a| a.addr == local)
                    .map(|a| a.ifindex),
            );
        }
    }
    ifindexes.extend(peer_routes.iter().map(|r| r.ifindex));
    let mut underlay: Vec<UnderlayInterface> = links
        .iter()
        .filter(|l| ifindexes.contains(&l.ifindex) && !l.loopback)
        .filter(|l| devices.iter().all(|d| d.ifindex != l.ifindex))
        .map(|l| UnderlayInterface {
            name: l.name.clone(),
            ifindex: l.ifindex,
            mtu: l.mtu,
        })
        .collect();
    underlay.sort_by(|a, b| a.name.cmp(&b.name).then(a.ifindex.cmp(&b.ifindex)));
    underlay
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::IpNet;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    const VTEP: MacAddr = MacAddr([0x66, 0, 0, 0, 0, 1]);

    fn device(name: &str, ifindex: u32, kind: &str, proto: Proto) -> TunnelDevice {
        TunnelDevice {
            name: name.into(),
            ifindex,
            proto,
            kind: kind.into(),
            vni: None,
            key: None,
            port: None,
            local: None,
            remote: None,
            lower: None,
            mtu: 1450,
            up: true,
        }
    }

    fn route(dst: &str, ifindex: u32, gateway: Option<&str>) -> Route {
        Route {
            origin: 12,
            blackhole: false,
            dst: net(dst),
            ifindex,
            gateway: gateway.map(ip),
            mtu: None,
            table: 254,
        }
    }

    fn fdb(mac: MacAddr, dst: &str) -> FdbEntry {
        FdbEntry {
            device: "vxlan.calico".into(),
            ifindex: 10,
            mac,
            dst: ip(dst),
            vni: None,
            port: None,
        }
    }

    fn link(name: &str, ifindex: u32, mtu: u32) -> Link {
        Link {
            name: name.into(),
            ifindex,
            mtu,
            kind: None,
            up: true,
            loopback: name == "lo",
        }
    }

    /// vxlan.calico (10), tunl0 (11), a point-to-point gre (12), geneve with
    /// a remote (13), wireguard (14); eth0 is 2.
    fn devices() -> Vec<TunnelDevice> {
        let mut gre = device("gre1", 12, "gre", Proto::Gre);
        gre.remote = Some(ip("198.18.0.12"));
        let mut geneve = device("gnv0", 13, "geneve", Proto::Geneve);
        geneve.remote = Some(ip("198.18.0.13"));
        vec![
            device("vxlan.calico", 10, "vxlan", Proto::Vxlan),
            device("tunl0", 11, "ipip", Proto::Ipip),
            gre,
            geneve,
            device("wireguard.cali", 14, "wireguard", Proto::Wireguard),
        ]
    }

    fn neighbours() -> Vec<Neighbour> {
        vec![
            Neighbour {
                ifindex: 10,
                addr: ip("10.42.1.0"),
                mac: Some(VTEP),
            },
            Neighbour {
                ifindex: 10,
                addr: ip("10.42.3.0"),
                mac: Some(MacAddr([0x66, 0, 0, 0, 0, 3])),
            },
            // Same address on another device: must not be used.
            Neighbour {
                ifindex: 2,
                addr: ip("10.42.4.0"),
                mac: Some(VTEP),
            },
        ]
    }

    #[test]
    fn each_kind_of_tunnel_route_leads_to_its_node() {
        let mut mtu_route = route("10.42.2.0/26", 11, Some("198.18.0.2"));
        mtu_route.mtu = Some(1440);
        let routes = vec![
            route("10.42.1.0/26", 10, Some("10.42.1.0")),
            mtu_route,
            route("10.42.3.0/26", 10, Some("10.42.3.0")), // neighbour, no FDB
            route("10.42.4.0/26", 10, Some("10.42.4.0")), // no neighbour here
            route("10.42.5.0/26", 10, None),
            route("10.42.6.0/26", 12, Some("10.99.0.1")),
            route("10.42.7.0/26", 13, Some("10.42.7.1")),
            route("10.42.8.0/26", 14, None),
            route("198.18.0.0/24", 2, None), // not through a tunnel
        ];
        let fdb = vec![fdb(VTEP, "198.18.0.1"), fdb(MacAddr::ZERO, "198.18.0.9")];
        let resolved = tunnel_routes(&devices(), &routes, &neighbours(), &fdb);
        let summary: Vec<(IpNet, &str, Option<MacAddr>, Option<IpAddr>)> = resolved
            .iter()
            .map(|r| (r.dst, r.device.as_str(), r.vtep_mac, r.node))
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    net("10.42.1.0/26"),
                    "vxlan.calico",
                    Some(VTEP),
                    Some(ip("198.18.0.1"))
                ),
                (net("10.42.2.0/26"), "tunl0", None, Some(ip("198.18.0.2"))),
                (
                    net("10.42.3.0/26"),
                    "vxlan.calico",
                    Some(MacAddr([0x66, 0, 0, 0, 0, 3])),
                    None
                ),
                (net("10.42.4.0/26"), "vxlan.calico", None, None),
                (net("10.42.5.0/26"), "vxlan.calico", None, None),
                (net("10.42.6.0/26"), "gre1", None, Some(ip("198.18.0.12"))),
                (net("10.42.7.0/26"), "gnv0", None, Some(ip("198.18.0.13"))),
                (net("10.42.8.0/26"), "wireguard.cali", None, None),
            ]
        );
        assert_eq!(resolved[1].proto, Proto::Ipip);
        assert_eq!(resolved[1].mtu, Some(1440));
        assert_eq!(resolved[1].gateway, Some(ip("198.18.0.2")));
        assert_eq!(resolved[1].table, 254);
    }

    #[test]
    fn peers_merge_routes_flood_entries_and_fixed_remotes() {
        let devices = devices();
        let mut routes = vec![
            route("10.42.1.64/26", 10, Some("10.42.1.0")),
            route("10.42.1.0/26", 10, Some("10.42.1.0")),
            route("10.42.1.0/26", 10, Some("10.42.1.0")), // same block, other table
            route("10.42.9.0/26", 11, Some("198.18.0.1")), // same node by ipip
        ];
        routes[0].mtu = Some(1400);
        routes[3].mtu = Some(1300);
        let fdb = vec![fdb(VTEP, "198.18.0.1"), fdb(MacAddr::ZERO, "198.18.0.9")];
        let resolved = tunnel_routes(&devices, &routes, &neighbours(), &fdb);
        let peers = expected_peers(&devices, &resolved, &fdb);
        assert_eq!(
            peers.keys().copied().collect::<Vec<_>>(),
            vec![
                ip("198.18.0.1"),
                ip("198.18.0.9"),
                ip("198.18.0.12"),
                ip("198.18.0.13")
            ]
        );
        assert_eq!(
            peers[&ip("198.18.0.1")],
            ExpectedPeer {
                blocks: vec![
                    net("10.42.1.0/26"),
                    net("10.42.1.64/26"),
                    net("10.42.9.0/26")
                ],
                encaps: BTreeSet::from([Proto::Vxlan, Proto::Ipip]),
                devices: vec!["tunl0".into(), "vxlan.calico".into()],
                route_mtu: Some(1300),
            }
        );
        assert_eq!(
            peers[&ip("198.18.0.9")],
            ExpectedPeer {
                blocks: vec![],
                encaps: BTreeSet::from([Proto::Vxlan]),
                devices: vec!["vxlan.calico".into()],
                route_mtu: None,
            }
        );
        assert_eq!(
            peers[&ip("198.18.0.12")].encaps,
            BTreeSet::from([Proto::Gre])
        );
        assert_eq!(peers[&ip("198.18.0.13")].devices, vec!["gnv0".to_string()]);
    }

    #[test]
    fn underlay_from_lower_local_address_and_peer_routes() {
        let links = vec![
            link("lo", 1, 65536),
            link("eth0", 2, 1500),
            link("eth1", 3, 9000),
            link("bond0", 4, 1500),
            link("vxlan.calico", 10, 1450),
            link("tunl0", 11, 1480),
        ];
        let addresses = vec![
            Address {
                ifindex: 3,
                addr: ip("198.18.1.1"),
                prefix_len: 24,
            },
            Address {
                ifindex: 1,
                addr: ip("198.18.9.9"),
                prefix_len: 32,
            },
        ];
        let mut vxlan = device("vxlan.calico", 10, "vxlan", Proto::Vxlan);
        vxlan.lower = Some(2);
        vxlan.local = Some(ip("198.18.1.1")); // the lower device wins
        let mut ipip = device("tunl0", 11, "ipip", Proto::Ipip);
        ipip.local = Some(ip("198.18.1.1"));
        let mut on_lo = device("ipip1", 12, "ipip", Proto::Ipip);
        on_lo.local = Some(ip("198.18.9.9"));
        let devices = vec![vxlan, ipip, on_lo];
        let peer_routes = vec![
            PeerRoute {
                node: ip("198.18.2.1"),
                ifindex: 2,
                gateway: None,
            },
            PeerRoute {
                node: ip("198.18.3.1"),
                ifindex: 4,
                gateway: Some(ip("198.18.4.254")),
            },
            PeerRoute {
                node: ip("198.18.5.1"),
                ifindex: 11, // through a tunnel: not underlay
                gateway: None,
            },
            PeerRoute {
                node: ip("198.18.6.1"),
                ifindex: 99, // vanished meanwhile
                gateway: None,
            },
        ];
        let names: Vec<(String, u32)> = underlay(&links, &addresses, &devices, &peer_routes)
            .into_iter()
            .map(|u| (u.name, u.mtu))
            .collect();
        assert_eq!(
            names,
            vec![
                ("bond0".to_string(), 1500),
                ("eth0".to_string(), 1500),
                ("eth1".to_string(), 9000)
            ]
        );
    }

    #[test]
    fn vnis_sorted_and_deduplicated() {
        let mut a = device("vxlan.calico", 10, "vxlan", Proto::Vxlan);
        a.vni = Some(4096);
        let mut b = device("flannel.1", 11, "vxlan", Proto::Vxlan);
        b.vni = Some(1);
        let mut c = device("vxlan.v6", 12, "vxlan", Proto::Vxlan);
        c.vni = Some(4096);
        let mut d = device("gnv0", 13, "geneve", Proto::Geneve);
        d.vni = Some(7);
        assert_eq!(vxlan_vnis(&[a, b, c, d]), vec![1, 4096]);
        assert_eq!(vxlan_vnis(&[]), Vec::<u32>::new());
    }
}
