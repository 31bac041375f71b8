//! The lab's network: the incident's GPU node, a router and two
//! control-plane nodes in network namespaces, each node with Calico's
//! devices (`vxlan.calico`, `tunl0`), routes, neighbour and FDB entries,
//! allow-sets and `cali-INPUT` rules, and the router's per-scenario
//! misbehaviour.
//!
//! ```text
//!  gpu 10.10.10.62 eth0 ── to-gpu 10.10.10.244 [router] br-cp 10.10.60.1 ─┬─ eth0 cp1 10.10.60.127
//!                                                                           └─ eth0 cp2 10.10.60.209
//! ```
//!
//! Pod addresses live on `lo` (works on kernels without the dummy driver).
//! IPv6 is off so that only the lab's pings cross the underlay.

use std::net::Ipv4Addr;

use anyhow::{Context, Result};
use ipnet::Ipv4Net;
use serde::Serialize;

use super::{
    cleanup::{Cleanup, PREFIX, check_interrupted},
    shell::{in_ns, run_tool},
    tunnel::{Routes, Tunnel},
};
use crate::cli::Scenario;

/// The nodes' underlay interface, where the observers attach.
pub const UNDERLAY: &str = "eth0";
/// Calico's VXLAN device and its parameters.
const VXLAN_DEV: &str = "vxlan.calico";
const VXLAN_VNI: &str = "4096";
const VXLAN_PORT: &str = "4789";
const VXLAN_MTU: &str = "1450";
/// Calico's IPIP device and its MTU (1500 - 20).
const IPIP_DEV: &str = "tunl0";
const IPIP_MTU: &str = "1480";
/// The router's interfaces: toward the GPU node, and the bridge of the
/// control-plane segment.
pub const ROUTER_GPU_SIDE: &str = "to-gpu";
const ROUTER_CP_BRIDGE: &str = "br-cp";
/// The router's address on the GPU side: the SNAT source of the incident.
pub const ROUTER_GPU_ADDR: Ipv4Addr = Ipv4Addr::new(10, 10, 10, 244);
const ROUTER_CP_ADDR: Ipv4Addr = Ipv4Addr::new(10, 10, 60, 1);

/// Calico's allow-sets: VXLAN sources, and IPIP sources (all hosts).
pub const VXLAN_SET: &str = "cali40all-vxlan-net";
const HOSTS_SET: &str = "cali40all-hosts-net";

/// One of Calico's rule pairs in `cali-INPUT`, with the comments Calico
/// gives them (the observer finds the drop rule by its comment).
pub struct RulePair {
    /// Encapsulation it filters (`vxlan`, `ipip`).
    pub proto: &'static str,
    /// iptables arguments matching that encapsulation.
    pub matches: &'static [&'static str],
    /// The allow-set its sources must be in.
    pub set: &'static str,
    /// Comment of the ACCEPT rule.
    pub allow: &'static str,
    /// Comment of the DROP rule.
    pub drop: &'static str,
}

/// Calico's VXLAN and IPIP rule pairs, as docs/incidents.md quotes them.
pub const RULES: [RulePair; 2] = [
    RulePair {
        proto: "vxlan",
        matches: &["-p", "udp", "--dport", VXLAN_PORT],
        set: VXLAN_SET,
        allow: "Allow IPv4 VXLAN packets from allowed hosts",
        drop: "Drop IPv4 VXLAN packets from non-allowed hosts",
    },
    RulePair {
        proto: "ipip",
        matches: &["-p", "4"],
        set: HOSTS_SET,
        allow: "Allow IPIP packets from Calico hosts",
        drop: "Drop IPIP packets from non-Calico hosts",
    },
];

/// Which pod block a ping uses, and so which encapsulation Calico's
/// routes prescribe for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Block {
    /// The pool routed over `vxlan.calico`.
    Vxlan,
    /// The throwaway pool routed over `tunl0` (the decisive experiment).
    Ipip,
}

impl Block {
    /// Both blocks.
    pub const ALL: [Block; 2] = [Block::Vxlan, Block::Ipip];

    /// The observer's protocol name for this encapsulation.
    pub fn proto(self) -> &'static str {
        match self {
            Block::Vxlan => "vxlan",
            Block::Ipip => "ipip",
        }
    }
}

