//! The pure half of the rtnetlink reader: the messages of a datagram, and
//! kernel messages into the plain records of the view. No socket here, so
//! that `observer`'s `node::dataplane` and the `netlink` fuzz target (`fuzz/`) run the same
//! code on the same bytes. Messages or attributes the parser does not know
//! are skipped, never fatal.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use netlink_packet_core::{DecodeError, NLMSG_DONE, NLMSG_ERROR, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    AddressFamily, IpProtocol, RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
    link::{
        InfoData, InfoIpTunnel, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo,
        LinkMessage,
    },
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage},
    route::{
        RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteMetric,
        RouteProtocol, RouteType, RouteVia,
    },
};
use observer_common::Proto;

use crate::model::dataplane::{
    Address, DeclaredTunnel, Dump, FdbEntry, Link, MacAddr, Neighbour, PeerRoute, Route,
    TunnelDevice, add_declared,
};

/// Netlink message header length.
pub const HEADER_LEN: usize = 16;

/// One message of a netlink datagram, as its header describes it.
#[derive(Debug, Clone, Copy)]
pub struct Envelope<'a> {
    /// nlmsg_type (NLMSG_DONE, NLMSG_ERROR or the RTM_* type).
    pub kind: u16,
    /// nlmsg_flags (NLM_F_MULTIPART, NLM_F_DUMP_INTR, ...).
    pub flags: u16,
    /// nlmsg_seq: the request it answers.
    pub seq: u32,
    /// The whole message, header included.
    pub bytes: &'a [u8],
}

impl Envelope<'_> {
    /// The errno NLMSG_DONE and NLMSG_ERROR carry after the header (0:
    /// success, negative: the error); 0 when the message is too short to
    /// carry one.
    pub fn code(&self) -> i32 {
        match self.bytes.get(HEADER_LEN..HEADER_LEN + 4) {
            Some(code) => i32::from_ne_bytes([code[0], code[1], code[2], code[3]]),
            None => 0,
        }
    }

    /// The rtnetlink message it holds; `None` for a control message
    /// (NLMSG_NOOP, ...), an error when the parser rejects it.
    pub fn route_message(&self) -> Result<Option<RouteNetlinkMessage>, DecodeError> {
        let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(self.bytes)?;
        Ok(match message.payload {
            NetlinkPayload::InnerMessage(inner) => Some(inner),
            _ => None,
        })
    }
}

/// The messages of one datagram in order ([`envelopes`]); after a length
/// that does not fit, that length as the error, then nothing.
pub struct Envelopes<'a> {
    data: &'a [u8],
    offset: usize,
}

/// The messages of the datagram `data`, each at its 4-byte aligned offset.
pub fn envelopes(data: &[u8]) -> Envelopes<'_> {
    Envelopes { data, offset: 0 }
}

impl<'a> Iterator for Envelopes<'a> {
    type Item = Result<Envelope<'a>, usize>;

    fn next(&mut self) -> Option<Self::Item> {
        let header = self.data.get(self.offset..)?.get(..HEADER_LEN)?;
        let word = |at: usize| [header[at], header[at + 1], header[at + 2], header[at + 3]];
        let length = u32::from_ne_bytes(word(0)) as usize;
        let kind = u16::from_ne_bytes([header[4], header[5]]);
        let flags = u16::from_ne_bytes([header[6], header[7]]);
        let seq = u32::from_ne_bytes(word(8));
        let Some(bytes) = (length >= HEADER_LEN)
            .then(|| self.data.get(self.offset..self.offset.checked_add(length)?))
            .flatten()
        else {
            // Nothing after a malformed length can be framed.
            self.offset = self.data.len();
            return Some(Err(length));
        };
        self.offset = self.offset.saturating_add(length.next_multiple_of(4));
        Some(Ok(Envelope {
            kind,
            flags,
            seq,
            bytes,
        }))
    }
}

/// The records of one read of the data plane, gathered dump by dump (the
/// link dump first: the neighbour dumps keep only tunnel devices'
/// entries); each dump's answer may hold any message, and only its own
/// kind is read.
pub struct DumpDecoder {
    dump: Dump,
}

