//! What the lab prints. Text: progress notes, a live per-node view of the
//! tunnel rows that moved in each observer interval (redrawn on a
//! terminal), then the pings, the paths, each node's observer account and
//! the lab diagnosis. JSON: the observers' lines tagged with `"node"` as
//! they come, then `{"type":"lab",...}` lines with the facts.
//!
//! A write to stdout that fails (a closed pipe: `observer lab | head`) is
//! the lab's error, "writing output": it ends the lab, whose guard removes
//! everything, and `main` maps a broken pipe to exit status 0 (see
//! `process::pipe`). Notes on stderr never fail ([`pipe::eprintln`]).

use std::{
    fmt,
    io::{self, IsTerminal, Write},
    time::Instant,
};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{Value, json};

use crate::process::pipe;

use super::{
    report::{self, Fact},
    scenarios::Scenario,
    topology::NODES,
    traffic::PingResult,
};

pub use crate::cli::LabFormat;

/// Where the lab's output goes, and the live view's state.
pub struct View {
    format: LabFormat,
    /// The nodes' names, by index.
    nodes: Vec<String>,
    terminal: bool,
    traffic_since: Option<Instant>,
    /// Per node: rows printed since its last `stats` line, and those of
    /// its last complete interval.
    current: Vec<Vec<Value>>,
    last: Vec<Vec<Value>>,
}

/// Everything the final write-up needs.
pub struct Summary<'a> {
    /// The scenario run.
    pub scenario: Scenario,
    /// What the pings reported (none with `--probe`).
    pub pings: &'a [PingResult],
    /// With `--probe`, per node: the probe's command line and its lines.
    pub probes: Vec<(&'a str, &'a [Value])>,
    /// The facts in the observers' output.
    pub facts: &'a [Fact],
    /// Per node: the observer's command line and every line it printed.
    pub nodes: Vec<(&'a str, &'a [Value])>,
}

impl View {
    /// A view printing `format` on stdout, of the observers on `nodes`.
    pub fn new(format: LabFormat, nodes: Vec<String>) -> View {
        View {
            format,
            terminal: std::io::stdout().is_terminal(),
            traffic_since: None,
            current: vec![Vec::new(); nodes.len()],
            last: vec![Vec::new(); nodes.len()],
            nodes,
        }
    }

    /// A line of the text write-up (nothing in JSON: the facts are
    /// `lab` lines there).
    pub fn text(&self, text: &str) -> Result<()> {
        match self.format {
            LabFormat::Text => print_line(format_args!("{text}")),
            LabFormat::Json => Ok(()),
        }
    }

    /// A progress note: on stdout in text, on stderr in JSON (stdout holds
    /// only JSON there).
    pub fn note(&self, text: &str) -> Result<()> {
        match self.format {
            LabFormat::Text => print_line(format_args!("lab: {text}")),
            LabFormat::Json => {
                pipe::eprintln(format_args!("lab: {text}"));
                Ok(())
            }
        }
    }

    /// The note that opens a run: the scenario and what it rebuilds.
    pub fn note_scenario(&self, scenario: Scenario) -> Result<()> {
        self.note(&format!(
            "scenario {}: {}",
            scenario.name(),
            scenario.about()
        ))
    }

    /// A `{"type":"lab",...}` line (JSON only).
    pub fn lab_line(&self, body: &impl Serialize) -> Result<()> {
        if self.format != LabFormat::Json {
            return Ok(());
        }
        let mut line = json!({"type": "lab"});
        if let (Some(out), Ok(Value::Object(fields))) =
            (line.as_object_mut(), serde_json::to_value(body))
        {
            out.extend(fields);
        }
        print_line(format_args!("{line}"))
    }

    /// Marks the start of the traffic (the live view's clock).
    pub fn traffic_started(&mut self) {
        self.traffic_since = Some(Instant::now());
    }

