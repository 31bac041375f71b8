//! BGP at the wire: each TCP/179 segment counted per (interface,
//! direction, peer) with its SYN/FIN/RST flags and the type of the BGP
//! message it starts with (NOTIFICATION with its code and subcode, OPEN
//! with its hold time). Called by the BGP programs (`xdp_bgp`, `tc_bgp`),
//! which the hooks tail-call for TCP/179, so that the parse is verified
//! once, not once per state the classifier ends in.

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_ns};
use observer_common::{
    BgpCounters, BgpKey, Direction, Stat, bgp_message,
    parse::{BgpSegment, Frame, TCP_FIN, TCP_RST, TCP_SYN, bgp_segment},
};

use crate::{count::bump, maps::BGP};

/// Counts `segments` (a GSO skb's) of the frame when it is TCP/179.
#[inline(always)]
pub fn record<F: Frame>(f: &F, ifindex: u32, direction: Direction, segments: u64) {
    if let Some(seg) = bgp_segment(f, direction) {
        add(&seg, ifindex, direction, segments);
    }
}

/// Adds `segments` of the TCP/179 segment `seg` to its peer's counters.
#[inline(always)]
fn add(seg: &BgpSegment, ifindex: u32, direction: Direction, segments: u64) {
    let key = BgpKey {
        peer: seg.peer,
        ifindex,
        direction: direction as u8,
        peer_family: seg.peer_family,
        _pad: [0; 2],
    };
    let counters = match BGP.get_ptr_mut(key) {
        Some(counters) => counters,
        None => {
            let fresh = BgpCounters {
                // SAFETY: a helper without arguments.
                created_ns: unsafe { bpf_ktime_get_ns() },
                ..BgpCounters::default()
            };
            if BGP.insert(key, fresh, BPF_NOEXIST as u64).is_ok() {
                bump(Stat::BgpInserts);
            }
            let Some(counters) = BGP.get_ptr_mut(key) else {
                return;
            };
            counters
        }
    };
    // SAFETY: the map's value for `key`, alive while this program runs
    // (RCU); other CPUs may add to it at the same time, hence the atomic
    // adds. The latest-NOTIFICATION and latest-OPEN fields are plain
    // stores: with two at once on two CPUs, either is the latest.
    let c = unsafe { &mut *counters };
    add_u64(&mut c.segments, segments);
    if seg.flags & TCP_SYN != 0 {
        add_u64(&mut c.syn, 1);
    }
    if seg.flags & TCP_FIN != 0 {
        add_u64(&mut c.fin, 1);
    }
    if seg.flags & TCP_RST != 0 {
        add_u64(&mut c.rst, 1);
    }
    let slot = seg.message as usize;
    let slot = if slot < bgp_message::SLOTS { slot } else { 0 };
    add_u64(&mut c.messages[slot], 1);
    if seg.message == bgp_message::NOTIFICATION {
        c.last_notification = u64::from(seg.notification);
        // SAFETY: a helper without arguments.
        c.last_notification_ns = unsafe { bpf_ktime_get_ns() };
    } else if seg.message == bgp_message::OPEN {
        c.hold_time = u64::from(seg.hold_time);
        // SAFETY: as above.
        c.hold_time_ns = unsafe { bpf_ktime_get_ns() };
    }
}

/// An atomic add whose result is not used: one `lock add` instruction
/// (BPF_ATOMIC with BPF_ADD, the old BPF_XADD), which every kernel the
/// observer supports accepts.
/// (The BPF target has no `AtomicU64::fetch_add`: it lacks compare and
/// swap, so core leaves the atomic types out; the intrinsic is the add.)
#[inline(always)]
fn add_u64(counter: &mut u64, n: u64) {
    #[cfg(target_arch = "bpf")]
    // SAFETY: an aligned u64 inside a map value.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            counter, n,
        );
    }
    #[cfg(not(target_arch = "bpf"))]
    // SAFETY: as above (a native build, for checks and tests only).
    unsafe { core::sync::atomic::AtomicU64::from_ptr(counter) }
        .fetch_add(n, core::sync::atomic::Ordering::Relaxed);
}
