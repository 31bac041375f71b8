//! The node's data-plane view as plain data: tunnel devices, addresses,
//! routes through tunnels, the vxlan neighbour and FDB entries, which peer
//! node owns which pod block, and the underlay interfaces that carry the
//! tunnels. `node::dataplane` reads the records through rtnetlink; the
//! resolution (route → neighbour → FDB → node, longest-prefix lookups,
//! underlay selection) lives in [`resolve`] as pure functions over them.

mod resolve;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

use anyhow::Result;
use ipnet::IpNet;
use observer_common::Proto;
use serde::{Serialize, Serializer};

pub use crate::model::facts::ExpectedPeer;
use crate::model::facts::{longest_prefix, proto_name};

/// An Ethernet address, printed and serialized as `aa:bb:cc:dd:ee:ff`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The all-zero address: a vxlan FDB entry with it is the default
    /// (flood) remote, used for every MAC without an entry of its own.
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// The address in `bytes` when it is exactly 6 bytes long (kernel
    /// link-layer attributes of other lengths are not Ethernet).
    pub fn from_bytes(bytes: &[u8]) -> Option<MacAddr> {
        Some(MacAddr(bytes.try_into().ok()?))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A network interface of the namespace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Link {
    /// Interface name.
    pub name: String,
    /// Interface index.
    pub ifindex: u32,
    /// MTU.
    pub mtu: u32,
    /// Kernel link kind (`vxlan`, `veth`, ...); `None` for devices without
    /// one (physical NICs, `lo`).
    pub kind: Option<String>,
    /// Administratively up and with carrier (IFF_UP and IFF_LOWER_UP).
    pub up: bool,
    /// The loopback device (never an underlay).
    pub loopback: bool,
}

/// An address configured on an interface.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Address {
    /// Interface that holds the address.
    pub ifindex: u32,
    /// The address.
    pub addr: IpAddr,
    /// Prefix length it was configured with.
    pub prefix_len: u8,
}

/// An encapsulation device: vxlan, geneve, ipip, ip6tnl, sit, GRE or
/// WireGuard.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TunnelDevice {
    /// Interface name (`vxlan.calico`, `tunl0`, `flannel.1`, ...).
    pub name: String,
    /// Interface index.
    pub ifindex: u32,
    /// Encapsulation of the packets it sends.
    #[serde(serialize_with = "proto_name")]
    pub proto: Proto,
    /// Kernel link kind (`vxlan`, `ipip`, `gretap`, ...).
    pub kind: String,
    /// VXLAN or Geneve network identifier.
    pub vni: Option<u32>,
    /// GRE key the device sends (`okey`), when it has one.
    pub key: Option<u32>,
    /// UDP destination port (vxlan, geneve). WireGuard's listen port is not
    /// in rtnetlink (it is in the wireguard generic netlink family).
    pub port: Option<u16>,
    /// Local (source) underlay address, when configured.
    pub local: Option<IpAddr>,
    /// Fixed remote underlay address (ipip/GRE/geneve remote, unicast vxlan
    /// group), when configured.
    pub remote: Option<IpAddr>,
    /// Interface index of the lower (underlay) device, when configured.
    pub lower: Option<u32>,
    /// MTU.
    pub mtu: u32,
    /// Administratively up and with carrier.
    pub up: bool,
}

impl TunnelDevice {
    /// The device `link` is, sending `proto`, before its kind's attributes
    /// (VNI, key, port, addresses, lower device) are read.
    pub fn of_link(link: &Link, proto: Proto, kind: String) -> TunnelDevice {
        TunnelDevice {
            name: link.name.clone(),
            ifindex: link.ifindex,
            proto,
            kind,
            vni: None,
            key: None,
            port: None,
            local: None,
            remote: None,
            lower: None,
            mtu: link.mtu,
            up: link.up,
        }
    }
}

/// A unicast route (or one next hop of a multipath route) as dumped.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Route {
    /// Destination prefix.
    pub dst: IpNet,
    /// Output interface.
    pub ifindex: u32,
    /// Next hop, when the route has one.
    pub gateway: Option<IpAddr>,
    /// Route MTU metric (RTAX_MTU), when set.
    pub mtu: Option<u32>,
    /// Routing table.
    pub table: u32,
    /// Who installed it (rtm_protocol: 4 static, 12 bird, ...; see
    /// [`origin_name`]).
    pub origin: u8,
    /// A blackhole route (no device: `ifindex` is 0).
    pub blackhole: bool,
}

