//! `observer diagnose`: a bounded attach whose anomalies become a short
//! incident write-up (what was measured, what it means, what to check
//! next; `report::diagnosis` writes it) and an exit status scripts can use.

use std::{
    io::{self, IsTerminal},
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result, bail};

use crate::{
    cli::{AttachArgs, DiagnoseArgs},
    model::dataplane::DeclaredTunnel,
    model::diagnosis::{MAX_FINDINGS, Outcome},
    monitor::{Monitor, Options},
    node::dataplane,
    node::netns,
    report::{self, Format},
};

/// Default `--duration`.
pub const DURATION: Duration = Duration::from_secs(10);

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
    let mut out = io::stdout().lock();
    report::diagnosis::write(
        &mut out,
        format,
        &outcome,
        args.netns.as_deref(),
        SystemTime::now(),
    )
    .context("writing output")?;
    if let Some(Err(e)) = &outcome.probe {
        bail!("the probes could not run: {e}");
    }
    Ok(outcome.healthy())
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