impl DumpDecoder {
    /// Starts from the answer of the link dump (RTM_GETLINK): every link,
    /// the tunnel devices among them, and the `declared` ones.
    pub fn new(
        replies: impl IntoIterator<Item = RouteNetlinkMessage>,
        declared: &[DeclaredTunnel],
    ) -> DumpDecoder {
        let mut links = Vec::new();
        let mut devices = Vec::new();
        for reply in replies {
            if let RouteNetlinkMessage::NewLink(message) = reply
                && let Some((link, device)) = link(&message)
            {
                links.push(link);
                devices.extend(device);
            }
        }
        links.sort_by_key(|l| l.ifindex);
        add_declared(&links, &mut devices, declared);
        DumpDecoder {
            dump: Dump {
                links,
                addresses: Vec::new(),
                devices,
                routes: Vec::new(),
                neighbours: Vec::new(),
                fdb: Vec::new(),
            },
        }
    }

    /// Adds the answer of an address dump (RTM_GETADDR).
    pub fn addresses(&mut self, replies: impl IntoIterator<Item = RouteNetlinkMessage>) {
        for reply in replies {
            if let RouteNetlinkMessage::NewAddress(message) = reply {
                self.dump.addresses.extend(address(&message));
            }
        }
    }

    /// Adds the answer of a route dump (RTM_GETROUTE) of either family.
    pub fn routes(&mut self, replies: impl IntoIterator<Item = RouteNetlinkMessage>) {
        for reply in replies {
            if let RouteNetlinkMessage::NewRoute(message) = reply {
                self.dump.routes.extend(route(&message));
            }
        }
    }

    /// Adds the answer of a neighbour dump (RTM_GETNEIGH) requested for
    /// `family`: ARP/NDP entries, or with [`AddressFamily::Bridge`] the
    /// FDB (vxlan devices only).
    pub fn neighbours(
        &mut self,
        family: AddressFamily,
        replies: impl IntoIterator<Item = RouteNetlinkMessage>,
    ) {
        for reply in replies {
            let RouteNetlinkMessage::NewNeighbour(message) = reply else {
                continue;
            };
            // Only tunnel devices: the underlay's neighbours and the
            // bridges' FDB can be large and say nothing about peers.
            let Some(device) = self
                .dump
                .devices
                .iter()
                .find(|d| d.ifindex == message.header.ifindex)
            else {
                continue;
            };
            if family == AddressFamily::Bridge {
                if device.proto == Proto::Vxlan {
                    self.dump.fdb.extend(fdb_entry(&message, device));
                }
            } else {
                self.dump.neighbours.extend(neighbour(&message));
            }
        }
    }

    /// The records gathered.
    pub fn finish(mut self) -> Dump {
        self.dump.addresses.sort_by_key(|a| (a.ifindex, a.addr));
        self.dump
    }
}

/// The rtnetlink messages of `data`, the datagrams of one or more answers
/// one after the other (a recorded read: fuzz inputs, test data), without
/// the control messages (NLMSG_DONE, ...) and those the parser rejects;
/// framing stops at a malformed length, as a live read does.
pub fn recorded_messages(data: &[u8]) -> Vec<RouteNetlinkMessage> {
    envelopes(data)
        .map_while(Result::ok)
        .filter(|envelope| !matches!(envelope.kind, NLMSG_DONE | NLMSG_ERROR))
        .filter_map(|envelope| envelope.route_message().ok().flatten())
        .collect()
}

/// The records of a recorded read's `messages` as [`DumpDecoder`] gathers
/// a live one, each neighbour message taken as the answer of the dump of
/// its own family.
pub fn recorded_dump(messages: &[RouteNetlinkMessage], declared: &[DeclaredTunnel]) -> Dump {
    let mut decoder = DumpDecoder::new(messages.iter().cloned(), declared);
    decoder.addresses(messages.iter().cloned());
    decoder.routes(messages.iter().cloned());
    for family in [
        AddressFamily::Inet,
        AddressFamily::Inet6,
        AddressFamily::Bridge,
    ] {
        let answer = messages.iter().filter(|message| {
            matches!(message, RouteNetlinkMessage::NewNeighbour(n) if n.header.family == family)
        });
        decoder.neighbours(family, answer.cloned());
    }
    decoder.finish()
}

