//! The building blocks a per-packet design can use, measured on this
//! kernel: one lookup that hits, plus an increment of the value, in each
//! candidate map type, as an XDP program over the trivial `xdp_pass`; and
//! whether the verifier inlined the lookup (its translated program is
//! longer than the one loaded, because `map_gen_lookup` replaced the
//! helper call with instructions).
//!
//! Programs and maps are made with raw `bpf(2)` calls: aya loads programs
//! only from ELF objects, and a second eBPF crate for a few instructions
//! would need its own nightly + bpf-linker build.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

use observer::bpf::testrun;

use super::{median_over, report};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_F_NO_PREALLOC: u32 = 1;
/// `XDP_PASS`.
pub const XDP_PASS: u32 = 2;

/// `struct bpf_insn`: opcode, dst/src registers (4 bits each), offset, immediate.
#[repr(C)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

impl Insn {
    /// One instruction; `regs` is `dst | src << 4`.
    pub const fn new(code: u8, regs: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs,
            off,
            imm,
        }
    }
}

/// The smallest valid XDP program, `r0 = XDP_PASS; exit`: its time is the
/// floor BPF_PROG_TEST_RUN itself costs per run.
pub fn load_xdp_pass() -> io::Result<OwnedFd> {
    load_raw_xdp(
        b"xdp_pass",
        &[
            // BPF_ALU64 | BPF_MOV | BPF_K: r0 = 2 (XDP_PASS)
            Insn::new(0xb7, 0, 0, XDP_PASS as i32),
            // BPF_JMP | BPF_EXIT
            Insn::new(0x95, 0, 0, 0),
        ],
    )
}

/// Loads a tc program for tcx ingress that only returns TC_ACT_UNSPEC
/// (-1, "next program / default action", the observer's own verdict): the
/// tcx counterpart of [`load_xdp_pass`].
pub fn load_tc_pass() -> io::Result<OwnedFd> {
    ProbeHook::Tcx.load(
        b"tc_pass",
        &[
            // BPF_ALU64 | BPF_MOV | BPF_K: r0 = -1 (TC_ACT_UNSPEC)
            Insn::new(0xb7, 0, 0, ProbeHook::Tcx.pass()),
            // BPF_JMP | BPF_EXIT
            Insn::new(0x95, 0, 0, 0),
        ],
    )
}

/// Where a hand-written program runs: XDP, or tc ingress through tcx.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ProbeHook {
    /// `BPF_PROG_TYPE_XDP`, native or generic.
    Xdp,
    /// `BPF_PROG_TYPE_SCHED_CLS` for `BPF_TCX_INGRESS`.
    Tcx,
}

impl ProbeHook {
    /// Offsets of the frame's start and end pointers in the context
    /// (`struct xdp_md`, `struct __sk_buff`).
    fn bounds(self) -> (i16, i16) {
        match self {
            ProbeHook::Xdp => (0, 4),
            ProbeHook::Tcx => (76, 80),
        }
    }

    /// The verdict that passes the frame on unchanged.
    fn pass(self) -> i32 {
        match self {
            ProbeHook::Xdp => XDP_PASS as i32,
            ProbeHook::Tcx => -1,
        }
    }

    /// Loads `insns` as a program of this hook.
    fn load(self, prog_name: &[u8], insns: &[Insn]) -> io::Result<OwnedFd> {
        const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
        const BPF_TCX_INGRESS: u32 = 46;
        match self {
            ProbeHook::Xdp => load_raw_xdp(prog_name, insns),
            ProbeHook::Tcx => load_raw(BPF_PROG_TYPE_SCHED_CLS, BPF_TCX_INGRESS, prog_name, insns),
        }
    }
}

/// Loads an XDP program from raw instructions.
pub fn load_raw_xdp(prog_name: &[u8], insns: &[Insn]) -> io::Result<OwnedFd> {
    load_raw(BPF_PROG_TYPE_XDP, 0, prog_name, insns)
}

