//! Map layouts and constants shared by the eBPF programs (`observer-ebpf`)
//! and userspace (`observer`). Everything here is `#[repr(C)]` and
//! `no_std`, because both sides read the same bytes; so is the packet
//! parser (`parse`) and the classifier checks (`checks`), which both sides
//! run: the programs on the wire, `observer replay` on capture files.
#![no_std]
// Inline asm on BPF: `parse::window_offset` hides offsets from LLVM.
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

pub mod checks;
pub mod parse;

/// Name of the per-CPU LRU hash map holding one [`FlowKey`] -> [`FlowValue`]
/// entry per (interface, direction, protocol, peer, VNI).
pub const FLOWS_MAP: &str = "FLOWS";
/// Name of the programs' global table mapping a UDP port to a [`Proto`]
/// (plus [`PORT_MATCH_SOURCE`]): 65,536 bytes, indexed by port, written by
/// the loader before load.
pub const UDP_PORT_TAGS_GLOBAL: &str = "UDP_PORT_TAGS";
/// Name of the per-CPU array of [`Stat`] counters.
pub const STATS_MAP: &str = "STATS";

/// Default capacity of [`FLOWS_MAP`]; userspace can change it before load.
pub const DEFAULT_MAX_FLOWS: u32 = 16_384;

/// Bit set in a [`UDP_PORT_TAGS_GLOBAL`] value when the port also identifies the
/// protocol as a *source* port (WireGuard answers from its listen port to an
/// ephemeral one; VXLAN senders pick random source ports, so for them it is
/// not set).
pub const PORT_MATCH_SOURCE: u8 = 0x80;
/// Mask extracting the [`Proto`] from a [`UDP_PORT_TAGS_GLOBAL`] value.
pub const PORT_PROTO_MASK: u8 = 0x7f;

/// VXLAN flags bit I: the VNI field is valid (RFC 7348). Read by the
/// parser and by the checks, which import the parser: here, so the two
/// modules do not import each other.
pub const VXLAN_FLAG_I: u8 = 0x08;

/// Well-known UDP ports, used as defaults by userspace.
pub mod ports {
    /// IANA VXLAN port (Calico, Cilium option).
    pub const VXLAN: u16 = 4789;
    /// Linux' historical VXLAN port (flannel, Cilium default).
    pub const VXLAN_LINUX: u16 = 8472;
    /// IANA VXLAN-GPE port.
    pub const VXLAN_GPE: u16 = 4790;
    /// IANA Geneve port.
    pub const GENEVE: u16 = 6081;
    /// WireGuard's customary ports (Calico IPv4 / IPv6).
    pub const WIREGUARD: u16 = 51820;
    /// Calico's IPv6 WireGuard port.
    pub const WIREGUARD_V6: u16 = 51821;
}

/// Direction of a packet relative to the observed interface.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// Received on the interface (XDP or tc ingress).
    Rx = 0,
    /// Sent through the interface (tc egress).
    Tx = 1,
}

/// Encapsulation protocol of the outer packet.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    /// Any IP packet that is not one of the encapsulations below.
    Other = 0,
    /// VXLAN (RFC 7348).
    Vxlan = 1,
    /// VXLAN Generic Protocol Extension.
    VxlanGpe = 2,
    /// Geneve (RFC 8926).
    Geneve = 3,
    /// IPv4 in IP (IPv4 protocol / IPv6 next header 4).
    Ipip = 4,
    /// IPv6 in IP (protocol / next header 41).
    Ip6ip = 5,
    /// GRE (protocol 47).
    Gre = 6,
    /// WireGuard (UDP).
    Wireguard = 7,
}

impl Proto {
    /// Every protocol, in numeric order.
    pub const ALL: [Proto; 8] = [
        Proto::Other,
        Proto::Vxlan,
        Proto::VxlanGpe,
        Proto::Geneve,
        Proto::Ipip,
        Proto::Ip6ip,
        Proto::Gre,
        Proto::Wireguard,
    ];

    /// Decodes the byte stored in a [`FlowKey`]; unknown values are `Other`.
    pub fn from_u8(value: u8) -> Proto {
        match value {
            1 => Proto::Vxlan,
            2 => Proto::VxlanGpe,
            3 => Proto::Geneve,
            4 => Proto::Ipip,
            5 => Proto::Ip6ip,
            6 => Proto::Gre,
            7 => Proto::Wireguard,
            _ => Proto::Other,
        }
    }

    /// The name used in JSON rows and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Other => "other",
            Proto::Vxlan => "vxlan",
            Proto::VxlanGpe => "vxlan-gpe",
            Proto::Geneve => "geneve",
            Proto::Ipip => "ipip",
            Proto::Ip6ip => "ip6ip",
            Proto::Gre => "gre",
            Proto::Wireguard => "wireguard",
        }
    }

    /// The protocol named `name` (see [`Proto::name`]).
    pub fn from_name(name: &str) -> Option<Proto> {
        Proto::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// Why a frame could not be classified. `None` marks a classified frame.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unclassified {
    /// The frame was classified (tunnel or plain IP).
    None = 0,
    /// Shorter than its Ethernet header and VLAN tags.
    TruncatedL2 = 1,
    /// Shorter than its IPv4/IPv6 header (or extension headers).
    TruncatedL3 = 2,
    /// Shorter than the UDP header of a UDP packet.
    TruncatedL4 = 3,
    /// Shorter than the encapsulation header its port or protocol announces.
    TruncatedEncap = 4,
    /// An IP header that contradicts itself (version, IHL below 5).
    MalformedL3 = 5,
    /// Not IP: ARP, LLC/STP, more than two VLAN tags, an IPv6 extension chain
    /// longer than the parser follows.
    Unsupported = 6,
    /// A header the parser needs lies past the first
    /// [`HEADER_WINDOW`](crate::parse::HEADER_WINDOW) bytes, which are all it
    /// reads: a long IPv6 extension header (a 2 KB destination-options
    /// header before the tunnel). Not followed, not necessarily cut.
    BeyondWindow = 7,
}