/// The main routing table, where Calico's BIRD and Felix install the
/// routes of pod blocks.
pub const MAIN_TABLE: u32 = 254;

/// The name `ip route` prints for a route's origin (rtm_protocol, as in
/// iproute2's `rt_protos`), or its number. Written here: the netlink
/// crate names only the kernel's own values, and the names are what an
/// SRE compares with `ip route`.
pub fn origin_name(origin: u8) -> String {
    match origin {
        0 => "unspec".into(),
        1 => "redirect".into(),
        2 => "kernel".into(),
        3 => "boot".into(),
        4 => "static".into(),
        9 => "ra".into(),
        11 => "zebra".into(),
        12 => "bird".into(),
        16 => "dhcp".into(),
        42 => "babel".into(),
        186 => "bgp".into(),
        187 => "isis".into(),
        188 => "ospf".into(),
        189 => "rip".into(),
        other => other.to_string(),
    }
}

fn origin_serialized<S: Serializer>(origin: &u8, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&origin_name(*origin))
}

fn encap_name<S: Serializer>(encap: &Option<Proto>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(encap.map_or("none", |p| p.name()))
}

/// One next hop of a pod block's route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NextHop {
    /// Output device name.
    pub device: String,
    /// Gateway, when the route has one.
    pub gateway: Option<IpAddr>,
    /// Encapsulation of the device; `None` (`none` in JSON) for direct
    /// routing.
    #[serde(serialize_with = "encap_name")]
    pub encap: Option<Proto>,
    /// The node it leads to: the resolved tunnel peer, or the gateway of
    /// a direct route; `None` when unknown.
    pub node: Option<IpAddr>,
}

/// How this node routes one pod block (main table): the blocks it owns
/// are blackholes, the others lead to the node that owns them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockRoute {
    /// The block.
    pub block: IpNet,
    /// Who installed the route (`bird`, `static`, `boot`, `80` for Felix).
    #[serde(serialize_with = "origin_serialized")]
    pub origin: u8,
    /// A blackhole: a block this node owns (or a route that drops).
    pub blackhole: bool,
    /// Next hops, more than one for ECMP; empty for a blackhole.
    pub next_hops: Vec<NextHop>,
}

impl BlockRoute {
    /// A node the block is routed to (the first next hop's that names
    /// one); `None` for a blackhole or unknown hops.
    pub fn any_node(&self) -> Option<IpAddr> {
        self.next_hops.iter().find_map(|h| h.node)
    }
}

/// A route through a tunnel device, with the peer node it leads to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TunnelRoute {
    /// Destination prefix (a pod block).
    pub dst: IpNet,
    /// Tunnel device name.
    pub device: String,
    /// Tunnel device index.
    pub ifindex: u32,
    /// Encapsulation of the tunnel device.
    #[serde(serialize_with = "proto_name")]
    pub proto: Proto,
    /// Next hop: the peer node (ipip, GRE) or the remote VTEP's overlay
    /// address (vxlan).
    pub gateway: Option<IpAddr>,
    /// Route MTU metric, when set.
    pub mtu: Option<u32>,
    /// Routing table.
    pub table: u32,
    /// MAC of the remote VTEP (vxlan: the gateway's neighbour entry).
    pub vtep_mac: Option<MacAddr>,
    /// Underlay address of the peer node; `None` when it cannot be
    /// resolved (for vxlan: no neighbour or no FDB entry for the gateway).
    pub node: Option<IpAddr>,
}

/// A neighbour (ARP/NDP) entry on a tunnel device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Neighbour {
    /// Device index.
    pub ifindex: u32,
    /// Overlay address.
    pub addr: IpAddr,
    /// Its MAC, when known.
    pub mac: Option<MacAddr>,
}

