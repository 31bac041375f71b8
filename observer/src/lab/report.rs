//! The lab's diagnosis, computed only from what the node observers printed
//! (their JSON lines: peer and drop rows, snat_suspected anomalies) and the
//! counters of Calico's rules read at the end: facts (per path, per foreign
//! source, per drop) and the findings they add up to. The lab's own
//! knowledge is used only to name nodes by their underlay address.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use ipnet::Ipv4Net;
use serde::Serialize;
use serde_json::Value;

use super::topology::{Block, NODES, NodeSpec, RULES, RuleCounts};

/// The node an observer named as the real sender of packets that arrived
/// from another address (its `snat_suspected` evidence).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sender {
    /// Lab name of that node (`?` when no lab node has the address).
    pub node: &'static str,
    /// The node address the observer named (`real_node`).
    pub addr: Ipv4Addr,
    /// The inner source that gave it away (`inner_source`).
    pub inner_src: Ipv4Addr,
    /// The pod block holding it, from the node's routes (`pod_block`).
    pub block: Ipv4Net,
}

/// One thing the observers showed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "fact", rename_all = "snake_case")]
pub enum Fact {
    /// Tunnel packets from one node to another: `sent` counted on the
    /// sender's underlay (tx, peer = receiver), `received` on the
    /// receiver's (rx, peer = sender).
    Path {
        /// `vxlan` or `ipip`.
        proto: String,
        /// Sending node.
        from: &'static str,
        /// Its address.
        from_addr: Ipv4Addr,
        /// Receiving node.
        to: &'static str,
        /// Its address.
        to_addr: Ipv4Addr,
        /// Packets the sender's observer saw leave.
        sent: u64,
        /// Packets the receiver's observer saw arrive from the sender's address.
        received: u64,
    },
    /// Tunnel packets that arrived from an address that is no node's.
    ForeignSource {
        /// Receiving node.
        node: &'static str,
        /// Encapsulation.
        proto: String,
        /// The outer source that arrived.
        outer_src: Ipv4Addr,
        /// Packets received from it.
        packets: u64,
        /// Inner sources sampled by the observer in those packets.
        inner_src: Vec<Ipv4Addr>,
        /// The real senders the observer named.
        senders: Vec<Sender>,
    },
    /// Calico allow-set drops: the observer's count beside the rules'.
    AllowSetDrops {
        /// Node.
        node: &'static str,
        /// `vxlan` or `ipip`.
        proto: &'static str,
        /// The allow-set.
        set: &'static str,
        /// Packets the observer flagged as `calico_allow_set`.
        observer_packets: u64,
        /// Comment of Calico's DROP rule.
        drop_rule: &'static str,
        /// Its packet counter.
        drop_rule_packets: u64,
        /// Comment of Calico's ACCEPT rule.
        allow_rule: &'static str,
        /// Its packet counter.
        allow_rule_packets: u64,
        /// Whether the observer and the DROP rule counted the same.
        agree: bool,
    },
    /// Any other drop the observer reported.
    Drop {
        /// Node.
        node: &'static str,
        /// Encapsulation (or `other`).
        proto: String,
        /// Peer, when known.
        peer: Option<String>,
        /// `classifier` or `kernel`.
        origin: String,
        /// Reason name.
        reason: String,
        /// Packets.
        packets: u64,
        /// The observer's sentence.
        message: String,
    },
}

/// The latest `peer` line of one row, and every inner source it sampled.
struct PeerRow<'a> {
    line: &'a Value,
    inner_srcs: BTreeSet<Ipv4Addr>,
}

impl PeerRow<'_> {
    fn is(&self, direction: &str, proto: &str, peer: Ipv4Addr) -> bool {
        self.line["direction"] == direction
            && self.line["proto"] == proto
            && self.peer() == Some(peer)
    }

    fn peer(&self) -> Option<Ipv4Addr> {
        self.line["peer"].as_str().and_then(|p| p.parse().ok())
    }

    fn packets(&self) -> u64 {
        self.line["packets"].as_u64().unwrap_or(0)
    }
}

