//! `observer diagnose`: a bounded attach whose anomalies become a short
//! incident write-up (what was measured, what it means, what to check
//! next) and an exit status scripts can use.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{self, IsTerminal, Write},
    net::IpAddr,
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result, bail};
use observer_common::Proto;

use crate::{
    cli::{AttachArgs, DiagnoseArgs},
    model::anomalies::{self, Anomaly, Event, FindingRecord, Kind, Known},
    model::crosscheck::NetfilterCheck,
    model::dataplane::DeclaredTunnel,
    model::probe::Run,
    model::routes::Outage,
    model::rows::DropRow,
    model::rows::Row,
    model::verdicts::{self, PairVerdict},
    monitor::{Monitor, Options},
    node::dataplane,
    node::netns,
    report::{
        self, Format, Line,
        lines::{self, DiagnosisLine, Measured, ProbeVerdict},
    },
};

/// Default `--duration`.
pub const DURATION: Duration = Duration::from_secs(10);

/// Findings kept for one write-up; beyond it they are only counted.
pub const MAX_FINDINGS: usize = 256;

/// Every anomaly seen during a bounded run (`observer diagnose`), with its
/// latest evidence, whether it still holds, and how long it lasted.
#[derive(Debug, Default)]
pub struct Findings {
    entries: BTreeMap<(Kind, IpAddr, Proto), FindingRecord>,
    /// Findings not kept because [`MAX_FINDINGS`] were already.
    pub overflow: u64,
}

impl Findings {
    /// Folds in one read's events.
    pub fn record(&mut self, events: &[Event]) {
        for event in events {
            let (anomaly, active, duration) = match event {
                Event::Raised(a) => (a, true, None),
                Event::Cleared { anomaly, duration } => (anomaly, false, Some(*duration)),
            };
            let key = (anomaly.kind, anomaly.peer, anomaly.proto);
            if !self.entries.contains_key(&key) && self.entries.len() >= MAX_FINDINGS {
                self.overflow += 1;
                continue;
            }
            let entry = self.entries.entry(key).or_insert_with(|| FindingRecord {
                anomaly: anomaly.clone(),
                active,
                duration_s: None,
                meaning: anomaly.kind.meaning(),
            });
            entry.active = active;
            entry.duration_s = duration.map(|d| (d.as_secs_f64() * 10.0).round() / 10.0);
            if !active {
                entry.anomaly.evidence = anomaly.evidence.clone();
                entry.anomaly.summary = anomaly.summary.clone();
            }
        }
    }

    /// Refreshes the evidence of the anomalies active now.
    pub fn still_active(&mut self, active: &[&Anomaly]) {
        for a in active {
            if let Some(entry) = self.entries.get_mut(&(a.kind, a.peer, a.proto)) {
                entry.anomaly.evidence = a.evidence.clone();
                entry.anomaly.summary = a.summary.clone();
                entry.anomaly.hint = a.hint.clone();
            }
        }
    }

    /// Findings in kind order (most decisive first), then peer.
    pub fn list(&self) -> Vec<&FindingRecord> {
        let mut list: Vec<&FindingRecord> = self.entries.values().collect();
        list.sort_by_key(|f| (f.anomaly.kind, f.anomaly.peer));
        list
    }

    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.overflow == 0
    }
}

/// What a finished run leaves for the diagnosis.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every anomaly seen during the run.
    pub findings: Findings,
    /// Rows of the last read.
    pub rows: Vec<Row>,
    /// Drop rows of the last read.
    pub drops: Vec<DropRow>,
    /// Netfilter cross-check of the last read.
    pub netfilter: Vec<NetfilterCheck>,
    /// What the node knew at the end.
    pub known: Known,
    /// Interfaces watched.
    pub interfaces: Vec<String>,
    /// How long it ran.
    pub seconds: f64,
    /// Route outages of pod blocks that ended during the run (at most
    /// [`MAX_FINDINGS`]).
    pub route_outages: Vec<Outage>,
    /// Route outages not kept.
    pub route_outages_not_kept: u64,
    /// `--probe`: the probe run, or why it could not run.
    pub probe: Option<Result<Run, String>>,
}

impl Outcome {
    /// Whether nothing was found: no anomaly, and the probes (when run)
    /// found nothing either.
    pub fn healthy(&self) -> bool {
        self.findings.is_empty() && self.probe_healthy()
    }

    fn probe_healthy(&self) -> bool {
        self.probe
            .as_ref()
            .is_none_or(|p| p.as_ref().is_ok_and(report::probe::healthy))
    }

