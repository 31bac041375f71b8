//! Header parsing shared by every hook: Ethernet with up to two VLAN tags,
//! outer IPv4 (with options) / IPv6 (with extension headers), and the
//! encapsulations the observer knows. Pure reads: nothing here writes the
//! packet.
//!
//! The same source is compiled twice: into the eBPF programs, and natively
//! into userspace, where `observer replay` classifies capture files with it
//! (a differential fuzz test keeps the two builds in agreement). What
//! differs between them comes in through traits: how bytes are read
//! ([`Frame`]) and where the UDP port table lives ([`PortTable`]).
//!
//! Shape matters for the verifier: each encapsulation parser only says
//! where its inner packet starts and of which kind, and the inner headers
//! are read once at the end, so the program is not inlined once per
//! encapsulation.

use crate::{Direction, PORT_MATCH_SOURCE, PORT_PROTO_MASK, Proto, Unclassified, family};

/// Length of an Ethernet header.
pub const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const ETH_P_TEB: u16 = 0x6558;

const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_IPIP: u8 = 4;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_IPV6: u8 = 41;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_GRE: u8 = 47;
const IPPROTO_AH: u8 = 51;
const IPPROTO_ICMPV6: u8 = 58;
const IPPROTO_DSTOPTS: u8 = 60;

const UDP_HLEN: usize = 8;
/// A TCP header without options.
const TCP_HLEN: usize = 20;
const VXLAN_HLEN: usize = 8;
const GENEVE_HLEN: usize = 8;
const GRE_HLEN: usize = 4;
/// ICMP and ICMPv6 error headers are 8 bytes before the quoted packet.
const ICMP_HLEN: usize = 8;
/// IPv6 extension headers followed before giving up (`unsupported`).
const MAX_IPV6_EXT: usize = 4;

/// Byte access to a frame; each hook provides its own (direct packet
/// access for XDP, direct access or `bpf_skb_load_bytes` for tc).
pub trait Frame {
    /// Reads a `T` at byte offset `off`; `None` when the frame is shorter
    /// or the bytes lie beyond [`HEADER_WINDOW`]. Offsets need not be
    /// aligned for `T`. Implementations pass `off` through
    /// [`window_offset`] before using it as a pointer offset.
    fn read<T: Plain>(&self, off: usize) -> Option<T>;

    /// The frame's first `len` bytes, when it holds them: one bounds check
    /// for every read at a constant offset inside them ([`Head::get`]),
    /// instead of one per read. `len` is a constant of the caller's, at
    /// most [`HEADER_WINDOW`].
    fn head(&self, len: usize) -> Option<Head<'_>>;

    /// The `len` bytes at `off`, when the frame holds them: [`Frame::head`]
    /// at a computed offset. `len` is a constant of the caller's, at most
    /// [`SCRATCH_SLACK`] (a copied frame's buffer holds that much past the
    /// window).
    fn at(&self, off: usize, len: usize) -> Option<Head<'_>>;
}

/// The first `len` bytes of a frame, known to be there ([`Frame::head`]).
///
/// Why: [`Frame::read`] checks each read against the frame's end through a
/// masked offset, as a computed offset needs on every supported verifier;
/// at the constant offsets of the hooks' first look ([`early`]) one check
/// of the whole header stack is enough, and each read is then one load.
#[derive(Clone, Copy)]
pub struct Head<'frame> {
    at: *const u8,
    len: usize,
    /// Borrows the frame: a head cannot outlive the bytes it reads.
    frame: core::marker::PhantomData<&'frame [u8]>,
}

impl Head<'_> {
    /// The `T` at offset `off` (a constant); `None` when it does not lie
    /// inside the head (a check that constants fold away).
    #[inline(always)]
    pub fn get<T: Plain>(&self, off: usize) -> Option<T> {
        if off + core::mem::size_of::<T>() > self.len {
            return None;
        }
        // SAFETY: `at..at + len` is readable (the `Frame::head` that made
        // this checked it) and holds the read; any bytes are a valid `T`.
        let at = unsafe { self.at.add(off) } as *const T;
        // On BPF an aligned read of a possibly misaligned packet pointer,
        // as in `PacketFrame::read`: word loads instead of byte loads.
        #[cfg(target_arch = "bpf")]
        // SAFETY: as above; BPF allows misaligned loads on the
        // architectures the observer supports (x86_64, arm64).
        let value = unsafe { core::ptr::read(at) };
        #[cfg(not(target_arch = "bpf"))]
        // SAFETY: as above.
        let value = unsafe { core::ptr::read_unaligned(at) };
        Some(value)
    }
}

/// Types a frame's bytes may be read as: every bit pattern is a valid
/// value (integers, arrays of them, and the `repr(C)` headers made of
/// them), so reading one from arbitrary bytes is sound.
///
/// # Safety
///
/// Implement only for types without padding, references, `bool`, `char`
/// or enums.
pub unsafe trait Plain: Copy {}

// SAFETY: integers and arrays of integers: any bytes are a valid value.
unsafe impl Plain for u16 {}
// SAFETY: as above.
unsafe impl<const N: usize> Plain for [u8; N] {}
// SAFETY: as above.
unsafe impl<const N: usize> Plain for [u16; N] {}
// SAFETY: as above.
unsafe impl<const N: usize> Plain for [u32; N] {}
// SAFETY: repr(C) structs of integers and integer arrays, no padding.
unsafe impl Plain for Ipv4Hdr {}
// SAFETY: as above.
unsafe impl Plain for Ipv6Hdr {}
// SAFETY: as above.
unsafe impl Plain for EncapHdr {}

/// The UDP port table: port -> protocol byte (a [`Proto`], plus
/// [`PORT_MATCH_SOURCE`]); 0 for ports that name no encapsulation. The
/// programs read their `UDP_PORT_TAGS` global, userspace an array.
pub trait PortTable {
    /// The protocol byte of `port`.
    fn tag(&self, port: u16) -> u8;
}

/// A frame held in memory (userspace): reads bounded by its length and by
/// [`HEADER_WINDOW`], like the programs'.
pub struct SliceFrame<'a>(pub &'a [u8]);

impl Frame for SliceFrame<'_> {
    #[inline(always)]
    fn read<T: Plain>(&self, off: usize) -> Option<T> {
        let off = window_offset(off, core::mem::size_of::<T>())?;
        let bytes = self.0.get(off..off + core::mem::size_of::<T>())?;
        // SAFETY: `bytes` holds size_of::<T>() bytes, and any bytes are a
        // valid T (`Plain`).
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr() as *const T) })
    }

    #[inline(always)]
    fn head(&self, len: usize) -> Option<Head<'_>> {
        (len <= HEADER_WINDOW && len <= self.0.len()).then_some(Head {
            at: self.0.as_ptr(),
            len,
            frame: core::marker::PhantomData,
        })
    }

    #[inline(always)]
    fn at(&self, off: usize, len: usize) -> Option<Head<'_>> {
        let off = window_offset(off, len)?;
        let bytes = self.0.get(off..off + len)?;
        Some(Head {
            at: bytes.as_ptr(),
            len,
            frame: core::marker::PhantomData,
        })
    }
}

/// Direct packet access (XDP, and tc when the linear part of the skb holds
/// the headers): reads bounded by `data_end`.
pub struct PacketFrame {
    /// `data`.
    pub start: usize,
    /// `data_end`.
    pub end: usize,
}