/// An empty program (`r0 = 0; exit`) on the skb:kfree_skb tracepoint, the
/// observer's drop hook, attached: its run time per event is the floor
/// any kfree_skb program costs on this kernel (the trampoline into BPF,
/// and with kernel.bpf_stats_enabled the stats' own clock reads). Returns
/// the program, its id and the attachment (detached when dropped).
pub fn attach_kfree_skb_floor() -> anyhow::Result<(OwnedFd, u32, OwnedFd)> {
    let prog = load_empty_tracepoint("kfree_skb", b"kfree_floor")?;
    let link = attach_tracepoint(prog.as_fd())?;
    let id = prog_info(prog.as_fd())?.0;
    Ok((prog, id, link))
}

/// Loads an empty program (`r0 = 0; exit`) for the kernel tracepoint
/// `tracepoint` (a BTF-typed raw tracepoint, as the observer's drop hook).
pub fn load_empty_tracepoint(tracepoint: &str, prog_name: &[u8]) -> anyhow::Result<OwnedFd> {
    const BPF_PROG_TYPE_TRACING: u32 = 26;
    const BPF_TRACE_RAW_TP: u32 = 23;
    let btf = aya::Btf::from_sys_fs()?;
    let target = btf.id_by_type_name_kind(
        &format!("btf_trace_{tracepoint}"),
        aya_obj::btf::BtfKind::Typedef,
    )?;
    Ok(load_program(
        BPF_PROG_TYPE_TRACING,
        BPF_TRACE_RAW_TP,
        target,
        prog_name,
        &[Insn::new(0xb7, 0, 0, 0), Insn::new(0x95, 0, 0, 0)],
    )?)
}

/// Attaches a program of [`load_empty_tracepoint`] to its tracepoint;
/// closing the returned descriptor detaches it.
pub fn attach_tracepoint(prog: BorrowedFd) -> io::Result<OwnedFd> {
    const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
    #[repr(C)]
    struct RawTracepointOpenAttr {
        name: u64,
        prog_fd: u32,
        _pad: u32,
    }
    bpf(
        BPF_RAW_TRACEPOINT_OPEN,
        &RawTracepointOpenAttr {
            name: 0,
            prog_fd: prog.as_raw_fd() as u32,
            _pad: 0,
        },
    )
}

/// Loads a program of `prog_type` from raw instructions.
fn load_raw(
    prog_type: u32,
    expected_attach_type: u32,
    prog_name: &[u8],
    insns: &[Insn],
) -> io::Result<OwnedFd> {
    load_program(prog_type, expected_attach_type, 0, prog_name, insns)
}

/// Loads a program of `prog_type` from raw instructions, for the kernel
/// BTF type `attach_btf_id` when it is a tracing program (else 0).
fn load_program(
    prog_type: u32,
    expected_attach_type: u32,
    attach_btf_id: u32,
    prog_name: &[u8],
    insns: &[Insn],
) -> io::Result<OwnedFd> {
    /// The leading fields of `union bpf_attr` for BPF_PROG_LOAD (uapi
    /// linux/bpf.h); the kernel treats the fields not passed as zero.
    #[repr(C)]
    struct ProgLoadAttr {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
        prog_ifindex: u32,
        expected_attach_type: u32,
        prog_btf_fd: u32,
        func_info_rec_size: u32,
        func_info: u64,
        func_info_cnt: u32,
        line_info_rec_size: u32,
        line_info: u64,
        line_info_cnt: u32,
        attach_btf_id: u32,
    }
    let license = c"GPL";
    let mut name = [0u8; 16];
    name[..prog_name.len()].copy_from_slice(prog_name);
    let attr = ProgLoadAttr {
        prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
        prog_ifindex: 0,
        expected_attach_type,
        prog_btf_fd: 0,
        func_info_rec_size: 0,
        func_info: 0,
        func_info_cnt: 0,
        line_info_rec_size: 0,
        line_info: 0,
        line_info_cnt: 0,
        attach_btf_id,
    };
    bpf(BPF_PROG_LOAD, &attr)
}

