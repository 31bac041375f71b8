//! Where the lab's output goes. Text: progress notes, a live per-node view
//! of the tunnel rows that moved in each observer interval (redrawn on a
//! terminal), then the pings, the paths, each node's observer account and
//! the lab diagnosis, all rendered by `report::lab`. JSON: the observers' lines tagged with `"node"` as
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

use crate::{
    process::pipe,
    report::lab::{self as render, NodeLines, PathRow, PingRow, WriteUp},
};

use super::{
    report::{self, Fact},
    scenarios::Scenario,
    topology::{NODES, NodeSpec},
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
        print_line(format_args!("{}", render::lab_line(body)))
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
            print_line(format_args!("{}", render::tagged(&self.nodes[node], line)))?;
        }
        Ok(())
    }

    /// One line of node `node`'s observer.
    pub fn observer_line(&mut self, node: usize, line: &Value) -> Result<()> {
        if self.format == LabFormat::Json {
            return print_line(format_args!("{}", render::tagged(&self.nodes[node], line)));
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
        let nodes = self
            .nodes
            .iter()
            .map(String::as_str)
            .zip(self.last.iter().map(Vec::as_slice));
        render::write_live(
            &mut io::stdout().lock(),
            since.elapsed().as_secs(),
            nodes,
            self.terminal,
        )
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

/// The text write-up, from the lab's summary (`report::lab` renders it).
fn write_up(out: &mut impl Write, summary: &Summary, findings: &[String]) -> io::Result<()> {
    fn node_lines<'a>(
        (node, &(command, lines)): (&'static NodeSpec, &(&'a str, &'a [Value])),
    ) -> NodeLines<'a> {
        NodeLines {
            name: node.name,
            addr: &node.addr,
            command,
            lines,
        }
    }
    let paths = summary.facts.iter().filter_map(|fact| match fact {
        Fact::Path {
            proto,
            from,
            from_addr,
            to,
            to_addr,
            sent,
            received,
        } => Some(PathRow {
            proto,
            from,
            from_addr,
            to,
            to_addr,
            sent: *sent,
            received: *received,
        }),
        _ => None,
    });
    let pings = summary.pings.iter().map(|p| PingRow {
        from: p.from,
        src: &p.src,
        to: p.to,
        dst: &p.dst,
        proto: p.block.proto(),
        size: p.size,
        transmitted: p.transmitted,
        received: p.received,
    });
    let (scenario, about) = (summary.scenario.name(), summary.scenario.about());
    render::write_up(
        out,
        &WriteUp {
            probes: NODES.iter().zip(&summary.probes).map(node_lines).collect(),
            pings: pings.collect(),
            paths: paths.collect(),
            nodes: NODES.iter().zip(&summary.nodes).map(node_lines).collect(),
            scenario: &scenario,
            about: &about,
            findings,
        },
    )
}
