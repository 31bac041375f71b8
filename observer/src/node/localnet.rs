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
    let mut req = ifreq(iface)?;
    ioctl(libc::SIOCGIFMTU, &mut req).with_context(|| format!("reading the MTU of {iface}"))?;
    // SAFETY: SIOCGIFMTU filled ifru_mtu.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as u32)
}

/// Name of the driver of `iface` in the current network namespace
/// (`veth`, `virtio_net`, `mlx5_core`, ...), as `ethtool -i` shows it.
pub fn driver(iface: &str) -> Result<String> {
    const ETHTOOL_GDRVINFO: u32 = 3;
    /// `struct ethtool_drvinfo` (uapi linux/ethtool.h).
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        version: [u8; 32],
        fw_version: [u8; 32],
        bus_info: [u8; 32],
        erom_version: [u8; 32],
        reserved2: [u8; 12],
        counts: [u32; 5],
    }
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        version: [0; 32],
        fw_version: [0; 32],
        bus_info: [0; 32],
        erom_version: [0; 32],
        reserved2: [0; 12],
        counts: [0; 5],
    };
    let mut req = ifreq(iface)?;
    req.ifr_ifru.ifru_data = (&mut info as *mut DrvInfo).cast();
    ioctl(libc::SIOCETHTOOL, &mut req)
        .with_context(|| format!("reading the driver of {iface} (ethtool -i)"))?;
    let end = info.driver.iter().position(|b| *b == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// An `ifreq` naming `iface`.
fn ifreq(iface: &str) -> Result<libc::ifreq> {
    let name = CString::new(iface).context("interface name contains NUL")?;
    if name.as_bytes().len() >= libc::IFNAMSIZ {
        bail!("interface name {iface} is too long");
    }
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    Ok(req)
}

/// An interface ioctl on a socket made in the current namespace.
fn ioctl(request: libc::c_ulong, req: &mut libc::ifreq) -> Result<()> {
    // SAFETY: plain socket call.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket for an interface ioctl");
    }
    // SAFETY: fd is a new descriptor we own.
    let socket = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // glibc's ioctl takes the request as c_ulong, musl's (the static
    // binary of the image) as c_int: `libc::Ioctl` is whichever it is.
    #[allow(clippy::unnecessary_cast)]
    let request = request as libc::Ioctl;
    // SAFETY: valid fd and ifreq; what ifreq points to outlives the call.
    if unsafe { libc::ioctl(socket.as_raw_fd(), request, req as *mut libc::ifreq) } < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
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
        let err = format!("{:#}", driver("nosuch0").unwrap_err());
        assert!(err.contains("driver of nosuch0"), "{err}");
    }

    #[test]
    fn netns_inode_is_stable() {
        assert_eq!(netns_inode().unwrap(), netns_inode().unwrap());
    }
}
