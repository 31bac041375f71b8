//! `observer probe`, the pure side: which (peer, encapsulation) pairs to
//! probe and with which addresses (from the data-plane view), the probe
//! packets' bytes, what a received frame says (an answer to a probe, or a
//! peer's tunnel packet and the source it arrived from), the size ladder,
//! and each pair's findings. The sockets are `node::probe`'s; the loop is
//! `cmd::probe`'s; the words are `report::probe`'s.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::{IpAddr, Ipv4Addr},
    str::FromStr,
    time::{Duration, SystemTime},
};

use etherparse::{IpHeaders, IpNumber, Ipv4Header, PacketBuilder};
use observer_common::{
    Direction, Proto,
    parse::{PortTable, SliceFrame, classify},
    ports,
};
use serde::Serialize;

use crate::model::{
    dataplane::{DataPlane, MacAddr, TunnelRoute},
    facts::{AllowSets, SetKind},
    rows::decode_addr,
};

/// The first bytes of every probe's ICMP payload: a probe is recognisable
/// on the wire (and in a capture) as the observer's, and the programs
/// count it apart from the flows.
pub const MAGIC: &[u8; 8] = &observer_common::PROBE_MAGIC;

/// The smallest inner packet: IPv4 (20) + ICMP echo (8) + [`MAGIC`].
pub const MIN_INNER: u32 = 20 + 8 + MAGIC.len() as u32;

/// Reachability probes per pair by default: few enough to be harmless on a
/// production node, enough to tell loss from silence.
pub const DEFAULT_COUNT: u32 = 5;
/// Probes per second of a run by default.
pub const DEFAULT_RATE: u32 = 20;
/// Wait for answers after a round by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// IP protocol number of ICMP.
const IPPROTO_ICMP: u8 = 1;

/// Inner packet size of the reachability probes: ping's default (56 bytes
/// of payload).
pub const BASE_INNER: u32 = 84;

/// An encapsulation to probe with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Encap {
    /// VXLAN to a UDP port.
    Vxlan {
        /// Destination port.
        port: u16,
    },
    /// Geneve to a UDP port.
    Geneve {
        /// Destination port.
        port: u16,
    },
    /// IPv4 in IPv4 (protocol 4).
    Ipip,
    /// No encapsulation: a plain UDP datagram to a port nothing listens on
    /// at the peer, answered by the peer's kernel with ICMP "port
    /// unreachable". Says whether UDP to that port crosses the path (a
    /// filter of UDP/4789 alone shows as `vxlan` unanswered and `udp:N`
    /// answered). Reachability only: the kernel rate-limits those errors,
    /// so no size ladder.
    Udp {
        /// Destination port.
        port: u16,
    },
}

impl Encap {
    /// The protocol the observer counts it as (`Other` for plain UDP).
    pub fn proto(self) -> Proto {
        match self {
            Encap::Vxlan { .. } => Proto::Vxlan,
            Encap::Geneve { .. } => Proto::Geneve,
            Encap::Ipip => Proto::Ipip,
            Encap::Udp { .. } => Proto::Other,
        }
    }

    /// Outer bytes before the inner IP packet: IPv4 + UDP + header +
    /// inner Ethernet for the UDP ones, IPv4 for IPIP; none for plain UDP
    /// (its size is the datagram's IP packet).
    pub fn overhead(self) -> u32 {
        match self {
            Encap::Vxlan { .. } | Encap::Geneve { .. } => 20 + 8 + 8 + 14,
            Encap::Ipip => 20,
            Encap::Udp { .. } => 0,
        }
    }

    /// Whether a size ladder is climbed with it.
    pub fn has_ladder(self) -> bool {
        !matches!(self, Encap::Udp { .. })
    }

    /// How it is named in prose: `VXLAN`, `Geneve`, `IPIP`, `UDP/5000`.
    pub fn prose(self) -> String {
        match self {
            Encap::Vxlan { .. } => "VXLAN".into(),
            Encap::Geneve { .. } => "Geneve".into(),
            Encap::Ipip => "IPIP".into(),
            Encap::Udp { port } => format!("UDP/{port}"),
        }
    }

    /// The encapsulation `proto` of a tunnel device listening on `port`.
    fn of_device(proto: Proto, port: Option<u16>) -> Option<Encap> {
        match proto {
            Proto::Vxlan => Some(Encap::Vxlan {
                port: port.unwrap_or(ports::VXLAN),
            }),
            Proto::Geneve => Some(Encap::Geneve {
                port: port.unwrap_or(ports::GENEVE),
            }),
            Proto::Ipip => Some(Encap::Ipip),
            _ => None,
        }
    }

    /// Whether both are the same encapsulation, whatever the port.
    fn same_kind(self, other: Encap) -> bool {
        self.proto() == other.proto()
    }
}

impl fmt::Display for Encap {
    /// `vxlan` on its standard port, else `vxlan:8472`; `ipip`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Encap::Vxlan { port } if port == ports::VXLAN => f.write_str("vxlan"),
            Encap::Vxlan { port } => write!(f, "vxlan:{port}"),
            Encap::Geneve { port } if port == ports::GENEVE => f.write_str("geneve"),
            Encap::Geneve { port } => write!(f, "geneve:{port}"),
            Encap::Ipip => f.write_str("ipip"),
            Encap::Udp { port } => write!(f, "udp:{port}"),
        }
    }
}

impl Serialize for Encap {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl FromStr for Encap {
    type Err = String;