/// A vxlan forwarding entry: frames to `mac` are sent to `dst`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FdbEntry {
    /// Vxlan device name.
    pub device: String,
    /// Vxlan device index.
    pub ifindex: u32,
    /// Inner destination MAC; [`MacAddr::ZERO`] is the default remote.
    pub mac: MacAddr,
    /// Underlay address of the remote VTEP (the peer node).
    pub dst: IpAddr,
    /// VNI override of the entry, when set.
    pub vni: Option<u32>,
    /// UDP port override of the entry, when set.
    pub port: Option<u16>,
}

/// The kernel's route to a peer node's underlay address.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeerRoute {
    /// Peer node address.
    pub node: IpAddr,
    /// Interface the packets leave by.
    pub ifindex: u32,
    /// Next hop, when the node is not directly connected.
    pub gateway: Option<IpAddr>,
}

/// An interface that carries tunnel traffic.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnderlayInterface {
    /// Interface name.
    pub name: String,
    /// Interface index.
    pub ifindex: u32,
    /// MTU.
    pub mtu: u32,
}

/// A device the kernel does not know as a tunnel but that carries one: a
/// userspace tunnel on a TUN device (wireguard-go, boringtun, or the lab's
/// IPIP on kernels without it). Given as `NAME=PROTO` (`tunl0=ipip`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredTunnel {
    /// Interface name.
    pub device: String,
    /// Encapsulation it carries.
    pub proto: Proto,
}

impl std::str::FromStr for DeclaredTunnel {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (device, proto) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: use NAME=PROTO, e.g. tunl0=ipip"))?;
        let proto = Proto::from_name(proto)
            .filter(|p| *p != Proto::Other)
            .ok_or_else(|| {
                let names: Vec<&str> = Proto::ALL[1..].iter().map(|p| p.name()).collect();
                format!(
                    "{proto:?} is no encapsulation: use one of {}",
                    names.join(", ")
                )
            })?;
        if device.is_empty() {
            return Err(format!("{text:?}: the device name is empty"));
        }
        Ok(DeclaredTunnel {
            device: device.to_string(),
            proto,
        })
    }
}

/// Adds the `declared` devices that exist and are not kernel tunnels
/// already (a kernel tunnel's own kind wins).
pub fn add_declared(links: &[Link], devices: &mut Vec<TunnelDevice>, declared: &[DeclaredTunnel]) {
    for d in declared {
        if devices.iter().any(|t| t.name == d.device) {
            continue;
        }
        let Some(link) = links.iter().find(|l| l.name == d.device) else {
            continue;
        };
        devices.push(TunnelDevice::of_link(
            link,
            d.proto,
            link.kind.clone().unwrap_or_else(|| "declared".to_string()),
        ));
    }
    devices.sort_by_key(|t| t.ifindex);
}

/// Everything [`Rtnl::dump_all`] reads, before resolution.
pub struct Dump {
    pub links: Vec<Link>,
    pub addresses: Vec<Address>,
    pub devices: Vec<TunnelDevice>,
    /// Unicast routes of every table, minus the kernel's connected routes.
    pub routes: Vec<Route>,
    /// Neighbour entries on tunnel devices only.
    pub neighbours: Vec<Neighbour>,
    /// FDB entries with a remote, on vxlan devices only.
    pub fdb: Vec<FdbEntry>,
}

/// The data-plane view of the current network namespace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataPlane {
    /// Every interface, by index.
    pub links: Vec<Link>,
    /// Every address, by interface index.
    pub addresses: Vec<Address>,
    /// Tunnel devices, by index.
    pub devices: Vec<TunnelDevice>,
    /// Routes through tunnel devices (all tables, IPv4 and IPv6), in dump
    /// order.
    pub routes: Vec<TunnelRoute>,
    /// Neighbour entries on tunnel devices.
    pub neighbours: Vec<Neighbour>,
    /// Vxlan FDB entries that name a remote.
    pub fdb: Vec<FdbEntry>,
    /// The kernel's route to each expected peer node, by node.
    pub peer_routes: Vec<PeerRoute>,
    /// Interfaces that carry tunnel traffic, by name.
    pub underlay: Vec<UnderlayInterface>,
    /// The routes of pod blocks, by block.
    pub blocks: Vec<BlockRoute>,
}

