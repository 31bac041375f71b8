//! What `observer replay` prints: the allow-set lines (JSON only, like
//! attach), one summary per capture (its `replay` line, or a sentence on a
//! table), then the rows as attach prints them.

use std::io::{self, Write};

use super::{
    Format, Line,
    lines::{self, AllowSetLine, ReplayLine},
    table,
    view::Snapshot,
    write_line,
};

/// Writes a replay: `allow_sets` and `captures` (one per file, in order),
/// then `snapshot`'s rows.
pub fn write(
    out: &mut impl Write,
    format: Format,
    allow_sets: &[AllowSetLine],
    captures: Vec<ReplayLine<'_>>,
    snapshot: &Snapshot<'_>,
) -> io::Result<()> {
    match format {
        Format::Json => {
            for allow_set in allow_sets {
                write_line(out, &Line::AllowSet(allow_set))?;
            }
            for capture in captures {
                write_line(out, &Line::Replay(capture))?;
            }
            lines::write_json(out, snapshot)
        }
        Format::Table => {
            for capture in &captures {
                writeln!(out, "{}", summary(capture))?;
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
