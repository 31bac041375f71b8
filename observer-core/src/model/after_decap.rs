//! Drops after decapsulation: which devices the kernel-drop program
//! watches besides the attached interfaces (the data plane's tunnel
//! devices, pod-facing devices by name), and which node owns each pod
//! block, by which it names the node a dropped inner packet came from or
//! was going to. Pure: the data-plane view in, the sets to write out.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
    str::FromStr,
};

use ipnet::IpNet;
use observer_common::{BLOCKS_MAX, Proto, WATCHED_MAX};

use crate::model::{
    dataplane::{BlockRoute, DataPlane},
    rows::Stage,
};

/// The default of `--after-decap`: the data plane's tunnel devices,
/// Calico's pod veths, flannel's bridge and other CNIs' veths.
pub const DEFAULT_DEVICES: &str = "tunnels,cali*,cni0,veth*";

/// Which devices to watch after decapsulation (`--after-decap`): a
/// comma-separated list of `tunnels` (every tunnel device of the data
/// plane) and interface names, a trailing `*` matching any rest; `none`
/// for no device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePatterns {
    tunnels: bool,
    names: Vec<String>,
}

impl DevicePatterns {
    /// No device.
    pub fn none() -> DevicePatterns {
        DevicePatterns {
            tunnels: false,
            names: Vec::new(),
        }
    }

    fn matches(&self, name: &str) -> bool {
        self.names.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == p,
        })
    }
}

impl Default for DevicePatterns {
    fn default() -> DevicePatterns {
        DEFAULT_DEVICES.parse().expect("the default parses")
    }
}

impl FromStr for DevicePatterns {
    type Err = String;

    fn from_str(text: &str) -> Result<DevicePatterns, String> {
        let mut patterns = DevicePatterns::none();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "none" => return Ok(DevicePatterns::none()),
                "tunnels" => patterns.tunnels = true,
                name if name.len() > 15 || name.contains(['/', ' ']) => {
                    return Err(format!(
                        "{name:?} is no interface name (at most 15 characters, no '/'); use `tunnels`, names like `cali*`, or `none`"
                    ));
                }
                name if name[..name.len() - 1].contains('*') => {
                    return Err(format!("{name:?}: `*` may only end a name (`cali*`)"));
                }
                name => patterns.names.push(name.to_string()),
            }
        }
        Ok(patterns)
    }
}

impl fmt::Display for DevicePatterns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words: Vec<&str> = self
            .tunnels
            .then_some("tunnels")
            .into_iter()
            .chain(self.names.iter().map(String::as_str))
            .collect();
        if words.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&words.join(","))
        }
    }
}

/// A device watched after decapsulation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WatchedDevice {
    /// Interface name.
    pub name: String,
    /// Where it sits.
    pub stage: Stage,
}

/// The devices of `view` to watch, by index: tunnel devices (stage
/// tunnel) when `patterns` asks for them, links whose name matches (stage
/// pod, or tunnel for a tunnel device), never an `attached` interface
/// (its drops are counted from the outer headers). At most
/// `WATCHED_MAX - attached` of them, the tunnels first: the map holds the
/// attached interfaces too.
pub fn watched_devices(
    view: &DataPlane,
    patterns: &DevicePatterns,
    attached: &BTreeSet<u32>,
) -> BTreeMap<u32, WatchedDevice> {
    let room = (WATCHED_MAX as usize).saturating_sub(attached.len());
    let tunnels: BTreeSet<u32> = view.devices.iter().map(|d| d.ifindex).collect();
    let mut watched = BTreeMap::new();
    let tunnel_devices = view
        .devices
        .iter()
        .filter(|d| patterns.tunnels || patterns.matches(&d.name))
        .map(|d| (d.ifindex, d.name.clone(), Stage::Tunnel));
    let pod_devices = view
        .links
        .iter()
        .filter(|l| !l.loopback && !tunnels.contains(&l.ifindex) && patterns.matches(&l.name))
        .map(|l| (l.ifindex, l.name.clone(), Stage::Pod));
    for (ifindex, name, stage) in tunnel_devices.chain(pod_devices) {
        if watched.len() >= room {
            break;
        }
        if !attached.contains(&ifindex) {
            watched.insert(ifindex, WatchedDevice { name, stage });
        }
    }
    watched
}

/// The node owning each pod block, as far as the data plane has said
/// during the run: a block whose route can no longer name its node (its
/// FDB or neighbour entry was removed, the very drops to attribute) keeps
/// the node it had; a block this node owns (a blackhole) has none.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlockOwners {
    owners: BTreeMap<IpNet, (IpAddr, Option<Proto>)>,
    /// Blocks not kept because [`BLOCKS_MAX`] were held.
    pub refused: u64,
}

impl BlockOwners {
    /// Takes the blocks of a new view; returns whether anything changed.
    pub fn update(&mut self, blocks: &[BlockRoute]) -> bool {
        let mut changed = false;
        for block in blocks {
            if block.blackhole {
                changed |= self.owners.remove(&block.block).is_some();
                continue;
            }
            let Some(hop) = block.next_hops.iter().find(|h| h.node.is_some()) else {
                continue;
            };
            let owner = (hop.node.expect("found with a node"), hop.encap);
            if self.owners.get(&block.block) == Some(&owner) {
                continue;
            }
            if !self.owners.contains_key(&block.block) && self.owners.len() >= BLOCKS_MAX as usize {
                self.refused += 1;
                continue;
            }
            self.owners.insert(block.block, owner);
            changed = true;
        }
        changed
    }

