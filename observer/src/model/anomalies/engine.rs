//! The window engine: keeps a short history of totals per tunnel (peer,
//! encapsulation), judges each tunnel over the window with the rules, and
//! turns the conditions that hold into events: raised when one starts,
//! cleared (with its duration) when it ends. Memory stays bounded whatever
//! the sources: idle tunnels are forgotten first, and anomalies beyond
//! [`MAX_ACTIVE`] are only counted.

use std::{
    collections::{BTreeMap, VecDeque},
    time::{Duration, SystemTime},
};

use foldhash::HashMap;

use super::{
    ActiveKey, Anomaly, Event, Key, Kind, Known, MAX_ACTIVE, MAX_TRACKED_PEERS, Thresholds,
    collect::{Extra, Totals, collect},
    rules::{self, Finding, PeerFacts},
};
use crate::model::rows::{DropRow, Row};

/// Slack on comparisons of times, which are sums of floating seconds.
const EPSILON: f64 = 1e-6;

/// History of one (peer, encapsulation).
#[derive(Debug, Default)]
struct Track {
    /// (time, totals), oldest first, spanning a little more than the window.
    samples: VecDeque<(f64, Totals)>,
    extra: Extra,
    last_seen: f64,
}

/// Active anomaly with its monotonic start.
#[derive(Debug)]
struct Active {
    anomaly: Anomaly,
    started: f64,
}

/// Raises and clears anomalies from successive reads.
#[derive(Debug)]
pub struct Engine {
    thresholds: Thresholds,
    tracks: HashMap<Key, Track>,
    active: BTreeMap<ActiveKey, Active>,
    /// When counting started (attach).
    start: f64,
    /// Time of the previous read: a peer seen for the first time had zero
    /// packets then.
    previous: f64,
    forgotten_peers: u64,
    raised: BTreeMap<Kind, u64>,
    suppressed: u64,
}

/// What one tunnel did over the window.
struct WindowDelta {
    delta: Totals,
    since: f64,
    seconds: f64,
}

impl Engine {
    /// An engine with `thresholds`, for counters that started at `start`
    /// (seconds on the monotonic clock `observe` is given).
    pub fn new(thresholds: Thresholds, start: f64) -> Engine {
        Engine {
            thresholds,
            tracks: HashMap::default(),
            active: BTreeMap::new(),
            start,
            previous: start,
            forgotten_peers: 0,
            raised: BTreeMap::new(),
            suppressed: 0,
        }
    }

    /// Changes the thresholds (SIGHUP); history is kept.
    pub fn set_thresholds(&mut self, thresholds: Thresholds) {
        self.thresholds = thresholds;
    }

    /// Anomalies active now, in kind then peer order.
    pub fn active(&self) -> Vec<&Anomaly> {
        self.active.values().map(|a| &a.anomaly).collect()
    }

    /// Anomalies raised so far, by kind.
    pub fn raised(&self) -> &BTreeMap<Kind, u64> {
        &self.raised
    }

    /// Anomalies not raised because [`MAX_ACTIVE`] were active.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }

    /// Peers forgotten because more than [`MAX_TRACKED_PEERS`] were seen.
    pub fn forgotten_peers(&self) -> u64 {
        self.forgotten_peers
    }

    /// Folds in one read (`now` in seconds on a monotonic clock, `wall`
    /// the same instant on the wall clock) and returns what changed.
    pub fn observe(
        &mut self,
        now: f64,
        wall: SystemTime,
        rows: &[Row],
        drops: &[DropRow],
        known: &Known,
    ) -> Vec<Event> {
        self.record(now, rows, drops, known);
        let window = self.thresholds.window.as_secs_f64();
        let mut conditions: BTreeMap<ActiveKey, Finding> = BTreeMap::new();
        for (&(peer, proto), track) in &self.tracks {
            let Some(w) = self.window_delta(track, now) else {
                continue;
            };
            let facts = PeerFacts {
                thresholds: &self.thresholds,
                peer,
                proto,
                window: &w.delta,
                seconds: w.seconds,
                full_window: now - self.start >= window - EPSILON
                    && now - w.since >= window - EPSILON,
                extra: &track.extra,
                known,
            };
            for (kind, finding) in rules::findings(&facts) {
                conditions.insert((kind, peer, proto), finding);
            }
        }
        self.transition(now, wall, conditions)
    }

