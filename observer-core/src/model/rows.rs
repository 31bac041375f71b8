//! The rows kernel maps decode into: flow identities and counters, drop
//! identities with their reasons named (classifier reasons by our name,
//! kernel reasons by the running kernel's), the one-line explanation an SRE
//! acts on, and the kernel's own self counters. Plain data: the `bpf` layer
//! fills these from the maps.

use std::{
    cmp::Ordering,
    collections::HashMap,
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use observer_common::{
    ClassifierDrop, Direction, DropKey, FlowKey, FlowValue, Proto, REASON_NOT_REPORTED, TcpCounts,
    Unclassified, drop_origin, family, stage,
};

/// One row as reported to the user.
#[derive(Debug, Clone, PartialEq)]
pub struct Row<K = FlowId> {
    /// Identity of the row.
    pub id: K,
    /// Packets since attach.
    pub packets: u64,
    /// Bytes since attach.
    pub bytes: u64,
    /// Packets per second over the last interval.
    pub pps: f64,
    /// Bits per second over the last interval.
    pub bps: f64,
    /// Latest inner (source, destination) sample.
    pub inner: Option<(IpAddr, IpAddr)>,
    /// Packets counted during the last interval (part of `packets`).
    pub interval_packets: u64,
    /// Inner TCP signals since attach (tunnel rows).
    pub tcp: TcpCounts,
    /// Inner TCP signals counted during the last interval (part of `tcp`).
    pub interval_tcp: TcpCounts,
}

impl<K> Row<K> {
    /// Whether the counters moved during the last interval.
    pub fn changed(&self) -> bool {
        self.interval_packets != 0
    }
}

/// The order rows are shown in: highest packet rate first, then most
/// bytes, then by identity (a total order, so output is stable).
pub fn by_rate<K: Ord>(a: &Row<K>, b: &Row<K>) -> Ordering {
    b.pps
        .total_cmp(&a.pps)
        .then(b.bytes.cmp(&a.bytes))
        .then_with(|| a.id.cmp(&b.id))
}

/// Identity of one counter row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowId {
    /// Interface index the packet was seen on.
    pub ifindex: u32,
    /// rx or tx.
    pub direction: Direction,
    /// Encapsulation (`Other` for plain IP and unclassified frames).
    pub proto: Proto,
    /// Why the frame was not classified (`None` when it was).
    pub reason: Unclassified,
    /// Outer source (rx) or destination (tx); `None` for aggregates.
    pub peer: Option<IpAddr>,
    /// VNI (VXLAN, VXLAN-GPE, Geneve), else 0.
    pub vni: u32,
}

impl FlowId {
    /// Decodes a kernel key. Unknown enum bytes decode to safe defaults
    /// rather than failing: the map is the kernel's, not ours to trust blindly.
    pub fn from_key(key: &FlowKey) -> FlowId {
        FlowId {
            ifindex: key.ifindex,
            direction: if key.direction == Direction::Tx as u8 {
                Direction::Tx
            } else {
                Direction::Rx
            },
            proto: Proto::from_u8(key.proto),
            reason: Unclassified::from_u8(key.reason),
            peer: decode_addr(&key.peer, key.peer_family),
            vni: key.vni,
        }
    }
}

/// Counters of one row, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowCounters {
    /// Packets as on the wire.
    pub packets: u64,
    /// Bytes as on the wire (Ethernet header included).
    pub bytes: u64,
    /// Inner TCP signals.
    pub tcp: TcpCounts,
    /// One (inner source, inner destination) sample, when the encapsulation has one.
    pub inner: Option<(IpAddr, IpAddr)>,
    /// The part of the counters read from the per-CPU flow cache and
    /// plain counters (the rest is the LRU map's). The two parts move
    /// independently: the cache part only grows, the map part restarts
    /// from zero when the LRU evicts the key.
    pub cached: Tally,
}

/// What one kernel store holds of a row: the counters the aggregator
/// keeps monotonic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
    /// Inner TCP signals.
    pub tcp: TcpCounts,
}

