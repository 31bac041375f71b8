//! Change notifications: a socket subscribed to the rtnetlink groups of
//! links, addresses, routes and neighbours, drained by a thread that only
//! raises a flag (bounded: no queue of events is kept). Notifications the
//! kernel could not queue (a full receive buffer: ENOBUFS) raise it too,
//! since whatever they said is re-read in full; the first overrun is
//! logged, all are counted.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
};

use anyhow::{Context, Result};
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};

/// The multicast groups whose messages mean "the data plane changed".
/// RTNLGRP_NEIGH also carries the FDB (AF_BRIDGE) notifications.
const GROUPS: [(u32, &str); 6] = [
    (libc::RTNLGRP_LINK, "RTNLGRP_LINK"),
    (libc::RTNLGRP_IPV4_IFADDR, "RTNLGRP_IPV4_IFADDR"),
    (libc::RTNLGRP_IPV6_IFADDR, "RTNLGRP_IPV6_IFADDR"),
    (libc::RTNLGRP_IPV4_ROUTE, "RTNLGRP_IPV4_ROUTE"),
    (libc::RTNLGRP_IPV6_ROUTE, "RTNLGRP_IPV6_ROUTE"),
    (libc::RTNLGRP_NEIGH, "RTNLGRP_NEIGH"),
];

/// The receive buffer asked for the notification socket. The kernel's
/// default (`net.core.rmem_default`, 208 KiB) holds a few hundred route
/// notifications, fewer than one BGP session's worth of withdrawn routes;
/// this holds several thousand. Memory is only taken while notifications
/// wait, and the thread drains them at once.
const RECEIVE_BUFFER: usize = 4 << 20;

/// State shared with the watching thread.
#[derive(Default)]
struct Flags {
    /// Something changed since the last [`ChangeWatcher::take_changed`].
    changed: AtomicBool,
    /// The thread stopped on an error: every call reports a change, since
    /// changes can no longer be seen.
    failed: AtomicBool,
    overruns: Overruns,
}

/// Overruns of the notification socket (ENOBUFS: notifications lost).
/// Said once, then counted: on a node whose routes churn for months a
/// warning per overrun would flood the log, and the count is exported.
#[derive(Default)]
struct Overruns(AtomicU64);

impl Overruns {
    /// Counts one overrun; true for the first, the one to log.
    fn count(&self) -> bool {
        self.0.fetch_add(1, Ordering::Relaxed) == 0
    }