    /// Adds one read to the tracks' histories.
    fn record(&mut self, now: f64, rows: &[Row], drops: &[DropRow], known: &Known) {
        let (totals, extras) = collect(rows, drops, &known.local);
        let zero_at = self.previous;
        let keep_from = now - self.thresholds.window.as_secs_f64() * 2.0;
        // A pair the rows no longer have was forgotten by the aggregator
        // too: if it comes back, its totals start from zero again.
        self.tracks.retain(|key, _| totals.contains_key(key));
        for (key, t) in totals {
            let track = self.tracks.entry(key).or_default();
            if track.samples.is_empty() && zero_at < now {
                track.samples.push_back((zero_at, Totals::default()));
            }
            // Only changes are kept: an unchanged pair's latest sample
            // still tells its totals, and idle pairs stay one sample.
            if track.samples.back().map(|s| s.1) != Some(t) {
                track.last_seen = now;
                track.samples.push_back((now, t));
            }
            // Keep one sample at or before the window's start as the base.
            while track.samples.len() > 2 && track.samples[1].0 <= keep_from {
                track.samples.pop_front();
            }
            if let Some(extra) = extras.get(&key) {
                if extra.inner_src.is_some() {
                    track.extra.inner_src = extra.inner_src;
                }
                if extra.path_mtu.is_some() {
                    track.extra.path_mtu = extra.path_mtu;
                }
                track.extra.reasons.clone_from(&extra.reasons);
            }
        }
        self.forget_excess();
        self.previous = now;
    }

    /// Raises new conditions, updates running ones, clears ended ones.
    fn transition(
        &mut self,
        now: f64,
        wall: SystemTime,
        conditions: BTreeMap<ActiveKey, Finding>,
    ) -> Vec<Event> {
        let mut events = Vec::new();
        let ended: Vec<ActiveKey> = self
            .active
            .keys()
            .filter(|k| !conditions.contains_key(k))
            .copied()
            .collect();
        for key in ended {
            let active = self.active.remove(&key).expect("listed just now");
            events.push(Event::Cleared {
                duration: Duration::from_secs_f64((now - active.started).max(0.0)),
                anomaly: active.anomaly,
            });
        }
        for (key, finding) in conditions {
            let (kind, peer, proto) = key;
            let full = self.active.len() >= MAX_ACTIVE;
            match self.active.get_mut(&key) {
                Some(active) => {
                    active.anomaly.evidence = finding.evidence;
                    active.anomaly.summary = finding.summary;
                    active.anomaly.hint = finding.hint;
                }
                None if full => {
                    if self.suppressed == 0 {
                        tracing::warn!(
                            max = MAX_ACTIVE,
                            "too many anomalies at once; further ones are only counted (spoofed sources?)"
                        );
                    }
                    self.suppressed += 1;
                }
                None => {
                    let anomaly = Anomaly {
                        kind,
                        peer,
                        proto,
                        since: wall,
                        evidence: finding.evidence,
                        summary: finding.summary,
                        hint: finding.hint,
                    };
                    *self.raised.entry(kind).or_default() += 1;
                    events.push(Event::Raised(anomaly.clone()));
                    self.active.insert(
                        key,
                        Active {
                            anomaly,
                            started: now,
                        },
                    );
                }
            }
        }
        events
    }

    /// Totals over the window: the latest sample minus the newest one at
    /// or before the window's start (or the oldest kept).
    fn window_delta(&self, track: &Track, now: f64) -> Option<WindowDelta> {
        let (_, latest) = *track.samples.back()?;
        let window_start = now - self.thresholds.window.as_secs_f64();
        let base = track
            .samples
            .iter()
            .rev()
            .find(|(t, _)| *t <= window_start + EPSILON)
            .or_else(|| track.samples.front())?;
        Some(WindowDelta {
            delta: latest.minus(&base.1),
            since: base.0,
            seconds: (now - base.0).max(1e-3),
        })
    }