impl Tally {
    /// Packets and bytes only.
    pub fn counts(packets: u64, bytes: u64) -> Tally {
        Tally {
            packets,
            bytes,
            tcp: TcpCounts::NONE,
        }
    }

    /// `self - earlier` when no counter went backwards since `earlier`;
    /// `None` when one did (the store lost the key and counts anew).
    pub fn since(&self, earlier: &Tally) -> Option<Tally> {
        let (a, b) = (&self.tcp, &earlier.tcp);
        Some(Tally {
            packets: self.packets.checked_sub(earlier.packets)?,
            bytes: self.bytes.checked_sub(earlier.bytes)?,
            tcp: TcpCounts {
                syn: a.syn.checked_sub(b.syn)?,
                syn_ack: a.syn_ack.checked_sub(b.syn_ack)?,
                rst: a.rst.checked_sub(b.rst)?,
                mss_over: a.mss_over.checked_sub(b.mss_over)?,
            },
        })
    }

    /// Adds `other`.
    pub fn add(&mut self, other: &Tally) {
        self.packets += other.packets;
        self.bytes += other.bytes;
        self.tcp.add(&other.tcp);
    }
}

impl FlowCounters {
    /// Sums per-CPU values; the inner sample is taken from any CPU that has one.
    pub fn sum<'a>(values: impl IntoIterator<Item = &'a FlowValue>) -> FlowCounters {
        let mut total = FlowCounters::default();
        for value in values {
            total.packets += value.packets;
            total.bytes += value.bytes;
            total.tcp.add(&value.tcp);
            if total.inner.is_none()
                && let (Some(src), Some(dst)) = (
                    decode_addr(&value.inner_src, value.inner_family),
                    decode_addr(&value.inner_dst, value.inner_family),
                )
            {
                total.inner = Some((src, dst));
            }
        }
        total
    }

    /// The counters as one [`Tally`].
    pub fn tally(&self) -> Tally {
        Tally {
            packets: self.packets,
            bytes: self.bytes,
            tcp: self.tcp,
        }
    }

    /// Adds `other`'s counters; the inner sample stays this one's when it
    /// has one.
    pub fn add(&mut self, other: &FlowCounters) {
        self.packets += other.packets;
        self.bytes += other.bytes;
        self.tcp.add(&other.tcp);
        self.inner = self.inner.or(other.inner);
    }

    /// Whether the key has an entry in the kernel's LRU flow map: more
    /// than its flow-cache part (every map entry holds at least one
    /// packet; keys only the cache holds can never be evicted).
    pub fn in_map(&self) -> bool {
        self.packets > self.cached.packets
    }
}

/// How many of `rows` (one flow-counter read) have entries in the kernel's
/// LRU flow map: a row with more than its flow-cache part. Every map entry
/// holds at least one packet, so the count is exact; rows only the cache
/// holds are not map entries (they can never be evicted).
pub fn map_entries(rows: &[(FlowId, FlowCounters)]) -> u64 {
    rows.iter()
        .filter(|(_, counters)| counters.in_map())
        .count() as u64
}

/// Turns the kernel's address words (network byte order in memory) into an address.
pub fn decode_addr(words: &[u32; 4], addr_family: u8) -> Option<IpAddr> {
    let mut bytes = [0u8; 16];
    for (chunk, word) in bytes.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
    match addr_family {
        family::V4 => Some(IpAddr::V4(Ipv4Addr::new(
            bytes[0], bytes[1], bytes[2], bytes[3],
        ))),
        family::V6 => Some(IpAddr::V6(Ipv6Addr::from(bytes))),
        _ => None,
    }
}

/// Where a drop was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    /// Flagged by the ingress classifier; the packet itself passed the
    /// observer (the node's own rules drop it later).
    Classifier,
    /// Freed by the kernel with a drop reason.
    Kernel,
}

impl Origin {
    /// Name in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Classifier => "classifier",
            Origin::Kernel => "kernel",
        }
    }
}

