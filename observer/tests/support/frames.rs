//! Frame builders (owned by the test-run tests).
//!
//! Every builder returns plain bytes, so a test can truncate or corrupt the
//! result at will. As built, frames are complete and valid: Ethernet header
//! (no FCS), IPv4 header checksums, UDP/TCP/ICMP checksums over the
//! pseudo-header, GRE checksums when the C bit is set. The same frames can
//! therefore be sent on a raw `AF_PACKET` socket and survive a real stack.
//!
//! Layers compose from the inside out; each function documents which layer
//! it returns:
//!
//! ```ignore
//! let inner = eth(ETH_P_IP, &icmp4_packet(addr4("10.1.0.1"), addr4("10.1.0.2")));
//! let frame = vxlan_frame(addr("192.0.2.1"), addr("192.0.2.2"), 42, &inner);
//! // the same, by hand:
//! let payload = cat(&[&vxlan_header(42), &inner]);
//! let frame2 = udp_frame(addr("192.0.2.1"), addr("192.0.2.2"), ENTROPY_PORT, VXLAN_PORT, &payload);
//! assert_eq!(frame, frame2);
//! ```
//!
//! Lengths of the fixed headers are exported (`ETH_HLEN`, `IPV4_HLEN`, ...)
//! so that tests can compute offsets such as "end of the encapsulation
//! header" without parsing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Ethernet header length (no tags).
pub const ETH_HLEN: usize = 14;
/// One 802.1Q / 802.1ad tag.
pub const VLAN_HLEN: usize = 4;
/// IPv4 header without options.
pub const IPV4_HLEN: usize = 20;
/// IPv6 fixed header.
pub const IPV6_HLEN: usize = 40;
/// UDP header.
pub const UDP_HLEN: usize = 8;
/// TCP header without options.
pub const TCP_HLEN: usize = 20;
/// VXLAN and VXLAN-GPE header.
pub const VXLAN_HLEN: usize = 8;
/// Geneve header without options.
pub const GENEVE_HLEN: usize = 8;
/// GRE header without optional fields.
pub const GRE_HLEN: usize = 4;

/// EtherType IPv4.
pub const ETH_P_IP: u16 = 0x0800;
/// EtherType ARP.
pub const ETH_P_ARP: u16 = 0x0806;
/// EtherType IPv6.
pub const ETH_P_IPV6: u16 = 0x86dd;
/// EtherType (TPID) of an 802.1Q tag.
pub const ETH_P_8021Q: u16 = 0x8100;
/// EtherType (TPID) of an 802.1ad (QinQ service) tag.
pub const ETH_P_8021AD: u16 = 0x88a8;
/// Transparent Ethernet bridging (GRE / Geneve protocol of an inner Ethernet frame).
pub const ETH_P_TEB: u16 = 0x6558;

/// IPv6 hop-by-hop options header.
pub const IPPROTO_HOPOPTS: u8 = 0;
/// ICMP.
pub const IPPROTO_ICMP: u8 = 1;
/// IPv4 in IP.
pub const IPPROTO_IPIP: u8 = 4;
/// TCP.
pub const IPPROTO_TCP: u8 = 6;
/// UDP.
pub const IPPROTO_UDP: u8 = 17;
/// IPv6 in IP.
pub const IPPROTO_IPV6: u8 = 41;
/// IPv6 routing header.
pub const IPPROTO_ROUTING: u8 = 43;
/// IPv6 fragment header.
pub const IPPROTO_FRAGMENT: u8 = 44;
/// GRE.
pub const IPPROTO_GRE: u8 = 47;
/// ESP.
pub const IPPROTO_ESP: u8 = 50;
/// Authentication header.
pub const IPPROTO_AH: u8 = 51;
/// ICMPv6.
pub const IPPROTO_ICMPV6: u8 = 58;
/// IPv6 "no next header".
pub const IPPROTO_NONE: u8 = 59;
/// IPv6 destination options header.
pub const IPPROTO_DSTOPTS: u8 = 60;

