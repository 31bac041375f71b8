//! The cluster's node pairs (`observer cluster`), from the series every
//! node's observer exports and a Prometheus-compatible store holds: per
//! (sending node, receiving node, encapsulation) what one sent, what the
//! other received from it (also from an address a router rewrote it to),
//! what the receiver dropped, the anomalies either side raised about the
//! other, and the verdict `diagnose` would give. Pure: the store's
//! answers come in as [`Series`], the window's end is an input.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    time::Duration,
};

use serde::Serialize;

use crate::model::{anomalies::Kind, verdicts::Verdict};

/// Who this node is in the cluster: the name every series of its
/// observer carries (`node` label) and its underlay addresses, which
/// its peers see as the outer source of its tunnel packets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeIdentity {
    /// The node's name (`--node-name`, default the hostname).
    pub name: String,
    /// Underlay addresses (`observer_node_info{node,address}`).
    pub addresses: BTreeSet<IpAddr>,
}

/// One series of a query's answer: its labels and its value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Label names and values (without `__name__`).
    pub labels: BTreeMap<String, String>,
    /// The sample's value.
    pub value: f64,
}

impl Series {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }

    fn address(&self, name: &str) -> Option<IpAddr> {
        self.label(name)?.parse().ok()
    }

    fn packets(&self) -> u64 {
        // Counters are whole; a store may answer 177.99999 after math.
        if self.value.is_finite() && self.value > 0.0 {
            self.value.round() as u64
        } else {
            0
        }
    }
}

/// The PromQL queries whose answers make a [`Window`], each over the
/// window ending at the query's evaluation time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queries {
    /// `observer_node_info`: node names and their underlay addresses.
    pub nodes: String,
    /// Tunnel packets per (node, peer, proto, direction).
    pub packets: String,
    /// Drops per (node, peer, proto, reason, stage).
    pub drops: String,
    /// Anomalies per (node, kind, proto, peer, about).
    pub anomalies: String,
}

impl Queries {
    /// The queries for a window of `window` (a whole number of seconds).
    ///
    /// A counter's increase over the window is its last value in the
    /// window minus its value at the window's start, exactly, without
    /// `increase()`'s extrapolation (so that the lab's counts come out as
    /// the observers printed them); a series that did not exist at the
    /// start (its peer's first packet, an observer started in the window)
    /// or went back (an observer restarted) counts its last value whole,
    /// as every observer counter starts at 0. `last_over_time` keeps the
    /// series of an observer that stopped within the window.
    pub fn new(window: Duration) -> Queries {
        let w = format!("{}s", window.as_secs().max(1));
        let increase = |selector: &str, by: &str| {
            format!(
                "sum by ({by}) ((last_over_time({selector}[{w}]) - ({selector} offset {w})) >= 0 \
                 or last_over_time({selector}[{w}]))"
            )
        };
        Queries {
            nodes: format!("max by (node, address) (last_over_time(observer_node_info[{w}]))"),
            packets: increase(
                r#"observer_encap_packets_total{proto!="other",peer!="other",peer!=""}"#,
                "node, peer, proto, direction",
            ),
            drops: increase(
                r#"observer_drops_total{proto!="other",peer!="other",peer!="",direction!="tx"}"#,
                "node, peer, proto, reason, stage",
            ),
            anomalies: format!(
                "max by (node, kind, proto, peer, about) \
                 (max_over_time(observer_peer_anomalies_active[{w}])) > 0"
            ),
        }
    }
}

/// What the store holds for one window, decoded from the answers to
/// [`Queries`]. Series without the labels a query groups by are skipped
/// and counted in `skipped`.
#[derive(Debug, Clone, Default)]
pub struct Window {
    /// Node name by underlay address (the first node to claim an address
    /// keeps it).
    nodes: BTreeMap<IpAddr, String>,
    /// Every node that exported its identity.
    names: BTreeSet<String>,
    /// (node, peer address, proto) -> (sent, received).
    packets: BTreeMap<(String, IpAddr, String), (u64, u64)>,
    /// (node, peer address, proto, reason, after decapsulation) ->
    /// packets.
    drops: BTreeMap<(String, IpAddr, String, String, bool), u64>,
    anomalies: Vec<Reported>,
    /// Series that lacked a label their query groups by.
    pub skipped: usize,
}

/// An anomaly a node's observer raised in the window.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Reported {
    node: String,
    kind: Kind,
    proto: String,
    /// The outer address it was seen with.
    peer: IpAddr,
    /// The node address it is about (`snat_suspected`: the rewritten
    /// node's).
    about: IpAddr,
}

