//! `cargo xtask image`: the observer as an OCI image, without a container
//! daemon: a static binary (musl, the eBPF object inside) as the only file
//! of one layer on an empty base, written as an OCI image layout
//! (`target/image/oci`) and as an `oci-archive` tar
//! (`target/image/observer-<version>.oci.tar`), with the standard labels.
//! Reproducible: every timestamp is the commit's, the layer's files are
//! owned by root with fixed modes, so the same commit gives the same
//! digests.
//!
//! The layout is written here rather than with buildah or umoci because
//! those need a storage driver and root-owned state; what an OCI image is
//! (a tar, three JSON documents, content addressed) is small and fixed by
//! the image-spec.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::util;

/// The Rust target of the static binary.
pub const MUSL: &str = "x86_64-unknown-linux-musl";
/// Where the binary is in the image.
pub const BINARY_PATH: &str = "usr/bin/observer";

/// Options of `cargo xtask image`.
#[derive(Debug, Args)]
pub struct ImageArgs {
    /// org.opencontainers.image.source: the repository's URL. [default:
    /// `git remote get-url origin`]
    #[arg(long, value_name = "URL")]
    pub source: Option<String>,
    /// Build profile of the binary (release for images you push; the tests
    /// use dev, which builds faster).
    #[arg(long, default_value = "release", value_name = "PROFILE")]
    pub profile: String,
}

/// What was written.
pub struct Image {
    /// The OCI image layout directory.
    pub layout: PathBuf,
    /// The oci-archive tar.
    pub archive: PathBuf,
    /// The manifest's digest (`sha256:...`).
    pub digest: String,
    /// The compressed layer's size in bytes.
    pub layer_bytes: u64,
}

/// Builds the static binary and writes the image; prints where it is and
/// how to inspect and push it.
pub fn image(args: &ImageArgs) -> Result<Image> {
    let binary = build_static(&args.profile)?;
    let root = util::workspace_root();
    let version = env!("CARGO_PKG_VERSION");
    let revision = git(&["rev-parse", "HEAD"])?;
    let created = git(&["log", "-1", "--format=%cI"])?;
    let epoch: u64 = git(&["log", "-1", "--format=%ct"])?
        .parse()
        .context("the commit time is no number")?;
    let source = match &args.source {
        Some(s) => s.clone(),
        None => {
            git(&["remote", "get-url", "origin"]).unwrap_or_else(|_| root.display().to_string())
        }
    };
    let labels = json!({
        "org.opencontainers.image.source": source,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.title": "observer",
        "org.opencontainers.image.description": "Per-peer counters of overlay (VXLAN, Geneve, IPIP, ...) traffic at the wire, and why tunnel packets die (eBPF)",
        "org.opencontainers.image.licenses": "MIT OR Apache-2.0",
    });

    let out = root.join("target/image");
    let layout = out.join("oci");
    if layout.exists() {
        fs::remove_dir_all(&layout).with_context(|| format!("removing {}", layout.display()))?;
    }
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs)?;

    let layer_tar = layer(&binary, epoch)?;
    let diff_id = sha256(&layer_tar);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&layer_tar)?;
    let layer_gz = gz.finish()?;
    let layer = write_blob(&blobs, &layer_gz)?;

    let config = serde_json::to_vec(&json!({
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": [format!("/{BINARY_PATH}")],
            "Cmd": ["--help"],
            "Env": ["PATH=/usr/bin"],
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "cargo xtask image"}],
    }))?;
    let config = write_blob(&blobs, &config)?;

    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer)],
        "annotations": labels,
    }))?;
    let manifest = write_blob(&blobs, &manifest)?;
    let mut entry = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    entry["annotations"] = json!({ "org.opencontainers.image.ref.name": version });
    fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [entry]}))?,
    )?;
    fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;

    let archive = out.join(format!("observer-{version}.oci.tar"));
    write_archive(&layout, &archive, epoch)?;
    let image = Image {
        layout,
        archive,
        digest: manifest.0.clone(),
        layer_bytes: layer.1,
    };
    println!(
        "image: {} (layout {}), manifest {}, one layer of {} bytes: /{BINARY_PATH}",
        image.archive.display(),
        image.layout.display(),
        image.digest,
        image.layer_bytes
    );
    println!(
        "inspect: skopeo inspect oci-archive:{}\n\
         push:    skopeo copy oci-archive:{} docker://REGISTRY/observer:{version}",
        image.archive.display(),
        image.archive.display()
    );
    Ok(image)
}

