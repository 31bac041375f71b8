//! skb:kfree_skb: counts packets the kernel drops on watched interfaces,
//! per protocol, peer, kernel drop reason and the code location that
//! freed them. On the underlay the outer headers name the peer; on tunnel
//! and pod devices (after decapsulation) the inner source's pod block
//! does, or the inner destination's for a packet on its way out
//! (`BLOCKS`). The reason numbers and locations are passed through;
//! userspace names them from the running kernel's BTF and
//! `/proc/kallsyms`. With capture on, each counted drop also sends its
//! packet's first bytes as evidence (`evidence::send_drop`). Field offsets
//! come from `SKB_LAYOUT`, filled from BTF at load time, so the same object
//! runs on kernels whose sk_buff differs.

use aya_ebpf::{
    helpers::generated::bpf_probe_read_kernel as bpf_probe_read_kernel_buf, macros::btf_tracepoint,
    maps::lpm_trie::Key, programs::BtfTracePointContext,
};
use observer_common::{
    Direction, DropKey, Proto, REASON_NOT_REPORTED, WatchedIface, drop_origin, evidence_link,
    family, stage, v4_mapped,
};

use crate::{
    drops, evidence,
    maps::{BLOCKS, MapPorts, SCRATCH, SCRATCH_DROPS, SKB_LAYOUT, WATCHED, is_watched_bit},
    parse,
};

/// `sk_buff.mac_header` value meaning "not set".
const MAC_HEADER_UNSET: u16 = 0xffff;

/// Entry on kernels whose tracepoint reports a drop reason (5.17+):
/// typed arguments (skb, location, reason, ...).
#[btf_tracepoint(function = "kfree_skb")]
pub fn observer_kfree(ctx: BtfTracePointContext) -> i32 {
    observe_drop(&ctx, ctx.arg(0), ctx.arg(1), ctx.arg(2));
    0
}

/// Entry on older kernels, whose tracepoint has two arguments (skb,
/// location): the verifier refuses a read of a third. Drops are counted
/// with reason [`REASON_NOT_REPORTED`].
#[btf_tracepoint(function = "kfree_skb")]
pub fn observer_kfree2(ctx: BtfTracePointContext) -> i32 {
    observe_drop(&ctx, ctx.arg(0), ctx.arg(1), REASON_NOT_REPORTED);
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
fn observe_drop(ctx: &BtfTracePointContext, skb: usize, location: u64, reason: u32) {
    let _ = try_observe_drop(ctx, skb, location, reason);
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
fn try_observe_drop(
    ctx: &BtfTracePointContext,
    skb: usize,
    location: u64,
    reason: u32,
) -> Option<()> {
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
    // SAFETY: map value pointer from a successful lookup.
    let stage = unsafe { *WATCHED.get_ptr(WatchedIface { netns, ifindex })? };
    if stage != stage::UNDERLAY {
        return observe_inner(ctx, skb, ifindex, stage, location, reason);
    }

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
    let mut key = DropKey::of(ifindex, &c, drop_origin::KERNEL, reason);
    key.location = location;
    drops::record_key(key, bytes);
    // The evidence is the frame as it arrived, from its Ethernet header.
    let available = tail.saturating_sub(u32::from(mac));
    evidence::send_drop(
        ctx,
        &key,
        bytes,
        (start, available),
        evidence_link::ETHERNET,
    )
}

/// Bytes of the inner IP header read after decapsulation: an IPv6 header
/// (an IPv4 header's addresses end within it).
const INNER_HEADER: usize = 40;

/// A drop on a tunnel or pod device: the skb's network header is the
/// inner IP header. Its source's pod block names the node the packet came
/// from; else its destination's the node it was going to; else no peer
/// (counted on tunnel devices only).
#[inline(always)]
fn observe_inner(
    ctx: &BtfTracePointContext,
    skb: usize,
    ifindex: u32,
    stage: u8,
    location: u64,
    reason: u32,
) -> Option<()> {
    let head: usize = field(skb, offset!(skb_head));
    let network: u16 = field(skb, offset!(skb_network_header));
    let data: usize = field(skb, offset!(skb_data));
    let len: u32 = field(skb, offset!(skb_len));
    let start = head + network as usize;
    let mut header = [0u8; INNER_HEADER];
    // SAFETY: a probe read of INNER_HEADER bytes into a stack buffer of
    // that size; a bad address makes it fail. Bytes past the packet's end
    // (a short IPv4 packet) are the skb's buffer, never looked at.
    let ret = unsafe {
        bpf_probe_read_kernel_buf(
            header.as_mut_ptr() as *mut _,
            INNER_HEADER as u32,
            start as *const _,
        )
    };
    if ret != 0 {
        return None;
    }
    let (src, dst, addr_family) = match header[0] >> 4 {
        4 => (
            v4_mapped(word(&header, 12)),
            v4_mapped(word(&header, 16)),
            family::V4,
        ),
        6 => (
            [
                word(&header, 8),
                word(&header, 12),
                word(&header, 16),
                word(&header, 20),
            ],
            [
                word(&header, 24),
                word(&header, 28),
                word(&header, 32),
                word(&header, 36),
            ],
            family::V6,
        ),
        _ => ([0; 4], [0; 4], family::NONE),
    };
    let mut key = DropKey {
        peer: [0; 4],
        ifindex,
        vni: 0,
        reason,
        origin: drop_origin::KERNEL,
        proto: Proto::Other as u8,
        peer_family: family::NONE,
        stage,
        direction: Direction::Rx as u8,
        _pad: [0; 7],
        location,
    };
    let mut attributed = false;
    if addr_family != family::NONE {
        let from = BLOCKS.get(Key::new(128, src));
        let block = match from {
            Some(block) => Some(block),
            None => {
                key.direction = Direction::Tx as u8;
                BLOCKS.get(Key::new(128, dst))
            }
        };
        match block {
            Some(block) => {
                key.peer = block.node;
                key.peer_family = block.node_family;
                key.proto = block.proto;
                attributed = true;
            }
            None => key.direction = Direction::Rx as u8,
        }
    }
    // A pod-facing device also carries the node's own traffic (pod to
    // pod, pod to host): its drops count only when they involve another
    // node. A tunnel device carries nothing else: all of its count.
    if !attributed && stage == stage::POD {
        return None;
    }
    // skb->len counts from skb->data; add back what lies between the
    // inner IP header and it (nothing once the stack pulled to it).
    let bytes = len as u64 + data.saturating_sub(start) as u64;
    drops::record_key(key, bytes);
    // The evidence is the inner IP packet (a tunnel device may have no
    // link header; userspace puts a synthetic Ethernet one before it), at
    // most what the linear part holds (none when the header lies beyond
    // it: the record still goes, so that every counted drop is sent,
    // rate-limited or lost).
    let tail: u32 = field(skb, offset!(skb_tail));
    let available = tail.saturating_sub(u32::from(network));
    evidence::send_drop(ctx, &key, bytes, (start, available), evidence_link::RAW_IP)
}

/// The address word at `at` of `header`, in packet byte order as the
/// maps hold addresses.
#[inline(always)]
fn word(header: &[u8; INNER_HEADER], at: usize) -> u32 {
    u32::from_ne_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
}
