//! Adds one classified frame to the flow counters.

use aya_ebpf::bindings::BPF_NOEXIST;
use observer_common::{Direction, FlowKey, FlowValue, Stat};

use crate::{
    maps::{FLOWS, STATS},
    parse::Classified,
};

/// Adds `packets`/`bytes` to the key the classification `c` describes.
#[inline(always)]
pub fn record(ifindex: u32, direction: Direction, c: &Classified, packets: u64, bytes: u64) {
    let key = FlowKey {
        peer: c.peer,
        ifindex,
        vni: c.vni,
        direction: direction as u8,
        proto: c.proto as u8,
        peer_family: c.peer_family,
        reason: c.reason as u8,
    };
    if add(&key, c, packets, bytes) {
        return;
    }
    let value = FlowValue {
        packets,
        bytes,
        inner_src: c.inner_src,
        inner_dst: c.inner_dst,
        inner_family: c.inner_family,
        _pad: [0; 7],
    };
    if FLOWS.insert(key, value, BPF_NOEXIST as u64).is_ok() {
        bump(Stat::FlowInserts);
    } else if !add(&key, c, packets, bytes) {
        // Another CPU inserted the key between our lookup and insert, and
        // the entry was evicted again before we could find it.
        bump(Stat::FlowInsertFailures);
    }
}

#[inline(always)]
fn add(key: &FlowKey, c: &Classified, packets: u64, bytes: u64) -> bool {
    let Some(value) = FLOWS.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: per-CPU value of this CPU; nothing else writes it concurrently.
    let value = unsafe { &mut *value };
    value.packets += packets;
    value.bytes += bytes;
    if c.inner_family != 0 {
        value.inner_src = c.inner_src;
        value.inner_dst = c.inner_dst;
        value.inner_family = c.inner_family;
    }
    true
}

#[inline(always)]
fn bump(stat: Stat) {
    if let Some(counter) = STATS.get_ptr_mut(stat as u32) {
        // SAFETY: per-CPU slot of this CPU.
        unsafe { *counter += 1 };
    }
}