impl Unclassified {
    /// Every reason, in numeric order (including `None`).
    pub const ALL: [Unclassified; 8] = [
        Unclassified::None,
        Unclassified::TruncatedL2,
        Unclassified::TruncatedL3,
        Unclassified::TruncatedL4,
        Unclassified::TruncatedEncap,
        Unclassified::MalformedL3,
        Unclassified::Unsupported,
        Unclassified::BeyondWindow,
    ];

    /// Decodes the byte stored in a [`FlowKey`]; unknown values map to `Unsupported`.
    pub fn from_u8(value: u8) -> Unclassified {
        Unclassified::ALL
            .get(value as usize)
            .copied()
            .unwrap_or(Unclassified::Unsupported)
    }

    /// The name used in JSON rows.
    pub fn name(self) -> &'static str {
        match self {
            Unclassified::None => "none",
            Unclassified::TruncatedL2 => "truncated_l2",
            Unclassified::TruncatedL3 => "truncated_l3",
            Unclassified::TruncatedL4 => "truncated_l4",
            Unclassified::TruncatedEncap => "truncated_encap",
            Unclassified::MalformedL3 => "malformed_l3",
            Unclassified::Unsupported => "unsupported",
            Unclassified::BeyondWindow => "beyond_window",
        }
    }
}

/// Address family byte stored with addresses: 0 none, 4 IPv4, 6 IPv6.
pub mod family {
    /// No address (aggregates such as `other`).
    pub const NONE: u8 = 0;
    /// IPv4: the first four address bytes are used.
    pub const V4: u8 = 4;
    /// IPv6: all sixteen bytes are used.
    pub const V6: u8 = 6;
}

/// Key of [`FLOWS_MAP`]. Plain IP traffic (`Proto::Other`) and unclassified
/// frames carry no peer, so that non-tunnel traffic cannot evict tunnel peers
/// from the LRU map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    /// Outer source (rx) or destination (tx), bytes in network order;
    /// IPv4 in the first word. Words, not bytes, so the programs copy it
    /// with four loads instead of sixteen.
    pub peer: [u32; 4],
    /// Interface index the hook ran on.
    pub ifindex: u32,
    /// VXLAN / VXLAN-GPE / Geneve network identifier, else 0.
    pub vni: u32,
    /// [`Direction`] as u8.
    pub direction: u8,
    /// [`Proto`] as u8.
    pub proto: u8,
    /// [`family`] of `peer`.
    pub peer_family: u8,
    /// [`Unclassified`] as u8.
    pub reason: u8,
}

impl FlowKey {
    /// The key of plain traffic (`Proto::Other`, classified, no peer) seen
    /// on `ifindex` in `direction`.
    pub fn plain(ifindex: u32, direction: Direction) -> FlowKey {
        FlowKey {
            peer: [0; 4],
            ifindex,
            vni: 0,
            direction: direction as u8,
            proto: Proto::Other as u8,
            peer_family: family::NONE,
            reason: Unclassified::None as u8,
        }
    }

    /// The key [`parse::classify`] gives a [`parse::CommonVxlan`] frame
    /// seen on `ifindex` in `direction`.
    #[inline(always)]
    pub fn common_vxlan(ifindex: u32, direction: Direction, v: &parse::CommonVxlan) -> FlowKey {
        FlowKey {
            peer: [v.peer, 0, 0, 0],
            ifindex,
            vni: v.vni,
            direction: direction as u8,
            proto: Proto::Vxlan as u8,
            peer_family: family::V4,
            reason: Unclassified::None as u8,
        }
    }

    /// This key's slot in [`PLAIN_MAP`] when it is the key of plain traffic
    /// on an interface below [`PLAIN_IFINDEX_LIMIT`].
    #[inline(always)]
    pub fn plain_slot(&self) -> Option<u32> {
        if self.proto == Proto::Other as u8
            && self.reason == Unclassified::None as u8
            && self.peer_family == family::NONE
            && self.ifindex < PLAIN_IFINDEX_LIMIT
        {
            Some(self.ifindex * 2 + self.direction as u32)
        } else {
            None
        }
    }

    /// The key counted in slot `slot` of [`PLAIN_MAP`].
    pub fn of_plain_slot(slot: u32) -> FlowKey {
        let direction = if slot & 1 == 0 {
            Direction::Rx
        } else {
            Direction::Tx
        };
        FlowKey::plain(slot / 2, direction)
    }

    /// The key of the classification `c` seen on `ifindex` in `direction`.
    #[inline(always)]
    pub fn of(ifindex: u32, direction: Direction, c: &parse::Classified) -> FlowKey {
        FlowKey {
            peer: c.peer,
            ifindex,
            vni: c.vni,
            direction: direction as u8,
            proto: c.proto as u8,
            peer_family: c.peer_family,
            reason: c.reason as u8,
        }
    }
}

/// Per-CPU value of [`FLOWS_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowValue {
    /// Packets as on the wire (a GSO skb counts its segments).
    pub packets: u64,
    /// Bytes as on the wire, including the Ethernet header.
    pub bytes: u64,
    /// Latest inner source address seen for this key (VXLAN, Geneve, IPIP, ...).
    pub inner_src: [u32; 4],
    /// Latest inner destination address seen for this key.
    pub inner_dst: [u32; 4],
    /// [`family`] of the inner addresses (0: no sample yet).
    pub inner_family: u8,
    /// Padding, always zero.
    pub _pad: [u8; 7],
    /// What the key's inner TCP segments said.
    pub tcp: TcpCounts,
}

impl FlowValue {
    /// The first `packets`/`bytes` of a key, with the inner sample of `c`
    /// and its inner TCP signals `tcp`.
    #[inline(always)]
    pub fn first(c: &parse::Classified, packets: u64, bytes: u64, tcp: &TcpCounts) -> FlowValue {
        FlowValue {
            packets,
            bytes,
            inner_src: c.inner_src,
            inner_dst: c.inner_dst,
            inner_family: c.inner_family,
            _pad: [0; 7],
            tcp: *tcp,
        }
    }

    /// Adds `packets`/`bytes` and the inner TCP signals `tcp`; the inner
    /// sample becomes `c`'s when it has one.
    #[inline(always)]
    pub fn add(&mut self, c: &parse::Classified, packets: u64, bytes: u64, tcp: &TcpCounts) {
        self.add_sampled(packets, bytes, c.inner_family, c.inner_src, c.inner_dst);
        self.tcp.add(tcp);
    }

