//! Facts about this node's own network that the drop checks need: the
//! VNIs of local vxlan devices, an interface's MTU, and the identity of
//! the current network namespace.

use std::{
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd},
};

use anyhow::{Context, Result, bail};

use crate::tools;
use serde::Deserialize;

#[derive(Deserialize)]
struct Link {
    #[serde(default)]
    linkinfo: Option<LinkInfo>,
}

#[derive(Deserialize)]
struct LinkInfo {
    #[serde(default)]
    info_data: Option<VxlanData>,
}

#[derive(Deserialize)]
struct VxlanData {
    id: Option<u32>,
}

/// VNIs of the vxlan devices in the current network namespace, from
/// `ip -d -j link show type vxlan` (iproute2 is on every node; the netlink
/// data-plane reader replaces this later).
pub fn vxlan_vnis() -> Result<Vec<u32>> {
    let json = tools::output(
        "ip",
        &["-d", "-j", "link", "show", "type", "vxlan"],
        "local vxlan devices",
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    parse_vxlan_vnis(&json)
}

/// VNIs in `ip -d -j link` output, sorted and deduplicated.
pub fn parse_vxlan_vnis(json: &str) -> Result<Vec<u32>> {
    if json.trim().is_empty() {
        return Ok(Vec::new());
    }
    let links: Vec<Link> = serde_json::from_str(json).context("parsing `ip -j link` output")?;
    let mut vnis: Vec<u32> = links
        .into_iter()
        .filter_map(|l| l.linkinfo?.info_data?.id)
        .collect();
    vnis.sort_unstable();
    vnis.dedup();
    Ok(vnis)
}

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
    fn vnis_from_ip_json() {
        let json = r#"[{"ifindex":4,"ifname":"vx0","linkinfo":{"info_kind":"vxlan","info_data":{"id":4096,"port":4789}}},{"ifindex":5,"ifname":"flannel.1","linkinfo":{"info_kind":"vxlan","info_data":{"id":1,"port":8472}}},{"ifindex":6,"ifname":"vx1","linkinfo":{"info_kind":"vxlan","info_data":{"id":4096}}}]"#;
        assert_eq!(parse_vxlan_vnis(json).unwrap(), vec![1, 4096]);
        assert_eq!(parse_vxlan_vnis("[]").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_vxlan_vnis("").unwrap(), Vec::<u32>::new());
        assert!(parse_vxlan_vnis("{").is_err());
    }

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
