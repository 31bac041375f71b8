//! The engine the commands drive: [`Monitor`] loads, attaches, then every
//! interval reads, aggregates, judges, prints and exports, until the
//! driver stops (start, then wait and tick until the last interval, then
//! finish). It follows interfaces that are deleted and re-created, and
//! reloads settings on SIGHUP. Beside it: the node-facts refresher
//! (`refresher`), the BGP follower (`bgp`), the probe engine and its
//! worker thread (`probe`, `probing`). `attach`, `diagnose` and the benches
//! drive it.

pub mod bgp;
pub mod evidence;
pub mod probe;
pub mod probing;
pub mod refresher;
pub mod serve;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io::{self, IsTerminal, Write},
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result, bail};
use tokio::{
    runtime::Runtime,
    signal::unix::{Signal, SignalKind, signal},
};

use crate::{
    bpf::{self, InterfaceEvent, LoadConfig, Observer, maps::MapRead},
    cli::AttachArgs,
    cli::settings::Settings,
    model::after_decap::{self, BlockOwners, DevicePatterns, WatchedDevice},
    model::aggregate::{Aggregator, DropAggregator},
    model::anomalies::{Anomaly, Engine, Event, Known},
    model::bgp_wire::{WireRow, WireTracker},
    model::cluster::NodeIdentity,
    model::crosscheck::NetfilterCheck,
    model::hooks::{AttachedWith, Attachment},
    model::probe::Run,
    model::routes::{Outage, RouteTracker},
    model::rows::Row,
    model::rows::{DropRow, KernelStats},
    monitor::bgp::{BgpFollower, SocketStatus},
    monitor::probing::ProbeWorker,
    monitor::refresher::FactsRefresher,
    node::allowsets::AllowSetConfig,
    node::dataplane::{ChangeWatcher, LiveView},
    node::kallsyms::KernelSymbols,
    node::preflight,
    process::privileges,
    report::textfile::{self, ExportInput, Exporter, TEXTFILE_NAME},
    report::{
        self, Format, Line,
        lines::{
            self, AllowSetLine, AttachLine, BgpLine, BirdSocketLine, DataplaneLine, InterfaceLine,
            ProgramNames, RouteOutageLine, RoutesLine,
        },
        table,
        view::{Snapshot, timestamp},
    },
};

/// Userspace rows kept per kernel flow-map entry: rows outlive evicted
/// kernel keys so totals stay monotonic, within this bound.
const ROWS_PER_FLOW: usize = 4;

/// How long [`Monitor::finish`] waits for `diagnose --probe`'s run when it
/// has not ended with the watch (probe's bounds keep a run of a few dozen
/// peers well within it).
const PROBE_WAIT: Duration = Duration::from_secs(120);

/// How a [`Monitor`] runs; the command that drives it chooses.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Output format.
    pub format: Format,
    /// Whether the run prints on stdout: the attach lines, then what every
    /// interval read (JSON lines, or the table). Without it the run reads,
    /// exports and logs only.
    pub print: bool,
    /// How long the run lasts; `None`: until a signal.
    pub duration: Option<Duration>,
    /// Probe the peers once, at the start (`diagnose --probe`);
    /// [`Monitor::finish`] waits for that run.
    pub probe_once: bool,
}

/// What one interval read, as [`Monitor::tick`] returns it (after printing
/// it). Borrows the monitor until the next interval.
#[derive(Debug)]
pub struct Interval<'m> {
    /// Rows of this read (totals since attach; `changed` this interval).
    pub rows: Vec<Row>,
    /// Drop rows of this read.
    pub drops: Vec<DropRow>,
    /// The latest netfilter cross-check (counters are read every refresh
    /// period, not every interval).
    pub netfilter: Vec<NetfilterCheck>,
    /// Anomalies raised or cleared by this read.
    pub events: Vec<Event>,
    /// Anomalies active after this read.
    pub active: Vec<&'m Anomaly>,
    /// Route outages of pod blocks that ended in this read.
    pub route_outages: Vec<Outage>,
}

