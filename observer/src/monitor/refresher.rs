//! The node-facts refresher: the facts behind the drop checks, refreshed
//! while attached:
//! allow-sets (mirrored into the programs) and the netfilter rule counters
//! the observer's own counts are compared with. (Local VNIs come with the
//! data-plane view, which `attach` already follows.)
//!
//! The first reads (before counting starts) and the rule counters' last
//! read (at exit) wait for the node's tools; the periodic ones in between run on a thread of
//! their own and are applied at the first interval after they finish, so
//! a slow or hung tool (nft or iptables waiting for the xtables lock that
//! Calico holds) never delays an interval.

use std::{
    collections::HashMap,
    sync::mpsc::{self, Receiver, SyncSender, TryRecvError},
    time::{Duration, Instant},
};

use anyhow::Result;
use observer_common::Proto;

use crate::{
    bpf::Observer,
    model::crosscheck::RuleReading,
    model::crosscheck::{NetfilterCheck, RuleTally},
    model::facts::{AllowSets, SetKind},
    model::rows::DropRow,
    model::rows::Row,
    model::rows::{self, DropId, KernelReasons, Stage},
    node::allowsets::{self, AllowSetConfig},
    node::netfilter::{self, RuleLocator},
    report::lines::AllowSetLine,
    report::view::iface_name,
};

/// Where allow-sets are mirrored: the programs' tries, or `observer
/// replay`'s native classifier.
pub trait AllowSetSink {
    /// Replaces the mirrored sets with `snapshot`'s.
    fn apply_allow_sets(&mut self, snapshot: &AllowSets) -> Result<()>;
}

impl AllowSetSink for Observer {
    fn apply_allow_sets(&mut self, snapshot: &AllowSets) -> Result<()> {
        Ok(Observer::apply_allow_sets(self, snapshot)?)
    }
}

/// Refresh state of the node-side checks.
pub struct FactsRefresher {
    config: AllowSetConfig,
    refresh: Duration,
    last_refresh: Option<Instant>,
    allow: Option<AllowSets>,
    /// Calico's drop-rule counters since attach.
    rule_tally: RuleTally,
    /// When the rule counters were last read (or asked for).
    last_rules_read: Option<Instant>,
    /// Where Calico's drop rules are (a copy goes with each periodic read,
    /// which sends back what it found).
    rule_locator: RuleLocator,
    reported_problems: Vec<String>,
    /// The thread running the periodic reads; started by the first one.
    reader: Option<ToolReader>,
    /// A periodic allow-set read that finished, not applied yet.
    ready_allow: Option<AllowSets>,
    /// A periodic rule-counter read that finished, not compared yet.
    ready_rules: Option<RulesRead>,
    /// The observer's drop rows when that read was asked for: the counters
    /// are compared with the drops of their own time, not of a later one.
    drops_when_asked: Vec<DropRow>,
}

/// The rule counters are read every this many allow-set refresh periods
/// (15 s by default): the cross-check compares totals since attach, so a
/// disagreement shows a few seconds later, and on a node with Calico's
/// nftables rules at scale each read costs nft 30 ms of CPU (it loads the
/// whole table).
const RULES_EVERY_REFRESHES: u32 = 3;

/// Calico's drop-rule counters as read, and the problems met reading them.
type RulesRead = (Vec<RuleReading>, Vec<String>);

/// What the reader thread is asked to read.
enum ReadRequest {
    AllowSets(AllowSetConfig),
    Rules(RuleLocator),
}

/// What it read.
enum ReadResult {
    AllowSets(AllowSets),
    Rules(RulesRead, RuleLocator),
}

/// The node's tools, run on a thread of their own: at most one request of
/// each kind in flight (bounded), results picked up without waiting. The
/// thread is in the network namespace of the thread that started it, and
/// ends when the [`ToolReader`] is dropped (after its current tool call,
/// which has its own timeout).
struct ToolReader {
    requests: SyncSender<ReadRequest>,
    results: Receiver<ReadResult>,
    allow_pending: bool,
    rules_pending: bool,
}