impl Window {
    /// Adds a series of the answer to [`Queries::nodes`].
    pub fn add_node(&mut self, s: &Series) {
        match (s.label("node"), s.address("address")) {
            (Some(node), Some(address)) if !node.is_empty() => {
                self.names.insert(node.to_string());
                self.nodes
                    .entry(address)
                    .or_insert_with(|| node.to_string());
            }
            _ => self.skipped += 1,
        }
    }

    /// Adds a series of the answer to [`Queries::packets`].
    pub fn add_packet(&mut self, s: &Series) {
        let (Some(node), Some(peer), Some(proto), Some(direction)) = (
            s.label("node"),
            s.address("peer"),
            s.label("proto"),
            s.label("direction"),
        ) else {
            self.skipped += 1;
            return;
        };
        let entry = self
            .packets
            .entry((node.to_string(), peer, proto.to_string()))
            .or_default();
        match direction {
            "tx" => entry.0 += s.packets(),
            "rx" => entry.1 += s.packets(),
            _ => self.skipped += 1,
        }
    }

    /// Adds a series of the answer to [`Queries::drops`].
    pub fn add_drop(&mut self, s: &Series) {
        let (Some(node), Some(peer), Some(proto), Some(reason)) = (
            s.label("node"),
            s.address("peer"),
            s.label("proto"),
            s.label("reason"),
        ) else {
            self.skipped += 1;
            return;
        };
        // Observers before stages exported none: the underlay.
        let after_decap = matches!(s.label("stage"), Some("tunnel" | "pod"));
        *self
            .drops
            .entry((
                node.to_string(),
                peer,
                proto.to_string(),
                reason.to_string(),
                after_decap,
            ))
            .or_default() += s.packets();
    }

    /// Adds a series of the answer to [`Queries::anomalies`].
    pub fn add_anomaly(&mut self, s: &Series) {
        let kind = s
            .label("kind")
            .and_then(|k| Kind::ALL.into_iter().find(|kind| kind.name() == k));
        let (Some(node), Some(kind), Some(proto), Some(peer), Some(about)) = (
            s.label("node"),
            kind,
            s.label("proto"),
            s.address("peer"),
            s.address("about"),
        ) else {
            self.skipped += 1;
            return;
        };
        self.anomalies.push(Reported {
            node: node.to_string(),
            kind,
            proto: proto.to_string(),
            peer,
            about,
        });
    }

    /// The nodes that exported their identity.
    pub fn node_names(&self) -> &BTreeSet<String> {
        &self.names
    }
}

/// Thresholds of the verdicts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Packets one node must send to another over the window before
    /// "none received" is one-way.
    pub min_packets: u64,
    /// Share of the sent packets that may be lost before the pair's
    /// verdict is loss (the rollout target: 0.0005).
    pub loss_target: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            min_packets: 5,
            loss_target: 0.0005,
        }
    }
}

/// An anomaly one side of a pair raised about the other.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PairAnomaly {
    /// The node that raised it.
    pub node: String,
    /// Its kind.
    pub kind: &'static str,
}

/// One node pair and encapsulation over the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pair {
    /// The sending node.
    pub from: String,
    /// The receiving node.
    pub to: String,
    /// The sender's underlay address (the receiver's peer).
    pub from_address: IpAddr,
    /// The receiver's underlay address (the sender's peer).
    pub to_address: IpAddr,
    /// Encapsulation.
    pub proto: String,
    /// Tunnel packets `from` sent to `to`.
    pub sent: u64,
    /// Tunnel packets `to` received from `from`, also under an address
    /// `to` attributes to it (`arrived_from`).
    pub received: u64,
    /// Outer source addresses other than `from_address` that `from`'s
    /// packets arrived with (a router source-NATed them).
    pub arrived_from: Vec<IpAddr>,
    /// Packets `to` received from `from` and dropped (kernel drop reasons).
    pub dropped: u64,
    /// The part of `dropped` that `to` dropped after decapsulation (on a
    /// tunnel or pod device).
    pub dropped_after_decap: u64,
    /// Drops and drop flags at `to` of `from`'s packets, by reason.
    pub drops: BTreeMap<String, u64>,
    /// Share of `sent` not delivered: (sent - received + dropped) / sent;
    /// `None` when nothing was sent.
    pub loss: Option<f64>,
    /// Anomalies either side raised about the other that concern this
    /// direction (and one_way, which both sides raise).
    pub anomalies: Vec<PairAnomaly>,
    /// What is wrong, most decisive first (`diagnose`'s verdicts).
    pub verdict: Verdict,
    /// What to do next; empty when healthy.
    pub next_step: String,
}

