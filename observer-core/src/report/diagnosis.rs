//! What `observer diagnose` prints at the end: the write-up for people
//! (what was measured, what the data plane expects, the verdict per node
//! pair, route outages, the probes, the findings with what they mean and
//! what to check next) and the `diagnosis` JSON line that carries it.

use std::{
    fmt::Write as _,
    io::{self, Write},
    net::IpAddr,
    time::SystemTime,
};

use crate::{
    model::{
        anomalies::{self, Known},
        diagnosis::Outcome,
        verdicts,
    },
    report::{
        Format, Line,
        lines::{DiagnosisLine, Measured, ProbeVerdict},
        probe,
        view::timestamp,
        write_line,
    },
};

/// Writes the diagnosis of `outcome` in `format`: the write-up, or (JSON)
/// the probes' lines when they ran, then the `diagnosis` line stamped `at`.
pub fn write(
    out: &mut impl Write,
    format: Format,
    outcome: &Outcome,
    netns: Option<&str>,
    at: SystemTime,
) -> io::Result<()> {
    let text = write_up(outcome, netns);
    match format {
        Format::Table => write!(out, "{text}"),
        Format::Json => {
            if let Some(Ok(run)) = &outcome.probe {
                probe::write_json(out, run)?;
            }
            write_line(out, &Line::Diagnosis(line(outcome, netns, at, &text)))
        }
    }
}

/// The `diagnosis` JSON line, with the write-up `text` in it.
fn line<'a>(
    outcome: &'a Outcome,
    netns: Option<&'a str>,
    at: SystemTime,
    text: &'a str,
) -> DiagnosisLine<'a> {
    DiagnosisLine {
        ts: timestamp(at),
        netns,
        interfaces: &outcome.interfaces,
        duration_s: (outcome.seconds * 10.0).round() / 10.0,
        healthy: outcome.healthy(),
        findings: outcome.findings.list(),
        findings_not_kept: outcome.findings.overflow,
        measured: measured(outcome),
        pairs: outcome.verdicts(),
        route_outages: &outcome.route_outages,
        netfilter: &outcome.netfilter,
        probe: outcome.probe.as_ref().map(|p| match p {
            Ok(run) => ProbeVerdict {
                healthy: run.healthy(),
                conclusion: probe::conclusion(run),
            },
            Err(e) => ProbeVerdict {
                healthy: false,
                conclusion: format!("the probes could not run: {e}"),
            },
        }),
        text,
    }
}

/// Packets per (peer, encapsulation) over the whole run, with the loss and
/// what the peer is to this node.
fn measured(outcome: &Outcome) -> Vec<Measured> {
    let by_peer = anomalies::peer_totals(&outcome.rows, &outcome.drops, &outcome.known.local);
    by_peer
        .into_iter()
        .map(|((peer, proto), (sent, received, dropped))| Measured {
            peer,
            proto: proto.name(),
            sent,
            received,
            dropped,
            loss: verdicts::loss(sent, received, dropped),
            role: role(&outcome.known, peer),
        })
        .collect()
}

fn role(known: &Known, peer: IpAddr) -> &'static str {
    if known.nodes.contains_key(&peer) {
        "node"
    } else if known.nodes.is_empty() {
        "unknown"
    } else {
        "not a node"
    }
}

/// The write-up for people, one section after the other.
pub fn write_up(outcome: &Outcome, netns: Option<&str>) -> String {
    let mut t = String::new();
    let place = netns.map_or(String::new(), |n| format!(" in netns {n}"));
    let _ = writeln!(
        t,
        "\nobserver diagnose{place}: {} for {:.0} s",
        outcome.interfaces.join(", "),
        outcome.seconds
    );
    measured_section(&mut t, outcome);
    data_plane_section(&mut t, outcome);
    pairs_section(&mut t, outcome);
    route_outages_section(&mut t, outcome);
    probes_section(&mut t, outcome);
    findings_section(&mut t, outcome);
    t
}