impl ToolReader {
    fn start() -> Result<ToolReader> {
        let (requests, inbox) = mpsc::sync_channel::<ReadRequest>(2);
        let (outbox, results) = mpsc::sync_channel::<ReadResult>(2);
        std::thread::Builder::new()
            .name("observer-tools".into())
            .spawn(move || {
                for request in inbox {
                    let result = match request {
                        ReadRequest::AllowSets(config) => {
                            ReadResult::AllowSets(allowsets::read(&config))
                        }
                        ReadRequest::Rules(mut locator) => {
                            let read = netfilter::read_calico_drop_rules(&mut locator);
                            ReadResult::Rules(read, locator)
                        }
                    };
                    if outbox.send(result).is_err() {
                        break;
                    }
                }
            })?;
        Ok(ToolReader {
            requests,
            results,
            allow_pending: false,
            rules_pending: false,
        })
    }
}

impl FactsRefresher {
    /// Checks with the allow-sets of `config`, re-read every `refresh`.
    pub fn new(config: AllowSetConfig, refresh: Duration) -> FactsRefresher {
        FactsRefresher {
            config,
            refresh,
            last_refresh: None,
            allow: None,
            rule_tally: RuleTally::default(),
            last_rules_read: None,
            rule_locator: RuleLocator::default(),
            reported_problems: Vec::new(),
            reader: None,
            ready_allow: None,
            ready_rules: None,
            drops_when_asked: Vec::new(),
        }
    }

    /// New allow-set names and refresh period (a reload): the sets are
    /// re-read at the next interval (on the reader thread); what was read,
    /// and the rule counts since attach, are kept.
    pub fn reconfigure(&mut self, config: AllowSetConfig, refresh: Duration) {
        self.config = config;
        self.refresh = refresh;
        self.last_refresh = None;
    }

    /// Sends `request` to the reader thread (started on first use); false
    /// when one of its kind is still running (or the thread is gone).
    fn ask(&mut self, request: ReadRequest) -> bool {
        if self.reader.is_none() {
            match ToolReader::start() {
                Ok(reader) => self.reader = Some(reader),
                Err(e) => {
                    self.warn_once(format!("cannot start the tool reader thread: {e:#}"));
                    return false;
                }
            }
        }
        let Some(reader) = self.reader.as_mut() else {
            return false;
        };
        let pending = match request {
            ReadRequest::AllowSets(_) => &mut reader.allow_pending,
            ReadRequest::Rules(_) => &mut reader.rules_pending,
        };
        if *pending {
            return false;
        }
        *pending = reader.requests.try_send(request).is_ok();
        *pending
    }

    /// Picks up what the reader thread finished.
    fn collect(&mut self) {
        let Some(reader) = self.reader.as_mut() else {
            return;
        };
        loop {
            match reader.results.try_recv() {
                Ok(ReadResult::AllowSets(sets)) => {
                    reader.allow_pending = false;
                    self.ready_allow = Some(sets);
                }
                Ok(ReadResult::Rules(read, locator)) => {
                    reader.rules_pending = false;
                    self.ready_rules = Some(read);
                    self.rule_locator = locator;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.reader = None;
                    break;
                }
            }
        }
    }

    /// Reads the allow-sets (the first time, waiting for the tools; then
    /// every refresh period, on the reader thread), mirrors changes into
    /// the programs, and returns a report per allow-set that changed (all
    /// of them on the first call).
    pub fn refresh<S: AllowSetSink + ?Sized>(
        &mut self,
        observer: &mut S,
    ) -> Result<Vec<AllowSetLine>> {
        if self.allow.is_none() {
            self.last_refresh = Some(Instant::now());
            let snapshot = allowsets::read(&self.config);
            return self.apply(observer, snapshot);
        }
        self.collect();
        let due = self
            .last_refresh
            .is_none_or(|at| at.elapsed() >= self.refresh);
        if due && self.ask(ReadRequest::AllowSets(self.config.clone())) {
            self.last_refresh = Some(Instant::now());
        }
        match self.ready_allow.take() {
            Some(snapshot) => self.apply(observer, snapshot),
            None => Ok(Vec::new()),
        }
    }

