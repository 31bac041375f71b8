//! The sockets of `observer probe`: a raw IPv4 socket that sends the
//! crafted probes as they are (the kernel adds no header of its own), and
//! a packet socket that sees, on the underlay interfaces, the tunnel
//! packets that arrive (answers included) before the node's firewall can
//! drop them. Both belong to the network namespace the thread is in when
//! they are opened.

use std::{
    io,
    mem::{size_of, zeroed},
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::model::dataplane::MacAddr;

/// Bytes of each received frame kept: every header up to the inner ICMP
/// payload's first bytes (84 bytes for VXLAN) with room to spare.
const SNAP_LEN: u32 = 256;

/// The raw socket probes are sent through.
pub struct Sender {
    fd: OwnedFd,
}

/// Opens an `AF_INET`/`AF_PACKET` socket, naming CAP_NET_RAW when refused.
fn socket(domain: libc::c_int, kind: libc::c_int, protocol: libc::c_int) -> Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked.
    let fd = unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPERM) {
            bail!(
                "opening a raw socket was refused: observer probe needs CAP_NET_RAW \
                 (run it as root, or grant the capability: setcap cap_net_raw+ep)"
            );
        }
        return Err(e).context("opening a raw socket");
    }
    // SAFETY: fd is a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_option<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: value points to a T of the size given.
    let ret = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Sender {
    /// A raw IPPROTO_RAW socket (IP_HDRINCL): the packet is sent as built,
    /// DF and sizes included. The kernel's path MTU cache is ignored
    /// (IP_PMTUDISC_PROBE) so the size ladder measures the path itself.
    pub fn open() -> Result<Sender> {
        let fd = socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW)?;
        set_option(
            &fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            &libc::IP_PMTUDISC_PROBE,
        )
        .context("setting IP_MTU_DISCOVER on the probe socket")?;
        Ok(Sender { fd })
    }

    /// Sends the IPv4 `packet` to `dst` (its outer destination). An error
    /// is the kernel's: `EMSGSIZE` when it exceeds the interface's MTU.
    pub fn send(&self, packet: &[u8], dst: Ipv4Addr) -> io::Result<()> {
        // SAFETY: all-zero is a valid sockaddr_in.
        let mut addr: libc::sockaddr_in = unsafe { zeroed() };
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from(dst).to_be();
        // SAFETY: packet and addr are valid for the lengths given.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&addr as *const libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

/// The source address the kernel uses toward `dst`: what a UDP socket
/// connected to it is bound to (connecting sends nothing).
pub fn source_toward(dst: Ipv4Addr) -> Result<Ipv4Addr> {
    let socket = UdpSocket::bind("0.0.0.0:0").context("opening a UDP socket")?;
    socket
        .connect((dst, 9))
        .with_context(|| format!("no route to {dst}"))?;
    match socket.local_addr()? {
        SocketAddr::V4(local) => Ok(*local.ip()),
        SocketAddr::V6(_) => bail!("no IPv4 source toward {dst}"),
    }
}

/// The MAC of interface `name` (SIOCGIFHWADDR); `None` when it has none.
pub fn mac_of(name: &str) -> Option<MacAddr> {
    let fd = socket(libc::AF_INET, libc::SOCK_DGRAM, 0).ok()?;
    // SAFETY: all-zero is a valid ifreq.
    let mut req: libc::ifreq = unsafe { zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return None;
    }
    for (dst, &src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    // c_ulong for glibc, c_int for musl (the image's static binary).
    #[allow(clippy::unnecessary_cast)]
    let request = libc::SIOCGIFHWADDR as libc::Ioctl;
    // SAFETY: req is a valid ifreq with a NUL-terminated name.
    if unsafe { libc::ioctl(fd.as_raw_fd(), request, &mut req) } != 0 {
        return None;
    }
    // SAFETY: SIOCGIFHWADDR filled ifru_hwaddr.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mac: [u8; 6] = std::array::from_fn(|i| data[i] as u8);
    (mac != [0; 6]).then_some(MacAddr(mac))
}

/// A received frame: where it came in, and its first bytes.
pub struct Received<'a> {
    /// The interface index it arrived on.
    pub ifindex: u32,
    /// The Ethernet frame, cut at [`SNAP_LEN`].
    pub frame: &'a [u8],
}

/// A packet socket that receives the tunnel packets and ICMP arriving on
/// the node (a kernel filter keeps everything else out, so a busy node
/// copies only those).
pub struct Listener {
    fd: OwnedFd,
    buffer: Vec<u8>,
}

impl Listener {
    /// Opens it for IPv4 protocol 4, ICMP, and UDP to `udp_ports`.
    pub fn open(udp_ports: &[u16]) -> Result<Listener> {
        let protocol = (libc::ETH_P_IP as u16).to_be() as libc::c_int;
        let fd = socket(libc::AF_PACKET, libc::SOCK_RAW, protocol)?;
        let program = filter(udp_ports);
        let prog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_ptr() as *mut libc::sock_filter,
        };
        set_option(&fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)
            .context("attaching the probe listener's packet filter")?;
        let mut listener = Listener {
            fd,
            buffer: vec![0; SNAP_LEN as usize],
        };
        // Frames queued before the filter was attached passed no filter.
        while listener.recv(Duration::ZERO)?.is_some() {}
        Ok(listener)
    }

    /// The next frame received (not sent) by this node, waiting at most
    /// `timeout`; `None` when none came.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Received<'_>>> {
        let mut poll = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        loop {
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&mut poll, 1, millis) };
            if ready < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e).context("waiting for probe answers");
            }
            if ready == 0 {
                return Ok(None);
            }
            // SAFETY: all-zero is a valid sockaddr_ll.
            let mut from: libc::sockaddr_ll = unsafe { zeroed() };
            let mut from_len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: buffer and from are valid for the lengths given.
            let len = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    self.buffer.as_mut_ptr().cast(),
                    self.buffer.len(),
                    libc::MSG_DONTWAIT,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if len < 0 {
                let e = io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) {
                    continue;
                }
                return Err(e).context("reading a probe answer");
            }
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            return Ok(Some(Received {
                ifindex: from.sll_ifindex as u32,
                frame: &self.buffer[..len as usize],
            }));
        }
    }

    /// Frames the kernel dropped because this socket's queue was full.
    pub fn drops(&self) -> u64 {
        // SAFETY: all-zero is a valid tpacket_stats.
        let mut stats: libc::tpacket_stats = unsafe { zeroed() };
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: stats is valid for len bytes.
        let ret = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut stats as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if ret == 0 {
            u64::from(stats.tp_drops)
        } else {
            0
        }
    }
}

