//! BGP at the wire: the TCP/179 segments the programs counted per
//! (interface, direction, peer), as totals since attach, and what they say
//! of each peer's session without asking BIRD (when the peer was last
//! heard, when the session last ended and how). The facts behind
//! `bgp_wire` lines, the `observer_bgp_wire_*` series and the wire's
//! `bgp_down`.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
};

use observer_common::{BgpCounters, BgpKey, Direction, bgp_message};
use serde::Serialize;

use super::rows::decode_addr;

/// One (interface, direction, peer) of the BGP map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WireId {
    /// The other end: source on rx, destination on tx.
    pub peer: IpAddr,
    /// Interface index.
    pub ifindex: u32,
    /// Direction on that interface.
    pub direction: Direction,
}

impl WireId {
    /// Decodes a kernel key; `None` for a key without an address.
    pub fn from_key(key: &BgpKey) -> Option<WireId> {
        Some(WireId {
            peer: decode_addr(&key.peer, key.peer_family)?,
            ifindex: key.ifindex,
            direction: if key.direction == Direction::Tx as u8 {
                Direction::Tx
            } else {
                Direction::Rx
            },
        })
    }
}

/// A NOTIFICATION's error code and subcode (RFC 4271 4.5); serialized
/// with its [`Notification::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification {
    /// Error code.
    pub code: u8,
    /// Error subcode.
    pub subcode: u8,
}

impl Notification {
    /// Decodes `code << 8 | subcode`.
    pub fn from_word(word: u64) -> Notification {
        Notification {
            code: (word >> 8) as u8,
            subcode: word as u8,
        }
    }

    /// The names RFC 4271 6 and the Cease subcodes of RFC 4486 / 8538 /
    /// 9384 give it, as `code/subcode` text (`Cease/Administrative
    /// Shutdown`); numbers for codes they do not name.
    pub fn name(&self) -> String {
        let code = match self.code {
            1 => "Message Header Error",
            2 => "OPEN Message Error",
            3 => "UPDATE Message Error",
            4 => "Hold Timer Expired",
            5 => "Finite State Machine Error",
            6 => "Cease",
            7 => "ROUTE-REFRESH Message Error",
            _ => return format!("code {}/subcode {}", self.code, self.subcode),
        };
        let subcode = match (self.code, self.subcode) {
            (_, 0) => return code.to_string(),
            (6, 1) => "Maximum Number of Prefixes Reached",
            (6, 2) => "Administrative Shutdown",
            (6, 3) => "Peer De-configured",
            (6, 4) => "Administrative Reset",
            (6, 5) => "Connection Rejected",
            (6, 6) => "Other Configuration Change",
            (6, 7) => "Connection Collision Resolution",
            (6, 8) => "Out of Resources",
            (6, 9) => "Hard Reset",
            (6, 10) => "BFD Down",
            (_, subcode) => return format!("{code}/subcode {subcode}"),
        };
        format!("{code}/{subcode}")
    }
}

impl Serialize for Notification {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("Notification", 3)?;
        s.serialize_field("code", &self.code)?;
        s.serialize_field("subcode", &self.subcode)?;
        s.serialize_field("name", &self.name())?;
        s.end()
    }
}

/// Counters of one [`WireId`]: the counter fields of a `bgp_wire` line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WireCounters {
    /// When the kernel created the key (not printed): tells a key the LRU
    /// evicted and created again.
    #[serde(skip)]
    pub created_ns: u64,
    /// TCP segments.
    pub segments: u64,
    /// Segments with SYN.
    pub syn: u64,
    /// Segments with FIN.
    pub fin: u64,
    /// Segments with RST.
    pub rst: u64,
    /// Segments starting with an OPEN.
    pub open: u64,
    /// Segments starting with an UPDATE.
    pub update: u64,
    /// Segments starting with a NOTIFICATION.
    pub notification: u64,
    /// Segments starting with a KEEPALIVE.
    pub keepalive: u64,
    /// Segments starting with a ROUTE-REFRESH.
    pub route_refresh: u64,
    /// The latest NOTIFICATION.
    pub last_notification: Option<Notification>,
    /// The hold time (seconds) the latest OPEN proposed.
    pub hold_time_s: Option<u16>,
}

