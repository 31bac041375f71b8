//! Sends copies of one IPv4 frame, each from another source address, with
//! sendmmsg on an AF_PACKET socket: the flood of distinct peers that the
//! bounded-memory test, the traffic bench and `cargo xtask soak` need.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::atomic::{AtomicBool, Ordering},
};

/// Frames per sendmmsg call.
const BATCH: usize = 256;
/// Byte offsets in an untagged Ethernet + IPv4 (no options) frame.
const IPV4_HEADER: std::ops::Range<usize> = 14..34;
const IPV4_CHECKSUM: std::ops::Range<usize> = 24..26;
const IPV4_SOURCE: std::ops::Range<usize> = 26..30;

/// An AF_PACKET socket on one interface of the current thread's network
/// namespace, and the frame it varies.
pub struct Storm {
    socket: OwnedFd,
    addr: libc::sockaddr_ll,
    template: Vec<u8>,
    buffers: Vec<u8>,
}

/// The Internet checksum (RFC 1071) of `data`, complemented, ready to store.
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl Storm {
    /// Opens the socket on `iface`. `template` is an untagged Ethernet +
    /// IPv4 frame without options (and a UDP checksum of 0, if UDP).
    pub fn open(iface: &str, template: Vec<u8>) -> io::Result<Storm> {
        if template.len() < IPV4_HEADER.end
            || template[12..14] != [0x08, 0x00]
            || template[14] != 0x45
        {
            return Err(io::Error::other(
                "template must be Ethernet + IPv4 without options",
            ));
        }
        let name = std::ffi::CString::new(iface).map_err(io::Error::other)?;
        // SAFETY: valid NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::other(format!("no interface {iface}")));
        }
        // SAFETY: plain socket(2); protocol 0: the socket only sends.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by socket(2) and is owned here.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: zeroed sockaddr_ll is valid; fields set below.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = ifindex as i32;
        addr.sll_protocol = 0x0800u16.to_be();
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&template[..6]);
        let buffers = template.repeat(BATCH);
        Ok(Storm {
            socket,
            addr,
            template,
            buffers,
        })
    }

    /// Sends up to `count` frames, the i-th from `first + ((offset + i) %
    /// span)` (IPv4 checksum recomputed), until `stop` is set. A frame the
    /// veth ring refuses (ENOBUFS) is sent again, so each is delivered
    /// once. Returns (frames sent, retries).
    pub fn send(
        &mut self,
        first: u32,
        offset: u64,
        count: u64,
        span: u32,
        stop: &AtomicBool,
    ) -> io::Result<(u64, u64)> {
        let len = self.template.len();
        let (mut sent, mut retries) = (0u64, 0u64);
        while sent < count && !stop.load(Ordering::Relaxed) {
            let n = BATCH.min((count - sent) as usize);
            for (i, frame) in self.buffers.chunks_mut(len).take(n).enumerate() {
                let source =
                    first.wrapping_add(((offset + sent + i as u64) % u64::from(span)) as u32);
                frame[IPV4_SOURCE].copy_from_slice(&source.to_be_bytes());
                frame[IPV4_CHECKSUM].copy_from_slice(&[0, 0]);
                let sum = internet_checksum(&frame[IPV4_HEADER]);
                frame[IPV4_CHECKSUM].copy_from_slice(&sum.to_be_bytes());
            }
            let mut iovecs: Vec<libc::iovec> = self
                .buffers
                .chunks_mut(len)
                .take(n)
                .map(|f| libc::iovec {
                    iov_base: f.as_mut_ptr().cast(),
                    iov_len: len,
                })
                .collect();
            let addr: *mut libc::sockaddr_ll = &mut self.addr;
            let mut messages: Vec<libc::mmsghdr> = iovecs
                .iter_mut()
                .map(|iov| {
                    // SAFETY: zeroed mmsghdr is valid; the pointers set here
                    // stay valid during the sendmmsg calls below.
                    let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                    m.msg_hdr.msg_name = addr.cast();
                    m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
                    m.msg_hdr.msg_iov = iov;
                    m.msg_hdr.msg_iovlen = 1;
                    m
                })
                .collect();
            let mut done = 0usize;
            while done < n {
                // SAFETY: messages[done..n] are initialised above.
                let ret = unsafe {
                    libc::sendmmsg(
                        self.socket.as_raw_fd(),
                        messages[done..].as_mut_ptr(),
                        (n - done) as u32,
                        0,
                    )
                };
                if ret > 0 {
                    done += ret as usize;
                    continue;
                }
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::ENOBUFS) | Some(libc::EAGAIN) => {
                        retries += 1;
                        std::thread::yield_now();
                    }
                    _ => return Err(err),
                }
            }
            sent += n as u64;
        }
        Ok((sent, retries))
    }
}