/// A node of the lab, with the incident's addresses.
#[derive(Debug)]
pub struct NodeSpec {
    /// Role, also the namespace suffix: `gpu`, `cp1`, `cp2`.
    pub name: &'static str,
    /// Underlay address (/24 on eth0).
    pub addr: Ipv4Addr,
    /// Default gateway (the router).
    pub gateway: Ipv4Addr,
    /// MAC of its vxlan.calico (the VTEP), named by the others' neighbour
    /// and FDB entries.
    pub vtep_mac: &'static str,
    /// Its VXLAN pod block (/26); the first address is on vxlan.calico.
    pub vxlan_block: Ipv4Net,
    /// Its pod address in that block (the pings' source and target).
    pub vxlan_pod: Ipv4Addr,
    /// Its IPIP pod block (/26); the first address is on tunl0.
    pub ipip_block: Ipv4Net,
    /// Its pod address in that block.
    pub ipip_pod: Ipv4Addr,
}

impl NodeSpec {
    /// The node's block of `block`.
    pub fn block(&self, block: Block) -> Ipv4Net {
        match block {
            Block::Vxlan => self.vxlan_block,
            Block::Ipip => self.ipip_block,
        }
    }

    /// The node's pod address in `block`.
    pub fn pod(&self, block: Block) -> Ipv4Addr {
        match block {
            Block::Vxlan => self.vxlan_pod,
            Block::Ipip => self.ipip_pod,
        }
    }
}

/// Index of the GPU node in [`NODES`].
pub const GPU: usize = 0;
/// Index of the first control-plane node.
pub const CP1: usize = 1;
/// Index of the second control-plane node.
pub const CP2: usize = 2;

/// The nodes: the GPU node behind the router, two control-plane nodes.
pub const NODES: [NodeSpec; 3] = [
    NodeSpec {
        name: "gpu",
        addr: Ipv4Addr::new(10, 10, 10, 62),
        gateway: ROUTER_GPU_ADDR,
        vtep_mac: "66:0b:5e:00:00:62",
        vxlan_block: Ipv4Net::new_assert(Ipv4Addr::new(10, 42, 182, 0), 26),
        vxlan_pod: Ipv4Addr::new(10, 42, 182, 1),
        ipip_block: Ipv4Net::new_assert(Ipv4Addr::new(10, 43, 182, 0), 26),
        ipip_pod: Ipv4Addr::new(10, 43, 182, 1),
    },
    NodeSpec {
        name: "cp1",
        addr: Ipv4Addr::new(10, 10, 60, 127),
        gateway: ROUTER_CP_ADDR,
        vtep_mac: "66:0b:5e:00:01:27",
        vxlan_block: Ipv4Net::new_assert(Ipv4Addr::new(10, 42, 168, 192), 26),
        vxlan_pod: Ipv4Addr::new(10, 42, 168, 210),
        ipip_block: Ipv4Net::new_assert(Ipv4Addr::new(10, 43, 168, 192), 26),
        ipip_pod: Ipv4Addr::new(10, 43, 168, 210),
    },
    NodeSpec {
        name: "cp2",
        addr: Ipv4Addr::new(10, 10, 60, 209),
        gateway: ROUTER_CP_ADDR,
        vtep_mac: "66:0b:5e:00:02:09",
        vxlan_block: Ipv4Net::new_assert(Ipv4Addr::new(10, 42, 10, 0), 26),
        vxlan_pod: Ipv4Addr::new(10, 42, 10, 1),
        ipip_block: Ipv4Net::new_assert(Ipv4Addr::new(10, 43, 10, 0), 26),
        ipip_pod: Ipv4Addr::new(10, 43, 10, 1),
    },
];

/// Namespace names of one lab run: `obslab-<pid>-<role>`.
#[derive(Debug, Clone)]
pub struct Names {
    /// Namespaces of [`NODES`], same order.
    pub nodes: [String; 3],
    /// The router's namespace.
    pub router: String,
}

impl Names {
    /// Names unique to process `pid`.
    pub fn new(pid: u32) -> Names {
        let ns = |role: &str| format!("{PREFIX}{pid}-{role}");
        Names {
            nodes: NODES.map(|n| ns(n.name)),
            router: ns("router"),
        }
    }
}

/// How `tunl0` is provided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IpipKind {
    /// The kernel's IPIP tunnel, as on a Calico node.
    Kernel,
    /// The lab's userspace tunnel on a TUN device (kernel without IPIP).
    Userspace,
}