    /// Node `node`'s probe lines, tagged with the node (JSON only).
    pub fn probe_lines(&self, node: usize, lines: &[Value]) -> Result<()> {
        if self.format != LabFormat::Json {
            return Ok(());
        }
        for line in lines {
            let mut tagged = json!({"node": self.nodes[node]});
            if let (Some(out), Some(fields)) = (tagged.as_object_mut(), line.as_object()) {
                out.extend(fields.clone());
            }
            print_line(format_args!("{tagged}"))?;
        }
        Ok(())
    }

    /// One line of node `node`'s observer.
    pub fn observer_line(&mut self, node: usize, line: &Value) -> Result<()> {
        if self.format == LabFormat::Json {
            let mut tagged = json!({"node": self.nodes[node]});
            if let (Some(out), Some(fields)) = (tagged.as_object_mut(), line.as_object()) {
                out.extend(fields.clone());
            }
            return print_line(format_args!("{tagged}"));
        }
        if line["type"] != "stats" {
            if line["type"] == "peer" && line["proto"] != "other" {
                self.current[node].push(line.clone());
            }
            return Ok(());
        }
        self.last[node] = std::mem::take(&mut self.current[node]);
        // The GPU node's interval paces the view: it is the node of the
        // incident, and one refresh per second is enough.
        if node == 0 && line["final"] == false {
            self.live().context("writing output")?;
        }
        Ok(())
    }

