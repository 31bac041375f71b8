//! Builds the eBPF programs (observer-ebpf) with the nightly toolchain and
//! bpf-linker, and leaves the object in OUT_DIR for `include_bytes_aligned!`.
//!
//! Every host build (clippy, the tests, the musl image, the fuzz check)
//! has an OUT_DIR of its own, and aya-build keeps its cargo target dir
//! under OUT_DIR: each would build the same object again, `core` for the
//! BPF target included (half a minute of CI each). So aya-build is handed
//! one shared directory, `<target dir>/ebpf`, under a lock (two cargo
//! commands may run at once), and the object is copied from there; the
//! BPF build inside is cargo's own, so it still rebuilds what changed.

use std::{
    env, fs,
    path::{Path, PathBuf},
};

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../observer-ebpf");
    // aya-build watches the eBPF crate only; the programs also compile
    // observer-common's parser and checks, so a change there must rebuild
    // them too (else the object and the native replay disagree).
    println!(
        "cargo:rerun-if-changed={}",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../observer-common/src")
    );
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let shared = shared_dir().join("ebpf");
    fs::create_dir_all(&shared).with_context(|| format!("creating {}", shared.display()))?;
    let lock = fs::File::create(shared.join(".lock"))
        .with_context(|| format!("creating {}/.lock", shared.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}/.lock", shared.display()))?;
    // SAFETY: no other thread of this build script runs yet; aya-build
    // reads OUT_DIR once, before it starts any.
    unsafe { env::set_var("OUT_DIR", &shared) };
    let built = aya_build::build_ebpf(
        [aya_build::Package {
            name: "observer-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    );
    // SAFETY: as above; aya-build's threads have ended.
    unsafe { env::set_var("OUT_DIR", &out_dir) };
    built?;
    let object = shared.join("observer");
    fs::copy(&object, out_dir.join("observer"))
        .with_context(|| format!("copying {} to {}", object.display(), out_dir.display()))?;
    Ok(())
}

/// The cargo target dir: CARGO_TARGET_DIR when it is absolute, else the
/// workspace's `target`.
fn shared_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir,
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
    }
}