impl Frame for PacketFrame {
    #[inline(always)]
    fn read<T: Plain>(&self, off: usize) -> Option<T> {
        let at = self.start + window_offset(off, core::mem::size_of::<T>())?;
        if at + core::mem::size_of::<T>() > self.end {
            return None;
        }
        // SAFETY: bounds checked against data_end just above. The pointer may
        // be misaligned for T: BPF allows misaligned packet loads on the
        // architectures the observer supports (x86_64, arm64), and an
        // aligned read lets LLVM emit word loads instead of byte loads.
        Some(unsafe { core::ptr::read(at as *const T) })
    }

    #[inline(always)]
    fn head(&self, len: usize) -> Option<Head<'_>> {
        if len > HEADER_WINDOW || self.start + len > self.end {
            return None;
        }
        Some(Head {
            at: self.start as *const u8,
            len,
            frame: core::marker::PhantomData,
        })
    }

    #[inline(always)]
    fn at(&self, off: usize, len: usize) -> Option<Head<'_>> {
        let at = self.start + window_offset(off, len)?;
        if at + len > self.end {
            return None;
        }
        Some(Head {
            at: at as *const u8,
            len,
            frame: core::marker::PhantomData,
        })
    }
}

/// The first bytes of a frame copied into a [`Scratch`] buffer (skb data
/// beyond the linear part, a dropped skb in kernel memory): one copy, then
/// plain loads, instead of a helper call per header field.
pub struct CopiedFrame {
    /// The buffer.
    pub buf: *const Scratch,
    /// Bytes copied (at most [`HEADER_WINDOW`]).
    pub len: usize,
}

impl Frame for CopiedFrame {
    #[inline(always)]
    fn read<T: Plain>(&self, off: usize) -> Option<T> {
        let off = window_offset(off, core::mem::size_of::<T>())?;
        if off + core::mem::size_of::<T>() > self.len {
            return None;
        }
        // SAFETY: `off` < HEADER_WINDOW and T is at most SCRATCH_SLACK
        // bytes, so the read stays inside the buffer (the verifier checks
        // the same bound); the first `len` bytes were written by the copy.
        Some(unsafe { core::ptr::read_unaligned((self.buf as *const u8).add(off) as *const T) })
    }

    #[inline(always)]
    fn head(&self, len: usize) -> Option<Head<'_>> {
        (len <= HEADER_WINDOW && len <= self.len).then_some(Head {
            at: self.buf as *const u8,
            len,
            frame: core::marker::PhantomData,
        })
    }

    #[inline(always)]
    fn at(&self, off: usize, len: usize) -> Option<Head<'_>> {
        let off = window_offset(off, len)?;
        if len > SCRATCH_SLACK || off + len > self.len {
            return None;
        }
        // SAFETY: `off` < HEADER_WINDOW and `len` at most SCRATCH_SLACK:
        // inside the buffer, whose first `self.len` bytes the copy wrote.
        let at = unsafe { (self.buf as *const u8).add(off) };
        Some(Head {
            at,
            len,
            frame: core::marker::PhantomData,
        })
    }
}

/// Bytes after [`HEADER_WINDOW`] in a [`Scratch`] buffer, so that any read
/// at a window offset (the largest is an IPv6 header, 40 bytes) stays
/// inside it.
pub const SCRATCH_SLACK: usize = 64;

/// A per-CPU copy buffer.
#[repr(C)]
pub struct Scratch {
    /// The copied bytes.
    pub bytes: [u8; HEADER_WINDOW + SCRATCH_SLACK],
}

/// `len` clamped to `1..=HEADER_WINDOW` in a form the verifier bounds (a
/// copy length must be a bounded register); `None` for 0.
#[inline(always)]
pub fn copy_len(len: usize) -> Option<usize> {
    if len == 0 {
        return None;
    }
    let len = if len > HEADER_WINDOW {
        HEADER_WINDOW
    } else {
        len
    };
    Some(bounded(len - 1, HEADER_WINDOW - 1) + 1)
}

/// The parser only reads the first `HEADER_WINDOW` bytes of a frame. 512
/// holds the deepest stack the observer parses (two VLAN tags, IPv6 with
/// extension headers, UDP, Geneve with options, inner Ethernet, inner IPv6,
/// inner TCP with options) with room to spare; a header past it makes the
/// frame `truncated`/`unsupported` like a short one.
pub const HEADER_WINDOW: usize = 512;

/// `off` checked to leave `size` bytes inside [`HEADER_WINDOW`], in a form
/// every supported kernel's verifier can bound.
///
/// Why the mask ([`bounded`]): verifiers before about 6.3 forget the
/// bounds of a value that went through OR, XOR or a shift by a register,
/// which is how LLVM assembles multi-byte header fields, so a computed
/// offset reached the pointer addition as "any 64-bit value" and 6.1
/// rejected the program; LLVM would drop a plain AND as redundant after
/// the range check.
#[inline(always)]
pub fn window_offset(off: usize, size: usize) -> Option<usize> {
    if off + size > HEADER_WINDOW {
        return None;
    }
    Some(bounded(off, HEADER_WINDOW - 1))
}

/// `x & mask`, with the AND kept even where the optimizer knows it
/// changes nothing: a value that went through a byte swap, an OR or a
/// shift by a register is unbounded to verifiers before about 6.3 (5.10
/// refused a port from `u16::from_be` as an index into the port table),
/// and an AND with a constant is bounded by every verifier.
#[inline(always)]
pub fn bounded(x: usize, mask: usize) -> usize {
    opaque(x) & mask
}

/// `x`, unknown to the optimizer (a register move in asm on BPF).
#[inline(always)]
fn opaque(x: usize) -> usize {
    register_move(x, false)
}

/// `p`, after which the optimizer assumes the memory behind it changed, so
/// that it reloads what it reads there instead of reusing what it stored
/// (the programs' `maps::settle`).
#[inline(always)]
pub fn clobbered<T>(p: *mut T) -> *mut T {
    register_move(p as usize, true) as *mut T
}

