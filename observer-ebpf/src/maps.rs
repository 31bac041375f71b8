//! The maps the programs write (layouts in `observer-common`).

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{
        HashMap, LpmTrie, LruHashMap, LruPerCpuHashMap, PerCpuArray, PerfEventArray, ProgramArray,
    },
};
use observer_common::parse::{self, Classified, PortTable, Scratch, clobbered};
use observer_common::{
    ALLOW_SET_MAX_PREFIXES, BGP_MAX_KEYS, BLOCKS_MAX, BgpCounters, BgpKey, BlockPeer, ConfigWords,
    DEFAULT_MAX_FLOWS, DropKey, DropValue, EvidenceBudget, EvidenceCopy, EvidenceHeader,
    FLOW_CACHE_SLOTS, FlowCacheSlot, FlowKey, FlowValue, LOCAL_VNIS_MAX, PLAIN_SLOTS,
    PlainCounters, Proto, STAT_COUNT, SkbLayout, Unclassified, WATCHED_BITS_WORDS, WATCHED_MAX,
    WatchedIface, config, watched_bit,
};

/// Per (interface, direction, protocol, peer, VNI) packet and byte counters.
/// Per-CPU so that the hot path needs no atomics; LRU so that it stays
/// bounded whatever sources an attacker forges.
#[map(name = "FLOWS")]
pub static FLOWS: LruPerCpuHashMap<FlowKey, FlowValue> =
    LruPerCpuHashMap::with_max_entries(DEFAULT_MAX_FLOWS, 0);

/// Per-CPU direct-mapped cache in front of [`FLOWS`]: the steady state of
/// a flow is one array lookup, a key compare and two adds (see
/// `observer_common::FlowCacheSlot` for why slots are never evicted).
#[map(name = "FLOW_CACHE")]
pub static FLOW_CACHE: PerCpuArray<FlowCacheSlot> =
    PerCpuArray::with_max_entries(FLOW_CACHE_SLOTS, 0);

/// Plain traffic per (interface, direction), per CPU (see
/// `observer_common::PLAIN_MAP`).
#[map(name = "PLAIN")]
pub static PLAIN: PerCpuArray<PlainCounters> = PerCpuArray::with_max_entries(PLAIN_SLOTS, 0);

/// UDP port -> protocol byte (see `observer_common::PORT_MATCH_SOURCE`),
/// indexed by port. A global, not an array map: the loader writes it
/// before load (`UDP_PORT_TAGS_GLOBAL`) into `.rodata`, which it freezes,
/// and a lookup is then one load at the port's offset, where an array
/// map's lookup is a dozen instructions (the key through the stack, the
/// bounds check, the address arithmetic) even when the verifier inlines
/// it; plain UDP pays two lookups.
#[unsafe(no_mangle)]
pub static UDP_PORT_TAGS: [u8; 65536] = [0; 65536];

/// The parser's port table: [`UDP_PORT_TAGS`].
pub struct MapPorts;

impl PortTable for MapPorts {
    #[inline(always)]
    fn tag(&self, port: u16) -> u8 {
        // Bounded for the verifier: the port comes out of a byte swap.
        let index = parse::bounded(port as usize, 0xffff);
        // SAFETY: `index` is inside the 65,536 bytes. Volatile: the
        // compiler sees an immutable table of zeroes, which the loader
        // overwrites.
        unsafe { read_volatile(UDP_PORT_TAGS.as_ptr().add(index)) }
    }
}

/// TCP/179 segments per (interface, direction, peer): flags and the BGP
/// message each starts with. LRU: spoofed peers cannot grow it. Shared,
/// not per-CPU, with atomic adds: BGP is a few segments a second, and
/// userspace sizes the map by the CPU count (see `observer_common::BGP_MAP`).
#[map(name = "BGP")]
pub static BGP: LruHashMap<BgpKey, BgpCounters> = LruHashMap::with_max_entries(BGP_MAX_KEYS, 0);

