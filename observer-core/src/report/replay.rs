//! What `observer replay` prints: the allow-set lines (JSON only, like
//! attach), one summary per capture (its `replay` line, or a sentence on a
//! table) followed by the frames the observer's evidence comments name
//! (`evidence` lines, or a short section), then the rows as attach prints
//! them.

use std::io::{self, Write};

use super::{
    Format, Line,
    lines::{self, AllowSetLine, EvidenceLine, ReplayLine},
    table,
    view::Snapshot,
    write_line,
};
use crate::model::{evidence::EvidenceTally, rows::direction_name};

/// One replayed capture: its summary and the evidence comments its
/// frames carried.
pub struct Capture<'a> {
    /// The `replay` line.
    pub summary: ReplayLine<'a>,
    /// Frames with an observer comment, per (peer, stage, direction,
    /// origin, reason).
    pub evidence: &'a EvidenceTally,
}

/// Writes a replay: `allow_sets` and `captures` (one per file, in order),
/// then `snapshot`'s rows.
pub fn write(
    out: &mut impl Write,
    format: Format,
    allow_sets: &[AllowSetLine],
    captures: Vec<Capture<'_>>,
    snapshot: &Snapshot<'_>,
) -> io::Result<()> {
    match format {
        Format::Json => {
            for allow_set in allow_sets {
                write_line(out, &Line::AllowSet(allow_set))?;
            }
            for Capture { summary, evidence } in captures {
                let capture = summary.iface;
                write_line(out, &Line::Replay(summary))?;
                for (key, frames) in evidence.iter() {
                    let line = EvidenceLine::new(capture, key, frames);
                    write_line(out, &Line::Evidence(line))?;
                }
            }
            lines::write_json(out, snapshot)
        }
        Format::Table => {
            for capture in &captures {
                writeln!(out, "{}", summary(&capture.summary))?;
                write_evidence(out, capture.summary.iface, capture.evidence)?;
            }
            table::write_table(out, snapshot, false)
        }
    }
}

/// One capture's summary sentence.
fn summary(c: &ReplayLine<'_>) -> String {
    // Only the test runs cut or refuse frames.
    let test_runs = if c.engine == "native" {
        String::new()
    } else {
        format!(
            ", {} cut to the test-run limit, {} refused by the test run",
            c.cut, c.refused
        )
    };
    format!(
        "replay {} ({}, {} engine): {} frames, {} sent by --local, {} truncated by the snap length ({} bytes not captured){test_runs}{}",
        c.iface,
        c.format,
        c.engine,
        c.frames,
        c.tx_frames,
        c.truncated,
        c.truncated_bytes,
        c.error.map_or(String::new(), |e| format!("; STOPPED: {e}"))
    )
}

