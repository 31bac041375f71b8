//! Node A with a pod behind a Calico-style veth, node B, and Calico's
//! VXLAN overlay between them: the topology of the tests of what happens
//! after decapsulation (`after_decap.rs`) and of inner TCP (`inner_tcp.rs`).
//!
//! ```text
//!   pod P: eth0 198.19.1.5/32 <-veth-> caliA1   node A: va 198.18.0.1  <-veth->  node B: vb 198.18.0.2
//!                                               vxlan.calico, block 198.19.1.0/24   vxlan.calico, block 198.19.2.0/24
//! ```

use observer_testkit::pair::{A_MAC_BYTES, B_IP, B_MAC_BYTES, NODE_A, Pair};

use super::{
    calico::{final_snapshot, settle},
    frames::{self, ETH_P_IP},
    netns::{Netns, ObserverProcess, ObserverRun, send_frames},
};

/// A's pod behind caliA1.
pub const POD: &str = "198.19.1.5";
/// The MAC of A's vxlan.calico ([`NODE_A`]'s VTEP).
const A_VTEP_MAC_BYTES: [u8; 6] = [2, 0, 0, 0, 1, 0x0a];
/// The MAC of B's vxlan.calico.
const B_VTEP_MAC_BYTES: [u8; 6] = [2, 0, 0, 0, 1, 0x0b];

/// Nodes A and B with Calico's VXLAN overlay; A also has pod P behind
/// caliA1 (Calico's way: a /32 route to the pod, the pod's gateway
/// 169.254.1.1 at caliA1's MAC ee:ee:ee:ee:ee:ee, here a static
/// neighbour where Calico answers by proxy ARP) and forwards.
pub struct Lab {
    pub pair: Pair,
    pub pod: Netns,
}

impl Lab {
    pub fn new(tag: &str) -> Lab {
        let pair = Pair::new(tag);
        pair.calico();
        let pod = Netns::new(&format!("{tag}p"));
        let a = &pair.a;
        a.ip(&[
            "link",
            "add",
            "caliA1",
            "address",
            "ee:ee:ee:ee:ee:ee",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ]);
        a.ip(&["link", "set", "caliA1", "up"]);
        a.exec_ok(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        a.ip(&["route", "add", &format!("{POD}/32"), "dev", "caliA1"]);
        pod.ip(&["addr", "add", &format!("{POD}/32"), "dev", "eth0"]);
        pod.ip(&["link", "set", "eth0", "up"]);
        pod.ip(&[
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ]);
        pod.ip(&[
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ]);
        pod.neigh("169.254.1.1", "ee:ee:ee:ee:ee:ee", "eth0");
        Lab { pair, pod }
    }

    /// The observer on A's underlay veth, with the default `--after-decap`.
    pub fn observe(&self) -> ObserverProcess {
        self.observe_with(&[])
    }

    /// The same, with more options `args`.
    pub fn observe_with(&self, args: &[&str]) -> ObserverProcess {
        let observer = ObserverProcess::start(
            Some(self.pair.a.name()),
            &[self.pair.a_iface()],
            &[&["--interval", "200ms"], args].concat(),
        );
        observer.wait_ready(1);
        // The data-plane view (and so the watched devices and the block
        // owners) is read before the first interval.
        settle(&observer);
        observer
    }

    /// `count` VXLAN frames from B's underlay veth to A's vxlan.calico, each
    /// carrying `inner` (an IPv4 packet) from B's VTEP.
    pub fn send_from_b(&self, inner: &[u8], count: u32) {
        send_vxlan_from_b(&self.pair, inner, count);
    }
}

/// `count` VXLAN frames from B's underlay veth to A's vxlan.calico
/// ([`Pair::calico`]), each carrying `inner` (an IPv4 packet) from B's
/// VTEP, the outer UDP checksum computed.
pub fn send_vxlan_from_b(pair: &Pair, inner: &[u8], count: u32) {
    let inner_frame = frames::ethernet(A_VTEP_MAC_BYTES, B_VTEP_MAC_BYTES, &[], ETH_P_IP, inner);
    let payload = frames::cat(&[&frames::vxlan_header(4096), &inner_frame]);
    let mut frame = frames::udp_frame(
        frames::addr(B_IP),
        frames::addr(NODE_A.underlay),
        frames::ENTROPY_PORT,
        4789,
        &payload,
    );
    frames::set_macs(&mut frame, A_MAC_BYTES, B_MAC_BYTES);
    send_frames(&pair.b, pair.b_iface(), vec![(frame, count)]);
}

/// An IPv4 TCP SYN from B's pod to A's pod `dst` (MSS 1460), its checksum
/// right or, with `wrong`, off by a flipped byte: what a node whose
/// checksum offload is broken sends.
pub fn syn_from_b_pod(dst: &str, wrong: bool) -> Vec<u8> {
    use observer_testkit::pair::NODE_B;
    let mut syn = frames::tcp_segment(
        frames::addr(NODE_B.pod),
        frames::addr(dst),
        [40000, 8080],
        frames::TCP_SYN,
        &frames::TCP_OPT_MSS_1460,
        &[],
    );
    if wrong {
        syn[16] ^= 0x5a;
    }
    frames::ipv4(frames::addr4(NODE_B.pod), frames::addr4(dst), 6, &syn)
}

/// The `tcp` member (SYN, SYN-ACK, RST, MSS over) of the final snapshot's
/// VXLAN peer line on `iface` in `direction` for B; zeros without one.
pub fn tcp_of(run: &ObserverRun, iface: &str, direction: &str) -> [u64; 4] {
    let Some(line) = final_snapshot(run).iter().find(|l| {
        l["type"] == "peer"
            && l["iface"] == iface
            && l["direction"] == direction
            && l["proto"] == "vxlan"
            && l["peer"] == B_IP
    }) else {
        return [0; 4];
    };
    let n = |k: &str| line["tcp"][k].as_u64().unwrap_or(0);
    [n("syn"), n("syn_ack"), n("rst"), n("mss_over")]
}

/// A listener on B's pod address (on B's lo, [`Pair::calico`]): the kernel
/// answers SYNs with SYN-ACKs whether or not anything accepts.
pub fn listen_on_b_pod(b: &Netns) -> (std::net::TcpListener, std::net::SocketAddr) {
    let port = super::netns::free_port(b);
    let addr: std::net::SocketAddr = format!("{}:{port}", observer_testkit::pair::NODE_B.pod)
        .parse()
        .unwrap();
    let listener = super::netns::in_netns(b.name(), move || std::net::TcpListener::bind(addr))
        .expect("bind on B's pod");
    (listener, addr)
}

/// One connection attempt from namespace `ns` to `addr`: whether it was
/// answered within `timeout`.
pub fn connect_from(ns: &Netns, addr: std::net::SocketAddr, timeout: std::time::Duration) -> bool {
    super::netns::in_netns(ns.name(), move || {
        std::net::TcpStream::connect_timeout(&addr, timeout).is_ok()
    })
}

/// Drops the SYN-ACKs `ns` sends (iptables OUTPUT, commented `comment`).
pub fn drop_syn_acks(ns: &Netns, comment: &str) {
    super::calico::iptables_drop(
        ns,
        &[
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "--tcp-flags",
            "SYN,ACK",
            "SYN,ACK",
        ],
        comment,
    );
}