    /// Mirrors `snapshot` into the programs when it changed; the reports.
    /// A kind whose read failed part-way keeps its previous set: a tool
    /// that timed out must not switch the check off.
    fn apply<S: AllowSetSink + ?Sized>(
        &mut self,
        observer: &mut S,
        mut snapshot: AllowSets,
    ) -> Result<Vec<AllowSetLine>> {
        if let Some(previous) = &self.allow {
            snapshot.keep_incomplete_from(previous);
        }
        for problem in &snapshot.problems {
            self.warn_once(problem.clone());
        }
        let reports = changed_lines(self.allow.as_ref(), &self.config, &snapshot);
        if !reports.is_empty() {
            observer.apply_allow_sets(&snapshot)?;
        }
        self.allow = Some(snapshot);
        Ok(reports)
    }

    /// The allow-sets as last read (`None` before the first refresh).
    pub fn allow_sets(&self) -> Option<&AllowSets> {
        self.allow.as_ref()
    }

    fn warn_once(&mut self, problem: String) {
        if !self.reported_problems.contains(&problem) {
            tracing::warn!("{problem}");
            self.reported_problems.push(problem);
        }
    }

    /// Names of the sets guarding `proto`, for messages.
    pub fn allow_set_names(&self, proto: Proto) -> String {
        allow_set_names(self.allow.as_ref(), proto)
    }

    /// Drop rows with their reason and location named (the kernel's
    /// names) and the sentence to act on.
    pub fn drop_rows(
        &self,
        kernel: &KernelReasons,
        rows: Vec<Row<DropId>>,
        ifaces: &HashMap<u32, String>,
        location: impl Fn(u64) -> Option<String>,
    ) -> Vec<DropRow> {
        drop_rows(kernel, rows, self.allow.as_ref(), ifaces, location)
    }

    /// Calico's drop-rule counters since attach beside the observer's
    /// `calico_allow_set` counts, when a read is in: every
    /// [`RULES_EVERY_REFRESHES`] refresh periods (on the reader thread, like
    /// the allow-sets) and at the end
    /// (`is_final`, waiting for the tools), not every interval: each read
    /// runs iptables, ip6tables and nft (on the chains holding Calico's
    /// rules, see [`RuleLocator`]). `None` when no read finished. The
    /// first call (waiting for the tools) only takes the baseline.
    pub fn netfilter(&mut self, drops: &[DropRow], is_final: bool) -> Option<Vec<NetfilterCheck>> {
        if is_final || self.last_rules_read.is_none() {
            self.last_rules_read = Some(Instant::now());
            let read = netfilter::read_calico_drop_rules(&mut self.rule_locator);
            return Some(self.compare(read, drops));
        }
        self.collect();
        let checks = match self.ready_rules.take() {
            Some(read) => {
                let asked = std::mem::take(&mut self.drops_when_asked);
                Some(self.compare(read, &asked))
            }
            None => None,
        };
        let due = self
            .last_rules_read
            .is_none_or(|at| at.elapsed() >= self.refresh * RULES_EVERY_REFRESHES);
        if due && self.ask(ReadRequest::Rules(self.rule_locator.clone())) {
            self.last_rules_read = Some(Instant::now());
            self.drops_when_asked = drops.to_vec();
        }
        checks
    }

    fn compare(
        &mut self,
        (readings, problems): RulesRead,
        drops: &[DropRow],
    ) -> Vec<NetfilterCheck> {
        for problem in problems {
            self.warn_once(problem);
        }
        self.rule_tally.update(&readings, drops)
    }
}