    /// Keeps at most [`MAX_TRACKED_PEERS`] tracks, forgetting the longest
    /// idle ones.
    fn forget_excess(&mut self) {
        if self.tracks.len() <= MAX_TRACKED_PEERS {
            return;
        }
        let mut by_age: Vec<(f64, Key)> =
            self.tracks.iter().map(|(k, t)| (t.last_seen, *k)).collect();
        let excess = self.tracks.len() - MAX_TRACKED_PEERS;
        // The `excess` oldest, in no order: a selection, not a sort.
        by_age.select_nth_unstable_by(excess - 1, |a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (_, key) in by_age.into_iter().take(excess) {
            self.tracks.remove(&key);
            self.forgotten_peers += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use observer_common::{ClassifierDrop, Direction, Proto};
    use serde_json::json;

    use super::*;
    use crate::model::anomalies::fixtures::{drive, drop, flow, known, raised, th};

    #[test]
    fn one_way_needs_a_full_window_and_clears_when_replies_come() {
        let mut e = Engine::new(th(), 0.0);
        // Sent only, for 4 s: not yet a whole window.
        let events = drive(&mut e, &known(), 4, |t| {
            (
                vec![flow(
                    "10.10.60.127",
                    Proto::Vxlan,
                    Direction::Tx,
                    t as u64 * 10,
                )],
                vec![],
            )
        });
        assert!(events.is_empty());
        let events = e.observe(
            5.0,
            SystemTime::UNIX_EPOCH + Duration::from_secs(5),
            &[flow("10.10.60.127", Proto::Vxlan, Direction::Tx, 50)],
            &[],
            &known(),
        );
        let Event::Raised(a) = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(a.kind, Kind::OneWay);
        assert_eq!(a.evidence["direction"], json!("tx_only"));
        assert_eq!(a.evidence["sent"], json!(50));
        assert_eq!(
            a.summary,
            "VXLAN to 10.10.60.127: 50 packets sent, none received from 10.10.60.127 in 5 s"
        );
        // Replies arrive: cleared, with the duration.
        let events = e.observe(
            7.0,
            SystemTime::UNIX_EPOCH + Duration::from_secs(7),
            &[
                flow("10.10.60.127", Proto::Vxlan, Direction::Tx, 70),
                flow("10.10.60.127", Proto::Vxlan, Direction::Rx, 3),
            ],
            &[],
            &known(),
        );
        assert_eq!(events.len(), 1);
        let Event::Cleared { anomaly, duration } = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(anomaly.kind, Kind::OneWay);
        assert_eq!(*duration, Duration::from_secs(2));
        assert!(e.active().is_empty());
    }

    #[test]
    fn one_way_below_min_packets_is_quiet_and_rx_only_needs_a_node() {
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 10, |_| {
            (
                vec![
                    // 4 packets only.
                    flow("10.10.60.127", Proto::Vxlan, Direction::Tx, 4),
                    flow("10.10.60.209", Proto::Ipip, Direction::Rx, 100),
                ],
                vec![],
            )
        });
        // The IPIP peer's 100 packets all came in the first second.
        let raised = raised(&events);
        assert!(!raised.contains(&(Kind::OneWay, "10.10.60.127".into())));
        assert!(raised.contains(&(Kind::OneWay, "10.10.60.209".into())));
        assert_eq!(
            e.active().iter().filter(|a| a.kind == Kind::OneWay).count(),
            0,
            "quiet for a whole window: cleared"
        );
    }

    #[test]
    fn drop_spike_threshold_and_clearing() {
        let mut e = Engine::new(th(), 0.0);
        // 4 drops/s: below 5/s.
        let events = drive(&mut e, &known(), 6, |t| {
            (
                vec![],
                vec![drop(
                    "10.10.60.127",
                    Proto::Vxlan,
                    ClassifierDrop::VniUnknown,
                    t as u64 * 4,
                    4096,
                )],
            )
        });
        assert_eq!(events, vec![]);
        // 20 drops/s, then none: raised, then cleared once the window passes.
        let mut e = Engine::new(th(), 0.0);
        let events = drive(&mut e, &known(), 15, |t| {
            (
                vec![],
                vec![drop(
                    "10.10.60.127",
                    Proto::Vxlan,
                    ClassifierDrop::VniUnknown,
                    t.min(5) as u64 * 20,
                    4096,
                )],
            )
        });
        assert_eq!(
            raised(&events),
            vec![(Kind::DropSpike, "10.10.60.127".into())]
        );
        assert!(matches!(events.last(), Some(Event::Cleared { .. })));
    }

    #[test]
    fn active_anomalies_are_bounded() {
        let mut e = Engine::new(th(), 0.0);
        let rows: Vec<Row> = (0..(MAX_ACTIVE as u32 + 10))
            .map(|i| {
                let mut r = flow("10.0.0.0", Proto::Vxlan, Direction::Rx, 1);
                r.id.peer = Some(IpAddr::from(Ipv4Addr::from(0x0b00_0000 + i)));
                r
            })
            .collect();
        // Each source is neither a node nor allowed: unknown_peer for all.
        let events = e.observe(1.0, SystemTime::UNIX_EPOCH, &rows, &[], &known());
        assert_eq!(events.len(), MAX_ACTIVE);
        assert_eq!(e.active().len(), MAX_ACTIVE);
        assert_eq!(e.suppressed(), 10);
    }

    #[test]
    fn tracked_peers_are_bounded() {
        let mut e = Engine::new(th(), 0.0);
        let rows: Vec<Row> = (0..(MAX_TRACKED_PEERS as u32 + 100))
            .map(|i| {
                let peer = IpAddr::from(Ipv4Addr::from(0x0a00_0000 + i));
                let mut r = flow("10.0.0.0", Proto::Vxlan, Direction::Tx, 1);
                r.id.peer = Some(peer);
                r
            })
            .collect();
        e.observe(1.0, SystemTime::UNIX_EPOCH, &rows, &[], &Known::default());
        assert_eq!(e.tracks.len(), MAX_TRACKED_PEERS);
        assert_eq!(e.forgotten_peers(), 100);
    }
}
