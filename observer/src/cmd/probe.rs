//! `observer probe`: reads the data plane, probes once (the engine is
//! `monitor::probe`), and prints what `report::probe` makes of it.

use std::io::{self, Write};

use anyhow::{Context, Result};

use crate::{
    cli::ProbeArgs,
    monitor::probe::{Settings, probe_once},
    node,
    report::{Format, probe as report},
};

/// Runs `observer probe`; returns whether every pair was healthy.
pub fn run(args: ProbeArgs) -> Result<bool> {
    if let Some(ns) = &args.netns {
        node::netns::enter(ns)?;
    }
    let settings = Settings {
        peers: args.peers,
        encaps: args.encaps,
        count: args.count,
        rate: args.rate,
        timeout: args.timeout,
        ladder: !args.no_ladder,
    };
    let view = node::dataplane::read_declaring(&args.tunnel_devices)
        .context("reading the data plane (routes, FDB, neighbours)")?;
    let run = probe_once(&view, &settings)?;
    let mut out = io::stdout().lock();
    match Format::or_default(args.output) {
        Format::Json => report::write_json(&mut out, &run),
        Format::Table => report::write_table(&mut out, &run),
    }?;
    out.flush()?;
    Ok(run.healthy())
}