/// Packets a node received from an outer source that is no node and that
/// no anomaly attributes to one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Foreign {
    /// The receiving node.
    pub node: String,
    /// The outer source.
    pub peer: IpAddr,
    /// Encapsulation.
    pub proto: String,
    /// Packets received.
    pub received: u64,
}

/// The pairs, worst first, and what fits no pair.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Cluster {
    /// Nodes that exported their identity.
    pub nodes: usize,
    /// One entry per (from, to, proto) with traffic, worst first.
    pub pairs: Vec<Pair>,
    /// Received tunnel traffic from addresses that are no node.
    pub foreign: Vec<Foreign>,
    /// Sent tunnel traffic to addresses that are no node (pairs whose
    /// receiver exports nothing), as (node, peer, proto, sent).
    pub unknown_receivers: Vec<Foreign>,
}

impl Cluster {
    /// Whether every pair is healthy.
    pub fn healthy(&self) -> bool {
        self.pairs.iter().all(|p| p.verdict == Verdict::Healthy)
    }

    /// Pairs per verdict.
    pub fn verdict_counts(&self) -> BTreeMap<Verdict, usize> {
        let mut counts = BTreeMap::new();
        for p in &self.pairs {
            *counts.entry(p.verdict).or_default() += 1;
        }
        counts
    }
}

/// Which side of a pair an anomaly kind speaks for: the receiver about
/// the sender's packets, the sender about the path to the receiver, or
/// both ways (BGP: a session has no direction).
fn speaks_for(kind: Kind, raised_by_receiver: bool) -> bool {
    match kind {
        Kind::AllowSetDrop
        | Kind::SnatSuspected
        | Kind::UnknownPeer
        | Kind::DropSpike
        | Kind::DroppedAfterDecap
        | Kind::BadChecksum
        | Kind::EncapMismatch => raised_by_receiver,
        Kind::RouteMissing | Kind::RouteConflict | Kind::StaleRoute => !raised_by_receiver,
        Kind::Mtu
        | Kind::MssExceedsTunnel
        | Kind::TcpSynUnanswered
        | Kind::BgpDown
        | Kind::BgpFlap => true,
        // Both sides see one-way traffic; the counts say which way.
        Kind::OneWay => false,
    }
}

/// Whether an anomaly's kind holds for every encapsulation (routes and
/// BGP sessions carry all of them).
fn any_proto(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::BgpDown | Kind::BgpFlap | Kind::RouteMissing | Kind::RouteConflict | Kind::StaleRoute
    )
}

/// Kernel drop reasons are upper case (`NETFILTER_DROP`); the
/// classifier's lower-case reasons flag packets that a kernel reason may
/// count again (a `calico_allow_set` packet is also a `NETFILTER_DROP`).
fn is_kernel_reason(reason: &str) -> bool {
    reason.bytes().any(|b| b.is_ascii_uppercase())
}