impl DataPlane {
    /// Builds the view from dumped records; `route_to` answers the kernel's
    /// route to a peer node (`None`: unreachable).
    pub fn assemble(
        dump: Dump,
        mut route_to: impl FnMut(IpAddr) -> Result<Option<PeerRoute>>,
    ) -> Result<DataPlane> {
        let Dump {
            links,
            addresses,
            devices,
            routes,
            neighbours,
            fdb,
        } = dump;
        let tunnel_routes = resolve::tunnel_routes(&devices, &routes, &neighbours, &fdb);
        let blocks = resolve::blocks(&links, &routes, &tunnel_routes);
        let routes = tunnel_routes;
        let mut peer_routes = Vec::new();
        for node in resolve::expected_peers(&devices, &routes, &fdb).into_keys() {
            peer_routes.extend(route_to(node)?);
        }
        let underlay = resolve::underlay(&links, &addresses, &devices, &peer_routes);
        Ok(DataPlane {
            links,
            addresses,
            devices,
            routes,
            neighbours,
            fdb,
            peer_routes,
            underlay,
            blocks,
        })
    }

    /// Peer nodes by underlay address: from the routes through tunnels, the
    /// default (all-zero MAC) vxlan FDB remotes and fixed tunnel remotes.
    pub fn expected_peers(&self) -> BTreeMap<IpAddr, ExpectedPeer> {
        resolve::expected_peers(&self.devices, &self.routes, &self.fdb)
    }

    /// The node whose pod block holds `addr` (an inner address): the node of
    /// the longest tunnel route prefix containing it; `None` when no tunnel
    /// route contains it or that route is unresolved.
    pub fn node_owning(&self, addr: IpAddr) -> Option<IpAddr> {
        longest_prefix(self.routes.iter().map(|r| (r.dst, r)), addr)?.node
    }

    /// Every address configured on this node's interfaces.
    pub fn local_addresses(&self) -> BTreeSet<IpAddr> {
        self.addresses.iter().map(|a| a.addr).collect()
    }

    /// This node's underlay addresses: those on the underlay interfaces
    /// and the tunnel devices' local addresses (what its peers see as the
    /// outer source of its tunnel packets), without loopback, link-local
    /// and unspecified ones.
    pub fn underlay_addresses(&self) -> BTreeSet<IpAddr> {
        let on_underlay = self
            .addresses
            .iter()
            .filter(|a| self.underlay.iter().any(|u| u.ifindex == a.ifindex))
            .map(|a| a.addr);
        let tunnel_sources = self.devices.iter().filter_map(|d| d.local);
        on_underlay
            .chain(tunnel_sources)
            .filter(|a| {
                !a.is_loopback()
                    && !a.is_unspecified()
                    && match a {
                        IpAddr::V4(v4) => !v4.is_link_local(),
                        IpAddr::V6(v6) => !v6.is_unicast_link_local(),
                    }
            })
            .collect()
    }

    /// VNIs of the vxlan devices, sorted and deduplicated.
    pub fn vxlan_vnis(&self) -> Vec<u32> {
        resolve::vxlan_vnis(&self.devices)
    }

