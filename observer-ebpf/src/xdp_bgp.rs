//! XDP on ingress, second part: BGP at the wire. A TCP/179 frame
//! `xdp_ingress` counted arrives here by a tail call; the segment is
//! added to its peer's BGP counters. Only the first buffer is read: the
//! headers and the first message header of a segment are there. Always
//! returns XDP_PASS.

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use observer_common::Direction;

use crate::{bgp, parse};

/// Entry point tail-called from the multi-buffer XDP program.
#[xdp(frags)]
pub fn observer_xdp_bgp(ctx: XdpContext) -> u32 {
    count(&ctx);
    xdp_action::XDP_PASS
}

/// Entry point tail-called from the single-buffer XDP program.
#[xdp]
pub fn observer_xdp_bgp_sb(ctx: XdpContext) -> u32 {
    count(&ctx);
    xdp_action::XDP_PASS
}

#[inline(always)]
fn count(ctx: &XdpContext) {
    let frame = parse::PacketFrame {
        start: ctx.data(),
        end: ctx.data_end(),
    };
    bgp::record(&frame, ctx.ingress_ifindex() as u32, Direction::Rx, 1);
}
