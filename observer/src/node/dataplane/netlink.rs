//! The rtnetlink side: one NETLINK_ROUTE socket, dump requests read until
//! NLMSG_DONE, and the conversion of kernel messages into the plain records
//! of the view. Messages or attributes the parser does not know are
//! skipped, never fatal.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result, bail};
use ipnet::IpNet;
use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_MULTIPART, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR,
    NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
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
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use observer_common::Proto;

use crate::model::dataplane::{
    Address, DeclaredTunnel, Dump, FdbEntry, Link, MacAddr, Neighbour, PeerRoute, Route,
    TunnelDevice, add_declared,
};

/// How often a dump is retried when the kernel says that the tables
/// changed while it was being read (NLM_F_DUMP_INTR).
const DUMP_ATTEMPTS: usize = 5;

/// Netlink message header length.
const HEADER_LEN: usize = 16;

/// How the kernel answered one request.
enum Reply {
    /// Every message of the answer.
    Complete(Vec<RouteNetlinkMessage>),
    /// The dump was interrupted by a change: read it again.
    Interrupted,
    /// The kernel refused the request with this error.
    Refused(std::io::Error),
}

/// A NETLINK_ROUTE socket in the calling thread's network namespace.
pub(super) struct Rtnl {
    socket: Socket,
    seq: u32,
}

impl Rtnl {
    /// Opens and binds the socket.
    pub fn open() -> Result<Rtnl> {
        let mut socket = Socket::new(NETLINK_ROUTE)
            .context("opening a NETLINK_ROUTE socket (the data plane is read through rtnetlink)")?;
        socket
            .bind_auto()
            .context("binding the NETLINK_ROUTE socket")?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .context("connecting the NETLINK_ROUTE socket to the kernel")?;
        Ok(Rtnl { socket, seq: 0 })
    }

    /// Every link, and the tunnel devices among them.
    pub fn links(&mut self) -> Result<(Vec<Link>, Vec<TunnelDevice>)> {
        let replies = self.dump(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            "dumping links (RTM_GETLINK)",
        )?;
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
        devices.sort_by_key(|d| d.ifindex);
        Ok((links, devices))
    }

    /// Links, addresses, routes, neighbours and the vxlan FDB.
    pub fn dump_all(&mut self, declared: &[DeclaredTunnel]) -> Result<Dump> {
        let (links, mut devices) = self.links()?;
        add_declared(&links, &mut devices, declared);
        let tunnel = |ifindex: u32| devices.iter().find(|d| d.ifindex == ifindex);

        let mut addresses = Vec::new();
        for reply in self.dump(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            "dumping addresses (RTM_GETADDR)",
        )? {
            if let RouteNetlinkMessage::NewAddress(message) = reply {
                addresses.extend(address(&message));
            }
        }
        addresses.sort_by_key(|a| (a.ifindex, a.addr));

        let mut routes = Vec::new();
        for (family, what) in [
            (AddressFamily::Inet, "dumping IPv4 routes (RTM_GETROUTE)"),
            (AddressFamily::Inet6, "dumping IPv6 routes (RTM_GETROUTE)"),
        ] {
            let mut request = RouteMessage::default();
            request.header.address_family = family;
            for reply in self.dump(RouteNetlinkMessage::GetRoute(request), what)? {
                if let RouteNetlinkMessage::NewRoute(message) = reply {
                    routes.extend(route(&message));
                }
            }
        }

        let mut neighbours = Vec::new();
        let mut fdb = Vec::new();
        for (family, what) in [
            (
                AddressFamily::Inet,
                "dumping IPv4 neighbours (RTM_GETNEIGH)",
            ),
            (
                AddressFamily::Inet6,
                "dumping IPv6 neighbours (RTM_GETNEIGH)",
            ),
            (
                AddressFamily::Bridge,
                "dumping the FDB (RTM_GETNEIGH, AF_BRIDGE)",
            ),
        ] {
            let mut request = NeighbourMessage::default();
            request.header.family = family;
            for reply in self.dump(RouteNetlinkMessage::GetNeighbour(request), what)? {
                let RouteNetlinkMessage::NewNeighbour(message) = reply else {
                    continue;
                };
                // Only tunnel devices: the underlay's neighbours and the
                // bridges' FDB can be large and say nothing about peers.
                let Some(device) = tunnel(message.header.ifindex) else {
                    continue;
                };
                if family == AddressFamily::Bridge {
                    if device.proto == Proto::Vxlan {
                        fdb.extend(fdb_entry(&message, device));
                    }
                } else {
                    neighbours.extend(neighbour(&message));
                }
            }
        }

        Ok(Dump {
            links,
            addresses,
            devices,
            routes,
            neighbours,
            fdb,
        })
    }

