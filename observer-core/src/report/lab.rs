//! What `observer lab` prints as text: the live view of the tunnel rows
//! that moved on each node, each node's probe lines as a table, and the
//! write-up (probes, pings, paths, each node's account, the lab
//! diagnosis). The lab (`observer`'s `lab/`) reads its observers as a user
//! would, through their JSON lines, and fills these view models from them
//! and from its own facts; its JSON output is those lines, tagged.

use std::{
    fmt::Display,
    io::{self, Write},
};

use serde::Serialize;
use serde_json::{Value, json};

/// One node's lines with the command that printed them.
pub struct NodeLines<'a> {
    /// The node's name.
    pub name: &'a str,
    /// Its underlay address.
    pub addr: &'a dyn Display,
    /// The command line.
    pub command: &'a str,
    /// Every JSON line it printed.
    pub lines: &'a [Value],
}

/// What one ping reported.
pub struct PingRow<'a> {
    pub from: &'a str,
    pub src: &'a dyn Display,
    pub to: &'a str,
    pub dst: &'a dyn Display,
    /// The encapsulation of the pod block used.
    pub proto: &'a str,
    /// ICMP payload bytes.
    pub size: u16,
    pub transmitted: u64,
    pub received: u64,
}

/// One path the observers counted: sent at one node, received at another.
pub struct PathRow<'a> {
    pub proto: &'a str,
    pub from: &'a str,
    pub from_addr: &'a dyn Display,
    pub to: &'a str,
    pub to_addr: &'a dyn Display,
    pub sent: u64,
    pub received: u64,
}

/// Everything the final write-up shows.
pub struct WriteUp<'a> {
    /// With `--probe`: each node's probe lines.
    pub probes: Vec<NodeLines<'a>>,
    /// What the pings reported (none with `--probe`).
    pub pings: Vec<PingRow<'a>>,
    /// The paths the observers counted.
    pub paths: Vec<PathRow<'a>>,
    /// Each node's observer and its lines (their `diagnosis` write-up).
    pub nodes: Vec<NodeLines<'a>>,
    /// The scenario's name and what it rebuilds.
    pub scenario: &'a str,
    pub about: &'a str,
    /// The lab's findings, in order.
    pub findings: &'a [String],
}

/// The write-up: probes, pings, paths, each node's account, the lab
/// diagnosis.
pub fn write_up(out: &mut impl Write, w: &WriteUp<'_>) -> io::Result<()> {
    for node in &w.probes {
        writeln!(out)?;
        writeln!(
            out,
            "== probes from {} {} — {}",
            node.name, node.addr, node.command
        )?;
        write_probes(out, node.lines)?;
    }
    write_pings(out, &w.pings)?;
    writeln!(out)?;
    writeln!(out, "== paths (what the observers counted on the wire)")?;
    for p in &w.paths {
        writeln!(
            out,
            "  {:<5} {:<3} {:<13} -> {:<3} {:<13} {:>5} sent (tx at {}), {:>5} received (rx at {})",
            p.proto,
            p.from,
            p.from_addr.to_string(),
            p.to,
            p.to_addr.to_string(),
            p.sent,
            p.from,
            p.received,
            p.to
        )?;
    }
    for node in &w.nodes {
        writeln!(out)?;
        writeln!(out, "== {} {} — {}", node.name, node.addr, node.command)?;
        match node_writeup(node.lines) {
            Some(text) => writeln!(out, "{}", text.trim_end())?,
            None => writeln!(out, "  (no diagnosis: the observer ended without one)")?,
        }
    }
    writeln!(out)?;
    writeln!(out, "== lab diagnosis ({}: {})", w.scenario, w.about)?;
    if w.findings.is_empty() {
        writeln!(
            out,
            "  Healthy: every path delivered all it carried, in both directions."
        )?;
    }
    write_numbered(out, w.findings)
}

/// The BGP scenarios' write-up: the findings from what each node's
/// observer said.
pub fn bgp_write_up(scenario: &str, findings: &[String]) -> String {
    let mut text =
        format!("== lab diagnosis ({scenario}: what each node's observer said)\n").into_bytes();
    let _ = write_numbered(&mut text, findings);
    String::from_utf8_lossy(&text).into_owned()
}

fn write_numbered(out: &mut impl Write, findings: &[String]) -> io::Result<()> {
    for (i, finding) in findings.iter().enumerate() {
        writeln!(out, "  {}. {finding}", i + 1)?;
    }
    Ok(())
}

/// A line of node `node`'s observer (or probe), tagged with the node, as
/// the lab's JSON output carries it.
pub fn tagged(node: &str, line: &Value) -> Value {
    let mut tagged = json!({ "node": node });
    if let (Some(out), Some(fields)) = (tagged.as_object_mut(), line.as_object()) {
        out.extend(fields.clone());
    }
    tagged
}

/// A `{"type":"lab",...}` line with the fields of `body`.
pub fn lab_line(body: &impl Serialize) -> Value {
    let mut line = json!({"type": "lab"});
    if let (Some(out), Ok(Value::Object(fields))) =
        (line.as_object_mut(), serde_json::to_value(body))
    {
        out.extend(fields);
    }
    line
}

fn write_pings(out: &mut impl Write, pings: &[PingRow<'_>]) -> io::Result<()> {
    if !pings.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "== pings (what the lab sent; the ping processes' own summaries)"
        )?;
    }
    for p in pings {
        writeln!(
            out,
            "  {:<3} {:<13} -> {:<3} {:<13} {:<5} block {:>4} B: {:>4} sent, {:>4} answered",
            p.from,
            p.src.to_string(),
            p.to,
            p.dst.to_string(),
            p.proto,
            p.size,
            p.transmitted,
            p.received
        )?;
    }
    Ok(())
}

