//! A simulated cluster's series, for the scale test and bench of
//! `observer cluster` and the node-pair rules (feature `testing`): every
//! node of a full VXLAN mesh sends and receives the same count to and from
//! every other, except that one pair's packets never arrive; each node's
//! series are what its own [`Exporter`] writes from such rows, in
//! OpenMetrics with two timestamps (a first sample at 0, then the count),
//! which `promtool tsdb create-blocks-from openmetrics` loads into a
//! Prometheus data directory.

use std::{
    collections::BTreeSet,
    fmt::Write,
    net::{IpAddr, Ipv4Addr},
};

use observer_common::{Direction, Proto, Unclassified};
use prometheus::proto::{MetricFamily, MetricType};

use crate::{
    model::{
        cluster::NodeIdentity,
        rows::{FlowId, Row, testing::row},
    },
    report::textfile::{ExportInput, Exporter},
};

/// Packets every node sends to each peer (and receives from it).
pub const PACKETS: u64 = 1_000;

/// The families `observer cluster` reads.
const FAMILIES: [&str; 2] = ["observer_node_info", "observer_encap_packets_total"];

/// Node `i`'s name.
pub fn name(i: usize) -> String {
    format!("n{i:04}")
}

/// Node `i`'s underlay address.
pub fn address(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 100, (i / 250) as u8, (i % 250 + 1) as u8))
}

/// The mesh of `nodes` nodes in which `broken` (from, to)'s VXLAN never
/// arrives.
pub struct Mesh {
    /// Nodes.
    pub nodes: usize,
    /// The one pair that loses everything.
    pub broken: (usize, usize),
}

impl Mesh {
    fn families(&self, i: usize) -> Vec<MetricFamily> {
        let flow = |direction, j| FlowId {
            ifindex: 2,
            direction,
            proto: Proto::Vxlan,
            reason: Unclassified::None,
            peer: Some(address(j)),
            vni: 4096,
        };
        let rows: Vec<Row> = (0..self.nodes)
            .filter(|&j| j != i)
            .flat_map(|j| {
                let arrives = (j, i) != self.broken;
                [
                    Some(row(flow(Direction::Tx, j), PACKETS)),
                    arrives.then(|| row(flow(Direction::Rx, j), PACKETS)),
                ]
            })
            .flatten()
            .collect();
        let node = NodeIdentity {
            name: name(i),
            addresses: BTreeSet::from([address(i)]),
        };
        Exporter::new(self.nodes).families(&ExportInput {
            rows: &rows,
            node: &node,
            ..Default::default()
        })
    }

    /// The series one node exports (every family of its textfile).
    pub fn series_per_node(&self) -> usize {
        self.families(0)
            .iter()
            .map(|f| match f.get_field_type() {
                // Buckets, +Inf, sum and count.
                MetricType::HISTOGRAM => f
                    .get_metric()
                    .iter()
                    .map(|m| m.get_histogram().get_bucket().len() + 3)
                    .sum(),
                _ => f.get_metric().len(),
            })
            .sum()
    }

    /// The mesh's node_info and packet series in OpenMetrics: a sample at
    /// `start` (counters 0) and one at `end` (Unix seconds) for each.
    pub fn openmetrics(&self, start: i64, end: i64) -> String {
        let per_node: Vec<Vec<MetricFamily>> = (0..self.nodes).map(|i| self.families(i)).collect();
        let mut out = String::new();
        for family in FAMILIES {
            let counter = family.ends_with("_total");
            let base = family.strip_suffix("_total").unwrap_or(family);
            let kind = if counter { "counter" } else { "gauge" };
            writeln!(out, "# TYPE {base} {kind}").unwrap();
            for families in &per_node {
                let Some(f) = families.iter().find(|f| f.name() == family) else {
                    continue;
                };
                for metric in f.get_metric() {
                    let labels: Vec<String> = metric
                        .get_label()
                        .iter()
                        .map(|l| format!("{}=\"{}\"", l.name(), l.value()))
                        .collect();
                    let value = if counter {
                        metric.get_counter().get_value()
                    } else {
                        metric.get_gauge().get_value()
                    };
                    let first = if counter { 0.0 } else { value };
                    let labels = labels.join(",");
                    writeln!(out, "{family}{{{labels}}} {first} {start}").unwrap();
                    writeln!(out, "{family}{{{labels}}} {value} {end}").unwrap();
                }
            }
        }
        out.push_str("# EOF\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_exports_its_peers_and_the_broken_pair_is_missing_once() {
        let mesh = Mesh {
            nodes: 3,
            broken: (0, 1),
        };
        let text = mesh.openmetrics(100, 400);
        let rx_from_n0_at_n1 = r#"observer_encap_packets_total{node="n0001",iface="if2",direction="rx",proto="vxlan",peer="10.100.0.1"}"#;
        assert!(!text.contains(rx_from_n0_at_n1), "{text}");
        let tx_n0_to_n1 = r#"observer_encap_packets_total{node="n0000",iface="if2",direction="tx",proto="vxlan",peer="10.100.0.2"} 1000 400"#;
        assert!(text.contains(tx_n0_to_n1), "{text}");
        // 3 nodes x 2 peers x 2 directions, less one, twice; 3 infos twice.
        let samples = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(samples, (3 * 2 * 2 - 1) * 2 + 3 * 2);
        assert!(text.starts_with("# TYPE observer_node_info gauge\n"));
        assert!(text.ends_with("# EOF\n"));
    }
}