/// What one interval read, as the textfile exports it.
struct Read<'r> {
    rows: &'r [Row],
    drops: &'r [DropRow],
    bgp_wire: &'r [WireRow],
    events: &'r [Event],
    route_outages: &'r [Outage],
    probe_runs: &'r [Run],
}

/// What a finished run leaves, as [`Monitor::finish`] returns it.
#[derive(Debug, Default)]
pub struct Finished {
    /// Interfaces watched.
    pub interfaces: Vec<String>,
    /// What the node knew at the end.
    pub known: Known,
    /// How long it ran.
    pub seconds: f64,
    /// The probe run of [`Options::probe_once`], or why there is none.
    pub probe: Option<Result<Run, String>>,
}

/// The signals the run reacts to.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

/// What wakes a waiting run.
enum Wake {
    /// The next interval is due.
    Tick,
    /// A signal or the end of `--duration`: the last interval.
    Stop,
    /// SIGHUP: reload the settings.
    Hangup,
}

/// When the run reads next and when it stops.
struct Clock {
    signals: Signals,
    ticker: tokio::time::Interval,
    /// Period of `ticker`.
    period: Duration,
    deadline: Option<tokio::time::Instant>,
    /// When the last interval was read (or counting started).
    last: Instant,
    /// Intervals that woke a whole period or more after they were due.
    late: u64,
}

impl Clock {
    /// A clock whose first interval is due one `period` from now, without
    /// an end.
    fn new(runtime: &Runtime, signals: Signals, period: Duration) -> Clock {
        let _guard = runtime.enter();
        Clock {
            signals,
            ticker: ticker(period),
            period,
            deadline: None,
            last: Instant::now(),
            late: 0,
        }
    }

    /// Counting starts now: the first interval is due one period later,
    /// the run ends `duration` later.
    fn restart(&mut self, runtime: &Runtime, duration: Option<Duration>) {
        let _guard = runtime.enter();
        let now = tokio::time::Instant::now();
        self.ticker = ticker(self.period);
        self.deadline = duration.map(|d| now + d);
        self.last = Instant::now();
    }

    /// A new period (a reload): the next interval is due one `period` from
    /// now.
    fn set_period(&mut self, runtime: &Runtime, period: Duration) {
        let _guard = runtime.enter();
        self.period = period;
        self.ticker = ticker(period);
    }

    async fn next(&mut self) -> Wake {
        let deadline = self.deadline;
        tokio::select! {
            due = self.ticker.tick() => {
                // The ticker delays missed ticks (the process was stopped
                // or starved, or an interval took longer than the period):
                // such a tick fires at once, long after it was due.
                if due.elapsed() >= self.period {
                    self.late += 1;
                }
                Wake::Tick
            }
            _ = self.signals.interrupt.recv() => Wake::Stop,
            _ = self.signals.terminate.recv() => Wake::Stop,
            _ = self.signals.hangup.recv() => Wake::Hangup,
            _ = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => Wake::Stop,
        }
    }
}

/// A ticker whose first tick is one `period` from now; needs the
/// runtime's context.
fn ticker(period: Duration) -> tokio::time::Interval {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker
}

