//! BGP at the wire: each TCP/179 segment counted per (interface,
//! direction, peer) with its SYN/FIN/RST flags and the type of the BGP
//! message it starts with (NOTIFICATION with its code and subcode). XDP
//! calls it first thing, before the classifier; tc from its own program
//! (`tc_bgp`). Both so that the parse is verified once, not once per state
//! the classifier ends in (see `observer_common::parse::bgp_segment`).

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_ns};
use observer_common::{
    BgpCounters, BgpKey, Direction, Stat, bgp_message,
    parse::{BgpSegment, Frame, TCP_FIN, TCP_RST, TCP_SYN, bgp_segment},
};

use crate::{count::bump, maps::BGP};

/// Bytes of a segment enough to read its first BGP message header (and a
/// NOTIFICATION's code): Ethernet, IPv6, TCP with options, 21 bytes.
pub const MESSAGE_WINDOW: usize = 160;

/// Counts `segments` (a GSO skb's) of the frame when it is TCP/179.
#[inline(always)]
pub fn record<F: Frame>(f: &F, ifindex: u32, direction: Direction, segments: u64) {
    if let Some(seg) = bgp_segment(f, direction) {
        add(&seg, ifindex, direction, segments);
    }
}

/// Adds `segments` of the TCP/179 segment `seg` to its peer's counters.
#[inline(always)]
pub fn add(seg: &BgpSegment, ifindex: u32, direction: Direction, segments: u64) {
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
            if BGP
                .insert(key, BgpCounters::default(), BPF_NOEXIST as u64)
                .is_ok()
            {
                bump(Stat::BgpInserts);
            }
            let Some(counters) = BGP.get_ptr_mut(key) else {
                return;
            };
            counters
        }
    };
    // SAFETY: this CPU's value; nothing else writes it concurrently.
    let counters = unsafe { &mut *counters };
    counters.segments += segments;
    counters.syn += u64::from(seg.flags & TCP_SYN != 0);
    counters.fin += u64::from(seg.flags & TCP_FIN != 0);
    counters.rst += u64::from(seg.flags & TCP_RST != 0);
    let slot = seg.message as usize;
    let slot = if slot < bgp_message::SLOTS { slot } else { 0 };
    counters.messages[slot] += 1;
    if seg.message == bgp_message::NOTIFICATION {
        counters.last_notification = u64::from(seg.notification);
        // SAFETY: a helper without arguments.
        counters.last_notification_ns = unsafe { bpf_ktime_get_ns() };
    } else if seg.message == bgp_message::OPEN {
        counters.hold_time = u64::from(seg.hold_time);
        // SAFETY: as above.
        counters.hold_time_ns = unsafe { bpf_ktime_get_ns() };
    }
}
