//! What the BGP scenario's observers printed, as facts: per node, each
//! anomaly it raised (kind, peer, blocks) and whether and after how long
//! it cleared, each route outage it measured, the BGP messages it saw
//! arrive from each peer at the wire, and what the pings counted; then
//! the findings and the write-up. Pure: JSON lines in, facts out.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
};

use serde::Serialize;
use serde_json::Value;

use super::mesh::MESH;

/// What one ping counted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PingCount {
    /// Sending node.
    pub from: &'static str,
    /// Target node.
    pub to: &'static str,
    /// Source pod address.
    pub src: Ipv4Addr,
    /// Target pod address.
    pub dst: Ipv4Addr,
    /// Echo requests sent.
    pub transmitted: u64,
    /// Replies received.
    pub received: u64,
}

/// One anomaly of one observer, from its raised and cleared lines.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Seen {
    /// `bgp_down`, `route_missing`, ...
    pub kind: String,
    /// The peer it names.
    pub peer: String,
    /// The pod blocks in its evidence (route_missing).
    pub blocks: Vec<String>,
    /// Whether it cleared during the run.
    pub cleared: bool,
    /// How long it lasted, when it cleared.
    pub duration_s: Option<f64>,
}

/// A fact of the run, printed as a `{"type":"lab","fact":...}` line.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "fact", rename_all = "snake_case")]
pub enum Fact {
    /// An anomaly a node's observer raised.
    Anomaly {
        /// The node whose observer raised it.
        node: &'static str,
        #[serde(flatten)]
        seen: Seen,
    },
    /// A pod block's route came back on a node after an outage.
    RouteOutage {
        /// The node that lost the route.
        node: &'static str,
        /// The block.
        block: String,
        /// The node the block was routed to.
        via: String,
        /// How long it had no route.
        duration_s: f64,
    },
    /// A node's verdict on one peer, from its diagnosis.
    Verdict {
        /// The node whose observer judged.
        node: &'static str,
        /// The peer.
        peer: String,
        /// `route_loss`, `policy_drop`, `mtu`, `other` or `healthy`.
        verdict: String,
    },
    /// The BGP segments a node's observer saw arrive from a peer that
    /// ended a session at the wire (a NOTIFICATION or an RST).
    Wire {
        /// The receiving node.
        node: &'static str,
        /// The sending peer.
        peer: String,
        /// Segments starting with an OPEN.
        open: u64,
        /// Segments starting with a NOTIFICATION.
        notification: u64,
        /// Segments with RST.
        rst: u64,
        /// The latest NOTIFICATION's name.
        last_notification: Option<String>,
    },
    /// What a ping counted.
    Ping(PingCount),
}

/// The [`Fact::Wire`]s of one node's lines: the last `bgp_wire` line
/// received from each peer, when it holds an end.
fn wire(node: &'static str, lines: &[Value]) -> Vec<Fact> {
    let mut last: BTreeMap<String, &Value> = BTreeMap::new();
    for line in lines
        .iter()
        .filter(|l| l["type"] == "bgp_wire" && l["direction"] == "rx")
    {
        last.insert(text(&line["peer"]), line);
    }
    let count = |line: &Value, key: &str| line[key].as_u64().unwrap_or(0);
    last.into_iter()
        .filter(|(_, l)| count(l, "notification") + count(l, "rst") > 0)
        .map(|(peer, l)| Fact::Wire {
            node,
            peer,
            open: count(l, "open"),
            notification: count(l, "notification"),
            rst: count(l, "rst"),
            last_notification: l["last_notification"]["name"].as_str().map(String::from),
        })
        .collect()
}

/// The anomalies in one observer's lines, in the order raised; a cleared
/// line completes its raised one.
pub fn anomalies(lines: &[Value]) -> Vec<Seen> {
    let mut seen: Vec<Seen> = Vec::new();
    for line in lines.iter().filter(|l| l["type"] == "anomaly") {
        let (kind, peer) = (text(&line["kind"]), text(&line["peer"]));
        let open = seen
            .iter_mut()
            .rev()
            .find(|s| s.kind == kind && s.peer == peer && !s.cleared);
        match (line["state"].as_str(), open) {
            (Some("raised"), _) => seen.push(Seen {
                blocks: line["evidence"]["blocks"]
                    .as_array()
                    .map(|b| b.iter().map(text).collect())
                    .unwrap_or_default(),
                kind,
                peer,
                cleared: false,
                duration_s: None,
            }),
            (Some("cleared"), Some(open)) => {
                open.cleared = true;
                open.duration_s = line["duration_s"].as_f64();
            }
            _ => {}
        }
    }
    seen
}