    /// Tunnel routes whose peer node could not be resolved (for vxlan: a
    /// route without neighbour or FDB entry; traffic on it goes nowhere
    /// known, or only to the default remotes).
    pub fn unresolved_routes(&self) -> Vec<&TunnelRoute> {
        self.routes.iter().filter(|r| r.node.is_none()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// A Calico-like node: eth0 (2) underlay, vxlan.calico (10) and tunl0
    /// (11) without lower devices; one vxlan block resolved through the
    /// FDB, one unresolved, one ipip block.
    fn dump() -> Dump {
        let link = |name: &str, ifindex, mtu, kind: Option<&str>| Link {
            name: name.into(),
            ifindex,
            mtu,
            kind: kind.map(Into::into),
            up: true,
            loopback: name == "lo",
        };
        let device = |name: &str, ifindex, proto, kind: &str, vni, port, mtu| TunnelDevice {
            name: name.into(),
            ifindex,
            proto,
            kind: kind.into(),
            vni,
            key: None,
            port,
            local: Some(ip("198.18.0.1")),
            remote: None,
            lower: None,
            mtu,
            up: true,
        };
        let route = |dst: &str, ifindex, gateway: &str| Route {
            dst: net(dst),
            ifindex,
            gateway: Some(ip(gateway)),
            mtu: None,
            table: 254,
            origin: 12,
            blackhole: false,
        };
        let vtep = MacAddr([0x66, 0, 0, 0, 0, 1]);
        Dump {
            links: vec![
                link("lo", 1, 65536, None),
                link("eth0", 2, 1500, Some("veth")),
                link("vxlan.calico", 10, 1450, Some("vxlan")),
                link("tunl0", 11, 1480, Some("ipip")),
            ],
            addresses: vec![
                Address {
                    ifindex: 2,
                    addr: ip("198.18.0.1"),
                    prefix_len: 24,
                },
                Address {
                    ifindex: 10,
                    addr: ip("10.42.0.0"),
                    prefix_len: 32,
                },
            ],
            devices: vec![
                device(
                    "vxlan.calico",
                    10,
                    Proto::Vxlan,
                    "vxlan",
                    Some(4096),
                    Some(4789),
                    1450,
                ),
                device("tunl0", 11, Proto::Ipip, "ipip", None, None, 1480),
            ],
            routes: vec![
                route("10.42.1.0/26", 10, "10.42.1.0"),
                route("10.42.3.0/26", 10, "10.42.3.0"),
                route("10.42.2.0/26", 11, "198.18.0.2"),
                route("0.0.0.0/0", 2, "198.18.0.254"),
            ],
            neighbours: vec![Neighbour {
                ifindex: 10,
                addr: ip("10.42.1.0"),
                mac: Some(vtep),
            }],
            fdb: vec![FdbEntry {
                device: "vxlan.calico".into(),
                ifindex: 10,
                mac: vtep,
                dst: ip("198.18.0.3"),
                vni: None,
                port: None,
            }],
        }
    }

    #[test]
    fn assembled_view_answers_the_questions() {
        let mut asked = Vec::new();
        let view = DataPlane::assemble(dump(), |node| {
            asked.push(node);
            Ok(Some(PeerRoute {
                node,
                ifindex: 2,
                gateway: None,
            }))
        })
        .unwrap();
        assert_eq!(asked, vec![ip("198.18.0.2"), ip("198.18.0.3")]);
        assert_eq!(
            view.underlay,
            vec![UnderlayInterface {
                name: "eth0".into(),
                ifindex: 2,
                mtu: 1500
            }]
        );
        // The pod address on vxlan.calico is no underlay address.
        assert_eq!(
            view.underlay_addresses(),
            BTreeSet::from([ip("198.18.0.1")])
        );
        assert_eq!(view.node_owning(ip("10.42.1.7")), Some(ip("198.18.0.3")));
        assert_eq!(view.node_owning(ip("10.42.2.63")), Some(ip("198.18.0.2")));
        assert_eq!(view.node_owning(ip("10.42.3.1")), None); // unresolved
        assert_eq!(view.node_owning(ip("10.42.2.64")), None); // no block
        assert_eq!(
            view.unresolved_routes()
                .iter()
                .map(|r| r.dst)
                .collect::<Vec<_>>(),
            vec![net("10.42.3.0/26")]
        );
        assert_eq!(
            view.local_addresses(),
            BTreeSet::from([ip("10.42.0.0"), ip("198.18.0.1")])
        );
        assert_eq!(view.vxlan_vnis(), vec![4096]);
        let peers = view.expected_peers();
        assert_eq!(peers.len(), 2);
        assert_eq!(peers[&ip("198.18.0.3")].blocks, vec![net("10.42.1.0/26")]);
    }

    #[test]
    fn pod_blocks_are_blackholes_bird_routes_and_tunnel_routes_of_the_main_table() {
        let mut dump = dump();
        let plain = |dst: &str, ifindex, gateway: Option<&str>, origin, blackhole, table| Route {
            dst: net(dst),
            ifindex,
            gateway: gateway.map(ip),
            mtu: None,
            table,
            origin,
            blackhole,
        };
        dump.routes.extend([
            // This node's own block: Calico's blackhole.
            plain("10.42.0.0/26", 0, None, 12, true, 254),
            // Direct routing (BGP without encapsulation), ECMP to two nodes.
            plain("10.42.4.0/26", 2, Some("198.18.0.4"), 12, false, 254),
            plain("10.42.4.0/26", 2, Some("198.18.0.5"), 12, false, 254),
            // No blocks: a static LAN route, a BIRD host route, another table.
            plain("192.168.0.0/16", 2, Some("198.18.0.254"), 4, false, 254),
            plain("10.42.9.9/32", 2, Some("198.18.0.4"), 12, false, 254),
            plain("10.42.5.0/26", 2, Some("198.18.0.4"), 12, false, 100),
        ]);
        let view = DataPlane::assemble(dump, |_| Ok(None)).unwrap();
        // One line per block: block, origin, blackhole, hops, owner node.
        let summary: Vec<String> = view
            .blocks
            .iter()
            .map(|b| {
                let hops: Vec<String> = b
                    .next_hops
                    .iter()
                    .map(|h| {
                        let node = h.node.map_or("?".into(), |n| n.to_string());
                        let encap = h.encap.map_or("none", |p| p.name());
                        format!("{} {node} {encap}", h.device)
                    })
                    .collect();
                let owner = b.any_node().map_or("-".into(), |n| n.to_string());
                let blackhole = if b.blackhole { " blackhole" } else { "" };
                format!(
                    "{} {}{blackhole} [{}] {owner}",
                    b.block,
                    origin_name(b.origin),
                    hops.join(", ")
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                "10.42.0.0/26 bird blackhole [] -",
                "10.42.1.0/26 bird [vxlan.calico 198.18.0.3 vxlan] 198.18.0.3",
                "10.42.2.0/26 bird [tunl0 198.18.0.2 ipip] 198.18.0.2",
                // Unresolved vxlan route: a block whose node is unknown.
                "10.42.3.0/26 bird [vxlan.calico ? vxlan] -",
                // ECMP to two nodes (or two ToR switches).
                "10.42.4.0/26 bird [eth0 198.18.0.4 none, eth0 198.18.0.5 none] 198.18.0.4",
            ]
        );
        let json = serde_json::to_value(&view.blocks[0]).unwrap();
        assert_eq!(json["origin"], "bird");
        assert_eq!(origin_name(80), "80");
        let json = serde_json::to_value(&view.blocks[4]).unwrap();
        assert_eq!(json["next_hops"][0]["encap"], "none");
    }

    #[test]
    fn a_failed_lookup_is_an_error_and_unreachable_peers_have_no_route() {
        let err = DataPlane::assemble(dump(), |_| anyhow::bail!("lookup failed")).unwrap_err();
        assert_eq!(err.to_string(), "lookup failed");
        let view = DataPlane::assemble(dump(), |_| Ok(None)).unwrap();
        assert!(view.peer_routes.is_empty());
        // The tunnels' local address still names the underlay.
        assert_eq!(view.underlay.len(), 1);
        assert_eq!(view.underlay[0].name, "eth0");
    }

    #[test]
    fn serializes_protocols_and_macs_by_name() {
        let view = DataPlane::assemble(dump(), |_| Ok(None)).unwrap();
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["devices"][0]["proto"], "vxlan");
        assert_eq!(json["devices"][1]["proto"], "ipip");
        assert_eq!(json["routes"][0]["vtep_mac"], "66:00:00:00:00:01");
        assert_eq!(json["routes"][0]["dst"], "10.42.1.0/26");
        assert_eq!(json["fdb"][0]["dst"], "198.18.0.3");
        let peers = serde_json::to_value(view.expected_peers()).unwrap();
        assert_eq!(
            peers["198.18.0.2"],
            serde_json::json!({
                "blocks": ["10.42.2.0/26"],
                "encaps": ["ipip"],
                "devices": ["tunl0"],
                "route_mtu": null
            })
        );
    }

    #[test]
    fn mac_from_bytes_needs_six() {
        assert_eq!(
            MacAddr::from_bytes(&[1, 2, 3, 4, 5, 0xab]).map(|m| m.to_string()),
            Some("01:02:03:04:05:ab".to_string())
        );
        assert_eq!(MacAddr::from_bytes(&[1, 2, 3, 4]), None);
        assert_eq!(MacAddr::ZERO.to_string(), "00:00:00:00:00:00");
    }
}