/// A running attach: loaded and attached by [`Monitor::start`]; every
/// [`Monitor::wait`] then [`Monitor::tick`] reads, exports, logs and (with
/// [`Options::print`]) prints an interval; [`Monitor::finish`] or a drop
/// detaches and removes the textfile.
pub struct Monitor<'a> {
    observer: Observer,
    args: &'a AttachArgs,
    settings: Settings,
    format: Format,
    print: bool,
    aggregator: Aggregator,
    drop_aggregator: DropAggregator,
    checks: FactsRefresher,
    exporter: Exporter,
    /// Interface names by index, old indexes included (rows keep them).
    ifaces: HashMap<u32, String>,
    /// The text `--metrics-listen` serves, when it does.
    served: Option<serve::Latest>,
    /// Where the textfile was last written, to remove it on exit.
    written: Option<PathBuf>,
    /// The textfile directory last checked for other users' write
    /// access, so the warning is given once per directory.
    checked_dir: Option<PathBuf>,
    engine: Engine,
    /// When counting started; the engine's clock.
    started: Instant,
    /// The node's data plane, re-read when netlink reports a change.
    dataplane: LiveView,
    /// The VNIs of this node's vxlan devices as last written into the
    /// programs (from the data-plane view).
    local_vnis: Vec<u32>,
    /// What the anomaly rules know of the peers: rebuilt when the data
    /// plane or the allow-sets change.
    known: Known,
    /// This node's name and underlay addresses (from the data-plane
    /// view), exported as the `node` label and observer_node_info.
    node: NodeIdentity,
    /// The latest netfilter cross-check (read every refresh period).
    netfilter: Vec<NetfilterCheck>,
    /// The BGP sessions of the node's BIRD.
    bgp: BgpFollower,
    /// The pod blocks' routes over time (from the data-plane view).
    routes: RouteTracker,
    /// What is watched after decapsulation, as written into the programs.
    after_decap: AfterDecap,
    /// Names the kernel functions that dropped packets.
    symbols: KernelSymbols,
    /// BGP at the wire (the programs' TCP/179 counters) over time.
    wire: WireTracker,
    /// The probing thread (`--probe-interval`, `diagnose --probe`).
    prober: Option<ProbeWorker>,
    /// Its latest run.
    probe_latest: Option<Run>,
    /// Whether [`Monitor::finish`] waits for the one probe run.
    probe_once: bool,
    /// Evidence capture (`--capture-dir`).
    capture: Option<evidence::Capture>,
    clock: Clock,
    // Last: the timers and signals above go before the runtime.
    runtime: Runtime,
}

/// The devices watched after decapsulation and the owners of the pod
/// blocks, as written into the programs.
#[derive(Default)]
struct AfterDecap {
    /// Watched devices by index (`--after-decap`).
    watched: BTreeMap<u32, WatchedDevice>,
    /// The node of each pod block.
    owners: BlockOwners,
}

impl AfterDecap {
    /// Writes what changed in `view` into the programs: the block owners,
    /// then the devices (so a device's first drop finds its blocks); names
    /// the devices in `names`.
    fn follow(
        &mut self,
        observer: &mut Observer,
        view: &crate::model::dataplane::DataPlane,
        patterns: &DevicePatterns,
        attached: &BTreeSet<u32>,
        names: &mut HashMap<u32, String>,
    ) -> Result<()> {
        let wanted = after_decap::watched_devices(view, patterns, attached);
        if self.owners.update(&view.blocks) {
            observer.set_block_peers(&self.owners.entries())?;
        }
        for (ifindex, device) in &self.watched {
            if wanted.get(ifindex) != Some(device) {
                observer.unwatch_after_decap(*ifindex);
            }
        }
        for (ifindex, device) in &wanted {
            if self.watched.get(ifindex) != Some(device) {
                observer.watch_after_decap(*ifindex, device.stage.to_u8())?;
                tracing::info!(device = %device.name, stage = %device.stage, "counting drops after decapsulation");
            }
            names.insert(*ifindex, device.name.clone());
        }
        self.watched = wanted;
        Ok(())
    }
}

