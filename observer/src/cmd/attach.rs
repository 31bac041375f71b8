//! `observer attach`: load, attach, then every interval read, aggregate,
//! print and export, until a signal or `--duration` ends the run. Follows
//! interfaces that are deleted and re-created, and reloads settings on
//! SIGHUP.

use std::{
    collections::HashMap,
    io::{self, IsTerminal, Write},
    path::PathBuf,
    time::{Instant, SystemTime},
};

use anyhow::{Context, Result, bail};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::{
    bpf::{self, InterfaceEvent, LoadConfig, Observer},
    cli::AttachArgs,
    cli::settings::Settings,
    cmd::checks::NodeChecks,
    model::aggregate::{Aggregator, DropAggregator},
    model::anomalies::{Engine, Event, Findings, Known},
    model::crosscheck::NetfilterCheck,
    model::dataplane::{DataPlane, DeclaredTunnel},
    model::hooks::{AttachedWith, Attachment},
    model::rows::{DropRow, KernelStats},
    node::allowsets::AllowSetConfig,
    node::dataplane::{self, ChangeWatcher},
    node::netns,
    node::preflight,
    report::textfile::{self, ExportInput, Exporter, TEXTFILE_NAME},
    report::{
        self, Format, Line,
        lines::{
            self, AllowSetLine, AttachLine, DataplaneLine, InterfaceLine, ProgramNames, Snapshot,
        },
        table,
    },
};

/// Default `--duration` of `observer diagnose`.
pub const DIAGNOSE_DURATION: std::time::Duration = std::time::Duration::from_secs(10);

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
    monitor(&args, Mode::Attach).map(|_| ())
}

/// Which command runs the monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `observer attach`: prints every interval until stopped.
    Attach,
    /// `observer diagnose`: bounded; prints intervals only as JSON lines
    /// or a live table on a terminal, and keeps what the write-up needs.
    Diagnose,
}

/// What a finished run leaves for the diagnosis.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every anomaly seen during the run.
    pub findings: Findings,
    /// The last read: rows, drop rows, netfilter cross-check.
    pub rows: Vec<crate::model::aggregate::Row>,
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
    /// The output format used.
    pub format: Option<Format>,
}

/// Loads, attaches and runs the read loop in the current network
/// namespace until a signal, `--duration` or a closed stdout.
pub fn monitor(args: &AttachArgs, mode: Mode) -> Result<Outcome> {
    let settings = Settings::load(args)?;
    preflight::check_privileges()?;
    preflight::check_btf(std::path::Path::new(preflight::KERNEL_BTF))?;
    let mut seen = std::collections::HashSet::new();
    for iface in &settings.interfaces {
        if !seen.insert(iface) {
            bail!("interface {iface} is given twice");
        }
        bpf::ifindex(iface).with_context(|| match &args.netns {
            Some(ns) => format!("in network namespace {ns}"),
            None => "in the current network namespace".to_string(),
        })?;
    }

    let mut observer = Observer::load(&LoadConfig {
        max_flows: settings.max_flows,
        ports: settings.ports.clone(),
        defer_tc_ingress: true,
    })?;
    let format = args.output.unwrap_or(if io::stdout().is_terminal() {
        Format::Table
    } else if mode == Mode::Diagnose {
        // A diagnosis piped to a file or a script is the write-up alone.
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
            hangup: signal(SignalKind::hangup()).context("installing the SIGHUP handler")?,
        }
    };
    for iface in &settings.interfaces {
        observer.attach(iface, settings.xdp_mode)?;
        let program_ids = observer.program_ids()?;
        let attachment = observer.attachments().last().expect("attached just now");
        tracing::info!(
            iface = %attachment.iface,
            rx = %attachment.rx,
            tx = %attachment.tx,
            "attached"
        );
        if format == Format::Json {
            let line = attach_line(&observer, attachment, &program_ids, SystemTime::now());
            if report::write_line(&mut io::stdout(), &Line::Attach(line)).is_err() {
                return Ok(Outcome::default());
            }
        }
    }

    let mut monitor = Monitor::new(&mut observer, args, settings, format, mode);
    let result = runtime.block_on(monitor.run(signals));
    monitor.remove_textfile();
    let outcome = Outcome {
        findings: std::mem::take(&mut monitor.findings),
        interfaces: monitor.settings.interfaces.clone(),
        known: std::mem::take(&mut monitor.known),
        seconds: monitor.started.elapsed().as_secs_f64(),
        format: Some(format),
        ..std::mem::take(&mut monitor.last)
    };
    // Dropping the observer closes the links: everything is detached.
    drop(monitor);
    drop(observer);
    result.map(|()| outcome)
}