/// A capture's evidence section: nothing when no frame carried an
/// observer comment.
fn write_evidence(out: &mut impl Write, capture: &str, tally: &EvidenceTally) -> io::Result<()> {
    if tally.is_empty() {
        return Ok(());
    }
    writeln!(out, "evidence in {capture}: {} frames", tally.frames())?;
    writeln!(
        out,
        "  {:<39} {:<8} {:<3} {:<10} {:<24} {:>8}",
        "PEER", "STAGE", "DIR", "ORIGIN", "REASON", "FRAMES"
    )?;
    for (key, frames) in tally.iter() {
        let peer = key.peer.map_or_else(|| "-".to_string(), |p| p.to_string());
        writeln!(
            out,
            "  {peer:<39} {:<8} {:<3} {:<10} {:<24} {frames:>8}",
            key.stage.name(),
            direction_name(key.direction),
            key.origin.name(),
            key.reason,
        )?;
    }
    if tally.overflow() > 0 {
        writeln!(
            out,
            "  ({} more (frame, reason) pairs of other keys, beyond the {} kept)",
            tally.overflow(),
            crate::model::evidence::TALLY_MAX_KEYS
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rows::KernelStats;
    use crate::model::{
        evidence::{Origin, Tag},
        rows::Stage,
    };
    use observer_common::Direction;
    use std::{collections::HashMap, time::SystemTime};

    fn capture<'a>(tally: &'a EvidenceTally) -> Capture<'a> {
        Capture {
            summary: ReplayLine {
                iface: "ev.pcapng",
                ifindex: 1,
                format: "pcapng",
                engine: "native",
                frames: 3,
                tx_frames: 0,
                truncated: 0,
                truncated_bytes: 0,
                cut: 0,
                refused: 0,
                first_ts: None,
                last_ts: None,
                error: None,
                evidence_frames: tally.frames(),
                evidence_overflow: tally.overflow(),
            },
            evidence: tally,
        }
    }

    fn tally() -> EvidenceTally {
        let mut tally = EvidenceTally::new();
        let mut tag = Tag {
            origin: Origin::Classifier,
            reasons: vec!["calico_allow_set".into(), "bad_outer_checksum".into()],
            stage: Stage::Underlay,
            direction: Direction::Rx,
            peer: Some("10.0.0.2".parse().unwrap()),
            interface: "eth0".into(),
            location: None,
        };
        tally.add(&tag);
        tag.reasons = vec!["calico_allow_set".into()];
        tally.add(&tag);
        tag.origin = Origin::Kernel;
        tag.peer = None;
        tag.reasons = vec!["NETFILTER_DROP".into()];
        tally.add(&tag);
        tally
    }

    /// What `write` prints before the rows: the capture's summary and
    /// its evidence.
    fn section(format: Format, tally: &EvidenceTally) -> String {
        let ifaces = HashMap::new();
        let snapshot = Snapshot::new(
            &[],
            KernelStats::default(),
            &ifaces,
            SystemTime::UNIX_EPOCH,
            true,
        );
        let mut out = Vec::new();
        write(&mut out, format, &[], vec![capture(tally)], &snapshot).unwrap();
        let mut rows = Vec::new();
        match format {
            Format::Table => table::write_table(&mut rows, &snapshot, false).unwrap(),
            Format::Json => lines::write_json(&mut rows, &snapshot).unwrap(),
        }
        let text = String::from_utf8(out).unwrap();
        let rows = String::from_utf8(rows).unwrap();
        text.strip_suffix(&rows).unwrap().to_string()
    }

    #[test]
    fn evidence_follows_its_capture_per_key() {
        let tally = tally();
        let json = section(Format::Json, &tally);
        let lines: Vec<&str> = json.lines().collect();
        assert!(
            lines[0].starts_with(r#"{"type":"replay","iface":"ev.pcapng""#),
            "{json}"
        );
        assert!(lines[0].ends_with(r#","evidence_frames":3}"#), "{json}");
        assert_eq!(
            lines[1..],
            [
                r#"{"type":"evidence","capture":"ev.pcapng","peer":null,"stage":"underlay","direction":"rx","origin":"kernel","reason":"NETFILTER_DROP","frames":1}"#,
                r#"{"type":"evidence","capture":"ev.pcapng","peer":"10.0.0.2","stage":"underlay","direction":"rx","origin":"classifier","reason":"bad_outer_checksum","frames":1}"#,
                r#"{"type":"evidence","capture":"ev.pcapng","peer":"10.0.0.2","stage":"underlay","direction":"rx","origin":"classifier","reason":"calico_allow_set","frames":2}"#,
            ]
        );
        let table = section(Format::Table, &tally);
        let rows: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert!(table.starts_with("replay ev.pcapng (pcapng, native engine): 3 frames"));
        assert_eq!(
            table.lines().nth(1),
            Some("evidence in ev.pcapng: 3 frames")
        );
        assert_eq!(
            rows[2..],
            [
                vec!["PEER", "STAGE", "DIR", "ORIGIN", "REASON", "FRAMES"],
                vec!["-", "underlay", "rx", "kernel", "NETFILTER_DROP", "1"],
                vec![
                    "10.0.0.2",
                    "underlay",
                    "rx",
                    "classifier",
                    "bad_outer_checksum",
                    "1"
                ],
                vec![
                    "10.0.0.2",
                    "underlay",
                    "rx",
                    "classifier",
                    "calico_allow_set",
                    "2"
                ],
            ]
        );
        // Nothing for a capture without observer comments.
        let table = section(Format::Table, &EvidenceTally::new());
        assert_eq!(table.lines().count(), 1, "{table}");
        assert!(!table.contains("evidence"), "{table}");
        let json = section(Format::Json, &EvidenceTally::new());
        assert_eq!(json.lines().count(), 1);
        assert!(!json.contains("evidence"), "{json}");
    }
}
