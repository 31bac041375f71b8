//! What both tc hooks share: header access (direct when the linear part of
//! the skb holds the header window, else one copy into a scratch buffer)
//! and wire accounting of GSO skbs.

use core::ptr::read_volatile;

use aya_ebpf::{helpers::generated::bpf_skb_load_bytes, programs::TcContext};
use observer_common::{Direction, FlowKey};

use crate::{
    count, drops,
    maps::{
        self, BGP_PROG, CHECKS, MapPorts, PENDING, PENDING_TC, Pending, SCRATCH, SCRATCH_TC,
        SHAPE_TC,
    },
    parse::{self, CopiedFrame, Frame, HEADER_WINDOW, PacketFrame},
};

/// tc's pass verdict that lets the next program (tcx) or the default
/// action (clsact) decide: the observer never takes a decision itself.
pub const TC_PASS: i32 = -1; // TC_ACT_UNSPEC == TCX_NEXT

/// Classifies and counts one skb seen by a tc hook in `direction`; on
/// ingress, a frame the drop checks concern continues in the checks
/// program (`tc_checks`) by a tail call, which does not return.
///
/// Why two whole paths instead of one frame that falls back per read: a
/// read with two access paths doubles the verifier's states at every
/// header field; here each path is verified once.
#[inline(always)]
pub fn observe(ctx: &TcContext, direction: Direction) {
    if count_common(ctx, direction) {
        return;
    }
    // Read again, not reused: what `count_common` learnt on its way here
    // (packet bounds, that the skb is not GSO, whether the interface has a
    // plain slot) would split the verifier's states for everything below.
    let Skb {
        len,
        segs,
        ifindex,
        direct,
    } = Skb::read(ctx);
    let skb = ctx.skb.skb;
    let window = if len > HEADER_WINDOW {
        HEADER_WINDOW
    } else {
        len
    };
    if direct.end - direct.start >= window {
        let Some(c) = count_frame(&direct, direction, ifindex, len as u64, segs) else {
            return;
        };
        let bgp = parse::plain_bgp(&direct, &c);
        hand_over(ctx, direction, &c, bgp, ifindex, (len as u64, segs), 0);
        return;
    }
    let Some(copy) = parse::copy_len(window) else {
        return;
    };
    let Some(buf) = SCRATCH.get_ptr_mut(SCRATCH_TC) else {
        return;
    };
    // SAFETY: the helper writes `copy` (at most HEADER_WINDOW) bytes into
    // the scratch buffer, which holds more.
    let ret = unsafe { bpf_skb_load_bytes(skb as *const _, 0, buf as *mut _, copy as u32) };
    if ret != 0 {
        return;
    }
    let copied = CopiedFrame { buf, len: copy };
    let Some(c) = count_frame(&copied, direction, ifindex, len as u64, segs) else {
        return;
    };
    let bgp = parse::plain_bgp(&copied, &c);
    hand_over(
        ctx,
        direction,
        &c,
        bgp,
        ifindex,
        (len as u64, segs),
        copy as u32,
    );
}

/// Counts plain TCP and UDP (most packets on many nodes), and VXLAN of the
/// common shape on a flow whose checks are known, before the full parse;
/// `false` when the skb is anything else, its headers lie beyond the
/// linear part, or it is a GSO skb (see `count_frame`).
#[inline(always)]
fn count_common(ctx: &TcContext, direction: Direction) -> bool {
    let skb = Skb::read(ctx);
    if skb.segs > 1 {
        return false;
    }
    let early = parse::early(&skb.direct, direction, &MapPorts);
    match early.exit {
        parse::Exit::Plain => {
            count::record_plain(&FlowKey::plain(skb.ifindex, direction), 1, skb.len as u64)
        }
        // Only received frames have drop checks (see `hand_over`).
        parse::Exit::Vxlan => count::record_common_vxlan(
            skb.ifindex,
            direction,
            &early.vxlan,
            skb.len as u64,
            direction == Direction::Rx,
        ),
        parse::Exit::Full => false,
    }
}