/// Whether `lines` hold an anomaly line of `kind` for `peer` in `state`.
pub fn has(lines: &[Value], kind: &str, peer: Ipv4Addr, state: &str) -> bool {
    let peer = peer.to_string();
    lines.iter().any(|l| {
        l["type"] == "anomaly" && l["kind"] == kind && l["peer"] == peer && l["state"] == state
    })
}

/// The facts of a run: `lines` per node of [`MESH`], and the pings.
pub fn facts(lines: &[Vec<Value>], pings: &[PingCount]) -> Vec<Fact> {
    let mut facts = Vec::new();
    for (member, lines) in MESH.iter().zip(lines) {
        facts.extend(anomalies(lines).into_iter().map(|seen| Fact::Anomaly {
            node: member.name,
            seen,
        }));
        facts.extend(
            lines
                .iter()
                .filter(|l| l["type"] == "route_outage")
                .map(|l| Fact::RouteOutage {
                    node: member.name,
                    block: text(&l["block"]),
                    via: text(&l["node"]),
                    duration_s: l["duration_s"].as_f64().unwrap_or(0.0),
                }),
        );
        let diagnosis = lines.iter().rev().find(|l| l["type"] == "diagnosis");
        let pairs = diagnosis.and_then(|d| d["pairs"].as_array());
        facts.extend(pairs.into_iter().flatten().map(|pair| Fact::Verdict {
            node: member.name,
            peer: text(&pair["peer"]),
            verdict: text(&pair["verdict"]),
        }));
        facts.extend(wire(member.name, lines));
    }
    facts.extend(pings.iter().cloned().map(Fact::Ping));
    facts
}

/// The lab's findings: per (kind, peer), which nodes named it and how
/// long it lasted on each; per block, its route outages; per ping, what
/// was lost.
pub fn findings(facts: &[Fact]) -> Vec<String> {
    let mut by_anomaly: BTreeMap<(&str, &str), Vec<(&str, &Seen)>> = BTreeMap::new();
    let mut outages: BTreeMap<(&str, &str), Vec<(&str, f64)>> = BTreeMap::new();
    let mut out = Vec::new();
    for fact in facts {
        match fact {
            Fact::Anomaly { node, seen } => by_anomaly
                .entry((&seen.kind, &seen.peer))
                .or_default()
                .push((node, seen)),
            Fact::RouteOutage {
                node,
                block,
                via,
                duration_s,
            } => outages
                .entry((block, via))
                .or_default()
                .push((node, *duration_s)),
            Fact::Verdict { .. } | Fact::Wire { .. } | Fact::Ping(_) => {}
        }
    }
    for ((kind, peer), seen) in &by_anomaly {
        let blocks = seen
            .iter()
            .flat_map(|(_, s)| s.blocks.iter().map(String::as_str))
            .collect::<std::collections::BTreeSet<_>>();
        let blocks = if blocks.is_empty() {
            String::new()
        } else {
            format!(
                " (block {})",
                blocks.into_iter().collect::<Vec<_>>().join(", ")
            )
        };
        let on: Vec<String> = seen
            .iter()
            .map(|(node, s)| match s.duration_s {
                Some(d) if s.cleared => format!("{node} cleared after {d:.1} s"),
                _ => format!("{node} still active at the end"),
            })
            .collect();
        out.push(format!(
            "{kind} for {}{blocks}: raised on {}",
            named(peer),
            on.join(", ")
        ));
    }
    for ((block, via), on) in &outages {
        let on: Vec<String> = on
            .iter()
            .map(|(node, d)| format!("{node} {d:.1} s"))
            .collect();
        out.push(format!(
            "route outage of {block} (routed to {}): {}",
            named(via),
            on.join(", ")
        ));
    }
    let mut verdicts: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for fact in facts {
        if let Fact::Verdict {
            node,
            peer,
            verdict,
        } = fact
        {
            verdicts.entry(node).or_default().push(format!(
                "{} {}",
                named(peer),
                verdict.replace('_', " ")
            ));
        }
    }
    for (node, said) in verdicts {
        out.push(format!("{node}'s verdicts: {}", said.join(", ")));
    }
    let mut wire: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for fact in facts {
        if let Fact::Wire {
            node,
            peer,
            open,
            notification,
            rst,
            last_notification,
        } = fact
        {
            let name = last_notification
                .as_deref()
                .map(|n| format!(" (latest {n})"))
                .unwrap_or_default();
            wire.entry(peer).or_default().push(format!(
                "{node} {notification} NOTIFICATION{name}, {rst} RST, {open} OPEN"
            ));
        }
    }
    for (peer, on) in wire {
        out.push(format!(
            "BGP at the wire from {}: {}",
            named(peer),
            on.join("; ")
        ));
    }
    for fact in facts {
        if let Fact::Ping(p) = fact {
            out.push(format!(
                "ping {} {} -> {} {}: {} of {} answered, {} lost",
                p.from,
                p.src,
                p.to,
                p.dst,
                p.received,
                p.transmitted,
                p.transmitted.saturating_sub(p.received)
            ));
        }
    }
    out
}