/// The route to `node` in the answer of a route lookup (RTM_GETROUTE for
/// one address): its first unicast next hop.
pub fn peer_route(
    node: IpAddr,
    replies: impl IntoIterator<Item = RouteNetlinkMessage>,
) -> Option<PeerRoute> {
    replies.into_iter().find_map(|reply| {
        let RouteNetlinkMessage::NewRoute(message) = reply else {
            return None;
        };
        if message.header.kind != RouteType::Unicast {
            return None;
        }
        let route = route_hops(&message).into_iter().next()?;
        Some(PeerRoute {
            node,
            ifindex: route.ifindex,
            gateway: route.gateway,
        })
    })
}

/// A link, and its tunnel device view when it is one; `None` without a
/// name.
fn link(message: &LinkMessage) -> Option<(Link, Option<TunnelDevice>)> {
    let mut name = None;
    let mut mtu = 0;
    let mut kind = None;
    let mut data = None;
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::Mtu(m) => mtu = *m,
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(k) => kind = Some(k),
                        LinkInfo::Data(d) => data = Some(d),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let flags = message.header.flags;
    let link = Link {
        name: name?,
        ifindex: message.header.index,
        mtu,
        kind: kind.map(|k| k.to_string()),
        up: flags.contains(LinkFlags::Up) && flags.contains(LinkFlags::LowerUp),
        loopback: flags.contains(LinkFlags::Loopback),
    };
    let device = kind.and_then(|kind| tunnel_device(&link, kind, data));
    Some((link, device))
}

