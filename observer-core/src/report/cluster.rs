//! What `observer cluster` prints: the node pairs worst first, as a table
//! with the next steps below it, or as JSON lines (`pair` per pair and
//! encapsulation, then `cluster_summary`).

use std::{
    collections::BTreeMap,
    io::{self, Write},
};

use serde::Serialize;

use crate::{
    model::{
        cluster::{Cluster, Foreign, Pair, join},
        verdicts::Verdict,
    },
    report::{Line, write_line},
};

/// The window the pairs were counted over.
#[derive(Debug, Clone)]
pub struct Span<'a> {
    /// The store's URL.
    pub store: &'a str,
    /// End of the window (RFC 3339).
    pub at: &'a str,
    /// Its length, as given (`5m`).
    pub window: &'a str,
}

/// The last JSON line.
#[derive(Serialize)]
pub struct SummaryLine<'a> {
    store: &'a str,
    at: &'a str,
    window: &'a str,
    nodes: usize,
    pairs: usize,
    problems: usize,
    verdicts: BTreeMap<Verdict, usize>,
    /// Tunnel packets received from addresses that are no node.
    foreign_sources: &'a [Foreign],
    /// Tunnel packets sent to addresses that are no node.
    unknown_receivers: &'a [Foreign],
    healthy: bool,
}

/// Writes the pairs and the summary as JSON lines.
pub fn write_json(out: &mut impl Write, span: &Span<'_>, cluster: &Cluster) -> io::Result<()> {
    for pair in &cluster.pairs {
        write_line(out, &Line::Pair(pair))?;
    }
    write_line(
        out,
        &Line::ClusterSummary(SummaryLine {
            store: span.store,
            at: span.at,
            window: span.window,
            nodes: cluster.nodes,
            pairs: cluster.pairs.len(),
            problems: problems(cluster),
            verdicts: cluster.verdict_counts(),
            foreign_sources: &cluster.foreign,
            unknown_receivers: &cluster.unknown_receivers,
            healthy: cluster.healthy(),
        }),
    )
}

fn problems(cluster: &Cluster) -> usize {
    cluster
        .pairs
        .iter()
        .filter(|p| p.verdict != Verdict::Healthy)
        .count()
}

/// Healthy pairs the table shows at most (a full mesh of 1,000 nodes has a
/// million); every pair with a problem is shown.
const TABLE_HEALTHY_ROWS: usize = 50;

/// Writes the pairs as a table, worst first (every pair with a problem,
/// then at most [`TABLE_HEALTHY_ROWS`] healthy ones), then the next step
/// of each pair with a problem and what fits no pair.
pub fn write_table(out: &mut impl Write, span: &Span<'_>, cluster: &Cluster) -> io::Result<()> {
    writeln!(
        out,
        "{} nodes, {} node pairs with tunnel traffic in the {} up to {} ({}): {}",
        cluster.nodes,
        cluster.pairs.len(),
        span.window,
        span.at,
        span.store,
        match problems(cluster) {
            0 => "all healthy".to_string(),
            1 => "1 with a problem".to_string(),
            n => format!("{n} with problems"),
        }
    )?;
    if cluster.pairs.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    let width = |f: &dyn Fn(&Pair) -> usize, min: usize| {
        cluster.pairs.iter().map(f).max().unwrap_or(0).max(min)
    };
    let w_from = width(&|p| p.from.len(), 4);
    let w_to = width(&|p| p.to.len(), 2);
    writeln!(
        out,
        "{:<w_from$}  {:<w_to$}  {:<9} {:>10} {:>10} {:>7}  {:<11}  DROPS AT RECEIVER / ANOMALIES",
        "FROM", "TO", "PROTO", "SENT", "RECEIVED", "LOSS", "VERDICT"
    )?;
    let mut healthy_rows = 0;
    let shown = cluster.pairs.iter().filter(|p| {
        healthy_rows += usize::from(p.verdict == Verdict::Healthy);
        p.verdict != Verdict::Healthy || healthy_rows <= TABLE_HEALTHY_ROWS
    });
    for p in shown {
        let mut notes: Vec<String> = p.drops.iter().map(|(r, n)| format!("{r} {n}")).collect();
        if !p.arrived_from.is_empty() {
            notes.insert(0, format!("arrives from {}", join(&p.arrived_from)));
        }
        notes.extend(
            p.anomalies
                .iter()
                .map(|a| format!("{}: {}", a.node, a.kind)),
        );
        let row = format!(
            "{:<w_from$}  {:<w_to$}  {:<9} {:>10} {:>10} {:>7}  {:<11}  {}",
            p.from,
            p.to,
            p.proto,
            p.sent,
            p.received,
            p.loss.map_or("-".to_string(), percent),
            p.verdict.words(),
            notes.join(", ")
        );
        writeln!(out, "{}", row.trim_end())?;
    }
    let hidden = healthy_rows.saturating_sub(TABLE_HEALTHY_ROWS);
    if hidden > 0 {
        writeln!(
            out,
            "... and {hidden} more healthy pairs (--output json lists every pair)"
        )?;
    }
    let steps: Vec<&Pair> = cluster
        .pairs
        .iter()
        .filter(|p| p.verdict != Verdict::Healthy)
        .collect();
    if !steps.is_empty() {
        writeln!(out, "\nNext steps:")?;
        for p in steps {
            writeln!(
                out,
                "  {} -> {} {} ({}): {}",
                p.from,
                p.to,
                p.proto,
                p.verdict.words(),
                p.next_step
            )?;
        }
    }
    for f in &cluster.foreign {
        writeln!(
            out,
            "\n{} received {} {} packets from {}, which is no node and no node's packets a router rewrote",
            f.node, f.received, f.proto, f.peer
        )?;
    }
    for f in &cluster.unknown_receivers {
        writeln!(
            out,
            "\n{} sent {} {} packets to {}, which exports no observer series (no observer there, or its series are missing)",
            f.node, f.received, f.proto, f.peer
        )?;
    }
    Ok(())
}