/// `bpf(cmd, attr)` returning a new descriptor.
fn bpf<T>(cmd: libc::c_long, attr: &T) -> io::Result<OwnedFd> {
    // SAFETY: attr and the buffers it points to outlive the call; the size
    // passed is the struct's.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            std::mem::size_of::<T>() as u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `bpf(cmd, attr)` for commands that return 0.
fn bpf_status<T>(cmd: libc::c_long, attr: &T) -> io::Result<()> {
    // SAFETY: as in `bpf`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            std::mem::size_of::<T>() as u32,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A map type under test.
struct MapType {
    name: &'static str,
    map_type: u32,
    key: Key,
    flags: u32,
    /// Prefixes in the trie (LPM only).
    prefixes: u32,
}

/// The shape of a key, and so of the program's stack set-up.
#[derive(Clone, Copy)]
enum Key {
    /// A u32 array index 0.
    Index,
    /// A zeroed 28-byte key, the size of the observer's `FlowKey`.
    Flow,
    /// An LPM key: prefix length 32 and an IPv4 address.
    Lpm,
}

impl Key {
    fn size(self) -> u32 {
        match self {
            Key::Index => 4,
            Key::Flow => std::mem::size_of::<observer_common::FlowKey>() as u32,
            Key::Lpm => 8,
        }
    }

    /// The key bytes userspace inserts (and the program looks up).
    fn bytes(self) -> Vec<u8> {
        match self {
            Key::Index => vec![0; 4],
            Key::Flow => vec![0; self.size() as usize],
            Key::Lpm => [32u32.to_ne_bytes(), LPM_MEMBER].concat(),
        }
    }

    /// Instructions writing the key on the stack; returns them and the
    /// key's stack offset.
    fn setup(self) -> (Vec<Insn>, i32) {
        match self {
            // *(u32 *)(r10 - 4) = 0
            Key::Index => (vec![Insn::new(0x62, 10, -4, 0)], -4),
            // *(u64 *)(r10 - n) = 0, 32 bytes
            Key::Flow => (
                (1..=4).map(|i| Insn::new(0x7a, 10, -8 * i, 0)).collect(),
                -32,
            ),
            Key::Lpm => (
                vec![
                    Insn::new(0x62, 10, -8, 32),
                    Insn::new(0x62, 10, -4, i32::from_ne_bytes(LPM_MEMBER)),
                ],
                -8,
            ),
        }
    }
}

/// The address the LPM program looks up (a /32 member, like a Calico node).
const LPM_MEMBER: [u8; 4] = [198, 18, 0, 2];

const MAP_TYPES: &[MapType] = &[
    MapType {
        name: "array",
        map_type: 2,
        key: Key::Index,
        flags: 0,
        prefixes: 0,
    },
    MapType {
        name: "percpu_array",
        map_type: 6,
        key: Key::Index,
        flags: 0,
        prefixes: 0,
    },
    MapType {
        name: "hash",
        map_type: 1,
        key: Key::Flow,
        flags: 0,
        prefixes: 0,
    },
    MapType {
        name: "percpu_hash",
        map_type: 5,
        key: Key::Flow,
        flags: 0,
        prefixes: 0,
    },
    MapType {
        name: "lru_hash",
        map_type: 9,
        key: Key::Flow,
        flags: 0,
        prefixes: 0,
    },
    MapType {
        name: "lru_percpu_hash",
        map_type: 10,
        key: Key::Flow,
        flags: 0,
        prefixes: 0,
    },
    MapType {
        name: "lpm_10",
        map_type: 11,
        key: Key::Lpm,
        flags: BPF_F_NO_PREALLOC,
        prefixes: 10,
    },
    MapType {
        name: "lpm_1000",
        map_type: 11,
        key: Key::Lpm,
        flags: BPF_F_NO_PREALLOC,
        prefixes: 1_000,
    },
    MapType {
        name: "lpm_10000",
        map_type: 11,
        key: Key::Lpm,
        flags: BPF_F_NO_PREALLOC,
        prefixes: 10_000,
    },
];

/// Measures every map type: `map_NAME_over_pass` (ns per lookup + add over
/// `xdp_pass`) and `map_NAME_inlined` (1 when the verifier inlined the
/// lookup on this kernel). `lru_lookup_over_pass` repeats the per-CPU LRU
/// figure under the name earlier runs used.
pub fn run(frame: &[u8], pass: BorrowedFd<'_>, repeat: u32, rounds: usize) -> anyhow::Result<()> {
    let mut loaded = Vec::new();
    for t in MAP_TYPES {
        let map = create_map(t)?;
        let (prog, insns) = load_probe(t, map.as_fd())?;
        let inlined = translated_len(prog.as_fd())? > insns;
        let r = testrun::run(prog.as_fd(), frame, None, 1)?;
        anyhow::ensure!(
            r.retval == XDP_PASS,
            "map_{}: returned {}",
            t.name,
            r.retval
        );
        loaded.push((t, map, prog, inlined));
    }
    let mut samples = vec![Vec::with_capacity(rounds); loaded.len() + 1];
    for _ in 0..rounds {
        samples[0].push(f64::from(
            testrun::run(pass, frame, None, repeat)?.duration_ns,
        ));
        for ((_, _, prog, _), s) in loaded.iter().zip(&mut samples[1..]) {
            s.push(f64::from(
                testrun::run(prog.as_fd(), frame, None, repeat)?.duration_ns,
            ));
        }
    }
    let (floor, probes) = samples.split_first().expect("the floor's samples");
    for ((t, _, _, inlined), s) in loaded.iter().zip(probes) {
        let over = median_over(s, floor);
        report(
            &format!("map_{}_over_pass", t.name),
            format!("{over:.1}"),
            "ns/pkt",
        );
        report(
            &format!("map_{}_inlined", t.name),
            u8::from(*inlined),
            "bool",
        );
        if t.name == "lru_percpu_hash" {
            report("lru_lookup_over_pass", format!("{over:.1}"), "ns/pkt");
        }
    }
    Ok(())
}

/// Creates the map of `t` with the key the program looks up (and, for LPM,
/// `t.prefixes - 1` other /24 prefixes).
fn create_map(t: &MapType) -> anyhow::Result<OwnedFd> {
    let max_entries = match t.key {
        Key::Index => 1,
        Key::Flow => observer_common::DEFAULT_MAX_FLOWS,
        Key::Lpm => t.prefixes,
    };
    let map = create(t.map_type, t.key.size(), 8, max_entries, t.flags)?;
    let mut keys = vec![t.key.bytes()];
    for i in 1..t.prefixes {
        let network = (0x0a00_0000u32 | (i << 8)).to_be_bytes();
        keys.push([24u32.to_ne_bytes(), network].concat());
    }
    // Large enough for a per-CPU value on any machine (8 bytes a CPU).
    let value = vec![0u8; 8 * 8192];
    for key in keys {
        update(map.as_fd(), &key, &value)?;
    }
    Ok(map)
}

fn update(map: BorrowedFd<'_>, key: &[u8], value: &[u8]) -> io::Result<()> {
    #[repr(C)]
    struct UpdateAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    bpf_status(
        BPF_MAP_UPDATE_ELEM,
        &UpdateAttr {
            map_fd: map.as_raw_fd() as u32,
            _pad: 0,
            key: key.as_ptr() as u64,
            value: value.as_ptr() as u64,
            flags: 0,
        },
    )
}

/// An XDP program that looks the key up in `map`, adds 1 to the value it
/// finds and passes. Returns it and its length in instructions.
fn load_probe(t: &MapType, map: BorrowedFd<'_>) -> anyhow::Result<(OwnedFd, usize)> {
    let (mut insns, key_off) = t.key.setup();
    insns.extend([
        // r1 = map (ld_imm64 with src_reg BPF_PSEUDO_MAP_FD), two slots.
        Insn::new(0x18, 1 | (1 << 4), 0, map.as_raw_fd()),
        Insn::new(0, 0, 0, 0),
        // r2 = r10 + key_off
        Insn::new(0xbf, 2 | (10 << 4), 0, 0),
        Insn::new(0x07, 2, 0, key_off),
        // call bpf_map_lookup_elem
        Insn::new(0x85, 0, 0, 1),
        // if r0 == 0 goto +3
        Insn::new(0x15, 0, 3, 0),
        // r1 = *(u64 *)(r0 + 0); r1 += 1; *(u64 *)(r0 + 0) = r1
        Insn::new(0x79, 1, 0, 0),
        Insn::new(0x07, 1, 0, 1),
        Insn::new(0x7b, 1 << 4, 0, 0),
        Insn::new(0xb7, 0, 0, XDP_PASS as i32),
        Insn::new(0x95, 0, 0, 0),
    ]);
    let name = format!("map_{}", t.name);
    let prog = load_raw_xdp(&name.as_bytes()[..name.len().min(15)], &insns)?;
    Ok((prog, insns.len()))
}

/// Length of the program as the verifier rewrote it, in instructions.
fn translated_len(prog: BorrowedFd<'_>) -> io::Result<usize> {
    Ok(prog_info(prog)?.1 as usize / 8)
}

/// The program's id and its translated length in bytes.
fn prog_info(prog: BorrowedFd<'_>) -> io::Result<(u32, u32)> {
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    // The leading fields of `struct bpf_prog_info`: type, id, tag[8],
    // jited_prog_len, xlated_prog_len. The kernel fills at most info_len.
    let mut info = [0u8; 24];
    bpf_status(
        BPF_OBJ_GET_INFO_BY_FD,
        &InfoAttr {
            bpf_fd: prog.as_raw_fd() as u32,
            info_len: info.len() as u32,
            info: info.as_mut_ptr() as u64,
        },
    )?;
    let id = u32::from_ne_bytes([info[4], info[5], info[6], info[7]]);
    let xlated = u32::from_ne_bytes([info[20], info[21], info[22], info[23]]);
    Ok((id, xlated))
}

/// Measures `plain_floor_over_pass` and `vxlan_floor_over_pass`: the
/// least an early exit for plain traffic and for VXLAN can cost on this
/// kernel, to read `plain_over_pass` and `vxlan_over_pass` against.
///
/// The plain probe does only what any design must on the bench's plain
/// UDP frame: bounds check, Ethernet type IPv4, IHL 5, protocol UDP, both
/// ports looked up in a port table (a destination or source port may name
/// a tunnel), and one per-CPU array slot's packets and bytes added. It
/// skips what the observer's parser also handles (VLAN tags, IPv4
/// options, IPv6, fragments, multi-buffer frames, the interface's slot).
///
/// The VXLAN probe does only what any design must on the bench's VXLAN
/// frame: bounds check, Ethernet type IPv4, IHL 5, not a fragment,
/// protocol UDP, the destination port looked up in a port table, the I
/// flag, inner Ethernet type IPv4, inner IHL 5 and not ICMP (a probe),
/// then one per-CPU array slot found by a hash of the source and VNI, the
/// key compared, and its packets and bytes added. It skips what the
/// observer also does: the source port's entry, IPv6, the interface and
/// direction in the key, the inner sample, the allow-set verdict's
/// generation and the VNI and MTU checks, multi-buffer lengths.
pub fn floors(
    plain: &[u8],
    vxlan: &[u8],
    pass: BorrowedFd<'_>,
    (repeat, rounds): (u32, usize),
) -> anyhow::Result<()> {
    let ports = create_array(2, 1, 65_536)?;
    let counters = create_array(6, 16, 1)?;
    let prog = load_xdp_raw_floor(ports.as_fd(), counters.as_fd())?;
    floor_over_pass(
        "plain_floor_over_pass",
        prog.as_fd(),
        plain,
        pass,
        (repeat, rounds),
    )?;
    let prog = load_vxlan_floor(ProbeHook::Xdp)?;
    floor_over_pass(
        "vxlan_floor_over_pass",
        prog.as_fd(),
        vxlan,
        pass,
        (repeat, rounds),
    )
}

/// Reports `name`: the time of `prog` on `frame` over that of `pass`
/// (median of per-round differences, `median_over`), in interleaved rounds, after one run that must pass the frame
/// (and claims what the probe claims on first sight).
fn floor_over_pass(
    name: &str,
    prog: BorrowedFd<'_>,
    frame: &[u8],
    pass: BorrowedFd<'_>,
    (repeat, rounds): (u32, usize),
) -> anyhow::Result<()> {
    let r = testrun::run(prog, frame, None, 1)?;
    anyhow::ensure!(r.retval == XDP_PASS, "{name}: returned {}", r.retval);
    let mut floor = Vec::with_capacity(rounds);
    let mut probe = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        floor.push(f64::from(
            testrun::run(pass, frame, None, repeat)?.duration_ns,
        ));
        probe.push(f64::from(
            testrun::run(prog, frame, None, repeat)?.duration_ns,
        ));
    }
    let over = median_over(&probe, &floor);
    report(name, format!("{over:.1}"), "ns/pkt");
    Ok(())
}

/// An array map (`map_type` 2 array, 6 per-CPU array) of `entries` values
/// of `value_size` bytes, all zero.
fn create_array(map_type: u32, value_size: u32, entries: u32) -> io::Result<OwnedFd> {
    create(map_type, 4, value_size, entries, 0)
}

/// `BPF_MAP_CREATE` of a map of `map_type`.
fn create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
) -> io::Result<OwnedFd> {
    #[repr(C)]
    struct MapCreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }
    bpf(
        BPF_MAP_CREATE,
        &MapCreateAttr {
            map_type,
            key_size,
            value_size,
            max_entries,
            map_flags,
        },
    )
}