/// IANA VXLAN port.
pub const VXLAN_PORT: u16 = 4789;
/// Linux' historical VXLAN port (flannel, Cilium).
pub const VXLAN_LINUX_PORT: u16 = 8472;
/// IANA VXLAN-GPE port.
pub const VXLAN_GPE_PORT: u16 = 4790;
/// IANA Geneve port.
pub const GENEVE_PORT: u16 = 6081;
/// WireGuard's customary listen port.
pub const WIREGUARD_PORT: u16 = 51820;
/// Source port the encapsulation builders use (tunnel endpoints pick one
/// from a flow hash; any ephemeral port will do).
pub const ENTROPY_PORT: u16 = 49153;

/// VXLAN-GPE next protocol: IPv4.
pub const GPE_NEXT_IPV4: u8 = 1;
/// VXLAN-GPE next protocol: IPv6.
pub const GPE_NEXT_IPV6: u8 = 2;
/// VXLAN-GPE next protocol: Ethernet.
pub const GPE_NEXT_ETHERNET: u8 = 3;

/// Default destination MAC of [`eth`] (locally administered unicast).
pub const MAC_DST: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x02];
/// Default source MAC of [`eth`] (locally administered unicast).
pub const MAC_SRC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x01];

/// Parses an IPv4 or IPv6 address; panics on a typo (test helper).
pub fn addr(text: &str) -> IpAddr {
    text.parse()
        .unwrap_or_else(|_| panic!("bad address {text}"))
}

/// Parses an IPv4 address; panics on a typo.
pub fn addr4(text: &str) -> Ipv4Addr {
    text.parse()
        .unwrap_or_else(|_| panic!("bad IPv4 address {text}"))
}

/// Parses an IPv6 address; panics on a typo.
pub fn addr6(text: &str) -> Ipv6Addr {
    text.parse()
        .unwrap_or_else(|_| panic!("bad IPv6 address {text}"))
}