    /// `vxlan[:PORT]`, `geneve[:PORT]` or `ipip`.
    fn from_str(text: &str) -> Result<Encap, String> {
        let (name, port) = match text.split_once(':') {
            Some((name, port)) => {
                let port: u16 = port
                    .parse()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| format!("{port:?} is not a UDP port (1-65535)"))?;
                (name, Some(port))
            }
            None => (text, None),
        };
        match (name, port) {
            ("vxlan", port) => Ok(Encap::Vxlan {
                port: port.unwrap_or(ports::VXLAN),
            }),
            ("geneve", port) => Ok(Encap::Geneve {
                port: port.unwrap_or(ports::GENEVE),
            }),
            ("ipip", None) => Ok(Encap::Ipip),
            ("ipip", Some(_)) => Err("ipip has no port (it is IP protocol 4)".into()),
            ("udp", Some(port)) => Ok(Encap::Udp { port }),
            ("udp", None) => Err("udp needs a port: udp:PORT".into()),
            _ => Err(format!(
                "unknown encapsulation {name:?}: use vxlan[:PORT], geneve[:PORT], ipip or udp:PORT"
            )),
        }
    }
}

/// One (peer, encapsulation) pair to probe, with the addresses that make
/// the peer's kernel decapsulate the probe and answer through its own
/// tunnel: the inner destination is the peer's own address, the inner
/// source this node's tunnel address, which the peer routes back through
/// the tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The peer node's underlay address (the outer destination).
    pub peer: Ipv4Addr,
    /// How the probe is encapsulated.
    pub encap: Encap,
    /// The local tunnel device whose address is the inner source.
    pub device: String,
    /// Its MTU: the largest inner packet the node sends through it.
    pub device_mtu: u32,
    /// VNI (VXLAN, Geneve): the local device's.
    pub vni: u32,
    /// Inner source: this node's address on `device`.
    pub inner_src: Ipv4Addr,
    /// Inner destination: the peer's VTEP address (VXLAN, Geneve) or its
    /// underlay address (IPIP: any address of its own makes it answer).
    pub inner_dst: Ipv4Addr,
    /// Inner Ethernet addresses (VXLAN, Geneve): the local device's and
    /// the peer VTEP's.
    pub macs: Option<(MacAddr, MacAddr)>,
    /// MTU of the underlay interface toward the peer: the largest outer
    /// packet this node can send.
    pub underlay_mtu: u32,
}

impl Target {
    /// The largest inner packet this node can send to the peer with this
    /// encapsulation: the top of the size ladder.
    pub fn max_inner(&self) -> u32 {
        self.underlay_mtu.saturating_sub(self.encap.overhead())
    }
}

/// A (peer, encapsulation) pair that cannot be probed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// The peer.
    pub peer: Ipv4Addr,
    /// The encapsulation.
    pub encap: Encap,
    /// Why, in words.
    pub why: String,
}

/// What to probe: the pairs, and those that cannot be.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The pairs to probe, by peer then encapsulation.
    pub targets: Vec<Target>,
    /// The pairs named (or used by the routes) that cannot be probed.
    pub skipped: Vec<Skipped>,
}

/// This node's side of a tunnel device: its IPv4 address and MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalEnd {
    /// The device's first IPv4 address.
    pub addr: Option<Ipv4Addr>,
    /// The device's MAC (VXLAN, Geneve).
    pub mac: Option<MacAddr>,
}

/// The local device (index) and the peer's VTEP (address, MAC) a tunnel
/// route names.
type RouteEnd = (u32, Option<(Ipv4Addr, MacAddr)>);

/// The encapsulation of `route` and its [`RouteEnd`]; `None` for a route
/// through a device that is no probed kind.
fn route_end(view: &DataPlane, route: &TunnelRoute) -> Option<(Encap, RouteEnd)> {
    let device = view.devices.iter().find(|d| d.ifindex == route.ifindex);
    let encap = Encap::of_device(route.proto, device.and_then(|d| d.port))?;
    let vtep = match (route.gateway, route.vtep_mac) {
        (Some(IpAddr::V4(gateway)), Some(mac)) => Some((gateway, mac)),
        _ => None,
    };
    Some((encap, (route.ifindex, vtep)))
}