/// The `__sk_buff` fields the hooks use.
struct Skb {
    len: usize,
    segs: u64,
    ifindex: u32,
    /// The linear part, by direct packet access.
    direct: PacketFrame,
}

impl Skb {
    /// Loads the fields; volatile, so that each call is its own set of
    /// loads (see `observe`).
    #[inline(always)]
    fn read(ctx: &TcContext) -> Skb {
        let skb = ctx.skb.skb;
        // SAFETY: reads of the program's own __sk_buff context.
        unsafe {
            Skb {
                len: read_volatile(&raw const (*skb).len) as usize,
                segs: read_volatile(&raw const (*skb).gso_segs) as u64,
                ifindex: read_volatile(&raw const (*skb).ifindex),
                direct: PacketFrame {
                    start: read_volatile(&raw const (*skb).data) as usize,
                    end: read_volatile(&raw const (*skb).data_end) as usize,
                },
            }
        }
    }
}

/// Passes a frame to a second program when it needs more than counting:
/// on ingress, a frame the drop checks concern (a tunnel packet, or ICMP
/// that may quote one) goes to the checks program; in both directions,
/// TCP/179 (`bgp`) goes to the BGP program.
/// Why second programs: verified together with the classifier and the GSO
/// accounting, the checks made tc ingress exceed the verifier's
/// 1M-instruction limit, and so did the BGP parse; verified alone, from
/// values read out of a map, they are cheap.
#[inline(always)]
fn hand_over(
    ctx: &TcContext,
    direction: Direction,
    c: &parse::Classified,
    bgp: bool,
    ifindex: u32,
    (len, segments): (u64, u64),
    copied: u32,
) {
    let checks = direction == Direction::Rx && parse::needs_checks(c);
    if !checks && !bgp {
        return;
    }
    let Some(pending) = PENDING.get_ptr_mut(PENDING_TC) else {
        return;
    };
    // SAFETY: this CPU's slot; the next program reads it right after, on
    // the same CPU, before anything else can run here.
    unsafe {
        *pending = Pending {
            classified: *c,
            wire_len: len,
            ifindex,
            copied,
            segments,
            direction: direction as u8,
        };
        // A tail call returns only when the slot is empty (that program
        // did not load).
        if checks {
            CHECKS.tail_call(ctx, 0);
        } else {
            BGP_PROG.tail_call(ctx, 0);
        }
    }
}

/// Classifies and counts the frame; returns the classification, settled
/// (`maps::settle`), unless the frame needs nothing more: plain traffic
/// other than ICMP and BGP, or a received tunnel packet known to pass the
/// drop checks (`drops::known_to_pass`).
#[inline(always)]
fn count_frame<F: Frame>(
    frame: &F,
    direction: Direction,
    ifindex: u32,
    len: u64,
    segs: u64,
) -> Option<parse::Classified> {
    let mut c = parse::classify(frame, direction, &MapPorts);
    // A GSO skb (many segments in one) takes the settled path below: its
    // segment arithmetic, verified once per parse path, was most of tc's
    // verification, and the settling costs it little per segment.
    if segs <= 1
        && count::record_plain_only(frame, &FlowKey::of(ifindex, direction, &c), &c, 1, len)
    {
        return None;
    }
    maps::settle(&mut c, SHAPE_TC)?;
    let (packets, bytes) = if segs > 1 {
        // Each segment repeats the headers; without an inner L4 header we
        // can only count the skb's own bytes.
        let headers = parse::headers_len(frame, &c).unwrap_or(0) as u64;
        (segs, len + (segs - 1) * headers)
    } else {
        (1, len)
    };
    let tcp = count::tcp_signals(frame, ifindex, &c);
    let slot = count::record(
        &FlowKey::of(ifindex, direction, &c),
        &c,
        packets,
        bytes,
        &tcp,
    );
    // A received tunnel packet its flow's facts say the checks pass needs
    // nothing more (BGP is plain traffic, never such a packet).
    if direction == Direction::Rx && drops::known_to_pass(slot.as_deref(), &c, len, &tcp) {
        return None;
    }
    Some(c)
}