/// The pairs of `window`, with `options`' thresholds.
pub fn pairs(window: &Window, options: Options) -> Cluster {
    let node_of = |addr: &IpAddr| window.nodes.get(addr);
    // Outer sources a receiver attributes to a node (snat_suspected).
    let attributed: BTreeMap<(&str, IpAddr, &str), IpAddr> = window
        .anomalies
        .iter()
        .filter(|a| a.kind == Kind::SnatSuspected && a.about != a.peer)
        .filter(|a| node_of(&a.about).is_some())
        .map(|a| ((a.node.as_str(), a.peer, a.proto.as_str()), a.about))
        .collect();
    // The node a receiver's peer address stands for.
    let sender = |receiver: &str, peer: IpAddr, proto: &str| -> Option<IpAddr> {
        if node_of(&peer).is_some() {
            Some(peer)
        } else {
            attributed.get(&(receiver, peer, proto)).copied()
        }
    };

    // A node's first address: the pair's address for that node until a
    // counter names the one its traffic used.
    let mut first_address: BTreeMap<&str, IpAddr> = BTreeMap::new();
    for (address, node) in window.nodes.iter().rev() {
        first_address.insert(node, *address);
    }
    let mut cluster = Cluster {
        nodes: window.names.len(),
        ..Cluster::default()
    };
    let mut building = Building::default();
    for ((node, peer, proto), (sent, received)) in &window.packets {
        let Some(this) = first_address.get(node.as_str()).copied() else {
            continue;
        };
        if *sent > 0 {
            match node_of(peer) {
                Some(to) => {
                    let p = building.pair((node, this), (to, *peer), proto);
                    p.to_address = *peer;
                    p.sent += sent;
                }
                None => cluster.unknown_receivers.push(Foreign {
                    node: node.clone(),
                    peer: *peer,
                    proto: proto.clone(),
                    received: *sent,
                }),
            }
        }
        if *received > 0 {
            match sender(node, *peer, proto) {
                Some(from) => {
                    let p = building.pair((&window.nodes[&from], from), (node, this), proto);
                    p.from_address = from;
                    p.received += received;
                    if *peer != from && !p.arrived_from.contains(peer) {
                        p.arrived_from.push(*peer);
                    }
                }
                None => cluster.foreign.push(Foreign {
                    node: node.clone(),
                    peer: *peer,
                    proto: proto.clone(),
                    received: *received,
                }),
            }
        }
    }
    for ((node, peer, proto, reason, after_decap), packets) in &window.drops {
        let (Some(this), Some(from)) = (
            first_address.get(node.as_str()).copied(),
            sender(node, *peer, proto),
        ) else {
            continue;
        };
        if *packets == 0 {
            continue;
        }
        let p = building.pair((&window.nodes[&from], from), (node, this), proto);
        *p.drops.entry(reason.clone()).or_default() += packets;
        if is_kernel_reason(reason) {
            p.dropped += packets;
        }
        if *after_decap {
            p.dropped_after_decap += packets;
        }
    }

    // Each pair reads only its two nodes' anomalies, not every node's.
    let mut raised_by: BTreeMap<&str, Vec<&Reported>> = BTreeMap::new();
    for a in &window.anomalies {
        raised_by.entry(a.node.as_str()).or_default().push(a);
    }
    let mut pairs = building.pairs;
    for p in &mut pairs {
        let raised = [p.to.as_str(), p.from.as_str()]
            .into_iter()
            .flat_map(|node| raised_by.get(node).into_iter().flatten().copied());
        let raised: Vec<&Reported> = raised.collect();
        judge(p, &raised, &window.nodes, options);
    }
    // (from, to, proto) is unique: an unstable sort orders the same.
    pairs.sort_unstable_by(|a, b| {
        a.verdict
            .cmp(&b.verdict)
            .then(b.loss.unwrap_or(0.0).total_cmp(&a.loss.unwrap_or(0.0)))
            .then_with(|| (&a.from, &a.to, &a.proto).cmp(&(&b.from, &b.to, &b.proto)))
    });
    cluster.pairs = pairs;
    cluster
}

/// The pairs under construction, and where each (from node, to node,
/// proto) is among them, keyed by the window's own strings: a full mesh
/// of 1,000 nodes has a million pairs, which a B-tree of pairs holds in
/// twice their size.
#[derive(Default)]
struct Building<'w> {
    index: HashMap<(&'w str, &'w str, &'w str), usize>,
    pairs: Vec<Pair>,
}