/// Works out what to probe from the data plane `view`.
///
/// Peers: every node the tunnel routes lead to, or only `named` when
/// given (a named peer the view does not know can still be probed over
/// IPIP; VXLAN and Geneve need its VTEP's address and MAC from the
/// routes). Encapsulations: those the routes to each peer use, plus
/// `extra`. `local_end` gives a tunnel device's address and MAC by
/// interface index.
pub fn plan(
    view: &DataPlane,
    local_end: impl Fn(u32) -> LocalEnd,
    named: &[Ipv4Addr],
    extra: &[Encap],
) -> Plan {
    // (peer, encap) -> the device and VTEP of a route leading there.
    let mut by_pair: BTreeMap<(Ipv4Addr, Encap), Option<RouteEnd>> = BTreeMap::new();
    for route in &view.routes {
        let Some(IpAddr::V4(peer)) = route.node else {
            continue;
        };
        if !named.is_empty() && !named.contains(&peer) {
            continue;
        }
        if let Some((encap, end)) = route_end(view, route) {
            by_pair.entry((peer, encap)).or_insert(Some(end));
        }
    }
    let peers: Vec<Ipv4Addr> = if named.is_empty() {
        let mut peers: Vec<Ipv4Addr> = by_pair.keys().map(|(peer, _)| *peer).collect();
        peers.dedup();
        peers
    } else {
        named.to_vec()
    };
    for &peer in &peers {
        for &encap in extra {
            by_pair.entry((peer, encap)).or_insert(None);
        }
    }

    let mut out = Plan::default();
    for ((peer, encap), found) in by_pair {
        let skip = |why: String| Skipped { peer, encap, why };
        let underlay = view
            .peer_routes
            .iter()
            .find(|r| r.node == IpAddr::V4(peer))
            .and_then(|r| view.links.iter().find(|l| l.ifindex == r.ifindex));
        let underlay_mtu = underlay.map_or(1500, |l| l.mtu);
        if let Encap::Udp { .. } = encap {
            // Plain UDP needs no tunnel: the underlay is its device.
            out.targets.push(Target {
                peer,
                encap,
                device: underlay.map_or_else(|| "-".into(), |l| l.name.clone()),
                device_mtu: underlay_mtu,
                vni: 0,
                inner_src: Ipv4Addr::UNSPECIFIED,
                inner_dst: peer,
                macs: None,
                underlay_mtu,
            });
            continue;
        }
        // A pair added by --encap borrows the device and VTEP of a route
        // to the same peer with the same kind of encapsulation, if any.
        let found = found.or_else(|| {
            view.routes
                .iter()
                .filter(|r| r.node == Some(IpAddr::V4(peer)))
                .filter_map(|r| route_end(view, r))
                .find_map(|(theirs, end)| theirs.same_kind(encap).then_some(end))
        });
        // IPIP needs only a local IPIP device with an address.
        let found = found.or_else(|| {
            (encap == Encap::Ipip)
                .then(|| {
                    view.devices
                        .iter()
                        .find(|d| d.proto == Proto::Ipip)
                        .map(|d| (d.ifindex, None))
                })
                .flatten()
        });
        let Some((ifindex, vtep)) = found else {
            out.skipped.push(skip(match encap {
                Encap::Ipip => "this node has no IPIP device to answer to".into(),
                _ => format!(
                    "no {} route leads to this peer, so its VTEP address and MAC are unknown",
                    encap.proto().name()
                ),
            }));
            continue;
        };
        let Some(device) = view.devices.iter().find(|d| d.ifindex == ifindex) else {
            continue;
        };
        let end = local_end(ifindex);
        let Some(inner_src) = end.addr else {
            out.skipped.push(skip(format!(
                "{} has no IPv4 address for the peer to answer to",
                device.name
            )));
            continue;
        };
        let (inner_dst, macs) = match encap {
            Encap::Ipip | Encap::Udp { .. } => (peer, None),
            Encap::Vxlan { .. } | Encap::Geneve { .. } => {
                let Some((vtep_addr, vtep_mac)) = vtep else {
                    out.skipped.push(skip(
                        "the route to this peer names no VTEP address with a neighbour entry"
                            .into(),
                    ));
                    continue;
                };
                let Some(mac) = end.mac else {
                    out.skipped
                        .push(skip(format!("{} has no MAC address", device.name)));
                    continue;
                };
                (vtep_addr, Some((mac, vtep_mac)))
            }
        };
        out.targets.push(Target {
            peer,
            encap,
            device: device.name.clone(),
            device_mtu: device.mtu,
            vni: device.vni.unwrap_or(0),
            inner_src,
            inner_dst,
            macs,
            underlay_mtu,
        });
    }
    out
}

/// ICMP echo identifier and sequence number of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProbeId {
    /// The run's echo identifier.
    pub id: u16,
    /// The probe's sequence number in the run.
    pub seq: u16,
}

/// The outer IPv4 packet of one probe to `target`: an inner ICMP echo
/// request of `inner_len` bytes (at least [`MIN_INNER`]) from
/// `outer_src`, with DF set inside and out so that the size ladder
/// measures the path instead of fragmenting.
pub fn packet(target: &Target, outer_src: Ipv4Addr, probe: ProbeId, inner_len: u32) -> Vec<u8> {
    let inner_len = inner_len.clamp(MIN_INNER, u32::from(u16::MAX) - 100);
    let mut payload = vec![0u8; inner_len as usize - 28];
    payload[..MAGIC.len()].copy_from_slice(MAGIC);
    let inner_ip = df_header(target.inner_src, target.inner_dst, IpNumber::ICMP);
    let mut inner = Vec::with_capacity(inner_len as usize + 14);
    let written = match target.macs {
        Some((src, dst)) => PacketBuilder::ethernet2(src.0, dst.0)
            .ip(IpHeaders::Ipv4(inner_ip, Default::default()))
            .icmpv4_echo_request(probe.id, probe.seq)
            .write(&mut inner, &payload),
        None => PacketBuilder::ip(IpHeaders::Ipv4(inner_ip, Default::default()))
            .icmpv4_echo_request(probe.id, probe.seq)
            .write(&mut inner, &payload),
    };
    // Writing into a Vec fails only on sizes above the IPv4 maximum,
    // which the clamp above rules out.
    debug_assert!(written.is_ok());

    // A source port from the probe's flow, as Linux picks one per inner
    // flow (so ECMP spreads probes like the traffic they stand for).
    let sport = 32768 + (probe.id ^ target.peer.octets()[3] as u16) % 28232;
    let udp_header = |kind_header: [u8; 8], port: u16| {
        let mut body = Vec::with_capacity(8 + inner.len());
        body.extend_from_slice(&kind_header);
        body.extend_from_slice(&inner);
        let mut out = Vec::with_capacity(28 + body.len());
        let ip = df_header(outer_src, target.peer, IpNumber::UDP);
        let _ = PacketBuilder::ip(IpHeaders::Ipv4(ip, Default::default()))
            .udp(sport, port)
            .write(&mut out, &body);
        out
    };
    let vni = target.vni.to_be_bytes();
    match target.encap {
        // The IP identification carries the sequence number back in the
        // ICMP error's quote; the source port names the run.
        Encap::Udp { port } => {
            let mut ip = df_header(outer_src, target.peer, IpNumber::UDP);
            ip.identification = probe.seq;
            let mut out = Vec::with_capacity(inner_len as usize);
            let _ = PacketBuilder::ip(IpHeaders::Ipv4(ip, Default::default()))
                .udp(udp_source_port(probe.id), port)
                .write(
                    &mut out,
                    &payload[..payload.len().min(inner_len as usize - 28)],
                );
            out
        }
        // RFC 7348: flags with I set, reserved, VNI, reserved.
        Encap::Vxlan { port } => udp_header([0x08, 0, 0, 0, vni[1], vni[2], vni[3], 0], port),
        // RFC 8926: no options, protocol type Transparent Ethernet Bridging.
        Encap::Geneve { port } => udp_header([0, 0, 0x65, 0x58, vni[1], vni[2], vni[3], 0], port),
        Encap::Ipip => {
            let mut ip = df_header(outer_src, target.peer, IpNumber::IPV4);
            let _ = ip.set_payload_len(inner.len());
            ip.header_checksum = ip.calc_header_checksum();
            let mut out = Vec::with_capacity(20 + inner.len());
            let _ = ip.write(&mut out);
            out.extend_from_slice(&inner);
            out
        }
    }
}