/// `x` through one register move in asm on BPF, which the optimizer cannot
/// see through; with `memory`, it also assumes the asm wrote memory.
/// Outside BPF, `x` itself.
#[inline(always)]
fn register_move(x: usize, memory: bool) -> usize {
    #[cfg(target_arch = "bpf")]
    {
        let mut x = x;
        // The asm must emit an instruction: an empty one leaves two
        // line_info records on one instruction, which 6.1 refuses.
        // SAFETY: one register move of `x`, touching no memory (without
        // `nomem` the compiler only assumes it may have).
        unsafe {
            if memory {
                core::arch::asm!("{0} = {0}", inout(reg) x, options(nostack, preserves_flags));
            } else {
                core::arch::asm!("{0} = {0}", inout(reg) x, options(pure, nomem, nostack, preserves_flags));
            }
        }
        x
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        let _ = memory;
        x
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Ipv4Hdr {
    version_ihl: u8,
    _tos: u8,
    total_len: u16,
    _id: u16,
    frag_off: u16,
    _ttl: u8,
    proto: u8,
    _check: u16,
    src: u32,
    dst: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Ipv6Hdr {
    version_flow: u32,
    payload_len: u16,
    next_header: u8,
    _hop_limit: u8,
    src: [u32; 4],
    dst: [u32; 4],
}

/// Tunnel, VXLAN-GPE and Geneve headers share this 8-byte shape.
#[repr(C)]
#[derive(Clone, Copy)]
struct EncapHdr {
    b: [u8; 4],
    vni_reserved: u32,
}

/// What follows an encapsulation header.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Inner {
    None,
    Ethernet,
    Ipv4,
    Ipv6,
}

/// What the parser learnt about one frame. `repr(C)` and `Copy`: tc
/// ingress hands it to its checks program through a per-CPU map.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Classified {
    /// Encapsulation (or `Other` for plain IP / unclassified frames).
    pub proto: Proto,
    /// Why the frame could not be classified (`None` when it was).
    pub reason: Unclassified,
    /// Outer source (rx) or destination (tx); zero for `Other`.
    pub peer: [u32; 4],
    /// Family of `peer`.
    pub peer_family: u8,
    /// VNI for VXLAN, VXLAN-GPE and Geneve.
    pub vni: u32,
    /// Inner source address sample.
    pub inner_src: [u32; 4],
    /// Inner destination address sample.
    pub inner_dst: [u32; 4],
    /// Family of the inner sample, 0 when none was read.
    pub inner_family: u8,
    /// Offset of the innermost L4 header (the outer one for plain IP; 0
    /// when unknown); used to size GSO segments.
    pub l4_off: usize,
    /// Protocol of that L4 header (valid when `l4_off != 0`).
    pub l4_proto: u8,
    /// Length of the Ethernet header and VLAN tags.
    pub l2_len: usize,
    /// First byte of the VXLAN header (flags; 0x08 is I, "VNI valid").
    pub vxlan_flags: u8,
    /// The outer IP packet is a fragment (first or later).
    pub outer_fragment: bool,
    /// An `observer probe` packet: a tunnel packet whose inner IPv4 ICMP
    /// payload starts with [`crate::PROBE_MAGIC`]. Counted apart, never
    /// in a flow row, so that probing never moves the passive counters
    /// (drop checks still apply: a probe dropped here is a drop).
    pub probe: bool,
    /// Where the outer IP packet ends according to its length field
    /// (0 when unknown): a shorter linear buffer means the frame has more
    /// data in fragments.
    pub ip_end: usize,
}

impl Classified {
    /// An unclassified frame that keeps where its IP packet ends: XDP needs
    /// it to count a frame whose data continues in fragments.
    #[inline(always)]
    const fn unclassified_ending_at(reason: Unclassified, ip_end: usize) -> Self {
        let mut c = Classified::unclassified(reason);
        c.ip_end = ip_end;
        c
    }

    #[inline(always)]
    const fn unclassified(reason: Unclassified) -> Self {
        Classified {
            proto: Proto::Other,
            reason,
            peer: [0; 4],
            peer_family: family::NONE,
            vni: 0,
            inner_src: [0; 4],
            inner_dst: [0; 4],
            inner_family: family::NONE,
            l4_off: 0,
            l4_proto: 0,
            l2_len: 0,
            vxlan_flags: 0,
            outer_fragment: false,
            probe: false,
            ip_end: 0,
        }
    }
}

/// Result of the encapsulation stage.
struct Encap {
    proto: Proto,
    vni: u32,
    flags: u8,
    inner: Inner,
    inner_off: usize,
}

impl Encap {
    #[inline(always)]
    const fn plain() -> Self {
        Encap {
            proto: Proto::Other,
            vni: 0,
            flags: 0,
            inner: Inner::None,
            inner_off: 0,
        }
    }
}

/// [`crate::PROBE_MAGIC`] as the two words a read of it gives.
const PROBE_WORDS: [u32; 2] = {
    let m = crate::PROBE_MAGIC;
    [
        u32::from_ne_bytes([m[0], m[1], m[2], m[3]]),
        u32::from_ne_bytes([m[4], m[5], m[6], m[7]]),
    ]
};

/// Classifies the frame as seen in `direction`.
#[inline(always)]
pub fn classify<F: Frame, P: PortTable>(f: &F, direction: Direction, ports: &P) -> Classified {
    let Some(eth_type) = f.read::<u16>(12) else {
        return Classified::unclassified(Unclassified::TruncatedL2);
    };
    let mut eth_type = u16::from_be(eth_type);
    let mut off = ETH_HLEN;
    // Up to two tags: 802.1Q, or 802.1ad outer + 802.1Q inner (QinQ).
    for _ in 0..2 {
        if eth_type != ETH_P_8021Q && eth_type != ETH_P_8021AD {
            break;
        }
        let Some(tag) = f.read::<[u16; 2]>(off) else {
            return Classified::unclassified(Unclassified::TruncatedL2);
        };
        eth_type = u16::from_be(tag[1]);
        off += 4;
    }

    let mut c = Classified::unclassified(Unclassified::None);
    c.l2_len = off;
    let (l4_off, l4_proto, fragment) = match eth_type {
        ETH_P_IP => {
            let Some(h) = f.read::<Ipv4Hdr>(off) else {
                return Classified::unclassified(Unclassified::TruncatedL3);
            };
            let ihl = ((h.version_ihl & 0x0f) as usize) * 4;
            if h.version_ihl >> 4 != 4 || ihl < 20 {
                return Classified::unclassified(Unclassified::MalformedL3);
            }
            // Two-byte probe: LLVM turns a one-byte bounds check into a
            // `ptr < end` comparison the verifier does not credit.
            if f.read::<[u8; 2]>(off + ihl - 2).is_none() {
                return Classified::unclassified(Unclassified::TruncatedL3);
            }
            c.peer[0] = match direction {
                Direction::Rx => h.src,
                Direction::Tx => h.dst,
            };
            c.peer_family = family::V4;
            c.ip_end = ip_end(off, u16::from_be(h.total_len) as usize);
            let frag_off = u16::from_be(h.frag_off);
            let fragment = if frag_off & 0x1fff != 0 {
                Fragment::Later
            } else if frag_off & 0x2000 != 0 {
                Fragment::First
            } else {
                Fragment::No
            };
            (off + ihl, h.proto, fragment)
        }
        ETH_P_IPV6 => {
            let Some(h) = f.read::<Ipv6Hdr>(off) else {
                return Classified::unclassified(Unclassified::TruncatedL3);
            };
            if (u32::from_be(h.version_flow) >> 28) != 6 {
                return Classified::unclassified(Unclassified::MalformedL3);
            }
            c.peer = match direction {
                Direction::Rx => h.src,
                Direction::Tx => h.dst,
            };
            c.peer_family = family::V6;
            c.ip_end = ip_end(off + 40, u16::from_be(h.payload_len) as usize);
            match ipv6_payload(f, off + 40, h.next_header) {
                Ok(l4) => l4,
                Err(reason) => return Classified::unclassified_ending_at(reason, c.ip_end),
            }
        }
        _ => return Classified::unclassified(Unclassified::Unsupported),
    };
    c.outer_fragment = fragment != Fragment::No;
    if fragment == Fragment::Later {
        // No L4 header: only IP-protocol encapsulations are recognisable.
        c.proto = match l4_proto {
            IPPROTO_IPIP => Proto::Ipip,
            IPPROTO_IPV6 => Proto::Ip6ip,
            IPPROTO_GRE => Proto::Gre,
            _ => return Classified::unclassified_ending_at(Unclassified::None, c.ip_end),
        };
        return c;
    }

    let encap = match l4_proto {
        IPPROTO_IPIP => Ok(Encap {
            proto: Proto::Ipip,
            vni: 0,
            flags: 0,
            inner: Inner::Ipv4,
            inner_off: l4_off,
        }),
        IPPROTO_IPV6 => Ok(Encap {
            proto: Proto::Ip6ip,
            vni: 0,
            flags: 0,
            inner: Inner::Ipv6,
            inner_off: l4_off,
        }),
        IPPROTO_GRE => gre(f, l4_off),
        IPPROTO_UDP => udp(f, l4_off, ports),
        _ => Ok(Encap::plain()),
    };
    let encap = match encap {
        Ok(e) => e,
        Err(reason) => return Classified::unclassified_ending_at(reason, c.ip_end),
    };
    if encap.proto == Proto::Other {
        let mut plain = Classified::unclassified_ending_at(Unclassified::None, c.ip_end);
        plain.l4_off = l4_off;
        plain.l4_proto = l4_proto;
        return plain;
    }
    c.proto = encap.proto;
    c.vni = encap.vni;
    c.vxlan_flags = encap.flags;
    inner_headers(f, encap.inner, encap.inner_off, &mut c);
    c
}

/// What the hooks' first look at a frame says ([`early`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Exit {
    /// Plain TCP or UDP that needs nothing past counting.
    Plain,
    /// VXLAN of the common shape.
    Vxlan,
    /// Anything else: the hooks classify it in full.
    Full,
}