/// `cargo build -p observer --target x86_64-unknown-linux-musl`: a binary
/// with no dynamic dependency (checked).
fn build_static(profile: &str) -> Result<PathBuf> {
    util::run(Command::new("rustup").args(["target", "add", MUSL]))?;
    // ring (rustls' cryptography) compiles C for the target: musl-gcc
    // (Debian's musl-tools) is that compiler. The dev image (CI's) goes
    // without debug info: it builds faster and its layer is smaller; build
    // scripts and proc macros never have it.
    let mut cargo = util::cargo();
    cargo
        .args([
            "build",
            "-p",
            "observer",
            "--profile",
            profile,
            "--target",
            MUSL,
        ])
        .env("CC_x86_64_unknown_linux_musl", "musl-gcc");
    if profile == "dev" {
        cargo.env("CARGO_PROFILE_DEV_DEBUG", "0");
    }
    util::run(&mut cargo)?;
    let dir = if profile == "dev" { "debug" } else { profile };
    let binary = util::workspace_root()
        .join("target")
        .join(MUSL)
        .join(dir)
        .join("observer");
    let elf = fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    if has_interpreter(&elf) {
        bail!(
            "{} asks for a dynamic loader (PT_INTERP): not a static binary",
            binary.display()
        );
    }
    Ok(binary)
}

/// Whether an ELF64 file has a PT_INTERP program header (a dynamic
/// loader), read from the program header table.
fn has_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return true;
    };
    (0..phnum as usize).any(|i| u32_at(phoff as usize + i * phentsize as usize) == Some(PT_INTERP))
}

/// The layer: /usr, /usr/bin and the binary, root-owned, at the commit's
/// time.
fn layer(binary: &Path, epoch: u64) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for dir in ["usr/", "usr/bin/"] {
        let mut header = header(tar::EntryType::Directory, 0o755, 0, epoch);
        tar.append_data(&mut header, dir, std::io::empty())?;
    }
    let bytes = fs::read(binary)?;
    let mut header = header(tar::EntryType::Regular, 0o755, bytes.len() as u64, epoch);
    tar.append_data(&mut header, BINARY_PATH, bytes.as_slice())?;
    Ok(tar.into_inner()?)
}

fn header(kind: tar::EntryType, mode: u32, size: u64, epoch: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(epoch);
    header.set_uid(0);
    header.set_gid(0);
    header
}

/// The layout directory as a tar (what skopeo and podman call
/// `oci-archive`), files in a fixed order.
fn write_archive(layout: &Path, archive: &Path, epoch: u64) -> Result<()> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut blobs: Vec<PathBuf> = fs::read_dir(layout.join("blobs/sha256"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    blobs.sort();
    for dir in ["blobs/", "blobs/sha256/"] {
        let mut header = header(tar::EntryType::Directory, 0o755, 0, epoch);
        tar.append_data(&mut header, dir, std::io::empty())?;
    }
    let files = ["oci-layout", "index.json"]
        .into_iter()
        .map(|f| (f.to_string(), layout.join(f)))
        .chain(blobs.into_iter().map(|p| {
            let name = format!("blobs/sha256/{}", p.file_name().unwrap().to_string_lossy());
            (name, p)
        }));
    for (name, path) in files {
        let bytes = fs::read(&path)?;
        let mut header = header(tar::EntryType::Regular, 0o644, bytes.len() as u64, epoch);
        tar.append_data(&mut header, name, bytes.as_slice())?;
    }
    fs::write(archive, tar.into_inner()?).with_context(|| format!("writing {}", archive.display()))
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// Writes a blob under its digest; returns (digest, size).
fn write_blob(blobs: &Path, bytes: &[u8]) -> Result<(String, u64)> {
    let digest = sha256(bytes);
    fs::write(blobs.join(&digest["sha256:".len()..]), bytes)?;
    Ok((digest, bytes.len() as u64))
}

fn descriptor(media_type: &str, blob: &(String, u64)) -> Value {
    json!({"mediaType": media_type, "digest": blob.0, "size": blob.1})
}

fn git(args: &[&str]) -> Result<String> {
    let out = util::output(
        Command::new("git")
            .args(args)
            .current_dir(util::workspace_root()),
    )?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_static_test_binary_is_told_apart_from_a_dynamic_one() {
        // The xtask binary itself is dynamic (glibc): it has PT_INTERP.
        let me = fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(has_interpreter(&me));
        assert!(has_interpreter(b"not an elf"));
    }
}
