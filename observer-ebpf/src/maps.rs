//! The maps the programs write (layouts in `observer-common`).

use aya_ebpf::{
    macros::map,
    maps::{Array, LruPerCpuHashMap, PerCpuArray},
};
use observer_common::{DEFAULT_MAX_FLOWS, FlowKey, FlowValue, STAT_COUNT};

/// Per (interface, direction, protocol, peer, VNI) packet and byte counters.
/// Per-CPU so that the hot path needs no atomics; LRU so that it stays
/// bounded whatever sources an attacker forges.
#[map(name = "FLOWS")]
pub static FLOWS: LruPerCpuHashMap<FlowKey, FlowValue> =
    LruPerCpuHashMap::with_max_entries(DEFAULT_MAX_FLOWS, 0);

/// UDP port -> protocol byte (see `observer_common::PORT_MATCH_SOURCE`).
/// An array indexed by port makes the lookup a bounds check and a load.
#[map(name = "UDP_PORTS")]
pub static UDP_PORTS: Array<u8> = Array::with_max_entries(65536, 0);

/// Self counters indexed by `observer_common::Stat`.
#[map(name = "STATS")]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);
