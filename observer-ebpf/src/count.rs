//! Adds one classified frame to the flow counters: plain traffic to its
//! interface's slot of the per-CPU plain counters (one array lookup);
//! other keys to the per-CPU flow cache (one array lookup and a key
//! compare), else the LRU map. Common VXLAN frames that need nothing more
//! go straight to their cache slot.

use aya_ebpf::bindings::BPF_NOEXIST;
use observer_common::{
    Direction, FLOW_CACHE_SLOTS, FlowCacheSlot, FlowKey, FlowValue, KeyFacts, Stat, TcpCounts,
};

use crate::{
    drops,
    maps::{FLOW_CACHE, FLOWS, PLAIN, STATS},
    parse::{self, Classified, CommonVxlan, Frame},
};

/// Adds `packets`/`bytes` and the inner TCP signals `tcp` to `key`.
/// Returns this CPU's cache slot of the key when it has one (the key's
/// node facts are cached there).
#[inline(always)]
pub fn record(
    key: &FlowKey,
    c: &Classified,
    packets: u64,
    bytes: u64,
    tcp: &TcpCounts,
) -> Option<&'static mut FlowCacheSlot> {
    if paused() {
        return None;
    }
    if c.probe {
        let stat = if key.direction == Direction::Rx as u8 {
            Stat::ProbeRxPackets
        } else {
            Stat::ProbeTxPackets
        };
        add(stat, packets);
        return None;
    }
    if record_plain(key, packets, bytes) {
        return None;
    }
    let index = cache_index(key);
    if let Some(slot) = FLOW_CACHE.get_ptr_mut(index) {
        // SAFETY: this CPU's slot; the hooks that write FLOW_CACHE (XDP and
        // tc) never interrupt one another on a CPU, and userspace only
        // reads it.
        let slot = unsafe { &mut *slot };
        if slot.holds(key) {
            slot.value.add(c, packets, bytes, tcp);
            return Some(slot);
        }
        if slot.key.ifindex == 0 {
            claim(slot, key, c, packets, bytes, tcp);
            bump(Stat::FlowCacheClaims);
            return Some(slot);
        }
        bump(Stat::FlowCacheCollisions);
    }
    record_in_map(key, c, packets, bytes, tcp);
    None
}

/// The inner TCP signals of a settled tunnel packet `c` seen on
/// `ifindex`: its flags, and for a SYN or SYN-ACK whether its MSS fits the
/// interface's MTU (looked up only then: handshakes are few).
#[inline(always)]
pub fn tcp_signals<F: Frame>(frame: &F, ifindex: u32, c: &Classified) -> TcpCounts {
    let tcp = parse::inner_tcp(frame, c);
    if tcp.flags == 0 {
        return TcpCounts::NONE;
    }
    let mtu = if tcp.full_segment != 0 {
        drops::iface_mtu(ifindex)
    } else {
        0
    };
    TcpCounts::of(&tcp, mtu)
}

/// Counts a plain frame that needs nothing more (no drop check, not BGP)
/// in its interface's `PLAIN` slot; `false` when it needs more or has no
/// slot, and nothing was counted.
///
/// The hooks call this on the parser's own result, before
/// `maps::settle`: plain traffic (most packets on many nodes) pays
/// neither the settling nor the code after it, and these few instructions
/// are all the verifier follows once per parse path.
#[inline(always)]
pub fn record_plain_only<F: Frame>(
    frame: &F,
    key: &FlowKey,
    c: &Classified,
    packets: u64,
    bytes: u64,
) -> bool {
    !parse::needs_checks(c) && !parse::plain_bgp(frame, c) && record_plain(key, packets, bytes)
}

/// Adds to `key`'s slot of the per-CPU plain counters when it has one;
/// `false` when it has none, and nothing was counted.
#[inline(always)]
pub fn record_plain(key: &FlowKey, packets: u64, bytes: u64) -> bool {
    if paused() {
        return true;
    }
    let Some(plain) = key.plain_slot().and_then(|slot| PLAIN.get_ptr_mut(slot)) else {
        return false;
    };
    // SAFETY: this CPU's slot; the hooks that write PLAIN (XDP and tc)
    // never interrupt one another on a CPU, and userspace only reads it.
    let plain = unsafe { &mut *plain };
    if plain.packets == 0 {
        // Userspace reads only the slots in use until this moves.
        bump(Stat::PlainSlotsUsed);
    }
    plain.packets += packets;
    plain.bytes += bytes;
    true
}

