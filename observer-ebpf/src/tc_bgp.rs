//! tc, both directions, second part: BGP at the wire. A TCP/179 frame
//! `tc_skb::observe` counted arrives here by a tail call, with the hook's
//! facts in the per-CPU `PENDING` slot; the segment is added to its
//! peer's BGP counters. Always returns the pass verdict.

use aya_ebpf::{helpers::generated::bpf_skb_load_bytes, macros::classifier, programs::TcContext};
use observer_common::Direction;

use crate::{
    bgp,
    maps::{PENDING, SCRATCH, SCRATCH_TC},
    parse::{self, CopiedFrame, PacketFrame},
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
    let pending = unsafe { *PENDING.get_ptr(0)? };
    let direction = if pending.direction == Direction::Tx as u8 {
        Direction::Tx
    } else {
        Direction::Rx
    };
    let segments = pending.segments.max(1);
    let direct = PacketFrame {
        start: ctx.data(),
        end: ctx.data_end(),
    };
    let seg = parse::bgp_segment(&direct, direction)?;
    // The headers are in the linear part (the stack builds them there);
    // the BGP message may start in fragments: then the segment's first
    // bytes are copied to read it.
    let linear = direct.end - direct.start;
    let wire_len = pending.wire_len as usize;
    if linear >= wire_len || linear >= bgp::MESSAGE_WINDOW {
        bgp::add(&seg, pending.ifindex, direction, segments);
        return Some(());
    }
    let copy = parse::copy_len(wire_len.min(bgp::MESSAGE_WINDOW))?;
    let buf = SCRATCH.get_ptr_mut(SCRATCH_TC)?;
    let skb = ctx.skb.skb;
    // SAFETY: the helper writes `copy` (at most HEADER_WINDOW) bytes into
    // the scratch buffer, which holds more.
    let ret = unsafe { bpf_skb_load_bytes(skb as *const _, 0, buf as *mut _, copy as u32) };
    let copied = CopiedFrame { buf, len: copy };
    let seg = match parse::bgp_segment(&copied, direction) {
        Some(whole) if ret == 0 => whole,
        _ => seg,
    };
    bgp::add(&seg, pending.ifindex, direction, segments);
    Some(())
}