/// The signals the run reacts to.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

/// State of a running attach.
struct Monitor<'a> {
    observer: &'a mut Observer,
    args: &'a AttachArgs,
    settings: Settings,
    format: Format,
    aggregator: Aggregator,
    drop_aggregator: DropAggregator,
    checks: NodeChecks,
    exporter: Exporter,
    /// Interface names by index, old indexes included (rows keep them).
    ifaces: HashMap<u32, String>,
    /// Where the textfile was last written, to remove it on exit.
    written: Option<PathBuf>,
    mode: Mode,
    engine: Engine,
    /// Every anomaly of the run (diagnose only).
    findings: Findings,
    /// The last read (diagnose only).
    last: Outcome,
    /// When counting started; the engine's clock.
    started: Instant,
    /// The node's data plane, re-read when netlink reports a change.
    dataplane: DataPlaneState,
    /// What the anomaly rules know of the peers: rebuilt when the data
    /// plane or the allow-sets change.
    known: Known,
    /// The latest netfilter cross-check (read every refresh period).
    netfilter: Vec<NetfilterCheck>,
}

/// The data-plane view and what keeps it current.
struct DataPlaneState {
    view: Option<DataPlane>,
    declared: Vec<DeclaredTunnel>,
    /// `None` when notifications could not be subscribed: then the view is
    /// re-read every interval.
    watcher: Option<ChangeWatcher>,
    last_error: Option<String>,
}

impl DataPlaneState {
    fn new(declared: Vec<DeclaredTunnel>) -> DataPlaneState {
        let watcher = ChangeWatcher::new()
            .inspect_err(|e| {
                tracing::warn!(error = %format!("{e:#}"), "no netlink change notifications; the data plane is re-read every interval")
            })
            .ok();
        DataPlaneState {
            view: None,
            declared,
            watcher,
            last_error: None,
        }
    }

    /// Re-reads the view when netlink reported a change (always the first
    /// time); true when the view differs from the previous one.
    fn refresh(&mut self) -> bool {
        let changed = self.watcher.as_ref().is_none_or(|w| w.take_changed());
        if !changed && self.view.is_some() {
            return false;
        }
        match dataplane::read_declaring(&self.declared) {
            Ok(view) => {
                self.last_error = None;
                if self.view.as_ref() == Some(&view) {
                    return false;
                }
                self.view = Some(view);
                true
            }
            Err(e) => {
                let error = format!("{e:#}");
                if self.last_error.as_ref() != Some(&error) {
                    tracing::error!(
                        error,
                        "cannot read the data plane (routes, FDB, devices); anomalies use the last view"
                    );
                    self.last_error = Some(error);
                }
                false
            }
        }
    }
}

impl<'a> Monitor<'a> {
    fn new(
        observer: &'a mut Observer,
        args: &'a AttachArgs,
        settings: Settings,
        format: Format,
        mode: Mode,
    ) -> Self {
        let max_rows = (settings.max_flows as usize).saturating_mul(ROWS_PER_FLOW);
        let settings_thresholds = settings.thresholds;
        let settings_tunnels = settings.tunnel_devices.clone();
        let checks = NodeChecks::new(allow_set_config(&settings), settings.allow_set_refresh);
        let ifaces = observer
            .attachments()
            .iter()
            .map(|a| (a.ifindex, a.iface.clone()))
            .collect();
        Monitor {
            observer,
            args,
            exporter: Exporter::new(settings.max_peers),
            settings,
            format,
            aggregator: Aggregator::new(max_rows),
            drop_aggregator: DropAggregator::new(max_rows),
            checks,
            ifaces,
            written: None,
            mode,
            engine: Engine::new(settings_thresholds, 0.0),
            findings: Findings::default(),
            last: Outcome::default(),
            started: Instant::now(),
            dataplane: DataPlaneState::new(settings_tunnels),
            known: Known::default(),
            netfilter: Vec::new(),
        }
    }