/// `r1 = map` (ld_imm64 with src_reg BPF_PSEUDO_MAP_FD), two slots.
fn push_map(code: &mut Vec<Insn>, fd: BorrowedFd<'_>) {
    code.push(Insn::new(0x18, 1 | (1 << 4), 0, fd.as_raw_fd()));
    code.push(Insn::new(0, 0, 0, 0));
}

/// `r0 = bpf_map_lookup_elem(map, r10 + key_at)`, leaving the probe
/// (a jump recorded in `to_exit`) when it finds nothing.
fn push_lookup(code: &mut Vec<Insn>, to_exit: &mut Vec<usize>, map: BorrowedFd<'_>, key_at: i32) {
    push_map(code, map);
    code.push(Insn::new(0xbf, 2 | (10 << 4), 0, 0));
    code.push(Insn::new(0x07, 2, 0, key_at));
    code.push(Insn::new(0x85, 0, 0, 1));
    to_exit.push(code.len());
    code.push(Insn::new(0x15, 0, 0, 0));
}

/// The port at `offset` of the frame (r6 = data) looked up in the port
/// table `ports`: leaves the probe (jumps recorded in `to_exit`) when the
/// lookup fails, and when the port's tag is nonzero (a tunnel port) unless
/// `tunnel`, or zero if `tunnel`.
fn push_port_lookup(
    code: &mut Vec<Insn>,
    to_exit: &mut Vec<usize>,
    ports: BorrowedFd<'_>,
    offset: i16,
    tunnel: bool,
) {
    // r2 = *(u16 *)(r6 + offset); r2 = be16 r2; *(u32 *)(r10 - 4) = r2
    code.push(Insn::new(0x69, 2 | (6 << 4), offset, 0));
    code.push(Insn::new(0xdc, 2, 0, 16));
    code.push(Insn::new(0x63, 10 | (2 << 4), -4, 0));
    push_lookup(code, to_exit, ports, -4);
    // r2 = *(u8 *)(r0 + 0); exit on the wrong tag
    code.push(Insn::new(0x71, 2, 0, 0));
    to_exit.push(code.len());
    code.push(Insn::new(if tunnel { 0x15 } else { 0x55 }, 2, 0, 0));
}

