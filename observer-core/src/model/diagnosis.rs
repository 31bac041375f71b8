//! What a bounded run (`observer diagnose`) leaves to diagnose: every
//! anomaly seen with its latest evidence ([`Findings`]), the last read, and
//! the probes' run; the verdict per node pair comes from
//! [`verdicts`](crate::model::verdicts).

use std::{collections::BTreeMap, net::IpAddr};

use observer_common::Proto;

use crate::model::{
    anomalies::{Anomaly, Event, FindingRecord, Kind, Known},
    crosscheck::NetfilterCheck,
    probe::Run,
    routes::Outage,
    rows::{DropRow, Row},
    verdicts::{self, PairVerdict},
};

/// Findings kept for one write-up; beyond it they are only counted.
pub const MAX_FINDINGS: usize = 256;

/// Every anomaly seen during a bounded run (`observer diagnose`), with its
/// latest evidence, whether it still holds, and how long it lasted.
#[derive(Debug, Default)]
pub struct Findings {
    entries: BTreeMap<(Kind, IpAddr, Proto), FindingRecord>,
    /// Findings not kept because [`MAX_FINDINGS`] were already.
    pub overflow: u64,
}

impl Findings {
    /// Folds in one read's events.
    pub fn record(&mut self, events: &[Event]) {
        for event in events {
            let (anomaly, active, duration) = match event {
                Event::Raised(a) => (a, true, None),
                Event::Cleared { anomaly, duration } => (anomaly, false, Some(*duration)),
            };
            let key = (anomaly.kind, anomaly.peer, anomaly.proto);
            if !self.entries.contains_key(&key) && self.entries.len() >= MAX_FINDINGS {
                self.overflow += 1;
                continue;
            }
            let entry = self.entries.entry(key).or_insert_with(|| FindingRecord {
                anomaly: anomaly.clone(),
                active,
                duration_s: None,
                meaning: anomaly.kind.meaning(),
            });
            entry.active = active;
            entry.duration_s = duration.map(|d| (d.as_secs_f64() * 10.0).round() / 10.0);
            if !active {
                entry.anomaly.evidence = anomaly.evidence.clone();
                entry.anomaly.summary = anomaly.summary.clone();
            }
        }
    }

    /// Refreshes the evidence of the anomalies active now.
    pub fn still_active(&mut self, active: &[&Anomaly]) {
        for a in active {
            if let Some(entry) = self.entries.get_mut(&(a.kind, a.peer, a.proto)) {
                entry.anomaly.evidence = a.evidence.clone();
                entry.anomaly.summary = a.summary.clone();
                entry.anomaly.hint = a.hint.clone();
            }
        }
    }

    /// Findings in kind order (most decisive first), then peer.
    pub fn list(&self) -> Vec<&FindingRecord> {
        let mut list: Vec<&FindingRecord> = self.entries.values().collect();
        list.sort_by_key(|f| (f.anomaly.kind, f.anomaly.peer));
        list
    }

    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.overflow == 0
    }
}

/// What a finished run leaves for the diagnosis.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every anomaly seen during the run.
    pub findings: Findings,
    /// Rows of the last read.
    pub rows: Vec<Row>,
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
    /// Route outages of pod blocks that ended during the run (at most
    /// [`MAX_FINDINGS`]).
    pub route_outages: Vec<Outage>,
    /// Route outages not kept.
    pub route_outages_not_kept: u64,
    /// `--probe`: the probe run, or why it could not run.
    pub probe: Option<Result<Run, String>>,
}

impl Outcome {
    /// Whether nothing was found: no anomaly, and the probes (when run)
    /// found nothing either.
    pub fn healthy(&self) -> bool {
        self.findings.is_empty() && self.probe_healthy()
    }

    /// Whether the probes, when run, found nothing wrong.
    pub fn probe_healthy(&self) -> bool {
        self.probe
            .as_ref()
            .is_none_or(|p| p.as_ref().is_ok_and(Run::healthy))
    }

    /// One verdict per node pair: every node the data plane or BIRD
    /// names, and every peer a finding is about.
    pub fn verdicts(&self) -> Vec<PairVerdict> {
        let peers = self
            .known
            .nodes
            .keys()
            .copied()
            .chain(self.known.bgp.iter().filter_map(|s| s.neighbor));
        verdicts::verdicts(&self.findings.list(), peers)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        net::Ipv4Addr,
        time::{Duration, SystemTime},
    };

    use super::*;

    fn anomaly(peer: u8, summary: &str) -> Anomaly {
        Anomaly {
            kind: Kind::AllowSetDrop,
            peer: IpAddr::V4(Ipv4Addr::new(10, 0, 0, peer)),
            proto: Proto::Vxlan,
            since: SystemTime::UNIX_EPOCH,
            evidence: BTreeMap::new(),
            summary: summary.to_string(),
            hint: "check the allow-set".to_string(),
        }
    }

    #[test]
    fn findings_beyond_the_cap_are_only_counted() {
        let mut findings = Findings::default();
        let events: Vec<Event> = (0..MAX_FINDINGS + 3)
            .map(|i| {
                let mut a = anomaly(0, "dropped");
                a.peer = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i as u32));
                Event::Raised(a)
            })
            .collect();
        findings.record(&events);
        assert_eq!(findings.list().len(), MAX_FINDINGS);
        assert_eq!(findings.overflow, 3);
        // A finding already kept is updated, not counted again.
        findings.record(&events[..1]);
        assert_eq!(findings.overflow, 3);
    }

    #[test]
    fn a_cleared_finding_keeps_its_last_evidence_and_its_duration() {
        let mut findings = Findings::default();
        findings.record(&[Event::Raised(anomaly(1, "first"))]);
        findings.record(&[Event::Cleared {
            anomaly: anomaly(1, "last"),
            duration: Duration::from_millis(1260),
        }]);
        let list = findings.list();
        assert_eq!(list.len(), 1);
        assert!(!list[0].active);
        assert_eq!(list[0].duration_s, Some(1.3));
        assert_eq!(list[0].anomaly.summary, "last");
    }

    #[test]
    fn healthy_means_no_finding_and_probes_that_found_nothing() {
        let mut outcome = Outcome::default();
        assert!(outcome.healthy());
        outcome.probe = Some(Err("no CAP_NET_RAW".to_string()));
        assert!(!outcome.healthy());
        outcome.probe = None;
        outcome
            .findings
            .record(&[Event::Raised(anomaly(1, "dropped"))]);
        assert!(!outcome.healthy());
    }
}