/// The source port of a run's plain UDP probes (`udp:PORT`), from its
/// echo identifier: how their port-unreachable errors are told from
/// others'.
fn udp_source_port(id: u16) -> u16 {
    32768 + id % 28232
}

/// An IPv4 header with DF set (length and checksum are filled in when
/// written).
fn df_header(src: Ipv4Addr, dst: Ipv4Addr, protocol: IpNumber) -> Ipv4Header {
    let mut header = Ipv4Header::new(0, 64, protocol, src.octets(), dst.octets())
        .unwrap_or_else(|_| Ipv4Header::default());
    header.dont_fragment = true;
    header
}

/// What one received frame says to the prober.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// An echo reply to one of this run's probes.
    Answer {
        /// Its sequence number.
        seq: u16,
        /// The outer source it arrived from (the inner source when it
        /// arrived without encapsulation).
        from: IpAddr,
        /// How it arrived (`Other`: not encapsulated).
        proto: Proto,
    },
    /// A peer's tunnel packet: its inner source and the outer source it
    /// arrived from.
    Tunnel {
        /// The encapsulation.
        proto: Proto,
        /// Outer source.
        from: IpAddr,
        /// Inner source.
        inner_src: IpAddr,
    },
}

/// Reads a received Ethernet `frame` with the observer's own parser.
/// `id` is the run's echo identifier.
pub fn read_frame(frame: &[u8], ports: &impl PortTable, id: u16) -> Option<Seen> {
    let c = classify(&SliceFrame(frame), Direction::Rx, ports);
    let from = decode_addr(&c.peer, c.peer_family);
    let inner_src = decode_addr(&c.inner_src, c.inner_family);
    if c.l4_proto == IPPROTO_ICMP && c.l4_off != 0 {
        let icmp = frame.get(c.l4_off..c.l4_off + 8)?;
        // Port unreachable (3/3) quoting one of this run's plain UDP
        // probes: its IP identification is the sequence number.
        if c.proto == Proto::Other && icmp[0] == 3 && icmp[1] == 3 {
            let quote = frame.get(c.l4_off + 8..)?;
            let ihl = usize::from(quote.first()? & 0x0f) * 4;
            let sport = quote.get(ihl..ihl + 2)?;
            if quote.get(9) == Some(&17)
                && u16::from_be_bytes([sport[0], sport[1]]) == udp_source_port(id)
            {
                return Some(Seen::Answer {
                    seq: u16::from_be_bytes([*quote.get(4)?, *quote.get(5)?]),
                    from: plain_source(frame, c.l4_off)?,
                    proto: Proto::Other,
                });
            }
        }
        let echo_reply = icmp[0] == 0 && icmp[1] == 0;
        // The programs' parser marks tunnelled probes; an answer that
        // arrived plain is checked here.
        let marked = c.probe
            || (c.proto == Proto::Other
                && frame.get(c.l4_off + 8..c.l4_off + 8 + MAGIC.len()) == Some(&MAGIC[..]));
        let ours = marked && u16::from_be_bytes([icmp[4], icmp[5]]) == id;
        if echo_reply && ours {
            let from = match c.proto {
                Proto::Other => plain_source(frame, c.l4_off)?,
                _ => from?,
            };
            return Some(Seen::Answer {
                seq: u16::from_be_bytes([icmp[6], icmp[7]]),
                from,
                proto: c.proto,
            });
        }
    }
    match c.proto {
        Proto::Other => None,
        proto => Some(Seen::Tunnel {
            proto,
            from: from?,
            inner_src: inner_src?,
        }),
    }
}

/// The source of a plain (not encapsulated) IPv4 packet whose L4 header
/// starts at `l4_off`. The parser keeps no L2 length for plain frames, so
/// the IPv4 header is the one, after an Ethernet header and up to two
/// VLAN tags, whose length ends at `l4_off`.
fn plain_source(frame: &[u8], l4_off: usize) -> Option<IpAddr> {
    let start = [14, 18, 22].into_iter().find(|&l2| {
        frame
            .get(l2)
            .is_some_and(|&b| b >> 4 == 4 && l2 + usize::from(b & 0x0f) * 4 == l4_off)
    })?;
    let src: [u8; 4] = frame.get(start + 12..start + 16)?.try_into().ok()?;
    Some(IpAddr::V4(Ipv4Addr::from(src)))
}

/// The size ladder of one pair: a bisection for the largest inner packet
/// that is answered, between one known to pass and one past the largest
/// the node can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ladder {
    /// Largest size answered so far.
    passed: u32,
    /// Smallest size unanswered so far (or one past the largest sendable).
    failed: u32,
}