/// Rows of an observer's output: lines of a row carry cumulative counters,
/// so the latest one is its total.
fn rows(lines: &[Value]) -> Vec<PeerRow<'_>> {
    let mut rows: BTreeMap<String, PeerRow<'_>> = BTreeMap::new();
    for line in lines.iter().filter(|l| l["type"] == "peer") {
        let key = ["iface", "direction", "proto", "peer", "vni"]
            .map(|k| line[k].to_string())
            .join("|");
        let row = rows.entry(key).or_insert_with(|| PeerRow {
            line,
            inner_srcs: BTreeSet::new(),
        });
        row.line = line;
        row.inner_srcs.extend(
            line["inner_src"]
                .as_str()
                .and_then(|s| s.parse::<Ipv4Addr>().ok()),
        );
    }
    rows.into_values().collect()
}

/// The latest `drop` line per (iface, proto, peer, vni, origin, reason).
fn drops(lines: &[Value]) -> Vec<&Value> {
    let mut latest = BTreeMap::new();
    for line in lines.iter().filter(|l| l["type"] == "drop") {
        let key = ["iface", "proto", "peer", "vni", "origin", "reason"]
            .map(|k| line[k].to_string())
            .join("|");
        latest.insert(key, line);
    }
    latest.into_values().collect()
}

fn is_allow_set_drop(line: &Value) -> bool {
    line["origin"] == "classifier" && line["reason"] == "calico_allow_set"
}

/// The real senders behind `outer` (`proto`) that the observer named in
/// its `snat_suspected` anomalies and final findings.
fn snat_senders(lines: &[Value], outer: Ipv4Addr, proto: &str) -> Vec<Sender> {
    let raised = lines
        .iter()
        .filter(|l| l["type"] == "anomaly" && l["state"] == "raised");
    let final_findings = lines
        .iter()
        .filter(|l| l["type"] == "diagnosis")
        .filter_map(|l| l["findings"].as_array())
        .flatten();
    let mut senders: Vec<Sender> = raised
        .chain(final_findings)
        .filter(|f| {
            f["kind"] == "snat_suspected"
                && f["proto"] == proto
                && f["peer"].as_str() == Some(&outer.to_string())
        })
        .filter_map(|f| {
            let evidence = &f["evidence"];
            let field = |k: &str| evidence[k].as_str().and_then(|v| v.parse().ok());
            let addr: Ipv4Addr = field("real_node")?;
            Some(Sender {
                node: NODES
                    .iter()
                    .find(|n| n.addr == addr)
                    .map_or("?", |n| n.name),
                addr,
                inner_src: field("inner_source")?,
                block: evidence["pod_block"].as_str()?.parse().ok()?,
            })
        })
        .collect();
    senders.sort_by_key(|s| (s.addr, s.inner_src));
    senders.dedup();
    senders
}