/// A share as a percentage with enough digits for the 0.05 % target.
fn percent(share: f64) -> String {
    match share {
        0.0 => "0%".to_string(),
        s if s >= 0.1 => format!("{:.0}%", s * 100.0),
        s => format!("{:.2}%", s * 100.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(from: usize, to: usize, verdict: Verdict) -> Pair {
        Pair {
            from: format!("n{from}"),
            to: format!("n{to}"),
            from_address: [10, 0, 0, from as u8].into(),
            to_address: [10, 0, 0, to as u8].into(),
            proto: "vxlan".to_string(),
            sent: 10,
            received: if verdict == Verdict::Healthy { 10 } else { 0 },
            arrived_from: Vec::new(),
            dropped: 0,
            dropped_after_decap: 0,
            drops: BTreeMap::new(),
            loss: Some(if verdict == Verdict::Healthy {
                0.0
            } else {
                1.0
            }),
            anomalies: Vec::new(),
            verdict,
            next_step: String::new(),
        }
    }

    #[test]
    fn the_table_shows_every_problem_and_at_most_fifty_healthy_pairs() {
        let mut pairs = vec![pair(1, 2, Verdict::OneWay)];
        pairs.extend((3..63).map(|to| pair(1, to, Verdict::Healthy)));
        let cluster = Cluster {
            nodes: 62,
            pairs,
            ..Cluster::default()
        };
        let span = Span {
            store: "http://prometheus:9090",
            at: "2026-12-06T15:00:00Z",
            window: "5m",
        };
        let mut out = Vec::new();
        write_table(&mut out, &span, &cluster).unwrap();
        let text = String::from_utf8(out).unwrap();
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("n1 ")).collect();
        assert_eq!(rows.len(), 1 + TABLE_HEALTHY_ROWS, "{text}");
        assert!(rows[0].contains("one-way"), "{text}");
        assert!(
            text.contains("... and 10 more healthy pairs (--output json lists every pair)"),
            "{text}"
        );
        assert!(
            text.starts_with("62 nodes, 61 node pairs with tunnel traffic"),
            "{text}"
        );

        let mut json = Vec::new();
        write_json(&mut json, &span, &cluster).unwrap();
        let pair_lines = String::from_utf8(json)
            .unwrap()
            .lines()
            .filter(|l| l.contains(r#""type":"pair""#))
            .count();
        assert_eq!(pair_lines, 61);
    }
}
