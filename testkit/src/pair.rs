//! The two-namespace setup that the namespace, monitor, drop, replay,
//! anomaly and diagnose tests and `cargo xtask soak` share: namespaces A
//! and B joined by a veth pair with fixed MACs and addresses and static
//! neighbour entries (IPv6 off), so that the only frames on the wire are
//! the ones a test sends; optionally a VXLAN device on each side, in one of
//! three styles.
//!
//! ```text
//!   ns A: va 198.18.0.1/24 02:00:00:00:00:0a  <-veth->  ns B: vb 198.18.0.2/24 02:00:00:00:00:0b
//!
//!   vxlan()   vx0 198.19.0.1/24               <->  vx0 198.19.0.2/24
//!             VNI 4096, UDP 4789, unicast remote, static neighbour
//!   flannel() flannel.1 198.19.1.0/32         <->  flannel.1 198.19.2.0/32
//!             VNI 1, UDP 8472, no learning, route to the peer's /24 onlink, neighbour + FDB
//!   calico()  vxlan.calico 198.19.1.0/32      <->  vxlan.calico 198.19.2.0/32
//!             VNI 4096, UDP 4789, MTU 1450, no learning, pod 198.19.1.1 on lo
//!             (block .1.0/24), route to the peer's block onlink, neighbour + FDB
//! ```
//!
//! The VTEPs' MACs are 02:00:00:00:01:0a (A) and 02:00:00:00:01:0b (B).
//! The interface names can be changed ([`Pair::with_ifaces`]); the
//! addresses and MACs cannot, tests assert them.

use std::process::{Child, Command, Stdio};

use crate::netns::{CmdError, Netns, VethEnd, VxlanDevice, or_panic, veth_pair_checked};

/// A's underlay address.
pub const A_IP: &str = "198.18.0.1";
/// B's underlay address.
pub const B_IP: &str = "198.18.0.2";
/// MAC of A's veth end.
pub const A_MAC: &str = "02:00:00:00:00:0a";
/// MAC of B's veth end.
pub const B_MAC: &str = "02:00:00:00:00:0b";
/// [`A_MAC`] as bytes (for crafted frames).
pub const A_MAC_BYTES: [u8; 6] = [2, 0, 0, 0, 0, 0x0a];
/// [`B_MAC`] as bytes.
pub const B_MAC_BYTES: [u8; 6] = [2, 0, 0, 0, 0, 0x0b];
/// MAC of A's VXLAN device (VTEP).
pub const A_VTEP_MAC: &str = "02:00:00:00:01:0a";
/// MAC of B's VXLAN device.
pub const B_VTEP_MAC: &str = "02:00:00:00:01:0b";
/// A's address on vx0 ([`Pair::vxlan`]).
pub const A_INNER: &str = "198.19.0.1";
/// B's address on vx0.
pub const B_INNER: &str = "198.19.0.2";

/// One side of the pair, as a node of an overlay.
pub struct Node {
    /// Underlay address (on the veth end).
    pub underlay: &'static str,
    /// MAC of the veth end.
    pub mac: &'static str,
    /// MAC of the VXLAN device.
    pub vtep_mac: &'static str,
    /// Address on vx0 ([`Pair::vxlan`]).
    pub inner: &'static str,
    /// The flannel.1 / vxlan.calico device's own address: the pod block's
    /// first address.
    pub vtep_ip: &'static str,
    /// The node's pod block.
    pub block: &'static str,
    /// A pod address in the block ([`Pair::calico`] puts it on lo).
    pub pod: &'static str,
}

/// Node A.
pub const NODE_A: Node = Node {
    underlay: A_IP,
    mac: A_MAC,
    vtep_mac: A_VTEP_MAC,
    inner: A_INNER,
    vtep_ip: "198.19.1.0",
    block: "198.19.1.0/24",
    pod: "198.19.1.1",
};
/// Node B.
pub const NODE_B: Node = Node {
    underlay: B_IP,
    mac: B_MAC,
    vtep_mac: B_VTEP_MAC,
    inner: B_INNER,
    vtep_ip: "198.19.2.0",
    block: "198.19.2.0/24",
    pod: "198.19.2.1",
};

/// Whether [`Pair::vxlan`]'s devices name the veth as their lower device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lower {
    /// `dev va`, as Calico creates its device.
    Veth,
    /// None: the route to the remote picks it, so deleting the veth leaves
    /// vx0 in place, working again once [`Pair::underlay`] is back.
    Route,
}