/// Builds the whole lab for `scenario`; everything created is owned by
/// `lab`. Returns how tunl0 is provided.
pub fn build(lab: &mut Cleanup, names: &Names, scenario: Scenario) -> Result<IpipKind> {
    for ns in names.nodes.iter().chain([&names.router]) {
        // rp_filter off: IPIP and VXLAN replies may come back on another
        // device than the route out.
        add_namespace(
            lab,
            ns,
            &[
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
            ],
        )?;
    }
    router(names, scenario)?;
    check_interrupted()?;
    let mut kind = IpipKind::Kernel;
    for (i, node) in NODES.iter().enumerate() {
        let ns = &names.nodes[i];
        underlay(ns, node)?;
        vxlan(ns, node)?;
        kind = ipip(lab, ns, node)?;
        routes(ns, i, scenario)?;
        calico_filter(ns).with_context(|| format!("Calico's rules on {}", node.name))?;
        check_interrupted()?;
    }
    Ok(kind)
}

/// Creates namespace `ns` (owned by `lab`) with IPv6 off before any
/// device exists (no router solicitations or MLD reports in the counters),
/// no IGMP reports for link-local groups (the router's, sent to
/// 224.0.0.22 as its links come up and again a second later, reached
/// nodes whose observers had attached, which dropped them as members of
/// no such group: a kernel drop, reason NOT_SPECIFIED, in a healthy run)
/// and the `sysctls` given, and its loopback up.
pub fn add_namespace(lab: &mut Cleanup, ns: &str, sysctls: &[&str]) -> Result<()> {
    lab.add_namespace(ns)?;
    let mut argv = vec![
        "sysctl",
        "-qw",
        "net.ipv6.conf.all.disable_ipv6=1",
        "net.ipv6.conf.default.disable_ipv6=1",
        "net.ipv4.igmp_link_local_mcast_reports=0",
    ];
    argv.extend_from_slice(sysctls);
    in_ns(ns, &argv)?;
    run_tool("ip", &["-n", ns, "link", "set", "lo", "up"])?;
    check_interrupted()
}

/// `ip -n NS args...` with string arguments built by the caller.
fn ip(ns: &str, args: &[&str]) -> Result<()> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    run_tool("ip", &all).map(drop)
}

