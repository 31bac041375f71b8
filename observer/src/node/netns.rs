//! Entering a named network namespace (`--netns NAME`, as created by
//! `ip netns add`).

use std::{fs::File, os::fd::AsRawFd, path::Path};

use anyhow::{Context, Result, bail};

/// Where iproute2 keeps named namespaces.
const NETNS_RUN_DIR: &str = "/run/netns";

/// Moves the calling thread into network namespace `name`.
///
/// Must run before any other thread is started (the async runtime), because
/// `setns` only moves the calling thread. Unlike `ip netns exec` it does not
/// remount /sys, so BTF and tracefs stay reachable.
pub fn enter(name: &str) -> Result<()> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        bail!("invalid network namespace name {name:?}");
    }
    let path = Path::new(NETNS_RUN_DIR).join(name);
    let file = File::open(&path).map_err(|e| {
        anyhow::anyhow!(
            "network namespace {name} not found ({}: {e}); list them with `ip netns list`",
            path.display()
        )
    })?;
    // SAFETY: valid fd; CLONE_NEWNET asks the kernel to check it is a netns.
    let ret = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if ret != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("entering network namespace {name} (needs CAP_SYS_ADMIN)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_namespace_is_named_in_the_error() {
        let err = enter("observer-no-such-ns").unwrap_err().to_string();
        assert!(
            err.contains("network namespace observer-no-such-ns not found"),
            "{err}"
        );
        assert!(err.contains("ip netns list"), "{err}");
    }

    #[test]
    fn path_like_names_are_refused() {
        assert!(enter("../etc").is_err());
        assert!(enter("").is_err());
    }
}