/// Sent, received and dropped per peer, with the loss.
fn measured_section(t: &mut String, outcome: &Outcome) {
    let _ = writeln!(
        t,
        "\nWhat was measured (tunnel packets at the wire, whole run):"
    );
    let rows = measured(outcome);
    if rows.is_empty() {
        let _ = writeln!(t, "  no tunnel packets in either direction");
        return;
    }
    let _ = writeln!(
        t,
        "  {:<40} {:<8} {:>10} {:>10} {:>10} {:>9}  ROLE",
        "PEER", "PROTO", "SENT", "RECEIVED", "DROPPED", "LOSS"
    );
    for m in &rows {
        let loss = m
            .loss
            .map_or_else(|| "-".to_string(), |l| format!("{:.3} %", l * 100.0));
        let _ = writeln!(
            t,
            "  {:<40} {:<8} {:>10} {:>10} {:>10} {:>9}  {}",
            m.peer.to_string(),
            m.proto,
            m.sent,
            m.received,
            m.dropped,
            loss,
            m.role
        );
    }
    let _ = writeln!(
        t,
        "  (LOSS: the share of what came in that was dropped here, where packets went both ways; the rollout target is below 0.050 %)"
    );
}

/// The nodes the routes and FDB name, and the netfilter cross-check.
fn data_plane_section(t: &mut String, outcome: &Outcome) {
    let nodes = &outcome.known.nodes;
    if !nodes.is_empty() {
        let _ = writeln!(t, "\nWhat the data plane expects (routes, FDB):");
        for (node, n) in nodes {
            let blocks: Vec<String> = n.blocks.iter().map(|b| b.to_string()).collect();
            let encaps: Vec<&str> = n.encaps.iter().map(|e| e.name()).collect();
            let _ = writeln!(
                t,
                "  node {node}: pod blocks {} via {} ({})",
                blocks.join(", "),
                n.devices.join(", "),
                encaps.join("/")
            );
        }
    }
    for c in &outcome.netfilter {
        let _ = writeln!(
            t,
            "  {} rule \"{}\": {} packets; observer counted {}{}",
            c.backend,
            c.rule,
            c.packets,
            c.observer_packets,
            if c.agree { " (agree)" } else { " (DISAGREE)" }
        );
    }
}

/// One verdict per node pair.
fn pairs_section(t: &mut String, outcome: &Outcome) {
    let pairs = outcome.verdicts();
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(
        t,
        "\nPer node pair (route loss, policy drop, MTU or healthy):"
    );
    for pair in &pairs {
        let how = match (pair.active, pair.longest_s) {
            (true, _) => " (still at the end)".to_string(),
            (false, Some(s)) => format!(" (cleared; the longest lasted {s} s)"),
            (false, None) => String::new(),
        };
        let kinds = if pair.kinds.is_empty() {
            String::new()
        } else {
            format!(": {}{how}", pair.kinds.join(", "))
        };
        let _ = writeln!(
            t,
            "  {:<40} {}{kinds}",
            pair.peer.to_string(),
            pair.verdict.words()
        );
    }
}

/// Pod blocks that lost their route during the run.
fn route_outages_section(t: &mut String, outcome: &Outcome) {
    if outcome.route_outages.is_empty() {
        return;
    }
    let _ = writeln!(
        t,
        "\nRoute outages (pod blocks that lost their route, and for how long):"
    );
    for o in &outcome.route_outages {
        let _ = writeln!(t, "  {} of node {}: {:.1} s", o.block, o.node, o.duration_s);
    }
    if outcome.route_outages_not_kept > 0 {
        let _ = writeln!(t, "  ({} more not kept)", outcome.route_outages_not_kept);
    }
}

/// `--probe`: the probes' table, indented, or why they could not run.
fn probes_section(t: &mut String, outcome: &Outcome) {
    match &outcome.probe {
        Some(Ok(run)) => {
            let _ = writeln!(
                t,
                "\nProbes (observer probe: encapsulated echo requests to every peer node, answered by its kernel):"
            );
            let mut table = Vec::new();
            let _ = probe::write_table(&mut table, run);
            for line in String::from_utf8_lossy(&table).lines() {
                let _ = writeln!(t, "  {line}");
            }
        }
        Some(Err(e)) => {
            let _ = writeln!(t, "\nProbes: could not run: {e}");
        }
        None => {}
    }
}