/// The tunnel view of `link` of kind `kind`; `None` when it is no tunnel.
fn tunnel_device(link: &Link, kind: &InfoKind, data: Option<&InfoData>) -> Option<TunnelDevice> {
    let proto = match kind {
        InfoKind::Vxlan => Proto::Vxlan,
        InfoKind::Geneve => Proto::Geneve,
        InfoKind::IpIp => Proto::Ipip,
        // sit carries IPv6 in IPv4 (protocol 41); ip6tnl carries IPv6
        // (ip6ip6, the default) or IPv4 (ipip6) in IPv6: refined below.
        InfoKind::SitTun | InfoKind::Ip6Tnl => Proto::Ip6ip,
        InfoKind::GreTun
        | InfoKind::GreTap
        | InfoKind::GreTun6
        | InfoKind::GreTap6
        | InfoKind::ErSpan
        | InfoKind::Ip6ErSpan => Proto::Gre,
        InfoKind::Wireguard => Proto::Wireguard,
        _ => return None,
    };
    let mut device = TunnelDevice::of_link(link, proto, kind.to_string());
    match data {
        Some(InfoData::Vxlan(infos)) => {
            for info in infos {
                match *info {
                    InfoVxlan::Id(vni) => device.vni = Some(vni),
                    InfoVxlan::Port(port) => device.port = Some(port),
                    InfoVxlan::Local(a) => device.local = specified(a.into()),
                    InfoVxlan::Local6(a) => device.local = specified(a.into()),
                    // A unicast group is the default remote; a multicast
                    // one is a flood group, no peer.
                    InfoVxlan::Group(a) => device.remote = unicast(a.into()),
                    InfoVxlan::Group6(a) => device.remote = unicast(a.into()),
                    InfoVxlan::Link(ifindex) => device.lower = nonzero(ifindex),
                    _ => {}
                }
            }
        }
        Some(InfoData::Geneve(infos)) => {
            use netlink_packet_route::link::InfoGeneve;
            for info in infos {
                match *info {
                    InfoGeneve::Id(vni) => device.vni = Some(vni),
                    InfoGeneve::Port(port) => device.port = Some(port),
                    InfoGeneve::Local(a) => device.local = specified(a.into()),
                    InfoGeneve::Local6(a) => device.local = specified(a.into()),
                    InfoGeneve::Remote(a) => device.remote = specified(a.into()),
                    InfoGeneve::Remote6(a) => device.remote = specified(a.into()),
                    _ => {}
                }
            }
        }
        Some(InfoData::IpTunnel(infos)) => {
            for info in infos {
                match info {
                    InfoIpTunnel::Link(ifindex) => device.lower = nonzero(*ifindex),
                    InfoIpTunnel::Local(a) => device.local = specified(*a),
                    InfoIpTunnel::Remote(a) => device.remote = specified(*a),
                    InfoIpTunnel::Protocol(IpProtocol::Ipip) if *kind == InfoKind::Ip6Tnl => {
                        device.proto = Proto::Ipip
                    }
                    _ => {}
                }
            }
        }
        Some(InfoData::GreTun(infos) | InfoData::GreTap(infos) | InfoData::ErSpan(infos)) => {
            use netlink_packet_route::link::InfoGre;
            for info in infos {
                match *info {
                    InfoGre::Link(ifindex) => device.lower = nonzero(ifindex),
                    InfoGre::OKey(key) => device.key = nonzero(key),
                    InfoGre::Local(a) => device.local = specified(a.into()),
                    InfoGre::Remote(a) => device.remote = specified(a.into()),
                    _ => {}
                }
            }
        }
        Some(InfoData::GreTun6(infos) | InfoData::GreTap6(infos) | InfoData::Ip6ErSpan(infos)) => {
            use netlink_packet_route::link::InfoGre6;
            for info in infos {
                match *info {
                    InfoGre6::Link(ifindex) => device.lower = nonzero(ifindex),
                    InfoGre6::OKey(key) => device.key = nonzero(key),
                    InfoGre6::Local(a) => device.local = specified(a.into()),
                    InfoGre6::Remote(a) => device.remote = specified(a.into()),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    Some(device)
}

/// `addr` unless it is the unspecified address (how the kernel reports
/// "not set").
fn specified(addr: IpAddr) -> Option<IpAddr> {
    (!addr.is_unspecified()).then_some(addr)
}

/// `addr` when it is a unicast address.
fn unicast(addr: IpAddr) -> Option<IpAddr> {
    specified(addr).filter(|a| !a.is_multicast())
}

/// `ifindex` unless 0 (no device).
fn nonzero(ifindex: u32) -> Option<u32> {
    (ifindex != 0).then_some(ifindex)
}

/// An address record (IFA_LOCAL, else IFA_ADDRESS: on point-to-point links
/// IFA_ADDRESS is the far end).
fn address(message: &AddressMessage) -> Option<Address> {
    let mut local = None;
    let mut address = None;
    for attribute in &message.attributes {
        match attribute {
            AddressAttribute::Local(a) => local = Some(*a),
            AddressAttribute::Address(a) => address = Some(*a),
            _ => {}
        }
    }
    Some(Address {
        ifindex: message.header.index,
        addr: local.or(address)?,
        prefix_len: message.header.prefix_len,
    })
}

/// The route's next hops as records; none for routes that are not
/// unicast or that the kernel derived from an address (connected
/// prefixes, IPv6 link-local: they lead to no peer).
fn route(message: &RouteMessage) -> Vec<Route> {
    // Cloned routes are the kernel's cached exceptions (a path MTU learnt
    // for one destination, say), which a dump lists beside the routes: a
    // tunnel's inner peer address is no pod block.
    // Blackholes stay: Calico installs one for each block this node owns.
    if !matches!(
        message.header.kind,
        RouteType::Unicast | RouteType::BlackHole
    ) || message.header.protocol == RouteProtocol::Kernel
        || message.header.flags.contains(RouteFlags::Cloned)
    {
        return Vec::new();
    }
    route_hops(message)
}

/// One record per next hop of a route message (one for a single-path
/// route, one per RTA_MULTIPATH entry otherwise).
fn route_hops(message: &RouteMessage) -> Vec<Route> {
    let header: &RouteHeader = &message.header;
    let mut dst = None;
    let mut ifindex = None;
    let mut gateway = None;
    let mut mtu = None;
    let mut table = u32::from(header.table);
    let mut hops = Vec::new();
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Destination(a) => dst = route_address(a),
            RouteAttribute::Oif(i) => ifindex = Some(*i),
            RouteAttribute::Gateway(a) => gateway = route_address(a),
            RouteAttribute::Via(via) => gateway = via_address(via),
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Metrics(metrics) => {
                mtu = metrics.iter().find_map(|m| match m {
                    RouteMetric::Mtu(mtu) => Some(*mtu),
                    _ => None,
                })
            }
            RouteAttribute::MultiPath(next_hops) => {
                for hop in next_hops {
                    let gateway = hop.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Gateway(a) => route_address(a),
                        RouteAttribute::Via(via) => via_address(via),
                        _ => None,
                    });
                    hops.push((hop.interface_index, gateway));
                }
            }
            _ => {}
        }
    }
    // No RTA_DST: the default route of the family.
    let dst = dst.unwrap_or(match header.address_family {
        AddressFamily::Inet6 => Ipv6Addr::UNSPECIFIED.into(),
        _ => Ipv4Addr::UNSPECIFIED.into(),
    });
    let Ok(dst) = IpNet::new(dst, header.destination_prefix_length) else {
        return Vec::new();
    };
    let blackhole = header.kind == RouteType::BlackHole;
    if hops.is_empty() {
        // A blackhole has no device: index 0, which no interface has.
        hops.extend(ifindex.or(blackhole.then_some(0)).map(|i| (i, gateway)));
    }
    let origin = u8::from(header.protocol);
    hops.into_iter()
        .map(|(ifindex, gateway)| Route {
            dst,
            ifindex,
            gateway,
            mtu,
            table,
            origin,
            blackhole,
        })
        .collect()
}