/// Adds a [`CommonVxlan`] frame of `bytes` to its key's slot of this CPU's
/// flow cache when the key holds one and, with `checks` (received frames),
/// the frame passes the drop checks there (`drops::common_vxlan_passes`);
/// `false` otherwise, and nothing was counted.
#[inline(always)]
pub fn record_common_vxlan(
    ifindex: u32,
    direction: Direction,
    v: &CommonVxlan,
    bytes: u64,
    checks: bool,
) -> bool {
    if paused() {
        return true;
    }
    let Some(slot) = cached_slot(&FlowKey::common_vxlan(ifindex, direction, v)) else {
        return false;
    };
    if checks && !drops::common_vxlan_passes(v, bytes, &slot.facts) {
        return false;
    }
    slot.value.add_common_vxlan(v, bytes);
    true
}

/// This CPU's cache slot of `key`, when the key holds it.
#[inline(always)]
pub fn cached_slot(key: &FlowKey) -> Option<&'static mut FlowCacheSlot> {
    let slot = FLOW_CACHE.get_ptr_mut(cache_index(key))?;
    // SAFETY: as in `record`.
    let slot = unsafe { &mut *slot };
    slot.holds(key).then_some(slot)
}

/// Slot of `key`: its words folded with XOR, then one multiplicative
/// (Fibonacci) hash, top bits. Why not the kernel's jhash: this runs on
/// every packet and needs only to spread the few keys of one node, not
/// resist an attacker (a collision costs the LRU path, never a count);
/// the XOR tree keeps the dependency chain to one multiply. The ifindex,
/// VNI and small fields are rotated so that they do not cancel the same
/// address bytes.
#[inline(always)]
fn cache_index(key: &FlowKey) -> u32 {
    const GOLDEN: u32 = 0x9e37_79b1;
    let tail = u32::from_ne_bytes([key.direction, key.proto, key.peer_family, key.reason]);
    let h = (key.peer[0] ^ key.peer[1])
        ^ (key.peer[2] ^ key.peer[3])
        ^ (key.ifindex.rotate_left(8) ^ key.vni.rotate_left(16))
        ^ tail.rotate_left(24);
    h.wrapping_mul(GOLDEN) >> (32 - FLOW_CACHE_SLOTS.trailing_zeros())
}

/// Fills a free slot with `key`. The key's ifindex, which marks the slot
/// taken, is written last, so that a reader never pairs counts with half
/// a key.
#[inline(always)]
fn claim(
    slot: &mut FlowCacheSlot,
    key: &FlowKey,
    c: &Classified,
    packets: u64,
    bytes: u64,
    tcp: &TcpCounts,
) {
    slot.facts = KeyFacts::default();
    slot.value = FlowValue::first(c, packets, bytes, tcp);
    slot.key = FlowKey { ifindex: 0, ..*key };
    core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::Release);
    slot.key.ifindex = key.ifindex;
}

/// The LRU path: a key without a cache slot on this CPU.
#[inline(always)]
fn record_in_map(key: &FlowKey, c: &Classified, packets: u64, bytes: u64, tcp: &TcpCounts) {
    if let Some(value) = FLOWS.get_ptr_mut(key) {
        // SAFETY: per-CPU value of this CPU; nothing else writes it concurrently.
        unsafe { &mut *value }.add(c, packets, bytes, tcp);
        return;
    }
    if FLOWS
        .insert(
            key,
            FlowValue::first(c, packets, bytes, tcp),
            BPF_NOEXIST as u64,
        )
        .is_ok()
    {
        bump(Stat::FlowInserts);
        return;
    }
    match FLOWS.get_ptr_mut(key) {
        // SAFETY: as above.
        Some(value) => unsafe { &mut *value }.add(c, packets, bytes, tcp),
        // Another CPU inserted the key between our lookup and insert, and
        // the entry was evicted again before we could find it.
        None => bump(Stat::FlowInsertFailures),
    }
}

/// Whether the hooks are attached but not counting yet
/// (`config::PAUSED`): a counting function then counts nothing and says
/// the packet was handled. Checked where packets are counted, not at the
/// hooks' entry: a branch there took XDP on 6.1 from 321k to 419k
/// verified instructions.
#[inline(always)]
fn paused() -> bool {
    crate::maps::config_on(observer_common::config::PAUSED)
}

/// Adds one to this CPU's `stat`.
#[inline(always)]
pub fn bump(stat: Stat) {
    add(stat, 1);
}

/// Adds `n` to this CPU's `stat`.
#[inline(always)]
fn add(stat: Stat, n: u64) {
    if let Some(counter) = STATS.get_ptr_mut(stat as u32) {
        // SAFETY: per-CPU slot of this CPU.
        unsafe { *counter += n };
    }
}
