//! Calico's drop-rule counters beside the observer's own `calico_allow_set`
//! counts: the comparison, and the bookkeeping that keeps a rule's count
//! since attach right when Calico re-creates the rule.

use serde::Serialize;

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
    use super::*;

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