/// The result of [`early`]. A struct with every field set on every path,
/// not an enum with data: the programs' verifier refuses the
/// uninitialised registers LLVM copies for the variants without it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Early {
    /// What the frame is.
    pub exit: Exit,
    /// Where its IP packet ends ([`Classified::ip_end`]; 0 for
    /// [`Exit::Full`]).
    pub ip_end: usize,
    /// What its flow row needs, for [`Exit::Vxlan`] (zero otherwise).
    pub vxlan: CommonVxlan,
}

impl Early {
    const FULL: Early = Early::new(Exit::Full, 0, CommonVxlan::NONE);

    #[inline(always)]
    const fn new(exit: Exit, ip_end: usize, vxlan: CommonVxlan) -> Early {
        Early {
            exit,
            ip_end,
            vxlan,
        }
    }
}

/// A VXLAN frame of the shape most tunnel traffic has, as [`early`] reads
/// it: what its flow row needs, nothing more.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CommonVxlan {
    /// Outer IPv4 source (rx) or destination (tx).
    pub peer: u32,
    /// The VNI.
    pub vni: u32,
    /// Inner IPv4 source.
    pub inner_src: u32,
    /// Inner IPv4 destination.
    pub inner_dst: u32,
}

impl CommonVxlan {
    const NONE: CommonVxlan = CommonVxlan {
        peer: 0,
        vni: 0,
        inner_src: 0,
        inner_dst: 0,
    };
}

/// The hooks' first look at a frame, at fixed offsets:
/// - [`Exit::Plain`] for plain TCP or UDP that needs nothing past
///   counting: untagged, IPv4 without options and not a fragment or IPv6
///   without extension headers, UDP to and from ports that name no
///   encapsulation, TCP not to or from the BGP port;
/// - [`Exit::Vxlan`] for VXLAN of the common shape: untagged IPv4 without
///   options and not a fragment, UDP whose ports name VXLAN, the I flag
///   set, an untagged inner IPv4 header without options that does not
///   carry ICMP (probes are ICMP);
/// - [`Exit::Full`] for anything else, whatever the frame is.
///
/// Why a second look at headers [`classify`] reads again: plain traffic is
/// the bulk of a node's packets and common VXLAN the bulk of its tunnel
/// packets, and `classify` handles everything (VLAN tags, options,
/// extension headers, fragments, every encapsulation) at offsets it works
/// out as it goes, with a result the hooks settle through a map
/// (`maps::settle`) before counting; this is a few loads. For every plain
/// frame it names, `classify` says plain traffic ending at the same place,
/// for which neither [`needs_checks`] nor [`plain_bgp`] holds; for every
/// VXLAN frame, VXLAN with the same peer, VNI, inner addresses and end,
/// the I flag set, not a fragment and not a probe, with untagged Ethernet
/// headers (the differential test asserts both on every frame it
/// generates, `tests/support/differential.rs`).
#[inline(always)]
pub fn early<F: Frame, P: PortTable>(f: &F, direction: Direction, ports: &P) -> Early {
    // Each header stack is read from one `Frame::head`: one bounds check,
    // then loads at constant offsets.
    let Some(h) = f.head(EARLY_V4_LEN) else {
        return Early::FULL;
    };
    let Some(eth_type) = h.get::<u16>(12) else {
        return Early::FULL;
    };
    // The L4 protocol, the first two words of the L4 header (UDP's or
    // TCP's ports, as on the wire), where the IP packet ends, and the outer
    // IPv4 addresses (`[0, 0]` and no VXLAN exit for IPv6): plain values on
    // every path (an `Option` of the header left registers uninitialised
    // on the IPv6 path, which the verifier refuses).
    let (l4_proto, [source, destination], end, outer_v4) = match u16::from_be(eth_type) {
        ETH_P_IP => {
            let (Some(ip), Some(l4)) =
                (h.get::<Ipv4Hdr>(ETH_HLEN), h.get::<[u16; 2]>(ETH_HLEN + 20))
            else {
                return Early::FULL;
            };
            if ip.version_ihl != 0x45 || u16::from_be(ip.frag_off) & 0x3fff != 0 {
                return Early::FULL;
            }
            let end = ip_end(ETH_HLEN, u16::from_be(ip.total_len) as usize);
            (ip.proto, l4, end, Some([ip.src, ip.dst]))
        }
        ETH_P_IPV6 => {
            let Some(h) = f.head(EARLY_V6_LEN) else {
                return Early::FULL;
            };
            let (Some(ip), Some(l4)) =
                (h.get::<Ipv6Hdr>(ETH_HLEN), h.get::<[u16; 2]>(ETH_HLEN + 40))
            else {
                return Early::FULL;
            };
            if (u32::from_be(ip.version_flow) >> 28) != 6 {
                return Early::FULL;
            }
            let end = ip_end(ETH_HLEN + 40, u16::from_be(ip.payload_len) as usize);
            (ip.next_header, l4, end, None)
        }
        _ => return Early::FULL,
    };
    let plain = Early::new(Exit::Plain, end, CommonVxlan::NONE);
    match l4_proto {
        IPPROTO_UDP => match udp_proto(source, destination, ports) {
            Proto::Other => plain,
            Proto::Vxlan => match outer_v4 {
                Some(outer) => match common_vxlan(f, outer, direction) {
                    Some(v) => Early::new(Exit::Vxlan, end, v),
                    None => Early::FULL,
                },
                None => Early::FULL,
            },
            _ => Early::FULL,
        },
        IPPROTO_TCP if !bgp_ports(source, destination) => plain,
        _ => Early::FULL,
    }
}

/// What [`early`] reads of every frame: Ethernet, IPv4 without options
/// and a UDP header (or the ports of a TCP header, which is longer).
const EARLY_V4_LEN: usize = ETH_HLEN + 20 + UDP_HLEN;
/// The same with IPv6 without extension headers.
const EARLY_V6_LEN: usize = ETH_HLEN + 40 + UDP_HLEN;
/// Where [`common_vxlan`] finds the VXLAN header and the inner frame.
const COMMON_VXLAN_OFF: usize = EARLY_V4_LEN;
const COMMON_INNER_ETH_OFF: usize = COMMON_VXLAN_OFF + VXLAN_HLEN;
/// What [`common_vxlan`] reads: up to the end of the inner IPv4 header.
const COMMON_VXLAN_LEN: usize = COMMON_INNER_ETH_OFF + ETH_HLEN + 20;
/// Where the inner TCP header of a common VXLAN frame starts.
const COMMON_INNER_TCP_OFF: usize = COMMON_VXLAN_LEN;
/// What [`common_vxlan`] reads of inner TCP: up to its flags.
const COMMON_VXLAN_TCP_LEN: usize = COMMON_INNER_TCP_OFF + 14;