    /// Adds one [`parse::CommonVxlan`] frame of `bytes`, with its inner
    /// sample: what [`FlowValue::add`] does with its classification (such
    /// a frame is no SYN and no RST, `parse::early`, so it has no TCP
    /// signal).
    #[inline(always)]
    pub fn add_common_vxlan(&mut self, v: &parse::CommonVxlan, bytes: u64) {
        self.add_sampled(
            1,
            bytes,
            family::V4,
            [v.inner_src, 0, 0, 0],
            [v.inner_dst, 0, 0, 0],
        );
    }

    #[inline(always)]
    fn add_sampled(
        &mut self,
        packets: u64,
        bytes: u64,
        inner_family: u8,
        inner_src: [u32; 4],
        inner_dst: [u32; 4],
    ) {
        self.packets += packets;
        self.bytes += bytes;
        if inner_family != family::NONE {
            self.inner_src = inner_src;
            self.inner_dst = inner_dst;
            self.inner_family = inner_family;
        }
    }
}

/// What the inner TCP segments of one flow key said (tunnel packets
/// only, `parse::inner_tcp`): the handshake and how it fails. Counted in
/// the programs like packets, since an unanswered SYN or an MSS too large
/// for the tunnel shows in no packet count.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TcpCounts {
    /// SYNs without ACK: connection attempts, retries included.
    pub syn: u64,
    /// SYN-ACKs: the answers to them.
    pub syn_ack: u64,
    /// Segments with RST.
    pub rst: u64,
    /// SYNs and SYN-ACKs whose MSS option, with the headers of a full
    /// segment and this frame's encapsulation, is more than the
    /// interface's MTU carries (`parse::InnerTcp::full_segment`): the
    /// other end will send segments the tunnel cannot carry whole.
    pub mss_over: u64,
}

impl TcpCounts {
    /// No signal.
    pub const NONE: TcpCounts = TcpCounts {
        syn: 0,
        syn_ack: 0,
        rst: 0,
        mss_over: 0,
    };

    /// The signals of one segment `tcp` seen on an interface of MTU `mtu`
    /// (0: unknown, no MSS judged).
    #[inline(always)]
    pub fn of(tcp: &parse::InnerTcp, mtu: u32) -> TcpCounts {
        let handshake = tcp.flags & (parse::TCP_SYN | parse::TCP_ACK);
        let syn = handshake == parse::TCP_SYN;
        let syn_ack = handshake == parse::TCP_SYN | parse::TCP_ACK;
        TcpCounts {
            syn: u64::from(syn),
            syn_ack: u64::from(syn_ack),
            rst: u64::from(tcp.flags & parse::TCP_RST != 0),
            mss_over: u64::from((syn || syn_ack) && mtu != 0 && tcp.full_segment > mtu),
        }
    }

    /// Adds `other`.
    #[inline(always)]
    pub fn add(&mut self, other: &TcpCounts) {
        self.syn += other.syn;
        self.syn_ack += other.syn_ack;
        self.rst += other.rst;
        self.mss_over += other.mss_over;
    }
}

/// Name of the per-CPU array of [`FlowCacheSlot`]s in front of
/// [`FLOWS_MAP`].
pub const FLOW_CACHE_MAP: &str = "FLOW_CACHE";
/// Slots of [`FLOW_CACHE_MAP`] per CPU (a power of two: the slot index is
/// the top bits of a hash). 1,024 slots of 128 bytes are 128 KiB per CPU.
pub const FLOW_CACHE_SLOTS: u32 = 1024;

/// One slot of the per-CPU flow cache: the counters of one [`FlowKey`] on
/// one CPU, found with one array lookup and a key compare instead of a hash
/// walk of the LRU map.
///
/// A slot is claimed by the first key that hashes to it and keeps that key
/// for the life of the programs: it is never evicted or reused, so a reader
/// never sees counts move between the slot and [`FLOWS_MAP`]. A key whose
/// slot another key holds is counted in [`FLOWS_MAP`] instead
/// ([`Stat::FlowCacheCollisions`]). A key's totals are the sum of its slots
/// (one per CPU at most) and its [`FLOWS_MAP`] values.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowCacheSlot {
    /// The key; `ifindex` 0 marks a free slot (no hook runs on ifindex 0),
    /// and is written last when a slot is claimed.
    pub key: FlowKey,
    /// What the drop checks need to know of the key, cached.
    pub facts: KeyFacts,
    /// Padding, always zero.
    pub _pad: u32,
    /// The counters.
    pub value: FlowValue,
}

impl FlowCacheSlot {
    /// Whether this slot holds `key`: the key compared as three aligned
    /// words and a half word (the slot is 8-aligned, and the key's 28
    /// bytes have no padding), instead of seven fields one by one. Word by
    /// word, not as arrays: an array compare may become a memcmp call,
    /// which eBPF does not have.
    #[inline(always)]
    pub fn holds(&self, key: &FlowKey) -> bool {
        let at = core::ptr::from_ref(self).cast::<u64>();
        // SAFETY: the slot's first 24 bytes are its key's `peer`, `ifindex`
        // and `vni`, bytes 24..28 its four one-byte fields: plain integers,
        // read at their alignment.
        let (peer_lo, peer_hi, ifindex_vni, tail) = unsafe {
            (
                at.read(),
                at.add(1).read(),
                at.add(2).read(),
                at.cast::<u32>().add(6).read(),
            )
        };
        peer_lo == pair(key.peer[0], key.peer[1])
            && peer_hi == pair(key.peer[2], key.peer[3])
            && ifindex_vni == pair(key.ifindex, key.vni)
            && tail == u32::from_ne_bytes([key.direction, key.proto, key.peer_family, key.reason])
    }
}

/// `lo` then `hi` as one word, in memory order. (Shifts, not a byte
/// array: LLVM's BPF backend assembled that byte by byte.)
#[inline(always)]
fn pair(lo: u32, hi: u32) -> u64 {
    if cfg!(target_endian = "little") {
        u64::from(lo) | (u64::from(hi) << 32)
    } else {
        (u64::from(lo) << 32) | u64::from(hi)
    }
}