/// The classic BPF program of the listener: IPv4 that is protocol 4, ICMP,
/// or an unfragmented UDP datagram to one of `udp_ports`; cut at
/// [`SNAP_LEN`]. Written by hand (a dozen instructions) rather than
/// compiled with libpcap, which would be a C dependency for this alone.
fn filter(udp_ports: &[u16]) -> Vec<libc::sock_filter> {
    const LD_H_ABS: u16 = 0x28;
    const LD_B_ABS: u16 = 0x30;
    const LD_H_IND: u16 = 0x48;
    const LDX_B_MSH: u16 = 0xb1;
    const JEQ_K: u16 = 0x15;
    const JSET_K: u16 = 0x45;
    const RET_K: u16 = 0x06;
    let op = |code, k| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    // Jumps are written as targets (usize::MAX: accept, MAX-1: drop) and
    // made relative once the program's length is known.
    const ACCEPT: usize = usize::MAX;
    const DROP: usize = usize::MAX - 1;
    let mut program: Vec<(libc::sock_filter, usize, usize)> = vec![
        (op(LD_H_ABS, 12), 0, 0),      // ethertype
        (op(JEQ_K, 0x0800), 0, DROP),  // IPv4 or nothing
        (op(LD_B_ABS, 14 + 9), 0, 0),  // protocol
        (op(JEQ_K, 4), ACCEPT, 0),     // IPIP
        (op(JEQ_K, 1), ACCEPT, 0),     // ICMP
        (op(JEQ_K, 17), 0, DROP),      // UDP or nothing
        (op(LD_H_ABS, 14 + 6), 0, 0),  // flags and fragment offset
        (op(JSET_K, 0x1fff), DROP, 0), // a later fragment has no ports
        (op(LDX_B_MSH, 14), 0, 0),     // X = IP header length
        (op(LD_H_IND, 14 + 2), 0, 0),  // destination port
    ];
    for &port in udp_ports {
        program.push((op(JEQ_K, u32::from(port)), ACCEPT, 0));
    }
    let drop_at = program.len();
    program.push((op(RET_K, 0), 0, 0));
    program.push((op(RET_K, SNAP_LEN), 0, 0));
    let target = |to: usize| match to {
        ACCEPT => drop_at + 1,
        DROP => drop_at,
        _ => usize::MAX,
    };
    program
        .iter()
        .enumerate()
        .map(|(at, &(mut ins, jt, jf))| {
            // 0 means "next instruction"; every target is after `at`.
            let relative = |to: usize| {
                if to == 0 {
                    0
                } else {
                    (target(to) - at - 1) as u8
                }
            };
            ins.jt = relative(jt);
            ins.jf = relative(jf);
            ins
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_jumps_land_on_accept_and_drop() {
        let program = filter(&[4789, 6081]);
        assert_eq!(program.len(), 14);
        let last = program.len() - 1;
        // IPIP accepts: the last instruction, returning SNAP_LEN.
        assert_eq!(3 + 1 + program[3].jt as usize, last);
        assert_eq!(program[last].k, SNAP_LEN);
        // Not IPv4 drops: the instruction before it, returning 0.
        assert_eq!(1 + 1 + program[1].jf as usize, last - 1);
        assert_eq!(program[last - 1].k, 0);
        // Each port accepts.
        for at in [10, 11] {
            assert_eq!(at + 1 + program[at].jt as usize, last);
        }
    }
}