impl WireCounters {
    /// Decodes one key's value.
    pub fn from_value(v: &BgpCounters) -> WireCounters {
        WireCounters {
            created_ns: v.created_ns,
            segments: v.segments,
            syn: v.syn,
            fin: v.fin,
            rst: v.rst,
            open: v.messages[bgp_message::OPEN as usize],
            update: v.messages[bgp_message::UPDATE as usize],
            notification: v.messages[bgp_message::NOTIFICATION as usize],
            keepalive: v.messages[bgp_message::KEEPALIVE as usize],
            route_refresh: v.messages[bgp_message::ROUTE_REFRESH as usize],
            last_notification: (v.last_notification_ns != 0)
                .then(|| Notification::from_word(v.last_notification)),
            hold_time_s: (v.hold_time_ns != 0).then_some(v.hold_time as u16),
        }
    }

    /// What `self` (a later reading of the same key) added to `before`. A
    /// key the LRU evicted and created again (its creation time differs)
    /// starts from zero: then all of `self` is new.
    fn since(&self, before: &WireCounters) -> WireCounters {
        let restarted = self.created_ns != before.created_ns;
        let delta = |now: u64, then: u64| if restarted { now } else { now - then.min(now) };
        WireCounters {
            created_ns: self.created_ns,
            segments: delta(self.segments, before.segments),
            syn: delta(self.syn, before.syn),
            fin: delta(self.fin, before.fin),
            rst: delta(self.rst, before.rst),
            open: delta(self.open, before.open),
            update: delta(self.update, before.update),
            notification: delta(self.notification, before.notification),
            keepalive: delta(self.keepalive, before.keepalive),
            route_refresh: delta(self.route_refresh, before.route_refresh),
            last_notification: self.last_notification,
            hold_time_s: self.hold_time_s,
        }
    }

    fn add(&mut self, other: &WireCounters) {
        self.segments += other.segments;
        self.syn += other.syn;
        self.fin += other.fin;
        self.rst += other.rst;
        self.open += other.open;
        self.update += other.update;
        self.notification += other.notification;
        self.keepalive += other.keepalive;
        self.route_refresh += other.route_refresh;
        self.last_notification = other.last_notification.or(self.last_notification);
        self.hold_time_s = other.hold_time_s.or(self.hold_time_s);
    }
}

/// One key's totals since attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireRow {
    /// The key.
    pub id: WireId,
    /// Totals since attach (across evictions of the kernel key).
    pub total: WireCounters,
    /// Whether anything was added this interval.
    pub changed: bool,
}

/// What the wire says of one peer's session, over all interfaces (times
/// on the engine's clock, seconds since attach).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WirePeer {
    /// When a message from the peer (OPEN, UPDATE, KEEPALIVE) was last
    /// counted: the hold timer restarts on each.
    pub heard_s: Option<f64>,
    /// Since when the session is down at the wire: it ended (a
    /// NOTIFICATION either way, an RST or a FIN) and no new one opened.
    pub down_since_s: Option<f64>,
    /// How it ended (`NOTIFICATION Cease/Administrative Shutdown from the
    /// peer`, `RST`, `FIN`).
    pub ended_by: Option<String>,
    /// The hold time the peer's latest OPEN proposed, and ours; the
    /// session uses the smaller (RFC 4271 4.2).
    pub hold_time_s: (Option<u16>, Option<u16>),
}

impl WirePeer {
    /// The session's hold time, once both OPENs were seen (0: no hold
    /// timer, RFC 4271).
    pub fn hold_time_s(&self) -> Option<u16> {
        match self.hold_time_s {
            (Some(theirs), Some(ours)) => Some(theirs.min(ours)),
            _ => None,
        }
    }

