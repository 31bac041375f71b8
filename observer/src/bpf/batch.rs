//! BPF_MAP_LOOKUP_BATCH: reads a whole per-CPU hash or array map in a few system
//! calls. aya's iterator makes two per entry (next key, then lookup): at
//! 100,000 flows that is 200,000 system calls every interval.
//!
//! Hand-written because aya 0.14 has no batch API; the attribute is the
//! kernel's `union bpf_attr` `batch` member (include/uapi/linux/bpf.h), from
//! aya-obj's bindings. Hash maps have it since 5.6, per-CPU arrays since
//! 5.13 (`cargo xtask vm-test` reads both on every supported kernel);
//! [`lookup_all_percpu`] says when the kernel refuses it, and the caller
//! then walks the map instead.

use std::{
    io,
    mem::size_of,
    os::fd::{AsFd, AsRawFd},
};

use aya::{Pod, maps::MapData};
use aya_obj::generated::{bpf_attr, bpf_cmd};

/// Entries asked for per call: 64 KiB of keys and a few MiB of per-CPU
/// values on a large node, a handful of calls for a full flow map.
const CHUNK: u32 = 1024;

/// Hands every entry of the per-CPU hash or array `map` (keys `K`, values
/// `V` per possible CPU) to `entry`, each key once, as the kernel answers:
/// a large map costs no table of its entries. `Ok(false)` when this kernel
/// has no batch lookup for the map (then nothing was handed; the caller
/// walks it).
pub fn lookup_all_percpu<K: Pod, V: Pod>(
    map: &MapData,
    possible_cpus: usize,
    mut entry: impl FnMut(&K, &[V]),
) -> io::Result<bool> {
    // The kernel lays each CPU's value out at a multiple of 8 bytes.
    let value_stride = size_of::<V>().div_ceil(8) * 8;
    let element_values = value_stride * possible_cpus;
    let mut chunk = CHUNK;
    // The position between calls: a bucket number for hash maps, which
    // the kernel writes to `out_batch` and reads from `in_batch`.
    let mut position: u64 = 0;
    let mut first = true;
    // u64 words keep the buffers 8-byte aligned for the kernel's copies.
    let buffers = |chunk: u32| {
        (
            vec![0u64; (chunk as usize * size_of::<K>()).div_ceil(8)],
            vec![0u64; (chunk as usize * element_values).div_ceil(8)],
        )
    };
    let (mut keys, mut values) = buffers(chunk);
    let mut per_cpu: Vec<V> = Vec::with_capacity(possible_cpus);
    loop {
        let mut next: u64 = 0;
        // SAFETY: all-zero is a valid bpf_attr.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // SAFETY: writing the batch member of the zeroed union.
        let batch = unsafe { &mut attr.batch };
        batch.in_batch = if first {
            0
        } else {
            &position as *const u64 as u64
        };
        batch.out_batch = &mut next as *mut u64 as u64;
        batch.keys = keys.as_mut_ptr() as u64;
        batch.values = values.as_mut_ptr() as u64;
        batch.count = chunk;
        batch.map_fd = map.fd().as_fd().as_raw_fd() as u32;
        // SAFETY: bpf(2) with an initialised attribute whose buffers hold
        // `chunk` keys and values and outlive the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                bpf_cmd::BPF_MAP_LOOKUP_BATCH as libc::c_int,
                &mut attr as *mut bpf_attr,
                size_of::<bpf_attr>() as u32,
            )
        };
        let error = io::Error::last_os_error();
        // SAFETY: reading back the batch member the kernel filled.
        let filled = unsafe { attr.batch.count } as usize;
        let done = match (ret, error.raw_os_error()) {
            (0, _) => false,
            // ENOENT: the last entries are in this answer.
            (_, Some(libc::ENOENT)) => true,
            // ENOSPC: one bucket holds more than `chunk` entries; ask again
            // for more from the same place.
            (_, Some(libc::ENOSPC)) if filled == 0 => {
                chunk = chunk.checked_mul(2).ok_or(error)?;
                (keys, values) = buffers(chunk);
                continue;
            }
            // The kernel has no batch lookup for this map (EINVAL before
            // 5.6, ENOTSUPP 524 from maps without it).
            (_, Some(libc::EINVAL | 524)) if first => return Ok(false),
            _ => return Err(error),
        };
        let key_bytes = bytes(&keys);
        let value_bytes = bytes(&values);
        for i in 0..filled.min(chunk as usize) {
            // SAFETY: in bounds (i < chunk); K and V are Pod, so any bytes
            // are valid; read_unaligned needs no alignment.
            let key: K = unsafe {
                std::ptr::read_unaligned(key_bytes[i * size_of::<K>()..].as_ptr().cast())
            };
            per_cpu.clear();
            per_cpu.extend((0..possible_cpus).map(|cpu| {
                let at = i * element_values + cpu * value_stride;
                // SAFETY: as above.
                unsafe { std::ptr::read_unaligned(value_bytes[at..].as_ptr().cast::<V>()) }
            }));
            entry(&key, &per_cpu);
        }
        if done {
            return Ok(true);
        }
        position = next;
        first = false;
    }
}

/// The bytes of `words`.
fn bytes(words: &[u64]) -> &[u8] {
    // SAFETY: u64 has no padding; the slice covers exactly the words.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), size_of_val(words)) }
}
