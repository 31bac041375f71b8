//! eBPF programs of the observer. One hook per module; the packet parser and
//! the counter update they share live in `parse` and `count`.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Inline asm on BPF: `parse::window_offset` hides offsets from LLVM.
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

mod count;
mod drops;
mod kfree_skb;
mod maps;
mod parse;
mod tc_checks;
mod tc_egress;
mod tc_ingress;
mod tc_skb;
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