/// [`early`] past the UDP header of a VXLAN frame whose outer IPv4 header
/// (without options) has the addresses `[source, destination]`.
#[inline(always)]
fn common_vxlan<F: Frame>(f: &F, outer: [u32; 2], direction: Direction) -> Option<CommonVxlan> {
    let h = f.head(COMMON_VXLAN_LEN)?;
    let vxlan = h.get::<EncapHdr>(COMMON_VXLAN_OFF)?;
    let inner_type = h.get::<u16>(COMMON_INNER_ETH_OFF + 12)?;
    let inner = h.get::<Ipv4Hdr>(COMMON_INNER_ETH_OFF + ETH_HLEN)?;
    if vxlan.b[0] & crate::VXLAN_FLAG_I == 0
        || u16::from_be(inner_type) != ETH_P_IP
        || inner.version_ihl != 0x45
        || inner.proto == IPPROTO_ICMP
    {
        return None;
    }
    // A SYN or RST has inner TCP signals to count ([`inner_tcp`]), which
    // only the full parse reads: one more load, on inner TCP only.
    if inner.proto == IPPROTO_TCP {
        let flags = f
            .head(COMMON_VXLAN_TCP_LEN)?
            .get::<[u8; 2]>(COMMON_INNER_TCP_OFF + 12)?[1];
        if flags & (TCP_SYN | TCP_RST) != 0 {
            return None;
        }
    }
    Some(CommonVxlan {
        peer: match direction {
            Direction::Rx => outer[0],
            Direction::Tx => outer[1],
        },
        vni: u32::from_be(vxlan.vni_reserved) >> 8,
        inner_src: inner.src,
        inner_dst: inner.dst,
    })
}

/// TCP flags the BGP counters follow.
pub const TCP_FIN: u8 = 0x01;
/// SYN.
pub const TCP_SYN: u8 = 0x02;
/// RST.
pub const TCP_RST: u8 = 0x04;
/// ACK.
pub const TCP_ACK: u8 = 0x10;

/// TCP option kind of the maximum segment size.
const TCP_OPT_MSS: u8 = 2;

/// What one tunnel packet's inner TCP header says ([`inner_tcp`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct InnerTcp {
    /// The flags byte (0 when the packet carries no inner TCP header).
    pub flags: u8,
    /// A SYN's or SYN-ACK's MSS option (0 when it has none first).
    pub mss: u16,
    /// The outer IP packet a full segment of that MSS would make, sent
    /// back through the same encapsulation: this frame's headers from the
    /// outer IP header to the inner TCP header, a TCP header without
    /// options, and `mss` bytes (0 without `mss`). More than the
    /// interface's MTU means the other end's full segments cannot cross
    /// the tunnel whole.
    pub full_segment: u32,
}

/// The inner TCP header of a tunnel packet `c` (not a probe, inner IPv4
/// or IPv6 read, inner protocol TCP): its flags and, on a SYN, the MSS
/// option. Read after the parse, at the inner L4 offset it found, so the
/// hooks verify it once. The MSS is read where senders put it, as the
/// first option (Linux, Windows and the BSDs do; elsewhere it is not
/// judged).
#[inline(always)]
pub fn inner_tcp<F: Frame>(f: &F, c: &Classified) -> InnerTcp {
    let none = InnerTcp::default();
    if c.proto == Proto::Other
        || c.probe
        || c.inner_family == family::NONE
        || c.l4_off == 0
        || c.l4_proto != IPPROTO_TCP
    {
        return none;
    }
    let Some([data_offset, flags]) = f.read::<[u8; 2]>(c.l4_off + 12) else {
        return none;
    };
    let mut tcp = InnerTcp {
        flags,
        mss: 0,
        full_segment: 0,
    };
    // Options start after the 20-byte header: a data offset above 5 words.
    if flags & TCP_SYN != 0
        && data_offset >> 4 > 5
        && let Some([kind, len, hi, lo]) = f.read::<[u8; 4]>(c.l4_off + 20)
        && kind == TCP_OPT_MSS
        && len == 4
    {
        tcp.mss = u16::from_be_bytes([hi, lo]);
        tcp.full_segment = (c.l4_off - c.l2_len + TCP_HLEN) as u32 + tcp.mss as u32;
    }
    tcp
}

/// Longest inner TCP segment whose checksum is verified: a header with
/// the most options (60 bytes), what a SYN, SYN-ACK or RST carries.
const MAX_VERIFIED_SEGMENT: usize = 60;

/// What the checksums of a received tunnel packet say ([`checksums`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Checksums {
    /// The inner TCP checksum was read and compared.
    pub verified: bool,
    /// The inner TCP checksum is wrong (and no pending one).
    pub bad_inner: bool,
    /// The outer UDP checksum is wrong.
    pub bad_outer: bool,
    /// The outer UDP checksum is zero: not computed, which UDP over IPv4
    /// allows and tunnels over IPv6 may do (RFC 6935); Calico's eBPF data
    /// plane requires it.
    pub zero_outer: bool,
}

/// The checksums of a received tunnel packet `c` whose inner TCP segment is
/// a SYN, SYN-ACK or RST without payload (a header of 20 to 60 bytes: what
/// the programs parse in full whatever the flow; the common VXLAN exit
/// takes data segments, [`early`]): the inner TCP checksum, and for
/// VXLAN, VXLAN-GPE and Geneve without options the outer UDP checksum.
///
/// A checksum the kernel or the NIC will still fill in is never judged:
/// a segment sent with checksum offload (`CHECKSUM_PARTIAL`) carries in
/// its checksum field the folded sum of its pseudo-header only, which is
/// what the sender's stack writes there for the device to complete (on a
/// veth the packet crosses namespaces like that). Such a segment is not
/// verified, nor is the outer UDP checksum computed around it (local
/// checksum offload sums the outer datagram as if the inner checksum were
/// already filled in).
///
/// Sums are taken over spans of constant lengths ([`sum_span`]), one per
/// possible header length: a loop to a computed length made the verifier
/// follow each length through everything after it (XDP went from 95k to
/// 745k verified instructions).
#[inline(always)]
pub fn checksums<F: Frame>(f: &F, c: &Classified) -> Checksums {
    let mut out = Checksums::default();
    let tcp = inner_tcp(f, c);
    let end = c.ip_end;
    if tcp.flags & (TCP_SYN | TCP_RST) == 0 || end <= c.l4_off {
        return out;
    }
    let len = end - c.l4_off;
    if len > MAX_VERIFIED_SEGMENT {
        return out;
    }
    let Some(field) = f.read::<[u8; 2]>(c.l4_off + 16) else {
        return out;
    };
    let outer = match c.proto {
        Proto::Vxlan | Proto::VxlanGpe | Proto::Geneve => outer_udp(f, c),
        _ => None,
    };
    out.zero_outer = outer.is_some_and(|o| o.zero);
    let mut pseudo = words_sum(&c.inner_src) + words_sum(&c.inner_dst);
    pseudo += IPPROTO_TCP as u32 + len as u32;
    if u16::from_be_bytes(field) == fold(pseudo) {
        // Pending: offloaded, filled in further on.
        return out;
    }
    let Some(segment) = segment_sum(f, c.l4_off, len) else {
        return out;
    };
    out.verified = true;
    out.bad_inner = fold(pseudo + segment) != 0xffff;
    if let Some(o) = outer
        && !o.zero
        && let Some(prefix) = prefix_sum(f, o.udp, c.l4_off - o.udp)
    {
        out.bad_outer = fold(o.pseudo + prefix + segment) != 0xffff;
    }
    out
}

