//! XDP on ingress, third part: the checksums of a received tunnel
//! packet's handshake or reset segment (`drops::checksum_checks`), reached
//! from `xdp_ingress` by a tail call with the classification in this
//! CPU's `PENDING` slot of XDP. Verified alone: inline, the sums over the
//! possible header lengths multiplied the states of everything after them.
//! Hands what the checks flagged to the evidence program, as XDP does.
//! Always returns XDP_PASS.

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

use crate::{
    drops,
    evidence::EVIDENCE_XDP,
    maps::{PENDING, PENDING_XDP},
    parse, xdp_ingress,
};

/// Entry point tail-called from the multi-buffer XDP program.
#[xdp(frags)]
pub fn observer_xdp_sum(ctx: XdpContext) -> u32 {
    check(&ctx);
    xdp_action::XDP_PASS
}

/// Entry point tail-called from the single-buffer XDP program.
#[xdp]
pub fn observer_xdp_sum_sb(ctx: XdpContext) -> u32 {
    check(&ctx);
    xdp_action::XDP_PASS
}

#[inline(always)]
fn check(ctx: &XdpContext) -> Option<()> {
    // SAFETY: this CPU's slot, written by the caller just before.
    let pending = unsafe { *PENDING.get_ptr(PENDING_XDP)? };
    let frame = parse::PacketFrame {
        start: ctx.data(),
        end: ctx.data_end(),
    };
    drops::checksum_checks(
        &frame,
        EVIDENCE_XDP,
        pending.ifindex,
        &pending.classified,
        pending.wire_len,
    );
    xdp_ingress::send_evidence(ctx);
    Some(())
}