/// The node facts the classifier checks need about one [`FlowKey`]
/// (`checks::FlowFacts`: is its source outside its allow-set, does a
/// local device have its VNI, its interface's MTU), as its cache slot
/// keeps them: decided once per key and facts generation
/// ([`config::FACTS_GENERATION`]), so that a flow's packets after its
/// first pay neither the LPM trie nor the VNI and MTU hash lookups.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KeyFacts {
    /// `generation << 2 | vni_unknown << 1 | outside_allow_set`, where
    /// `generation` is [`config::FACTS_GENERATION`] when the facts were
    /// decided; 0 when none were.
    pub verdict: u32,
    /// MTU of the key's interface; 0 when unknown.
    pub mtu: u32,
}

impl KeyFacts {
    /// The largest generation a verdict holds (30 bits); userspace wraps
    /// to 1 after it.
    pub const MAX_GENERATION: u32 = u32::MAX >> 2;

    /// `facts`, decided under `generation`.
    #[inline(always)]
    pub fn decided(generation: u32, facts: &checks::FlowFacts) -> KeyFacts {
        KeyFacts {
            verdict: (generation << 2)
                | (u32::from(facts.vni_unknown) << 1)
                | u32::from(facts.outside_allow_set),
            mtu: facts.mtu,
        }
    }

    /// The facts, when they were decided under `generation` (never 0);
    /// `None` when they are stale or none were decided.
    #[inline(always)]
    pub fn current(&self, generation: u32) -> Option<checks::FlowFacts> {
        self.is_current(generation).then(|| self.facts())
    }

    /// Whether the facts were decided under `generation` (never 0).
    #[inline(always)]
    pub fn is_current(&self, generation: u32) -> bool {
        generation != 0 && self.verdict >> 2 == generation
    }

    /// The facts, whenever they were decided.
    #[inline(always)]
    pub fn facts(&self) -> checks::FlowFacts {
        checks::FlowFacts {
            outside_allow_set: self.verdict & 1 != 0,
            vni_unknown: self.verdict & 2 != 0,
            mtu: self.mtu,
        }
    }
}

/// Name of the per-CPU array of [`PlainCounters`] indexed by
/// [`FlowKey::plain_slot`]: plain traffic (most packets on many nodes) is
/// counted with one array lookup and two adds, without the flow cache's
/// hash and key compare. Its rows are the flow rows of those keys, never
/// evicted; userspace adds them to the flow cache's part.
pub const PLAIN_MAP: &str = "PLAIN";
/// Interfaces with a lower index count plain traffic in [`PLAIN_MAP`]
/// (underlay devices are made early and have low indexes); plain traffic
/// on the others goes through the flow cache and [`FLOWS_MAP`] like any
/// key. 1,024 interfaces of two directions are 32 KiB per CPU.
pub const PLAIN_IFINDEX_LIMIT: u32 = 1024;
/// Slots of [`PLAIN_MAP`] per CPU: received and sent, per interface.
pub const PLAIN_SLOTS: u32 = 2 * PLAIN_IFINDEX_LIMIT;

/// Value of [`PLAIN_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PlainCounters {
    /// Packets as on the wire (a GSO skb counts its segments).
    pub packets: u64,
    /// Bytes as on the wire, including the Ethernet header.
    pub bytes: u64,
}

/// Name of the map of BGP traffic (TCP port 179) per peer. Userspace
/// loads it with [`BGP_MAX_KEYS`] plus [`LRU_LOCAL_FREE`] per possible CPU
/// entries: the kernel's common LRU hands each CPU that inserts a batch of
/// free entries, and evicts live keys once the batches have taken them
/// all (before 6.16), so a map of 512 on a 64-CPU node would evict peers
/// while far from full.
pub const BGP_MAP: &str = "BGP";

/// Free entries the kernel's common LRU moves to a CPU's local list at a
/// time (`LOCAL_FREE_TARGET` in kernel/bpf/bpf_lru_list.h).
pub const LRU_LOCAL_FREE: u32 = 128;

/// TCP port of BGP.
pub const BGP_PORT: u16 = 179;

/// Keys of [`BGP_MAP`] kept without eviction, one per (interface,
/// direction, peer): a node has a BGP peer per other node (Calico's full
/// mesh) or a few route reflectors; spoofed TCP/179 sources beyond it
/// evict the idlest (LRU).
pub const BGP_MAX_KEYS: u32 = 512;

/// BGP message types (RFC 4271 4.1; ROUTE-REFRESH: RFC 2918), the index
/// of [`BgpCounters::messages`]; 0 counts segments that start no message
/// (pure ACKs, the rest of a long message).
pub mod bgp_message {
    /// No message header at the start of the segment's payload.
    pub const NONE: u8 = 0;
    /// OPEN.
    pub const OPEN: u8 = 1;
    /// UPDATE.
    pub const UPDATE: u8 = 2;
    /// NOTIFICATION (with error code and subcode).
    pub const NOTIFICATION: u8 = 3;
    /// KEEPALIVE.
    pub const KEEPALIVE: u8 = 4;
    /// ROUTE-REFRESH.
    pub const ROUTE_REFRESH: u8 = 5;
    /// Slots of [`super::BgpCounters::messages`]; an unknown type counts
    /// as [`NONE`].
    pub const SLOTS: usize = 6;
}

/// Key of [`BGP_MAP`]: the other end of a TCP/179 connection as seen on
/// one interface in one direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct BgpKey {
    /// Peer address (source on rx, destination on tx), as [`FlowKey::peer`].
    pub peer: [u32; 4],
    /// Interface index.
    pub ifindex: u32,
    /// [`Direction`] as u8.
    pub direction: u8,
    /// [`family`] of `peer`.
    pub peer_family: u8,
    /// Zero.
    pub _pad: [u8; 2],
}