    /// Takes what one reading added on all of the peer's keys.
    fn take(&mut self, now: f64, read: PeerRead) {
        if read.hold_time_s.0.is_some() {
            self.hold_time_s.0 = read.hold_time_s.0;
        }
        if read.hold_time_s.1.is_some() {
            self.hold_time_s.1 = read.hold_time_s.1;
        }
        // Within one reading the order of segments is lost. An end (a
        // NOTIFICATION either way, an RST, a FIN) ends the session unless
        // the peer also sent an OPEN and then KEEPALIVEs or UPDATEs: that
        // reading is ambiguous (a reset that came back, or a reconnect
        // refused after the OPENs) and changes nothing. KEEPALIVEs or
        // UPDATEs without an end mean it is up (an OPEN alone is a session
        // still opening). Only a peer that spoke BGP is judged: a probe or
        // a scan of port 179 (SYN, then RST or FIN) is no session. The
        // first end counts: the reconnects the peer then refuses are not
        // new ends.
        let spoke = self.heard_s.is_some() || read.heard;
        let reopened = read.opened && read.established;
        match read.end {
            Some((_, by)) if spoke && !reopened && self.down_since_s.is_none() => {
                self.down_since_s = Some(now);
                self.ended_by = Some(by);
            }
            None if read.established => {
                self.down_since_s = None;
                self.ended_by = None;
            }
            _ => {}
        }
        if read.heard {
            self.heard_s = Some(now);
        }
    }
}

/// What one reading added for one peer, over its keys.
#[derive(Debug, Default)]
struct PeerRead {
    /// A message from the peer (OPEN, UPDATE, KEEPALIVE).
    heard: bool,
    /// An OPEN from the peer.
    opened: bool,
    /// A KEEPALIVE or UPDATE from the peer: a session past its OPENs.
    established: bool,
    /// Hold times of the OPENs (the peer's, ours).
    hold_time_s: (Option<u16>, Option<u16>),
    /// The strongest sign of an end (NOTIFICATION over RST over FIN),
    /// ranked, and how to name it.
    end: Option<(u8, String)>,
}

impl PeerRead {
    fn add(&mut self, direction: Direction, delta: &WireCounters) {
        let from_peer = direction == Direction::Rx;
        if from_peer {
            self.heard |= delta.open + delta.update + delta.keepalive > 0;
            self.opened |= delta.open > 0;
            self.established |= delta.update + delta.keepalive > 0;
        }
        if delta.open > 0 {
            let hold = if from_peer {
                &mut self.hold_time_s.0
            } else {
                &mut self.hold_time_s.1
            };
            *hold = delta.hold_time_s;
        }
        let end = if delta.notification > 0 {
            let name = delta
                .last_notification
                .map_or_else(|| "unknown".to_string(), |n| n.name());
            let side = if from_peer { "from" } else { "to" };
            Some((3, format!("NOTIFICATION {name} {side} the peer")))
        } else if delta.rst > 0 {
            Some((2, "RST".to_string()))
        } else if delta.fin > 0 {
            Some((1, "FIN".to_string()))
        } else {
            None
        };
        if let Some(end) = end
            && self.end.as_ref().is_none_or(|(rank, _)| end.0 > *rank)
        {
            self.end = Some(end);
        }
    }
}

/// Follows the BGP map from one reading to the next; as bounded as the
/// map (`BGP_MAX_KEYS` keys), since a key gone from it is forgotten.
#[derive(Debug, Default)]
pub struct WireTracker {
    /// The last kernel reading of each key, and the totals since attach.
    keys: HashMap<WireId, (WireCounters, WireCounters)>,
    /// Per peer, what the wire says of its session.
    peers: BTreeMap<IpAddr, WirePeer>,
}

impl WireTracker {
    /// Takes a reading of the BGP map at `now`; returns every key's totals
    /// since attach, sorted by key. Keys gone from the map (LRU eviction)
    /// are forgotten with it, so the tracker stays as bounded as the map.
    pub fn update(&mut self, now: f64, reading: &[(WireId, WireCounters)]) -> Vec<WireRow> {
        let mut keys = HashMap::with_capacity(reading.len());
        let mut rows = Vec::with_capacity(reading.len());
        let mut reads: BTreeMap<IpAddr, PeerRead> = BTreeMap::new();
        for (id, counters) in reading {
            let (last, mut total) = self.keys.get(id).copied().unwrap_or_default();
            let delta = counters.since(&last);
            total.add(&delta);
            let changed = delta.segments > 0;
            if changed {
                reads.entry(id.peer).or_default().add(id.direction, &delta);
            }
            keys.insert(*id, (*counters, total));
            rows.push(WireRow {
                id: *id,
                total,
                changed,
            });
        }
        for (peer, read) in reads {
            self.peers.entry(peer).or_default().take(now, read);
        }
        self.keys = keys;
        let live: BTreeSet<IpAddr> = reading.iter().map(|(id, _)| id.peer).collect();
        self.peers.retain(|peer, _| live.contains(peer));
        rows.sort_by_key(|row| row.id);
        rows
    }