    /// Re-reads the allow-sets when due; `known` follows when they changed
    /// (it is rebuilt on change, not every interval). Returns the reports.
    fn refresh_allow_sets(&mut self) -> Result<Vec<AllowSetLine>> {
        let reports = self.checks.refresh(self.observer)?;
        if !reports.is_empty() {
            self.known.allow = self.checks.allow_sets().cloned();
        }
        Ok(reports)
    }

    /// Re-reads the data plane when netlink says it changed, printing the
    /// new view as a JSON line.
    fn refresh_dataplane(&mut self) -> io::Result<()> {
        if !self.dataplane.refresh() {
            return Ok(());
        }
        let Some(view) = self.dataplane.view.as_ref() else {
            return Ok(());
        };
        let expected_peers = view.expected_peers();
        let local = view.local_addresses();
        let line = DataplaneLine {
            ts: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            devices: &view.devices,
            underlay: &view.underlay,
            expected_peers: &expected_peers,
            unresolved_routes: view.unresolved_routes(),
        };
        tracing::info!(
            devices = view.devices.len(),
            expected_peers = line.expected_peers.len(),
            unresolved_routes = line.unresolved_routes.len(),
            "data plane read"
        );
        if self.prints_intervals() {
            self.print_lines(&[Line::Dataplane(line)])?;
        }
        self.known.nodes = expected_peers;
        self.known.local = local;
        Ok(())
    }

    /// Whether interval output goes to stdout: always for attach; for
    /// diagnose as JSON lines or a live table on a terminal.
    fn prints_intervals(&self) -> bool {
        match self.mode {
            Mode::Attach => true,
            Mode::Diagnose => self.format == Format::Json || io::stdout().is_terminal(),
        }
    }