/// A probe's first instructions, and the jumps to its exit so far: loads
/// the frame bounds (r6 = data, r7 = data_end) and leaves the probe unless
/// `len` bytes are there; then each (load opcode, offset, value) of
/// `fields` must read `value` (multi-byte fields as read little-endian);
/// then r7 is the frame's length.
fn prologue(hook: ProbeHook, len: i32, fields: &[(u8, i16, i32)]) -> (Vec<Insn>, Vec<usize>) {
    let mut code = Vec::new();
    let mut to_exit = Vec::new();
    let (data, data_end) = hook.bounds();
    code.extend([
        Insn::new(0x61, 6 | (1 << 4), data, 0),
        Insn::new(0x61, 7 | (1 << 4), data_end, 0),
        Insn::new(0xbf, 2 | (6 << 4), 0, 0),
        Insn::new(0x07, 2, 0, len),
    ]);
    // if r2 > r7 goto exit
    to_exit.push(code.len());
    code.push(Insn::new(0x2d, 2 | (7 << 4), 0, 0));
    for &(size, offset, value) in fields {
        code.push(Insn::new(size, 2 | (6 << 4), offset, 0));
        to_exit.push(code.len());
        code.push(Insn::new(0x55, 2, 0, value));
    }
    // r7 = data_end - data: the frame's length.
    code.push(Insn::new(0x1f, 7 | (6 << 4), 0, 0));
    (code, to_exit)
}