    /// The kernel's route to `node` (`ip route get NODE`); `None` when the
    /// node is unreachable or one of this node's own addresses.
    pub fn route_to(&mut self, node: IpAddr) -> Result<Option<PeerRoute>> {
        let mut request = RouteMessage::default();
        (
            request.header.address_family,
            request.header.destination_prefix_length,
        ) = match node {
            IpAddr::V4(_) => (AddressFamily::Inet, 32),
            IpAddr::V6(_) => (AddressFamily::Inet6, 128),
        };
        request
            .attributes
            .push(RouteAttribute::Destination(node.into()));
        let what = format!("looking up the route to peer node {node} (RTM_GETROUTE)");
        let replies = match self.exchange(RouteNetlinkMessage::GetRoute(request), false, &what)? {
            Reply::Complete(replies) => replies,
            Reply::Refused(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ENETDOWN)
                ) =>
            {
                return Ok(None);
            }
            Reply::Refused(e) => return Err(e).context(what),
            // Only dumps are ever interrupted; a lookup has nothing to retry.
            Reply::Interrupted => return Ok(None),
        };
        Ok(replies.into_iter().find_map(|reply| {
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
        }))
    }

    /// A dump request, retried while the kernel reports it interrupted.
    fn dump(
        &mut self,
        request: RouteNetlinkMessage,
        what: &str,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        for _ in 0..DUMP_ATTEMPTS {
            match self.exchange(request.clone(), true, what)? {
                Reply::Complete(replies) => return Ok(replies),
                Reply::Interrupted => continue,
                Reply::Refused(e) => return Err(e).context(what.to_string()),
            }
        }
        bail!(
            "{what}: the kernel's tables changed during each of {DUMP_ATTEMPTS} dumps \
             (NLM_F_DUMP_INTR); the data plane is being rewritten, read it again later"
        )
    }

    /// Sends one request and reads its answer: until NLMSG_DONE for a
    /// dump, else until the first message that is not part of a multipart
    /// answer.
    fn exchange(&mut self, request: RouteNetlinkMessage, dump: bool, what: &str) -> Result<Reply> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { 0 };
        header.sequence_number = self.seq;
        let mut message = NetlinkMessage::new(header, NetlinkPayload::from(request));
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        self.socket
            .send(&bytes, 0)
            .with_context(|| format!("{what}: sending the request"))?;

        let mut replies = Vec::new();
        let mut interrupted = false;
        loop {
            let (data, _) = self
                .socket
                .recv_from_full()
                .with_context(|| format!("{what}: reading the answer"))?;
            let mut offset = 0;
            while offset + HEADER_LEN <= data.len() {
                let field = |at: usize, len: usize| &data[offset + at..offset + at + len];
                let length = u32::from_ne_bytes(field(0, 4).try_into()?) as usize;
                let kind = u16::from_ne_bytes(field(4, 2).try_into()?);
                let flags = u16::from_ne_bytes(field(6, 2).try_into()?);
                let seq = u32::from_ne_bytes(field(8, 4).try_into()?);
                if length < HEADER_LEN || offset + length > data.len() {
                    bail!("{what}: the kernel sent a malformed netlink message (length {length})");
                }
                let bytes = &data[offset..offset + length];
                offset += length.next_multiple_of(4);
                // A late answer to an earlier request that gave up early.
                if seq != self.seq {
                    continue;
                }
                interrupted |= flags & NLM_F_DUMP_INTR != 0;
                match kind {
                    // DONE and ERROR both carry an errno (0: success).
                    NLMSG_DONE | NLMSG_ERROR => {
                        let code = match bytes.get(HEADER_LEN..HEADER_LEN + 4) {
                            Some(code) => i32::from_ne_bytes(code.try_into()?),
                            None => 0,
                        };
                        return Ok(if code < 0 {
                            Reply::Refused(std::io::Error::from_raw_os_error(-code))
                        } else if interrupted {
                            Reply::Interrupted
                        } else {
                            Reply::Complete(replies)
                        });
                    }
                    _ => match NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes) {
                        Ok(message) => {
                            if let NetlinkPayload::InnerMessage(inner) = message.payload {
                                replies.push(inner);
                            }
                        }
                        Err(e) => {
                            tracing::warn!("{what}: skipping a message the parser rejects: {e}")
                        }
                    },
                }
                if !dump && flags & NLM_F_MULTIPART == 0 {
                    return Ok(Reply::Complete(replies));
                }
            }
        }
    }
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