/// Where on its way into (or out of) the node a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Stage {
    /// On an attached interface, still encapsulated.
    #[default]
    Underlay,
    /// On a tunnel device, after decapsulation (or before encapsulation).
    Tunnel,
    /// On a pod-facing device (cali*, cni0, veth*).
    Pod,
}

impl Stage {
    /// Name in JSON and labels.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Underlay => "underlay",
            Stage::Tunnel => "tunnel",
            Stage::Pod => "pod",
        }
    }

    /// The stage of a kernel key's `stage` byte.
    pub fn from_u8(value: u8) -> Stage {
        match value {
            stage::TUNNEL => Stage::Tunnel,
            stage::POD => Stage::Pod,
            _ => Stage::Underlay,
        }
    }

    /// The kernel's byte for it.
    pub fn to_u8(self) -> u8 {
        match self {
            Stage::Underlay => stage::UNDERLAY,
            Stage::Tunnel => stage::TUNNEL,
            Stage::Pod => stage::POD,
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Identity of one drop row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DropId {
    /// Interface the packet arrived on (underlay) or was on when the
    /// kernel freed it (tunnel and pod devices).
    pub ifindex: u32,
    /// Outer protocol; after decapsulation the encapsulation the peer's
    /// pod block is routed through.
    pub proto: Proto,
    /// Outer source (`None` for the `other` aggregate); after
    /// decapsulation the node owning the inner source's pod block
    /// (`direction` rx) or the inner destination's (tx).
    pub peer: Option<IpAddr>,
    /// Where the packet was: underlay, tunnel or pod device.
    pub stage: Stage,
    /// After decapsulation, whether `peer` sent the packet (rx) or it was
    /// on its way to `peer` (tx); rx on the underlay.
    pub direction: Direction,
    /// Kernel drops: the kernel address that freed the packet (named by
    /// the `node` layer from `/proc/kallsyms`); 0 for the classifier.
    pub location: u64,
    /// VNI when the encapsulation has one.
    pub vni: u32,
    /// For `path_mtu` rows, the next-hop MTU the router reported (the
    /// kernel key carries it in its `vni` field, see `DropKey`).
    pub mtu: Option<u32>,
    /// Classifier or kernel.
    pub origin: Origin,
    /// `ClassifierDrop` value or the kernel's drop reason value.
    pub reason: u32,
}

impl DropId {
    /// Decodes a kernel key; a `path_mtu` key's `vni` is its MTU.
    pub fn from_key(key: &DropKey) -> DropId {
        let origin = if key.origin == drop_origin::KERNEL {
            Origin::Kernel
        } else {
            Origin::Classifier
        };
        let path_mtu = origin == Origin::Classifier && key.reason == ClassifierDrop::PathMtu as u32;
        DropId {
            ifindex: key.ifindex,
            proto: Proto::from_u8(key.proto),
            peer: decode_addr(&key.peer, key.peer_family),
            vni: if path_mtu { 0 } else { key.vni },
            mtu: path_mtu.then_some(key.vni),
            origin,
            reason: key.reason,
            stage: Stage::from_u8(key.stage),
            direction: if key.direction == Direction::Tx as u8 {
                Direction::Tx
            } else {
                Direction::Rx
            },
            location: key.location,
        }
    }

    /// Reason name: ours for the classifier, the kernel's for the kernel.
    pub fn reason_name(&self, kernel: &KernelReasons) -> String {
        match self.origin {
            Origin::Classifier => classifier_reason(self.reason).map_or_else(
                || format!("classifier_{}", self.reason),
                |r| r.name().to_string(),
            ),
            Origin::Kernel => kernel.name(self.reason),
        }
    }
}

/// The running kernel's drop reason names (`enum skb_drop_reason` and its
/// subsystems, from BTF; their numbering differs between kernels).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelReasons {
    /// Reason value -> name without `SKB_DROP_REASON_`.
    pub reasons: HashMap<u32, String>,
    /// Subsystem (upper 16 bits) -> name.
    pub subsystems: HashMap<u32, String>,
}

impl KernelReasons {
    /// The kernel's name of drop reason `value` (`NETFILTER_DROP`, ...).
    /// Reasons of other subsystems (upper 16 bits set) are named
    /// `SUBSYSTEM:n`, e.g. `OPENVSWITCH:3`; [`REASON_NOT_REPORTED`] (a
    /// kernel before 5.17) is `NOT_REPORTED`.
    pub fn name(&self, value: u32) -> String {
        if value == REASON_NOT_REPORTED {
            return "NOT_REPORTED".to_string();
        }
        let subsystem = value >> 16;
        if subsystem != 0 {
            let name = self
                .subsystems
                .get(&subsystem)
                .cloned()
                .unwrap_or_else(|| format!("subsystem_{subsystem}"));
            return format!("{name}:{}", value & 0xffff);
        }
        self.reasons
            .get(&value)
            .cloned()
            .unwrap_or_else(|| format!("reason_{value}"))
    }
}

/// Packets and bytes of a drop row, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounters {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

fn classifier_reason(value: u32) -> Option<ClassifierDrop> {
    u16::try_from(value).ok().and_then(ClassifierDrop::from_u16)
}

/// What a classifier reason means, for the one-line message.
fn classifier_meaning(reason: ClassifierDrop, mtu: u32, allow_sets: &str) -> String {
    match reason {
        ClassifierDrop::CalicoAllowSet => format!("source not in {allow_sets}"),
        ClassifierDrop::VxlanNoIFlag => "VXLAN header without the I flag".to_string(),
        ClassifierDrop::VniUnknown => "VNI configured on no local vxlan device".to_string(),
        ClassifierDrop::OuterFragment => "outer IP packet is a fragment".to_string(),
        ClassifierDrop::OverMtu => "outer IP packet larger than the interface MTU".to_string(),
        ClassifierDrop::PathMtu => {
            format!("too big for the path (a router reported next-hop MTU {mtu})")
        }
        ClassifierDrop::BadInnerChecksum => {
            "inner TCP checksum wrong (a handshake or reset the receiving stack drops)".to_string()
        }
        ClassifierDrop::BadOuterChecksum => {
            "outer UDP checksum wrong (dropped before decapsulation)".to_string()
        }
        ClassifierDrop::ZeroUdpChecksum => {
            "outer UDP checksum zero: not computed, legal, no drop".to_string()
        }
    }
}

/// The sentence for a drop row, e.g. "579 VXLAN packets from 10.10.10.244
/// dropped: source not in cali40all-vxlan-net", or after decapsulation
/// "12 VXLAN packets from a pod of 10.99.0.1 dropped on vxlan.calico
/// (tunnel) at nf_hook_slow: kernel drop reason NETFILTER_DROP".
/// `allow_sets` names the sets of the row's protocol, `device` the
/// interface, `location` the kernel function that freed the packets.
pub fn message(
    id: &DropId,
    packets: u64,
    reason: &str,
    allow_sets: &str,
    device: &str,
    location: Option<&str>,
) -> String {
    let what = match id.proto {
        Proto::Other => "non-tunnel".to_string(),
        proto => proto.name().to_uppercase(),
    };
    let path_mtu = id.origin == Origin::Classifier && id.reason == ClassifierDrop::PathMtu as u32;
    // A path_mtu row counts packets this node sent: its peer is the
    // destination; so does a drop after decapsulation on the way out.
    let toward = path_mtu || id.direction == Direction::Tx;
    let pod_of = if id.stage == Stage::Underlay {
        ""
    } else {
        "a pod of "
    };
    let from = id.peer.map_or(String::new(), |p| {
        format!(" {} {pod_of}{p}", if toward { "to" } else { "from" })
    });
    let at = location.map_or(String::new(), |l| format!(" at {l}"));
    if id.stage != Stage::Underlay {
        let plural = if packets == 1 { "packet" } else { "packets" };
        let what = match id.peer {
            Some(_) => what,
            None => "inner".to_string(),
        };
        return format!(
            "{packets} {what} {plural}{from} dropped on {device} ({}){at}: kernel drop reason {reason}",
            id.stage
        );
    }
    let plural = if packets == 1 { "packet" } else { "packets" };
    let verb = match id.origin {
        Origin::Classifier if path_mtu => "dropped on the path",
        Origin::Classifier if id.reason != ClassifierDrop::CalicoAllowSet as u32 => "flagged",
        _ => "dropped",
    };
    let why = match (id.origin, classifier_reason(id.reason)) {
        (Origin::Classifier, Some(r)) => classifier_meaning(r, id.mtu.unwrap_or(0), allow_sets),
        _ => format!("kernel drop reason {reason}"),
    };
    format!("{packets} {what} {plural}{from} {verb}{at}: {why}")
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a drop after decapsulation happened and which way the packet
/// went, for the anomaly rules: "on vxlan.calico at nf_hook_slow, from
/// its pods" (`device`, `location`); `None` on the underlay.
pub fn place(id: &DropId, device: &str, location: Option<&str>) -> Option<String> {
    if id.stage == Stage::Underlay {
        return None;
    }
    let at = location.map_or(String::new(), |l| format!(" at {l}"));
    let way = match id.direction {
        Direction::Rx => "from its pods",
        Direction::Tx => "to its pods",
    };
    Some(format!("on {device}{at}, {way}"))
}

/// Whether a kernel drop with `reason` freed at `location` happened in
/// the receiving host's socket layer: no socket listens (`NO_SOCKET`),
/// TCP discarding what it already has or does not want (`TCP_*`), a full
/// socket buffer or a socket filter (`SOCKET_*`, `PROTO_MEM`). After
/// decapsulation such a packet has reached its host: the application's
/// business, not the overlay's, and TCP discards retransmitted data all
/// day. Kernels that report no reason are judged by the function that
/// freed the packet, including ICMP's receive functions, which free
/// delivered packets through the same tracepoint there.
pub fn socket_level(reason: &str, location: Option<&str>) -> bool {
    const REASONS: [&str; 3] = ["TCP_", "SOCKET_", "PROTO_MEM"];
    if reason == "NO_SOCKET" || REASONS.iter().any(|r| reason.starts_with(r)) {
        return true;
    }
    // icmp_rcv: 5.10 frees every echo reply that no ping socket took (a
    // raw-socket ping's: the raw socket got a clone) with kfree_skb, 279
    // of 279 in the lab on 5.10.
    const FUNCTIONS: [&str; 11] = [
        "tcp_",
        "tcp6_",
        "udp",
        "__udp",
        "sk_",
        "sock_",
        "__sk_",
        "raw_",
        "icmp_rcv",
        "icmpv6_rcv",
        "ping_rcv",
    ];
    let unreported = reason == "NOT_REPORTED" || reason == "NOT_SPECIFIED";
    unreported && location.is_some_and(|l| FUNCTIONS.iter().any(|f| l.starts_with(f)))
}

/// A drop row with its reason named and explained.
#[derive(Debug, Clone)]
pub struct DropRow {
    /// Totals and rates.
    pub row: Row<DropId>,
    /// Reason name (`calico_allow_set`, `NETFILTER_DROP`, ...).
    pub reason: String,
    /// The kernel function that freed the packets (`nf_hook_slow`,
    /// `ip_rcv_finish_core`), from `/proc/kallsyms`; `None` for the
    /// classifier or when the kernel hides its addresses.
    pub location: Option<String>,
    /// After decapsulation, where and which way, for the anomaly rules
    /// (`on vxlan.calico at nf_hook_slow, from its pods`); `None` on the
    /// underlay.
    pub place: Option<String>,
    /// One-line explanation.
    pub message: String,
}

/// Kernel-side self counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// Keys in the flow map now.
    pub flow_entries: u64,
    /// Keys ever inserted.
    pub flow_inserts: u64,
    /// Keys evicted by the LRU (inserts minus live entries: nothing else deletes).
    pub flow_evictions: u64,
    /// Packets not counted because their key could not be inserted.
    pub flow_insert_failures: u64,
    /// Flow-cache slots held by a key (summed over CPUs; never freed).
    pub flow_cache_slots: u64,
    /// Packets counted in the LRU map because their cache slot held
    /// another key.
    pub flow_cache_collisions: u64,
    /// Keys ever inserted into the BGP map.
    pub bgp_inserts: u64,
    /// `observer probe` packets received, counted apart from the rows.
    pub probe_rx_packets: u64,
    /// `observer probe` packets sent.
    pub probe_tx_packets: u64,
    /// Evidence records the programs handed to their rings
    /// (`--capture-dir`).
    pub evidence_sent: u64,
    /// Evidence records a full ring had no room for.
    pub evidence_lost: u64,
    /// Flagged or dropped frames not captured: their CPU had sent
    /// `--capture-rate` records that second.
    pub evidence_rate_limited: u64,
}

impl KernelStats {
    /// Keys the BGP map's LRU evicted, given its live keys (nothing else
    /// deletes them).
    pub fn bgp_evictions(&self, bgp_entries: usize) -> u64 {
        self.bgp_inserts.saturating_sub(bgp_entries as u64)
    }
}

/// Name of a direction in JSON, labels and the table.
pub fn direction_name(direction: Direction) -> &'static str {
    match direction {
        Direction::Rx => "rx",
        Direction::Tx => "tx",
    }
}