/// Appends the probe's exit (`r0 =` the hook's pass verdict), points the
/// jumps in `to_exit` at it and loads the program.
fn finish_probe(
    hook: ProbeHook,
    name: &[u8],
    mut code: Vec<Insn>,
    to_exit: &[usize],
) -> io::Result<OwnedFd> {
    let exit = code.len();
    code.push(Insn::new(0xb7, 0, 0, hook.pass()));
    code.push(Insn::new(0x95, 0, 0, 0));
    for &at in to_exit {
        code[at].off = (exit - at - 1) as i16;
    }
    hook.load(name, &code)
}

/// The plain probe of [`floors`].
fn load_xdp_raw_floor(ports: BorrowedFd<'_>, counters: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // Ethernet, IPv4 without options, UDP: type 0x0800, version 4 + IHL
    // 5, protocol 17.
    let (mut code, mut to_exit) = prologue(
        ProbeHook::Xdp,
        42,
        &[(0x69, 12, 0x0008), (0x71, 14, 0x45), (0x71, 23, 17)],
    );
    push_port_lookup(&mut code, &mut to_exit, ports, 36, false);
    push_port_lookup(&mut code, &mut to_exit, ports, 34, false);
    // *(u32 *)(r10 - 8) = 0: the counters' only slot.
    code.push(Insn::new(0x62, 10, -8, 0));
    push_lookup(&mut code, &mut to_exit, counters, -8);
    push_add(&mut code, 0);
    finish_probe(ProbeHook::Xdp, b"plain_floor", code, &to_exit)
}