impl<'a> Monitor<'a> {
    /// Loads and attaches in the current network namespace, prints the
    /// attach lines, reads the allow-sets and the data plane; the first
    /// interval is due one `interval` later.
    pub fn start(args: &'a AttachArgs, options: Options) -> Result<Monitor<'a>> {
        let settings = Settings::load(args)?;
        preflight::check_privileges()?;
        preflight::check_btf(std::path::Path::new(preflight::KERNEL_BTF))?;
        let mut seen = std::collections::HashSet::new();
        let mut interfaces = Vec::with_capacity(settings.interfaces.len());
        for iface in &settings.interfaces {
            if !seen.insert(iface) {
                bail!("interface {iface} is given twice");
            }
            interfaces.push(
                bpf::Interface::resolve(iface).with_context(|| match &args.netns {
                    Some(ns) => format!("in network namespace {ns}"),
                    None => "in the current network namespace".to_string(),
                })?,
            );
        }

        let mut observer = Observer::load(&LoadConfig {
            max_flows: settings.max_flows,
            ports: settings.ports.clone(),
            defer_tc_ingress: true,
        })?;
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
                interrupt: signal(SignalKind::interrupt())
                    .context("installing the SIGINT handler")?,
                terminate: signal(SignalKind::terminate())
                    .context("installing the SIGTERM handler")?,
                hangup: signal(SignalKind::hangup()).context("installing the SIGHUP handler")?,
            }
        };
        let metrics_listener = settings.metrics_listen.map(serve::bind).transpose()?;
        // Drops after decapsulation are watched before the first attach
        // line: what arrives once a script sees it is counted whole. The
        // live view follows changes from the first interval on.
        let mut after_decap = AfterDecap::default();
        let mut early_names = HashMap::new();
        match crate::node::dataplane::read_declaring(&settings.tunnel_devices) {
            Ok(view) => {
                let attached = interfaces.iter().map(|i| i.ifindex).collect();
                after_decap.follow(
                    &mut observer,
                    &view,
                    &settings.after_decap,
                    &attached,
                    &mut early_names,
                )?;
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "data plane unreadable: drops after decapsulation are watched from the first interval")
            }
        }
        // Before the first attach: what is flagged once a script sees the
        // attach line is captured.
        let capture = settings
            .capture
            .as_ref()
            .map(|capture| evidence::Capture::start(&mut observer, capture, settings.interval))
            .transpose()?;
        // Attached paused, then counted from one instant: received and
        // sent packets alike (`config::PAUSED`).
        observer.set_counting(false)?;
        for iface in &interfaces {
            observer.attach(iface, settings.xdp_mode)?;
        }
        observer.set_counting(true)?;
        let program_ids = observer.program_ids()?;
        for attachment in observer.attachments() {
            tracing::info!(
                iface = %attachment.iface,
                rx = %attachment.rx,
                tx = %attachment.tx,
                "attached"
            );
            if options.print && options.format == Format::Json {
                let line = attach_line(&observer, attachment, &program_ids, SystemTime::now());
                report::write_line(&mut io::stdout(), &Line::Attach(line))
                    .context("writing output")?;
            }
        }
        // Opened while CAP_SYSLOG may still be held (see node::kallsyms).
        let symbols = KernelSymbols::open();
        // Loaded and attached: from here on the run needs only a few
        // capabilities. Before the threads below start, which inherit them.
        if let Some(root) = &settings.host_root {
            crate::node::tools::run_in_host_root(root)?;
        }
        privileges::drop_to_steady_state(privileges::Needs {
            host_root: settings.host_root.is_some(),
            may_load: observer.may_load_on_reattach(),
            foreign_output_dir: settings
                .textfile_dir
                .as_deref()
                .into_iter()
                .chain(settings.capture.as_ref().map(|c| c.dir.as_path()))
                .any(privileges::needs_dac_override),
        })?;

        let served = match metrics_listener {
            Some(listener) => {
                let latest = serve::Latest::default();
                serve::serve(listener, latest.clone())?;
                Some(latest)
            }
            None => None,
        };

        let max_rows = (settings.max_flows as usize).saturating_mul(ROWS_PER_FLOW);
        let settings_thresholds = settings.thresholds;
        let settings_tunnels = settings.tunnel_devices.clone();
        let settings_ports = settings.ports.clone();
        let settings_bird_sockets = settings.bird_sockets.clone();
        let settings_node_name = settings.node_name.clone();
        let settings_interval = settings.interval;
        let prober = if options.probe_once || settings.probe_interval.is_some() {
            let every = settings.probe_interval.filter(|_| !options.probe_once);
            Some(ProbeWorker::start(
                settings.tunnel_devices.clone(),
                probe::Settings::default(),
                every,
            )?)
        } else {
            None
        };
        let checks = FactsRefresher::new(allow_set_config(&settings), settings.allow_set_refresh);
        let mut ifaces: HashMap<u32, String> = observer
            .attachments()
            .iter()
            .map(|a| (a.ifindex, a.iface.clone()))
            .collect();
        ifaces.extend(early_names);
        let clock = Clock::new(&runtime, signals, settings.interval);
        let mut monitor = Monitor {
            observer,
            args,
            exporter: Exporter::new(settings.max_peers),
            settings,
            format: options.format,
            print: options.print,
            aggregator: Aggregator::new(max_rows),
            drop_aggregator: DropAggregator::new(max_rows),
            checks,
            ifaces,
            written: None,
            served,
            checked_dir: None,
            engine: Engine::new(settings_thresholds, 0.0),
            started: Instant::now(),
            dataplane: LiveView::new(settings_tunnels, ChangeWatcher::new()),
            local_vnis: Vec::new(),
            known: Known {
                ports: settings_ports,
                ..Known::default()
            },
            node: NodeIdentity {
                name: settings_node_name,
                addresses: BTreeSet::new(),
            },
            netfilter: Vec::new(),
            bgp: BgpFollower::start(settings_bird_sockets, settings_interval),
            routes: RouteTracker::default(),
            after_decap,
            symbols,
            wire: WireTracker::default(),
            prober,
            probe_latest: None,
            probe_once: options.probe_once,
            capture,
            clock,
            runtime,
        };

        let reports = monitor.refresh_allow_sets()?;
        monitor
            .print_allow_sets(&reports)
            .context("writing output")?;
        monitor.refresh_dataplane(0.0)?;
        // Baseline of the netfilter counters: the comparison is since attach.
        monitor.checks.netfilter(&[], true);
        monitor.clock.restart(&monitor.runtime, options.duration);
        Ok(monitor)
    }

    /// Waits for the next interval; true when it is the last one (a
    /// signal, or the end of [`Options::duration`]). SIGHUP reloads the
    /// settings meanwhile.
    pub fn wait(&mut self) -> bool {
        loop {
            match self.runtime.block_on(self.clock.next()) {
                Wake::Tick => return false,
                Wake::Stop => return true,
                Wake::Hangup => {
                    self.reload();
                    if self.settings.interval != self.clock.period {
                        self.clock.set_period(&self.runtime, self.settings.interval);
                    }
                }
            }
        }
    }

    /// Ends the run: detaches everything and removes the textfile.
    pub fn finish(mut self) -> Finished {
        self.remove_textfile();
        if let Some(capture) = self.capture.take() {
            capture.finish(evidence::Names {
                ifaces: &self.ifaces,
                kernel: self.observer.kernel_reasons(),
                symbols: &mut self.symbols,
            });
        }
        let seconds = self.started.elapsed().as_secs_f64();
        let probe = match (self.probe_once, self.probe_latest.take(), &mut self.prober) {
            (false, _, _) => None,
            (true, Some(run), _) => Some(Ok(run)),
            (true, None, Some(prober)) => Some(match prober.last_error() {
                Some(error) => Err(error.to_string()),
                None => prober.wait(PROBE_WAIT),
            }),
            (true, None, None) => None,
        };
        Finished {
            interfaces: self.settings.interfaces.clone(),
            known: std::mem::take(&mut self.known),
            seconds,
            probe,
        }
        // Dropping the observer closes the links: everything is detached.
    }

    /// Re-reads the allow-sets when due; `known` follows when they changed
    /// (it is rebuilt on change, not every interval). Returns the reports.
    fn refresh_allow_sets(&mut self) -> Result<Vec<AllowSetLine>> {
        let reports = self.checks.refresh(&mut self.observer)?;
        if !reports.is_empty() {
            self.known.allow = self.checks.allow_sets().cloned();
        }
        Ok(reports)
    }

    /// Re-reads the data plane when netlink says it changed, printing the
    /// new view as a JSON line, writing this node's VNIs into the programs
    /// and following its block routes (`now` on the engine's clock);
    /// returns the route outages that ended.
    fn refresh_dataplane(&mut self, now: f64) -> Result<Vec<Outage>> {
        if !self.dataplane.refresh() {
            // Between views only time moves: blocks missing too long go.
            if self.routes.expire(now) {
                self.known.missing_blocks = self.routes.missing();
            }
            return Ok(Vec::new());
        }
        let Some(view) = self.dataplane.view() else {
            return Ok(Vec::new());
        };
        let expected_peers = view.expected_peers();
        let local = view.local_addresses();
        let vnis = view.vxlan_vnis();
        let line = DataplaneLine {
            ts: timestamp(SystemTime::now()),
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
        self.print_lines(&[Line::Dataplane(line)])
            .context("writing output")?;
        self.known.nodes = expected_peers;
        self.known.local = local;
        self.node.addresses = view.underlay_addresses();
        // vni_unknown checks VXLAN packets against this node's own VNIs;
        // with no vxlan device the check is off.
        if self.local_vnis != vnis {
            self.observer.apply_local_vnis(&vnis)?;
            self.local_vnis = vnis;
        }
        self.refresh_after_decap()?;
        self.refresh_routes(now).context("writing output")
    }

    /// Follows the devices watched after decapsulation and the owners of
    /// the pod blocks in a new data-plane view.
    fn refresh_after_decap(&mut self) -> Result<()> {
        let Some(view) = self.dataplane.view() else {
            return Ok(());
        };
        let attached: BTreeSet<u32> = self
            .observer
            .attachments()
            .iter()
            .map(|a| a.ifindex)
            .collect();
        self.after_decap.follow(
            &mut self.observer,
            view,
            &self.settings.after_decap,
            &attached,
            &mut self.ifaces,
        )
    }

    /// Takes the latest BGP readings into `known` (for `bgp_down`); prints
    /// sockets whose status changed and sessions that changed (every
    /// session when `is_final`), and logs each socket status once.
    fn refresh_bgp(&mut self, is_final: bool) -> io::Result<()> {
        let changes = self.bgp.refresh();
        // Every change of a session is in `changes`: the copy in `known`
        // is renewed only then, not every interval.
        if !changes.sessions.is_empty() || !changes.removed.is_empty() {
            self.known.bgp = self.bgp.sessions();
        }
        let ts = timestamp(SystemTime::now());
        let mut out = Vec::new();
        for (socket, status) in &changes.sockets {
            match status {
                SocketStatus::Ok(sessions) => {
                    tracing::info!(socket, sessions, "reading BGP sessions from BIRD")
                }
                SocketStatus::Absent => {
                    tracing::info!(
                        socket,
                        "no BIRD control socket there; BGP sessions are not followed from it"
                    )
                }
                SocketStatus::Failed(error) => {
                    tracing::warn!(
                        socket,
                        error,
                        "cannot read BIRD; its sessions are Unknown until it answers"
                    )
                }
            }
            out.push(Line::BirdSocket(BirdSocketLine {
                ts: ts.clone(),
                socket,
                status: status.name(),
                sessions: match status {
                    SocketStatus::Ok(n) => *n,
                    _ => 0,
                },
                error: match status {
                    SocketStatus::Failed(e) => Some(e),
                    _ => None,
                },
            }));
        }
        let sessions = if is_final {
            &self.known.bgp
        } else {
            &changes.sessions
        };
        let removed = changes.removed.iter().map(|session| (session, true));
        out.extend(
            sessions
                .iter()
                .map(|session| (session, false))
                .chain(removed)
                .map(|(session, removed)| {
                    Line::Bgp(BgpLine {
                        ts: ts.clone(),
                        session,
                        removed,
                    })
                }),
        );
        self.print_lines(&out)
    }

    /// Follows the pod blocks' routes of a new view: `known` learns the
    /// routes and the blocks missing now; prints what changed and the
    /// outages that ended, and returns those.
    fn refresh_routes(&mut self, now: f64) -> io::Result<Vec<Outage>> {
        let Some(view) = self.dataplane.view() else {
            return Ok(Vec::new());
        };
        let changes = self.routes.update(now, &view.blocks);
        self.known.missing_blocks = self.routes.missing();
        let ts = timestamp(SystemTime::now());
        let mut out = Vec::new();
        if !changes.changed.is_empty() || !changes.withdrawn.is_empty() {
            self.known.blocks.clone_from(&view.blocks);
            tracing::info!(
                changed = changes.changed.len(),
                withdrawn = changes.withdrawn.len(),
                missing = self.known.missing_blocks.len(),
                "pod block routes changed"
            );
            out.push(Line::Routes(RoutesLine {
                ts: ts.clone(),
                blocks: &changes.changed,
                withdrawn: &changes.withdrawn,
                routed: view.blocks.len(),
                missing: self.known.missing_blocks.len(),
                forgotten: self.routes.forgotten(),
            }));
        }
        for outage in &changes.outages {
            tracing::info!(
                block = %outage.block,
                node = %outage.node,
                seconds = outage.duration_s,
                "pod block routed again"
            );
            out.push(Line::RouteOutage(RouteOutageLine {
                ts: ts.clone(),
                outage,
            }));
        }
        self.print_lines(&out)?;
        Ok(changes.outages)
    }

    /// Prints JSON lines (nothing in table mode or without printing).
    fn print_lines(&self, lines: &[Line<'_>]) -> io::Result<()> {
        if !self.print || self.format != Format::Json || lines.is_empty() {
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

    /// One interval: follow interfaces, refresh node facts, read, print,
    /// export. `is_final` after [`Monitor::wait`] said so: every row is
    /// printed and the netfilter counters are read.
    pub fn tick(&mut self, is_final: bool) -> Result<Interval<'_>> {
        let seconds = self.clock.last.elapsed().as_secs_f64();
        let events = self.observer.follow_interfaces();
        self.report_interface_events(&events)
            .context("writing output")?;
        let reports = self.refresh_allow_sets()?;
        // One clock reading for the routes and the engine: an outage and
        // the route_missing it raised count from the same instant.
        let now = self.started.elapsed().as_secs_f64();
        let route_outages = self.refresh_dataplane(now)?;
        self.refresh_bgp(is_final).context("writing output")?;
        // Rows go into the aggregator as the map is read: at 100,000 flows
        // a table of the read would be 10 MiB per interval.
        self.aggregator.begin_read();
        let aggregator = &mut self.aggregator;
        let map_entries = self
            .observer
            .for_each_flow(MapRead::Batch, |id, counters| aggregator.add(id, counters))?;
        self.aggregator.end_read();
        self.drop_aggregator.update(&self.observer.read_drops()?);
        if let Some(capture) = &mut self.capture {
            // The last interval's counters and files agree: nothing is
            // sent after the switch, and the drain below reads the rest.
            if is_final && let Err(e) = self.observer.stop_evidence() {
                tracing::warn!(error = %e, "switching evidence capture off");
            }
            capture.drain(evidence::Names {
                ifaces: &self.ifaces,
                kernel: self.observer.kernel_reasons(),
                symbols: &mut self.symbols,
            });
        }
        let bgp_wire = self.refresh_bgp_wire(now)?;
        let rows = self.aggregator.finish_interval(seconds);
        let drop_rows = self.drop_aggregator.finish_interval(seconds);
        self.symbols
            .resolve(drop_rows.iter().map(|r| r.id.location));
        let symbols = &self.symbols;
        let drop_rows = self.checks.drop_rows(
            self.observer.kernel_reasons(),
            drop_rows,
            &self.ifaces,
            |addr| symbols.name(addr),
        );
        // Netfilter lines are printed when the counters were read; the
        // table and the diagnosis keep the latest comparison.
        let fresh_netfilter = self.checks.netfilter(&drop_rows, is_final);
        if let Some(checks) = &fresh_netfilter {
            self.netfilter = checks.clone();
        }
        let stats = self.observer.stats_for(map_entries)?;
        let probe_runs = self
            .prober
            .as_mut()
            .map(ProbeWorker::take)
            .unwrap_or_default();
        if let Some(latest) = probe_runs.last() {
            self.probe_latest = Some(latest.clone());
        }
        let at = SystemTime::now();
        let events = self.engine.observe(now, at, &rows, &drop_rows, &self.known);
        for event in &events {
            log_event(event);
        }
        self.export(
            &Read {
                rows: &rows,
                drops: &drop_rows,
                bgp_wire: &bgp_wire,
                events: &events,
                route_outages: &route_outages,
                probe_runs: &probe_runs,
            },
            stats,
            at,
        );
        let active = self.engine.active();
        if self.print {
            let snapshot = Snapshot {
                rows: &rows,
                stats,
                rows_forgotten: self.aggregator.forgotten_rows(),
                late_intervals: self.clock.late,
                netlink_overruns: self.dataplane.overruns(),
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
                bgp: &self.known.bgp,
                bgp_wire: &bgp_wire,
                evidence: self.capture.as_ref().map(evidence::Capture::counts),
            };
            self.print_allow_sets(&reports)
                .and_then(|()| {
                    let mut out = io::stdout().lock();
                    match self.format {
                        // diagnose prints its one run with the write-up.
                        Format::Json => probe_runs
                            .iter()
                            .filter(|_| !self.probe_once)
                            .try_for_each(|run| report::probe::write_json(&mut out, run))
                            .and_then(|()| lines::write_json(&mut out, &snapshot)),
                        Format::Table => table::write_table(
                            &mut out,
                            &snapshot,
                            io::stdout().is_terminal() && !is_final,
                        ),
                    }
                })
                .context("writing output")?;
        }
        self.clock.last = Instant::now();
        Ok(Interval {
            rows,
            drops: drop_rows,
            netfilter: self.netfilter.clone(),
            events,
            active,
            route_outages,
        })
    }

    fn report_interface_events(&mut self, events: &[InterfaceEvent]) -> io::Result<()> {
        let mut lines = Vec::new();
        for event in events {
            let ts = timestamp(SystemTime::now());
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

    /// Reads BGP at the wire; `known` learns what it says of each peer's
    /// session when something moved.
    fn refresh_bgp_wire(&mut self, now: f64) -> Result<Vec<WireRow>> {
        let rows = self.wire.update(now, &self.observer.read_bgp_wire()?);
        if rows.iter().any(|r| r.changed) || self.known.bgp_wire.len() != self.wire.peers().len() {
            self.known.bgp_wire.clone_from(self.wire.peers());
        }
        Ok(rows)
    }

    /// Writes the textfile and hands the text to `--metrics-listen`; a
    /// failed write is counted and logged, never fatal.
    fn export(&mut self, read: &Read<'_>, stats: KernelStats, at: SystemTime) {
        let dir = self.settings.textfile_dir.clone();
        if dir.is_none() && self.served.is_none() {
            return;
        }
        if let Some(dir) = &dir
            && self.checked_dir.as_ref() != Some(dir)
            && let Ok(warning) = textfile::shared_dir_warning(dir)
        {
            if let Some(warning) = warning {
                tracing::warn!("{warning}");
            }
            self.checked_dir = Some(dir.clone());
        }
        let input = ExportInput {
            rows: read.rows,
            drops: read.drops,
            ifaces: &self.ifaces,
            stats,
            programs_attached: self.observer.programs_attached(),
            late_intervals: self.clock.late,
            netlink_overruns: self.dataplane.overruns(),
            at,
            anomalies: &self.engine.active(),
            anomalies_raised: self.engine.raised(),
            bgp: &self.known.bgp,
            bgp_wire: read.bgp_wire,
            bird_sockets: &self.bgp.socket_status(),
            events: read.events,
            route_outages: read.route_outages,
            blocks_missing: self.known.missing_blocks.len(),
            probe_runs: read.probe_runs,
            probe_latest: self.probe_latest.as_ref(),
            node: &self.node,
            evidence: self.capture.as_ref().map(evidence::Capture::counts),
        };
        let families = self.exporter.families(&input);
        let text = match textfile::encode(&families) {
            Ok(text) => text,
            Err(e) => {
                self.exporter.errors += 1;
                tracing::error!(error = %e, "cannot encode the metrics");
                return;
            }
        };
        if let Some(served) = &self.served {
            served.set(text.clone());
        }
        let Some(dir) = dir else { return };
        let result = textfile::write_atomic(&dir, TEXTFILE_NAME, &text);
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
        self.node.name = new.node_name.clone();
        self.engine.set_thresholds(new.thresholds);
        self.checks
            .reconfigure(allow_set_config(&new), new.allow_set_refresh);
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

impl Drop for Monitor<'_> {
    /// Also when a run ends early (an error, a closed stdout).
    fn drop(&mut self) {
        self.remove_textfile();
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
        skip_node_sets: None,
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
        ts: timestamp(at),
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
