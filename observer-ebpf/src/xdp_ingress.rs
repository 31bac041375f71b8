//! XDP on ingress: counts frames as they arrive, before GRO, so packet
//! counts are the wire's. Always returns XDP_PASS.

use core::ptr::read_volatile;

use aya_ebpf::{
    bindings::xdp_action, helpers::generated::bpf_xdp_get_buff_len, macros::xdp,
    programs::XdpContext,
};
use observer_common::{Direction, FlowKey};

use crate::{
    count, drops,
    maps::{
        self, MapPorts, PENDING, PENDING_XDP, Pending, SHAPE_XDP, XDP_BGP_PROG, XDP_CHECKS_PROG,
    },
    parse,
};

/// Entry point on kernels with multi-buffer XDP (5.18+): `frags` so that it
/// also attaches to jumbo-MTU devices, where only the first buffer is
/// parsed and the length helper adds the rest.
#[xdp(frags)]
pub fn observer_xdp(ctx: XdpContext) -> u32 {
    try_observer_xdp(&ctx, Buffers::Multi);
    xdp_action::XDP_PASS
}

/// Entry point on kernels without multi-buffer XDP (before 5.18): there
/// every frame is one linear buffer, and `bpf_xdp_get_buff_len` does not
/// exist.
#[xdp]
pub fn observer_xdp_sb(ctx: XdpContext) -> u32 {
    try_observer_xdp(&ctx, Buffers::Single);
    xdp_action::XDP_PASS
}

/// Longest frame of a 1,500-byte MTU (two VLAN tags, no FCS).
const MAX_STANDARD_FRAME: usize = 1522;

/// Whether a frame may continue in fragments beyond its linear buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Buffers {
    Single,
    Multi,
}

#[inline(always)]
fn try_observer_xdp(ctx: &XdpContext, buffers: Buffers) {
    let Xdp { frame, ifindex } = Xdp::read(ctx);
    // Plain TCP and UDP (most packets on many nodes) end here, before the
    // full parse; so does common VXLAN on a flow whose checks are known.
    let early = parse::early(&frame, Direction::Rx, &MapPorts);
    let counted = match early.exit {
        parse::Exit::Plain => count::record_plain(
            &FlowKey::plain(ifindex, Direction::Rx),
            1,
            frame_bytes(ctx, &frame, buffers, early.ip_end),
        ),
        parse::Exit::Vxlan => count::record_common_vxlan(
            ifindex,
            Direction::Rx,
            &early.vxlan,
            frame_bytes(ctx, &frame, buffers, early.ip_end),
            true,
        ),
        parse::Exit::Full => false,
    };
    if counted {
        return;
    }
    // Read again, not reused: what `early` and the exits learnt on their
    // way here (packet bounds, whether the interface has a plain slot)
    // would split the verifier's states for everything below (it tripled
    // this program's verified instructions).
    let Xdp { frame, ifindex } = Xdp::read(ctx);
    let mut c = parse::classify(&frame, Direction::Rx, &MapPorts);
    let bytes = frame_bytes(ctx, &frame, buffers, c.ip_end);
    if count::record_plain_only(
        &frame,
        &FlowKey::of(ifindex, Direction::Rx, &c),
        &c,
        1,
        bytes,
    ) {
        // Other plain traffic (ICMP excepted) ends here.
        return;
    }
    if maps::settle(&mut c, SHAPE_XDP).is_none() {
        return;
    }
    let tcp = count::tcp_signals(&frame, ifindex, &c);
    let slot = count::record(&FlowKey::of(ifindex, Direction::Rx, &c), &c, 1, bytes, &tcp);
    if parse::needs_checks(&c) {
        if drops::known_to_pass(slot.as_deref(), &c, bytes, &tcp) {
            return;
        }
        // The drop checks, the checksums of handshakes and resets and the
        // evidence are a program of their own (`xdp_checks`, as tc's):
        // verified here, they multiplied this program's states. Returns
        // only when the slot is empty.
        if let Some(pending) = PENDING.get_ptr_mut(PENDING_XDP) {
            // SAFETY: this CPU's slot; the checks program reads it right
            // after, on the same CPU.
            unsafe {
                *pending = Pending {
                    classified: c,
                    wire_len: bytes,
                    ifindex,
                    copied: 0,
                    segments: 1,
                    direction: Direction::Rx as u8,
                };
                XDP_CHECKS_PROG.tail_call(ctx, 0);
            }
        }
    } else if parse::plain_bgp(&frame, &c) {
        // BGP at the wire is its own program (`xdp_bgp`): parsed here, it
        // tripled this program's verification (964k of the 1M
        // instructions on 6.18). Returns only when the slot is empty.
        // SAFETY: a tail call with the program's own context.
        unsafe { XDP_BGP_PROG.tail_call(ctx, 0) };
    }
}

/// The `xdp_md` fields the hook uses.
struct Xdp {
    /// The frame, by direct packet access.
    frame: parse::PacketFrame,
    ifindex: u32,
}

impl Xdp {
    /// Loads the fields; volatile, so that each call is its own set of
    /// loads (see `try_observer_xdp`).
    #[inline(always)]
    fn read(ctx: &XdpContext) -> Xdp {
        let md = ctx.ctx;
        // SAFETY: reads of the program's own xdp_md context.
        unsafe {
            Xdp {
                frame: parse::PacketFrame {
                    start: read_volatile(&raw const (*md).data) as usize,
                    end: read_volatile(&raw const (*md).data_end) as usize,
                },
                ifindex: read_volatile(&raw const (*md).ingress_ifindex),
            }
        }
    }
}

/// The frame's length on the wire. The linear buffer is the whole frame
/// unless it is shorter than the IP header says (`ip_end`), or longer than
/// a standard frame (only jumbo-MTU devices have fragments, and a frame
/// may carry bytes past its IP packet): only then ask for the length
/// including fragments (a helper call costs more than the rest of the
/// program, but little per byte of a jumbo frame).
#[inline(always)]
fn frame_bytes(
    ctx: &XdpContext,
    frame: &parse::PacketFrame,
    buffers: Buffers,
    ip_end: usize,
) -> u64 {
    let linear = frame.end - frame.start;
    if buffers == Buffers::Multi && (ip_end > linear || linear > MAX_STANDARD_FRAME) {
        // SAFETY: ctx.ctx is the program's own xdp_md.
        unsafe { bpf_xdp_get_buff_len(ctx.ctx) }
    } else {
        linear as u64
    }
}