/// Concatenates byte slices.
pub fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// The Internet checksum (RFC 1071) of the concatenation of `parts`, as the
/// value to store in the header (already complemented).
pub fn internet_checksum(parts: &[&[u8]]) -> u16 {
    let data = parts.concat();
    let mut sum: u32 = 0;
    for chunk in data.chunks(2) {
        let word = if chunk.len() == 2 {
            u16::from_be_bytes([chunk[0], chunk[1]])
        } else {
            u16::from_be_bytes([chunk[0], 0])
        };
        sum += word as u32;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

// ---------------------------------------------------------------- layer 2

/// One VLAN tag: TPID (0x8100 or 0x88a8) and VLAN id (priority 0, DEI 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vlan {
    /// Tag protocol identifier.
    pub tpid: u16,
    /// VLAN id (12 bits).
    pub vid: u16,
}

impl Vlan {
    /// A customer tag (802.1Q, TPID 0x8100).
    pub const fn dot1q(vid: u16) -> Vlan {
        Vlan {
            tpid: ETH_P_8021Q,
            vid,
        }
    }

    /// A service tag (802.1ad, TPID 0x88a8), the outer tag of QinQ.
    pub const fn dot1ad(vid: u16) -> Vlan {
        Vlan {
            tpid: ETH_P_8021AD,
            vid,
        }
    }
}

/// An Ethernet frame: MACs, `tags` (outermost first), `ethertype`, payload.
pub fn ethernet(
    dst: [u8; 6],
    src: [u8; 6],
    tags: &[Vlan],
    ethertype: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_HLEN + tags.len() * VLAN_HLEN + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    for tag in tags {
        f.extend_from_slice(&tag.tpid.to_be_bytes());
        f.extend_from_slice(&(tag.vid & 0x0fff).to_be_bytes());
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An untagged Ethernet frame between [`MAC_SRC`] and [`MAC_DST`].
pub fn eth(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    ethernet(MAC_DST, MAC_SRC, &[], ethertype, payload)
}

/// Inserts `tags` (outermost first) after the MAC addresses of `frame`.
pub fn with_vlans(frame: &[u8], tags: &[Vlan]) -> Vec<u8> {
    assert!(frame.len() >= ETH_HLEN, "not an Ethernet frame");
    let mut f = frame[..12].to_vec();
    for tag in tags {
        f.extend_from_slice(&tag.tpid.to_be_bytes());
        f.extend_from_slice(&(tag.vid & 0x0fff).to_be_bytes());
    }
    f.extend_from_slice(&frame[12..]);
    f
}

/// Replaces the MAC addresses of `frame` (for sending on a real link).
pub fn set_macs(frame: &mut [u8], dst: [u8; 6], src: [u8; 6]) {
    frame[..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
}

/// A broadcast ARP request frame: who has `target`? tell `sender`.
pub fn arp_request_frame(sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let mut arp = Vec::with_capacity(28);
    arp.extend_from_slice(&1u16.to_be_bytes()); // hardware: Ethernet
    arp.extend_from_slice(&ETH_P_IP.to_be_bytes());
    arp.extend_from_slice(&[6, 4]);
    arp.extend_from_slice(&1u16.to_be_bytes()); // request
    arp.extend_from_slice(&MAC_SRC);
    arp.extend_from_slice(&sender.octets());
    arp.extend_from_slice(&[0; 6]);
    arp.extend_from_slice(&target.octets());
    ethernet([0xff; 6], MAC_SRC, &[], ETH_P_ARP, &arp)
}

/// An IEEE 802.3 frame with an LLC header carrying an STP configuration
/// BPDU (length field instead of an EtherType), as switches send.
pub fn stp_llc_frame() -> Vec<u8> {
    let mut bpdu = vec![0x42, 0x42, 0x03]; // LLC: DSAP, SSAP STP, UI
    bpdu.extend_from_slice(&[0x00, 0x00, 0x00, 0x00]); // protocol, version, type config
    bpdu.extend_from_slice(&[0u8; 31]);
    let dst = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x00];
    ethernet(dst, MAC_SRC, &[], bpdu.len() as u16, &bpdu)
}

// ---------------------------------------------------------------- layer 3

/// Settings of an IPv4 header beyond its addresses and protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4Options {
    /// Raw option bytes; padded with zeros (end of options) to a multiple of
    /// four. At most 40 bytes.
    pub options: Vec<u8>,
    /// Type of service byte.
    pub tos: u8,
    /// Identification.
    pub id: u16,
    /// Time to live.
    pub ttl: u8,
    /// DF flag.
    pub dont_fragment: bool,
    /// MF flag.
    pub more_fragments: bool,
    /// Fragment offset in units of 8 bytes (13 bits).
    pub fragment_offset: u16,
}

impl Default for Ipv4Options {
    fn default() -> Self {
        Ipv4Options {
            options: Vec::new(),
            tos: 0,
            id: 0x1234,
            ttl: 64,
            dont_fragment: false,
            more_fragments: false,
            fragment_offset: 0,
        }
    }
}

/// IPv4 "router alert" option (RFC 2113), four bytes.
pub const IPV4_OPT_ROUTER_ALERT: [u8; 4] = [0x94, 0x04, 0x00, 0x00];
/// IPv4 "no operation" option, one byte.
pub const IPV4_OPT_NOP: u8 = 0x01;

/// An IPv4 packet (header without options, checksum set) carrying `payload`.
pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, payload: &[u8]) -> Vec<u8> {
    ipv4_with(&Ipv4Options::default(), src, dst, proto, payload)
}

/// An IPv4 packet with the header settings `o` (options, fragmentation).
pub fn ipv4_with(
    o: &Ipv4Options,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut options = o.options.clone();
    while !options.len().is_multiple_of(4) {
        options.push(0);
    }
    assert!(options.len() <= 40, "IPv4 options longer than 40 bytes");
    let hlen = IPV4_HLEN + options.len();
    let total = hlen + payload.len();
    assert!(total <= 0xffff, "IPv4 packet longer than 65535 bytes");
    let flags_frag = ((o.dont_fragment as u16) << 14)
        | ((o.more_fragments as u16) << 13)
        | (o.fragment_offset & 0x1fff);
    let mut h = Vec::with_capacity(total);
    h.push(0x40 | (hlen / 4) as u8);
    h.push(o.tos);
    h.extend_from_slice(&(total as u16).to_be_bytes());
    h.extend_from_slice(&o.id.to_be_bytes());
    h.extend_from_slice(&flags_frag.to_be_bytes());
    h.push(o.ttl);
    h.push(proto);
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    h.extend_from_slice(&options);
    let sum = internet_checksum(&[&h]);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    h.extend_from_slice(payload);
    h
}

/// One IPv6 extension header for [`ipv6_ext`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ipv6Ext {
    /// Hop-by-hop options; the value is the Hdr Ext Len field: the header
    /// is `(n + 1) * 8` bytes, filled with a PadN option.
    HopByHop(u8),
    /// Destination options, sized like [`Ipv6Ext::HopByHop`].
    DestOpts(u8),
    /// Routing header of experimental type 253 with segments left 0 (which
    /// every node skips); `(n + 1) * 8` bytes.
    Routing(u8),
    /// Fragment header (8 bytes): offset in 8-byte units, M flag.
    Fragment {
        /// Fragment offset in units of 8 bytes (13 bits).
        offset: u16,
        /// More fragments follow.
        more: bool,
    },
    /// Authentication header with a 12-byte ICV (24 bytes).
    Ah,
}