/// packets += 1 and bytes += r7 at `at` and `at + 8` of the value r0
/// points to.
fn push_add(code: &mut Vec<Insn>, at: i16) {
    code.extend([
        Insn::new(0x79, 1, at, 0),
        Insn::new(0x07, 1, 0, 1),
        Insn::new(0x7b, 1 << 4, at, 0),
        Insn::new(0x79, 1, at + 8, 0),
        Insn::new(0x0f, 1 | (7 << 4), 0, 0),
        Insn::new(0x7b, 1 << 4, at + 8, 0),
    ]);
}

/// The VXLAN probe of [`floors`] at `hook`, with maps of its own (the
/// program holds them): a port table with VXLAN's port tagged, and 1,024
/// per-CPU slots of source, VNI word, packets and bytes. A slot whose key
/// differs is claimed (a flow's first frame); later frames find their key.
/// The traffic bench attaches it too: the cheapest program that counts
/// the bench's frames per peer.
pub fn load_vxlan_floor(hook: ProbeHook) -> anyhow::Result<OwnedFd> {
    const GOLDEN: u32 = 0x9e37_79b1;
    let ports = create_array(2, 1, 65_536)?;
    update(ports.as_fd(), &4789u32.to_ne_bytes(), &[1])?;
    let slots = create_array(6, 24, 1024)?;
    let (ports, slots) = (ports.as_fd(), slots.as_fd());
    // Outer Ethernet, IPv4 without options, UDP, VXLAN, inner Ethernet
    // and IPv4 without options: 84 bytes.
    let (mut code, mut to_exit) = prologue(
        hook,
        84,
        &[
            (0x69, 12, 0x0008),
            (0x71, 14, 0x45),
            (0x71, 23, 17),
            (0x69, 62, 0x0008),
            (0x71, 64, 0x45),
        ],
    );
    code.extend([
        // r2 = *(u16 *)(r6 + 20) & 0x3fff (as read little-endian)
        Insn::new(0x69, 2 | (6 << 4), 20, 0),
        Insn::new(0x57, 2, 0, 0xff3f),
    ]);
    // if r2 != 0 goto exit (a fragment)
    to_exit.push(code.len());
    code.push(Insn::new(0x55, 2, 0, 0));
    // The inner protocol is not ICMP.
    code.push(Insn::new(0x71, 2 | (6 << 4), 73, 0));
    to_exit.push(code.len());
    code.push(Insn::new(0x15, 2, 0, 1));
    // The I flag.
    code.push(Insn::new(0x71, 2 | (6 << 4), 42, 0));
    code.push(Insn::new(0x57, 2, 0, 8));
    to_exit.push(code.len());
    code.push(Insn::new(0x15, 2, 0, 0));
    push_port_lookup(&mut code, &mut to_exit, ports, 36, true);
    code.extend([
        // r8 = source; r9 = VNI word
        Insn::new(0x61, 8 | (6 << 4), 26, 0),
        Insn::new(0x61, 9 | (6 << 4), 46, 0),
        // w2 = (w8 ^ w9) * GOLDEN >> 22; *(u32 *)(r10 - 8) = r2
        Insn::new(0xbc, 2 | (8 << 4), 0, 0),
        Insn::new(0xac, 2 | (9 << 4), 0, 0),
        Insn::new(0x24, 2, 0, GOLDEN as i32),
        Insn::new(0x74, 2, 0, 22),
        Insn::new(0x63, 10 | (2 << 4), -8, 0),
    ]);
    push_lookup(&mut code, &mut to_exit, slots, -8);
    // if *(u32 *)(r0 + 0) != r8 || *(u32 *)(r0 + 4) != r9 goto claim
    let mut to_claim = Vec::new();
    code.push(Insn::new(0x61, 2, 0, 0));
    to_claim.push(code.len());
    code.push(Insn::new(0x5d, 2 | (8 << 4), 0, 0));
    code.push(Insn::new(0x61, 2, 4, 0));
    to_claim.push(code.len());
    code.push(Insn::new(0x5d, 2 | (9 << 4), 0, 0));
    let add = code.len();
    push_add(&mut code, 8);
    to_exit.push(code.len());
    code.push(Insn::new(0x05, 0, 0, 0));
    // claim: the key, then the add.
    let claim = code.len();
    code.push(Insn::new(0x63, 8 << 4, 0, 0));
    code.push(Insn::new(0x63, 9 << 4, 4, 0));
    code.push(Insn::new(
        0x05,
        0,
        (add as i64 - code.len() as i64 - 1) as i16,
        0,
    ));
    for at in to_claim {
        code[at].off = (claim - at - 1) as i16;
    }
    Ok(finish_probe(hook, b"vxlan_floor", code, &to_exit)?)
}