    /// Every block with its node and the encapsulation it is routed
    /// through (`None`: direct routing).
    pub fn entries(&self) -> Vec<(IpNet, IpAddr, Option<Proto>)> {
        self.owners
            .iter()
            .map(|(block, (node, proto))| (*block, *node, *proto))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::dataplane::{Link, NextHop, TunnelDevice};

    fn link(name: &str, ifindex: u32) -> Link {
        Link {
            name: name.to_string(),
            ifindex,
            mtu: 1500,
            kind: None,
            up: true,
            loopback: name == "lo",
        }
    }

    fn view() -> DataPlane {
        DataPlane {
            links: [
                "lo",
                "eth0",
                "vxlan.calico",
                "cali1a2b",
                "veth9",
                "cni0",
                "docker0",
            ]
            .iter()
            .enumerate()
            .map(|(i, n)| link(n, i as u32 + 1))
            .collect(),
            addresses: Vec::new(),
            devices: vec![TunnelDevice {
                name: "vxlan.calico".into(),
                ifindex: 3,
                proto: Proto::Vxlan,
                kind: "vxlan".into(),
                vni: Some(4096),
                key: None,
                port: Some(4789),
                local: None,
                remote: None,
                lower: None,
                mtu: 1450,
                up: true,
            }],
            routes: Vec::new(),
            neighbours: Vec::new(),
            fdb: Vec::new(),
            peer_routes: Vec::new(),
            underlay: Vec::new(),
            blocks: Vec::new(),
        }
    }

    fn watched(patterns: &DevicePatterns, attached: &[u32]) -> Vec<(u32, String, Stage)> {
        let attached = attached.iter().copied().collect();
        watched_devices(&view(), patterns, &attached)
            .into_iter()
            .map(|(i, d)| (i, d.name, d.stage))
            .collect()
    }

    #[test]
    fn the_default_watches_tunnels_and_pod_devices_never_the_attached() {
        assert_eq!(
            watched(&DevicePatterns::default(), &[2, 5]),
            vec![
                (3, "vxlan.calico".into(), Stage::Tunnel),
                (4, "cali1a2b".into(), Stage::Pod),
                (6, "cni0".into(), Stage::Pod),
            ]
        );
        assert!(watched(&DevicePatterns::none(), &[2, 5]).is_empty());
    }

    #[test]
    fn patterns_parse_print_and_refuse_nonsense() {
        let p: DevicePatterns = "tunnels, lxc*,eth1".parse().unwrap();
        assert_eq!(p.to_string(), "tunnels,lxc*,eth1");
        assert_eq!(
            "none".parse::<DevicePatterns>().unwrap(),
            DevicePatterns::none()
        );
        assert_eq!(DevicePatterns::none().to_string(), "none");
        assert_eq!(DevicePatterns::default().to_string(), DEFAULT_DEVICES);
        assert!(
            "c*li"
                .parse::<DevicePatterns>()
                .unwrap_err()
                .contains("may only end")
        );
        assert!(
            "a/b"
                .parse::<DevicePatterns>()
                .unwrap_err()
                .contains("no interface name")
        );
        let only: DevicePatterns = "cali*".parse().unwrap();
        assert_eq!(
            watched(&only, &[]),
            vec![(4, "cali1a2b".into(), Stage::Pod)]
        );
    }

    fn block(text: &str, node: Option<&str>, blackhole: bool) -> BlockRoute {
        BlockRoute {
            block: text.parse().unwrap(),
            origin: 80,
            blackhole,
            next_hops: if blackhole {
                Vec::new()
            } else {
                vec![NextHop {
                    device: "vxlan.calico".into(),
                    gateway: None,
                    encap: Some(Proto::Vxlan),
                    node: node.map(|n| n.parse().unwrap()),
                }]
            },
        }
    }

    #[test]
    fn blocks_keep_their_node_when_the_route_can_no_longer_name_it() {
        let mut owners = BlockOwners::default();
        assert!(owners.update(&[
            block("10.244.1.0/26", Some("10.99.0.1"), false),
            block("10.244.2.0/26", None, true),
        ]));
        let cp1 = (
            "10.244.1.0/26".parse().unwrap(),
            "10.99.0.1".parse().unwrap(),
            Some(Proto::Vxlan),
        );
        assert_eq!(owners.entries(), vec![cp1]);
        // The FDB entry is gone: the route names no node, the owner stays.
        assert!(!owners.update(&[block("10.244.1.0/26", None, false)]));
        assert_eq!(owners.entries(), vec![cp1]);
        // The block moved to another node; then this node took it.
        assert!(owners.update(&[block("10.244.1.0/26", Some("10.99.0.3"), false)]));
        assert_eq!(
            owners.entries()[0].1,
            "10.99.0.3".parse::<IpAddr>().unwrap()
        );
        assert!(owners.update(&[block("10.244.1.0/26", None, true)]));
        assert!(owners.entries().is_empty());
    }
}