fn route_address(address: &RouteAddress) -> Option<IpAddr> {
    match address {
        RouteAddress::Inet(a) => Some((*a).into()),
        RouteAddress::Inet6(a) => Some((*a).into()),
        _ => None,
    }
}

/// RTA_VIA: a next hop of the other family (IPv4 route via IPv6 gateway).
fn via_address(via: &RouteVia) -> Option<IpAddr> {
    match via {
        RouteVia::Inet(a) => Some((*a).into()),
        RouteVia::Inet6(a) => Some((*a).into()),
        _ => None,
    }
}

/// An ARP/NDP entry.
fn neighbour(message: &NeighbourMessage) -> Option<Neighbour> {
    let mut addr = None;
    let mut mac = None;
    for attribute in &message.attributes {
        match attribute {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => addr = Some((*a).into()),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => addr = Some((*a).into()),
            NeighbourAttribute::LinkLayerAddress(bytes) => mac = MacAddr::from_bytes(bytes),
            _ => {}
        }
    }
    Some(Neighbour {
        ifindex: message.header.ifindex,
        addr: addr?,
        mac,
    })
}

/// A vxlan FDB entry; `None` without a remote (NDA_DST) or a MAC.
fn fdb_entry(message: &NeighbourMessage, device: &TunnelDevice) -> Option<FdbEntry> {
    let mut mac = None;
    let mut dst = None;
    let mut vni = None;
    let mut port = None;
    for attribute in &message.attributes {
        match attribute {
            NeighbourAttribute::LinkLayerAddress(bytes) => mac = MacAddr::from_bytes(bytes),
            // AF_BRIDGE messages leave NDA_DST raw: 4 or 16 bytes.
            NeighbourAttribute::Destination(address) => {
                dst = match address {
                    NeighbourAddress::Inet(a) => Some((*a).into()),
                    NeighbourAddress::Inet6(a) => Some((*a).into()),
                    NeighbourAddress::Other(bytes) => raw_ip(bytes),
                    _ => None,
                }
            }
            NeighbourAttribute::Vni(v) => vni = Some(*v),
            NeighbourAttribute::Port(p) => port = Some(*p),
            _ => {}
        }
    }
    Some(FdbEntry {
        device: device.name.clone(),
        ifindex: device.ifindex,
        mac: mac?,
        dst: dst?,
        vni,
        port,
    })
}

