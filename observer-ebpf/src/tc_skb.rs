//! What both tc hooks share: skb byte access and wire accounting of GSO skbs.

use aya_ebpf::{helpers::generated::bpf_skb_load_bytes, programs::TcContext};
use observer_common::Direction;

use crate::{count, drops, parse};

/// tc's pass verdict that lets the next program (tcx) or the default
/// action (clsact) decide: the observer never takes a decision itself.
pub const TC_PASS: i32 = -1; // TC_ACT_UNSPEC == TCX_NEXT

/// skb access: direct for the linear part, `bpf_skb_load_bytes` beyond it
/// (headers of a GSO skb may sit in fragments).
struct SkbFrame<'a> {
    ctx: &'a TcContext,
    start: usize,
    end: usize,
}

impl parse::Frame for SkbFrame<'_> {
    #[inline(always)]
    fn read<T: Copy>(&self, off: usize) -> Option<T> {
        let size = core::mem::size_of::<T>();
        let at = self.start + off;
        if at + size <= self.end {
            // SAFETY: bounds checked against data_end just above. The pointer may
            // be misaligned for T: BPF allows misaligned packet loads on the
            // architectures the observer supports (x86_64, arm64), and an
            // aligned read lets LLVM emit word loads instead of byte loads.
            return Some(unsafe { core::ptr::read(at as *const T) });
        }
        let mut value = core::mem::MaybeUninit::<T>::uninit();
        // SAFETY: the helper writes exactly `size` bytes into `value` or fails.
        let ret = unsafe {
            bpf_skb_load_bytes(
                self.ctx.skb.skb as *const _,
                off as u32,
                value.as_mut_ptr() as *mut _,
                size as u32,
            )
        };
        if ret == 0 {
            // SAFETY: fully written by the helper.
            Some(unsafe { value.assume_init() })
        } else {
            None
        }
    }
}

/// Classifies and counts one skb seen by a tc hook in `direction`.
#[inline(always)]
pub fn observe(ctx: &TcContext, direction: Direction) {
    let frame = SkbFrame {
        ctx,
        start: ctx.data(),
        end: ctx.data_end(),
    };
    let c = parse::classify(&frame, direction);
    let skb = ctx.skb.skb;
    // SAFETY: reads of the program's own __sk_buff context.
    let (len, segs, ifindex) =
        unsafe { ((*skb).len as u64, (*skb).gso_segs as u64, (*skb).ifindex) };
    let (packets, bytes) = if segs > 1 {
        // Each segment repeats the headers; without an inner L4 header we
        // can only count the skb's own bytes.
        let headers = parse::headers_len(&frame, &c).unwrap_or(0) as u64;
        (segs, len + (segs - 1) * headers)
    } else {
        (1, len)
    };
    count::record(ifindex, direction, &c, packets, bytes);
    if direction == Direction::Rx {
        drops::classifier_checks(ifindex, &c, len);
    }
}