/// The facts in the observers' output (`outputs`, one per node of
/// [`NODES`]) and Calico's rule counters (`counters`: per node, per
/// [`RULES`] pair, (ACCEPT, DROP) packets).
pub fn facts(outputs: &[Vec<Value>], counters: &[RuleCounts]) -> Vec<Fact> {
    let rows: Vec<Vec<PeerRow<'_>>> = outputs.iter().map(|lines| rows(lines)).collect();
    let mut facts = Vec::new();
    for (a, from) in NODES.iter().enumerate() {
        for (b, to) in NODES.iter().enumerate().filter(|(b, _)| *b != a) {
            for block in Block::ALL {
                let proto = block.proto();
                let count = |rows: &[PeerRow<'_>], direction, peer| -> u64 {
                    rows.iter()
                        .filter(|r| r.is(direction, proto, peer))
                        .map(PeerRow::packets)
                        .sum()
                };
                let sent = count(&rows[a], "tx", to.addr);
                let received = count(&rows[b], "rx", from.addr);
                if sent + received > 0 {
                    facts.push(Fact::Path {
                        proto: proto.to_string(),
                        from: from.name,
                        from_addr: from.addr,
                        to: to.name,
                        to_addr: to.addr,
                        sent,
                        received,
                    });
                }
            }
        }
    }
    for (n, node) in NODES.iter().enumerate() {
        let mut foreign: BTreeMap<(String, Ipv4Addr), (u64, BTreeSet<Ipv4Addr>)> = BTreeMap::new();
        for row in &rows[n] {
            let Some(peer) = row.peer() else { continue };
            if row.line["direction"] != "rx" || NODES.iter().any(|o| o.addr == peer) {
                continue;
            }
            let proto = row.line["proto"].as_str().unwrap_or("?").to_string();
            let entry = foreign.entry((proto, peer)).or_default();
            entry.0 += row.packets();
            entry.1.extend(&row.inner_srcs);
        }
        for ((proto, outer_src), (packets, inner)) in foreign {
            facts.push(Fact::ForeignSource {
                node: node.name,
                senders: snat_senders(&outputs[n], outer_src, &proto),
                proto,
                outer_src,
                packets,
                inner_src: inner.into_iter().collect(),
            });
        }
        let node_drops = drops(&outputs[n]);
        for (pair, &(allow, drop)) in RULES.iter().zip(&counters[n]) {
            let observed = node_drops
                .iter()
                .filter(|l| is_allow_set_drop(l) && l["proto"] == pair.proto)
                .filter_map(|l| l["packets"].as_u64())
                .sum();
            facts.push(Fact::AllowSetDrops {
                node: node.name,
                proto: pair.proto,
                set: pair.set,
                observer_packets: observed,
                drop_rule: pair.drop,
                drop_rule_packets: drop,
                allow_rule: pair.allow,
                allow_rule_packets: allow,
                agree: observed == drop,
            });
        }
        for line in node_drops.into_iter().filter(|l| !is_allow_set_drop(l)) {
            let text = |k: &str| line[k].as_str().unwrap_or("?").to_string();
            facts.push(Fact::Drop {
                node: node.name,
                proto: text("proto"),
                peer: line["peer"].as_str().map(str::to_string),
                origin: text("origin"),
                reason: text("reason"),
                packets: line["packets"].as_u64().unwrap_or(0),
                message: text("message"),
            });
        }
    }
    facts
}

fn node(name: &str) -> &'static NodeSpec {
    NODES
        .iter()
        .find(|n| n.name == name)
        .expect("facts name lab nodes only")
}

/// The findings the facts add up to, most telling first; one sentence
/// each. A scenario without any is healthy.
pub fn findings(facts: &[Fact]) -> Vec<String> {
    let mut out = Vec::new();
    let foreign = |at: &str, proto: &str| -> Vec<(Ipv4Addr, &Vec<Sender>)> {
        facts
            .iter()
            .filter_map(|f| match f {
                Fact::ForeignSource {
                    node,
                    proto: p,
                    outer_src,
                    senders,
                    ..
                } if *node == at && p == proto => Some((*outer_src, senders)),
                _ => None,
            })
            .collect()
    };
    let paths = || {
        facts.iter().filter_map(|f| match f {
            Fact::Path {
                proto,
                from,
                to,
                sent,
                received,
                ..
            } => Some((proto.as_str(), *from, *to, *sent, *received)),
            _ => None,
        })
    };
    for (proto, from, to, sent, received) in paths() {
        let (f, t) = (node(from), node(to));
        let what = format!(
            "{} {from} {} -> {to} {}",
            proto.to_uppercase(),
            f.addr,
            t.addr
        );
        if received == 0 {
            let mut line = format!(
                "{what} never arrives: {sent} sent by {from}, 0 received at {to} from {}.",
                f.addr
            );
            for (outer, senders) in foreign(to, proto) {
                if senders.iter().any(|s| s.node == from) {
                    line.push_str(&format!(" It arrives from {outer} instead (below)."));
                }
            }
            out.push(line);
        } else if received < sent {
            out.push(format!(
                "{what} loses {} of {sent} packets: {received} received at {to}.",
                sent - received
            ));
        }
    }
    for fact in facts {
        if let Fact::ForeignSource {
            node,
            proto,
            outer_src,
            packets,
            inner_src,
            senders,
        } = fact
        {
            let inner = join(inner_src);
            let who = if senders.is_empty() {
                format!("the observer named no node as their sender (inner source {inner})")
            } else {
                let owners: Vec<String> = senders
                    .iter()
                    .map(|s| {
                        format!(
                            "{} lies in {}'s block {}: {} {} sent them",
                            s.inner_src, s.node, s.block, s.node, s.addr
                        )
                    })
                    .collect();
                format!(
                    "the observer's snat_suspected: inner source {}; the outer source was \
                     rewritten on the way (source NAT)",
                    owners.join("; ")
                )
            };
            out.push(format!(
                "{} reaches {node} from {outer_src}, which is no node's address: {packets} \
                 packets; {who}.",
                proto.to_uppercase()
            ));
            let ipip: Vec<String> = paths()
                .filter(|&(p, _, to, _, received)| p == "ipip" && to == *node && received > 0)
                .map(|(_, from, _, _, received)| {
                    format!("{} ({from}) {received} packets", self::node(from).addr)
                })
                .collect();
            if proto != "ipip" && !ipip.is_empty() {
                out.push(format!(
                    "Same path, other protocol: IPIP reaches {node} with the real node \
                     addresses, {}: IPIP is not NATed.",
                    ipip.join(", ")
                ));
            }
        }
    }
    for fact in facts {
        if let Fact::AllowSetDrops {
            node,
            proto,
            set,
            observer_packets,
            drop_rule,
            drop_rule_packets,
            allow_rule,
            allow_rule_packets,
            agree,
        } = fact
            && (*observer_packets > 0 || *drop_rule_packets > 0)
        {
            out.push(format!(
                "{node} drops {proto_up} from sources outside {set}: the observer counted \
                 {observer_packets} (calico_allow_set), iptables cali-INPUT \"{drop_rule}\" \
                 counted {drop_rule_packets} (\"{allow_rule}\": {allow_rule_packets}): {}.",
                if *agree { "equal" } else { "DIFFERENT" },
                proto_up = proto.to_uppercase()
            ));
        }
    }
    out.extend(mismatches(&paths().collect::<Vec<_>>()));
    for fact in facts {
        if let Fact::Drop { node, message, .. } = fact {
            out.push(format!("{node}: {message}."));
        }
    }
    out
}