/// The BGP counting program (slot 0), tail-called by both tc hooks for
/// TCP/179: verified alone, it does not multiply the states of theirs.
#[map(name = "BGP_PROG")]
pub static BGP_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// XDP's BGP counting program (slot 0; the variant matching XDP's, since
/// the kernel refuses a tail call between multi- and single-buffer XDP).
#[map(name = "XDP_BGP_PROG")]
pub static XDP_BGP_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// XDP's checks program (`xdp_checks.rs`, slot 0), of the same buffer
/// mode.
#[map(name = "XDP_CHECKS_PROG")]
pub static XDP_CHECKS_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Evidence records to userspace (`observer_common::EVIDENCE_MAP`): one
/// perf ring per CPU, sized by userspace; a full ring loses the record
/// and `Stat::EvidenceLost` counts it.
#[map(name = "EVIDENCE")]
pub static EVIDENCE: PerfEventArray<EvidenceHeader> = PerfEventArray::new(0);

/// Each CPU's evidence slots, one per hook kind (the same indexes as
/// [`PENDING`]): the reasons the checks flagged on the frame in hand,
/// gathered until the hook sends them with the frame's bytes.
#[map(name = "EVIDENCE_SLOTS")]
pub static EVIDENCE_SLOTS: PerCpuArray<EvidenceHeader> = PerCpuArray::with_max_entries(2, 0);

/// Each CPU's kernel-drop evidence record, assembled before it is sent.
#[map(name = "EVIDENCE_COPY")]
pub static EVIDENCE_COPY: PerCpuArray<EvidenceCopy> = PerCpuArray::with_max_entries(1, 0);

/// Each CPU's evidence budget (`config::EVIDENCE_RATE` per second).
#[map(name = "EVIDENCE_BUDGET")]
pub static EVIDENCE_BUDGET: PerCpuArray<EvidenceBudget> = PerCpuArray::with_max_entries(1, 0);

/// Self counters indexed by `observer_common::Stat`.
#[map(name = "STATS")]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);

/// Dropped or drop-flagged packets by (interface, peer, origin, reason).
#[map(name = "DROPS")]
pub static DROPS: LruPerCpuHashMap<DropKey, DropValue> =
    LruPerCpuHashMap::with_max_entries(DEFAULT_MAX_FLOWS, 0);

/// Sources allowed to send VXLAN (Calico's cali40all-vxlan-net), IPv4.
#[map(name = "VXLAN_ALLOW4")]
pub static VXLAN_ALLOW4: LpmTrie<u32, u8> =
    LpmTrie::with_max_entries(ALLOW_SET_MAX_PREFIXES, BPF_F_NO_PREALLOC);

/// Sources allowed to send VXLAN (cali60all-vxlan-net), IPv6.
#[map(name = "VXLAN_ALLOW6")]
pub static VXLAN_ALLOW6: LpmTrie<[u32; 4], u8> =
    LpmTrie::with_max_entries(ALLOW_SET_MAX_PREFIXES, BPF_F_NO_PREALLOC);

/// Sources allowed to send IPIP (cali40all-hosts-net), IPv4.
#[map(name = "IPIP_ALLOW4")]
pub static IPIP_ALLOW4: LpmTrie<u32, u8> =
    LpmTrie::with_max_entries(ALLOW_SET_MAX_PREFIXES, BPF_F_NO_PREALLOC);

/// Sources allowed to send IP-in-IP, IPv6.
#[map(name = "IPIP_ALLOW6")]
pub static IPIP_ALLOW6: LpmTrie<[u32; 4], u8> =
    LpmTrie::with_max_entries(ALLOW_SET_MAX_PREFIXES, BPF_F_NO_PREALLOC);

/// Check switches and the node facts generation, indexed by
/// `observer_common::config`. A global in a data section of its own
/// (`CONFIG_SECTION`, which userspace rewrites), not an array map: a read
/// is one load, where an array map's lookup is a dozen instructions even
/// when the verifier inlines it, and the VXLAN exit reads the generation
/// for every frame.
#[unsafe(link_section = ".data.config")]
#[unsafe(no_mangle)]
static mut CONFIG: ConfigWords = [0; config::COUNT as usize];