fn raw_ip(bytes: &[u8]) -> Option<IpAddr> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        return Some(Ipv4Addr::from(v4).into());
    }
    <[u8; 16]>::try_from(bytes)
        .ok()
        .map(|v6| Ipv6Addr::from(v6).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::dataplane::DataPlane;

    /// A read of Calico's VXLAN data plane recorded in a namespace by
    /// `fuzz/record_seeds.py` (the `netlink` fuzz target's seed).
    const RECORDED: &[u8] = include_bytes!("../../../fuzz/seeds/netlink/calico-vxlan.bin");

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_recorded_read_resolves_like_the_node_it_was_recorded_on() {
        let messages = recorded_messages(RECORDED);
        let declared = ["wg0=wireguard".parse().unwrap()];
        let dump = recorded_dump(&messages, &declared);
        // The lookups of peer nodes' routes were not recorded.
        let plane = DataPlane::assemble(dump, |_| Ok(None)).unwrap();
        let devices: Vec<(&str, Proto, Option<u32>, Option<u16>)> = plane
            .devices
            .iter()
            .map(|d| (d.name.as_str(), d.proto, d.vni, d.port))
            .collect();
        assert_eq!(
            devices,
            [
                ("vxlan.calico", Proto::Vxlan, Some(4096), Some(4789)),
                ("vxlan-v6.calico", Proto::Vxlan, Some(4096), Some(4789)),
                ("wg0", Proto::Wireguard, None, None),
            ]
        );
        let routes: Vec<(String, Option<IpAddr>, Option<IpAddr>)> = plane
            .routes
            .iter()
            .map(|r| (r.dst.to_string(), r.gateway, r.node))
            .collect();
        assert_eq!(
            routes,
            [
                (
                    "192.168.20.0/26".into(),
                    Some(ip("192.168.20.0")),
                    Some(ip("10.10.60.2"))
                ),
                ("192.168.50.0/26".into(), None, None),
                (
                    "fd00:20::/122".into(),
                    Some(ip("fd00:20::")),
                    Some(ip("fd00:10::2"))
                ),
            ]
        );
        let blocks: Vec<(String, bool, usize)> = plane
            .blocks
            .iter()
            .map(|b| (b.block.to_string(), b.blackhole, b.next_hops.len()))
            .collect();
        assert_eq!(
            blocks,
            [
                ("192.168.10.0/26".into(), true, 0),
                ("192.168.20.0/26".into(), false, 1),
                ("192.168.30.0/26".into(), false, 1),
                ("192.168.40.0/26".into(), false, 2),
                ("192.168.50.0/26".into(), false, 1),
                ("fd00:20::/122".into(), false, 1),
            ]
        );
        let fdb: Vec<(String, IpAddr)> = plane
            .fdb
            .iter()
            .map(|f| (f.mac.to_string(), f.dst))
            .collect();
        assert_eq!(
            fdb,
            [
                // In the kernel's order: its FDB hash table's.
                ("00:00:00:00:00:00".into(), ip("10.10.60.3")),
                ("66:a0:00:00:00:02".into(), ip("10.10.60.2")),
                ("66:a0:00:00:00:02".into(), ip("fd00:10::2")),
            ]
        );
        // Beside the kernel's own multicast entries (IPv6, NOARP).
        let vteps: Vec<(IpAddr, u32)> = plane
            .neighbours
            .iter()
            .filter(|n| n.mac.is_some_and(|m| m.to_string() == "66:a0:00:00:00:02"))
            .map(|n| (n.addr, n.ifindex))
            .collect();
        assert_eq!(
            vteps,
            [
                (ip("192.168.20.0"), plane.devices[0].ifindex),
                (ip("fd00:20::"), plane.devices[1].ifindex)
            ]
        );
        assert_eq!(
            plane.node_owning(ip("192.168.20.7")),
            Some(ip("10.10.60.2"))
        );
    }

    #[test]
    fn framing_stops_at_a_length_that_does_not_fit() {
        // A 20-byte NLMSG_DONE carrying -ENOBUFS, then a header claiming
        // 64 bytes with 16 left.
        let mut data = Vec::new();
        data.extend_from_slice(&20u32.to_ne_bytes());
        data.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        data.extend_from_slice(&[0; 10]);
        data.extend_from_slice(&(-libc::ENOBUFS).to_ne_bytes());
        data.extend_from_slice(&64u32.to_ne_bytes());
        data.extend_from_slice(&[0; 12]);
        let framed: Vec<Result<(u16, i32), usize>> = envelopes(&data)
            .map(|e| e.map(|e| (e.kind, e.code())))
            .collect();
        assert_eq!(framed, [Ok((NLMSG_DONE, -libc::ENOBUFS)), Err(64)]);
        // Shorter than a header: no message at all.
        assert_eq!(envelopes(&data[..15]).count(), 0);
    }
}
