//! A two-node VXLAN overlay built the way Calico builds it: pod-block
//! routes via `vxlan.calico`, onlink, through the peer's VTEP address, with
//! permanent neighbour and FDB entries; so the data plane names each node,
//! its pod block and its encapsulation.
//!
//! ```text
//!   ns A: va 198.18.0.1/24  <-veth->  ns B: vb 198.18.0.2/24
//!   vxlan.calico VNI 4096 / 4789      vxlan.calico VNI 4096 / 4789
//!   pod 198.19.1.1 (block .1.0/24)    pod 198.19.2.1 (block .2.0/24)
//! ```

use std::process::{Child, Command, Stdio};

use super::netns::{Netns, VethEnd, veth_pair};

/// MACs of the underlay veth ends (A's va, B's vb).
pub const A_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x0a];
/// See [`A_MAC`].
pub const B_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x0b];

/// Node A's underlay address.
pub const A_IP: &str = "198.18.0.1";
/// Node B's underlay address.
pub const B_IP: &str = "198.18.0.2";

fn mac(bytes: [u8; 6]) -> String {
    bytes.map(|b| format!("{b:02x}")).join(":")
}

/// One node of the overlay.
pub struct Node {
    pub underlay: &'static str,
    pub vtep_mac: &'static str,
    /// The vxlan device's own address: the pod block's first address.
    pub vtep_ip: &'static str,
    pub block: &'static str,
    pub pod: &'static str,
}

/// Node A.
pub const NODE_A: Node = Node {
    underlay: A_IP,
    vtep_mac: "02:00:00:00:01:0a",
    vtep_ip: "198.19.1.0",
    block: "198.19.1.0/24",
    pod: "198.19.1.1",
};
/// Node B.
pub const NODE_B: Node = Node {
    underlay: B_IP,
    vtep_mac: "02:00:00:00:01:0b",
    vtep_ip: "198.19.2.0",
    block: "198.19.2.0/24",
    pod: "198.19.2.1",
};

/// Two namespaces with the overlay; dropped (deleted) at the end of the test.
pub struct Overlay {
    pub a: Netns,
    pub b: Netns,
}

impl Overlay {
    pub fn new(tag: &str) -> Overlay {
        let a = Netns::new(&format!("{tag}a"));
        let b = Netns::new(&format!("{tag}b"));
        let end = |iface: &str, mac: &str, addr: &str| VethEnd {
            iface: iface.into(),
            mac: mac.into(),
            addr: addr.into(),
        };
        veth_pair(
            &a,
            &end("va", &mac(A_MAC), A_IP),
            &b,
            &end("vb", &mac(B_MAC), B_IP),
            24,
        );
        for (ns, dev, me, peer) in [(&a, "va", &NODE_A, &NODE_B), (&b, "vb", &NODE_B, &NODE_A)] {
            ns.ip(&[
                "link",
                "add",
                "vxlan.calico",
                "address",
                me.vtep_mac,
                "type",
                "vxlan",
                "id",
                "4096",
                "dstport",
                "4789",
                "local",
                me.underlay,
                "dev",
                dev,
                "nolearning",
            ]);
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
        Overlay { a, b }
    }
}

/// `ping` from `from`'s pod to `to`'s pod, in the background.
pub fn ping(ns: &Netns, from: &Node, to: &Node, count: u32) -> Child {
    Command::new("ip")
        .args(["netns", "exec", ns.name(), "ping", "-q", "-i", "0.2", "-c"])
        .arg(count.to_string())
        .args(["-I", from.pod, to.pod])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ping")
}