/// Counters of one [`BgpKey`] (shared by the CPUs; atomic adds).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BgpCounters {
    /// When the key was inserted (`bpf_ktime_get_ns`): a key the LRU
    /// evicted and inserted again between two reads starts from zero, which
    /// userspace tells by this changing.
    pub created_ns: u64,
    /// TCP segments as on the wire (a GSO skb counts its segments).
    pub segments: u64,
    /// Segments with SYN set.
    pub syn: u64,
    /// Segments with FIN set.
    pub fin: u64,
    /// Segments with RST set.
    pub rst: u64,
    /// Segments by the type of the BGP message that starts their payload
    /// (index: [`bgp_message`]).
    pub messages: [u64; bgp_message::SLOTS],
    /// `code << 8 | subcode` of the latest NOTIFICATION.
    pub last_notification: u64,
    /// When it was seen (`bpf_ktime_get_ns`; 0: none yet).
    pub last_notification_ns: u64,
    /// The hold time (seconds) proposed by the latest OPEN.
    pub hold_time: u64,
    /// When it was seen, as `last_notification_ns`.
    pub hold_time_ns: u64,
}

/// Indexes of the per-CPU [`STATS_MAP`] counters.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// New keys inserted into [`FLOWS_MAP`]; minus the live entries this
    /// gives the LRU evictions (userspace never deletes keys).
    FlowInserts = 0,
    /// Packets that could not be counted because the insert failed.
    FlowInsertFailures = 1,
    /// [`FLOW_CACHE_MAP`] slots claimed by a key.
    FlowCacheClaims = 2,
    /// Packets whose cache slot held another key, so they were counted in
    /// [`FLOWS_MAP`] (the slower path; counts stay exact).
    FlowCacheCollisions = 3,
    /// New keys inserted into [`BGP_MAP`] (minus its live entries: its
    /// LRU evictions).
    BgpInserts = 4,
    /// `observer probe` packets received (counted here, not in flows;
    /// see [`PROBE_MAGIC`]).
    ProbeRxPackets = 5,
    /// `observer probe` packets sent.
    ProbeTxPackets = 6,
    /// [`PLAIN_MAP`] slots (per CPU) that counted their first packet:
    /// userspace reads every slot only after this moves.
    PlainSlotsUsed = 7,
    /// Evidence records handed to [`EVIDENCE_MAP`] (`--capture-dir`).
    EvidenceSent = 8,
    /// Evidence records the perf ring of their CPU had no room for (the
    /// helper failed): lost, exactly.
    EvidenceLost = 9,
    /// Flagged or dropped frames not captured because their CPU had used
    /// its `config::EVIDENCE_RATE` for the second.
    EvidenceRateLimited = 10,
}

/// The first bytes of the inner ICMP payload of every `observer probe`
/// packet: the programs count such packets apart from the flows.
pub const PROBE_MAGIC: [u8; 8] = *b"OBSPROBE";

/// Number of slots in [`STATS_MAP`].
pub const STAT_COUNT: u32 = 11;

/// Proves at compile time, on both sides, that a map type has no padding:
/// its size is the sum of its fields' sizes and its last field ends it.
/// Padding bytes would carry uninitialised memory between kernel and user
/// space, which `aya::Pod` forbids and the eBPF verifier rejects in keys.
macro_rules! assert_no_padding {
    ($ty:ident { $($field:ident),+ }, $last:ident) => {
        const _: () = {
            let fields = 0 $(+ size_of_field(|v: &$ty| &v.$field))+;
            assert!(core::mem::size_of::<$ty>() == fields);
            assert!(
                core::mem::offset_of!($ty, $last) + size_of_field(|v: &$ty| &v.$last)
                    == core::mem::size_of::<$ty>()
            );
        };
    };
}

/// The size of the field a projection returns (the closure is never called:
/// it only names the field's type).
const fn size_of_field<S, F>(_: fn(&S) -> &F) -> usize {
    core::mem::size_of::<F>()
}

assert_no_padding!(
    FlowKey {
        peer,
        ifindex,
        vni,
        direction,
        proto,
        peer_family,
        reason
    },
    reason
);
assert_no_padding!(
    FlowValue {
        packets,
        bytes,
        inner_src,
        inner_dst,
        inner_family,
        _pad,
        tcp
    },
    tcp
);
assert_no_padding!(
    TcpCounts {
        syn,
        syn_ack,
        rst,
        mss_over
    },
    mss_over
);
assert_no_padding!(
    FlowCacheSlot {
        key,
        facts,
        _pad,
        value
    },
    value
);
assert_no_padding!(KeyFacts { verdict, mtu }, mtu);
assert_no_padding!(
    DropKey {
        peer,
        ifindex,
        vni,
        reason,
        origin,
        proto,
        peer_family,
        stage,
        direction,
        _pad,
        location
    },
    location
);
assert_no_padding!(
    BlockPeer {
        node,
        node_family,
        proto,
        _pad
    },
    _pad
);
assert_no_padding!(DropValue { packets, bytes }, bytes);
assert_no_padding!(
    EvidenceHeader {
        key,
        time_ns,
        reasons,
        wire_len,
        captured,
        link
    },
    link
);
assert_no_padding!(EvidenceCopy { header, data }, data);
assert_no_padding!(
    EvidenceBudget {
        second_start_ns,
        sent
    },
    sent
);
assert_no_padding!(PlainCounters { packets, bytes }, bytes);
assert_no_padding!(
    BgpKey {
        peer,
        ifindex,
        direction,
        peer_family,
        _pad
    },
    _pad
);
assert_no_padding!(
    BgpCounters {
        created_ns,
        segments,
        syn,
        fin,
        rst,
        messages,
        last_notification,
        last_notification_ns,
        hold_time,
        hold_time_ns
    },
    hold_time_ns
);
assert_no_padding!(WatchedIface { netns, ifindex }, ifindex);
assert_no_padding!(
    SkbLayout {
        skb_dev,
        skb_head,
        skb_mac_header,
        skb_tail,
        skb_data,
        skb_len,
        dev_ifindex,
        dev_nd_net,
        net_inum,
        skb_network_header,
        valid
    },
    valid
);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] integers and arrays of them without padding,
    // proven by the `assert_no_padding!` lines above; every bit pattern is
    // a valid value.
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::FlowValue {}
    unsafe impl aya::Pod for super::FlowCacheSlot {}
    unsafe impl aya::Pod for super::DropKey {}
    unsafe impl aya::Pod for super::DropValue {}
    unsafe impl aya::Pod for super::PlainCounters {}
    unsafe impl aya::Pod for super::BgpKey {}
    unsafe impl aya::Pod for super::BgpCounters {}
    unsafe impl aya::Pod for super::WatchedIface {}
    unsafe impl aya::Pod for super::SkbLayout {}
    unsafe impl aya::Pod for super::BlockPeer {}
    unsafe impl aya::Pod for super::EvidenceHeader {}
}

