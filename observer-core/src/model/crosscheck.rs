//! Calico's drop-rule counters beside the observer's own `calico_allow_set`
//! counts: the comparison, and the bookkeeping that keeps a rule's count
//! since attach right when Calico re-creates the rule.

use std::collections::HashMap;

use observer_common::ClassifierDrop;
use serde::Serialize;

use crate::model::{
    facts::{Family, SetKind},
    rows::{DropRow, Origin},
};

/// One reading of the counter of one of Calico's drop rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleReading {
    /// `iptables`, `ip6tables` or `nftables`.
    pub backend: &'static str,
    /// The rule's comment, which names it (chain names differ between
    /// Calico's data planes).
    pub comment: String,
    /// The allow-set kind the rule enforces.
    pub kind: SetKind,
    /// The address family of the sources it drops.
    pub family: Family,
    /// Packets it matched since it was created.
    pub packets: u64,
}

/// The observer's count beside a netfilter rule's counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetfilterCheck {
    /// `iptables`, `ip6tables` or `nftables`.
    pub backend: &'static str,
    /// The rule's comment.
    pub rule: String,
    /// `vxlan` or `ipip`.
    pub proto: &'static str,
    /// Packets the rule matched since attach.
    pub packets: u64,
    /// Packets the observer flagged `calico_allow_set` for the same
    /// protocol and family since attach.
    pub observer_packets: u64,
    /// Whether both agree.
    pub agree: bool,
}

/// A rule's name: (backend, comment).
type RuleName<'a> = (&'static str, &'a str);

/// Per rule (backend, comment): (last reading, packets since attach).
type RuleCounts = HashMap<(&'static str, String), (u64, u64)>;

/// The rules' packets since attach, from successive readings.
#[derive(Debug, Default)]
pub struct RuleTally {
    /// Per rule (backend, comment): the last counter read and the packets
    /// matched since attach; `None` before the first reading, which only
    /// takes the baseline. Summing differences keeps the count right when
    /// Calico re-creates a rule (its counter restarts at zero).
    counts: Option<RuleCounts>,
}

impl RuleTally {
    /// Folds in one reading of every rule and compares each rule's count
    /// since attach with the `calico_allow_set` drops the observer counted
    /// for the same kind and address family. Sorted by backend and rule.
    pub fn update(&mut self, readings: &[RuleReading], drops: &[DropRow]) -> Vec<NetfilterCheck> {
        // A rule can appear in several chains: one counter per name.
        let mut now: HashMap<RuleName<'_>, (&RuleReading, u64)> = HashMap::new();
        for reading in readings {
            now.entry((reading.backend, &reading.comment))
                .or_insert((reading, 0))
                .1 += reading.packets;
        }
        let first = self.counts.is_none();
        let counts = self.counts.get_or_insert_with(HashMap::new);
        let mut checks: Vec<NetfilterCheck> = now
            .into_values()
            .map(|(rule, packets)| {
                let state = counts
                    .entry((rule.backend, rule.comment.clone()))
                    .or_insert((packets, 0));
                fold_rule_counter(state, packets, first);
                let observer_packets = flagged_packets(drops, rule.kind, rule.family);
                NetfilterCheck {
                    backend: rule.backend,
                    rule: rule.comment.clone(),
                    proto: rule.kind.name(),
                    packets: state.1,
                    observer_packets,
                    agree: state.1 == observer_packets,
                }
            })
            .collect();
        checks.sort_by(|a, b| (a.backend, &a.rule).cmp(&(b.backend, &b.rule)));
        checks
    }
}

/// Packets the observer flagged `calico_allow_set` from sources of
/// `family` in the encapsulations a set of `kind` guards.
fn flagged_packets(drops: &[DropRow], kind: SetKind, family: Family) -> u64 {
    drops
        .iter()
        .filter(|d| {
            let id = &d.row.id;
            id.origin == Origin::Classifier
                && id.reason == ClassifierDrop::CalicoAllowSet as u32
                && SetKind::guarding(id.proto) == Some(kind)
                && id
                    .peer
                    .is_some_and(|p| p.is_ipv6() == (family == Family::V6))
        })
        .map(|d| d.row.packets)
        .sum()
}

/// Adds a rule counter reading to (last reading, packets since attach). A
/// smaller reading means the rule was re-created: all of it is new.
pub fn fold_rule_counter(state: &mut (u64, u64), packets: u64, baseline_only: bool) {
    let (last, since) = state;
    if !baseline_only {
        *since += if packets >= *last {
            packets - *last
        } else {
            packets
        };
    }
    *last = packets;
}

#[cfg(test)]
mod tests {
    use observer_common::Proto;

    use super::*;
    use crate::model::rows::testing;

    fn reading(comment: &str, kind: SetKind, family: Family, packets: u64) -> RuleReading {
        RuleReading {
            backend: "iptables",
            comment: comment.into(),
            kind,
            family,
            packets,
        }
    }

    fn flagged(peer: &str, proto: Proto, packets: u64) -> DropRow {
        let mut id = testing::drop_id(
            peer,
            Origin::Classifier,
            ClassifierDrop::CalicoAllowSet as u32,
        );
        id.proto = proto;
        testing::drop_row(id, packets, "calico_allow_set")
    }

    #[test]
    fn each_rule_is_compared_with_drops_of_its_kind_and_family() {
        let mut tally = RuleTally::default();
        let rules = |v4, v6, ipip| {
            [
                reading("vxlan v4", SetKind::Vxlan, Family::V4, v4),
                reading("vxlan v6", SetKind::Vxlan, Family::V6, v6),
                reading("ipip", SetKind::Ipip, Family::V4, ipip),
            ]
        };
        let baseline = tally.update(&rules(100, 7, 3), &[]);
        assert!(
            baseline.iter().all(|c| c.packets == 0 && c.agree),
            "{baseline:?}"
        );
        let drops = [
            flagged("10.0.0.1", Proto::Vxlan, 5),
            flagged("fd00::1", Proto::Vxlan, 2),
            flagged("10.0.0.2", Proto::Ipip, 4),
        ];
        let checks = tally.update(&rules(105, 9, 6), &drops);
        let by_rule: Vec<(&str, u64, u64, bool)> = checks
            .iter()
            .map(|c| (c.rule.as_str(), c.packets, c.observer_packets, c.agree))
            .collect();
        assert_eq!(
            by_rule,
            [
                ("ipip", 3, 4, false),
                ("vxlan v4", 5, 5, true),
                ("vxlan v6", 2, 2, true),
            ]
        );
    }

    #[test]
    fn rule_counters_survive_rule_recreation() {
        let mut state = (0, 0);
        fold_rule_counter(&mut state, 1000, true);
        assert_eq!(state, (1000, 0), "the baseline counts nothing");
        fold_rule_counter(&mut state, 1037, false);
        assert_eq!(state.1, 37);
        // Felix re-created the rule: the counter restarted, 5 new matches.
        fold_rule_counter(&mut state, 5, false);
        assert_eq!(state.1, 42);
        fold_rule_counter(&mut state, 5, false);
        assert_eq!(state.1, 42);
    }
}
