//! The node-side facts behind the drop checks, refreshed while attached:
//! allow-sets (mirrored into the programs), local VNIs, and the netfilter
//! rule counters the observer's own counts are compared with.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::Result;
use observer_common::{ClassifierDrop, Proto};

use crate::{
    bpf::Observer,
    model::aggregate::Row,
    model::crosscheck::{NetfilterCheck, fold_rule_counter},
    model::rows::DropRow,
    model::rows::{self, DropId, Origin},
    node::allowsets::{self, AllowSetConfig, SetKind, Snapshot},
    node::localnet,
    node::netfilter,
    report::lines::AllowSetLine,
};

/// A netfilter rule: (backend, comment).
type RuleId = (&'static str, String);

/// Refresh state of the node-side checks.
pub struct NodeChecks {
    config: AllowSetConfig,
    refresh: Duration,
    last_refresh: Option<Instant>,
    allow: Option<Snapshot>,
    vnis: Option<Vec<u32>>,
    /// Per rule (backend, comment): the last counter read and the packets
    /// matched since attach. Summing differences keeps the count right when
    /// Calico re-creates a rule (its counter restarts at zero).
    rule_counts: Option<HashMap<RuleId, (u64, u64)>>,
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
            vnis: None,
            rule_counts: None,
            last_rules_read: None,
            reported_problems: Vec::new(),
        }
    }

    /// Re-reads allow-sets and local VNIs when a refresh is due, mirrors
    /// changes into the programs, and returns a report per allow-set that
    /// changed (all of them on the first call).
    pub fn refresh(&mut self, observer: &mut Observer) -> Result<Vec<AllowSetLine>> {
        if self
            .last_refresh
            .is_some_and(|at| at.elapsed() < self.refresh)
        {
            return Ok(Vec::new());
        }
        self.last_refresh = Some(Instant::now());

        match localnet::vxlan_vnis() {
            Ok(vnis) if self.vnis.as_ref() != Some(&vnis) => {
                observer.apply_local_vnis(&vnis)?;
                self.vnis = Some(vnis);
            }
            Ok(_) => {}
            Err(e) => self.warn_once(format!(
                "local vxlan devices unknown, vni_unknown not checked: {e:#}"
            )),
        }

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
                sources: set.sources.clone(),
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
    pub fn allow_sets(&self) -> Option<&Snapshot> {
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
            .map(|s| {
                s.get(kind)
                    .sources
                    .iter()
                    .map(|src| src.rsplit(' ').next().unwrap_or(src))
                    .collect()
            })
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
        let (rules, problems) = netfilter::read_calico_drop_rules();
        for problem in problems {
            self.warn_once(problem);
        }
        let mut now: HashMap<RuleId, (SetKind, u64)> = HashMap::new();
        for (kind, rule) in rules {
            now.entry((rule.backend, rule.comment))
                .or_insert((kind, 0))
                .1 += rule.packets;
        }
        let first = self.rule_counts.is_none();
        let counts = self.rule_counts.get_or_insert_with(HashMap::new);
        for (key, (_, packets)) in &now {
            fold_rule_counter(
                counts.entry(key.clone()).or_insert((*packets, 0)),
                *packets,
                first,
            );
        }
        let mut checks: Vec<NetfilterCheck> = now
            .iter()
            .map(|(key, (kind, _))| {
                let (backend, comment) = key;
                let since = counts.get(key).map_or(0, |(_, since)| *since);
                let ipv6 = comment.contains("IPv6");
                let observer_packets = drops
                    .iter()
                    .filter(|d| {
                        d.row.id.origin == Origin::Classifier
                            && d.row.id.reason == ClassifierDrop::CalicoAllowSet as u32
                            && match kind {
                                SetKind::Vxlan => d.row.id.proto == Proto::Vxlan,
                                SetKind::Ipip => {
                                    matches!(d.row.id.proto, Proto::Ipip | Proto::Ip6ip)
                                }
                            }
                            && d.row.id.peer.is_some_and(|p| p.is_ipv6() == ipv6)
                    })
                    .map(|d| d.row.packets)
                    .sum();
                NetfilterCheck {
                    backend,
                    rule: comment.clone(),
                    proto: kind.name(),
                    packets: since,
                    observer_packets,
                    agree: since == observer_packets,
                }
            })
            .collect();
        checks.sort_by(|a, b| (a.backend, &a.rule).cmp(&(b.backend, &b.rule)));
        checks
    }
}