impl Ipv6Ext {
    /// Next-header value announcing this extension header.
    pub fn protocol(self) -> u8 {
        match self {
            Ipv6Ext::HopByHop(_) => IPPROTO_HOPOPTS,
            Ipv6Ext::DestOpts(_) => IPPROTO_DSTOPTS,
            Ipv6Ext::Routing(_) => IPPROTO_ROUTING,
            Ipv6Ext::Fragment { .. } => IPPROTO_FRAGMENT,
            Ipv6Ext::Ah => IPPROTO_AH,
        }
    }

    /// Length of the header in bytes.
    pub fn len(self) -> usize {
        match self {
            Ipv6Ext::HopByHop(n) | Ipv6Ext::DestOpts(n) | Ipv6Ext::Routing(n) => {
                (n as usize + 1) * 8
            }
            Ipv6Ext::Fragment { .. } => 8,
            Ipv6Ext::Ah => 24,
        }
    }

    fn bytes(self, next: u8) -> Vec<u8> {
        let len = self.len();
        let mut h = vec![next];
        match self {
            Ipv6Ext::HopByHop(n) | Ipv6Ext::DestOpts(n) => {
                h.push(n);
                // One PadN option covering the rest of the header.
                h.push(1);
                h.push((len - 4) as u8);
                h.resize(len, 0);
            }
            Ipv6Ext::Routing(n) => {
                h.extend_from_slice(&[n, 253, 0]);
                h.resize(len, 0);
            }
            Ipv6Ext::Fragment { offset, more } => {
                h.push(0);
                h.extend_from_slice(&(((offset & 0x1fff) << 3) | more as u16).to_be_bytes());
                h.extend_from_slice(&0x0bad_cafe_u32.to_be_bytes());
            }
            Ipv6Ext::Ah => {
                h.push((len / 4 - 2) as u8);
                h.extend_from_slice(&[0, 0]);
                h.extend_from_slice(&0x100u32.to_be_bytes()); // SPI
                h.extend_from_slice(&1u32.to_be_bytes()); // sequence
                h.resize(len, 0xaa); // ICV
            }
        }
        debug_assert_eq!(h.len(), len);
        h
    }
}

/// An IPv6 packet (no extension headers) carrying `payload` as `next`.
pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, payload: &[u8]) -> Vec<u8> {
    ipv6_ext(src, dst, &[], next, payload)
}

