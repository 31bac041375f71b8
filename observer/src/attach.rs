//! `observer attach`: load, attach, then read, aggregate and print every
//! interval until a signal or `--duration` ends the run.

use std::{
    collections::HashMap,
    io::{self, IsTerminal, Write},
    time::{Instant, SystemTime},
};

use anyhow::{Context, Result, bail};
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    aggregate::{Aggregator, DropAggregator},
    allowsets::AllowSetConfig,
    checks::NodeChecks,
    cli::AttachArgs,
    drops,
    loader::{self, LoadConfig, Observer},
    netns,
    output::{self, AttachLine, DropRow, Format, Snapshot},
    ports::PortConfig,
    preflight,
};

/// Userspace rows kept per kernel flow-map entry: rows outlive evicted
/// kernel keys so totals stay monotonic, within this bound.
const ROWS_PER_FLOW: usize = 4;

/// Runs the attach command.
pub fn run(args: AttachArgs) -> Result<()> {
    // Namespace first: setns only moves the calling thread, so it must
    // happen before the runtime starts any.
    if let Some(name) = &args.netns {
        netns::enter(name)?;
    }
    preflight::check_privileges()?;
    preflight::check_btf(std::path::Path::new(preflight::KERNEL_BTF))?;
    let mut seen = std::collections::HashSet::new();
    for iface in &args.ifaces {
        if !seen.insert(iface) {
            bail!("interface {iface} is given twice");
        }
        loader::ifindex(iface).with_context(|| match &args.netns {
            Some(ns) => format!("in network namespace {ns}"),
            None => "in the current network namespace".to_string(),
        })?;
    }

    let config = LoadConfig {
        max_flows: args.max_flows,
        ports: port_config(&args),
    };
    let mut observer = Observer::load(&config)?;
    let format = args.output.unwrap_or(if io::stdout().is_terminal() {
        Format::Table
    } else {
        Format::Json
    });
    // Signal handlers go in before the first attach line: a script that
    // stops the observer as soon as it is attached must get the final
    // counters and exit 0, not die from the default signal action.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let signals = {
        let _guard = runtime.enter();
        Signals {
            interrupt: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            terminate: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        }
    };
    let program_ids = observer.program_ids()?;
    for iface in &args.ifaces {
        observer.attach(iface, args.xdp_mode)?;
        let attachment = observer.attachments().last().expect("attached just now");
        tracing::info!(
            iface = %attachment.iface,
            rx = %attachment.rx,
            tx = %attachment.tx,
            "attached"
        );
        if format == Format::Json {
            let line = serde_json::to_string(&AttachLine::new(
                attachment,
                &program_ids,
                observer.drop_hook(),
                SystemTime::now(),
            ))?;
            if writeln!(io::stdout(), "{line}").is_err() {
                return Ok(());
            }
        }
    }

    let result = runtime.block_on(stream(&mut observer, &args, format, signals));
    // Dropping the observer closes the links: everything is detached.
    drop(observer);
    result
}

fn port_config(args: &AttachArgs) -> PortConfig {
    let defaults = PortConfig::default();
    let pick = |given: &Vec<u16>, default: Vec<u16>| {
        if given.is_empty() {
            default
        } else {
            given.clone()
        }
    };
    PortConfig {
        vxlan: pick(&args.vxlan_ports, defaults.vxlan),
        vxlan_gpe: pick(&args.vxlan_gpe_ports, defaults.vxlan_gpe),
        geneve: pick(&args.geneve_ports, defaults.geneve),
        wireguard: pick(&args.wireguard_ports, defaults.wireguard),
    }
}

/// The signals that end a run.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

async fn stream(
    observer: &mut Observer,
    args: &AttachArgs,
    format: Format,
    mut signals: Signals,
) -> Result<()> {
    let ifaces: HashMap<u32, String> = observer
        .attachments()
        .iter()
        .map(|a| (a.ifindex, a.iface.clone()))
        .collect();
    let max_rows = (args.max_flows as usize).saturating_mul(ROWS_PER_FLOW);
    let mut aggregator = Aggregator::new(max_rows);
    let mut drop_aggregator = DropAggregator::new(max_rows);
    let mut checks = NodeChecks::new(
        AllowSetConfig {
            sets: args.allow_sets.clone(),
            cidrs: args.allow_cidrs.clone(),
        },
        args.allow_set_refresh,
    );
    let print_reports = |reports: Vec<crate::checks::AllowSetReport>| -> io::Result<()> {
        if format != Format::Json {
            return Ok(());
        }
        let mut out = io::stdout().lock();
        for report in reports {
            writeln!(
                out,
                "{}",
                serde_json::to_string(&report).map_err(io::Error::other)?
            )?;
        }
        out.flush()
    };
    if let Err(e) = print_reports(checks.refresh(observer)?) {
        return if e.kind() == io::ErrorKind::BrokenPipe {
            Ok(())
        } else {
            Err(e.into())
        };
    }
    // Baseline of the netfilter counters: the comparison is since attach.
    checks.netfilter(&[]);
    let start = tokio::time::Instant::now();
    let deadline = args.duration.map(|d| start + d);
    let mut ticker = tokio::time::interval_at(start + args.interval, args.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Instant::now();
    let clear = io::stdout().is_terminal();
    loop {
        let is_final = tokio::select! {
            _ = ticker.tick() => false,
            _ = signals.interrupt.recv() => true,
            _ = signals.terminate.recv() => true,
            _ = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => true,
        };
        let reports = checks.refresh(observer)?;
        aggregator.update(&observer.read_flows()?);
        drop_aggregator.update(&drops::read(observer)?);
        let seconds = last.elapsed().as_secs_f64();
        let rows = aggregator.finish_interval(seconds);
        let drop_rows: Vec<DropRow> = drop_aggregator
            .finish_interval(seconds)
            .into_iter()
            .map(|row| {
                let reason = row.id.reason_name(observer);
                let message = drops::message(
                    &row.id,
                    row.packets,
                    &reason,
                    &checks.allow_set_names(row.id.proto),
                );
                DropRow {
                    row,
                    reason,
                    message,
                }
            })
            .collect();
        let netfilter = checks.netfilter(&drop_rows);
        last = Instant::now();
        let snapshot = Snapshot {
            rows: &rows,
            stats: observer.read_stats()?,
            rows_forgotten: aggregator.forgotten_rows(),
            ifaces: &ifaces,
            attachments: observer.attachments(),
            at: SystemTime::now(),
            is_final,
            drops: &drop_rows,
            netfilter: &netfilter,
        };
        if let Err(e) = print_reports(reports) {
            return if e.kind() == io::ErrorKind::BrokenPipe {
                Ok(())
            } else {
                Err(e.into())
            };
        }
        let mut out = io::stdout().lock();
        let written = match format {
            Format::Json => output::write_json(&mut out, &snapshot),
            Format::Table => output::write_table(&mut out, &snapshot, clear && !is_final),
        };
        match written {
            // Reader gone (`| head`): stop quietly, detaching everything.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(e).context("writing output"),
            Ok(()) => {}
        }
        if is_final {
            return Ok(());
        }
    }
}
