//! How much freed memory the process keeps: a monitor that runs for months
//! should hold what it uses, not the most it ever used.
//!
//! At 100,000 peers each interval builds tables of several MiB (the flow
//! map's read, the rows) and frees them. glibc serves large allocations
//! with their own mappings, but raises that threshold to the largest block
//! freed so far, so from the second interval on these tables come from the
//! heap, and a heap that has grown stays resident. A fixed threshold keeps
//! them mapped and returned when freed: in `cargo xtask bench`,
//! `rss_100000_peers` fell by about 45 MiB (measured when it was added,
//! 150 to 98 MiB) for a few milliseconds of page faults per interval.

/// Allocations from this size up get their own mapping.
#[cfg(target_env = "gnu")]
const OWN_MAPPING_FROM: libc::c_int = 1 << 20;

/// Makes large freed blocks go back to the system (glibc only; other
/// allocators have their own policy). Call once, first thing in `main`.
pub fn return_large_frees() {
    // SAFETY: mallopt changes glibc's allocation policy only, under
    // glibc's own lock; it takes no pointers.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, OWN_MAPPING_FROM);
    }
}