/// An IPv6 packet with extension headers `exts` (in order) before the
/// upper-layer `proto` and its `payload`.
pub fn ipv6_ext(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    exts: &[Ipv6Ext],
    proto: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut chain = Vec::new();
    for (i, ext) in exts.iter().enumerate() {
        let next = exts.get(i + 1).map_or(proto, |e| e.protocol());
        chain.extend_from_slice(&ext.bytes(next));
    }
    let payload_len = chain.len() + payload.len();
    assert!(
        payload_len <= 0xffff,
        "IPv6 payload longer than 65535 bytes"
    );
    let first = exts.first().map_or(proto, |e| e.protocol());
    let mut h = Vec::with_capacity(IPV6_HLEN + payload_len);
    h.extend_from_slice(&0x6000_0000u32.to_be_bytes());
    h.extend_from_slice(&(payload_len as u16).to_be_bytes());
    h.push(first);
    h.push(64);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    h.extend_from_slice(&chain);
    h.extend_from_slice(payload);
    h
}

/// An IPv4 or IPv6 packet, by the family of the addresses (which must match).
pub fn ip(src: IpAddr, dst: IpAddr, proto: u8, payload: &[u8]) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => ipv4(s, d, proto, payload),
        (IpAddr::V6(s), IpAddr::V6(d)) => ipv6(s, d, proto, payload),
        _ => panic!("mixed address families {src} -> {dst}"),
    }
}

/// EtherType of an IP packet with source `a`.
pub fn ethertype_of(a: IpAddr) -> u16 {
    match a {
        IpAddr::V4(_) => ETH_P_IP,
        IpAddr::V6(_) => ETH_P_IPV6,
    }
}

/// Length of the IP header [`ip`] writes for `a`'s family.
pub fn ip_hlen(a: IpAddr) -> usize {
    match a {
        IpAddr::V4(_) => IPV4_HLEN,
        IpAddr::V6(_) => IPV6_HLEN,
    }
}

// ---------------------------------------------------------------- layer 4

pub fn pseudo_header(src: IpAddr, dst: IpAddr, proto: u8, len: usize) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut p = Vec::with_capacity(12);
            p.extend_from_slice(&s.octets());
            p.extend_from_slice(&d.octets());
            p.extend_from_slice(&[0, proto]);
            p.extend_from_slice(&(len as u16).to_be_bytes());
            p
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let mut p = Vec::with_capacity(40);
            p.extend_from_slice(&s.octets());
            p.extend_from_slice(&d.octets());
            p.extend_from_slice(&(len as u32).to_be_bytes());
            p.extend_from_slice(&[0, 0, 0, proto]);
            p
        }
        _ => panic!("mixed address families {src} -> {dst}"),
    }
}

/// A UDP datagram (header + payload) with its checksum for `src` -> `dst`.
pub fn udp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let len = UDP_HLEN + payload.len();
    let mut u = Vec::with_capacity(len);
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&(len as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    let mut sum = internet_checksum(&[&pseudo_header(src, dst, IPPROTO_UDP, len), &u]);
    if sum == 0 {
        sum = 0xffff;
    }
    u[6..8].copy_from_slice(&sum.to_be_bytes());
    u
}

/// A TCP segment (20-byte header, PSH|ACK, checksum set) for `src` -> `dst`.
pub fn tcp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    tcp_with_options(src, dst, sport, dport, &[], payload)
}

/// TCP timestamp option padded with two NOPs (12 bytes), as Linux sends.
pub const TCP_OPT_TIMESTAMPS: [u8; 12] = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];

/// A TCP segment whose header carries `options` (padded with zeros to a
/// multiple of four; at most 40 bytes).
pub fn tcp_with_options(
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    options: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    tcp_segment(src, dst, [sport, dport], TCP_PSH_ACK, options, payload)
}