/// The write-up of the last `diagnosis` line among a node's lines.
pub fn node_writeup(lines: &[Value]) -> Option<&str> {
    lines
        .iter()
        .rev()
        .find(|l| l["type"] == "diagnosis")
        .and_then(|l| l["text"].as_str())
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

/// The live view: per node, the tunnel rows (`peer` lines) of its last
/// complete interval, `elapsed_s` into the traffic; `clear` first clears
/// the terminal.
pub fn write_live<'a>(
    out: &mut impl Write,
    elapsed_s: u64,
    nodes: impl Iterator<Item = (&'a str, &'a [Value])>,
    clear: bool,
) -> io::Result<()> {
    if clear {
        write!(out, "\x1b[H\x1b[2J")?;
    }
    writeln!(
        out,
        "lab [{elapsed_s:>3}s] tunnel rows that moved in the last second, per node:"
    )?;
    writeln!(
        out,
        "  {:<4} {:<3} {:<5} {:<15} {:>7} {:>8}  {:<31} drops",
        "node", "dir", "proto", "peer", "pkt/s", "total", "inner sample"
    )?;
    for (node, rows) in nodes {
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

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn the_write_up_lists_pings_paths_accounts_and_findings() {
        let gpu = Ipv4Addr::new(10, 10, 10, 62);
        let cp1 = Ipv4Addr::new(10, 10, 60, 127);
        let (src, dst) = (Ipv4Addr::new(10, 42, 1, 1), Ipv4Addr::new(10, 42, 168, 193));
        let lines = [json!({"type": "diagnosis", "text": "\nobserver diagnose: eth0 for 9 s\n"})];
        let findings = ["VXLAN gpu -> cp1 never arrives".to_string()];
        let mut out = Vec::new();
        write_up(
            &mut out,
            &WriteUp {
                probes: Vec::new(),
                pings: vec![PingRow {
                    from: "gpu",
                    src: &src,
                    to: "cp1",
                    dst: &dst,
                    proto: "vxlan",
                    size: 56,
                    transmitted: 71,
                    received: 0,
                }],
                paths: vec![PathRow {
                    proto: "vxlan",
                    from: "gpu",
                    from_addr: &gpu,
                    to: "cp1",
                    to_addr: &cp1,
                    sent: 71,
                    received: 0,
                }],
                nodes: vec![
                    NodeLines {
                        name: "gpu",
                        addr: &gpu,
                        command: "observer diagnose eth0",
                        lines: &lines,
                    },
                    NodeLines {
                        name: "cp1",
                        addr: &cp1,
                        command: "observer diagnose eth0",
                        lines: &[],
                    },
                ],
                scenario: "incident",
                about: "the router drops VXLAN",
                findings: &findings,
            },
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\n== pings (what the lab sent; the ping processes' own summaries)\n\
             \x20 gpu 10.42.1.1     -> cp1 10.42.168.193 vxlan block   56 B:   71 sent,    0 answered\n\
             \n== paths (what the observers counted on the wire)\n\
             \x20 vxlan gpu 10.10.10.62   -> cp1 10.10.60.127     71 sent (tx at gpu),     0 received (rx at cp1)\n\
             \n== gpu 10.10.10.62 — observer diagnose eth0\n\
             \nobserver diagnose: eth0 for 9 s\n\
             \n== cp1 10.10.60.127 — observer diagnose eth0\n\
             \x20 (no diagnosis: the observer ended without one)\n\
             \n== lab diagnosis (incident: the router drops VXLAN)\n\
             \x20 1. VXLAN gpu -> cp1 never arrives\n"
        );
        assert_eq!(
            bgp_write_up("bgp-down", &findings),
            "== lab diagnosis (bgp-down: what each node's observer said)\n\
             \x20 1. VXLAN gpu -> cp1 never arrives\n"
        );
    }

    #[test]
    fn the_live_view_shows_each_nodes_moving_rows() {
        let rows = [json!({"type": "peer", "direction": "rx", "proto": "vxlan",
            "peer": "10.10.10.244", "pps": 7.4, "packets": 40,
            "inner_src": "10.42.168.193", "inner_dst": "10.42.1.1",
            "drops": {"calico_allow_set": 40}})];
        let mut out = Vec::new();
        let nodes = [("gpu", &rows[..]), ("cp1", &[][..])];
        write_live(&mut out, 3, nodes.into_iter(), false).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "lab [  3s] tunnel rows that moved in the last second, per node:"
        );
        assert_eq!(
            lines[2],
            "  gpu  rx  vxlan 10.10.10.244          7       40  10.42.168.193 > 10.42.1.1       calico_allow_set=40"
        );
        assert_eq!(lines[3], "  cp1  (nothing)");
    }

    #[test]
    fn json_lines_are_tagged_with_their_node_or_as_lab_facts() {
        let line = json!({"type": "peer", "packets": 3});
        assert_eq!(
            tagged("gpu", &line),
            json!({"node": "gpu", "type": "peer", "packets": 3})
        );
        assert_eq!(
            lab_line(&json!({"fact": "ping", "received": 0})),
            json!({"type": "lab", "fact": "ping", "received": 0})
        );
        let probe = [json!({"type": "probe_summary", "conclusion": "Every pair answered."})];
        assert_eq!(probes_text(&probe), "  Every pair answered.");
    }
}