impl Ladder {
    /// A ladder from `passed` (answered) up to `max` (the largest the node
    /// can send).
    pub fn new(passed: u32, max: u32) -> Ladder {
        Ladder {
            passed,
            failed: max.max(passed) + 1,
        }
    }

    /// The next size to try; `None` once the answer is known.
    pub fn next(&self) -> Option<u32> {
        (self.failed - self.passed > 1).then(|| self.passed + (self.failed - self.passed) / 2)
    }

    /// Records whether `size` was answered.
    pub fn record(&mut self, size: u32, answered: bool) {
        if answered {
            self.passed = self.passed.max(size);
        } else {
            self.failed = self.failed.min(size);
        }
    }

    /// The largest size answered.
    pub fn largest(&self) -> u32 {
        self.passed
    }
}

/// Round-trip times of the answered probes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Rtt {
    /// Fastest, in milliseconds.
    pub min_ms: f64,
    /// Mean.
    pub avg_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Rtt {
    /// Of `samples`; `None` when there are none.
    pub fn of(samples: &[Duration]) -> Option<Rtt> {
        let ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        let min = ms.iter().copied().reduce(f64::min)?;
        let max = ms.iter().copied().reduce(f64::max)?;
        let round = |v: f64| (v * 1000.0).round() / 1000.0;
        Some(Rtt {
            min_ms: round(min),
            avg_ms: round(ms.iter().sum::<f64>() / ms.len() as f64),
            max_ms: round(max),
        })
    }
}

/// What the probes of one pair found.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The pair.
    pub target: Target,
    /// Reachability probes sent.
    pub sent: u32,
    /// Of those, answered.
    pub answered: u32,
    /// Their round-trip times.
    pub rtts: Vec<Duration>,
    /// Answers by the outer source they arrived from, and how they arrived.
    pub sources: BTreeMap<(IpAddr, Proto), u32>,
    /// The largest inner packet answered (the size ladder); `None` when
    /// nothing was answered or the ladder was not climbed.
    pub max_size: Option<u32>,
    /// Probes the size ladder sent.
    pub ladder_sent: u32,
    /// The peer's own tunnel packets of this encapsulation that arrived
    /// during the run (from any source).
    pub peer_arrivals: u64,
    /// Answer sources this node's allow-set refuses, with the set's
    /// names: those answers arrived at the wire and Calico drops them
    /// here.
    pub refused: BTreeMap<IpAddr, String>,
}

/// One thing wrong with a pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// No probe was answered.
    Unanswered,
    /// No probe was answered, yet the peer's own packets of this
    /// encapsulation arrived: the way from here to the peer (or the
    /// answers' way back) loses it, not both ways.
    OneWay {
        /// The peer's packets that arrived during the run.
        arrived: u64,
    },
    /// Some probes were not answered.
    Loss {
        /// Unanswered probes.
        lost: u32,
    },
    /// Answers arrived from an address that is not the peer's.
    AnswerSource {
        /// The address.
        from: IpAddr,
        /// The node that address is, when it is one.
        node: Option<IpAddr>,
    },
    /// Answers arrived without the encapsulation.
    NotEncapsulated,
    /// Answers arrived at the wire from a source this node's allow-set
    /// refuses: Calico drops them here.
    DroppedHere {
        /// The source.
        from: IpAddr,
        /// The allow-set(s) that refuse it.
        sets: String,
    },
    /// The tunnel device lets through packets the path cannot carry.
    DeviceMtuTooBig {
        /// The largest inner packet answered.
        max_size: u32,
        /// The device's MTU.
        device_mtu: u32,
    },
}

impl Outcome {
    /// What is wrong with the pair; empty when it is healthy. `is_node`
    /// says whether an address is a node of the view.
    pub fn findings(&self, is_node: impl Fn(IpAddr) -> bool) -> Vec<Finding> {
        let mut findings = Vec::new();
        if self.answered == 0 {
            findings.push(Finding::Unanswered);
            if self.peer_arrivals > 0 {
                findings.push(Finding::OneWay {
                    arrived: self.peer_arrivals,
                });
            }
            return findings;
        }
        if self.answered < self.sent {
            findings.push(Finding::Loss {
                lost: self.sent - self.answered,
            });
        }
        let peer = IpAddr::V4(self.target.peer);
        for &(from, proto) in self.sources.keys() {
            if let Some(sets) = self.refused.get(&from) {
                findings.push(Finding::DroppedHere {
                    from,
                    sets: sets.clone(),
                });
            }
            if proto == Proto::Other && self.target.encap.has_ladder() {
                findings.push(Finding::NotEncapsulated);
            } else if from != peer {
                findings.push(Finding::AnswerSource {
                    from,
                    node: is_node(from).then_some(from),
                });
            }
        }
        if let Some(max_size) = self.max_size
            && max_size < self.target.device_mtu
        {
            findings.push(Finding::DeviceMtuTooBig {
                max_size,
                device_mtu: self.target.device_mtu,
            });
        }
        findings.dedup();
        findings
    }
}

/// Keys of [`Run::arrivals`] kept.
pub const MAX_ARRIVALS: usize = 256;