/// Name of the per-CPU LRU hash map of [`DropKey`] -> [`DropValue`]:
/// packets the classifier flags and packets the kernel drops, by reason.
pub const DROPS_MAP: &str = "DROPS";
/// LPM trie of IPv4 sources allowed to send VXLAN (key data: the address
/// word as in the packet).
pub const VXLAN_ALLOW_V4_MAP: &str = "VXLAN_ALLOW4";
/// LPM trie of IPv6 sources allowed to send VXLAN (key data: four words).
pub const VXLAN_ALLOW_V6_MAP: &str = "VXLAN_ALLOW6";
/// LPM trie of IPv4 sources allowed to send IPIP.
pub const IPIP_ALLOW_V4_MAP: &str = "IPIP_ALLOW4";
/// LPM trie of IPv6 sources allowed to send IP-in-IP.
pub const IPIP_ALLOW_V6_MAP: &str = "IPIP_ALLOW6";
/// Capacity of each allow-set trie.
pub const ALLOW_SET_MAX_PREFIXES: u32 = 65_536;
/// Name of the programs' data section holding the `u32` words indexed by
/// [`config`] constants (`[u32; config::COUNT]`): aya makes it an array
/// map of one value, which userspace rewrites whole.
pub const CONFIG_SECTION: &str = ".data.config";
/// Name of the hash set of VNIs configured on local vxlan devices.
pub const LOCAL_VNIS_MAP: &str = "LOCAL_VNIS";
/// Capacity of [`LOCAL_VNIS_MAP`].
pub const LOCAL_VNIS_MAX: u32 = 4096;
/// Name of the map ifindex -> underlay MTU of watched interfaces.
pub const IFACE_MTU_MAP: &str = "IFACE_MTU";
/// Name of the hash map of [`WatchedIface`]s the kfree_skb program counts,
/// each with its [`stage`].
pub const WATCHED_MAP: &str = "WATCHED";
/// Capacity of [`WATCHED_MAP`] and [`IFACE_MTU_MAP`]: the attached
/// interfaces, the tunnel devices and a node's pod-facing devices (a
/// Kubernetes node runs at most a few hundred pods).
pub const WATCHED_MAX: u32 = 1024;

/// Where on the way into a pod a watched interface sits: the value of
/// [`WATCHED_MAP`] and [`DropKey::stage`].
pub mod stage {
    /// An attached (underlay) interface: drops are parsed from the outer
    /// Ethernet header.
    pub const UNDERLAY: u8 = 0;
    /// A tunnel device (vxlan.calico, tunl0, flannel.1): the packet is
    /// decapsulated, drops are parsed from the inner IP header.
    pub const TUNNEL: u8 = 1;
    /// A pod-facing device (cali*, cni0, veth*): inner packets too.
    pub const POD: u8 = 2;
}

/// Name of the LPM trie of pod blocks -> the node that owns them
/// ([`BlockPeer`]), from the data-plane view: kfree_skb attributes a drop
/// after decapsulation to the node of its inner source (or destination).
/// Keys are sixteen bytes, IPv4 blocks as IPv4-mapped IPv6
/// (`::ffff:a.b.c.d`, prefix length + 96).
pub const BLOCKS_MAP: &str = "BLOCKS";
/// Capacity of [`BLOCKS_MAP`]: a block per node of a 16,384-node cluster.
pub const BLOCKS_MAX: u32 = 16_384;

/// The IPv4-mapped IPv6 words (as in the packet) of an IPv4 address word,
/// the key data of [`BLOCKS_MAP`].
#[inline(always)]
pub fn v4_mapped(addr: u32) -> [u32; 4] {
    [0, 0, u32::from_be(0x0000_ffff), addr]
}

/// Value of [`BLOCKS_MAP`]: the node a pod block belongs to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BlockPeer {
    /// The node's underlay address, as [`FlowKey::peer`].
    pub node: [u32; 4],
    /// [`family`] of `node`.
    pub node_family: u8,
    /// [`Proto`] of the tunnel the block is routed through (`Other`:
    /// direct routing).
    pub proto: u8,
    /// Padding, always zero.
    pub _pad: [u8; 2],
}
/// Name of the array of `u64` words whose bit `ifindex % WATCHED_BITS` is
/// set for every watched interface: kfree_skb's first test, two reads into
/// the skb, so that a drop on any other device costs almost nothing. A set
/// bit is then confirmed in [`WATCHED_MAP`] (ifindexes may share a bit).
///
/// It is the programs' data section of this name (`[u64; WATCHED_BITS /
/// 64]`), an array map of one value, like [`CONFIG_SECTION`].
pub const WATCHED_BITS_SECTION: &str = ".data.watched";
/// Bits in [`WATCHED_BITS_SECTION`] (a power of two).
pub const WATCHED_BITS: u32 = 65536;
/// `u64` words of [`WATCHED_BITS_SECTION`].
pub const WATCHED_BITS_WORDS: usize = (WATCHED_BITS / 64) as usize;

/// `ifindex`'s bit in [`WATCHED_BITS_SECTION`] (interfaces may share one).
#[inline(always)]
pub fn watched_bit(ifindex: u32) -> u32 {
    ifindex & (WATCHED_BITS - 1)
}
/// Name of the program array tc ingress tail-calls its drop checks from.
pub const CHECKS_MAP: &str = "CHECKS";
/// Name of the program array both tc hooks tail-call BGP counting from.
pub const BGP_PROG_MAP: &str = "BGP_PROG";
/// Name of the program array XDP tail-calls BGP counting from.
pub const XDP_BGP_PROG_MAP: &str = "XDP_BGP_PROG";
/// Name of the program array XDP tail-calls its drop checks from.
pub const XDP_CHECKS_PROG_MAP: &str = "XDP_CHECKS_PROG";
/// Name of the perf event array evidence records go through
/// (`--capture-dir`): an [`EvidenceHeader`] followed by
/// [`EvidenceHeader::captured`] bytes of the frame.
pub const EVIDENCE_MAP: &str = "EVIDENCE";
/// The most bytes of a frame an evidence record carries.
pub const EVIDENCE_MAX_SNAP: u32 = 1024;
/// Name of the global holding the [`SkbLayout`].
pub const SKB_LAYOUT_GLOBAL: &str = "SKB_LAYOUT";