/// VNIs of the local vxlan devices.
#[map(name = "LOCAL_VNIS")]
pub static LOCAL_VNIS: HashMap<u32, u8> = HashMap::with_max_entries(LOCAL_VNIS_MAX, 0);

/// Underlay MTU of each watched interface.
#[map(name = "IFACE_MTU")]
pub static IFACE_MTU: HashMap<u32, u32> = HashMap::with_max_entries(WATCHED_MAX, 0);

/// Interfaces whose kernel drops are counted, each with its
/// `observer_common::stage`.
#[map(name = "WATCHED")]
pub static WATCHED: HashMap<WatchedIface, u8> = HashMap::with_max_entries(WATCHED_MAX, 0);

/// Pod blocks -> the node that owns them (`observer_common::BLOCKS_MAP`).
#[map(name = "BLOCKS")]
pub static BLOCKS: LpmTrie<[u32; 4], BlockPeer> =
    LpmTrie::with_max_entries(BLOCKS_MAX, BPF_F_NO_PREALLOC);

/// Bit `ifindex % WATCHED_BITS` set for every watched interface, one `u64`
/// per 64 bits: kfree_skb's cheap first test. A global in a data section
/// of its own (`WATCHED_BITS_SECTION`), as [`CONFIG`]: every drop of the
/// machine reads it.
#[unsafe(link_section = ".data.watched")]
#[unsafe(no_mangle)]
static mut WATCHED_BITS: [u64; WATCHED_BITS_WORDS] = [0; WATCHED_BITS_WORDS];

/// Whether `ifindex`'s bit of [`WATCHED_BITS`] is set.
#[inline(always)]
pub fn is_watched_bit(ifindex: u32) -> bool {
    let bit = watched_bit(ifindex) as usize;
    // SAFETY: `bit / 64` indexes inside the array. Volatile: userspace
    // rewrites it while the programs run.
    let word = unsafe { read_volatile((&raw const WATCHED_BITS).cast::<u64>().add(bit / 64)) };
    word & (1u64 << (bit % 64)) != 0
}

/// sk_buff field offsets from the running kernel's BTF, set at load time.
/// An immutable static lands in `.rodata`, which the loader freezes, so
/// the verifier reads these as constants (the kfree_skb hook's direct
/// loads need that).
#[unsafe(no_mangle)]
pub static SKB_LAYOUT: SkbLayout = SkbLayout {
    skb_dev: 0,
    skb_head: 0,
    skb_mac_header: 0,
    skb_tail: 0,
    skb_data: 0,
    skb_len: 0,
    dev_ifindex: 0,
    dev_nd_net: 0,
    net_inum: 0,
    skb_network_header: 0,
    valid: 0,
};

/// Per-CPU buffers that header windows are copied into, one per kind of
/// hook, so that a kfree_skb run interrupting a tc run on the same CPU
/// cannot overwrite its copy.
#[map(name = "SCRATCH")]
pub static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(2, 0);
/// [`SCRATCH`] slot of the tc hooks.
pub const SCRATCH_TC: u32 = 0;
/// [`SCRATCH`] slot of the kfree_skb hook.
pub const SCRATCH_DROPS: u32 = 1;

/// tc ingress's checks program (slot 0), reached by a tail call.
#[map(name = "CHECKS")]
pub static CHECKS: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// What tc ingress hands its checks program, per CPU.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Pending {
    /// The frame's classification.
    pub classified: Classified,
    /// skb length.
    pub wire_len: u64,
    /// Interface index.
    pub ifindex: u32,
    /// Bytes copied into the tc scratch buffer; 0: read the packet directly.
    pub copied: u32,
    /// GSO segments of the skb (0 or 1: one segment).
    pub segments: u64,
    /// `Direction` of the hook, as u8.
    pub direction: u8,
}