/// The outer UDP header of a UDP encapsulation's frame `c` (outer IPv4 or
/// IPv6 without extension headers), when its datagram ends where the
/// packet does.
#[derive(Clone, Copy)]
struct OuterUdp {
    /// The checksum is zero: not computed.
    zero: bool,
    /// Where the UDP header starts.
    udp: usize,
    /// Sum of the pseudo-header (addresses, protocol, length).
    pseudo: u32,
}

#[inline(always)]
fn outer_udp<F: Frame>(f: &F, c: &Classified) -> Option<OuterUdp> {
    let ip = c.l2_len;
    // Two bytes, not one: a one-byte read's bounds check compiles to a
    // compare the verifier learns no packet range from.
    let [first, _] = f.read::<[u8; 2]>(ip)?;
    let (udp, addrs) = match first >> 4 {
        4 => {
            let h = f.read::<Ipv4Hdr>(ip)?;
            let addrs = words_sum(&[h.src]) + words_sum(&[h.dst]);
            (ip + ((h.version_ihl & 0x0f) as usize) * 4, addrs)
        }
        6 => {
            let h = f.read::<Ipv6Hdr>(ip)?;
            if h.next_header != IPPROTO_UDP {
                return None;
            }
            (ip + 40, words_sum(&h.src) + words_sum(&h.dst))
        }
        _ => return None,
    };
    let header = f.read::<[u8; 8]>(udp)?;
    let len = u16::from_be_bytes([header[4], header[5]]) as usize;
    if udp + len != c.ip_end {
        return None;
    }
    Some(OuterUdp {
        zero: header[6] == 0 && header[7] == 0,
        udp,
        pseudo: addrs + IPPROTO_UDP as u32 + len as u32,
    })
}

/// Sum of a TCP header of `len` bytes at `off` (20 to 60, a multiple of 4).
#[inline(always)]
fn segment_sum<F: Frame>(f: &F, off: usize, len: usize) -> Option<u32> {
    match len {
        20 => sum_span::<F, 20>(f, off),
        24 => sum_span::<F, 24>(f, off),
        28 => sum_span::<F, 28>(f, off),
        32 => sum_span::<F, 32>(f, off),
        36 => sum_span::<F, 36>(f, off),
        40 => sum_span::<F, 40>(f, off),
        44 => sum_span::<F, 44>(f, off),
        48 => sum_span::<F, 48>(f, off),
        52 => sum_span::<F, 52>(f, off),
        56 => sum_span::<F, 56>(f, off),
        60 => sum_span::<F, 60>(f, off),
        _ => None,
    }
}

/// Sum of the `len` bytes from the outer UDP header at `off` to the inner
/// TCP header: UDP, the encapsulation's header, inner Ethernet (VXLAN,
/// Geneve) and the inner IP header: 36 (VXLAN-GPE, IPv4), 50 (VXLAN or
/// Geneve without options, IPv4), 56 (VXLAN-GPE, IPv6), 70 (VXLAN or
/// Geneve, IPv6). Spans of at most 50 bytes (see [`Frame::at`]).
#[inline(always)]
fn prefix_sum<F: Frame>(f: &F, off: usize, len: usize) -> Option<u32> {
    match len {
        36 => sum_span::<F, 36>(f, off),
        50 => sum_span::<F, 50>(f, off),
        56 => Some(sum_span::<F, 36>(f, off)? + sum_span::<F, 20>(f, off + 36)?),
        70 => Some(sum_span::<F, 50>(f, off)? + sum_span::<F, 20>(f, off + 50)?),
        _ => None,
    }
}

/// Sum of the 16-bit words of the `N` bytes at `off` (`N` even): one
/// bounds check, then loads at constant offsets.
#[inline(always)]
fn sum_span<F: Frame, const N: usize>(f: &F, off: usize) -> Option<u32> {
    let h = f.at(off, N)?;
    let mut sum = 0u32;
    let mut i = 0;
    while i + 2 <= N {
        sum += u16::from_be(h.get::<u16>(i)?) as u32;
        i += 2;
    }
    Some(sum)
}

/// Sum of the 16-bit halves of address words as loaded (network order).
#[inline(always)]
fn words_sum(words: &[u32]) -> u32 {
    let mut sum = 0;
    for w in words {
        let b = w.to_ne_bytes();
        sum += u16::from_be_bytes([b[0], b[1]]) as u32 + u16::from_be_bytes([b[2], b[3]]) as u32;
    }
    sum
}

/// The ones' complement sum folded to 16 bits (twice is enough for any
/// sum of fewer than 65,536 words).
#[inline(always)]
fn fold(sum: u32) -> u16 {
    let sum = (sum & 0xffff) + (sum >> 16);
    ((sum & 0xffff) + (sum >> 16)) as u16
}

/// What one TCP/179 segment says: its peer, its flags, and the BGP
/// message that starts its payload.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BgpSegment {
    /// The other end (source on rx, destination on tx).
    pub peer: [u32; 4],
    /// [`family`] of `peer`.
    pub peer_family: u8,
    /// The TCP flags byte.
    pub flags: u8,
    /// The type of the BGP message at the start of the payload
    /// ([`crate::bgp_message`]; `NONE` when none starts there).
    pub message: u8,
    /// `code << 8 | subcode` of a NOTIFICATION.
    pub notification: u16,
    /// The hold time (seconds) an OPEN proposes.
    pub hold_time: u16,
}