/// The words of [`CONFIG_SECTION`], indexed by [`config`] constants.
pub type ConfigWords = [u32; config::COUNT as usize];

/// Indexes of [`CONFIG_SECTION`]; a non-zero value switches a check on.
pub mod config {
    /// An IPv4 VXLAN allow-set was found: check VXLAN sources against it.
    pub const VXLAN_ALLOW_V4: u32 = 0;
    /// An IPv6 VXLAN allow-set was found.
    pub const VXLAN_ALLOW_V6: u32 = 1;
    /// An IPv4 IPIP allow-set was found.
    pub const IPIP_ALLOW_V4: u32 = 2;
    /// An IPv6 IP-in-IP allow-set was found.
    pub const IPIP_ALLOW_V6: u32 = 3;
    /// Local vxlan devices were read: flag VNIs none of them has.
    pub const VNI_CHECK: u32 = 4;
    /// Generation of the node facts the checks read (the allow-sets and
    /// their switches, the local VNIs and the VNI switch, the interface
    /// MTUs), never 0: userspace increments it after every change, which
    /// voids the facts cached in [`super::FlowCacheSlot::facts`].
    pub const FACTS_GENERATION: u32 = 5;
    /// The hooks pass packets without counting them in the flow
    /// counters (drop flags and BGP at the wire go on). Set while a run
    /// attaches its interfaces and cleared once every hook is attached,
    /// so that both directions of every interface are counted from the
    /// same instant: XDP attached before tc egress counted requests whose
    /// replies left uncounted (3 of 30 GRE pings under qemu on 6.1).
    pub const PAUSED: u32 = 6;
    /// Evidence capture (`--capture-dir`): bytes of each flagged or
    /// dropped frame to hand to userspace, at most
    /// [`super::EVIDENCE_MAX_SNAP`]; 0: no capture (the programs then
    /// never look at the evidence maps).
    pub const EVIDENCE_SNAP: u32 = 7;
    /// Evidence records each CPU may send per second; the rest are
    /// counted as `Stat::EvidenceRateLimited`.
    pub const EVIDENCE_RATE: u32 = 8;
    /// Number of slots.
    pub const COUNT: u32 = 9;
}

/// Where a drop was seen.
pub mod drop_origin {
    /// Flagged by the ingress classifier (the packet itself still passes).
    pub const CLASSIFIER: u8 = 0;
    /// Freed by the kernel with a drop reason (skb:kfree_skb).
    pub const KERNEL: u8 = 1;
}

/// [`DropKey::reason`] of a kernel drop on a kernel whose `skb:kfree_skb`
/// tracepoint has no reason argument (before 5.17). No kernel reason has
/// this value: subsystem reasons use at most a few subsystem numbers.
pub const REASON_NOT_REPORTED: u32 = u32::MAX;

/// Reasons the ingress classifier flags (origin [`drop_origin::CLASSIFIER`]).
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClassifierDrop {
    /// Source not in the allow-set of its encapsulation (Calico drops it).
    CalicoAllowSet = 1,
    /// VXLAN header without the I (valid VNI) flag.
    VxlanNoIFlag = 2,
    /// VNI configured on no local vxlan device.
    VniUnknown = 3,
    /// The outer IP packet is a fragment.
    OuterFragment = 4,
    /// The outer IP packet is larger than the interface MTU.
    OverMtu = 5,
    /// A router answered a tunnel packet this node sent with ICMP
    /// "fragmentation needed" / ICMPv6 "packet too big": the path MTU is
    /// below the tunnel's. Counted against the tunnel peer the packet was
    /// for, with the reported next-hop MTU in the key's `vni` field.
    PathMtu = 6,
    /// The inner TCP checksum of a handshake or reset segment is wrong
    /// (`parse::checksums`): the receiving stack drops it.
    BadInnerChecksum = 7,
    /// The outer UDP checksum of such a packet is wrong: the receiving
    /// node drops it before decapsulation.
    BadOuterChecksum = 8,
    /// The outer UDP checksum of such a packet is zero (not computed):
    /// legal, counted apart, no drop.
    ZeroUdpChecksum = 9,
}

impl ClassifierDrop {
    /// Every reason.
    pub const ALL: [ClassifierDrop; 9] = [
        ClassifierDrop::CalicoAllowSet,
        ClassifierDrop::VxlanNoIFlag,
        ClassifierDrop::VniUnknown,
        ClassifierDrop::OuterFragment,
        ClassifierDrop::OverMtu,
        ClassifierDrop::PathMtu,
        ClassifierDrop::BadInnerChecksum,
        ClassifierDrop::BadOuterChecksum,
        ClassifierDrop::ZeroUdpChecksum,
    ];

    /// Decodes a stored reason.
    pub fn from_u16(value: u16) -> Option<ClassifierDrop> {
        ClassifierDrop::ALL.into_iter().find(|r| *r as u16 == value)
    }

    /// Name used in JSON (`drops` keys) and labels.
    pub fn name(self) -> &'static str {
        match self {
            ClassifierDrop::CalicoAllowSet => "calico_allow_set",
            ClassifierDrop::VxlanNoIFlag => "vxlan_no_i_flag",
            ClassifierDrop::VniUnknown => "vni_unknown",
            ClassifierDrop::OuterFragment => "outer_fragment",
            ClassifierDrop::OverMtu => "over_mtu",
            ClassifierDrop::PathMtu => "path_mtu",
            ClassifierDrop::BadInnerChecksum => "bad_inner_checksum",
            ClassifierDrop::BadOuterChecksum => "bad_outer_checksum",
            ClassifierDrop::ZeroUdpChecksum => "zero_udp_checksum",
        }
    }
}