impl<'w> Building<'w> {
    /// The pair of `from` and `to` (node name and address) for `proto`,
    /// created on first use.
    fn pair(
        &mut self,
        from: (&'w str, IpAddr),
        to: (&'w str, IpAddr),
        proto: &'w str,
    ) -> &mut Pair {
        let pairs = &mut self.pairs;
        let at = *self.index.entry((from.0, to.0, proto)).or_insert_with(|| {
            pairs.push(Pair {
                from: from.0.to_string(),
                to: to.0.to_string(),
                from_address: from.1,
                to_address: to.1,
                proto: proto.to_string(),
                sent: 0,
                received: 0,
                arrived_from: Vec::new(),
                dropped: 0,
                dropped_after_decap: 0,
                drops: BTreeMap::new(),
                loss: None,
                anomalies: Vec::new(),
                verdict: Verdict::Healthy,
                next_step: String::new(),
            });
            pairs.len() - 1
        });
        &mut pairs[at]
    }
}

/// Sets the pair's loss, anomalies, verdict and next step.
/// `raised`: the anomalies its two nodes raised; `nodes`: node name by
/// underlay address.
fn judge(p: &mut Pair, raised: &[&Reported], nodes: &BTreeMap<IpAddr, String>, options: Options) {
    let delivered = p.received.saturating_sub(p.dropped);
    p.loss = (p.sent > 0).then(|| (p.sent.saturating_sub(delivered)) as f64 / p.sent as f64);
    let is = |address: &IpAddr, node: &str| nodes.get(address).is_some_and(|n| n == node);
    let mut decisive = Verdict::Healthy;
    let mut listed = BTreeSet::new();
    for a in raised {
        if a.proto != p.proto && !any_proto(a.kind) {
            continue;
        }
        let by_receiver =
            a.node == p.to && (is(&a.about, &p.from) || p.arrived_from.contains(&a.peer));
        let by_sender = a.node == p.from && is(&a.about, &p.to);
        if !by_receiver && !by_sender {
            continue;
        }
        if speaks_for(a.kind, by_receiver) {
            decisive = decisive.min(Verdict::of(a.kind));
        } else if a.kind != Kind::OneWay {
            continue;
        }
        listed.insert(PairAnomaly {
            node: a.node.clone(),
            kind: a.kind.name(),
        });
    }
    p.anomalies = listed.into_iter().collect();
    if p.sent >= options.min_packets && p.received == 0 {
        decisive = decisive.min(Verdict::OneWay);
    } else if p.sent >= options.min_packets && p.loss.is_some_and(|loss| loss > options.loss_target)
    {
        decisive = decisive.min(if p.dropped > 0 {
            kernel_drop_verdict(p)
        } else {
            Verdict::Loss
        });
    }
    p.verdict = decisive;
    p.next_step = next_step(p);
}

/// A pair whose loss is the receiver's own drops: dropped after
/// decapsulation when most of them were, else a policy drop when a
/// netfilter or allow-set reason says so, else loss.
fn kernel_drop_verdict(p: &Pair) -> Verdict {
    if p.dropped_after_decap > 0 && p.dropped_after_decap * 2 >= p.dropped {
        return Verdict::AfterDecap;
    }
    let policy = p
        .drops
        .keys()
        .any(|r| r == "calico_allow_set" || r.starts_with("NETFILTER"));
    if policy {
        Verdict::PolicyDrop
    } else {
        Verdict::Loss
    }
}

fn next_step(p: &Pair) -> String {
    let (from, to, proto) = (&p.from, &p.to, &p.proto);
    let (fa, ta) = (p.from_address, p.to_address);
    let reasons = || {
        p.drops
            .iter()
            .map(|(r, n)| format!("{r} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match p.verdict {
        Verdict::Healthy => String::new(),
        Verdict::RouteLoss => format!(
            "a route or BGP session between {from} and {to} is missing: run `observer diagnose` on \
             {from} (it names the pod blocks without a route) and check BIRD's sessions there \
             (`birdcl show protocols`)"
        ),
        Verdict::PolicyDrop if !p.arrived_from.is_empty() => format!(
            "{from}'s {proto} packets reach {to} from {}, which is no node (a router on the way \
             source-NATs them), and {to} drops them ({}): exempt node-to-node tunnel traffic from \
             NAT on that router",
            join(&p.arrived_from),
            reasons()
        ),
        Verdict::PolicyDrop => format!(
            "{to} drops {from}'s {proto} packets by policy ({}): check that {fa} is in {to}'s \
             allow-set (Calico: cali40all-vxlan-net / cali40all-hosts-net) and no DROP rule \
             matches it; `observer diagnose` on {to} shows the rule counters",
            reasons()
        ),
        Verdict::AfterDecap => format!(
            "{from}'s {proto} packets reach {to} and {to} drops them after decapsulation ({}): \
             `observer diagnose` on {to} names the device and the kernel function",
            reasons()
        ),
        Verdict::Mtu => format!(
            "{from}'s {proto} packets to {to} do not fit the path: lower the tunnel device's MTU \
             on both nodes or raise the path's; `observer probe` on {from} measures the largest \
             size that passes"
        ),
        Verdict::TcpHandshake => format!(
            "TCP connections between pods on {from} and {to} over {proto} are not answered: \
             `observer diagnose` on both names the side; check for bad inner checksums \
             (`ethtool -K <tunnel device> tx-checksum-ip-generic off`, Calico's \
             ChecksumOffloadBroken) and the pods' network policies"
        ),
        Verdict::OneWay => format!(
            "{from} sent {} {proto} packets to {to} ({ta}) and {to} received none from {fa}: \
             something between them drops {proto} from {fa} (a firewall, security group or \
             router ACL for the encapsulation's port or protocol); `observer diagnose` on {to} \
             shows what does arrive",
            p.sent
        ),
        Verdict::Loss if p.dropped > 0 => format!(
            "{to} drops {} of {from}'s {proto} packets ({}): `observer diagnose` on {to} names \
             the kernel's reasons",
            p.dropped,
            reasons()
        ),
        Verdict::Loss => format!(
            "{} of {} {proto} packets from {from} to {to} were not received, and {to} dropped \
             none: they are lost on the path between {fa} and {ta} (`observer probe` on {from})",
            p.sent.saturating_sub(p.received),
            p.sent
        ),
        Verdict::Other => format!(
            "see the anomalies ({}): `observer diagnose` on {to} and on {from}",
            p.anomalies
                .iter()
                .map(|a| format!("{}: {}", a.node, a.kind))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Addresses as "a, b".
pub fn join(addrs: &[IpAddr]) -> String {
    addrs
        .iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Adds each of `series` to `w` as the command adds the series of an
    /// answer.
    fn add(w: &mut Window, adder: fn(&mut Window, &Series), series: &[Series]) {
        for s in series {
            adder(w, s);
        }
    }

    /// A window knowing nodes a (10.0.0.1) and b (10.0.0.2).
    fn nodes_a_and_b() -> Window {
        let mut w = Window::default();
        add(
            &mut w,
            Window::add_node,
            &[
                series(&[("node", "a"), ("address", "10.0.0.1")], 1.0),
                series(&[("node", "b"), ("address", "10.0.0.2")], 1.0),
            ],
        );
        w
    }

    fn series(labels: &[(&str, &str)], value: f64) -> Series {
        Series {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }

    const GPU: &str = "10.10.10.62";
    const CP1: &str = "10.10.60.127";
    const CP2: &str = "10.10.60.209";
    const ROUTER: &str = "10.10.10.244";

    fn packets(node: &str, peer: &str, proto: &str, direction: &str, n: f64) -> Series {
        series(
            &[
                ("node", node),
                ("peer", peer),
                ("proto", proto),
                ("direction", direction),
            ],
            n,
        )
    }

    /// The incident lab as the store holds it: gpu's VXLAN never reaches
    /// cp1; cp1's arrives at gpu from the router's address and is dropped
    /// by the allow-set; IPIP works both ways; cp1 and cp2 are fine.
    fn incident() -> Window {
        let mut w = Window::default();
        add(
            &mut w,
            Window::add_node,
            &[
                series(&[("node", "gpu"), ("address", GPU)], 1.0),
                series(&[("node", "cp1"), ("address", CP1)], 1.0),
                series(&[("node", "cp2"), ("address", CP2)], 1.0),
            ],
        );
        add(
            &mut w,
            Window::add_packet,
            &[
                packets("gpu", CP1, "vxlan", "tx", 80.0),
                packets("cp1", GPU, "vxlan", "tx", 78.0),
                packets("gpu", ROUTER, "vxlan", "rx", 78.0),
                packets("gpu", CP1, "ipip", "tx", 40.0),
                packets("cp1", GPU, "ipip", "rx", 40.0),
                packets("cp1", GPU, "ipip", "tx", 40.0),
                packets("gpu", CP1, "ipip", "rx", 40.0),
                packets("cp1", CP2, "vxlan", "tx", 40.0),
                packets("cp2", CP1, "vxlan", "rx", 40.0),
                packets("cp2", CP1, "vxlan", "tx", 40.0),
                packets("cp1", CP2, "vxlan", "rx", 40.0),
            ],
        );
        add(
            &mut w,
            Window::add_drop,
            &[
                series(
                    &[
                        ("node", "gpu"),
                        ("peer", ROUTER),
                        ("proto", "vxlan"),
                        ("reason", "calico_allow_set"),
                    ],
                    78.0,
                ),
                series(
                    &[
                        ("node", "gpu"),
                        ("peer", ROUTER),
                        ("proto", "vxlan"),
                        ("reason", "NETFILTER_DROP"),
                    ],
                    78.0,
                ),
            ],
        );
        let anomaly = |node: &str, kind: &str, peer: &str, about: &str| {
            series(
                &[
                    ("node", node),
                    ("kind", kind),
                    ("proto", "vxlan"),
                    ("peer", peer),
                    ("about", about),
                ],
                1.0,
            )
        };
        add(
            &mut w,
            Window::add_anomaly,
            &[
                anomaly("gpu", "snat_suspected", ROUTER, CP1),
                anomaly("gpu", "allow_set_drop", ROUTER, ROUTER),
                anomaly("gpu", "one_way", CP1, CP1),
                anomaly("cp1", "one_way", GPU, GPU),
            ],
        );
        w
    }

    fn line(p: &Pair) -> String {
        format!(
            "{}->{} {} sent {} received {} dropped {} via {:?} {:?} {:?}",
            p.from,
            p.to,
            p.proto,
            p.sent,
            p.received,
            p.dropped,
            p.arrived_from,
            p.verdict,
            p.anomalies
                .iter()
                .map(|a| format!("{}:{}", a.node, a.kind))
                .collect::<Vec<_>>()
        )
    }

    #[test]
    fn the_incident_is_one_way_one_way_and_a_policy_drop_the_other() {
        let cluster = pairs(&incident(), Options::default());
        let lines: Vec<String> = cluster.pairs.iter().map(line).collect();
        assert_eq!(
            lines,
            [
                r#"cp1->gpu vxlan sent 78 received 78 dropped 78 via [10.10.10.244] PolicyDrop ["cp1:one_way", "gpu:allow_set_drop", "gpu:one_way", "gpu:snat_suspected"]"#,
                r#"gpu->cp1 vxlan sent 80 received 0 dropped 0 via [] OneWay ["cp1:one_way", "gpu:one_way"]"#,
                "cp1->cp2 vxlan sent 40 received 40 dropped 0 via [] Healthy []",
                "cp1->gpu ipip sent 40 received 40 dropped 0 via [] Healthy []",
                "cp2->cp1 vxlan sent 40 received 40 dropped 0 via [] Healthy []",
                "gpu->cp1 ipip sent 40 received 40 dropped 0 via [] Healthy []",
            ]
        );
        let policy = &cluster.pairs[0];
        assert_eq!(policy.loss, Some(1.0));
        assert!(
            policy
                .next_step
                .contains("from 10.10.10.244, which is no node")
        );
        assert_eq!(cluster.pairs[1].loss, Some(1.0));
        assert!(
            cluster.pairs[1]
                .next_step
                .starts_with("gpu sent 80 vxlan packets to cp1")
        );
        assert!(cluster.foreign.is_empty());
        assert_eq!(cluster.nodes, 3);
        assert!(!cluster.healthy());
        assert_eq!(
            cluster.verdict_counts(),
            BTreeMap::from([
                (Verdict::PolicyDrop, 1),
                (Verdict::OneWay, 1),
                (Verdict::Healthy, 4)
            ])
        );
    }

    /// b drops a's VXLAN after decapsulation (conntrack or a policy on
    /// vxlan.calico): the pair's verdict says so, not a policy on the
    /// wire; the same reason on the underlay stays a policy drop.
    #[test]
    fn drops_after_decapsulation_are_their_own_verdict() {
        let mut w = nodes_a_and_b();
        add(
            &mut w,
            Window::add_packet,
            &[
                packets("a", "10.0.0.2", "vxlan", "tx", 1_000.0),
                packets("b", "10.0.0.1", "vxlan", "rx", 1_000.0),
                packets("b", "10.0.0.1", "ipip", "tx", 1_000.0),
                packets("a", "10.0.0.2", "ipip", "rx", 1_000.0),
            ],
        );
        let drop = |node: &str, peer: &str, proto: &str, stage: Option<&str>| {
            let mut labels = vec![
                ("node", node),
                ("peer", peer),
                ("proto", proto),
                ("reason", "NETFILTER_DROP"),
            ];
            labels.extend(stage.map(|s| ("stage", s)));
            series(&labels, 40.0)
        };
        add(
            &mut w,
            Window::add_drop,
            &[
                drop("b", "10.0.0.1", "vxlan", Some("tunnel")),
                drop("a", "10.0.0.2", "ipip", Some("underlay")),
            ],
        );
        let cluster = pairs(&w, Options::default());
        let by = |from: &str, proto: &str| {
            cluster
                .pairs
                .iter()
                .find(|p| p.from == from && p.proto == proto)
                .unwrap()
        };
        let vxlan = by("a", "vxlan");
        assert_eq!(vxlan.verdict, Verdict::AfterDecap, "{vxlan:?}");
        assert_eq!((vxlan.dropped, vxlan.dropped_after_decap), (40, 40));
        assert!(
            vxlan.next_step.contains("after decapsulation"),
            "{}",
            vxlan.next_step
        );
        let ipip = by("b", "ipip");
        assert_eq!(ipip.verdict, Verdict::PolicyDrop, "{ipip:?}");
        assert_eq!((ipip.dropped, ipip.dropped_after_decap), (40, 0));
    }

    #[test]
    fn loss_on_the_path_and_drops_at_the_receiver_are_told_apart() {
        let mut w = nodes_a_and_b();
        add(
            &mut w,
            Window::add_packet,
            &[
                packets("a", "10.0.0.2", "geneve", "tx", 10_000.0),
                packets("b", "10.0.0.1", "geneve", "rx", 9_990.0),
                packets("b", "10.0.0.1", "geneve", "tx", 10_000.0),
                packets("a", "10.0.0.2", "geneve", "rx", 10_000.0),
                // Within the target: 4 of 10,000 (0.04 %).
                packets("a", "10.0.0.2", "vxlan", "tx", 10_000.0),
                packets("b", "10.0.0.1", "vxlan", "rx", 9_996.0),
                // A foreign source nobody attributes.
                packets("b", "192.0.2.9", "vxlan", "rx", 7.0),
            ],
        );
        add(
            &mut w,
            Window::add_drop,
            &[series(
                &[
                    ("node", "a"),
                    ("peer", "10.0.0.2"),
                    ("proto", "geneve"),
                    ("reason", "IP_RPFILTER"),
                ],
                30.0,
            )],
        );
        let cluster = pairs(&w, Options::default());
        let by = |from: &str, proto: &str| {
            cluster
                .pairs
                .iter()
                .find(|p| p.from == from && p.proto == proto)
                .unwrap()
        };
        assert_eq!(by("a", "geneve").verdict, Verdict::Loss);
        assert_eq!(by("a", "geneve").loss, Some(0.001));
        assert!(by("a", "geneve").next_step.contains("lost on the path"));
        assert_eq!(by("b", "geneve").verdict, Verdict::Loss);
        assert_eq!(by("b", "geneve").dropped, 30);
        assert!(by("b", "geneve").next_step.contains("a drops 30"));
        assert_eq!(by("a", "vxlan").verdict, Verdict::Healthy);
        assert_eq!(
            cluster.foreign,
            [Foreign {
                node: "b".to_string(),
                peer: "192.0.2.9".parse().unwrap(),
                proto: "vxlan".to_string(),
                received: 7
            }]
        );
    }

    #[test]
    fn route_and_bgp_findings_speak_for_their_side_and_every_encapsulation() {
        let mut w = Window::default();
        add(
            &mut w,
            Window::add_node,
            &[
                series(&[("node", "n1"), ("address", "10.0.0.1")], 1.0),
                series(&[("node", "n2"), ("address", "10.0.0.2")], 1.0),
            ],
        );
        add(
            &mut w,
            Window::add_packet,
            &[
                packets("n1", "10.0.0.2", "ipip", "tx", 10.0),
                packets("n2", "10.0.0.1", "ipip", "rx", 10.0),
                packets("n2", "10.0.0.1", "ipip", "tx", 10.0),
                packets("n1", "10.0.0.2", "ipip", "rx", 10.0),
            ],
        );
        // n1 lost its route to n2's block: n1 -> n2 is route loss, the
        // other way is fine.
        add(
            &mut w,
            Window::add_anomaly,
            &[series(
                &[
                    ("node", "n1"),
                    ("kind", "route_missing"),
                    ("proto", "other"),
                    ("peer", "10.0.0.2"),
                    ("about", "10.0.0.2"),
                ],
                1.0,
            )],
        );
        let cluster = pairs(&w, Options::default());
        let lines: Vec<String> = cluster.pairs.iter().map(line).collect();
        assert_eq!(
            lines,
            [
                r#"n1->n2 ipip sent 10 received 10 dropped 0 via [] RouteLoss ["n1:route_missing"]"#,
                "n2->n1 ipip sent 10 received 10 dropped 0 via [] Healthy []",
            ]
        );
    }

    #[test]
    fn series_without_their_labels_are_skipped_and_counted() {
        let mut w = Window::default();
        add(&mut w, Window::add_node, &[series(&[("node", "a")], 1.0)]);
        add(
            &mut w,
            Window::add_packet,
            &[packets("a", "not-an-address", "vxlan", "tx", 1.0)],
        );
        add(
            &mut w,
            Window::add_anomaly,
            &[series(&[("node", "a"), ("kind", "no_such_kind")], 1.0)],
        );
        assert_eq!(w.skipped, 3);
        assert!(pairs(&w, Options::default()).pairs.is_empty());
    }

    #[test]
    fn queries_take_exact_increases_over_the_window() {
        let q = Queries::new(Duration::from_secs(300));
        assert_eq!(
            q.packets,
            "sum by (node, peer, proto, direction) ((last_over_time(observer_encap_packets_total{proto!=\"other\",peer!=\"other\",peer!=\"\"}[300s]) - (observer_encap_packets_total{proto!=\"other\",peer!=\"other\",peer!=\"\"} offset 300s)) >= 0 or last_over_time(observer_encap_packets_total{proto!=\"other\",peer!=\"other\",peer!=\"\"}[300s]))"
        );
        assert!(q.nodes.contains("observer_node_info[300s]"));
    }
}