/// Row builders for unit tests, one set for every module: defaults
/// (interface 2, rx, VXLAN, VNI 4096, 100 bytes a packet, moved this
/// interval) that a test overrides with struct update syntax.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use observer_common::{Direction, Proto, TcpCounts, Unclassified};

    use super::{DropId, DropRow, FlowId, Origin, Row};

    /// A received VXLAN flow from `peer`.
    pub fn flow_id(peer: &str) -> FlowId {
        FlowId {
            ifindex: 2,
            direction: Direction::Rx,
            proto: Proto::Vxlan,
            reason: Unclassified::None,
            peer: Some(peer.parse().expect("an address")),
            vni: 4096,
        }
    }

    /// A VXLAN drop from `peer` with `reason` of `origin`.
    pub fn drop_id(peer: &str, origin: Origin, reason: u32) -> DropId {
        DropId {
            ifindex: 2,
            proto: Proto::Vxlan,
            peer: Some(peer.parse().expect("an address")),
            vni: 4096,
            mtu: None,
            origin,
            reason,
            stage: super::Stage::Underlay,
            direction: Direction::Rx,
            location: 0,
        }
    }

    /// The row of `id` with `packets` (100 bytes each), no rates.
    pub fn row<K>(id: K, packets: u64) -> Row<K> {
        Row {
            id,
            packets,
            bytes: packets * 100,
            pps: 0.0,
            bps: 0.0,
            inner: None,
            interval_packets: packets,
            tcp: TcpCounts::NONE,
            interval_tcp: TcpCounts::NONE,
        }
    }

    /// The drop row of `id` with `packets`, its reason named `reason`.
    pub fn drop_row(id: DropId, packets: u64, reason: &str) -> DropRow {
        DropRow {
            row: row(id, packets),
            reason: reason.to_string(),
            location: None,
            place: None,
            message: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(bytes: [u8; 16]) -> [u32; 4] {
        let mut w = [0u32; 4];
        for (i, chunk) in bytes.chunks_exact(4).enumerate() {
            w[i] = u32::from_ne_bytes(chunk.try_into().unwrap());
        }
        w
    }

    #[test]
    fn map_entries_leave_out_rows_only_the_cache_holds() {
        let id = testing::flow_id("10.10.60.127");
        let counters = |packets: u64, cached: u64| FlowCounters {
            packets,
            bytes: packets * 100,
            cached: Tally::counts(cached, cached * 100),
            ..FlowCounters::default()
        };
        let rows = [
            (id, counters(5, 0)),
            (id, counters(7, 7)),
            (id, counters(9, 4)),
        ];
        assert_eq!(map_entries(&rows), 2);
    }

    #[test]
    fn decodes_ipv4_and_ipv6_in_network_order() {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&[10, 10, 60, 127]);
        assert_eq!(
            decode_addr(&words(b), family::V4),
            Some("10.10.60.127".parse().unwrap())
        );
        let v6: Ipv6Addr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            decode_addr(&words(v6.octets()), family::V6),
            Some(IpAddr::V6(v6))
        );
        assert_eq!(decode_addr(&words(b), family::NONE), None);
    }

    #[test]
    fn sums_cpus_and_keeps_first_inner_sample() {
        let mut inner = [0u8; 16];
        inner[..4].copy_from_slice(&[10, 42, 0, 1]);
        let with_sample = FlowValue {
            packets: 2,
            bytes: 200,
            inner_src: words(inner),
            inner_dst: words(inner),
            inner_family: family::V4,
            _pad: [0; 7],
            tcp: TcpCounts::NONE,
        };
        let without = FlowValue {
            packets: 3,
            bytes: 300,
            ..FlowValue::default()
        };
        let total = FlowCounters::sum([&without, &with_sample]);
        assert_eq!((total.packets, total.bytes), (5, 500));
        let ip: IpAddr = "10.42.0.1".parse().unwrap();
        assert_eq!(total.inner, Some((ip, ip)));
    }

    #[test]
    fn unknown_enum_bytes_decode_safely() {
        let key = FlowKey {
            peer: [0; 4],
            ifindex: 3,
            vni: 0,
            direction: 9,
            proto: 200,
            peer_family: 77,
            reason: 99,
        };
        let id = FlowId::from_key(&key);
        assert_eq!(id.direction, Direction::Rx);
        assert_eq!(id.proto, Proto::Other);
        assert_eq!(id.reason, Unclassified::Unsupported);
        assert_eq!(id.peer, None);
    }

    fn id(origin: Origin, reason: u32) -> DropId {
        testing::drop_id("10.10.10.244", origin, reason)
    }

    #[test]
    fn the_incident_in_one_line() {
        let msg = message(
            &id(Origin::Classifier, ClassifierDrop::CalicoAllowSet as u32),
            579,
            "calico_allow_set",
            "cali40all-vxlan-net",
            "eth0",
            None,
        );
        assert_eq!(
            msg,
            "579 VXLAN packets from 10.10.10.244 dropped: source not in cali40all-vxlan-net"
        );
    }

    #[test]
    fn kernel_reasons_use_the_kernel_name() {
        let msg = message(
            &id(Origin::Kernel, 12),
            1,
            "NETFILTER_DROP",
            "",
            "eth0",
            Some("nf_hook_slow"),
        );
        assert_eq!(
            msg,
            "1 VXLAN packet from 10.10.10.244 dropped at nf_hook_slow: kernel drop reason NETFILTER_DROP"
        );
    }

    #[test]
    fn drops_after_decapsulation_name_device_stage_and_direction() {
        let rx = DropId {
            stage: Stage::Tunnel,
            vni: 0,
            ..id(Origin::Kernel, 12)
        };
        let msg = message(
            &rx,
            12,
            "NETFILTER_DROP",
            "",
            "vxlan.calico",
            Some("nf_hook_slow"),
        );
        assert_eq!(
            msg,
            "12 VXLAN packets from a pod of 10.10.10.244 dropped on vxlan.calico (tunnel) at nf_hook_slow: kernel drop reason NETFILTER_DROP"
        );
        let tx = DropId {
            stage: Stage::Pod,
            direction: Direction::Tx,
            ..rx
        };
        let msg = message(&tx, 1, "NETFILTER_DROP", "", "cali1", None);
        assert_eq!(
            msg,
            "1 VXLAN packet to a pod of 10.10.10.244 dropped on cali1 (pod): kernel drop reason NETFILTER_DROP"
        );
        let nobody = DropId {
            peer: None,
            proto: Proto::Other,
            ..rx
        };
        assert_eq!(
            message(&nobody, 2, "IP_RPFILTER", "", "vxlan.calico", None),
            "2 inner packets dropped on vxlan.calico (tunnel): kernel drop reason IP_RPFILTER"
        );
    }

    #[test]
    fn socket_layer_drops_are_told_apart() {
        for (reason, location) in [
            ("NO_SOCKET", None),
            ("TCP_OLD_DATA", Some("tcp_data_queue")),
            ("SOCKET_RCVBUFF", None),
            ("PROTO_MEM", None),
            ("NOT_REPORTED", Some("__udp4_lib_rcv")),
            ("NOT_SPECIFIED", Some("tcp_v4_rcv")),
            ("NOT_REPORTED", Some("icmp_rcv")),
        ] {
            assert!(socket_level(reason, location), "{reason} at {location:?}");
        }
        for (reason, location) in [
            ("NETFILTER_DROP", Some("nf_hook_slow")),
            ("IP_RPFILTER", Some("ip_rcv_finish_core")),
            ("UDP_CSUM", Some("__udp4_lib_rcv")),
            ("NOT_REPORTED", Some("nf_hook_slow")),
            ("NOT_REPORTED", None),
        ] {
            assert!(!socket_level(reason, location), "{reason} at {location:?}");
        }
    }

    #[test]
    fn drop_keys_after_decapsulation_decode_stage_direction_and_location() {
        let key = DropKey {
            peer: [u32::from_ne_bytes([10, 99, 0, 1]), 0, 0, 0],
            ifindex: 7,
            vni: 0,
            reason: 12,
            origin: drop_origin::KERNEL,
            proto: Proto::Vxlan as u8,
            peer_family: family::V4,
            stage: stage::POD,
            direction: Direction::Tx as u8,
            _pad: [0; 7],
            location: 0xffff_ffff_8100_1234,
        };
        let id = DropId::from_key(&key);
        assert_eq!(id.stage, Stage::Pod);
        assert_eq!(id.direction, Direction::Tx);
        assert_eq!(id.location, 0xffff_ffff_8100_1234);
        assert_eq!(id.peer, Some("10.99.0.1".parse().unwrap()));
        let odd = DropKey {
            stage: 9,
            direction: 9,
            ..key
        };
        assert_eq!(DropId::from_key(&odd).stage, Stage::Underlay);
        assert_eq!(DropId::from_key(&odd).direction, Direction::Rx);
    }

    #[test]
    fn other_checks_are_flags_not_drops() {
        let msg = message(
            &id(Origin::Classifier, ClassifierDrop::VniUnknown as u32),
            3,
            "vni_unknown",
            "",
            "eth0",
            None,
        );
        assert_eq!(
            msg,
            "3 VXLAN packets from 10.10.10.244 flagged: VNI configured on no local vxlan device"
        );
    }

    #[test]
    fn path_mtu_keys_carry_their_mtu_in_its_own_field() {
        let key = DropKey {
            peer: [0; 4],
            ifindex: 2,
            vni: 1400,
            reason: ClassifierDrop::PathMtu as u32,
            origin: drop_origin::CLASSIFIER,
            proto: Proto::Ipip as u8,
            peer_family: family::NONE,
            stage: stage::UNDERLAY,
            direction: Direction::Rx as u8,
            _pad: [0; 7],
            location: 0,
        };
        let id = DropId::from_key(&key);
        assert_eq!((id.vni, id.mtu), (0, Some(1400)));
        let other = DropKey {
            reason: ClassifierDrop::VniUnknown as u32,
            ..key
        };
        assert_eq!(DropId::from_key(&other).mtu, None);
        assert_eq!(DropId::from_key(&other).vni, 1400);
    }

    #[test]
    fn kernel_reasons_are_named_from_the_table() {
        let kernel = KernelReasons {
            reasons: HashMap::from([(12, "NETFILTER_DROP".to_string())]),
            subsystems: HashMap::from([(3, "OPENVSWITCH".to_string())]),
        };
        assert_eq!(kernel.name(12), "NETFILTER_DROP");
        assert_eq!(kernel.name(99), "reason_99");
        assert_eq!(kernel.name((3 << 16) | 5), "OPENVSWITCH:5");
        assert_eq!(kernel.name(REASON_NOT_REPORTED), "NOT_REPORTED");
    }
}