/// Key of [`DROPS_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DropKey {
    /// Outer source of the dropped packet (zero for `Other`); for
    /// [`ClassifierDrop::PathMtu`] the destination of the quoted packet;
    /// after decapsulation the node whose pod block holds the inner
    /// source or destination ([`BLOCKS_MAP`], see `direction`), zero
    /// when no block does.
    pub peer: [u32; 4],
    /// Interface the packet arrived on (underlay), or was on when the
    /// kernel freed it (tunnel and pod devices).
    pub ifindex: u32,
    /// VNI when the encapsulation has one; for [`ClassifierDrop::PathMtu`]
    /// the next-hop MTU the router reported (rows per MTU value stay few).
    pub vni: u32,
    /// [`ClassifierDrop`] or the kernel's drop reason: `enum
    /// skb_drop_reason`, with a subsystem (e.g. openvswitch) in the upper
    /// 16 bits for subsystem reasons.
    pub reason: u32,
    /// [`drop_origin`].
    pub origin: u8,
    /// [`Proto`] as u8.
    pub proto: u8,
    /// [`family`] of `peer`.
    pub peer_family: u8,
    /// [`stage`] of the interface.
    pub stage: u8,
    /// [`Direction`] as u8: after decapsulation, `Rx` when `peer` is the
    /// node the inner source belongs to, `Tx` when it is the inner
    /// destination's (the packet was on its way there); always `Rx` on
    /// the underlay.
    pub direction: u8,
    /// Padding, always zero.
    pub _pad: [u8; 7],
    /// Kernel drops: the address the skb was freed from (the
    /// tracepoint's `location`), which userspace names through
    /// `/proc/kallsyms`; 0 for the classifier.
    pub location: u64,
}

impl DropKey {
    /// The key of a drop of the classified frame `c` on underlay
    /// interface `ifindex`.
    #[inline(always)]
    pub fn of(ifindex: u32, c: &parse::Classified, origin: u8, reason: u32) -> DropKey {
        DropKey {
            peer: c.peer,
            ifindex,
            vni: c.vni,
            reason,
            origin,
            proto: c.proto as u8,
            peer_family: c.peer_family,
            stage: stage::UNDERLAY,
            direction: Direction::Rx as u8,
            _pad: [0; 7],
            location: 0,
        }
    }
}

/// What an evidence record's bytes start with ([`EvidenceHeader::link`]).
pub mod evidence_link {
    /// The frame from its Ethernet header (XDP and tc).
    pub const ETHERNET: u32 = 0;
    /// The packet from its IP header (kernel drops: the skb's network
    /// header, which every stage has; an underlay drop's outer packet).
    pub const RAW_IP: u32 = 1;
}

/// The head of one record of [`EVIDENCE_MAP`]: a frame the programs
/// flagged or saw dropped, followed by [`captured`](Self::captured) of its
/// bytes. Also each CPU's evidence slots, where the checks of one frame
/// gather its reasons before the record is sent.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EvidenceHeader {
    /// The drop's key: peer, interface, stage, direction, origin,
    /// location; `reason` the kernel's (origin kernel) or the last
    /// classifier reason.
    pub key: DropKey,
    /// `bpf_ktime_get_ns` when sent (CLOCK_MONOTONIC).
    pub time_ns: u64,
    /// Classifier drops: bit `1 << reason` for each [`ClassifierDrop`]
    /// flagged on the frame; 0 for kernel drops.
    pub reasons: u32,
    /// The frame's length (the skb's for kernel drops).
    pub wire_len: u32,
    /// Bytes of the frame after this header.
    pub captured: u32,
    /// [`evidence_link`].
    pub link: u32,
}

/// A kernel drop's evidence record, assembled in a per-CPU buffer (a
/// tracepoint cannot append packet bytes the way XDP and tc can).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EvidenceCopy {
    /// The record's head.
    pub header: EvidenceHeader,
    /// The packet's first bytes (`header.captured` of them are sent).
    /// Twice [`EVIDENCE_MAX_SNAP`]: the program bounds the length it
    /// copies with a mask (`len & (2 * EVIDENCE_MAX_SNAP - 1)`), which
    /// every verifier follows, where 5.10's loses a minimum's bound.
    pub data: [u8; 2 * EVIDENCE_MAX_SNAP as usize],
}

/// A CPU's evidence budget: the second it counts and what it sent in it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EvidenceBudget {
    /// `bpf_ktime_get_ns` at the start of the second counted.
    pub second_start_ns: u64,
    /// Records sent within it.
    pub sent: u64,
}

/// Per-CPU value of [`DROPS_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DropValue {
    /// Packets.
    pub packets: u64,
    /// Bytes (frame length for the classifier, skb length for the kernel).
    pub bytes: u64,
}

/// Interface identity for the kfree_skb filter: network namespace inode
/// number and interface index (indexes repeat across namespaces).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WatchedIface {
    /// Inode number of the network namespace (`stat /proc/self/ns/net`).
    pub netns: u32,
    /// Interface index inside it.
    pub ifindex: u32,
}

/// Byte offsets of kernel structure fields, read from the running
/// kernel's BTF at load time so one build runs on many kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SkbLayout {
    /// `sk_buff.dev` (struct net_device *).
    pub skb_dev: u32,
    /// `sk_buff.head` (unsigned char *).
    pub skb_head: u32,
    /// `sk_buff.mac_header` (u16 offset from head).
    pub skb_mac_header: u32,
    /// `sk_buff.tail` (u32 offset from head on 64-bit kernels).
    pub skb_tail: u32,
    /// `sk_buff.data` (unsigned char *).
    pub skb_data: u32,
    /// `sk_buff.len`.
    pub skb_len: u32,
    /// `net_device.ifindex`.
    pub dev_ifindex: u32,
    /// `net_device.nd_net` (possible_net_t, whose first member is `struct net *`).
    pub dev_nd_net: u32,
    /// `net.ns.inum`.
    pub net_inum: u32,
    /// `sk_buff.network_header` (u16 offset from head).
    pub skb_network_header: u32,
    /// Non-zero once userspace filled the offsets in.
    pub valid: u32,
}