/// TCP flags: SYN, SYN-ACK, RST, PSH|ACK.
pub const TCP_SYN: u8 = 0x02;
pub const TCP_SYN_ACK: u8 = 0x12;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH_ACK: u8 = 0x18;
/// Linux's MSS option for a 1,500-byte MTU (MSS 1460).
pub const TCP_OPT_MSS_1460: [u8; 4] = [2, 4, 0x05, 0xb4];

/// A TCP segment with `flags` from `ports[0]` to `ports[1]`, its header
/// carrying `options` (padded with zeros to a multiple of four; at most
/// 40 bytes), checksum set.
pub fn tcp_segment(
    src: IpAddr,
    dst: IpAddr,
    [sport, dport]: [u16; 2],
    flags: u8,
    options: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let mut opts = options.to_vec();
    while !opts.len().is_multiple_of(4) {
        opts.push(0);
    }
    assert!(opts.len() <= 40, "TCP options longer than 40 bytes");
    let hlen = TCP_HLEN + opts.len();
    let mut t = Vec::with_capacity(hlen + payload.len());
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&1000u32.to_be_bytes()); // sequence
    t.extend_from_slice(&2000u32.to_be_bytes()); // acknowledgment
    t.push(((hlen / 4) as u8) << 4);
    t.push(flags);
    t.extend_from_slice(&64240u16.to_be_bytes()); // window
    t.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
    t.extend_from_slice(&opts);
    t.extend_from_slice(payload);
    let sum = internet_checksum(&[&pseudo_header(src, dst, IPPROTO_TCP, t.len()), &t]);
    t[16..18].copy_from_slice(&sum.to_be_bytes());
    t
}

/// An ICMP (IPv4) echo request message.
pub fn icmp4_echo(id: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut m = vec![8, 0, 0, 0];
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(payload);
    let sum = internet_checksum(&[&m]);
    m[2..4].copy_from_slice(&sum.to_be_bytes());
    m
}

/// An ICMPv6 echo request message for `src` -> `dst`.
pub fn icmp6_echo(src: Ipv6Addr, dst: Ipv6Addr, id: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut m = vec![128, 0, 0, 0];
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(payload);
    let pseudo = pseudo_header(IpAddr::V6(src), IpAddr::V6(dst), IPPROTO_ICMPV6, m.len());
    let sum = internet_checksum(&[&pseudo, &m]);
    m[2..4].copy_from_slice(&sum.to_be_bytes());
    m
}

/// An IPv4 packet carrying an ICMP echo request (a typical inner packet).
pub fn icmp4_packet(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    ipv4(
        src,
        dst,
        IPPROTO_ICMP,
        &icmp4_echo(7, 1, b"observer ping payload"),
    )
}

/// An IPv6 packet carrying an ICMPv6 echo request (a typical inner packet).
pub fn icmp6_packet(src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
    let echo = icmp6_echo(src, dst, 7, 1, b"observer ping payload");
    ipv6(src, dst, IPPROTO_ICMPV6, &echo)
}

/// An IPv4 or IPv6 ICMP echo request packet, by the addresses' family.
pub fn icmp_packet(src: IpAddr, dst: IpAddr) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => icmp4_packet(s, d),
        (IpAddr::V6(s), IpAddr::V6(d)) => icmp6_packet(s, d),
        _ => panic!("mixed address families {src} -> {dst}"),
    }
}

/// An inner Ethernet frame carrying [`icmp_packet`] (what VXLAN, Geneve
/// with 0x6558 and GRE with 0x6558 transport).
pub fn icmp_eth_frame(src: IpAddr, dst: IpAddr) -> Vec<u8> {
    eth(ethertype_of(src), &icmp_packet(src, dst))
}

/// A complete frame: Ethernet + IP (`proto`, `payload`).
pub fn ip_frame(src: IpAddr, dst: IpAddr, proto: u8, payload: &[u8]) -> Vec<u8> {
    eth(ethertype_of(src), &ip(src, dst, proto, payload))
}

/// A complete frame: Ethernet + IP + UDP.
pub fn udp_frame(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    ip_frame(src, dst, IPPROTO_UDP, &udp(src, dst, sport, dport, payload))
}