    /// One verdict per node pair: every node the data plane or BIRD
    /// names, and every peer a finding is about.
    pub fn verdicts(&self) -> Vec<PairVerdict> {
        let peers = self
            .known
            .nodes
            .keys()
            .copied()
            .chain(self.known.bgp.iter().filter_map(|s| s.neighbor));
        verdicts::verdicts(&self.findings.list(), peers)
    }
}

/// Runs the diagnosis; `Ok(true)` when nothing was found.
pub fn run(args: DiagnoseArgs) -> Result<bool> {
    let probe = args.probe;
    let mut args = args.attach;
    if let Some(name) = &args.netns {
        netns::enter(name)?;
    }
    if args.ifaces.is_empty() && args.config.is_none() {
        args.ifaces = tunnel_interfaces(&args.tunnel_devices)?;
        tracing::info!(interfaces = %args.ifaces.join(", "), "watching the interfaces that carry tunnel traffic");
    }
    // A diagnosis piped to a file or a script is the write-up alone.
    let format = args.output.unwrap_or(Format::Table);
    let options = Options {
        format,
        // Intervals as JSON lines, or as a live table on a terminal.
        print: format == Format::Json || io::stdout().is_terminal(),
        duration: Some(args.duration.unwrap_or(DURATION)),
        probe_once: probe,
    };
    let outcome = observe(&args, options)?;
    let healthy = outcome.healthy();
    let text = write_up(&outcome, args.netns.as_deref());
    let mut out = io::stdout().lock();
    match format {
        Format::Json => {
            let line = DiagnosisLine {
                ts: lines::timestamp(SystemTime::now()),
                netns: args.netns.as_deref(),
                interfaces: &outcome.interfaces,
                duration_s: (outcome.seconds * 10.0).round() / 10.0,
                healthy,
                findings: outcome.findings.list(),
                findings_not_kept: outcome.findings.overflow,
                measured: measured(&outcome),
                pairs: outcome.verdicts(),
                route_outages: &outcome.route_outages,
                netfilter: &outcome.netfilter,
                probe: outcome.probe.as_ref().map(|p| match p {
                    Ok(run) => ProbeVerdict {
                        healthy: report::probe::healthy(run),
                        conclusion: report::probe::conclusion(run),
                    },
                    Err(e) => ProbeVerdict {
                        healthy: false,
                        conclusion: format!("the probes could not run: {e}"),
                    },
                }),
                text: &text,
            };
            match &outcome.probe {
                Some(Ok(run)) => report::probe::write_json(&mut out, run),
                _ => Ok(()),
            }
            .and_then(|()| report::write_line(&mut out, &Line::Diagnosis(line)))
        }
        Format::Table => write!(out, "{text}"),
    }
    .context("writing output")?;
    if let Some(Err(e)) = &outcome.probe {
        bail!("the probes could not run: {e}");
    }
    Ok(healthy)
}

/// Runs the monitor to its end, keeping every finding and the last read.
fn observe(args: &AttachArgs, options: Options) -> Result<Outcome> {
    let mut monitor = Monitor::start(args, options)?;
    let mut outcome = Outcome::default();
    loop {
        let is_final = monitor.wait();
        let interval = monitor.tick(is_final)?;
        outcome.findings.record(&interval.events);
        outcome.findings.still_active(&interval.active);
        outcome.rows = interval.rows;
        outcome.drops = interval.drops;
        outcome.netfilter = interval.netfilter;
        for outage in interval.route_outages {
            if outcome.route_outages.len() < MAX_FINDINGS {
                outcome.route_outages.push(outage);
            } else {
                outcome.route_outages_not_kept += 1;
            }
        }
        if is_final {
            break;
        }
    }
    let finished = monitor.finish();
    Ok(Outcome {
        known: finished.known,
        interfaces: finished.interfaces,
        seconds: finished.seconds,
        probe: finished.probe,
        ..outcome
    })
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
    let pairs = outcome.verdicts();
    if !pairs.is_empty() {
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
    if !outcome.route_outages.is_empty() {
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
    match &outcome.probe {
        Some(Ok(run)) => {
            let _ = writeln!(
                t,
                "\nProbes (observer probe: encapsulated echo requests to every peer node, answered by its kernel):"
            );
            let mut table = Vec::new();
            let _ = report::probe::write_table(&mut table, run);
            for line in String::from_utf8_lossy(&table).lines() {
                let _ = writeln!(t, "  {line}");
            }
        }
        Some(Err(e)) => {
            let _ = writeln!(t, "\nProbes: could not run: {e}");
        }
        None => {}
    }
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
