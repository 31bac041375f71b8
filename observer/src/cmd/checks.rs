//! The node-side facts behind the drop checks, refreshed while attached:
//! allow-sets (mirrored into the programs) and the netfilter rule counters
//! the observer's own counts are compared with. (Local VNIs come with the
//! data-plane view, which `attach` already follows.)

use std::time::{Duration, Instant};

use anyhow::Result;
use observer_common::Proto;

use crate::{
    bpf::Observer,
    model::crosscheck::{NetfilterCheck, RuleTally},
    model::rows::DropRow,
    model::rows::Row,
    model::rows::{self, DropId},
    node::allowsets::{self, AllowSetConfig, AllowSets, SetKind},
    node::netfilter,
    report::lines::AllowSetLine,
};

/// Refresh state of the node-side checks.
pub struct NodeChecks {
    config: AllowSetConfig,
    refresh: Duration,
    last_refresh: Option<Instant>,
    allow: Option<AllowSets>,
    /// Calico's drop-rule counters since attach.
    rule_tally: RuleTally,
    /// When the rule counters were last read.
    last_rules_read: Option<Instant>,
    reported_problems: Vec<String>,
}

impl NodeChecks {
    /// Checks with the allow-sets of `config`, re-read every `refresh`.
    pub fn new(config: AllowSetConfig, refresh: Duration) -> NodeChecks {
        NodeChecks {
            config,
            refresh,
            last_refresh: None,
            allow: None,
            rule_tally: RuleTally::default(),
            last_rules_read: None,
            reported_problems: Vec::new(),
        }
    }

    /// Re-reads the allow-sets when a refresh is due, mirrors changes into
    /// the programs, and returns a report per allow-set that changed (all
    /// of them on the first call).
    pub fn refresh(&mut self, observer: &mut Observer) -> Result<Vec<AllowSetLine>> {
        if self
            .last_refresh
            .is_some_and(|at| at.elapsed() < self.refresh)
        {
            return Ok(Vec::new());
        }
        self.last_refresh = Some(Instant::now());

        let snapshot = allowsets::read(&self.config);
        for problem in &snapshot.problems {
            self.warn_once(problem.clone());
        }
        let mut reports = Vec::new();
        for kind in SetKind::ALL {
            let changed = self
                .allow
                .as_ref()
                .is_none_or(|old| old.get(kind) != snapshot.get(kind));
            if !changed {
                continue;
            }
            let set = snapshot.get(kind);
            let looked_for = allowsets::looked_for(&self.config, kind);
            if !set.active() {
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
        let kind = match proto {
            Proto::Ipip | Proto::Ip6ip => SetKind::Ipip,
            _ => SetKind::Vxlan,
        };
        let names: Vec<&str> = self
            .allow
            .as_ref()
            .map(|s| s.get(kind).set_names())
            .unwrap_or_default();
        if names.is_empty() {
            "the allow-set".to_string()
        } else {
            names.join(", ")
        }
    }

    /// Drop rows with their reason named (the kernel's names for kernel
    /// reasons) and the sentence to act on.
    pub fn drop_rows(&self, observer: &Observer, rows: Vec<Row<DropId>>) -> Vec<DropRow> {
        rows.into_iter()
            .map(|row| {
                let reason = row.id.reason_name(observer.kernel_reasons());
                let message = rows::message(
                    &row.id,
                    row.packets,
                    &reason,
                    &self.allow_set_names(row.id.proto),
                );
                DropRow {
                    row,
                    reason,
                    message,
                }
            })
            .collect()
    }

    /// Calico's drop-rule counters since attach beside the observer's
    /// `calico_allow_set` counts, when a read is due: every refresh period
    /// (like the allow-sets) and at the end (`is_final`), not every
    /// interval, because each read runs iptables-save, ip6tables-save and
    /// nft, whose cost grows with the node's rules. `None` when not due.
    /// The first call only takes the baseline.
    pub fn netfilter(&mut self, drops: &[DropRow], is_final: bool) -> Option<Vec<NetfilterCheck>> {
        let due = is_final
            || self
                .last_rules_read
                .is_none_or(|at| at.elapsed() >= self.refresh);
        if !due {
            return None;
        }
        self.last_rules_read = Some(Instant::now());
        Some(self.read_netfilter(drops))
    }

    fn read_netfilter(&mut self, drops: &[DropRow]) -> Vec<NetfilterCheck> {
        let (readings, problems) = netfilter::read_calico_drop_rules();
        for problem in problems {
            self.warn_once(problem);
        }
        self.rule_tally.update(&readings, drops)
    }
}