/// `n4 10.99.0.4` for a mesh node's address, else the address.
fn named(addr: &str) -> String {
    let node = addr
        .parse::<IpAddr>()
        .ok()
        .and_then(|a| MESH.iter().find(|m| IpAddr::V4(m.addr) == a));
    match node {
        Some(m) => format!("{} {addr}", m.name),
        None => addr.to_string(),
    }
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn anomaly(state: &str, kind: &str, peer: &str, duration: Option<f64>) -> Value {
        let evidence = match kind {
            "route_missing" => json!({"blocks":["10.65.4.0/26"]}),
            _ => json!({}),
        };
        json!({"type":"anomaly","state":state,"kind":kind,"peer":peer,
               "evidence":evidence,"duration_s":duration})
    }

    #[test]
    fn raised_and_cleared_lines_make_one_fact_each_and_findings_per_peer() {
        let n1 = vec![
            anomaly("raised", "bgp_down", "10.99.0.4", None),
            anomaly("raised", "route_missing", "10.99.0.4", None),
            json!({"type":"route_outage","block":"10.65.4.0/26","node":"10.99.0.4","duration_s":12.34}),
            json!({"type":"bgp_wire","direction":"rx","peer":"10.99.0.4","open":1,"notification":0,"rst":0}),
            json!({"type":"bgp_wire","direction":"rx","peer":"10.99.0.2","open":1,"notification":0,"rst":0}),
            json!({"type":"bgp_wire","direction":"tx","peer":"10.99.0.4","open":2,"notification":1,"rst":0}),
            json!({"type":"bgp_wire","direction":"rx","peer":"10.99.0.4","open":2,"notification":1,"rst":3,
                   "last_notification":{"code":6,"subcode":2,"name":"Cease/Administrative Shutdown"}}),
            anomaly("cleared", "route_missing", "10.99.0.4", Some(12.3)),
            anomaly("cleared", "bgp_down", "10.99.0.4", Some(13.0)),
        ];
        let n2 = vec![
            anomaly("raised", "bgp_down", "10.99.0.4", None),
            json!({"type":"diagnosis","pairs":[
                {"peer":"10.99.0.1","verdict":"healthy"},
                {"peer":"10.99.0.4","verdict":"route_loss"}]}),
        ];
        let pings = [PingCount {
            from: "n1",
            to: "n4",
            src: Ipv4Addr::new(10, 65, 1, 1),
            dst: Ipv4Addr::new(10, 65, 4, 1),
            transmitted: 200,
            received: 80,
        }];
        let facts = facts(&[n1.clone(), n2, vec![], vec![]], &pings);
        assert_eq!(anomalies(&n1).len(), 2);
        assert!(has(
            &n1,
            "route_missing",
            Ipv4Addr::new(10, 99, 0, 4),
            "cleared"
        ));
        assert!(!has(
            &n1,
            "route_missing",
            Ipv4Addr::new(10, 99, 0, 3),
            "cleared"
        ));
        let json = serde_json::to_value(&facts[1]).unwrap();
        assert_eq!(
            json,
            json!({"fact":"anomaly","node":"n1","kind":"route_missing","peer":"10.99.0.4",
                   "blocks":["10.65.4.0/26"],"cleared":true,"duration_s":12.3})
        );
        assert_eq!(
            findings(&facts),
            vec![
                "bgp_down for n4 10.99.0.4: raised on n1 cleared after 13.0 s, n2 still active at the end",
                "route_missing for n4 10.99.0.4 (block 10.65.4.0/26): raised on n1 cleared after 12.3 s",
                "route outage of 10.65.4.0/26 (routed to n4 10.99.0.4): n1 12.3 s",
                "n2's verdicts: n1 10.99.0.1 healthy, n4 10.99.0.4 route loss",
                "BGP at the wire from n4 10.99.0.4: n1 1 NOTIFICATION (latest Cease/Administrative Shutdown), 3 RST, 2 OPEN",
                "ping n1 10.65.1.1 -> n4 10.65.4.1: 80 of 200 answered, 120 lost",
            ]
        );
    }
}
