//! XDP on ingress, second part: the drop checks of a tunnel packet (or
//! ICMP that may quote one) `xdp_ingress` classified and counted
//! (classifier reasons, `path_mtu`, the checksums of handshake and reset
//! segments), then the evidence of what they flagged
//! (`evidence::send_flagged`); reached by a tail call with the
//! classification in this CPU's `PENDING` slot of XDP, as tc's checks
//! program is. Why a program of its own: verified with the classifier, the
//! checks and their checksum sums multiplied its states (inline, the sums
//! took XDP from 95k to 745k verified instructions on 6.18; with the
//! evidence, the checks took it from 266k to 414k on 6.1); alone, from
//! values read out of a map, they are cheap. Always returns XDP_PASS.

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use observer_common::{Direction, FlowKey};

use crate::{
    count, drops,
    evidence::{self, EVIDENCE_XDP},
    maps::{PENDING, PENDING_XDP},
    parse,
};

/// Entry point tail-called from the multi-buffer XDP program.
#[xdp(frags)]
pub fn observer_xdp_chk(ctx: XdpContext) -> u32 {
    check(&ctx);
    xdp_action::XDP_PASS
}

/// Entry point tail-called from the single-buffer XDP program.
#[xdp]
pub fn observer_xdp_chk_sb(ctx: XdpContext) -> u32 {
    check(&ctx);
    xdp_action::XDP_PASS
}

#[inline(always)]
fn check(ctx: &XdpContext) -> Option<()> {
    // SAFETY: this CPU's slot, written by the caller just before.
    let pending = unsafe { *PENDING.get_ptr(PENDING_XDP)? };
    let c = &pending.classified;
    // The flow's cache slot holds its node facts.
    let slot = count::cached_slot(&FlowKey::of(pending.ifindex, Direction::Rx, c));
    drops::classifier_checks(
        EVIDENCE_XDP,
        pending.ifindex,
        c,
        pending.wire_len,
        slot.map(|s| &mut s.facts),
    );
    let frame = parse::PacketFrame {
        start: ctx.data(),
        end: ctx.data_end(),
    };
    drops::path_mtu_checks(&frame, EVIDENCE_XDP, pending.ifindex, c, pending.wire_len);
    drops::checksum_checks(&frame, EVIDENCE_XDP, pending.ifindex, c, pending.wire_len);
    // The helper copies from the first buffer: at most its length (more
    // fails it on kernels before multi-buffer XDP).
    let linear = (ctx.data_end() - ctx.data()) as u32;
    evidence::send_flagged(ctx, EVIDENCE_XDP, linear)
}
