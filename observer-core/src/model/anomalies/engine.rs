//! The window engine: keeps a short history of totals per tunnel (peer,
//! encapsulation), judges each tunnel over the window with the rules, and
//! turns the conditions that hold into events: raised when one starts,
//! cleared (with its duration) when it ends. Memory stays bounded whatever
//! the sources: idle tunnels are forgotten first, and anomalies beyond
//! [`MAX_ACTIVE`] are only counted.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    net::IpAddr,
    time::{Duration, SystemTime},
};

use observer_common::Proto;

use super::{
    ActiveKey, Anomaly, Event, Key, Kind, Known, MAX_ACTIVE, MAX_TRACKED_PEERS, Thresholds,
    collect::{Extra, Part, Span, Totals, tunnel_parts},
    rules::{self, Finding, PeerFacts},
};
use ipnet::IpNet;
use smallvec::{SmallVec, smallvec};

use crate::model::{
    bgp_wire,
    dataplane::BlockRoute,
    read_order::ReadOrderMap,
    routes::{FORGET_AFTER_S, MissingBlock},
    rows::{DropRow, Row},
};

/// Slack on comparisons of times, which are sums of floating seconds.
const EPSILON: f64 = 1e-6;

/// History of one (peer, encapsulation).
#[derive(Debug)]
struct Track {
    /// (time, totals since the pair was first tracked), oldest first,
    /// spanning a little more than the window; a sample per read in which
    /// the pair moved. The first two are kept in the track itself: most
    /// pairs have no more, and judging 57,344 tracks each interval was
    /// mostly a cache miss per track on a separate sample buffer.
    samples: SmallVec<[(f64, Totals); 2]>,
    extra: Extra,
    /// Time of the latest sample.
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
    /// In first-seen order, which is the rows' read order: a read's
    /// lookups mostly hit the entry after the previous one. Removal
    /// re-indexes, so the index never fills with a hash table's
    /// tombstones (a `HashMap` held at its cap of 57,344 doubled to
    /// 131,072 buckets, 31 MiB, under a churn of new sources).
    tracks: ReadOrderMap<Key, Track>,
    active: BTreeMap<ActiveKey, Active>,
    /// When counting started (attach).
    start: f64,
    /// Time of the previous read: a peer seen for the first time had zero
    /// packets then.
    previous: f64,
    forgotten_peers: u64,
    raised: BTreeMap<Kind, u64>,
    suppressed: u64,
    /// BGP neighbors whose session is not established, and since when
    /// (as many as the BIRD sessions read, which `node::bird` bounds).
    bgp_down_since: BTreeMap<IpAddr, f64>,
    /// Per BGP neighbor: the session as last read (Established, and BIRD's
    /// `since`), and when it re-established within the flap window.
    bgp_history: BTreeMap<IpAddr, BgpHistory>,
    /// Since when each route_conflict and stale_route condition has held
    /// (as many as the nodes the data plane points at).
    held_since: BTreeMap<ActiveKey, f64>,
    /// Addresses the data plane pointed at while they were a node here,
    /// and when they last were one (for stale_route: no longer one). Kept
    /// after the data plane stops pointing at them (a route withdrawn,
    /// then left behind again), for [`FORGET_AFTER_S`], at most
    /// [`MAX_TRACKED_PEERS`].
    was_node: BTreeMap<IpAddr, f64>,
}

