//! tc, both directions, second part: BGP at the wire. A TCP/179 frame
//! `tc_skb::observe` counted arrives here by a tail call, with the hook's
//! facts in the per-CPU `PENDING` slot; the segment is added to its
//! peer's BGP counters. Always returns the pass verdict.

use aya_ebpf::{macros::classifier, programs::TcContext};
use observer_common::Direction;

use crate::{
    bgp,
    maps::{PENDING, PENDING_TC, SCRATCH, SCRATCH_TC},
    parse::{CopiedFrame, HEADER_WINDOW, PacketFrame},
    tc_skb::TC_PASS,
};

/// Entry point (tail call target only; never attached).
#[classifier]
pub fn observer_tc_bgp(ctx: TcContext) -> i32 {
    try_bgp(&ctx);
    TC_PASS
}

#[inline(always)]
fn try_bgp(ctx: &TcContext) -> Option<()> {
    // SAFETY: this CPU's slot, written by the caller just before.
    let pending = unsafe { *PENDING.get_ptr(PENDING_TC)? };
    let direction = if pending.direction == Direction::Tx as u8 {
        Direction::Tx
    } else {
        Direction::Rx
    };
    let segments = pending.segments.max(1);
    // Where the caller read the frame: directly when the linear part held
    // its header window (all of it, or 512 bytes: the first BGP message
    // header is within), else its copy of that window, still in this
    // CPU's scratch buffer.
    if pending.copied == 0 {
        let frame = PacketFrame {
            start: ctx.data(),
            end: ctx.data_end(),
        };
        bgp::record(&frame, pending.ifindex, direction, segments);
    } else {
        let frame = CopiedFrame {
            buf: SCRATCH.get_ptr(SCRATCH_TC)?,
            len: (pending.copied as usize).min(HEADER_WINDOW),
        };
        bgp::record(&frame, pending.ifindex, direction, segments);
    }
    Some(())
}