/// What one probe run found.
#[derive(Debug, Clone)]
pub struct Run {
    /// When it started.
    pub at: SystemTime,
    /// One per probed pair.
    pub outcomes: Vec<Outcome>,
    /// The pairs that could not be probed.
    pub skipped: Vec<Skipped>,
    /// The peers' tunnel packets that arrived during the run, with their
    /// packet counts (at most [`MAX_ARRIVALS`] keys).
    pub arrivals: BTreeMap<Arrival, u64>,
    /// Such packets whose key found no room (the outer source is the
    /// sender's to choose).
    pub arrivals_overflow: u64,
    /// The nodes of the view (to say whether an address is one).
    pub nodes: BTreeSet<IpAddr>,
    /// Arrival sources this node's allow-set refuses, by encapsulation,
    /// with the set's names (Calico drops those packets here).
    pub refused: BTreeMap<(Proto, IpAddr), String>,
    /// Probes sent, all phases.
    pub sent: u64,
    /// Frames the listener's queue overflowed by (answers may be among).
    pub listener_drops: u64,
}

/// A peer's tunnel packet seen during a run: the node whose pod block
/// holds its inner source, how it was encapsulated, and the outer source
/// it arrived from (another address than the node's is source NAT on the
/// way: the incident's VXLAN arriving from the router's address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Arrival {
    /// The node whose pod block holds the inner source (`from_node`: a
    /// line's `node` is the lab's node name).
    #[serde(rename = "from_node")]
    pub node: IpAddr,
    /// The encapsulation.
    #[serde(serialize_with = "crate::model::facts::proto_name")]
    pub proto: Proto,
    /// The outer source it arrived from.
    pub arrived_from: IpAddr,
}

impl Run {
    /// Whether the run found nothing wrong: no pair skipped, no answer
    /// from a rewritten source, no finding on any pair.
    pub fn healthy(&self) -> bool {
        self.skipped.is_empty()
            && !self.arrivals.keys().any(Arrival::rewritten)
            && self
                .outcomes
                .iter()
                .all(|o| o.findings(|addr| self.nodes.contains(&addr)).is_empty())
    }
}

impl Arrival {
    /// Whether it arrived from another address than the node's.
    pub fn rewritten(&self) -> bool {
        self.arrived_from != self.node
    }
}

/// The names of the allow-set of `allow` that refuses tunnel packets of
/// `proto` from `from` (Calico drops them here); `None` when it allows
/// them or no set guards that encapsulation.
pub fn refusing_set(allow: &AllowSets, proto: Proto, from: IpAddr) -> Option<String> {
    let set = allow.get(SetKind::guarding(proto)?);
    (set.allows(from) == Some(false)).then(|| set.set_names().join(", "))
}