/// A node that receives one encapsulation from a peer but sends it
/// another: the two disagree on the encapsulation.
fn mismatches(paths: &[(&str, &'static str, &'static str, u64, u64)]) -> Vec<String> {
    let mut out = Vec::new();
    let sends = |from: &str, to: &str, proto: &str| {
        paths
            .iter()
            .any(|&(p, f, t, sent, _)| p == proto && f == from && t == to && sent > 0)
    };
    for &(proto, peer, me, _, received) in paths {
        if received == 0 || sends(me, peer, proto) {
            continue;
        }
        let other: Vec<&str> = Block::ALL
            .iter()
            .map(|b| b.proto())
            .filter(|&p| p != proto && sends(me, peer, p))
            .collect();
        if let Some(other) = other.first() {
            out.push(format!(
                "{me} receives {} from {peer} but sends it {} only: the two nodes disagree on \
                 the encapsulation (a half-applied change?).",
                proto.to_uppercase(),
                other.to_uppercase()
            ));
        }
    }
    out
}

fn join(addrs: &[Ipv4Addr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn peer(direction: &str, proto: &str, peer: &str, packets: u64, inner: &str) -> Value {
        json!({"type":"peer","iface":"eth0","direction":direction,"proto":proto,"peer":peer,
               "vni":4096,"packets":packets,"inner_src":inner,"inner_dst":"10.0.0.1"})
    }

    fn incident() -> (Vec<Vec<Value>>, Vec<RuleCounts>) {
        let gpu = vec![
            peer("tx", "vxlan", "10.10.60.127", 20, "10.42.182.1"),
            peer("tx", "vxlan", "10.10.60.127", 53, "10.42.182.1"),
            peer("rx", "vxlan", "10.10.10.244", 53, "10.42.168.210"),
            peer("rx", "ipip", "10.10.60.127", 106, "10.43.168.210"),
            json!({"type":"anomaly","state":"raised","kind":"snat_suspected","peer":"10.10.10.244",
                   "proto":"vxlan","evidence":{"inner_source":"10.42.168.210",
                   "real_node":"10.10.60.127","pod_block":"10.42.168.192/26"}}),
            json!({"type":"drop","iface":"eth0","proto":"vxlan","peer":"10.10.10.244","vni":4096,
                   "origin":"classifier","reason":"calico_allow_set","packets":53,"message":"m"}),
            json!({"type":"drop","iface":"eth0","proto":"vxlan","peer":"10.10.10.244","vni":4096,
                   "origin":"kernel","reason":"NETFILTER_DROP","packets":53,
                   "message":"53 VXLAN packets from 10.10.10.244 dropped: kernel drop reason NETFILTER_DROP"}),
        ];
        let cp1 = vec![
            peer("tx", "vxlan", "10.10.10.62", 53, "10.42.168.210"),
            peer("tx", "ipip", "10.10.10.62", 106, "10.43.168.210"),
        ];
        (
            vec![gpu, cp1, vec![]],
            vec![
                vec![(0, 53), (106, 0)],
                vec![(0, 0), (0, 0)],
                vec![(0, 0), (0, 0)],
            ],
        )
    }

    #[test]
    fn incident_facts_come_from_the_rows() {
        let (outputs, counters) = incident();
        let facts = facts(&outputs, &counters);
        assert!(facts.contains(&Fact::Path {
            proto: "vxlan".into(),
            from: "gpu",
            from_addr: NODES[0].addr,
            to: "cp1",
            to_addr: NODES[1].addr,
            sent: 53,
            received: 0,
        }));
        let Some(Fact::ForeignSource {
            outer_src, senders, ..
        }) = facts
            .iter()
            .find(|f| matches!(f, Fact::ForeignSource { .. }))
        else {
            panic!("no foreign source in {facts:?}");
        };
        assert_eq!(outer_src.to_string(), "10.10.10.244");
        assert_eq!(senders[0].node, "cp1");
        assert_eq!(senders[0].addr, NODES[1].addr);
        let findings = findings(&facts);
        let text = findings.join("\n");
        assert!(
            text.contains("VXLAN gpu 10.10.10.62 -> cp1 10.10.60.127 never arrives: 53 sent by gpu, 0 received"),
            "{text}"
        );
        assert!(
            text.contains("It arrives from 10.10.10.244 instead"),
            "{text}"
        );
        assert!(text.contains("cp1 10.10.60.127 sent them"), "{text}");
        assert!(text.contains("counted 53 (calico_allow_set)"), "{text}");
        assert!(text.contains(": equal."), "{text}");
        assert!(text.contains("10.10.60.127 (cp1) 106 packets"), "{text}");
        assert!(
            text.contains("gpu: 53 VXLAN packets from 10.10.10.244 dropped"),
            "{text}"
        );
    }

    #[test]
    fn a_one_sided_encapsulation_is_a_mismatch() {
        let gpu = vec![
            peer("tx", "ipip", "10.10.60.127", 10, "10.42.182.1"),
            peer("rx", "vxlan", "10.10.60.127", 10, "10.42.168.210"),
        ];
        let cp1 = vec![
            peer("rx", "ipip", "10.10.10.62", 10, "10.42.182.1"),
            peer("tx", "vxlan", "10.10.10.62", 10, "10.42.168.210"),
        ];
        let zero = vec![(0, 0), (0, 0)];
        let facts = facts(&[gpu, cp1, vec![]], &[zero.clone(), zero.clone(), zero]);
        let findings = findings(&facts);
        assert!(
            findings
                .iter()
                .any(|f| f.starts_with("gpu receives VXLAN from cp1 but sends it IPIP only")),
            "{findings:?}"
        );
        assert!(
            findings
                .iter()
                .any(|f| f.starts_with("cp1 receives IPIP from gpu but sends it VXLAN only")),
            "{findings:?}"
        );
    }

    #[test]
    fn a_healthy_run_has_no_findings() {
        let gpu = vec![peer("tx", "vxlan", "10.10.60.127", 10, "10.42.182.1")];
        let cp1 = vec![peer("rx", "vxlan", "10.10.10.62", 10, "10.42.182.1")];
        let zero = vec![(0, 0), (0, 0)];
        let facts = facts(&[gpu, cp1, vec![]], &[zero.clone(), zero.clone(), zero]);
        assert!(findings(&facts).is_empty(), "{facts:?}");
    }
}
