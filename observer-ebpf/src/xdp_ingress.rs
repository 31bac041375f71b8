//! XDP on ingress: counts frames as they arrive, before GRO, so packet
//! counts are the wire's. Always returns XDP_PASS.

use aya_ebpf::{
    bindings::xdp_action, helpers::generated::bpf_xdp_get_buff_len, macros::xdp,
    programs::XdpContext,
};
use observer_common::Direction;

use crate::{count, drops, parse};

/// Direct packet access to the linear part of the frame.
struct XdpFrame {
    start: usize,
    end: usize,
}

impl parse::Frame for XdpFrame {
    #[inline(always)]
    fn read<T: Copy>(&self, off: usize) -> Option<T> {
        let at = self.start + off;
        if at + core::mem::size_of::<T>() > self.end {
            return None;
        }
        // SAFETY: bounds checked against data_end just above. The pointer may
        // be misaligned for T: BPF allows misaligned packet loads on the
        // architectures the observer supports (x86_64, arm64), and an
        // aligned read lets LLVM emit word loads instead of byte loads.
        Some(unsafe { core::ptr::read(at as *const T) })
    }
}

/// Entry point; `frags` so that it also attaches to multi-buffer (jumbo
/// MTU) devices, where only the first buffer is parsed.
#[xdp(frags)]
pub fn observer_xdp(ctx: XdpContext) -> u32 {
    try_observer_xdp(&ctx);
    xdp_action::XDP_PASS
}

#[inline(always)]
fn try_observer_xdp(ctx: &XdpContext) {
    let frame = XdpFrame {
        start: ctx.data(),
        end: ctx.data_end(),
    };
    let c = parse::classify(&frame, Direction::Rx);
    // The linear buffer is the whole frame unless it is shorter than the IP
    // header says: only then ask for the length including fragments (a
    // helper call costs more than the rest of the program).
    let linear = frame.end - frame.start;
    let bytes = if c.ip_end > linear {
        // SAFETY: ctx.ctx is the program's own xdp_md.
        unsafe { bpf_xdp_get_buff_len(ctx.ctx) }
    } else {
        linear as u64
    };
    let ifindex = ctx.ingress_ifindex() as u32;
    count::record(ifindex, Direction::Rx, &c, 1, bytes);
    drops::classifier_checks(ifindex, &c, bytes);
    // Only here, not in tc ingress: there the extra reads push the
    // verifier past its 1M-instruction limit (two access paths per read).
    drops::path_mtu_checks(&frame, ifindex, &c, bytes);
}
