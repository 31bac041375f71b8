//! XDP on ingress, last part: the evidence record of a frame the checks
//! flagged (`evidence::send_flagged`), reached by a tail call from
//! `xdp_ingress` or `xdp_checksums` when capture is on and this CPU's XDP
//! evidence slot holds reasons. Verified alone: the helper that appends
//! the frame's bytes is followed once, not for every state of the
//! classifier. Always returns XDP_PASS.

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

use crate::evidence::{self, EVIDENCE_XDP};

/// Entry point tail-called from the multi-buffer XDP programs.
#[xdp(frags)]
pub fn observer_xdp_ev(ctx: XdpContext) -> u32 {
    send(&ctx);
    xdp_action::XDP_PASS
}

/// Entry point tail-called from the single-buffer XDP programs.
#[xdp]
pub fn observer_xdp_ev_sb(ctx: XdpContext) -> u32 {
    send(&ctx);
    xdp_action::XDP_PASS
}

#[inline(always)]
fn send(ctx: &XdpContext) {
    // The helper copies from the first buffer: at most its length (more
    // fails it on kernels before multi-buffer XDP).
    let linear = (ctx.data_end() - ctx.data()) as u32;
    let _ = evidence::send_flagged(ctx, EVIDENCE_XDP, linear);
}