/// The BGP facts of a frame to or from TCP port 179; `None` for any other
/// frame. Only the first message header of the segment is read: a segment
/// may carry several messages, or the middle of one.
///
/// A parse of its own, not a step after [`classify`]: run after it, its
/// variable offsets were verified once per state `classify` ends in, which
/// the verifier refused as too large; at a hook's start it is verified
/// once. It reads untagged Ethernet, IPv4 (not fragments after the first)
/// and IPv6 without extension headers: how BGP sessions between nodes
/// travel.
#[inline(always)]
pub fn bgp_segment<F: Frame>(f: &F, direction: Direction) -> Option<BgpSegment> {
    let eth_type = f.read::<[u8; 2]>(12)?;
    let mut seg = BgpSegment {
        peer: [0; 4],
        peer_family: family::NONE,
        flags: 0,
        message: crate::bgp_message::NONE,
        notification: 0,
        hold_time: 0,
    };
    let (l4_off, ip_end) = match u16::from_be_bytes(eth_type) {
        ETH_P_IP => {
            let h = f.read::<[u32; 5]>(ETH_HLEN)?;
            let b = h[0].to_ne_bytes();
            let (ihl, total_len) = (
                ((b[0] & 0x0f) as usize) * 4,
                u16::from_be_bytes([b[2], b[3]]),
            );
            let proto = h[2].to_ne_bytes()[1];
            let frag_off = u16::from_be_bytes([h[1].to_ne_bytes()[2], h[1].to_ne_bytes()[3]]);
            if proto != IPPROTO_TCP || ihl < 20 || frag_off & 0x1fff != 0 {
                return None;
            }
            seg.peer[0] = match direction {
                Direction::Rx => h[3],
                Direction::Tx => h[4],
            };
            seg.peer_family = family::V4;
            (ETH_HLEN + ihl, ip_end(ETH_HLEN, total_len as usize))
        }
        ETH_P_IPV6 => {
            let h = f.read::<[u32; 10]>(ETH_HLEN)?;
            let b = h[1].to_ne_bytes();
            if b[2] != IPPROTO_TCP {
                return None;
            }
            seg.peer = match direction {
                Direction::Rx => [h[2], h[3], h[4], h[5]],
                Direction::Tx => [h[6], h[7], h[8], h[9]],
            };
            seg.peer_family = family::V6;
            let payload = u16::from_be_bytes([b[0], b[1]]) as usize;
            (ETH_HLEN + 40, ip_end(ETH_HLEN + 40, payload))
        }
        _ => return None,
    };
    let tcp = f.read::<[u8; 14]>(l4_off)?;
    let (source, destination) = (
        u16::from_be_bytes([tcp[0], tcp[1]]),
        u16::from_be_bytes([tcp[2], tcp[3]]),
    );
    if source != crate::BGP_PORT && destination != crate::BGP_PORT {
        return None;
    }
    seg.flags = tcp[13];
    let data_offset = ((tcp[12] >> 4) as usize) * 4;
    let message = l4_off + data_offset;
    // A header is 19 bytes: a marker of 16 all-ones bytes, the length, the
    // type.
    if data_offset < 20 || message + 19 > ip_end {
        return Some(seg);
    }
    let Some(marker) = f.read::<[u32; 4]>(message) else {
        return Some(seg);
    };
    if marker != [u32::MAX; 4] {
        return Some(seg);
    }
    let Some(header) = f.read::<[u8; 3]>(message + 16) else {
        return Some(seg);
    };
    seg.message = header[2];
    // After the header: a NOTIFICATION's code and subcode; an OPEN's
    // version (1 byte), AS (2) and hold time (2).
    if seg.message == crate::bgp_message::NOTIFICATION
        && let Some(code) = f.read::<[u8; 2]>(message + 19)
    {
        seg.notification = u16::from_be_bytes(code);
    } else if seg.message == crate::bgp_message::OPEN
        && let Some(hold) = f.read::<[u8; 2]>(message + 22)
    {
        seg.hold_time = u16::from_be_bytes(hold);
    }
    Some(seg)
}

/// End of the IP packet whose length field says `len` bytes after `start`.
/// A zero length (BIG TCP, IPv6 jumbograms) means "larger than the field
/// can say": the end is reported beyond any linear buffer.
#[inline(always)]
fn ip_end(start: usize, len: usize) -> usize {
    if len == 0 { 1 << 20 } else { start + len }
}

/// Whether the outer IP packet is a fragment.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fragment {
    No,
    /// Offset 0, more fragments follow: the L4 header is present.
    First,
    /// Offset > 0: no L4 header.
    Later,
}

/// Why `size` bytes at `off` could not be read: the frame is `short`, or
/// they lie past [`HEADER_WINDOW`], where the parser never reads
/// ([`Unclassified::BeyondWindow`]: a frame with a long IPv6 extension
/// header is whole, and tcpdump follows it). Decided on the offset alone,
/// so that every hook and replay agree whatever length each one sees.
#[inline(always)]
fn missing(off: usize, size: usize, short: Unclassified) -> Unclassified {
    if off + size > HEADER_WINDOW {
        Unclassified::BeyondWindow
    } else {
        short
    }
}

/// Follows IPv6 extension headers to the upper-layer protocol.
#[inline(always)]
fn ipv6_payload<F: Frame>(
    f: &F,
    mut off: usize,
    mut next: u8,
) -> Result<(usize, u8, Fragment), Unclassified> {
    let mut fragment = Fragment::No;
    for _ in 0..MAX_IPV6_EXT {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH => {
                let Some(ext) = f.read::<[u8; 2]>(off) else {
                    return Err(missing(off, 2, Unclassified::TruncatedL3));
                };
                off += if next == IPPROTO_AH {
                    (ext[1] as usize + 2) * 4
                } else {
                    (ext[1] as usize + 1) * 8
                };
                // The whole header must be present (two-byte probe, as for
                // IPv4 options).
                if f.read::<[u8; 2]>(off - 2).is_none() {
                    return Err(missing(off - 2, 2, Unclassified::TruncatedL3));
                }
                next = ext[0];
            }
            IPPROTO_FRAGMENT => {
                let Some(ext) = f.read::<[u16; 4]>(off) else {
                    return Err(missing(off, 8, Unclassified::TruncatedL3));
                };
                next = ext[0].to_ne_bytes()[0];
                off += 8;
                if u16::from_be(ext[1]) & 0xfff8 != 0 {
                    return Ok((off, next, Fragment::Later));
                }
                fragment = Fragment::First;
            }
            _ => return Ok((off, next, fragment)),
        }
    }
    match next {
        IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH | IPPROTO_FRAGMENT => {
            Err(Unclassified::Unsupported)
        }
        _ => Ok((off, next, fragment)),
    }
}

/// The encapsulation a UDP header's `source` and `destination` ports (as
/// on the wire) name: the destination port's, else the source port's when
/// that port's entry asks for source matches.
#[inline(always)]
fn udp_proto<P: PortTable>(source: u16, destination: u16, table: &P) -> Proto {
    let mut tag = table.tag(u16::from_be(destination));
    if tag == 0 {
        let source_tag = table.tag(u16::from_be(source));
        if source_tag & PORT_MATCH_SOURCE != 0 {
            tag = source_tag;
        }
    }
    Proto::from_u8(tag & PORT_PROTO_MASK)
}

#[inline(always)]
fn udp<F: Frame, P: PortTable>(f: &F, off: usize, table: &P) -> Result<Encap, Unclassified> {
    let Some(ports) = f.read::<[u16; 4]>(off) else {
        return Err(missing(off, UDP_HLEN, Unclassified::TruncatedL4));
    };
    let proto = udp_proto(ports[0], ports[1], table);
    let hdr_off = off + UDP_HLEN;
    let (inner, inner_off) = match proto {
        Proto::Other => return Ok(Encap::plain()),
        Proto::Wireguard => {
            // Message type and reserved bytes.
            if f.read::<[u8; 4]>(hdr_off).is_none() {
                return Err(missing(hdr_off, 4, Unclassified::TruncatedEncap));
            }
            return Ok(Encap {
                proto,
                vni: 0,
                flags: 0,
                inner: Inner::None,
                inner_off: 0,
            });
        }
        _ => (Inner::None, hdr_off + VXLAN_HLEN),
    };
    let Some(h) = f.read::<EncapHdr>(hdr_off) else {
        return Err(missing(
            hdr_off,
            core::mem::size_of::<EncapHdr>(),
            Unclassified::TruncatedEncap,
        ));
    };
    let vni = u32::from_be(h.vni_reserved) >> 8;
    let (inner, inner_off) = match proto {
        Proto::Vxlan => (Inner::Ethernet, inner_off),
        // Next Protocol: 1 IPv4, 2 IPv6, 3 Ethernet.
        Proto::VxlanGpe => (
            match h.b[3] {
                1 => Inner::Ipv4,
                2 => Inner::Ipv6,
                3 => Inner::Ethernet,
                _ => Inner::None,
            },
            inner_off,
        ),
        Proto::Geneve => (
            inner_of_ethertype(u16::from_be_bytes([h.b[2], h.b[3]])),
            hdr_off + GENEVE_HLEN + ((h.b[0] & 0x3f) as usize) * 4,
        ),
        _ => (inner, inner_off),
    };
    Ok(Encap {
        proto,
        vni,
        flags: h.b[0],
        inner,
        inner_off,
    })
}

