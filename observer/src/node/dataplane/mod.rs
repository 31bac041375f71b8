//! Reads the node's data plane through rtnetlink (never by running a
//! tool) into `model::dataplane`'s view, and says when it changed
//! ([`ChangeWatcher`]). Everything is read in the network namespace of the
//! calling thread. [`LiveView`] is the view kept current by both.

mod live;
mod netlink;
mod watch;

use std::net::IpAddr;

use anyhow::Result;

use crate::model::dataplane::{DataPlane, DeclaredTunnel, PeerRoute};
pub use live::LiveView;
pub use watch::ChangeWatcher;

/// Reads the view of the calling thread's network namespace (rtnetlink
/// dumps of links, addresses, routes, neighbours and the bridge FDB, then
/// one route lookup per peer node).
pub fn read() -> Result<DataPlane> {
    read_declaring(&[])
}

/// [`read`], also counting the `declared` devices as tunnels.
pub fn read_declaring(declared: &[DeclaredTunnel]) -> Result<DataPlane> {
    let mut rtnl = netlink::Rtnl::open()?;
    let dump = rtnl.dump_all(declared)?;
    DataPlane::assemble(dump, |node: IpAddr| -> Result<Option<PeerRoute>> {
        rtnl.route_to(node)
    })
}