    /// Prints JSON lines (nothing in table mode).
    fn print_lines(&self, lines: &[Line<'_>]) -> io::Result<()> {
        if self.format != Format::Json || lines.is_empty() {
            return Ok(());
        }
        let mut out = io::stdout().lock();
        for line in lines {
            report::write_line(&mut out, line)?;
        }
        out.flush()
    }

    /// Prints the allow-sets that changed.
    fn print_allow_sets(&self, reports: &[AllowSetLine]) -> io::Result<()> {
        let lines: Vec<Line<'_>> = reports.iter().map(Line::AllowSet).collect();
        self.print_lines(&lines)
    }

    async fn run(&mut self, mut signals: Signals) -> Result<()> {
        let reports = self.refresh_allow_sets()?;
        if stop_on_closed_stdout(self.print_allow_sets(&reports))? {
            return Ok(());
        }
        if stop_on_closed_stdout(self.refresh_dataplane())? {
            return Ok(());
        }
        // Baseline of the netfilter counters: the comparison is since attach.
        self.checks.netfilter(&[], true);
        let start = tokio::time::Instant::now();
        let duration = match self.mode {
            Mode::Attach => self.args.duration,
            Mode::Diagnose => Some(self.args.duration.unwrap_or(DIAGNOSE_DURATION)),
        };
        let deadline = duration.map(|d| start + d);
        let mut interval = self.settings.interval;
        let mut ticker = tokio::time::interval_at(start + interval, interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = Instant::now();
        loop {
            let is_final = tokio::select! {
                _ = ticker.tick() => false,
                _ = signals.interrupt.recv() => true,
                _ = signals.terminate.recv() => true,
                _ = signals.hangup.recv() => {
                    self.reload();
                    if self.settings.interval != interval {
                        interval = self.settings.interval;
                        ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
                        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    }
                    continue;
                }
                _ = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => true,
            };
            if stop_on_closed_stdout(self.tick(is_final, last.elapsed().as_secs_f64()))? {
                return Ok(());
            }
            last = Instant::now();
            if is_final {
                return Ok(());
            }
        }
    }

    /// One interval: follow interfaces, refresh node facts, read, print, export.
    fn tick(&mut self, is_final: bool, seconds: f64) -> io::Result<()> {
        let events = self.observer.follow_interfaces();
        self.report_interface_events(&events)?;
        let reports = self.refresh_allow_sets().map_err(io::Error::other)?;
        self.refresh_dataplane()?;
        let flows = self.observer.read_flows().map_err(io::Error::other)?;
        self.aggregator.update(&flows);
        self.drop_aggregator
            .update(&self.observer.read_drops().map_err(io::Error::other)?);
        let rows = self.aggregator.finish_interval(seconds);
        let drop_rows = self
            .checks
            .drop_rows(self.observer, self.drop_aggregator.finish_interval(seconds));
        // Netfilter lines are printed when the counters were read; the
        // table and the diagnosis keep the latest comparison.
        let fresh_netfilter = self.checks.netfilter(&drop_rows, is_final);
        if let Some(checks) = &fresh_netfilter {
            self.netfilter = checks.clone();
        }
        let stats = self
            .observer
            .stats_for(flows.len() as u64)
            .map_err(io::Error::other)?;
        let at = SystemTime::now();
        let events = self.engine.observe(
            self.started.elapsed().as_secs_f64(),
            at,
            &rows,
            &drop_rows,
            &self.known,
        );
        for event in &events {
            log_event(event);
        }
        if self.mode == Mode::Diagnose {
            self.findings.record(&events);
        }
        self.export(&rows, &drop_rows, stats, at);
        let active = self.engine.active();
        let snapshot = Snapshot {
            rows: &rows,
            stats,
            rows_forgotten: self.aggregator.forgotten_rows(),
            ifaces: &self.ifaces,
            attachments: self.observer.attachments(),
            at,
            is_final,
            drops: &drop_rows,
            netfilter: match (self.format, &fresh_netfilter) {
                (Format::Json, Some(fresh)) => fresh,
                (Format::Json, None) => &[],
                (Format::Table, _) => &self.netfilter,
            },
            anomaly_events: &events,
            anomalies: &active,
        };
        let result = if self.prints_intervals() {
            self.print_allow_sets(&reports)?;
            let mut out = io::stdout().lock();
            match self.format {
                Format::Json => lines::write_json(&mut out, &snapshot),
                Format::Table => {
                    table::write_table(&mut out, &snapshot, io::stdout().is_terminal() && !is_final)
                }
            }
        } else {
            Ok(())
        };
        if self.mode == Mode::Diagnose {
            self.findings.still_active(&active);
            self.last.rows = rows;
            self.last.drops = drop_rows;
            self.last.netfilter = self.netfilter.clone();
        }
        result
    }

    fn report_interface_events(&mut self, events: &[InterfaceEvent]) -> io::Result<()> {
        let mut lines = Vec::new();
        for event in events {
            let ts = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
            let line = match event {
                InterfaceEvent::Gone { iface, ifindex } => {
                    tracing::warn!(
                        iface,
                        ifindex,
                        "interface gone; re-attaching when it comes back"
                    );
                    Line::Interface(InterfaceLine {
                        ts,
                        iface,
                        event: "gone",
                        ifindex: Some(*ifindex),
                        error: None,
                    })
                }
                InterfaceEvent::Reattached { iface, ifindex } => {
                    tracing::info!(iface, ifindex, "interface back; attached again");
                    self.ifaces.insert(*ifindex, iface.clone());
                    Line::Interface(InterfaceLine {
                        ts,
                        iface,
                        event: "reattached",
                        ifindex: Some(*ifindex),
                        error: None,
                    })
                }
                InterfaceEvent::Failed { iface, error } => {
                    tracing::error!(iface, error, "re-attaching failed; retrying next interval");
                    Line::Interface(InterfaceLine {
                        ts,
                        iface,
                        event: "reattach_failed",
                        ifindex: None,
                        error: Some(error),
                    })
                }
            };
            lines.push(line);
        }
        self.print_lines(&lines)
    }

    /// Writes the textfile; a failure is counted and logged, never fatal.
    fn export(
        &mut self,
        rows: &[crate::model::aggregate::Row],
        drops: &[DropRow],
        stats: KernelStats,
        at: SystemTime,
    ) {
        let Some(dir) = self.settings.textfile_dir.clone() else {
            return;
        };
        let input = ExportInput {
            rows,
            drops,
            ifaces: &self.ifaces,
            stats,
            programs_attached: self.observer.programs_attached(),
            at,
            anomalies: &self.engine.active(),
            anomalies_raised: self.engine.raised(),
        };
        let families = self.exporter.families(&input);
        let result = textfile::encode(&families)
            .and_then(|text| textfile::write_atomic(&dir, TEXTFILE_NAME, &text));
        match result {
            Ok(path) => self.written = Some(path),
            Err(e) => {
                self.exporter.errors += 1;
                tracing::error!(
                    dir = %dir.display(),
                    error = %e,
                    errors = self.exporter.errors,
                    "cannot write the textfile; counting continues and the next interval retries"
                );
            }
        }
    }

    /// SIGHUP: re-reads the config file; applies what can change while
    /// attached and names what needs a restart.
    fn reload(&mut self) {
        let new = match Settings::load(self.args) {
            Ok(new) => new,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "reload failed; keeping the current settings");
                return;
            }
        };
        let fixed = self.settings.fixed_changes(&new);
        if !fixed.is_empty() {
            tracing::warn!(settings = %fixed.join(", "), "changed in the config file but need a restart; ignored");
        }
        if new.textfile_dir != self.settings.textfile_dir {
            self.remove_textfile();
        }
        self.exporter.set_max_peers(new.max_peers);
        self.engine.set_thresholds(new.thresholds);
        self.checks = NodeChecks::new(allow_set_config(&new), new.allow_set_refresh);
        self.settings = Settings {
            interfaces: self.settings.interfaces.clone(),
            xdp_mode: self.settings.xdp_mode,
            max_flows: self.settings.max_flows,
            ports: self.settings.ports.clone(),
            ..new
        };
        tracing::info!(
            interval = ?self.settings.interval,
            max_peers = self.settings.max_peers,
            textfile_dir = ?self.settings.textfile_dir,
            "settings reloaded"
        );
    }