/// A complete frame: Ethernet + IP + TCP (20-byte header).
pub fn tcp_frame(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    ip_frame(src, dst, IPPROTO_TCP, &tcp(src, dst, sport, dport, payload))
}

// ---------------------------------------------------------- encapsulations

/// VXLAN header (RFC 7348): I flag, 24-bit `vni`.
pub fn vxlan_header(vni: u32) -> [u8; VXLAN_HLEN] {
    let v = (vni & 0x00ff_ffff) << 8;
    let mut h = [0u8; VXLAN_HLEN];
    h[0] = 0x08;
    h[4..8].copy_from_slice(&v.to_be_bytes());
    h
}

/// VXLAN-GPE header: I and P flags, `next` protocol ([`GPE_NEXT_IPV4`],
/// [`GPE_NEXT_IPV6`], [`GPE_NEXT_ETHERNET`]), 24-bit `vni`.
pub fn vxlan_gpe_header(vni: u32, next: u8) -> [u8; VXLAN_HLEN] {
    let mut h = vxlan_header(vni);
    h[0] = 0x0c;
    h[3] = next;
    h
}

/// Geneve header (RFC 8926) with `option_words` 4-byte words of options
/// (0..=63; filled with well-formed experimental TLVs), `protocol` (0x6558,
/// 0x0800, 0x86dd) and 24-bit `vni`.
pub fn geneve_header(vni: u32, protocol: u16, option_words: u8) -> Vec<u8> {
    assert!(option_words < 64, "Geneve options are at most 63 words");
    let mut h = Vec::with_capacity(GENEVE_HLEN + option_words as usize * 4);
    h.push(option_words); // version 0
    h.push(0); // O and C flags clear
    h.extend_from_slice(&protocol.to_be_bytes());
    h.extend_from_slice(&((vni & 0x00ff_ffff) << 8).to_be_bytes());
    let mut left = option_words as usize;
    while left > 0 {
        // One TLV: class, type, length of its data in words (<= 31).
        let words = left.min(32);
        h.extend_from_slice(&0xfff0u16.to_be_bytes()); // experimental class
        h.push(0x01);
        h.push((words - 1) as u8);
        h.resize(h.len() + (words - 1) * 4, 0x5a);
        left -= words;
    }
    h
}

/// Optional fields of a GRE (version 0) header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gre {
    /// C flag: checksum (and reserved) field present; computed over the GRE
    /// header and payload.
    pub checksum: bool,
    /// K flag: key field.
    pub key: Option<u32>,
    /// S flag: sequence number field.
    pub seq: Option<u32>,
}

impl Gre {
    /// Length of the GRE header with these fields.
    pub fn header_len(&self) -> usize {
        GRE_HLEN
            + 4 * (self.checksum as usize
                + self.key.is_some() as usize
                + self.seq.is_some() as usize)
    }

    /// GRE header + `payload`, announcing `protocol` (0x0800, 0x86dd, 0x6558, ...).
    pub fn encap(&self, protocol: u16, payload: &[u8]) -> Vec<u8> {
        let flags: u8 = ((self.checksum as u8) << 7)
            | ((self.key.is_some() as u8) << 5)
            | ((self.seq.is_some() as u8) << 4);
        let mut g = vec![flags, 0x00];
        g.extend_from_slice(&protocol.to_be_bytes());
        if self.checksum {
            g.extend_from_slice(&[0, 0, 0, 0]);
        }
        if let Some(key) = self.key {
            g.extend_from_slice(&key.to_be_bytes());
        }
        if let Some(seq) = self.seq {
            g.extend_from_slice(&seq.to_be_bytes());
        }
        g.extend_from_slice(payload);
        if self.checksum {
            let sum = internet_checksum(&[&g]);
            g[4..6].copy_from_slice(&sum.to_be_bytes());
        }
        g
    }
}

