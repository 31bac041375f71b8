//! Facts about this node's own network that the drop checks need: an
//! interface's MTU and the identity of the current network namespace.
//! (The VNIs of local vxlan devices come with the data-plane view.)

use std::{
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd},
};

use anyhow::{Context, Result, bail};

/// MTU of `iface` in the current network namespace (SIOCGIFMTU on a socket
/// made here: /sys may show another namespace after setns).
pub fn mtu(iface: &str) -> Result<u32> {
    let name = CString::new(iface).context("interface name contains NUL")?;
    if name.as_bytes().len() >= libc::IFNAMSIZ {
        bail!("interface name {iface} is too long");
    }
    // SAFETY: plain socket call.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket for SIOCGIFMTU");
    }
    // SAFETY: fd is a new descriptor we own.
    let socket = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: valid fd and ifreq.
    let ret = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFMTU, &mut req) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("reading the MTU of {iface}"));
    }
    // SAFETY: SIOCGIFMTU filled ifru_mtu.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as u32)
}

/// Inode number of the current thread's network namespace: what the
/// kernel's `net->ns.inum` holds for it.
pub fn netns_inode() -> Result<u32> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata("/proc/thread-self/ns/net")
        .context("reading /proc/thread-self/ns/net")?;
    Ok(meta.ino() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_mtu_and_missing_interface() {
        assert!(mtu("lo").unwrap() >= 1500);
        let err = format!("{:#}", mtu("nosuch0").unwrap_err());
        assert!(err.contains("nosuch0"), "{err}");
    }

    #[test]
    fn netns_inode_is_stable() {
        assert_eq!(netns_inode().unwrap(), netns_inode().unwrap());
    }
}