/// The router: a veth toward the GPU node, a bridge for the control
/// plane, forwarding on, and the scenario's NAT, filter and MTU.
fn router(names: &Names, scenario: Scenario) -> Result<()> {
    let r = names.router.as_str();
    in_ns(r, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    let gpu_side = format!("{ROUTER_GPU_ADDR}/24");
    ip(
        r,
        &[
            "link",
            "add",
            ROUTER_GPU_SIDE,
            "type",
            "veth",
            "peer",
            "name",
            UNDERLAY,
            "netns",
            &names.nodes[GPU],
        ],
    )?;
    ip(r, &["addr", "add", &gpu_side, "dev", ROUTER_GPU_SIDE])?;
    if let Some(mtu) = scenario.gpu_link_mtu() {
        ip(
            r,
            &["link", "set", ROUTER_GPU_SIDE, "mtu", &mtu.to_string()],
        )?;
    }
    ip(r, &["link", "set", ROUTER_GPU_SIDE, "up"])?;
    ip(r, &["link", "add", ROUTER_CP_BRIDGE, "type", "bridge"])?;
    ip(
        r,
        &[
            "addr",
            "add",
            &format!("{ROUTER_CP_ADDR}/24"),
            "dev",
            ROUTER_CP_BRIDGE,
        ],
    )?;
    ip(r, &["link", "set", ROUTER_CP_BRIDGE, "up"])?;
    for cp in [CP1, CP2] {
        let port = format!("to-{}", NODES[cp].name);
        ip(
            r,
            &[
                "link",
                "add",
                &port,
                "type",
                "veth",
                "peer",
                "name",
                UNDERLAY,
                "netns",
                &names.nodes[cp],
            ],
        )?;
        ip(r, &["link", "set", &port, "master", ROUTER_CP_BRIDGE, "up"])?;
    }
    if scenario.snat_udp_to_gpu() {
        let to = ROUTER_GPU_ADDR.to_string();
        in_ns(
            r,
            &[
                "iptables",
                "-w",
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-o",
                ROUTER_GPU_SIDE,
                "-p",
                "udp",
                "-j",
                "SNAT",
                "--to-source",
                &to,
            ],
        )?;
    }
    if scenario.drop_udp_from_gpu() {
        in_ns(
            r,
            &[
                "iptables",
                "-w",
                "-A",
                "FORWARD",
                "-i",
                ROUTER_GPU_SIDE,
                "-p",
                "udp",
                "--dport",
                VXLAN_PORT,
                "-j",
                "DROP",
            ],
        )?;
    }
    Ok(())
}

/// eth0 (created with the router's veths) addressed and up, default route
/// via the router, pod addresses on lo.
fn underlay(ns: &str, node: &NodeSpec) -> Result<()> {
    ip(
        ns,
        &["addr", "add", &format!("{}/24", node.addr), "dev", UNDERLAY],
    )?;
    ip(ns, &["link", "set", UNDERLAY, "up"])?;
    ip(
        ns,
        &["route", "add", "default", "via", &node.gateway.to_string()],
    )?;
    for block in Block::ALL {
        ip(
            ns,
            &[
                "addr",
                "add",
                &format!("{}/32", node.pod(block)),
                "dev",
                "lo",
            ],
        )?;
    }
    Ok(())
}

/// vxlan.calico as Calico creates it: VNI 4096, port 4789, local = node
/// address, no learning, MTU 1450, the block's first address on it, and a
/// permanent neighbour and FDB entry for every other node's VTEP.
fn vxlan(ns: &str, node: &NodeSpec) -> Result<()> {
    let local = node.addr.to_string();
    ip(
        ns,
        &[
            "link",
            "add",
            VXLAN_DEV,
            "address",
            node.vtep_mac,
            "mtu",
            VXLAN_MTU,
            "type",
            "vxlan",
            "id",
            VXLAN_VNI,
            "dstport",
            VXLAN_PORT,
            "local",
            &local,
            "dev",
            UNDERLAY,
            "nolearning",
        ],
    )?;
    let overlay = format!("{}/32", node.vxlan_block.network());
    ip(ns, &["addr", "add", &overlay, "dev", VXLAN_DEV])?;
    ip(ns, &["link", "set", VXLAN_DEV, "up"])?;
    for other in NODES.iter().filter(|o| o.name != node.name) {
        let overlay = other.vxlan_block.network().to_string();
        ip(
            ns,
            &[
                "neigh",
                "replace",
                &overlay,
                "lladdr",
                other.vtep_mac,
                "dev",
                VXLAN_DEV,
                "nud",
                "permanent",
            ],
        )?;
        run_tool(
            "bridge",
            &[
                "-n",
                ns,
                "fdb",
                "append",
                other.vtep_mac,
                "dev",
                VXLAN_DEV,
                "dst",
                &other.addr.to_string(),
                "self",
                "permanent",
            ],
        )?;
    }
    Ok(())
}

/// tunl0: the kernel's when the kernel has IPIP, else the lab's userspace
/// tunnel; up, MTU 1480, the IPIP block's first address on it.
fn ipip(lab: &mut Cleanup, ns: &str, node: &NodeSpec) -> Result<IpipKind> {
    let routes: Routes = NODES
        .iter()
        .filter(|o| o.name != node.name)
        .flat_map(|o| Block::ALL.map(|b| (o.block(b), o.addr)))
        .collect();
    let kind = tunl0(lab, ns, node.addr, routes)?;
    let overlay = format!("{}/32", node.ipip_block.network());
    ip(ns, &["addr", "add", &overlay, "dev", IPIP_DEV])?;
    Ok(kind)
}

/// tunl0 in `ns`, up with MTU 1480: the kernel's when the kernel has IPIP,
/// else the lab's userspace tunnel from `local`, which sends the inner
/// destinations `routes` names to their node (owned by `lab`).
pub fn tunl0(lab: &mut Cleanup, ns: &str, local: Ipv4Addr, routes: Routes) -> Result<IpipKind> {
    let exists = || ip(ns, &["link", "show", IPIP_DEV]).is_ok();
    // With the ipip module loaded every namespace gets tunl0; adding one
    // loads the module where it is built but not loaded.
    if !exists() {
        let _ = ip(ns, &["link", "add", IPIP_DEV, "type", "ipip"]);
    }
    let kind = if exists() {
        IpipKind::Kernel
    } else {
        lab.add_tunnel(Tunnel::start(ns, local, routes)?);
        IpipKind::Userspace
    };
    ip(ns, &["link", "set", IPIP_DEV, "mtu", IPIP_MTU, "up"])?;
    Ok(kind)
}

/// Calico's routes to the other nodes' blocks: the VXLAN block via the
/// peer's vxlan.calico address, the IPIP block via the peer's node address
/// on tunl0, both onlink. In `encap-mismatch` the GPU node already routes
/// cp1's VXLAN block over tunl0.
fn routes(ns: &str, me: usize, scenario: Scenario) -> Result<()> {
    for (i, other) in NODES.iter().enumerate().filter(|(i, _)| *i != me) {
        let vxlan_block = other.vxlan_block.to_string();
        let node_addr = other.addr.to_string();
        let vtep = other.vxlan_block.network().to_string();
        let (via, dev) = if scenario.gpu_routes_cp1_vxlan_block_over_ipip() && me == GPU && i == CP1
        {
            (node_addr.as_str(), IPIP_DEV)
        } else {
            (vtep.as_str(), VXLAN_DEV)
        };
        ip(
            ns,
            &[
                "route",
                "add",
                &vxlan_block,
                "via",
                via,
                "dev",
                dev,
                "onlink",
            ],
        )?;
        ip(
            ns,
            &[
                "route",
                "add",
                &other.ipip_block.to_string(),
                "via",
                &node_addr,
                "dev",
                IPIP_DEV,
                "onlink",
            ],
        )?;
    }
    Ok(())
}

/// Calico's allow-sets holding the three node addresses, and chain
/// cali-INPUT (jumped to from INPUT) with the VXLAN and IPIP rule pairs.
fn calico_filter(ns: &str) -> Result<()> {
    for set in [VXLAN_SET, HOSTS_SET] {
        in_ns(ns, &["ipset", "create", set, "hash:net"])?;
        for node in &NODES {
            in_ns(ns, &["ipset", "add", set, &node.addr.to_string()])?;
        }
    }
    in_ns(ns, &["iptables", "-w", "-N", "cali-INPUT"])?;
    in_ns(ns, &["iptables", "-w", "-A", "INPUT", "-j", "cali-INPUT"])?;
    for pair in &RULES {
        for (comment, target, set) in [
            (
                pair.allow,
                "ACCEPT",
                &["-m", "set", "--match-set", pair.set, "src"][..],
            ),
            (pair.drop, "DROP", &[][..]),
        ] {
            let mut argv = vec!["iptables", "-w", "-A", "cali-INPUT"];
            argv.extend_from_slice(pair.matches);
            argv.extend_from_slice(&["-m", "comment", "--comment", comment]);
            argv.extend_from_slice(set);
            argv.extend_from_slice(&["-m", "addrtype", "--dst-type", "LOCAL", "-j", target]);
            in_ns(ns, &argv)?;
        }
    }
    Ok(())
}

/// Per [`RULES`] pair: (ACCEPT packets, DROP packets).
pub type RuleCounts = Vec<(u64, u64)>;

/// Packet counters of the rule pairs in `ns`, read with `iptables -L
/// cali-INPUT -v -x -n` (independently of the observer, which reads
/// iptables-save): per pair, (ACCEPT packets, DROP packets).
pub fn rule_counters(ns: &str) -> Result<RuleCounts> {
    let text = in_ns(
        ns,
        &["iptables", "-w", "-L", "cali-INPUT", "-v", "-x", "-n"],
    )?;
    RULES
        .iter()
        .map(|pair| Ok((counter(&text, pair.allow)?, counter(&text, pair.drop)?)))
        .collect()
}

/// The packet column of the rule commented `comment` in `iptables -L -v -x
/// -n` output (`   579   85692 DROP  17 -- * * ... /* comment */ ...`).
fn counter(listing: &str, comment: &str) -> Result<u64> {
    let quoted = format!("/* {comment} */");
    let line = listing
        .lines()
        .find(|l| l.contains(&quoted))
        .with_context(|| format!("no rule {quoted} in `iptables -L cali-INPUT`:\n{listing}"))?;
    line.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no packet count in `{line}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_packet_column_by_comment() {
        let listing = "Chain cali-INPUT (1 references)\n    pkts      bytes target     prot opt in     out     source               destination\n       0        0 ACCEPT     17   --  *      *       0.0.0.0/0            0.0.0.0/0            /* Allow IPv4 VXLAN packets from allowed hosts */ udp dpt:4789\n     579    85692 DROP       17   --  *      *       0.0.0.0/0            0.0.0.0/0            /* Drop IPv4 VXLAN packets from non-allowed hosts */ udp dpt:4789\n";
        assert_eq!(counter(listing, RULES[0].allow).unwrap(), 0);
        assert_eq!(counter(listing, RULES[0].drop).unwrap(), 579);
        assert!(counter(listing, RULES[1].drop).is_err());
    }

    #[test]
    fn names_are_per_process() {
        let names = Names::new(42);
        assert_eq!(names.nodes[GPU], "obslab-42-gpu");
        assert_eq!(names.nodes[CP2], "obslab-42-cp2");
        assert_eq!(names.router, "obslab-42-router");
    }
}