    /// What the wire says of each peer's session.
    pub fn peers(&self) -> &BTreeMap<IpAddr, WirePeer> {
        &self.peers
    }
}

/// The wire's verdict on a peer at `now`: since when its session is down
/// and why, or `None` when the wire has no sign of it. Down when the
/// session ended (NOTIFICATION, RST, FIN) and no new one opened, or when
/// the peer was silent longer than the session's hold time.
pub fn down_at_wire(peer: &WirePeer, now: f64) -> Option<(f64, String)> {
    if let (Some(since), Some(by)) = (peer.down_since_s, &peer.ended_by) {
        return Some((since, format!("session ended at the wire: {by}")));
    }
    let hold = f64::from(peer.hold_time_s().filter(|h| *h > 0)?);
    let heard = peer.heard_s?;
    (now - heard > hold).then(|| {
        (
            heard + hold,
            format!(
                "nothing heard from the peer for {:.0} s, longer than the session's hold time of {hold:.0} s",
                now - heard
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(peer: &str, direction: Direction) -> WireId {
        WireId {
            peer: peer.parse().unwrap(),
            ifindex: 2,
            direction,
        }
    }

    /// A key created at 1 ns with `segments`, `keepalive` KEEPALIVEs.
    fn counters(segments: u64, keepalive: u64) -> WireCounters {
        WireCounters {
            created_ns: 1,
            segments,
            keepalive,
            ..WireCounters::default()
        }
    }

    /// The totals `rows` print for `counters` (no creation time).
    fn total(segments: u64, keepalive: u64) -> WireCounters {
        WireCounters {
            created_ns: 0,
            ..counters(segments, keepalive)
        }
    }

    const PEER: &str = "10.0.0.2";

    fn peer() -> IpAddr {
        PEER.parse().unwrap()
    }

    #[test]
    fn notification_names_follow_the_rfcs() {
        assert_eq!(
            Notification::from_word(0x0602).name(),
            "Cease/Administrative Shutdown"
        );
        assert_eq!(Notification::from_word(0x0400).name(), "Hold Timer Expired");
        assert_eq!(
            Notification::from_word(0x0203).name(),
            "OPEN Message Error/subcode 3"
        );
        assert_eq!(Notification::from_word(0x0901).name(), "code 9/subcode 1");
    }

    #[test]
    fn a_kernel_value_decodes_with_its_latest_notification_and_open() {
        let mut value = BgpCounters {
            created_ns: 7,
            segments: 5,
            rst: 1,
            last_notification: 0x0400,
            last_notification_ns: 20,
            hold_time: 9,
            hold_time_ns: 5,
            ..BgpCounters::default()
        };
        value.messages[bgp_message::NOTIFICATION as usize] = 2;
        value.messages[bgp_message::OPEN as usize] = 1;
        value.messages[bgp_message::NONE as usize] = 2;
        let decoded = WireCounters::from_value(&value);
        assert_eq!(
            decoded,
            WireCounters {
                created_ns: 7,
                segments: 5,
                rst: 1,
                notification: 2,
                open: 1,
                last_notification: Some(Notification {
                    code: 4,
                    subcode: 0
                }),
                hold_time_s: Some(9),
                ..WireCounters::default()
            }
        );
        // Never seen: none, not code 0 or hold time 0.
        let quiet = WireCounters::from_value(&BgpCounters::default());
        assert_eq!((quiet.last_notification, quiet.hold_time_s), (None, None));
    }

    #[test]
    fn totals_survive_an_evicted_and_recreated_key() {
        let mut tracker = WireTracker::default();
        let rx = id(PEER, Direction::Rx);
        tracker.update(1.0, &[(rx, counters(10, 4))]);
        let rows = tracker.update(2.0, &[(rx, counters(12, 5))]);
        assert_eq!(rows[0].total, total(12, 5));
        assert!(rows[0].changed);
        // Evicted and created again (a new creation time), already past
        // its old count: all of it is new.
        let again = WireCounters {
            created_ns: 2,
            ..counters(13, 6)
        };
        let rows = tracker.update(3.0, &[(rx, again)]);
        assert_eq!(rows[0].total, total(25, 11));
        let rows = tracker.update(4.0, &[(rx, again)]);
        assert!(!rows[0].changed);
        // Gone from the map: forgotten, peer included.
        assert!(tracker.update(5.0, &[]).is_empty());
        assert!(tracker.peers().is_empty());
    }

    /// A reading of `rx` and `tx` (cumulative counters) at `t`; the peer's
    /// wire verdict at `t`.
    fn read(
        tracker: &mut WireTracker,
        t: f64,
        rx: WireCounters,
        tx: WireCounters,
    ) -> Option<(f64, String)> {
        let (rx_id, tx_id) = (id(PEER, Direction::Rx), id(PEER, Direction::Tx));
        tracker.update(t, &[(tx_id, tx), (rx_id, rx)]);
        tracker
            .peers()
            .get(&peer())
            .and_then(|p| down_at_wire(p, t))
    }

    #[test]
    fn a_session_ended_by_a_notification_is_down_until_keepalives_return() {
        let mut tracker = WireTracker::default();
        let mut rx = counters(1, 1);
        let mut tx = counters(1, 0);
        assert_eq!(read(&mut tracker, 1.0, rx, tx), None);
        // A KEEPALIVE, then the NOTIFICATION, and our FIN, in one reading:
        // down, named by the NOTIFICATION.
        rx.segments += 2;
        rx.keepalive += 1;
        rx.notification += 1;
        rx.last_notification = Some(Notification::from_word(0x0602));
        tx.segments += 1;
        tx.fin += 1;
        let (since, why) = read(&mut tracker, 2.0, rx, tx).unwrap();
        assert_eq!(since, 2.0);
        assert_eq!(
            why,
            "session ended at the wire: NOTIFICATION Cease/Administrative Shutdown from the peer"
        );
        // Our reconnects, refused by the peer's kernel: the end stays.
        rx.segments += 1;
        rx.rst += 1;
        tx.segments += 1;
        tx.syn += 1;
        assert_eq!(read(&mut tracker, 3.0, rx, tx).unwrap().0, 2.0);
        // The peer opens again, but our side refuses it (OPEN, then a
        // NOTIFICATION, in one reading): still down.
        rx.segments += 1;
        rx.open += 1;
        rx.hold_time_s = Some(6);
        tx.segments += 1;
        tx.notification += 1;
        assert_eq!(read(&mut tracker, 4.0, rx, tx).unwrap().0, 2.0);
        // An OPEN alone: still opening, still down.
        rx.segments += 1;
        rx.open += 1;
        assert_eq!(read(&mut tracker, 5.0, rx, tx).unwrap().0, 2.0);
        // KEEPALIVEs and no end: up.
        rx.segments += 1;
        rx.keepalive += 1;
        assert_eq!(read(&mut tracker, 6.0, rx, tx), None);
    }

    #[test]
    fn a_reset_that_came_back_within_one_reading_changes_nothing() {
        let mut tracker = WireTracker::default();
        let mut rx = counters(1, 1);
        let tx = counters(1, 0);
        read(&mut tracker, 1.0, rx, tx);
        rx.segments += 3;
        rx.notification += 1;
        rx.open += 1;
        rx.keepalive += 1;
        assert_eq!(read(&mut tracker, 2.0, rx, tx), None);
    }

    #[test]
    fn a_probe_of_port_179_is_no_session() {
        let mut tracker = WireTracker::default();
        let rx = WireCounters {
            syn: 1,
            rst: 1,
            ..counters(2, 0)
        };
        let tx = WireCounters {
            syn: 1,
            ..counters(1, 0)
        };
        for t in [1.0, 10.0, 100.0] {
            assert_eq!(read(&mut tracker, t, rx, tx), None);
        }
    }

    #[test]
    fn a_peer_silent_longer_than_the_hold_time_is_down() {
        let mut tracker = WireTracker::default();
        let open = |hold| WireCounters {
            open: 1,
            hold_time_s: Some(hold),
            ..counters(1, 0)
        };
        read(&mut tracker, 1.0, open(9), open(6));
        assert_eq!(tracker.peers()[&peer()].hold_time_s(), Some(6));
        assert_eq!(down_at_wire(&tracker.peers()[&peer()], 7.0), None);
        let (since, why) = down_at_wire(&tracker.peers()[&peer()], 8.0).unwrap();
        assert_eq!(since, 7.0);
        assert!(why.contains("hold time of 6 s"), "{why}");
    }
}