    fn live(&self) -> io::Result<()> {
        let Some(since) = self.traffic_since else {
            return Ok(());
        };
        let mut out = io::stdout().lock();
        if self.terminal {
            write!(out, "\x1b[H\x1b[2J")?;
        }
        writeln!(
            out,
            "lab [{:>3}s] tunnel rows that moved in the last second, per node:",
            since.elapsed().as_secs()
        )?;
        writeln!(
            out,
            "  {:<4} {:<3} {:<5} {:<15} {:>7} {:>8}  {:<31} drops",
            "node", "dir", "proto", "peer", "pkt/s", "total", "inner sample"
        )?;
        for (node, rows) in self.nodes.iter().zip(&self.last) {
            if rows.is_empty() {
                writeln!(out, "  {node:<4} (nothing)")?;
            }
            for row in rows {
                let inner = match (row["inner_src"].as_str(), row["inner_dst"].as_str()) {
                    (Some(s), Some(d)) => format!("{s} > {d}"),
                    _ => String::new(),
                };
                let drops = row["drops"]
                    .as_object()
                    .map(|d| {
                        d.iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default();
                writeln!(
                    out,
                    "  {:<4} {:<3} {:<5} {:<15} {:>7.0} {:>8}  {:<31} {drops}",
                    node,
                    row["direction"].as_str().unwrap_or("?"),
                    row["proto"].as_str().unwrap_or("?"),
                    row["peer"].as_str().unwrap_or("-"),
                    row["pps"].as_f64().unwrap_or(0.0),
                    row["packets"].as_u64().unwrap_or(0),
                    inner
                )?;
            }
        }
        out.flush()
    }

    /// The final write-up: facts and findings.
    pub fn summary(&self, summary: &Summary) -> Result<()> {
        let findings = report::findings(summary.facts);
        if self.format == LabFormat::Json {
            for ping in summary.pings {
                let mut line = serde_json::to_value(ping).unwrap_or_default();
                line["fact"] = "ping".into();
                self.lab_line(&line)?;
            }
            for (node, (_, lines)) in summary.probes.iter().enumerate() {
                self.probe_lines(node, lines)?;
            }
            for fact in summary.facts {
                self.lab_line(fact)?;
            }
            return self.lab_line(&json!({
                "fact": "diagnosis",
                "scenario": summary.scenario.name(),
                "healthy": findings.is_empty(),
                "findings": findings,
            }));
        }
        write_up(&mut io::stdout().lock(), summary, &findings).context("writing output")
    }
}

/// Writes `line` and a newline on stdout, as `println!` would, but a
/// failed write is an error instead of a panic.
fn print_line(line: fmt::Arguments<'_>) -> Result<()> {
    writeln!(io::stdout().lock(), "{line}").context("writing output")
}

/// One node's probe lines as text: a row per pair and the conclusion.
pub fn probes_text(lines: &[Value]) -> String {
    let mut text = Vec::new();
    let _ = write_probes(&mut text, lines);
    String::from_utf8_lossy(&text).trim_end().to_string()
}

/// One node's probe lines, as `observer probe` prints its table.
fn write_probes(out: &mut impl Write, lines: &[Value]) -> io::Result<()> {
    for line in lines {
        let text = |key: &str| line[key].as_str().unwrap_or("-").to_string();
        let number = |key: &str| line[key].as_u64().map_or("-".into(), |n| n.to_string());
        match line["type"].as_str() {
            Some("probe") => {
                let from = line["answer_sources"]
                    .as_array()
                    .map(|sources| {
                        sources
                            .iter()
                            .filter_map(|s| s["from"].as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default();
                writeln!(
                    out,
                    "  {:<14} {:<6} {:>3}/{:<3} answered  from {:<15} max size {:>5} (device MTU {:>5})  {}",
                    text("peer"),
                    text("encap"),
                    number("answered"),
                    number("sent"),
                    if from.is_empty() { "-".into() } else { from },
                    number("max_size"),
                    number("device_mtu"),
                    text("verdict")
                )?;
            }
            Some("probe_summary") => writeln!(out, "  {}", text("conclusion"))?,
            _ => {}
        }
    }
    Ok(())
}

/// The text write-up: pings, paths, each node's account, the lab diagnosis.
fn write_up(out: &mut impl Write, summary: &Summary, findings: &[String]) -> io::Result<()> {
    for (node, (command, lines)) in NODES.iter().zip(&summary.probes) {
        writeln!(out)?;
        writeln!(
            out,
            "== probes from {} {} — {command}",
            node.name, node.addr
        )?;
        write_probes(out, lines)?;
    }
    if !summary.pings.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "== pings (what the lab sent; the ping processes' own summaries)"
        )?;
    }
    for p in summary.pings {
        writeln!(
            out,
            "  {:<3} {:<13} -> {:<3} {:<13} {:<5} block {:>4} B: {:>4} sent, {:>4} answered",
            p.from,
            p.src,
            p.to,
            p.dst,
            p.block.proto(),
            p.size,
            p.transmitted,
            p.received
        )?;
    }
    writeln!(out)?;
    writeln!(out, "== paths (what the observers counted on the wire)")?;
    for fact in summary.facts {
        if let Fact::Path {
            proto,
            from,
            from_addr,
            to,
            to_addr,
            sent,
            received,
        } = fact
        {
            writeln!(
                out,
                "  {proto:<5} {from:<3} {from_addr:<13} -> {to:<3} {to_addr:<13} {sent:>5} sent (tx at {from}), {received:>5} received (rx at {to})"
            )?;
        }
    }
    for (node, (command, lines)) in NODES.iter().zip(&summary.nodes) {
        writeln!(out)?;
        writeln!(out, "== {} {} — {command}", node.name, node.addr)?;
        match report::node_writeup(lines) {
            Some(text) => writeln!(out, "{}", text.trim_end())?,
            None => writeln!(out, "  (no diagnosis: the observer ended without one)")?,
        }
    }
    writeln!(out)?;
    writeln!(
        out,
        "== lab diagnosis ({}: {})",
        summary.scenario.name(),
        summary.scenario.about()
    )?;
    if findings.is_empty() {
        writeln!(
            out,
            "  Healthy: every path delivered all it carried, in both directions."
        )?;
    }
    for (i, finding) in findings.iter().enumerate() {
        writeln!(out, "  {}. {finding}", i + 1)?;
    }
    Ok(())
}