/// What the engine remembers of one BGP session for `bgp_flap`.
#[derive(Debug, Default)]
struct BgpHistory {
    /// Whether it was Established at the last read, and BIRD's `since`.
    last: (bool, String),
    /// When it re-established, within the flap window.
    re_established: VecDeque<f64>,
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
            tracks: ReadOrderMap::default(),
            active: BTreeMap::new(),
            start,
            previous: start,
            forgotten_peers: 0,
            raised: BTreeMap::new(),
            suppressed: 0,
            bgp_down_since: BTreeMap::new(),
            bgp_history: BTreeMap::new(),
            held_since: BTreeMap::new(),
            was_node: BTreeMap::new(),
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
        let mut conditions: BTreeMap<ActiveKey, Finding> = BTreeMap::new();
        let mut began = self.bgp_down_conditions(now, known, &mut conditions);
        self.bgp_flap_conditions(now, known, &mut conditions);
        self.route_missing_conditions(now, known, &mut conditions, &mut began);
        self.data_plane_conditions(now, known, &mut conditions, &mut began);
        let unraised = self.tunnel_conditions(now, known, &mut conditions);
        self.transition(now, wall, conditions, &began, unraised)
    }

    /// Adds the tunnel rules' conditions that [`Engine::transition`] will
    /// show: those of running anomalies, and new ones in key order while
    /// there is room for them (it raises in that order). Returns how many
    /// more hold but find no room: they are only counted, and their texts
    /// are never written (a flood of new sources holds tens of thousands).
    fn tunnel_conditions(
        &self,
        now: f64,
        known: &Known,
        conditions: &mut BTreeMap<ActiveKey, Finding>,
    ) -> u64 {
        let mut holding: Vec<ActiveKey> = Vec::new();
        for (&(peer, proto), track) in self.tracks.iter() {
            self.judge((peer, proto), track, now, known, false, |facts| {
                holding.extend(rules::holding(facts).map(|kind| (kind, peer, proto)));
            });
        }
        // Every condition in key order, tunnel ones marked: room is what
        // the running anomalies that still hold leave.
        let mut all: Vec<(ActiveKey, bool)> = conditions
            .keys()
            .map(|&k| (k, false))
            .chain(holding.iter().map(|&k| (k, true)))
            .collect();
        all.sort_unstable();
        let running = all
            .iter()
            .filter(|(k, _)| self.active.contains_key(k))
            .count();
        let mut room = MAX_ACTIVE.saturating_sub(running);
        let mut unraised = 0;
        for (key, tunnel) in all {
            let shown = if self.active.contains_key(&key) {
                true
            } else if room > 0 {
                room -= 1;
                true
            } else {
                false
            };
            if !tunnel {
                continue;
            }
            if !shown {
                unraised += 1;
                continue;
            }
            let (kind, peer, proto) = key;
            let track = self.tracks.get(&(peer, proto)).expect("judged just now");
            let described = self.judge((peer, proto), track, now, known, true, |facts| {
                rules::finding(kind, facts)
            });
            if let Some(Some(finding)) = described {
                conditions.insert(key, finding);
            }
        }
        unraised
    }

    /// `apply` to the facts of one tunnel over the window; `None` when the
    /// tunnel did not move in the window.
    fn judge<R>(
        &self,
        (peer, proto): Key,
        track: &Track,
        now: f64,
        known: &Known,
        describe: bool,
        apply: impl FnOnce(&PeerFacts<'_>) -> R,
    ) -> Option<R> {
        let window = self.thresholds.window.as_secs_f64();
        // No sample inside the window: nothing moved in it, so nothing
        // to judge (every sample adds packets). An idle tunnel raises
        // nothing (also with --anomaly-min-packets 0), and most of a
        // large node's tunnels are idle at any time: checked before
        // reading the samples.
        if track.last_seen <= now - window + EPSILON {
            return None;
        }
        let w = self.window_delta(track, now)?;
        Some(apply(&PeerFacts {
            thresholds: &self.thresholds,
            peer,
            proto,
            window: &w.delta,
            seconds: w.seconds,
            full_window: now - self.start >= window - EPSILON && now - w.since >= window - EPSILON,
            extra: &track.extra,
            known,
            describe,
        }))
    }

    /// Adds a `bgp_down` condition for each BGP session down for a whole
    /// window (a session that is still coming up, at BIRD's start or a new
    /// node's, is not yet a problem); returns when each began: when its
    /// session was first seen down, a window before it is raised. BIRD's
    /// sessions first; for a peer BIRD did not report, the wire's view
    /// (a NOTIFICATION, RST or FIN and nothing heard since, or silence
    /// beyond the hold time).
    fn bgp_down_conditions(
        &mut self,
        now: f64,
        known: &Known,
        conditions: &mut BTreeMap<ActiveKey, Finding>,
    ) -> BTreeMap<ActiveKey, f64> {
        let window = self.thresholds.window.as_secs_f64();
        let mut down = BTreeMap::new();
        let mut began = BTreeMap::new();
        for session in known.bgp.iter().filter(|s| !s.established()) {
            let Some(neighbor) = session.neighbor else {
                continue;
            };
            let since = self.bgp_down_since.get(&neighbor).copied().unwrap_or(now);
            down.insert(neighbor, since);
            if now - since >= window - EPSILON
                && let Some(finding) = rules::bgp_down(session, now - since)
            {
                let key = (Kind::BgpDown, neighbor, Proto::Other);
                conditions.insert(key, finding);
                began.insert(key, since);
            }
        }
        self.bgp_down_since = down;
        // Without BIRD's sessions (no socket read), the wire's view. With
        // them, a peer BIRD has no session with is no peer any more (a
        // decommissioned node): its ended session is not an outage. An
        // ended session not back after 6 hours is forgotten likewise.
        let wire = if known.bgp.is_empty() {
            known.bgp_wire.iter()
        } else {
            Default::default()
        };
        for (peer, wire) in wire {
            if let Some((since, why)) = bgp_wire::down_at_wire(wire, now)
                && now - since >= window - EPSILON
                && now - since < FORGET_AFTER_S
            {
                let key = (Kind::BgpDown, *peer, Proto::Other);
                let finding = rules::bgp_down_at_wire(*peer, wire, &why, now, now - since);
                conditions.insert(key, finding);
                began.insert(key, since);
            }
        }
        began
    }

    /// Adds a `bgp_flap` condition for each BGP session re-established
    /// more than `bgp_flaps` times in `bgp_flap_window`. A session counts
    /// as re-established when it is Established now and was not at the
    /// last read, or BIRD's `since` moved while it stayed Established (it
    /// went down and up between two reads). Its first sighting does not
    /// count: its past is unknown; nor does a read BIRD did not answer.
    fn bgp_flap_conditions(
        &mut self,
        now: f64,
        known: &Known,
        conditions: &mut BTreeMap<ActiveKey, Finding>,
    ) {
        let keep_from = now - self.thresholds.bgp_flap_window.as_secs_f64();
        let mut history = BTreeMap::new();
        for session in &known.bgp {
            let Some(neighbor) = session.neighbor else {
                continue;
            };
            let mut h = self
                .bgp_history
                .remove(&neighbor)
                .unwrap_or_else(|| BgpHistory {
                    last: (session.established(), session.since.clone()),
                    re_established: VecDeque::new(),
                });
            // A BIRD that did not answer says nothing of the session: its
            // last reading stands, or answering again would be a flap.
            if session.answered() {
                let (was_up, was_since) = &h.last;
                if session.established() && (!was_up || *was_since != session.since) {
                    h.re_established.push_back(now);
                }
                h.last = (session.established(), session.since.clone());
            }
            while h.re_established.front().is_some_and(|t| *t <= keep_from) {
                h.re_established.pop_front();
            }
            if let Some(finding) =
                rules::bgp_flap(session, h.re_established.len(), &self.thresholds)
            {
                conditions.insert((Kind::BgpFlap, neighbor, Proto::Other), finding);
            }
            history.insert(neighbor, h);
        }
        // Sessions no longer read are forgotten: bounded by what BIRD has.
        self.bgp_history = history;
    }

    /// Adds a `route_missing` condition per node whose blocks have had no
    /// route for a whole window (a route being replaced is no outage),
    /// when the node still matters here: BIRD has a session with it, or
    /// it exchanged tunnel traffic with this node within the window (a
    /// decommissioned node's blocks go quietly). Its start is when the
    /// first of its blocks went.
    fn route_missing_conditions(
        &self,
        now: f64,
        known: &Known,
        conditions: &mut BTreeMap<ActiveKey, Finding>,
        began: &mut BTreeMap<ActiveKey, f64>,
    ) {
        let window = self.thresholds.window.as_secs_f64();
        let mut by_node: BTreeMap<IpAddr, Vec<&MissingBlock>> = BTreeMap::new();
        for missing in &known.missing_blocks {
            by_node.entry(missing.node).or_default().push(missing);
        }
        for (node, blocks) in by_node {
            let since = blocks.iter().map(|b| b.since).fold(f64::INFINITY, f64::min);
            if now - since < window - EPSILON {
                continue;
            }
            let session = known.bgp.iter().find(|s| s.neighbor == Some(node));
            if session.is_none() && !self.recent_traffic(node, now) {
                continue;
            }
            let key = (Kind::RouteMissing, node, Proto::Other);
            conditions.insert(
                key,
                rules::route_missing(node, &blocks, now - since, session),
            );
            began.insert(key, since);
        }
    }

    /// Whether `node` exchanged tunnel traffic with this node within the
    /// window.
    fn recent_traffic(&self, node: IpAddr, now: f64) -> bool {
        let window = self.thresholds.window.as_secs_f64();
        Proto::ALL.iter().any(|proto| {
            self.tracks
                .get(&(node, *proto))
                .is_some_and(|t| t.last_seen > now - window + EPSILON)
        })
    }

    /// Adds the conditions on the data plane's own entries that have held
    /// for a whole window (a route being replaced passes through such
    /// states): `route_conflict` per node a conflicting block leads to,
    /// `stale_route` per address the routes, FDB or neighbour entries
    /// lead to that is no longer a node, and `route_missing` per BGP
    /// neighbor whose every route the import filter rejected.
    fn data_plane_conditions(
        &mut self,
        now: f64,
        known: &Known,
        conditions: &mut BTreeMap<ActiveKey, Finding>,
        began: &mut BTreeMap<ActiveKey, f64>,
    ) {
        let mut found: BTreeMap<ActiveKey, Finding> = BTreeMap::new();
        let mut conflicts: BTreeMap<IpAddr, Vec<&BlockRoute>> = BTreeMap::new();
        let mut pointed: BTreeMap<IpAddr, Vec<IpNet>> = BTreeMap::new();
        for block in &known.blocks {
            let nodes: BTreeSet<IpAddr> = block.next_hops.iter().filter_map(|h| h.node).collect();
            // Through tunnels, a block's next hops are its owner: two of
            // them are two owners. Direct routes may be ECMP by design
            // (two ToR switches), so only a blackhole beside one counts.
            let tunnel_owners: BTreeSet<IpAddr> = block
                .next_hops
                .iter()
                .filter(|h| h.encap.is_some())
                .filter_map(|h| h.node)
                .collect();
            if tunnel_owners.len() > 1 || (block.blackhole && !block.next_hops.is_empty()) {
                for node in &nodes {
                    conflicts.entry(*node).or_default().push(block);
                }
            }
            for node in nodes {
                pointed.entry(node).or_default().push(block.block);
            }
        }
        for (node, blocks) in conflicts {
            found.insert(
                (Kind::RouteConflict, node, Proto::Other),
                rules::route_conflict(node, &blocks),
            );
        }
        for session in &known.bgp {
            if let (Some(neighbor), Some(finding)) =
                (session.neighbor, rules::routes_filtered(session))
            {
                let key = (Kind::RouteMissing, neighbor, Proto::Other);
                // Blocks that went missing say more than a filter count.
                if !conditions.contains_key(&key) {
                    found.insert(key, finding);
                }
            }
        }
        for node in known.nodes.keys() {
            pointed.entry(*node).or_default();
        }
        // "No longer a node": it was one here (a BGP session, an allow-set
        // entry, traffic) and is not now. A node never seen as one (the
        // announcing node behind a route reflector) is not judged.
        for (addr, blocks) in pointed {
            if known.local.contains(&addr) {
                continue;
            }
            let member = known.still_a_node(addr);
            if member == Some(true) || self.recent_traffic(addr, now) {
                self.was_node.insert(addr, now);
                continue;
            }
            if member.is_none() || !self.was_node.contains_key(&addr) {
                continue;
            }
            let devices = known
                .nodes
                .get(&addr)
                .map(|n| n.devices.clone())
                .unwrap_or_default();
            found.insert(
                (Kind::StaleRoute, addr, Proto::Other),
                rules::stale_route(addr, &blocks, &devices, known),
            );
        }
        self.was_node.retain(|_, seen| now - *seen < FORGET_AFTER_S);
        while self.was_node.len() > MAX_TRACKED_PEERS {
            let oldest = self
                .was_node
                .iter()
                .min_by(|a, b| a.1.total_cmp(b.1))
                .map(|(addr, _)| *addr);
            if let Some(addr) = oldest {
                self.was_node.remove(&addr);
            }
        }
        let window = self.thresholds.window.as_secs_f64();
        let mut held = BTreeMap::new();
        for (key, finding) in found {
            let since = self.held_since.get(&key).copied().unwrap_or(now);
            held.insert(key, since);
            if now - since >= window - EPSILON {
                conditions.insert(key, finding);
                began.insert(key, since);
            }
        }
        self.held_since = held;
    }

    /// Adds one read to the tracks' histories: the packets each tunnel
    /// counted since the previous read. Only rows that moved are looked
    /// at (an idle row, most of a large node's, costs one compare), so a
    /// pair's samples are its totals since it was first tracked.
    fn record(&mut self, now: f64, rows: &[Row], drops: &[DropRow], known: &Known) {
        let zero_at = self.previous.min(now);
        let keep_from = now - self.thresholds.window.as_secs_f64() * 2.0;
        // Rows of pairs not tracked yet wait until room is made for them.
        let mut untracked = Vec::new();
        // Tracked pairs that moved in this read: they keep their place.
        let mut moved_tracked = 0;
        let moved = tunnel_parts(
            rows.iter().filter(|r| r.changed()),
            drops.iter().filter(|d| d.row.changed()),
            &known.local,
        );
        for part in moved {
            match self.tracks.get_mut(&part.key) {
                Some(track) => {
                    moved_tracked += usize::from(track.last_seen < now);
                    track.add(&part, now, keep_from);
                }
                None => untracked.push(part),
            }
        }
        if !untracked.is_empty() {
            let mut new_pairs: Vec<Key> = untracked.iter().map(|p| p.key).collect();
            new_pairs.sort_unstable();
            new_pairs.dedup();
            // Room first, so the table never holds more than the cap: the
            // longest idle pairs go, never one that moved in this read.
            // New pairs beyond that room (a flood of sources) are only
            // counted.
            let admitted = new_pairs
                .len()
                .min(MAX_TRACKED_PEERS.saturating_sub(moved_tracked));
            self.forget_oldest((self.tracks.len() + admitted).saturating_sub(MAX_TRACKED_PEERS));
            self.forgotten_peers += (new_pairs.len() - admitted) as u64;
            new_pairs.truncate(admitted);
            self.tracks.reserve_capped(admitted, MAX_TRACKED_PEERS);
            for part in untracked {
                if new_pairs.binary_search(&part.key).is_err() {
                    continue;
                }
                self.tracks
                    .get_or_insert_with(part.key, || Track::new(zero_at))
                    .add(&part, now, keep_from);
            }
        }
        self.previous = now;
    }

    /// Raises new conditions, updates running ones, clears ended ones. A
    /// condition in `began` started then, before this read raised it: its
    /// start time and duration count from there. `unraised` more hold
    /// that found no room (left out of `conditions`).
    fn transition(
        &mut self,
        now: f64,
        wall: SystemTime,
        conditions: BTreeMap<ActiveKey, Finding>,
        began: &BTreeMap<ActiveKey, f64>,
        unraised: u64,
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
                None if full => self.suppress(1),
                None => {
                    let started = began.get(&key).copied().unwrap_or(now);
                    let anomaly = Anomaly {
                        kind,
                        peer,
                        proto,
                        since: wall - Duration::from_secs_f64((now - started).max(0.0)),
                        evidence: finding.evidence,
                        summary: finding.summary,
                        hint: finding.hint,
                    };
                    *self.raised.entry(kind).or_default() += 1;
                    events.push(Event::Raised(anomaly.clone()));
                    self.active.insert(key, Active { anomaly, started });
                }
            }
        }
        self.suppress(unraised);
        events
    }

    /// Counts `count` conditions not raised because [`MAX_ACTIVE`] were
    /// active, warning at the first.
    fn suppress(&mut self, count: u64) {
        if count > 0 && self.suppressed == 0 {
            tracing::warn!(
                max = MAX_ACTIVE,
                "too many anomalies at once; further ones are only counted (spoofed sources?)"
            );
        }
        self.suppressed += count;
    }

    /// Totals over the window: the latest sample minus the newest one at
    /// or before the window's start (or the oldest kept).
    fn window_delta(&self, track: &Track, now: f64) -> Option<WindowDelta> {
        let (_, latest) = *track.samples.last()?;
        let window_start = now - self.thresholds.window.as_secs_f64();
        let base = track
            .samples
            .iter()
            .rev()
            .find(|(t, _)| *t <= window_start + EPSILON)
            .or_else(|| track.samples.first())?;
        Some(WindowDelta {
            delta: latest.minus(&base.1),
            since: base.0,
            seconds: (now - base.0).max(1e-3),
        })
    }

    /// Forgets the `count` longest idle tracks (their pairs are tracked
    /// again, from zero, when they move).
    fn forget_oldest(&mut self, count: usize) {
        let count = count.min(self.tracks.len());
        if count == 0 {
            return;
        }
        let older = |a: &(f64, Key), b: &(f64, Key)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        let mut by_age: Vec<(f64, Key)> =
            self.tracks.iter().map(|(k, t)| (t.last_seen, *k)).collect();
        // The `count` oldest are those up to the count-th: a selection,
        // not a sort (keys are unique, so exactly `count` go).
        let youngest_forgotten = *by_age.select_nth_unstable_by(count - 1, older).1;
        let before = self.tracks.len();
        self.tracks
            .retain(|k, t| older(&(t.last_seen, *k), &youngest_forgotten).is_gt());
        self.forgotten_peers += (before - self.tracks.len()) as u64;
    }
}

