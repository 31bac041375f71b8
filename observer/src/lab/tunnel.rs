//! A userspace stand-in for the kernel's `tunl0`, for kernels built without
//! IPIP (`CONFIG_NET_IPIP`): a TUN device named `tunl0` whose packets are
//! sent as IPv4 protocol 4 from the node address through a raw socket, and
//! protocol-4 packets received for the node address written back to it.
//! On the wire it is the same IPIP the kernel would send, so the observer,
//! Calico's rules and the router see real IPIP.

use std::{
    fs::File,
    io::{Read, Write},
    net::Ipv4Addr,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use anyhow::{Context, Result, bail};
use ipnet::Ipv4Net;

use crate::node::netns;

/// `_IOW('T', 202, int)` from linux/if_tun.h (not in the libc crate).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// How often the forwarding thread looks at its stop flag.
const POLL_MS: libc::c_int = 100;

/// A running userspace IPIP tunnel; dropping it stops the thread and
/// closes the TUN device, which removes it.
pub struct Tunnel {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Inner destinations and the node address their IPIP packets go to (the
/// `via` of the kernel's `dev tunl0 onlink` routes).
pub type Routes = Vec<(Ipv4Net, Ipv4Addr)>;

impl Tunnel {
    /// Creates `tunl0` in namespace `ns` and forwards between it and the
    /// wire, encapsulating from `local` toward the node `routes` names.
    pub fn start(ns: &str, local: Ipv4Addr, routes: Routes) -> Result<Tunnel> {
        let (tun, raw) = open_in(ns, local)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("tunl0 {ns}"))
                .spawn(move || forward(tun, raw, &routes, &stop))
                .context("starting the userspace IPIP thread")?
        };
        Ok(Tunnel {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Opens the TUN device and the raw socket inside `ns` (both stay bound to
/// it when used from other threads).
fn open_in(ns: &str, local: Ipv4Addr) -> Result<(File, OwnedFd)> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<(File, OwnedFd)> {
                netns::enter(ns)?;
                Ok((open_tun("tunl0")?, raw_ipip_socket(local)?))
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the thread opening tunl0 in {ns} panicked"))?
    })
}

fn open_tun(name: &str) -> Result<File> {
    let file = File::options()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .context("opening /dev/net/tun (needs the tun module, CONFIG_TUN)")?;
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes one ifreq, which outlives the call.
    if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("creating TUN device {name} (TUNSETIFF)"));
    }
    Ok(file)
}

fn raw_ipip_socket(local: Ipv4Addr) -> Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned right after.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_IPIP) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("opening a raw IPIP socket");
    }
    // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Bound to the node address: it is the outer source, as with `local`
    // on a kernel tunnel, and only IPIP for this node is read.
    let addr = sockaddr(local);
    // SAFETY: addr is a valid sockaddr_in of the given length.
    let ret = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("binding the raw IPIP socket to {local}"));
    }
    Ok(fd)
}

fn sockaddr(addr: Ipv4Addr) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Moves packets both ways until `stop`. A packet that cannot be moved is
/// dropped, as a kernel tunnel would drop it.
fn forward(mut tun: File, raw: OwnedFd, routes: &Routes, stop: &AtomicBool) {
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::SeqCst) {
        let mut fds = [
            libc::pollfd {
                fd: tun.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: raw.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid array of two pollfd.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, POLL_MS) } <= 0 {
            continue;
        }
        if fds[0].revents & libc::POLLIN != 0
            && let Ok(n) = tun.read(&mut buf)
        {
            let _ = encapsulate(&raw, &buf[..n], routes);
        }
        if fds[1].revents & libc::POLLIN != 0 {
            // SAFETY: buf is writable for its length.
            let n = unsafe { libc::recv(raw.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if let Some(inner) = usize::try_from(n).ok().and_then(|n| decapsulate(&buf[..n])) {
                let _ = tun.write(inner);
            }
        }
    }
}

/// Sends one inner IPv4 packet to the node that owns its destination.
fn encapsulate(raw: &OwnedFd, inner: &[u8], routes: &Routes) -> Result<()> {
    if inner.len() < 20 || inner[0] >> 4 != 4 {
        bail!("not an IPv4 packet");
    }
    let dst = Ipv4Addr::new(inner[16], inner[17], inner[18], inner[19]);
    let Some((_, node)) = routes.iter().find(|(net, _)| net.contains(&dst)) else {
        bail!("no tunl0 route to {dst}");
    };
    let addr = sockaddr(*node);
    // SAFETY: inner and addr are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            raw.as_raw_fd(),
            inner.as_ptr().cast(),
            inner.len(),
            0,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// The inner packet of a received outer IPv4 packet (raw sockets deliver
/// the outer header too).
fn decapsulate(packet: &[u8]) -> Option<&[u8]> {
    let header = usize::from(packet.first()? & 0x0f) * 4;
    packet.get(header..).filter(|inner| inner.len() >= 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decapsulation_skips_the_outer_header_and_its_options() {
        let mut packet = vec![0x46; 24];
        packet.extend_from_slice(&[0x45; 20]);
        assert_eq!(decapsulate(&packet), Some(&[0x45; 20][..]));
        assert_eq!(decapsulate(&packet[..30]), None);
        assert_eq!(decapsulate(&[]), None);
    }
}