/// The findings, each with what it means and what to check next, and the
/// conclusion with its exit status.
fn findings_section(t: &mut String, outcome: &Outcome) {
    let findings = outcome.findings.list();
    if findings.is_empty() {
        let _ = if outcome.probe_healthy() {
            writeln!(
                t,
                "\nHealthy: no anomaly in {:.0} s. Exit status 0.",
                outcome.seconds
            )
        } else {
            writeln!(
                t,
                "\nNo anomaly in {:.0} s, but the probes found what is above. Exit status 1.",
                outcome.seconds
            )
        };
        return;
    }
    let _ = writeln!(t, "\nFindings ({}):", findings.len());
    for (i, f) in findings.iter().enumerate() {
        let a = &f.anomaly;
        let state = match f.duration_s {
            _ if f.active => "still active at the end".to_string(),
            Some(d) => format!("lasted {d} s, then cleared"),
            None => "cleared".to_string(),
        };
        let _ = writeln!(t, "  {}. [{}] {}", i + 1, a.kind.name(), a.summary);
        let _ = writeln!(t, "     means: {}", f.meaning);
        let _ = writeln!(t, "     next:  {}", a.hint);
        let _ = writeln!(
            t,
            "     since {}, {state}",
            humantime::format_rfc3339_seconds(a.since)
        );
    }
    if outcome.findings.overflow > 0 {
        let _ = writeln!(
            t,
            "  ({} more findings not kept)",
            outcome.findings.overflow
        );
    }
    let _ = writeln!(t, "\nProblem found. Exit status 1.");
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeMap,
        net::Ipv4Addr,
        time::{Duration, SystemTime},
    };

    use observer_common::Proto;

    use super::*;
    use crate::model::anomalies::{Anomaly, Event, Kind};

    fn outcome() -> Outcome {
        Outcome {
            interfaces: vec!["eth0".to_string()],
            seconds: 10.04,
            ..Outcome::default()
        }
    }

    fn json(outcome: &Outcome) -> serde_json::Value {
        let mut out = Vec::new();
        write(
            &mut out,
            Format::Json,
            outcome,
            Some("node-a"),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1),
        )
        .unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn a_quiet_run_is_healthy_with_exit_status_0() {
        let outcome = outcome();
        assert_eq!(
            write_up(&outcome, None),
            "\nobserver diagnose: eth0 for 10 s\n\
             \nWhat was measured (tunnel packets at the wire, whole run):\n  \
             no tunnel packets in either direction\n\
             \nHealthy: no anomaly in 10 s. Exit status 0.\n"
        );
        let line = json(&outcome);
        assert_eq!(line["type"], "diagnosis");
        assert_eq!(line["healthy"], true);
        assert_eq!(line["netns"], "node-a");
        assert_eq!(line["duration_s"], 10.0);
        assert_eq!(line["text"], write_up(&outcome, Some("node-a")));
    }

    #[test]
    fn a_finding_says_what_it_means_and_what_to_check_next() {
        let mut outcome = outcome();
        outcome.findings.record(&[Event::Raised(Anomaly {
            kind: Kind::AllowSetDrop,
            peer: Ipv4Addr::new(10, 10, 10, 244).into(),
            proto: Proto::Vxlan,
            since: SystemTime::UNIX_EPOCH,
            evidence: BTreeMap::new(),
            summary: "178 VXLAN packets from 10.10.10.244 dropped".to_string(),
            hint: "ipset list cali40all-vxlan-net".to_string(),
        })]);
        let text = write_up(&outcome, Some("node-a"));
        let findings = text.split("\nFindings (1):\n").nth(1).expect(&text);
        assert_eq!(
            findings,
            format!(
                "  1. [allow_set_drop] 178 VXLAN packets from 10.10.10.244 dropped\n     \
                 means: {}\n     \
                 next:  ipset list cali40all-vxlan-net\n     \
                 since 1970-01-01T00:00:00Z, still active at the end\n\
                 \nProblem found. Exit status 1.\n",
                Kind::AllowSetDrop.meaning()
            )
        );
        assert!(text.starts_with("\nobserver diagnose in netns node-a: eth0 for 10 s\n"));
        let line = json(&outcome);
        assert_eq!(line["healthy"], false);
        assert_eq!(line["findings"].as_array().unwrap().len(), 1);
        assert_eq!(line["pairs"][0]["peer"], "10.10.10.244");
    }
}