    /// On a clean exit the textfile is removed: stale counters must not
    /// look current (the "observer not running" alert covers the gap).
    fn remove_textfile(&mut self) {
        if let Some(path) = self.written.take()
            && let Err(e) = std::fs::remove_file(&path)
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove the textfile");
        }
    }
}

/// Anomalies also go to the log, so a long-running attach leaves a trace
/// in the journal whatever the output format.
fn log_event(event: &Event) {
    match event {
        Event::Raised(a) => tracing::warn!(
            kind = a.kind.name(),
            peer = %a.peer,
            proto = a.proto.name(),
            "anomaly: {}",
            a.summary
        ),
        Event::Cleared { anomaly, duration } => tracing::info!(
            kind = anomaly.kind.name(),
            peer = %anomaly.peer,
            proto = anomaly.proto.name(),
            duration = %humantime::format_duration(std::time::Duration::from_secs(duration.as_secs())),
            "anomaly cleared"
        ),
    }
}

fn allow_set_config(settings: &Settings) -> AllowSetConfig {
    AllowSetConfig {
        sets: settings.allow_sets.clone(),
        cidrs: settings.allow_cidrs.clone(),
    }
}

/// `Ok(true)` when stdout's reader went away (`| head`): stop quietly,
/// detaching everything.
fn stop_on_closed_stdout(result: io::Result<()>) -> Result<bool> {
    match result {
        Ok(()) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(true),
        Err(e) => Err(e).context("writing output"),
    }
}

/// The `attach` line of `attachment`: its hooks, the program variants in
/// use and the kernel's fallbacks.
fn attach_line<'a>(
    observer: &'a Observer,
    attachment: &'a Attachment,
    program_ids: &'a [Option<u32>],
    at: SystemTime,
) -> AttachLine<'a> {
    let rx_hook = match attachment.rx {
        AttachedWith::XdpNative | AttachedWith::XdpGeneric => bpf::Hook::Xdp,
        AttachedWith::Tcx | AttachedWith::Clsact => bpf::Hook::TcIngress,
    };
    let drop_hook = observer.drop_hook();
    AttachLine {
        ts: lines::timestamp(at),
        iface: &attachment.iface,
        ifindex: attachment.ifindex,
        rx_hook: attachment.rx.to_string(),
        tx_hook: attachment.tx.to_string(),
        xdp_fallback_reason: attachment.xdp_fallback_reason.as_deref(),
        program_ids,
        drop_hook: match drop_hook {
            bpf::DropHook::Pending => "pending".to_string(),
            bpf::DropHook::Attached(_) => "tp_btf".to_string(),
            bpf::DropHook::Unavailable(why) => format!("unavailable: {why}"),
        },
        kernel: &observer.features().release,
        programs: ProgramNames {
            rx: observer.program_name(rx_hook),
            tx: observer.program_name(bpf::Hook::TcEgress),
            drops: match drop_hook {
                bpf::DropHook::Attached(name) => Some(name),
                _ => None,
            },
        },
        fallbacks: observer
            .plan()
            .fallbacks
            .iter()
            .map(|f| f.to_string())
            .collect(),
    }
}
