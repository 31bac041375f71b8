//! skb:kfree_skb: counts packets the kernel drops on watched interfaces,
//! per protocol, peer and kernel drop reason. The reason numbers are
//! passed through; userspace names them from the running kernel's BTF.
//! Field offsets come from `SKB_LAYOUT`, filled from BTF at load time, so
//! the same object runs on kernels whose sk_buff differs.

use aya_ebpf::{
    helpers::generated::bpf_probe_read_kernel as bpf_probe_read_kernel_buf, macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use observer_common::{Direction, REASON_NOT_REPORTED, WatchedIface, drop_origin};

use crate::{
    drops,
    maps::{MapPorts, SCRATCH, SCRATCH_DROPS, SKB_LAYOUT, WATCHED, is_watched_bit},
    parse,
};

/// `sk_buff.mac_header` value meaning "not set".
const MAC_HEADER_UNSET: u16 = 0xffff;

/// Entry on kernels whose tracepoint reports a drop reason (5.17+):
/// typed arguments (skb, location, reason, ...).
#[btf_tracepoint(function = "kfree_skb")]
pub fn observer_kfree(ctx: BtfTracePointContext) -> i32 {
    observe_drop(ctx.arg(0), ctx.arg(2));
    0
}

/// Entry on older kernels, whose tracepoint has two arguments (skb,
/// location): the verifier refuses a read of a third. Drops are counted
/// with reason [`REASON_NOT_REPORTED`].
#[btf_tracepoint(function = "kfree_skb")]
pub fn observer_kfree2(ctx: BtfTracePointContext) -> i32 {
    observe_drop(ctx.arg(0), REASON_NOT_REPORTED);
    0
}

/// The `T` at `offset` of the kernel struct at `base`.
///
/// Why a plain load and not `bpf_probe_read_kernel`: a tp_btf program's
/// arguments are typed kernel pointers, and `offset` comes from
/// [`SKB_LAYOUT`] in `.rodata`, which the loader freezes, so the verifier
/// knows it as a constant. It then checks the load against the kernel's
/// BTF and emits a fault-safe load (a bad address reads as 0): a few
/// instructions instead of a helper call, on every drop of the machine.
#[inline(always)]
fn field<T: Copy>(base: usize, offset: u32) -> T {
    // SAFETY: see above; the verifier proves the access, the JIT makes a
    // fault read 0.
    unsafe { core::ptr::read_volatile((base + offset as usize) as *const T) }
}

#[inline(always)]
fn observe_drop(skb: usize, reason: u32) {
    let _ = try_observe_drop(skb, reason);
}

/// The offset `field` of [`SKB_LAYOUT`] selects, read where it is needed:
/// each is a load, and most drops need only two of them.
macro_rules! offset {
    ($field:ident) => {
        // SAFETY: a global written only by the loader before load.
        unsafe { core::ptr::read_volatile(&raw const SKB_LAYOUT.$field) }
    };
}

#[inline(always)]
fn try_observe_drop(skb: usize, reason: u32) -> Option<()> {
    if offset!(valid) == 0 || skb == 0 {
        return None;
    }
    let dev: usize = field(skb, offset!(skb_dev));
    if dev == 0 {
        return None;
    }
    let ifindex: u32 = field(dev, offset!(dev_ifindex));
    // Most drops happen on devices nobody watches: the bitmap answers for
    // them after two reads, before the namespace walk and the hash lookup.
    if !is_watched_bit(ifindex) {
        return None;
    }
    let net: usize = field(dev, offset!(dev_nd_net));
    let netns: u32 = field(net, offset!(net_inum));
    WATCHED.get_ptr(WatchedIface { netns, ifindex })?;

    let head: usize = field(skb, offset!(skb_head));
    let mac: u16 = field(skb, offset!(skb_mac_header));
    let tail: u32 = field(skb, offset!(skb_tail));
    if mac == MAC_HEADER_UNSET || tail <= mac as u32 {
        return None;
    }
    let data: usize = field(skb, offset!(skb_data));
    let len: u32 = field(skb, offset!(skb_len));
    let start = head + mac as usize;
    // One copy of the header window out of kernel memory, then plain loads.
    let copy = parse::copy_len((tail - mac as u32) as usize)?;
    let buf = SCRATCH.get_ptr_mut(SCRATCH_DROPS)?;
    // SAFETY: a probe read of `copy` (at most HEADER_WINDOW) bytes into the
    // scratch buffer, which holds more; a bad address makes it fail.
    let ret = unsafe { bpf_probe_read_kernel_buf(buf as *mut _, copy as u32, start as *const _) };
    if ret != 0 {
        return None;
    }
    let frame = parse::CopiedFrame { buf, len: copy };
    let c = parse::classify(&frame, Direction::Rx, &MapPorts);
    // skb->len counts from skb->data, which has moved past the headers
    // already parsed by the stack; add them back for wire bytes.
    let bytes = len as u64 + data.saturating_sub(start) as u64;
    drops::record(ifindex, &c, drop_origin::KERNEL, reason, bytes);
    Some(())
}