/// The [`Arrival`] `seen` is, if any: a tunnel packet whose inner source
/// belongs to a node by the routes of `view`.
pub fn arrival(view: &DataPlane, seen: &Seen) -> Option<Arrival> {
    let Seen::Tunnel {
        proto,
        from,
        inner_src,
    } = *seen
    else {
        return None;
    };
    Some(Arrival {
        node: view.node_owning(inner_src)?,
        proto,
        arrived_from: from,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        dataplane::{Address, Link, PeerRoute, TunnelDevice, TunnelRoute},
        ports::{PortArray, PortConfig},
    };

    const GPU: Ipv4Addr = Ipv4Addr::new(10, 10, 10, 62);
    const CP1: Ipv4Addr = Ipv4Addr::new(10, 10, 60, 127);
    const MAC_GPU: MacAddr = MacAddr([0x66, 0, 0, 0, 0, 1]);
    const MAC_CP1: MacAddr = MacAddr([0x66, 0, 0, 0, 0, 2]);

    /// gpu's view: cp1's VXLAN block via its VTEP 10.244.1.0, its IPIP
    /// block via 10.10.60.127 on tunl0.
    fn view() -> DataPlane {
        let link = |name: &str, ifindex, mtu, kind: Option<&str>| Link {
            name: name.into(),
            ifindex,
            mtu,
            kind: kind.map(Into::into),
            up: true,
            loopback: false,
        };
        let links = vec![
            link("eth0", 2, 1500, Some("veth")),
            link("vxlan.calico", 3, 1450, Some("vxlan")),
            link("tunl0", 4, 1480, Some("ipip")),
        ];
        let mut vxlan = TunnelDevice::of_link(&links[1], Proto::Vxlan, "vxlan".into());
        vxlan.vni = Some(4096);
        vxlan.port = Some(4789);
        let ipip = TunnelDevice::of_link(&links[2], Proto::Ipip, "ipip".into());
        let route = |dst: &str, ifindex, proto, gateway: Ipv4Addr, mac| TunnelRoute {
            dst: dst.parse().unwrap(),
            device: String::new(),
            ifindex,
            proto,
            gateway: Some(IpAddr::V4(gateway)),
            mtu: None,
            table: 254,
            vtep_mac: mac,
            node: Some(IpAddr::V4(CP1)),
        };
        DataPlane {
            addresses: vec![Address {
                ifindex: 3,
                addr: "10.244.0.0".parse().unwrap(),
                prefix_len: 32,
            }],
            devices: vec![vxlan, ipip],
            routes: vec![
                route(
                    "10.244.1.0/26",
                    3,
                    Proto::Vxlan,
                    Ipv4Addr::new(10, 244, 1, 0),
                    Some(MAC_CP1),
                ),
                route("10.245.1.0/26", 4, Proto::Ipip, CP1, None),
            ],
            peer_routes: vec![PeerRoute {
                node: IpAddr::V4(CP1),
                ifindex: 2,
                gateway: None,
            }],
            links,
            neighbours: Vec::new(),
            fdb: Vec::new(),
            underlay: Vec::new(),
            blocks: Vec::new(),
        }
    }

    fn local_end(ifindex: u32) -> LocalEnd {
        match ifindex {
            3 => LocalEnd {
                addr: Some(Ipv4Addr::new(10, 244, 0, 0)),
                mac: Some(MAC_GPU),
            },
            4 => LocalEnd {
                addr: Some(Ipv4Addr::new(10, 245, 0, 0)),
                mac: None,
            },
            _ => LocalEnd {
                addr: None,
                mac: None,
            },
        }
    }

    #[test]
    fn the_routes_give_each_peer_its_encapsulations_and_addresses() {
        let plan = plan(&view(), local_end, &[], &[]);
        assert!(plan.skipped.is_empty(), "{:?}", plan.skipped);
        let [vxlan, ipip] = &plan.targets[..] else {
            panic!("{:?}", plan.targets)
        };
        assert_eq!(vxlan.encap, Encap::Vxlan { port: 4789 });
        assert_eq!(vxlan.inner_dst, Ipv4Addr::new(10, 244, 1, 0));
        assert_eq!(vxlan.inner_src, Ipv4Addr::new(10, 244, 0, 0));
        assert_eq!(vxlan.macs, Some((MAC_GPU, MAC_CP1)));
        assert_eq!(
            (vxlan.vni, vxlan.device_mtu, vxlan.max_inner()),
            (4096, 1450, 1450)
        );
        assert_eq!(ipip.encap, Encap::Ipip);
        assert_eq!(ipip.inner_dst, CP1);
        assert_eq!((ipip.device_mtu, ipip.max_inner()), (1480, 1480));
    }

    #[test]
    fn named_peers_and_extra_encapsulations_are_probed_or_said_why_not() {
        let plan = plan(
            &view(),
            local_end,
            &[GPU, CP1],
            &["geneve".parse().unwrap(), Encap::Ipip],
        );
        let probed: Vec<(Ipv4Addr, String)> = plan
            .targets
            .iter()
            .map(|t| (t.peer, t.encap.to_string()))
            .collect();
        // gpu is in no route: IPIP still works (it needs no VTEP).
        assert_eq!(
            probed,
            [
                (GPU, "ipip".to_string()),
                (CP1, "vxlan".to_string()),
                (CP1, "ipip".to_string())
            ]
        );
        let skipped: Vec<(Ipv4Addr, String)> = plan
            .skipped
            .iter()
            .map(|s| (s.peer, s.encap.to_string()))
            .collect();
        assert_eq!(
            skipped,
            [(GPU, "geneve".to_string()), (CP1, "geneve".to_string())]
        );
        assert!(
            plan.skipped[0]
                .why
                .contains("VTEP address and MAC are unknown")
        );
    }

    #[test]
    fn encapsulations_parse_as_written_on_the_command_line() {
        assert_eq!("vxlan".parse(), Ok(Encap::Vxlan { port: 4789 }));
        assert_eq!("vxlan:8472".parse(), Ok(Encap::Vxlan { port: 8472 }));
        assert_eq!("geneve".parse(), Ok(Encap::Geneve { port: 6081 }));
        assert_eq!("ipip".parse(), Ok(Encap::Ipip));
        assert!("ipip:4".parse::<Encap>().unwrap_err().contains("no port"));
        assert!(
            "vxlan:0"
                .parse::<Encap>()
                .unwrap_err()
                .contains("not a UDP port")
        );
        assert!(
            "gre"
                .parse::<Encap>()
                .unwrap_err()
                .contains("unknown encapsulation")
        );
        assert_eq!(Encap::Vxlan { port: 8472 }.to_string(), "vxlan:8472");
    }

    /// The answer a peer sends to `probe`: the request's packet with the
    /// addresses swapped and an echo reply, behind an Ethernet header.
    fn answer_frame(target: &Target, outer_src: Ipv4Addr, probe: ProbeId, size: u32) -> Vec<u8> {
        let back = Target {
            peer: GPU,
            inner_src: target.inner_dst,
            inner_dst: target.inner_src,
            macs: target.macs.map(|(a, b)| (b, a)),
            ..target.clone()
        };
        let mut ip = packet(&back, outer_src, probe, size);
        let inner_icmp = ip.len() - (size as usize - 20);
        ip[inner_icmp] = 0; // echo reply
        let mut frame = vec![0u8; 12];
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(&ip);
        frame
    }

    #[test]
    fn probes_parse_as_their_encapsulation_and_answers_are_recognised() {
        let ports = PortArray::new(&PortConfig::default()).unwrap();
        let probe = ProbeId { id: 0x4242, seq: 7 };
        for target in plan(&view(), local_end, &[], &[]).targets {
            let ip = packet(&target, GPU, probe, 1000);
            assert_eq!(ip.len() as u32, 1000 + target.encap.overhead());
            assert_eq!(ip[6] & 0x40, 0x40, "DF is set outside");
            let mut frame = vec![0u8; 12];
            frame.extend_from_slice(&[0x08, 0x00]);
            frame.extend_from_slice(&ip);
            // As the peer sees it: a tunnel packet from gpu.
            assert_eq!(
                read_frame(&frame, &ports, 1),
                Some(Seen::Tunnel {
                    proto: target.encap.proto(),
                    from: IpAddr::V4(GPU),
                    inner_src: IpAddr::V4(target.inner_src),
                })
            );
            let answer = answer_frame(&target, CP1, probe, 1000);
            assert_eq!(
                read_frame(&answer, &ports, 0x4242),
                Some(Seen::Answer {
                    seq: 7,
                    from: IpAddr::V4(CP1),
                    proto: target.encap.proto()
                })
            );
            // Another run's answer is only a tunnel packet.
            assert!(matches!(
                read_frame(&answer, &ports, 0x4243),
                Some(Seen::Tunnel { .. })
            ));
        }
    }

    #[test]
    fn plain_udp_probes_are_answered_by_a_port_unreachable_quoting_them() {
        let ports = PortArray::new(&PortConfig::default()).unwrap();
        let plan = plan(&view(), local_end, &[CP1], &["udp:9999".parse().unwrap()]);
        let udp = plan
            .targets
            .iter()
            .find(|t| t.encap == Encap::Udp { port: 9999 })
            .expect("a udp:9999 pair");
        assert_eq!((udp.device.as_str(), udp.device_mtu), ("eth0", 1500));
        assert!(!udp.encap.has_ladder());
        let probe = ProbeId { id: 0x4242, seq: 7 };
        let ip = packet(udp, GPU, probe, BASE_INNER);
        assert_eq!(ip.len() as u32, BASE_INNER);
        assert_eq!((ip[9], u16::from_be_bytes([ip[22], ip[23]])), (17, 9999));
        // The peer's kernel: ICMP 3/3 from cp1 quoting the probe's first
        // 28 bytes, behind an Ethernet header.
        let mut icmp = vec![3, 3, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(&ip[..28]);
        let mut answer = Vec::new();
        PacketBuilder::ethernet2([2; 6], [4; 6])
            .ipv4(CP1.octets(), GPU.octets(), 64)
            .write(&mut answer, IpNumber::ICMP, &icmp)
            .unwrap();
        assert_eq!(
            read_frame(&answer, &ports, 0x4242),
            Some(Seen::Answer {
                seq: 7,
                from: IpAddr::V4(CP1),
                proto: Proto::Other
            })
        );
        // Another run's (another source port) is nothing to this one.
        assert_eq!(read_frame(&answer, &ports, 0x4243), None);
        assert_eq!(Encap::Udp { port: 9999 }.to_string(), "udp:9999");
        assert_eq!("udp:9999".parse(), Ok(Encap::Udp { port: 9999 }));
        assert!("udp".parse::<Encap>().unwrap_err().contains("needs a port"));
    }

    #[test]
    fn a_node_arriving_from_another_address_is_rewritten() {
        let view = view();
        let snat: IpAddr = "10.10.10.244".parse().unwrap();
        let seen = Seen::Tunnel {
            proto: Proto::Vxlan,
            from: snat,
            inner_src: "10.244.1.0".parse().unwrap(),
        };
        let snatted = arrival(&view, &seen).unwrap();
        assert_eq!(
            snatted,
            Arrival {
                node: IpAddr::V4(CP1),
                proto: Proto::Vxlan,
                arrived_from: snat
            }
        );
        assert!(snatted.rewritten());
        let direct = Seen::Tunnel {
            proto: Proto::Vxlan,
            from: IpAddr::V4(CP1),
            inner_src: "10.244.1.0".parse().unwrap(),
        };
        assert!(!arrival(&view, &direct).unwrap().rewritten());
        let stranger = Seen::Tunnel {
            proto: Proto::Vxlan,
            from: IpAddr::V4(CP1),
            inner_src: "192.0.2.1".parse().unwrap(),
        };
        assert_eq!(arrival(&view, &stranger), None);
    }

    #[test]
    fn the_ladder_finds_the_largest_size_that_passes() {
        for limit in [84, 85, 1350, 1380, 1449, 1450] {
            let mut ladder = Ladder::new(84, 1450);
            let mut steps = 0;
            while let Some(size) = ladder.next() {
                ladder.record(size, size <= limit);
                steps += 1;
            }
            assert_eq!(ladder.largest(), limit);
            assert!(steps <= 11, "{steps} steps");
        }
    }

    #[test]
    fn findings_name_loss_rewritten_answers_and_a_device_mtu_the_path_cannot_carry() {
        let target = plan(&view(), local_end, &[], &[]).targets.remove(0);
        let mut outcome = Outcome {
            target,
            sent: 5,
            answered: 5,
            rtts: vec![Duration::from_millis(1); 5],
            sources: BTreeMap::from([((IpAddr::V4(CP1), Proto::Vxlan), 5)]),
            max_size: Some(1450),
            ladder_sent: 9,
            peer_arrivals: 0,
            refused: BTreeMap::new(),
        };
        assert_eq!(outcome.findings(|_| true), []);
        outcome.answered = 4;
        outcome.max_size = Some(1350);
        outcome.sources = BTreeMap::from([(("10.10.10.244".parse().unwrap(), Proto::Vxlan), 4)]);
        assert_eq!(
            outcome.findings(|_| false),
            [
                Finding::Loss { lost: 1 },
                Finding::AnswerSource {
                    from: "10.10.10.244".parse().unwrap(),
                    node: None
                },
                Finding::DeviceMtuTooBig {
                    max_size: 1350,
                    device_mtu: 1450
                }
            ]
        );
        let snat: IpAddr = "10.10.10.244".parse().unwrap();
        outcome.refused = BTreeMap::from([(snat, "cali40all-vxlan-net".to_string())]);
        assert_eq!(
            outcome.findings(|_| false)[1],
            Finding::DroppedHere {
                from: snat,
                sets: "cali40all-vxlan-net".into()
            }
        );
        outcome.answered = 0;
        assert_eq!(outcome.findings(|_| true), [Finding::Unanswered]);
        outcome.peer_arrivals = 3;
        assert_eq!(
            outcome.findings(|_| true),
            [Finding::Unanswered, Finding::OneWay { arrived: 3 }]
        );
    }

    #[test]
    fn round_trip_times_summarise_in_milliseconds() {
        let rtt = Rtt::of(&[
            Duration::from_micros(500),
            Duration::from_micros(1500),
            Duration::from_micros(1000),
        ])
        .unwrap();
        assert_eq!((rtt.min_ms, rtt.avg_ms, rtt.max_ms), (0.5, 1.0, 1.5));
        assert_eq!(Rtt::of(&[]), None);
    }
}
