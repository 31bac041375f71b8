//! The rtnetlink side: one NETLINK_ROUTE socket, dump requests read until
//! NLMSG_DONE. What the messages say is decoded by `decode`.

use std::net::IpAddr;

use anyhow::{Context, Result, anyhow, bail};
use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_MULTIPART, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR,
    NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage, address::AddressMessage, link::LinkMessage,
    neighbour::NeighbourMessage, route::RouteAttribute, route::RouteMessage,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use crate::model::dataplane::{DeclaredTunnel, Dump, PeerRoute};
use crate::parse::netlink::{self as decode, DumpDecoder};

/// How often a dump is retried when the kernel says that the tables
/// changed while it was being read (NLM_F_DUMP_INTR).
const DUMP_ATTEMPTS: usize = 5;

/// How the kernel answered one request.
enum Reply {
    /// Every message of the answer.
    Complete(Vec<RouteNetlinkMessage>),
    /// The dump was interrupted by a change: read it again.
    Interrupted,
    /// The kernel refused the request with this error.
    Refused(std::io::Error),
}

/// A NETLINK_ROUTE socket in the calling thread's network namespace.
pub(super) struct Rtnl {
    socket: Socket,
    seq: u32,
}

impl Rtnl {
    /// Opens and binds the socket.
    pub fn open() -> Result<Rtnl> {
        let mut socket = Socket::new(NETLINK_ROUTE)
            .context("opening a NETLINK_ROUTE socket (the data plane is read through rtnetlink)")?;
        socket
            .bind_auto()
            .context("binding the NETLINK_ROUTE socket")?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .context("connecting the NETLINK_ROUTE socket to the kernel")?;
        Ok(Rtnl { socket, seq: 0 })
    }

    /// Links, addresses, routes, neighbours and the vxlan FDB.
    pub fn dump_all(&mut self, declared: &[DeclaredTunnel]) -> Result<Dump> {
        let links = self.dump(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            "dumping links (RTM_GETLINK)",
        )?;
        let mut decoder = DumpDecoder::new(links, declared);
        decoder.addresses(self.dump(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            "dumping addresses (RTM_GETADDR)",
        )?);
        for (family, what) in [
            (AddressFamily::Inet, "dumping IPv4 routes (RTM_GETROUTE)"),
            (AddressFamily::Inet6, "dumping IPv6 routes (RTM_GETROUTE)"),
        ] {
            let mut request = RouteMessage::default();
            request.header.address_family = family;
            decoder.routes(self.dump(RouteNetlinkMessage::GetRoute(request), what)?);
        }
        for (family, what) in [
            (
                AddressFamily::Inet,
                "dumping IPv4 neighbours (RTM_GETNEIGH)",
            ),
            (
                AddressFamily::Inet6,
                "dumping IPv6 neighbours (RTM_GETNEIGH)",
            ),
            (
                AddressFamily::Bridge,
                "dumping the FDB (RTM_GETNEIGH, AF_BRIDGE)",
            ),
        ] {
            let mut request = NeighbourMessage::default();
            request.header.family = family;
            decoder.neighbours(
                family,
                self.dump(RouteNetlinkMessage::GetNeighbour(request), what)?,
            );
        }
        Ok(decoder.finish())
    }

    /// The kernel's route to `node` (`ip route get NODE`); `None` when the
    /// node is unreachable or one of this node's own addresses.
    pub fn route_to(&mut self, node: IpAddr) -> Result<Option<PeerRoute>> {
        let mut request = RouteMessage::default();
        (
            request.header.address_family,
            request.header.destination_prefix_length,
        ) = match node {
            IpAddr::V4(_) => (AddressFamily::Inet, 32),
            IpAddr::V6(_) => (AddressFamily::Inet6, 128),
        };
        request
            .attributes
            .push(RouteAttribute::Destination(node.into()));
        let what = format!("looking up the route to peer node {node} (RTM_GETROUTE)");
        let replies = match self.exchange(RouteNetlinkMessage::GetRoute(request), false, &what)? {
            Reply::Complete(replies) => replies,
            Reply::Refused(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ENETDOWN)
                ) =>
            {
                return Ok(None);
            }
            Reply::Refused(e) => return Err(e).context(what),
            // Only dumps are ever interrupted; a lookup has nothing to retry.
            Reply::Interrupted => return Ok(None),
        };
        Ok(decode::peer_route(node, replies))
    }

    /// A dump request, retried while the kernel reports it interrupted.
    fn dump(
        &mut self,
        request: RouteNetlinkMessage,
        what: &str,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        for _ in 0..DUMP_ATTEMPTS {
            match self.exchange(request.clone(), true, what)? {
                Reply::Complete(replies) => return Ok(replies),
                Reply::Interrupted => continue,
                Reply::Refused(e) => return Err(e).context(what.to_string()),
            }
        }
        bail!(
            "{what}: the kernel's tables changed during each of {DUMP_ATTEMPTS} dumps \
             (NLM_F_DUMP_INTR); the data plane is being rewritten, read it again later"
        )
    }

    /// Sends one request and reads its answer: until NLMSG_DONE for a
    /// dump, else until the first message that is not part of a multipart
    /// answer.
    fn exchange(&mut self, request: RouteNetlinkMessage, dump: bool, what: &str) -> Result<Reply> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { 0 };
        header.sequence_number = self.seq;
        let mut message = NetlinkMessage::new(header, NetlinkPayload::from(request));
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        self.socket
            .send(&bytes, 0)
            .with_context(|| format!("{what}: sending the request"))?;

        let mut replies = Vec::new();
        let mut interrupted = false;
        loop {
            let (data, _) = self
                .socket
                .recv_from_full()
                .with_context(|| format!("{what}: reading the answer"))?;
            for envelope in decode::envelopes(&data) {
                let envelope = envelope.map_err(|length| {
                    anyhow!("{what}: the kernel sent a malformed netlink message (length {length})")
                })?;
                // A late answer to an earlier request that gave up early.
                if envelope.seq != self.seq {
                    continue;
                }
                interrupted |= envelope.flags & NLM_F_DUMP_INTR != 0;
                match envelope.kind {
                    // DONE and ERROR both carry an errno (0: success).
                    NLMSG_DONE | NLMSG_ERROR => {
                        let code = envelope.code();
                        return Ok(if code < 0 {
                            // Saturating: i32::MIN has no positive errno.
                            Reply::Refused(std::io::Error::from_raw_os_error(code.saturating_neg()))
                        } else if interrupted {
                            Reply::Interrupted
                        } else {
                            Reply::Complete(replies)
                        });
                    }
                    _ => match envelope.route_message() {
                        Ok(message) => replies.extend(message),
                        Err(e) => {
                            tracing::warn!("{what}: skipping a message the parser rejects: {e}")
                        }
                    },
                }
                if !dump && envelope.flags & NLM_F_MULTIPART == 0 {
                    return Ok(Reply::Complete(replies));
                }
            }
        }
    }
}
