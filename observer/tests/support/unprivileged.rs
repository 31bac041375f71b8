//! Running the observer as an unprivileged user (`nobody`, uid 65534).
//!
//! The binary under test lives in the checkout's target directory, which
//! such a user cannot reach when the checkout sits in a folder only root
//! may enter (root's home and `mktemp -d` folders are mode 0700 on
//! Debian): the exec fails with EACCES before the observer runs. Every
//! test that drops privileges runs a copy made here instead.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

/// The uid and gid of `nobody` / `nogroup`.
pub const NOBODY: u32 = 65534;

/// A copy of a binary in a fresh directory that every user may enter
/// (mode 0755 below the system's temporary directory), removed on drop.
pub struct BinaryCopy {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl BinaryCopy {
    /// A copy of the observer binary under test.
    pub fn observer() -> BinaryCopy {
        BinaryCopy::of(Path::new(env!("CARGO_BIN_EXE_observer")))
    }

    /// A copy of `binary`, executable by everyone.
    pub fn of(binary: &Path) -> BinaryCopy {
        let dir = tempfile::Builder::new()
            .prefix("observer-unprivileged-")
            .tempdir()
            .expect("creating a directory for the binary's copy");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))
            .expect("opening the copy's directory to every user");
        let path = dir
            .path()
            .join(binary.file_name().expect("a binary's file name"));
        fs::copy(binary, &path)
            .unwrap_or_else(|e| panic!("copying {} to {}: {e}", binary.display(), path.display()));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .expect("making the copy executable by every user");
        BinaryCopy { dir, path }
    }

    /// The copy's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The copy's path as text (for command lines).
    pub fn as_str(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temporary path")
    }

    /// The directory holding the copy.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