/// The VXLAN devices a [`Pair`] method made: what a test pings and what
/// the observer must report.
#[derive(Debug, Clone, Copy)]
pub struct Vxlan {
    /// Device name (the same on both sides).
    pub dev: &'static str,
    /// Outer UDP destination port.
    pub port: u16,
    /// VNI.
    pub vni: u64,
    /// A's inner address (ping source).
    pub a_inner: &'static str,
    /// B's inner address (ping target).
    pub b_inner: &'static str,
}

/// Two namespaces joined by va (in A) <-> vb (in B), deleted on drop.
/// Declare it before the processes that run in it, so that they are
/// dropped (stopped) first.
pub struct Pair {
    /// Namespace A (the observed side in most tests).
    pub a: Netns,
    /// Namespace B.
    pub b: Netns,
    ifaces: [String; 2],
}

impl Pair {
    /// Namespaces `obs<tag>a…` and `obs<tag>b…` (unique names), joined by va <-> vb.
    pub fn new(tag: &str) -> Pair {
        Pair::with_ifaces(tag, "va", "vb")
    }

    /// Like [`Pair::new`], with other names for the veth ends.
    pub fn with_ifaces(tag: &str, a_iface: &str, b_iface: &str) -> Pair {
        let a = Netns::new(&format!("{tag}a"));
        let b = Netns::new(&format!("{tag}b"));
        or_panic(Pair::build(a, b, a_iface, b_iface))
    }

    /// Joins the namespaces `a` and `b` (from [`Netns::create`] where the
    /// names matter) by `a_iface` <-> `b_iface`.
    pub fn build(a: Netns, b: Netns, a_iface: &str, b_iface: &str) -> Result<Pair, CmdError> {
        let pair = Pair {
            a,
            b,
            ifaces: [a_iface.to_string(), b_iface.to_string()],
        };
        pair.underlay_checked()?;
        Ok(pair)
    }

    /// A's veth end (va).
    pub fn a_iface(&self) -> &str {
        &self.ifaces[0]
    }

    /// B's veth end (vb).
    pub fn b_iface(&self) -> &str {
        &self.ifaces[1]
    }

    /// (Re-)creates the veth pair with its addresses and static neighbours
    /// (again after a test deleted it).
    pub fn underlay(&self) {
        or_panic(self.underlay_checked())
    }

    /// See [`Pair::underlay`].
    pub fn underlay_checked(&self) -> Result<(), CmdError> {
        veth_pair_checked(
            &self.a,
            &VethEnd::new(self.a_iface(), A_MAC, A_IP),
            &self.b,
            &VethEnd::new(self.b_iface(), B_MAC, B_IP),
            24,
        )
    }

    /// vx0 on each side: VNI 4096, UDP 4789, unicast remote, the inner
    /// addresses 198.19.0.1/24 and .2 with static neighbour entries.
    pub fn vxlan(&self, lower: Lower) -> Vxlan {
        or_panic(self.vxlan_checked(lower))
    }

    /// See [`Pair::vxlan`].
    pub fn vxlan_checked(&self, lower: Lower) -> Result<Vxlan, CmdError> {
        for (ns, iface, me, peer) in self.sides() {
            ns.add_vxlan_checked(&VxlanDevice {
                name: "vx0",
                mac: me.vtep_mac,
                vni: 4096,
                port: 4789,
                local: me.underlay,
                remote: Some(peer.underlay),
                lower: (lower == Lower::Veth).then_some(iface),
                learning: true,
            })?;
            ns.ip_checked(&["addr", "add", &format!("{}/24", me.inner), "dev", "vx0"])?;
            ns.ip_checked(&["link", "set", "vx0", "up"])?;
            ns.neigh_checked(peer.inner, peer.vtep_mac, "vx0")?;
        }
        Ok(Vxlan {
            dev: "vx0",
            port: 4789,
            vni: 4096,
            a_inner: A_INNER,
            b_inner: B_INNER,
        })
    }

