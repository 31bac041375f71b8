//! The BGP scenarios' network: four nodes on one L2 segment (a bridge in
//! a switch namespace), each with a pod address on `lo` and its own BIRD
//! in a full iBGP mesh (AS 64512, the tests' config from
//! `bird`): Calico's BGP mode, with direct routing or,
//! with `--bgp-encap ipip`, its IPIP mode (learned routes through tunl0).

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use super::bird::{Bird, MeshNode};
use anyhow::{Result, bail};
use ipnet::Ipv4Net;

use super::{
    cleanup::{Cleanup, check_interrupted},
    scenarios::Scenario,
    shell::run_tool,
    topology::{IpipKind, UNDERLAY, add_namespace, tunl0},
};
use crate::cli::BgpEncap;

/// One node of the mesh.
pub struct MeshMember {
    /// Its name in the lab.
    pub name: &'static str,
    /// Underlay address (BGP source and router id).
    pub addr: Ipv4Addr,
    /// The pod block it owns and announces.
    pub block: Ipv4Net,
    /// Its pod address (on `lo`), inside the block.
    pub pod: Ipv4Addr,
}

/// The mesh: four nodes, as the smallest full mesh that still
/// shows "every other node" at once.
pub const MESH: [MeshMember; 4] = [
    member("n1", 1),
    member("n2", 2),
    member("n3", 3),
    member("n4", 4),
];

const fn member(name: &'static str, n: u8) -> MeshMember {
    MeshMember {
        name,
        addr: Ipv4Addr::new(10, 99, 0, n),
        block: Ipv4Net::new_assert(Ipv4Addr::new(10, 65, n, 0), 26),
        pod: Ipv4Addr::new(10, 65, n, 1),
    }
}

/// The node whose BIRD stops in `bgp-down`, the newest node (whose block
/// one peer filters) in `new-node`, the node that leaves in
/// `stale-route`.
pub const DOWN: usize = 3;

/// Time for the mesh to come up (every session Established, every block
/// in every kernel), and for the observers to name and clear an outage
/// beyond the planned time.
pub const SETTLE: Duration = Duration::from_secs(60);

/// The namespaces, the bridge, each node's underlay and pod address, and
/// with `encap` ipip each node's tunl0 (returns how it is provided).
pub fn build(
    lab: &mut Cleanup,
    names: &[String],
    switch: &str,
    encap: BgpEncap,
) -> Result<Option<IpipKind>> {
    // rp_filter off over IPIP: a decapsulated packet arrives on tunl0.
    let sysctls: &[&str] = match encap {
        BgpEncap::None => &[],
        BgpEncap::Ipip => &[
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ],
    };
    for ns in names.iter().map(String::as_str).chain([switch]) {
        add_namespace(lab, ns, sysctls)?;
    }
    run_tool(
        "ip",
        &["-n", switch, "link", "add", "br0", "type", "bridge"],
    )?;
    run_tool("ip", &["-n", switch, "link", "set", "br0", "up"])?;
    for (member, ns) in MESH.iter().zip(names) {
        let port = format!("p-{}", member.name);
        run_tool(
            "ip",
            &[
                "-n", switch, "link", "add", &port, "type", "veth", "peer", "name", UNDERLAY,
                "netns", ns,
            ],
        )?;
        run_tool(
            "ip",
            &["-n", switch, "link", "set", &port, "master", "br0", "up"],
        )?;
        let addr = format!("{}/24", member.addr);
        run_tool("ip", &["-n", ns, "addr", "add", &addr, "dev", UNDERLAY])?;
        run_tool("ip", &["-n", ns, "link", "set", UNDERLAY, "up"])?;
        let pod = format!("{}/32", member.pod);
        run_tool("ip", &["-n", ns, "addr", "add", &pod, "dev", "lo"])?;
        check_interrupted()?;
    }
    if encap == BgpEncap::None {
        return Ok(None);
    }
    let mut kind = IpipKind::Kernel;
    for (i, ns) in names.iter().enumerate() {
        let others = (0..MESH.len()).filter(|j| *j != i);
        let routes = others.map(|j| (MESH[j].block, MESH[j].addr)).collect();
        kind = tunl0(lab, ns, MESH[i].addr, routes)?;
        // As Calico does: tunl0 holds its block's first address, which the
        // other nodes route back through their tunl0 (what `observer
        // probe` answers to).
        let first = format!("{}/32", MESH[i].block.network());
        run_tool("ip", &["-n", ns, "addr", "add", &first, "dev", "tunl0"])?;
    }
    Ok(Some(kind))
}

/// The node whose import filter rejects n4's block in `new-node`, and
/// that keeps a route to n4 after it left in `stale-route`.
pub const FILTERING: usize = 0;

/// Blocks node `i`'s import filter rejects in `scenario`: in `new-node`,
/// n1 rejects n4's (the newest node's) block.
pub fn rejects(scenario: Scenario, i: usize) -> Vec<Ipv4Net> {
    if scenario == Scenario::NewNode && i == FILTERING {
        vec![MESH[DOWN].block]
    } else {
        Vec::new()
    }
}

/// Node `i`'s part of the mesh in `scenario` and `encap`; without the
/// nodes in `gone` (a node that left: Calico removes it from every BIRD
/// config).
pub fn mesh_node(i: usize, scenario: Scenario, encap: BgpEncap, gone: &[usize]) -> MeshNode {
    MeshNode {
        address: MESH[i].addr,
        block: MESH[i].block.to_string(),
        peers: (0..MESH.len())
            .filter(|j| *j != i && !gone.contains(j))
            .map(|j| MESH[j].addr)
            .collect(),
        rejects: rejects(scenario, i)
            .iter()
            .map(ToString::to_string)
            .collect(),
        tunnel: (encap == BgpEncap::Ipip).then(|| "tunl0".to_string()),
    }
}

/// One BIRD per node, with the mesh's config for `scenario` and `encap`.
pub fn start_birds(names: &[String], scenario: Scenario, encap: BgpEncap) -> Result<Vec<Bird>> {
    names
        .iter()
        .enumerate()
        .map(|(i, ns)| {
            Bird::start_in(ns, &mesh_node(i, scenario, encap, &[]))
                .map_err(|e| anyhow::anyhow!("starting BIRD on {}: {e}", MESH[i].name))
        })
        .collect()
}

/// Waits until every node's BIRD has every session Established and its
/// kernel table every other node's block it does not reject (`proto
/// bird`, beside its own blackhole).
pub fn wait_up(names: &[String], birds: &[Bird], scenario: Scenario) -> Result<()> {
    let deadline = Instant::now() + SETTLE;
    loop {
        check_interrupted()?;
        let mut up = true;
        for (i, (ns, bird)) in names.iter().zip(birds).enumerate() {
            let sessions = bird
                .birdc(&["show", "protocols"])
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let established = sessions
                .lines()
                .filter(|l| l.contains("Established"))
                .count();
            let routes = run_tool("ip", &["-n", ns, "route", "show", "proto", "bird"])?;
            let expected = MESH.len() - rejects(scenario, i).len();
            up &= established == MESH.len() - 1 && routes.lines().count() == expected;
        }
        if up {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the BGP mesh did not come up within {SETTLE:?} (BIRD sessions Established and every block in every kernel)"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
