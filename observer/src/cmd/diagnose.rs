//! `observer diagnose`: a bounded attach whose anomalies become a short
//! incident write-up (what was measured, what it means, what to check
//! next) and an exit status scripts can use.

use std::{
    fmt::Write as _,
    io::{self, Write},
    net::IpAddr,
    time::SystemTime,
};

use anyhow::{Result, bail};

use crate::{
    cli::DiagnoseArgs,
    cmd::attach::{self, Mode, Outcome},
    model::anomalies::{self, Known},
    model::dataplane::DeclaredTunnel,
    node::dataplane,
    node::netns,
    report::{
        self, Format, Line,
        lines::{DiagnosisLine, Measured},
    },
};

/// Runs the diagnosis; `Ok(true)` when nothing was found.
pub fn run(args: DiagnoseArgs) -> Result<bool> {
    let mut args = args.attach;
    if let Some(name) = &args.netns {
        netns::enter(name)?;
    }
    if args.ifaces.is_empty() && args.config.is_none() {
        args.ifaces = tunnel_interfaces(&args.tunnel_devices)?;
        tracing::info!(interfaces = %args.ifaces.join(", "), "watching the interfaces that carry tunnel traffic");
    }
    let outcome = attach::monitor(&args, Mode::Diagnose)?;
    let healthy = outcome.findings.is_empty();
    let text = write_up(&outcome, args.netns.as_deref());
    let mut out = io::stdout().lock();
    let written = match outcome.format {
        Some(Format::Json) => {
            let line = DiagnosisLine {
                ts: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
                netns: args.netns.as_deref(),
                interfaces: &outcome.interfaces,
                duration_s: (outcome.seconds * 10.0).round() / 10.0,
                healthy,
                findings: outcome.findings.list(),
                findings_not_kept: outcome.findings.overflow,
                measured: measured(&outcome),
                netfilter: &outcome.netfilter,
                text: &text,
            };
            report::write_line(&mut out, &Line::Diagnosis(line))
        }
        _ => write!(out, "{text}"),
    };
    match written {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    Ok(healthy)
}

/// The interfaces that carry tunnel traffic here.
fn tunnel_interfaces(declared: &[DeclaredTunnel]) -> Result<Vec<String>> {
    let view = dataplane::read_declaring(declared)?;
    let names: Vec<String> = view.underlay.iter().map(|u| u.name.clone()).collect();
    if names.is_empty() {
        bail!(
            "no interface carries tunnel traffic here (no vxlan, ipip, geneve or wireguard device with routes to other nodes): name the underlay interface, e.g. `observer diagnose eth0`"
        );
    }
    Ok(names)
}

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

/// The human write-up.
pub fn write_up(outcome: &Outcome, netns: Option<&str>) -> String {
    let mut t = String::new();
    let place = netns.map_or(String::new(), |n| format!(" in netns {n}"));
    let _ = writeln!(
        t,
        "\nobserver diagnose{place}: {} for {:.0} s",
        outcome.interfaces.join(", "),
        outcome.seconds
    );
    let _ = writeln!(
        t,
        "\nWhat was measured (tunnel packets at the wire, whole run):"
    );
    let rows = measured(outcome);
    if rows.is_empty() {
        let _ = writeln!(t, "  no tunnel packets in either direction");
    } else {
        let _ = writeln!(
            t,
            "  {:<40} {:<8} {:>10} {:>10} {:>10}  ROLE",
            "PEER", "PROTO", "SENT", "RECEIVED", "DROPPED"
        );
        for m in &rows {
            let _ = writeln!(
                t,
                "  {:<40} {:<8} {:>10} {:>10} {:>10}  {}",
                m.peer.to_string(),
                m.proto,
                m.sent,
                m.received,
                m.dropped,
                m.role
            );
        }
    }
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
    let findings = outcome.findings.list();
    if findings.is_empty() {
        let _ = writeln!(
            t,
            "\nHealthy: no anomaly in {:.0} s. Exit status 0.",
            outcome.seconds
        );
        return t;
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
    t
}