/// Reads the allow-sets of `config` once, waiting for the node's tools,
/// mirrors them into `sink`, and returns them with a line per kind: what
/// `observer replay` needs, without a refresher or its thread.
pub fn read_allow_sets_once<S: AllowSetSink + ?Sized>(
    config: &AllowSetConfig,
    sink: &mut S,
) -> Result<(AllowSets, Vec<AllowSetLine>)> {
    let snapshot = allowsets::read(config);
    let mut warned: Vec<&String> = Vec::new();
    for problem in &snapshot.problems {
        if !warned.contains(&problem) {
            tracing::warn!("{problem}");
            warned.push(problem);
        }
    }
    let reports = changed_lines(None, config, &snapshot);
    if !reports.is_empty() {
        sink.apply_allow_sets(&snapshot)?;
    }
    Ok((snapshot, reports))
}

/// A line per kind of allow-set that `snapshot` changes from `previous`
/// (every kind when there is none).
fn changed_lines(
    previous: Option<&AllowSets>,
    config: &AllowSetConfig,
    snapshot: &AllowSets,
) -> Vec<AllowSetLine> {
    let mut reports = Vec::new();
    for kind in SetKind::ALL {
        let changed = previous.is_none_or(|old| old.get(kind) != snapshot.get(kind));
        if !changed {
            continue;
        }
        let set = snapshot.get(kind);
        let looked_for = allowsets::looked_for(config, kind);
        // When the node's sets were not read, the problem says so.
        if !set.active() && config.skip_node_sets.is_none() {
            tracing::warn!(
                proto = kind.name(),
                looked_for = %looked_for.join(", "),
                "no allow-set found (looked in ipset and nftables); {} sources are not checked",
                kind.name()
            );
        }
        reports.push(AllowSetLine {
            proto: kind.name(),
            active: set.active(),
            sources: set.sources.iter().map(ToString::to_string).collect(),
            prefixes: set.prefixes.len(),
            looked_for,
            problems: snapshot.problems.clone(),
        });
    }
    reports
}

/// Names of the sets of `allow` guarding `proto`, for messages.
fn allow_set_names(allow: Option<&AllowSets>, proto: Proto) -> String {
    // Only VXLAN and IPIP rows are calico_allow_set drops.
    let kind = SetKind::guarding(proto).unwrap_or(SetKind::Vxlan);
    let names: Vec<&str> = allow.map(|s| s.get(kind).set_names()).unwrap_or_default();
    if names.is_empty() {
        "the allow-set".to_string()
    } else {
        names.join(", ")
    }
}

/// Drop rows with their reason named (the kernel's names for kernel
/// reasons), the kernel function that freed them (`location`, see
/// `node::kallsyms`) and the sentence to act on, naming the sets of
/// `allow` and the interface from `ifaces`. Drops after decapsulation in
/// the receiving socket layer (`rows::socket_level`) are left out: those
/// packets reached their host.
pub fn drop_rows(
    kernel: &KernelReasons,
    rows: Vec<Row<DropId>>,
    allow: Option<&AllowSets>,
    ifaces: &HashMap<u32, String>,
    location: impl Fn(u64) -> Option<String>,
) -> Vec<DropRow> {
    rows.into_iter()
        .filter_map(|row| {
            let reason = row.id.reason_name(kernel);
            let location = location(row.id.location);
            if row.id.stage != Stage::Underlay && rows::socket_level(&reason, location.as_deref()) {
                return None;
            }
            let device = iface_name(ifaces, row.id.ifindex);
            let message = rows::message(
                &row.id,
                row.packets,
                &reason,
                &allow_set_names(allow, row.id.proto),
                &device,
                location.as_deref(),
            );
            let place = rows::place(&row.id, &device, location.as_deref());
            Some(DropRow {
                row,
                reason,
                location,
                place,
                message,
            })
        })
        .collect()
}