/// A WireGuard transport data message (type 4): 16-byte header, then
/// `plaintext_len` rounded up to 16 plus a 16-byte tag of stand-in ciphertext.
pub fn wireguard_transport(receiver: u32, counter: u64, plaintext_len: usize) -> Vec<u8> {
    let mut m = vec![4, 0, 0, 0];
    m.extend_from_slice(&receiver.to_le_bytes());
    m.extend_from_slice(&counter.to_le_bytes());
    let body = plaintext_len.div_ceil(16) * 16 + 16;
    m.extend((0..body).map(|i| (i as u8).wrapping_mul(151).wrapping_add(7)));
    m
}

/// A WireGuard handshake initiation message (type 1, 148 bytes).
pub fn wireguard_initiation(sender: u32) -> Vec<u8> {
    let mut m = vec![1, 0, 0, 0];
    m.extend_from_slice(&sender.to_le_bytes());
    m.extend((0..140).map(|i| (i as u8).wrapping_mul(37).wrapping_add(3)));
    m
}

/// Complete VXLAN frame: `src` -> `dst` UDP [`ENTROPY_PORT`] -> [`VXLAN_PORT`],
/// VNI `vni`, carrying the Ethernet frame `inner`.
pub fn vxlan_frame(src: IpAddr, dst: IpAddr, vni: u32, inner: &[u8]) -> Vec<u8> {
    let payload = cat(&[&vxlan_header(vni), inner]);
    udp_frame(src, dst, ENTROPY_PORT, VXLAN_PORT, &payload)
}

/// Complete VXLAN-GPE frame (UDP [`VXLAN_GPE_PORT`]) carrying `inner`, a
/// packet of the kind `next` announces.
pub fn vxlan_gpe_frame(src: IpAddr, dst: IpAddr, vni: u32, next: u8, inner: &[u8]) -> Vec<u8> {
    let payload = cat(&[&vxlan_gpe_header(vni, next), inner]);
    udp_frame(src, dst, ENTROPY_PORT, VXLAN_GPE_PORT, &payload)
}

/// Complete Geneve frame (UDP [`GENEVE_PORT`]) with `option_words` words of
/// options, carrying `inner` of EtherType `protocol`.
pub fn geneve_frame(
    src: IpAddr,
    dst: IpAddr,
    vni: u32,
    protocol: u16,
    option_words: u8,
    inner: &[u8],
) -> Vec<u8> {
    let payload = cat(&[&geneve_header(vni, protocol, option_words), inner]);
    udp_frame(src, dst, ENTROPY_PORT, GENEVE_PORT, &payload)
}

/// Complete GRE frame (IP protocol 47) carrying `inner` of EtherType `protocol`.
pub fn gre_frame(src: IpAddr, dst: IpAddr, gre: &Gre, protocol: u16, inner: &[u8]) -> Vec<u8> {
    ip_frame(src, dst, IPPROTO_GRE, &gre.encap(protocol, inner))
}

/// Complete IPv4-in-IP frame (protocol 4): `inner` is an IPv4 packet; the
/// outer header may be IPv4 or IPv6.
pub fn ipip_frame(src: IpAddr, dst: IpAddr, inner: &[u8]) -> Vec<u8> {
    ip_frame(src, dst, IPPROTO_IPIP, inner)
}

/// Complete IPv6-in-IP frame (protocol 41, e.g. 6in4/SIT): `inner` is an
/// IPv6 packet; the outer header may be IPv4 or IPv6.
pub fn ip6ip_frame(src: IpAddr, dst: IpAddr, inner: &[u8]) -> Vec<u8> {
    ip_frame(src, dst, IPPROTO_IPV6, inner)
}

/// Complete WireGuard frame: UDP `sport` -> `dport` carrying `message`
/// (see [`wireguard_transport`], [`wireguard_initiation`]). A peer sends
/// from any port to [`WIREGUARD_PORT`]; the listener answers from
/// [`WIREGUARD_PORT`] to that ephemeral port.
pub fn wireguard_frame(
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    message: &[u8],
) -> Vec<u8> {
    udp_frame(src, dst, sport, dport, message)
}