#[inline(always)]
fn inner_of_ethertype(eth_type: u16) -> Inner {
    match eth_type {
        ETH_P_TEB => Inner::Ethernet,
        ETH_P_IP => Inner::Ipv4,
        ETH_P_IPV6 => Inner::Ipv6,
        _ => Inner::None,
    }
}

#[inline(always)]
fn gre<F: Frame>(f: &F, off: usize) -> Result<Encap, Unclassified> {
    let Some(h) = f.read::<[u8; GRE_HLEN]>(off) else {
        return Err(missing(off, GRE_HLEN, Unclassified::TruncatedEncap));
    };
    let mut encap = Encap {
        proto: Proto::Gre,
        vni: 0,
        flags: 0,
        inner: Inner::None,
        inner_off: 0,
    };
    // Version 0 only: checksum (C), key (K) and sequence (S) each add 4 bytes.
    if h[1] & 0x07 == 0 {
        let optional = (h[0] >> 7) + ((h[0] >> 5) & 1) + ((h[0] >> 4) & 1);
        encap.inner = inner_of_ethertype(u16::from_be_bytes([h[2], h[3]]));
        encap.inner_off = off + GRE_HLEN + (optional as usize) * 4;
    }
    Ok(encap)
}

/// Records the inner addresses; a short or non-IP inner packet leaves the
/// sample empty, but the outer classification stands.
#[inline(always)]
fn inner_headers<F: Frame>(f: &F, mut inner: Inner, mut off: usize, c: &mut Classified) {
    if inner == Inner::Ethernet {
        let Some(t) = f.read::<u16>(off + 12) else {
            return;
        };
        inner = inner_of_ethertype(u16::from_be(t));
        off += ETH_HLEN;
    }
    match inner {
        Inner::Ipv4 => {
            if let Some(h) = f.read::<Ipv4Hdr>(off)
                && h.version_ihl >> 4 == 4
            {
                c.inner_src[0] = h.src;
                c.inner_dst[0] = h.dst;
                c.inner_family = family::V4;
                c.l4_off = off + ((h.version_ihl & 0x0f) as usize) * 4;
                c.l4_proto = h.proto;
                // Probes are IPv4 ICMP: the payload is read only there, as
                // two words compared one by one (an array compare may
                // become a memcmp call, which eBPF does not have).
                c.probe = h.proto == IPPROTO_ICMP
                    && f.read::<[u32; 2]>(c.l4_off + 8)
                        .is_some_and(|w| w[0] == PROBE_WORDS[0] && w[1] == PROBE_WORDS[1]);
            }
        }
        Inner::Ipv6 => {
            if let Some(h) = f.read::<Ipv6Hdr>(off)
                && u32::from_be(h.version_flow) >> 28 == 6
            {
                c.inner_src = h.src;
                c.inner_dst = h.dst;
                c.inner_family = family::V6;
                c.l4_off = off + 40;
                c.l4_proto = h.next_header;
            }
        }
        _ => {}
    }
}

/// Whether the drop checks concern a classified frame: a tunnel packet
/// (classifier reasons), or an ICMP / ICMPv6 packet that may quote one
/// (`path_mtu`).
#[inline(always)]
pub fn needs_checks(c: &Classified) -> bool {
    c.proto != Proto::Other
        || (c.reason == Unclassified::None
            && c.l4_off != 0
            && (c.l4_proto == IPPROTO_ICMP || c.l4_proto == IPPROTO_ICMPV6))
}

/// Plain (not tunnelled) TCP from or to port 179: the frames the BGP
/// program counts. Only the ports are read here (in the hook, where every
/// read is verified once per state the classifier ends in); the BGP
/// program parses the rest.
#[inline(always)]
pub fn plain_bgp<F: Frame>(f: &F, c: &Classified) -> bool {
    if c.proto != Proto::Other
        || c.reason != Unclassified::None
        || c.l4_off == 0
        || c.l4_proto != IPPROTO_TCP
    {
        return false;
    }
    f.read::<[u16; 2]>(c.l4_off)
        .is_some_and(|[source, destination]| bgp_ports(source, destination))
}

/// Whether a TCP header's `source` or `destination` port (as on the
/// wire) is the BGP port.
#[inline(always)]
fn bgp_ports(source: u16, destination: u16) -> bool {
    let bgp = crate::BGP_PORT.to_be();
    source == bgp || destination == bgp
}

/// Length of all headers up to the innermost L4 payload, used to count the
/// bytes of a GSO skb's segments (each segment repeats these headers).
/// Returns `None` when the inner L4 header is unknown.
#[inline(always)]
pub fn headers_len<F: Frame>(f: &F, c: &Classified) -> Option<usize> {
    if c.l4_off == 0 {
        return None;
    }
    match c.l4_proto {
        IPPROTO_TCP => {
            let doff = f.read::<[u8; 2]>(c.l4_off + 12)?;
            Some(c.l4_off + ((doff[0] >> 4) as usize) * 4)
        }
        IPPROTO_UDP => Some(c.l4_off + UDP_HLEN),
        _ => Some(c.l4_off),
    }
}

/// A router's "fragmentation needed" (ICMP 3/4) or "packet too big"
/// (ICMPv6 2) error about a tunnel packet this node sent: returns the
/// quoted packet classified as sent (peer = its destination, the tunnel
/// peer), with the next-hop MTU the router reported in `vni`. `None` for
/// any other packet.
///
/// Only the quoted outer headers are read (RFC 792 guarantees the IP header
/// and 8 bytes after it): enough for the IP protocol or the UDP port that
/// names the encapsulation.
#[inline(always)]
pub fn too_big<F: Frame, P: PortTable>(f: &F, c: &Classified, ports: &P) -> Option<Classified> {
    if c.proto != Proto::Other || c.reason != Unclassified::None || c.l4_off == 0 {
        return None;
    }
    let icmp = f.read::<[u16; 4]>(c.l4_off)?;
    let [kind, code] = icmp[0].to_ne_bytes();
    let quoted_off = c.l4_off + ICMP_HLEN;
    let mut q = Classified::unclassified(Unclassified::None);
    let (quoted_l4_off, quoted_proto) = match c.l4_proto {
        IPPROTO_ICMP if kind == 3 && code == 4 => {
            q.vni = u16::from_be(icmp[3]) as u32;
            let h = f.read::<Ipv4Hdr>(quoted_off)?;
            if h.version_ihl >> 4 != 4 {
                return None;
            }
            q.peer[0] = h.dst;
            q.peer_family = family::V4;
            (quoted_off + ((h.version_ihl & 0x0f) as usize) * 4, h.proto)
        }
        IPPROTO_ICMPV6 if kind == 2 => {
            q.vni = ((u16::from_be(icmp[2]) as u32) << 16) | u16::from_be(icmp[3]) as u32;
            let h = f.read::<Ipv6Hdr>(quoted_off)?;
            q.peer = h.dst;
            q.peer_family = family::V6;
            (quoted_off + 40, h.next_header)
        }
        _ => return None,
    };
    q.proto = match quoted_proto {
        IPPROTO_IPIP => Proto::Ipip,
        IPPROTO_IPV6 => Proto::Ip6ip,
        IPPROTO_GRE => Proto::Gre,
        IPPROTO_UDP => {
            let quoted_ports = f.read::<[u16; 2]>(quoted_l4_off)?;
            Proto::from_u8(ports.tag(u16::from_be(quoted_ports[1])) & PORT_PROTO_MASK)
        }
        _ => Proto::Other,
    };
    if q.proto == Proto::Other {
        return None;
    }
    Some(q)
}
