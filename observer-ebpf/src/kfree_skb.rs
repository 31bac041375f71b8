//! skb:kfree_skb: counts packets the kernel drops on watched interfaces,
//! per protocol, peer and kernel drop reason. The reason numbers are
//! passed through; userspace names them from the running kernel's BTF.
//! Field offsets come from `SKB_LAYOUT`, filled from BTF at load time, so
//! the same object runs on kernels whose sk_buff differs.

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use observer_common::{Direction, SkbLayout, WatchedIface, drop_origin};

use crate::{
    drops,
    maps::{SKB_LAYOUT, WATCHED},
    parse,
};

/// `sk_buff.mac_header` value meaning "not set".
const MAC_HEADER_UNSET: u16 = 0xffff;

/// Preferred entry (tp_btf): typed arguments (skb, location, reason, ...).
#[btf_tracepoint(function = "kfree_skb")]
pub fn observer_kfree(ctx: BtfTracePointContext) -> i32 {
    observe_drop(ctx.arg(0), ctx.arg(2));
    0
}

/// Fallback entry on kernels without tp_btf: same argument order.
#[raw_tracepoint(tracepoint = "kfree_skb")]
pub fn observer_kfree_raw(ctx: RawTracePointContext) -> i32 {
    observe_drop(ctx.arg(0), ctx.arg(2));
    0
}

/// Kernel memory of a dropped skb, from its MAC header to its tail.
struct KernelFrame {
    start: usize,
    len: usize,
}

impl parse::Frame for KernelFrame {
    #[inline(always)]
    fn read<T: Copy>(&self, off: usize) -> Option<T> {
        if off + core::mem::size_of::<T>() > self.len {
            return None;
        }
        // SAFETY: a probe read; a bad address makes the helper fail.
        unsafe { bpf_probe_read_kernel((self.start + off) as *const T).ok() }
    }
}

#[inline(always)]
fn field<T: Copy>(base: usize, offset: u32) -> Option<T> {
    // SAFETY: a probe read; a bad address makes the helper fail.
    unsafe { bpf_probe_read_kernel((base + offset as usize) as *const T).ok() }
}

#[inline(always)]
fn observe_drop(skb: usize, reason: u32) {
    let _ = try_observe_drop(skb, reason);
}

#[inline(always)]
fn try_observe_drop(skb: usize, reason: u32) -> Option<()> {
    // SAFETY: a global written only by the loader before load.
    let layout: SkbLayout = unsafe { core::ptr::read_volatile(&SKB_LAYOUT) };
    if layout.valid == 0 || skb == 0 {
        return None;
    }
    let dev: usize = field(skb, layout.skb_dev)?;
    if dev == 0 {
        return None;
    }
    let ifindex: u32 = field(dev, layout.dev_ifindex)?;
    let net: usize = field(dev, layout.dev_nd_net)?;
    let netns: u32 = field(net, layout.net_inum)?;
    WATCHED.get_ptr(WatchedIface { netns, ifindex })?;

    let head: usize = field(skb, layout.skb_head)?;
    let mac: u16 = field(skb, layout.skb_mac_header)?;
    let tail: u32 = field(skb, layout.skb_tail)?;
    if mac == MAC_HEADER_UNSET || tail <= mac as u32 {
        return None;
    }
    let data: usize = field(skb, layout.skb_data)?;
    let len: u32 = field(skb, layout.skb_len)?;
    let start = head + mac as usize;
    let frame = KernelFrame {
        start,
        len: (tail - mac as u32) as usize,
    };
    let c = parse::classify(&frame, Direction::Rx);
    // skb->len counts from skb->data, which has moved past the headers
    // already parsed by the stack; add them back for wire bytes.
    let bytes = len as u64 + data.saturating_sub(start) as u64;
    drops::record(ifindex, &c, drop_origin::KERNEL, reason, bytes);
    Some(())
}
