//! Link settings for the eBPF object.

fn main() {
    // bpf-linker passes --bpf-expand-memcpy-in-order to LLVM by default,
    // which stops LLVM from expanding memset inline: every zeroed struct
    // became a call to a byte-by-byte memset subprogram (about 80 ns per
    // packet). Without it, LLVM expands memcpy/memset into plain stores.
    println!("cargo::rustc-link-arg-bins=--disable-expand-memcpy-in-order");
}
