//! eBPF programs of the observer. One hook per module; the counter update
//! they share lives in `count`, the packet parser in `observer_common::parse`
//! (shared with userspace, which runs it natively on capture files).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// For the atomic add of the shared BGP counters (`bgp::add_u64`).
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

use observer_common::parse;

mod bgp;
mod count;
mod drops;
mod evidence;
mod kfree_skb;
mod maps;
mod tc_bgp;
mod tc_checks;
mod tc_egress;
mod tc_ingress;
mod tc_skb;
mod xdp_bgp;
mod xdp_checks;
mod xdp_ingress;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach a panic, so this is
    // never executed; it exists because no_std binaries need a handler.
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}