    fn total(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Says whether the data plane of the network namespace it was created in
/// changed (links, addresses, routes, neighbours, FDB).
pub struct ChangeWatcher {
    flags: Arc<Flags>,
    /// Written on drop to wake the thread up and end it.
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl ChangeWatcher {
    /// Subscribes in the calling thread's network namespace (the socket
    /// stays there whichever thread uses it) and starts the watching
    /// thread; the socket's receive buffer is 4 MiB.
    pub fn new() -> Result<ChangeWatcher> {
        Self::with_receive_buffer(RECEIVE_BUFFER)
    }

    /// [`ChangeWatcher::new`] with a receive buffer of `bytes` (the kernel
    /// doubles it for its bookkeeping and raises it to its minimum, about
    /// 2 KiB).
    pub fn with_receive_buffer(bytes: usize) -> Result<ChangeWatcher> {
        let mut socket = Socket::new(NETLINK_ROUTE)
            .context("opening a NETLINK_ROUTE socket for change notifications")?;
        set_receive_buffer(&socket, bytes)?;
        socket
            .bind_auto()
            .context("binding the NETLINK_ROUTE notification socket")?;
        for (group, name) in GROUPS {
            socket
                .add_membership(group)
                .with_context(|| format!("subscribing to rtnetlink group {name}"))?;
        }
        socket
            .set_non_blocking(true)
            .context("making the notification socket non-blocking")?;
        // SAFETY: plain eventfd(2) call.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .context("creating the eventfd that stops the change watcher");
        }
        // SAFETY: fd is a new descriptor owned here.
        let stop = unsafe { OwnedFd::from_raw_fd(fd) };
        let flags = Arc::new(Flags::default());
        // The first call reports a change: nothing has been read yet.
        flags.changed.store(true, Ordering::Relaxed);
        let thread = {
            let flags = flags.clone();
            let stop = stop.as_raw_fd();
            std::thread::Builder::new()
                .name("dataplane-watch".into())
                .spawn(move || watch(&socket, stop, &flags))
                .context("starting the change watcher thread")?
        };
        Ok(ChangeWatcher {
            flags,
            stop,
            thread: Some(thread),
        })
    }

    /// Whether anything changed since the previous call (true on the first
    /// call, and always once the watcher failed).
    pub fn take_changed(&self) -> bool {
        self.flags.changed.swap(false, Ordering::AcqRel)
            || self.flags.failed.load(Ordering::Acquire)
    }

    /// How often the socket overran (the kernel dropped notifications)
    /// since the watcher started.
    pub fn overruns(&self) -> u64 {
        self.flags.overruns.total()
    }
}

/// Sets the socket's receive buffer to `bytes`: SO_RCVBUFFORCE, which
/// needs CAP_NET_ADMIN and goes beyond `net.core.rmem_max` (netlink-sys
/// has no call for it), else netlink-sys's SO_RCVBUF (capped at
/// `net.core.rmem_max`).
fn set_receive_buffer(socket: &Socket, bytes: usize) -> Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: passes a valid c_int and its size.
    let forced = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    } == 0;
    if forced {
        return Ok(());
    }
    socket.set_rx_buf_sz(value).with_context(|| {
        format!("setting the receive buffer of the notification socket to {bytes} bytes")
    })
}

impl Drop for ChangeWatcher {
    fn drop(&mut self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Waits for notifications on `socket` until `stop` is readable.
fn watch(socket: &Socket, stop: RawFd, flags: &Flags) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut fds = [
            libc::pollfd {
                fd: socket.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid array of two pollfd.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if ready < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return fail(flags, "polling", err);
        }
        if fds[1].revents != 0 {
            return;
        }
        // Drain everything queued: one flag covers any number of messages.
        loop {
            // SAFETY: buf is valid for buf.len() bytes.
            let n = unsafe {
                libc::recv(
                    socket.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                flags.changed.store(true, Ordering::Release);
                continue;
            }
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EAGAIN) => break,
                Some(libc::EINTR) => continue,
                // Notifications were lost (socket buffer overrun): some
                // change happened, which is all the flag says, and the
                // whole view is re-read anyway.
                Some(libc::ENOBUFS) => {
                    flags.changed.store(true, Ordering::Release);
                    if flags.overruns.count() {
                        warn_overrun(socket);
                    }
                }
                _ => return fail(flags, "reading", err),
            }
        }
    }
}

/// The one warning of a run about overruns.
fn warn_overrun(socket: &Socket) {
    let buffer = match socket.get_rx_buf_sz() {
        Ok(bytes) => format!("{bytes} bytes"),
        Err(e) => format!("size unknown: {e}"),
    };
    tracing::warn!(
        "data-plane change notifications were lost: the netlink socket's receive buffer \
         ({buffer}) overran (ENOBUFS) while the data plane changed faster than they \
         were read; the whole data plane is re-read at the next interval, so the view \
         stays exact. Said once: later overruns are only counted \
         (observer_netlink_overruns_total)"
    );
}

fn fail(flags: &Flags, doing: &str, err: std::io::Error) {
    tracing::warn!(
        "data-plane change watcher stopped {doing} its netlink socket: {err}; \
         every refresh now re-reads the data plane"
    );
    flags.failed.store(true, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_overrun_is_said_and_every_one_counted() {
        let overruns = Overruns::default();
        assert_eq!(overruns.total(), 0);
        assert!(overruns.count(), "the first overrun is logged");
        assert!(!overruns.count(), "the second is only counted");
        assert!(!overruns.count());
        assert_eq!(overruns.total(), 3);
    }
}
