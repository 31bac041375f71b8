//! tc ingress, second part: the drop checks (classifier reasons,
//! `path_mtu` and checksums) of a frame `tc_skb::observe` classified and counted, reached
//! by a tail call with the classification in the per-CPU `PENDING` slot;
//! then the evidence of what they flagged (`evidence::send_flagged`).
//! Always returns the pass verdict.

use aya_ebpf::{macros::classifier, programs::TcContext};

use observer_common::{Direction, FlowKey};

use crate::{
    count, drops,
    evidence::{self, EVIDENCE_TC},
    maps::{PENDING, PENDING_TC, SCRATCH, SCRATCH_TC},
    parse::{CopiedFrame, HEADER_WINDOW, PacketFrame},
    tc_skb::TC_PASS,
};

/// Entry point (tail call target only; never attached).
#[classifier]
pub fn observer_tc_chk(ctx: TcContext) -> i32 {
    try_checks(&ctx);
    TC_PASS
}

#[inline(always)]
fn try_checks(ctx: &TcContext) -> Option<()> {
    // SAFETY: this CPU's slot, written by the caller just before.
    let pending = unsafe { *PENDING.get_ptr(PENDING_TC)? };
    let c = &pending.classified;
    // The flow's cache slot holds its node facts.
    let slot = count::cached_slot(&FlowKey::of(pending.ifindex, Direction::Rx, c));
    drops::classifier_checks(
        EVIDENCE_TC,
        pending.ifindex,
        c,
        pending.wire_len,
        slot.map(|s| &mut s.facts),
    );
    if pending.copied == 0 {
        let frame = PacketFrame {
            start: ctx.data(),
            end: ctx.data_end(),
        };
        drops::path_mtu_checks(&frame, EVIDENCE_TC, pending.ifindex, c, pending.wire_len);
        drops::checksum_checks(&frame, EVIDENCE_TC, pending.ifindex, c, pending.wire_len);
    } else {
        // The caller's copy of the header window is still in the scratch
        // buffer of this CPU.
        let frame = CopiedFrame {
            buf: SCRATCH.get_ptr(SCRATCH_TC)?,
            len: (pending.copied as usize).min(HEADER_WINDOW),
        };
        drops::path_mtu_checks(&frame, EVIDENCE_TC, pending.ifindex, c, pending.wire_len);
        drops::checksum_checks(&frame, EVIDENCE_TC, pending.ifindex, c, pending.wire_len);
    }
    // The helper appends the skb's bytes: at most its length.
    // SAFETY: a read of the program's own __sk_buff context.
    let len = unsafe { (*ctx.skb.skb).len };
    evidence::send_flagged(ctx, EVIDENCE_TC, len)
}