    /// flannel-style: device `flannel.1`, VNI 1, port 8472, no learning, a
    /// /32 on the device, a route to the peer's subnet via its .0 address
    /// onlink, and static neighbour + FDB entries, as flanneld programs them.
    pub fn flannel(&self) -> Vxlan {
        for (ns, iface, me, peer) in self.sides() {
            ns.add_vxlan(&VxlanDevice {
                name: "flannel.1",
                mac: me.vtep_mac,
                vni: 1,
                port: 8472,
                local: me.underlay,
                remote: None,
                lower: Some(iface),
                learning: false,
            });
            ns.ip(&[
                "addr",
                "add",
                &format!("{}/32", me.vtep_ip),
                "dev",
                "flannel.1",
            ]);
            ns.ip(&["link", "set", "flannel.1", "up"]);
            ns.ip(&[
                "route",
                "add",
                peer.block,
                "via",
                peer.vtep_ip,
                "dev",
                "flannel.1",
                "onlink",
            ]);
            ns.neigh(peer.vtep_ip, peer.vtep_mac, "flannel.1");
            ns.bridge(&[
                "fdb",
                "append",
                peer.vtep_mac,
                "dev",
                "flannel.1",
                "dst",
                peer.underlay,
            ]);
        }
        Vxlan {
            dev: "flannel.1",
            port: 8472,
            vni: 1,
            a_inner: NODE_A.vtep_ip,
            b_inner: NODE_B.vtep_ip,
        }
    }

    /// A two-node VXLAN overlay built the way Calico builds it: pod-block
    /// routes via `vxlan.calico`, onlink, through the peer's VTEP address,
    /// with permanent neighbour and FDB entries; so the data plane names
    /// each node, its pod block and its encapsulation. The inner addresses
    /// returned are the pods' ([`ping_pod`]).
    pub fn calico(&self) -> Vxlan {
        for (ns, iface, me, peer) in self.sides() {
            ns.add_vxlan(&VxlanDevice {
                name: "vxlan.calico",
                mac: me.vtep_mac,
                vni: 4096,
                port: 4789,
                local: me.underlay,
                remote: None,
                lower: Some(iface),
                learning: false,
            });
            ns.ip(&["link", "set", "vxlan.calico", "mtu", "1450", "up"]);
            ns.ip(&[
                "addr",
                "add",
                &format!("{}/32", me.vtep_ip),
                "dev",
                "vxlan.calico",
            ]);
            // The pod address lives on lo (this kernel has no dummy device).
            ns.ip(&["addr", "add", &format!("{}/32", me.pod), "dev", "lo"]);
            ns.ip(&[
                "route",
                "add",
                peer.block,
                "via",
                peer.vtep_ip,
                "dev",
                "vxlan.calico",
                "onlink",
                "src",
                me.pod,
            ]);
            ns.neigh(peer.vtep_ip, peer.vtep_mac, "vxlan.calico");
            ns.bridge(&[
                "fdb",
                "append",
                peer.vtep_mac,
                "dev",
                "vxlan.calico",
                "dst",
                peer.underlay,
                "self",
                "permanent",
            ]);
        }
        Vxlan {
            dev: "vxlan.calico",
            port: 4789,
            vni: 4096,
            a_inner: NODE_A.pod,
            b_inner: NODE_B.pod,
        }
    }

    /// A forgets B's VTEP after [`Pair::calico`]: deletes its FDB entry for
    /// B's vxlan.calico MAC, so vxlan_xmit has no remote for B's pods.
    pub fn forget_peer_vtep(&self) {
        self.a.bridge(&[
            "fdb",
            "del",
            B_VTEP_MAC,
            "dev",
            "vxlan.calico",
            "dst",
            B_IP,
            "self",
        ]);
    }

    /// (namespace, veth end, this node, the peer) for A, then for B.
    fn sides(&self) -> [(&Netns, &str, &'static Node, &'static Node); 2] {
        [
            (&self.a, self.a_iface(), &NODE_A, &NODE_B),
            (&self.b, self.b_iface(), &NODE_B, &NODE_A),
        ]
    }
}

/// `ping` from `from`'s pod to `to`'s pod ([`Pair::calico`]), in the
/// background, in namespace `ns`.
pub fn ping_pod(ns: &Netns, from: &Node, to: &Node, count: u32) -> Child {
    Command::new("ip")
        .args(["netns", "exec", ns.name(), "ping", "-q", "-i", "0.2", "-c"])
        .arg(count.to_string())
        .args(["-I", from.pod, to.pod])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ping")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte and text forms of the MACs agree (frames use one, `ip` the other).
    #[test]
    fn macs_agree() {
        let text = |bytes: [u8; 6]| bytes.map(|b| format!("{b:02x}")).join(":");
        assert_eq!(text(A_MAC_BYTES), A_MAC);
        assert_eq!(text(B_MAC_BYTES), B_MAC);
    }
}
