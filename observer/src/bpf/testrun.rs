//! BPF_PROG_TEST_RUN: runs a loaded program on a frame in the kernel,
//! without a device. Used by tests, `cargo xtask bench` and `observer replay`.
//!
//! Hand-written because aya 0.14 has no test-run API; the attribute layout
//! is the kernel's `union bpf_attr` `test` member (include/uapi/linux/bpf.h).

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
};

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// Size of `struct __sk_buff` (uapi), the context of tc programs.
pub const SKB_CTX_SIZE: usize = 192;
const SKB_GSO_SEGS_OFFSET: usize = 164;
const SKB_GSO_SIZE_OFFSET: usize = 176;

#[repr(C)]
#[derive(Default)]
struct TestAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    // The kernel requires the unused tail of the attribute union to be zero.
    _tail: [u32; 11],
}

/// Outcome of one test run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestRun {
    /// The program's return value (XDP action or tc verdict, as u32).
    pub retval: u32,
    /// Average run time per repetition as measured by the kernel, in ns.
    pub duration_ns: u32,
}

/// Builds a `struct __sk_buff` context for a tc test run describing a GSO
/// skb of `segs` segments of `size` bytes each.
pub fn skb_gso_ctx(segs: u32, size: u32) -> [u8; SKB_CTX_SIZE] {
    let mut ctx = [0u8; SKB_CTX_SIZE];
    ctx[SKB_GSO_SEGS_OFFSET..SKB_GSO_SEGS_OFFSET + 4].copy_from_slice(&segs.to_ne_bytes());
    ctx[SKB_GSO_SIZE_OFFSET..SKB_GSO_SIZE_OFFSET + 4].copy_from_slice(&size.to_ne_bytes());
    ctx
}

/// Runs the program `prog` on `frame` `repeat` times (0 counts as 1), with
/// an optional context (`struct xdp_md` or `struct __sk_buff`).
pub fn run(
    prog: BorrowedFd<'_>,
    frame: &[u8],
    ctx: Option<&[u8]>,
    repeat: u32,
) -> io::Result<TestRun> {
    let mut out = vec![0u8; frame.len() + 256];
    let mut attr = TestAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_size_out: out.len() as u32,
        data_in: frame.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat,
        ..Default::default()
    };
    if let Some(ctx) = ctx {
        attr.ctx_size_in = ctx.len() as u32;
        attr.ctx_in = ctx.as_ptr() as u64;
    }
    // SAFETY: attr points to valid buffers that outlive the call; the size
    // passed is the struct's.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestAttr,
            std::mem::size_of::<TestAttr>() as u32,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TestRun {
        retval: attr.retval,
        duration_ns: attr.duration,
    })
}

/// Pins the calling thread to the CPU it runs on, so that every test run
/// it makes lands in the same per-CPU map values: then a row's inner
/// sample is its latest frame's, as in a single-CPU sequence.
pub fn pin_to_this_cpu() -> io::Result<()> {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 {
        return Err(io::Error::last_os_error());
    }
    pin_to_cpu(cpu as usize)
}

/// Pins the calling thread to `cpu`.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: the set is a zeroed plain struct that CPU_SET writes one bit
    // of, passed with its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