impl Track {
    /// The track of a pair first seen moving in the read after `zero_at`.
    fn new(zero_at: f64) -> Track {
        // Nothing before the previous read: a pair seen for the first time
        // (or again, after it was forgotten) had zero packets then.
        let samples = smallvec![(zero_at, Totals::default())];
        Track {
            samples,
            extra: Extra::default(),
            last_seen: zero_at,
        }
    }

    /// Adds what one row moved in the read at `now`; samples older than
    /// `keep_from` go, but for one base at or before the window's start.
    fn add(&mut self, part: &Part<'_>, now: f64, keep_from: f64) {
        if self.last_seen < now {
            // The pair's first row that moved in this read.
            let latest = self.samples.last().map_or(Totals::default(), |s| s.1);
            self.samples.push((now, latest));
            self.last_seen = now;
            let stale = self.samples[1..]
                .iter()
                .take_while(|(t, _)| *t <= keep_from)
                .count()
                .min(self.samples.len() - 2);
            self.samples.drain(..stale);
        }
        if let Some((_, totals)) = self.samples.last_mut() {
            part.add(Span::Interval, totals, &mut self.extra);
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
            // 10 of the 50 since the read at 4 s.
            &[Row {
                interval_packets: 10,
                ..flow("10.10.60.127", Proto::Vxlan, Direction::Tx, 50)
            }],
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
                Row {
                    interval_packets: 20,
                    ..flow("10.10.60.127", Proto::Vxlan, Direction::Tx, 70)
                },
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
    fn bgp_down_is_raised_once_and_cleared_with_its_duration() {
        use crate::model::bgp::{BgpSession, testing};
        let session = |bgp_state: &str| testing::session("10.0.0.2", bgp_state);
        let mut e = Engine::new(th(), 0.0);
        let mut known = known();
        let mut run = |e: &mut Engine, reads: &[(f64, &str)]| {
            let mut events = Vec::new();
            for (t, state) in reads {
                known.bgp = vec![session(state)];
                events.extend(e.observe(*t, SystemTime::UNIX_EPOCH, &[], &[], &known));
            }
            events
        };
        // Down for less than the window (5 s): a session coming up.
        let reads = [
            (1.0, "Established"),
            (2.0, "Active"),
            (3.0, "Connect"),
            (4.0, "Established"),
        ];
        assert_eq!(run(&mut e, &reads), vec![]);
        // Down from t = 5 to 12.5: raised at 10, a window after it was
        // first seen down, and cleared with the whole outage's duration.
        let reads = [
            (5.0, "Active"),
            (6.0, "Active"),
            (10.0, "Connect"),
            (12.5, "Established"),
        ];
        let events = run(&mut e, &reads);
        assert_eq!(events.len(), 2, "{events:?}");
        let Event::Raised(raised) = &events[0] else {
            panic!("{events:?}");
        };
        assert_eq!(
            (
                raised.kind,
                raised.peer,
                raised.evidence["bgp_state"].as_str()
            ),
            (Kind::BgpDown, "10.0.0.2".parse().unwrap(), Some("Connect"))
        );
        assert_eq!(raised.evidence["down_for_s"], 5.0);
        assert_eq!(
            raised.since,
            SystemTime::UNIX_EPOCH - Duration::from_secs(5),
            "starts when first seen down (the reads' wall clock is the epoch here)"
        );
        assert!(
            raised.summary.contains("Mesh_10_0_0_2"),
            "{}",
            raised.summary
        );
        let Event::Cleared { anomaly, duration } = &events[1] else {
            panic!("{events:?}");
        };
        assert_eq!(anomaly.evidence["bgp_state"].as_str(), Some("Connect"));
        assert_eq!(*duration, Duration::from_secs_f64(7.5));
        // A session without a neighbor address names no peer: not judged.
        let mut known = crate::model::anomalies::fixtures::known();
        known.bgp = vec![BgpSession {
            neighbor: None,
            ..session("Active")
        }];
        for t in [13.0, 20.0] {
            assert_eq!(
                e.observe(t, SystemTime::UNIX_EPOCH, &[], &[], &known),
                vec![]
            );
        }
    }

    #[test]
    fn bgp_down_at_the_wire_when_bird_does_not_report_the_peer() {
        use crate::model::bgp::testing;
        use crate::model::bgp_wire::WirePeer;
        let peer: IpAddr = "10.0.0.2".parse().unwrap();
        let mut e = Engine::new(th(), 0.0);
        let mut known = known();
        let ended = WirePeer {
            heard_s: Some(1.0),
            down_since_s: Some(2.0),
            ended_by: Some("NOTIFICATION Cease/Administrative Shutdown from the peer".into()),
            hold_time_s: (Some(6), Some(6)),
        };
        known.bgp_wire.insert(peer, ended.clone());
        // Within the window (5 s) of the end: not yet.
        assert_eq!(
            e.observe(6.0, SystemTime::UNIX_EPOCH, &[], &[], &known),
            vec![]
        );
        let events = e.observe(7.0, SystemTime::UNIX_EPOCH, &[], &[], &known);
        let [Event::Raised(raised)] = events.as_slice() else {
            panic!("{events:?}");
        };
        assert_eq!((raised.kind, raised.peer), (Kind::BgpDown, peer));
        assert_eq!(raised.evidence["source"], "wire");
        assert_eq!(raised.evidence["down_for_s"], 5.0);
        assert!(
            raised.summary.contains("Cease/Administrative Shutdown"),
            "{}",
            raised.summary
        );
        // BIRD reports the session: BIRD's view wins (Established here).
        known.bgp = vec![testing::session("10.0.0.2", "Established")];
        let events = e.observe(8.0, SystemTime::UNIX_EPOCH, &[], &[], &known);
        assert!(
            matches!(events.as_slice(), [Event::Cleared { .. }]),
            "{events:?}"
        );
        // A new session: up.
        known.bgp_wire.insert(
            peer,
            WirePeer {
                heard_s: Some(9.0),
                down_since_s: None,
                ended_by: None,
                ..ended
            },
        );
        for t in [9.0, 15.0] {
            assert_eq!(
                e.observe(t, SystemTime::UNIX_EPOCH, &[], &[], &known),
                vec![]
            );
        }
    }

    #[test]
    fn bgp_flap_counts_re_establishments_in_its_window() {
        use crate::model::bgp::{BgpSession, testing};
        let session = |state: &str, since: &str| BgpSession {
            since: since.into(),
            ..testing::session("10.0.0.2", state)
        };
        let mut e = Engine::new(th(), 0.0);
        let mut known = known();
        let mut kinds = Vec::new();
        let reads = [
            // First sight: its past is unknown, not counted.
            (1.0, "Established", "a"),
            (2.0, "Active", "b"),
            (3.0, "Established", "c"), // 1
            (4.0, "Established", "d"), // 2: down and up between reads
            // BIRD did not answer once: no flap when it answers again.
            (4.5, "Unknown", "d"),
            (5.0, "Established", "d"),
            (6.0, "Connect", "e"),
            (7.0, "Established", "f"), // 3: at the threshold
            (8.0, "Established", "g"), // 4: above it
            (300.0, "Established", "g"),
            // The window (600 s) has passed the first three.
            (605.0, "Established", "g"),
        ];
        for (t, state, since) in reads {
            known.bgp = vec![session(state, since)];
            for event in e.observe(t, SystemTime::UNIX_EPOCH, &[], &[], &known) {
                let (what, anomaly) = match &event {
                    Event::Raised(a) => ("raised", a),
                    Event::Cleared { anomaly, .. } => ("cleared", anomaly),
                };
                kinds.push((
                    t,
                    what,
                    anomaly.kind,
                    anomaly.evidence.get("re_established").cloned(),
                ));
            }
        }
        assert_eq!(
            kinds,
            vec![
                (8.0, "raised", Kind::BgpFlap, Some(4.into())),
                (605.0, "cleared", Kind::BgpFlap, Some(4.into())),
            ]
        );
    }

    #[test]
    fn route_missing_needs_a_whole_window_and_a_node_that_still_matters() {
        use crate::model::{
            bgp::testing,
            dataplane::{BlockRoute, NextHop},
            routes::MissingBlock,
        };
        let node: IpAddr = "10.99.0.2".parse().unwrap();
        let missing = |block: &str, since: f64| MissingBlock {
            block: block.parse().unwrap(),
            node,
            since,
            last_route: BlockRoute {
                block: block.parse().unwrap(),
                origin: 12,
                blackhole: false,
                next_hops: vec![NextHop {
                    device: "eth0".into(),
                    gateway: Some(node),
                    encap: None,
                    node: Some(node),
                }],
            },
        };
        let blocks = vec![missing("10.65.2.0/26", 2.0), missing("10.65.2.64/26", 3.0)];
        let mut e = Engine::new(th(), 0.0);
        let mut known = known();
        known.missing_blocks = blocks.clone();
        // Not a BGP peer, no traffic with it: a decommissioned node's
        // blocks go quietly.
        for t in [3.0, 8.0, 20.0] {
            assert_eq!(
                e.observe(t, SystemTime::UNIX_EPOCH, &[], &[], &known),
                vec![]
            );
        }

        // A BGP peer (down): raised a window after the first block went.
        let mut e = Engine::new(th(), 0.0);
        known.bgp = vec![testing::session("10.99.0.2", "Active")];
        assert_eq!(
            e.observe(6.5, SystemTime::UNIX_EPOCH, &[], &[], &known),
            vec![]
        );
        let events = e.observe(7.0, SystemTime::UNIX_EPOCH, &[], &[], &known);
        let route_missing: Vec<&Anomaly> = events
            .iter()
            .filter_map(|e| match e {
                Event::Raised(a) if a.kind == Kind::RouteMissing => Some(a),
                _ => None,
            })
            .collect();
        assert_eq!(route_missing.len(), 1, "{events:?}");
        let anomaly = route_missing[0];
        assert_eq!(anomaly.peer, node);
        assert_eq!(
            anomaly.evidence["blocks"],
            serde_json::json!(["10.65.2.0/26", "10.65.2.64/26"])
        );
        assert_eq!(anomaly.evidence["missing_for_s"], 5.0);
        assert_eq!(
            anomaly.evidence["last_route"],
            "via 10.99.0.2 dev eth0 proto bird"
        );
        assert_eq!(anomaly.evidence["bgp_state"], "Active");
        assert!(anomaly.hint.contains("bgp_down"), "{}", anomaly.hint);

        // The routes are back: cleared, lasting from the first block's loss.
        known.missing_blocks.clear();
        let events = e.observe(9.5, SystemTime::UNIX_EPOCH, &[], &[], &known);
        let cleared: Vec<Duration> = events
            .iter()
            .filter_map(|e| match e {
                Event::Cleared { anomaly, duration } if anomaly.kind == Kind::RouteMissing => {
                    Some(*duration)
                }
                _ => None,
            })
            .collect();
        assert_eq!(cleared, vec![Duration::from_secs_f64(7.5)]);

        // Tunnel traffic with the node within the window also makes it
        // matter, without BGP.
        let mut e = Engine::new(th(), 0.0);
        known.bgp.clear();
        known.missing_blocks = blocks;
        let events = drive(&mut e, &known, 8, |t| {
            (
                vec![flow(
                    "10.99.0.2",
                    Proto::Vxlan,
                    Direction::Rx,
                    10 * u64::from(t),
                )],
                vec![],
            )
        });
        assert!(
            raised(&events).contains(&(Kind::RouteMissing, "10.99.0.2".into())),
            "{events:?}"
        );
    }

    #[test]
    fn route_missing_when_the_import_filter_rejects_all_a_peer_sends() {
        use crate::model::bgp::{BgpSession, testing};
        let filtered = |imported| BgpSession {
            routes_imported: imported,
            updates_filtered: 2,
            ..testing::session("10.99.0.4", "Established")
        };
        let mut e = Engine::new(th(), 0.0);
        let mut known = known();
        known.bgp = vec![filtered(0)];
        assert_eq!(
            e.observe(1.0, SystemTime::UNIX_EPOCH, &[], &[], &known),
            vec![]
        );
        let events = e.observe(6.0, SystemTime::UNIX_EPOCH, &[], &[], &known);
        let [Event::Raised(missing)] = events.as_slice() else {
            panic!("{events:?}");
        };
        assert_eq!(
            (missing.kind, missing.peer.to_string()),
            (Kind::RouteMissing, "10.99.0.4".into())
        );
        assert_eq!(missing.evidence["updates_filtered"], 2);
        assert!(missing.hint.contains("import filter"), "{}", missing.hint);
        // One route accepted (the filter fixed): cleared.
        known.bgp = vec![filtered(1)];
        let events = e.observe(7.0, SystemTime::UNIX_EPOCH, &[], &[], &known);
        assert!(
            matches!(events.as_slice(), [Event::Cleared { .. }]),
            "{events:?}"
        );
    }

    #[test]
    fn route_conflict_and_stale_route_hold_a_window_first() {
        use crate::model::{
            bgp::testing,
            dataplane::{BlockRoute, NextHop},
        };
        let hop = |node: &str| NextHop {
            device: "eth0".into(),
            gateway: Some(node.parse().unwrap()),
            encap: None,
            node: Some(node.parse().unwrap()),
        };
        let tunnel = |hop: NextHop| NextHop {
            device: "vxlan.calico".into(),
            encap: Some(Proto::Vxlan),
            ..hop
        };
        let block = |net: &str, blackhole, hops: Vec<NextHop>| BlockRoute {
            block: net.parse().unwrap(),
            origin: 12,
            blackhole,
            next_hops: hops,
        };
        let mut known = known();
        known.blocks = vec![
            // Two owners: through the vxlan device to two nodes.
            block(
                "10.42.168.192/26",
                false,
                vec![tunnel(hop("10.10.60.127")), tunnel(hop("10.10.60.209"))],
            ),
            // ECMP over two direct next hops (two ToR switches, say): by
            // design, no conflict.
            block(
                "10.42.200.0/26",
                false,
                vec![hop("10.10.60.127"), hop("10.10.60.209")],
            ),
            // A node that left: routed to, in no allow-set, silent.
            block("10.42.99.0/26", false, vec![hop("10.10.60.99")]),
            // A blackhole beside a route: our block, or the node's?
            block("10.42.10.0/26", true, vec![hop("10.10.60.209")]),
        ];
        let keys = |events: &[Event]| -> Vec<(Kind, String, &'static str)> {
            events
                .iter()
                .map(|e| match e {
                    Event::Raised(a) => (a.kind, a.peer.to_string(), "raised"),
                    Event::Cleared { anomaly, .. } => {
                        (anomaly.kind, anomaly.peer.to_string(), "cleared")
                    }
                })
                .collect()
        };
        let mut e = Engine::new(th(), 0.0);
        // .99 was a node (a BGP session) at first; then it left.
        known.bgp = vec![testing::session("10.10.60.99", "Established")];
        assert_eq!(
            e.observe(0.5, SystemTime::UNIX_EPOCH, &[], &[], &known),
            vec![]
        );
        known.bgp.clear();
        assert_eq!(
            e.observe(1.0, SystemTime::UNIX_EPOCH, &[], &[], &known),
            vec![]
        );
        assert_eq!(
            e.observe(5.0, SystemTime::UNIX_EPOCH, &[], &[], &known),
            vec![]
        );
        let events = e.observe(6.0, SystemTime::UNIX_EPOCH, &[], &[], &known);
        assert_eq!(
            keys(&events),
            vec![
                (Kind::RouteConflict, "10.10.60.127".into(), "raised"),
                (Kind::RouteConflict, "10.10.60.209".into(), "raised"),
                (Kind::StaleRoute, "10.10.60.99".into(), "raised"),
            ]
        );
        let Event::Raised(conflict) = &events[1] else {
            unreachable!()
        };
        assert_eq!(
            conflict.evidence["blocks"],
            serde_json::json!(["10.42.168.192/26", "10.42.10.0/26"])
        );
        let Event::Raised(stale) = &events[2] else {
            unreachable!()
        };
        assert_eq!(
            stale.evidence["blocks"],
            serde_json::json!(["10.42.99.0/26"])
        );

        // BIRD has a session with it: still a node, no longer stale.
        known.bgp = vec![testing::session("10.10.60.99", "Established")];
        let events = e.observe(7.0, SystemTime::UNIX_EPOCH, &[], &[], &known);
        assert_eq!(
            keys(&events),
            vec![(Kind::StaleRoute, "10.10.60.99".into(), "cleared")]
        );

        // Its route withdrawn, then left behind again: still remembered.
        let all_blocks = known.blocks.clone();
        known.bgp = vec![testing::session("10.10.60.99", "Established")];
        let mut gap = Engine::new(th(), 0.0);
        gap.observe(0.5, SystemTime::UNIX_EPOCH, &[], &[], &known);
        known.bgp.clear();
        known
            .blocks
            .retain(|b| b.block.to_string() != "10.42.99.0/26");
        gap.observe(1.0, SystemTime::UNIX_EPOCH, &[], &[], &known);
        known.blocks = all_blocks;
        gap.observe(2.0, SystemTime::UNIX_EPOCH, &[], &[], &known);
        let events = gap.observe(7.5, SystemTime::UNIX_EPOCH, &[], &[], &known);
        assert!(
            events
                .iter()
                .any(|ev| matches!(ev, Event::Raised(a) if a.kind == Kind::StaleRoute)),
            "{events:?}"
        );

        // Never seen as a node here (behind a route reflector): not judged.
        let mut fresh = Engine::new(th(), 0.0);
        for t in [1.0, 7.0] {
            let events = fresh.observe(t, SystemTime::UNIX_EPOCH, &[], &[], &known);
            assert!(
                events
                    .iter()
                    .all(|ev| !matches!(ev, Event::Raised(a) if a.kind == Kind::StaleRoute)),
                "{events:?}"
            );
        }

        // Traffic with it also says it is a node; so do no membership
        // sources at all (nothing to judge by).
        let mut e = Engine::new(th(), 0.0);
        known.bgp.clear();
        let events = drive(&mut e, &known, 8, |t| {
            (
                vec![flow(
                    "10.10.60.99",
                    Proto::Vxlan,
                    Direction::Rx,
                    10 * u64::from(t),
                )],
                vec![],
            )
        });
        assert!(
            !raised(&events).iter().any(|(k, _)| *k == Kind::StaleRoute),
            "{events:?}"
        );
        let mut e = Engine::new(th(), 0.0);
        known.allow = None;
        for t in [1.0, 7.0] {
            let events = e.observe(t, SystemTime::UNIX_EPOCH, &[], &[], &known);
            assert!(
                events
                    .iter()
                    .all(|ev| !matches!(ev, Event::Raised(a) if a.kind == Kind::StaleRoute))
            );
        }
    }

    #[test]
    fn an_idle_tunnel_raises_nothing_even_with_no_packet_minimum() {
        let mut e = Engine::new(
            Thresholds {
                min_packets: 0,
                ..th()
            },
            0.0,
        );
        // 10 packets sent in the first second, then nothing: one way while
        // they are in the window, then idle.
        let events = drive(&mut e, &known(), 30, |_| {
            (
                vec![flow("10.10.60.127", Proto::Vxlan, Direction::Tx, 10)],
                vec![],
            )
        });
        assert_eq!(raised(&events), vec![(Kind::OneWay, "10.10.60.127".into())]);
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
        // Listed in reverse, so that raising in key order is not reading
        // order.
        let reversed: Vec<Row> = rows.iter().rev().cloned().collect();
        let events = e.observe(1.0, SystemTime::UNIX_EPOCH, &reversed, &[], &known());
        assert_eq!(events.len(), MAX_ACTIVE);
        assert_eq!(e.active().len(), MAX_ACTIVE);
        assert_eq!(e.suppressed(), 10);
        // The lowest sources are raised, each with its texts; the ten
        // highest only counted.
        let peers: Vec<IpAddr> = events
            .iter()
            .map(|event| match event {
                Event::Raised(a) => {
                    assert!(!a.summary.is_empty() && !a.hint.is_empty(), "{a:?}");
                    assert_eq!(a.evidence["received"], 1);
                    a.peer
                }
                other => panic!("{other:?}"),
            })
            .collect();
        let lowest: Vec<IpAddr> = rows[..MAX_ACTIVE]
            .iter()
            .map(|r| r.id.peer.unwrap())
            .collect();
        assert_eq!(peers, lowest);
        // Still holding a read later: the running ones stay (their texts
        // updated), the others are counted again.
        let totals = |packets: u64| -> Vec<Row> {
            rows.iter()
                .map(|r| Row {
                    packets,
                    interval_packets: 2,
                    ..r.clone()
                })
                .collect()
        };
        let events = e.observe(2.0, SystemTime::UNIX_EPOCH, &totals(3), &[], &known());
        assert!(events.is_empty(), "{events:?}");
        assert_eq!(e.suppressed(), 20);
        assert!(e.active().iter().all(|a| a.evidence["received"] == 3));
        // When the first hundred stop, the waiting ten are raised with
        // room to spare.
        let events = e.observe(
            60.0,
            SystemTime::UNIX_EPOCH,
            &totals(5)[100..],
            &[],
            &known(),
        );
        let cleared = events
            .iter()
            .filter(|e| matches!(e, Event::Cleared { .. }))
            .count();
        assert_eq!(cleared, 100);
        let raised: Vec<IpAddr> = events
            .iter()
            .filter_map(|e| match e {
                Event::Raised(a) => Some(a.peer),
                _ => None,
            })
            .collect();
        let waiting: Vec<IpAddr> = rows[MAX_ACTIVE..]
            .iter()
            .map(|r| r.id.peer.unwrap())
            .collect();
        assert_eq!(raised, waiting);
    }

    #[test]
    fn new_pairs_never_push_out_pairs_that_moved_in_the_same_read() {
        let mut e = Engine::new(th(), 0.0);
        let row = |i: u32, packets: u64| {
            let mut r = flow("10.0.0.0", Proto::Vxlan, Direction::Tx, packets);
            r.id.peer = Some(IpAddr::from(Ipv4Addr::from(0x0a00_0000 + i)));
            r
        };
        let tracked: Vec<Row> = (0..MAX_TRACKED_PEERS as u32).map(|i| row(i, 1)).collect();
        e.observe(
            1.0,
            SystemTime::UNIX_EPOCH,
            &tracked,
            &[],
            &Known::default(),
        );
        // All of them move again, and 10 sources are new: no room for
        // those, which are only counted.
        let mut rows: Vec<Row> = tracked
            .iter()
            .map(|r| Row {
                packets: 2,
                ..r.clone()
            })
            .collect();
        rows.extend((0..10).map(|i| row(MAX_TRACKED_PEERS as u32 + i, 1)));
        e.observe(2.0, SystemTime::UNIX_EPOCH, &rows, &[], &Known::default());
        assert_eq!(e.forgotten_peers(), 10);
        assert!(
            tracked
                .iter()
                .all(|r| e.tracks.get(&(r.id.peer.unwrap(), r.id.proto)).is_some())
        );
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

        // Idle since: the forgotten pairs are not made again (and others
        // forgotten in their place) at every read.
        let mut rows = rows;
        for r in &mut rows {
            r.interval_packets = 0;
        }
        e.observe(2.0, SystemTime::UNIX_EPOCH, &rows, &[], &Known::default());
        assert_eq!(e.tracks.len(), MAX_TRACKED_PEERS);
        assert_eq!(e.forgotten_peers(), 100);

        // A forgotten pair that moves again is tracked anew with what it
        // moved since the previous read: 2 packets in the window, not the
        // 3 it has in all.
        let forgotten = rows
            .iter_mut()
            .find(|r| e.tracks.get(&(r.id.peer.unwrap(), r.id.proto)).is_none())
            .expect("a forgotten pair");
        forgotten.packets = 3;
        forgotten.interval_packets = 2;
        let key = (forgotten.id.peer.unwrap(), forgotten.id.proto);
        e.observe(3.0, SystemTime::UNIX_EPOCH, &rows, &[], &Known::default());
        let track = e.tracks.get(&key).expect("tracked");
        let window = e.window_delta(track, 3.0).expect("samples");
        assert_eq!((window.delta.tx, window.since), (2, 2.0));
        assert_eq!(e.forgotten_peers(), 101);
    }
}