/// The [`Pending`] slots of each CPU, one per hook kind.
#[map(name = "PENDING")]
pub static PENDING: PerCpuArray<Pending> = PerCpuArray::with_max_entries(2, 0);
/// [`PENDING`] slot of the tc hooks.
pub const PENDING_TC: u32 = 0;
/// [`PENDING`] slot of XDP.
pub const PENDING_XDP: u32 = 1;

/// Declares [`Shape`] with the fields it shares with `Classified`, and
/// the copies between the two, naming each field once.
macro_rules! shape {
    ($($field:ident: $ty:ty),* $(,)?) => {
        /// What [`settle`] passes through map memory: the parser's scalars,
        /// by which the verifier tells the parse's paths apart (the
        /// addresses it read from the packet are unknown to it already).
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub struct Shape {
            $($field: $ty),*
        }

        impl Shape {
            #[inline(always)]
            fn of(c: &Classified) -> Shape {
                Shape { $($field: c.$field),* }
            }

            #[inline(always)]
            fn write_to(self, c: &mut Classified) {
                $(c.$field = self.$field;)*
            }
        }
    };
}

shape!(
    l4_off: usize,
    l2_len: usize,
    ip_end: usize,
    vni: u32,
    proto: Proto,
    reason: Unclassified,
    peer_family: u8,
    inner_family: u8,
    l4_proto: u8,
    vxlan_flags: u8,
    outer_fragment: bool,
    probe: bool,
);

/// Each CPU's [`Shape`] slots, one per hook kind.
#[map(name = "SHAPES")]
pub static SHAPES: PerCpuArray<Shape> = PerCpuArray::with_max_entries(2, 0);
/// [`SHAPES`] slot of the tc hooks.
pub const SHAPE_TC: u32 = 0;
/// [`SHAPES`] slot of XDP.
pub const SHAPE_XDP: u32 = 1;

/// Makes the scalars the parser computed unknown to the verifier, leaving
/// their values unchanged: they go through this CPU's [`SHAPES`] slot
/// `slot` and are read back. `None` (never at run time: the slot exists)
/// tells the hook to stop, so that no path keeps the known values.
///
/// Why: the verifier follows each path of the parse (VLAN tags, IPv4
/// options, IPv6 extension headers, each encapsulation) with the
/// constants it computed there (protocol, reason, offsets, families), and
/// verified everything after the parse once per distinct end state. On
/// 6.18 that was 265,000 verified instructions for XDP and 480,000 for tc
/// ingress (575,000 on 5.10), most of a minute per load in a TCG VM and
/// seconds on a node; settled, 64,000 and 89,000. Values read from map
/// memory are unknown to the verifier, so the code after this point is
/// verified for far fewer states. Only the scalars go through memory
/// (twelve stores and loads; the bench shows no cost against its noise):
/// settling the whole classification, addresses included, saved tc more
/// verification but cost 10-15 ns per frame. [`clobbered`] makes the compiler
/// reload the fields instead of reusing what it stored; mixing an unknown
/// value into the fields in registers did not help, as the compiler moved
/// the mixing into each path of the parse.
#[inline(always)]
pub fn settle(c: &mut Classified, slot: u32) -> Option<()> {
    let at = SHAPES.get_ptr_mut(slot)?;
    // SAFETY: this CPU's slot, used by one hook at a time (XDP and tc have
    // a slot each, and never interrupt themselves on a CPU).
    let shape = unsafe {
        *at = Shape::of(c);
        *clobbered(at)
    };
    shape.write_to(c);
    Some(())
}

/// `CONFIG[index]` (0 for an index beyond it).
#[inline(always)]
pub fn config_word(index: u32) -> u32 {
    if index >= config::COUNT {
        return 0;
    }
    // SAFETY: `index` is inside the array. Volatile: userspace rewrites it
    // while the programs run.
    unsafe { read_volatile((&raw const CONFIG).cast::<u32>().add(index as usize)) }
}

/// Whether a `CONFIG` switch is on.
#[inline(always)]
pub fn config_on(index: u32) -> bool {
    config_word(index) != 0
}
