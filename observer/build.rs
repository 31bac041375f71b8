//! Builds the eBPF programs (observer-ebpf) with the nightly toolchain and
//! bpf-linker, and leaves the object in OUT_DIR for `include_bytes_aligned!`.

fn main() -> anyhow::Result<()> {
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../observer-ebpf");
    // aya-build watches the eBPF crate only; the programs also compile
    // observer-common's parser and checks, so a change there must rebuild
    // them too (else the object and the native replay disagree).
    println!(
        "cargo:rerun-if-changed={}",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../observer-common/src")
    );
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "observer-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
}
