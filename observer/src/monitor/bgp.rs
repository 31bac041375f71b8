//! The BGP sessions a monitor follows: the latest readings of the BIRD
//! control sockets (read on `node::bird`'s thread), what changed since
//! the previous interval, and each socket's status, logged once per
//! change (an absent socket is said once, not every interval).

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use crate::{
    model::bgp::{BgpSession, BirdReading, UNKNOWN, same_since},
    node::bird::BirdWatcher,
    parse::bird,
};

/// A socket's status as reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketStatus {
    /// Read; this many sessions.
    Ok(usize),
    /// Not there.
    Absent,
    /// Not readable: why.
    Failed(String),
}

impl SocketStatus {
    /// The `status` of a `bird_socket` line.
    pub fn name(&self) -> &'static str {
        match self {
            SocketStatus::Ok(_) => "ok",
            SocketStatus::Absent => "absent",
            SocketStatus::Failed(_) => "failed",
        }
    }
}

/// What one interval's readings changed.
#[derive(Debug, Default)]
pub struct BgpChanges {
    /// Sockets whose status changed, with the new status.
    pub sockets: Vec<(String, SocketStatus)>,
    /// Sessions that are new or differ from the previous interval's.
    pub sessions: Vec<BgpSession>,
    /// Sessions BIRD no longer has (a protocol removed from its config),
    /// as last read.
    pub removed: Vec<BgpSession>,
}

/// The followed sessions.
pub struct BgpFollower {
    watcher: Option<BirdWatcher>,
    period: Duration,
    status: BTreeMap<PathBuf, SocketStatus>,
    /// Every session as last read, by socket and protocol. A socket that
    /// fails (or goes away after it answered) keeps its sessions, in
    /// state [`UNKNOWN`].
    sessions: BTreeMap<PathBuf, BTreeMap<String, BgpSession>>,
}

impl BgpFollower {
    /// Starts reading `sockets` every `period` (nothing without sockets).
    pub fn start(sockets: Vec<PathBuf>, period: Duration) -> BgpFollower {
        BgpFollower {
            watcher: (!sockets.is_empty()).then(|| BirdWatcher::start(sockets, period)),
            period,
            status: BTreeMap::new(),
            sessions: BTreeMap::new(),
        }
    }

    /// Takes the latest readings; returns what changed.
    pub fn refresh(&mut self) -> BgpChanges {
        let Some(watcher) = &self.watcher else {
            return BgpChanges::default();
        };
        // A reading thread stuck for three periods (and its timeouts) is a
        // BIRD that does not answer.
        let readings = watcher.latest(3 * self.period + 2 * bird::TIMEOUT);
        self.apply(readings)
    }

    /// Takes `readings` in; returns what changed.
    fn apply(&mut self, readings: Vec<(PathBuf, BirdReading)>) -> BgpChanges {
        let mut changes = BgpChanges::default();
        for (socket, reading) in readings {
            let status = match &reading {
                BirdReading::Sessions(s) => SocketStatus::Ok(s.len()),
                BirdReading::Absent => SocketStatus::Absent,
                BirdReading::Failed(e) => SocketStatus::Failed(e.clone()),
            };
            let was = self.status.insert(socket.clone(), status.clone());
            // A count of sessions that changed is said by the session lines.
            let same = match (&was, &status) {
                (Some(SocketStatus::Ok(_)), SocketStatus::Ok(_)) => true,
                (Some(old), new) => old == new,
                (None, _) => false,
            };
            if !same {
                changes
                    .sockets
                    .push((socket.display().to_string(), status.clone()));
            }
            let known = self.sessions.entry(socket).or_default();
            let now: Vec<BgpSession> = match reading {
                BirdReading::Sessions(now) => now,
                // Gone or not answering: whatever BIRD said last no longer
                // holds, and a dead BIRD serves no routes.
                BirdReading::Absent | BirdReading::Failed(_) => {
                    let why = match &status {
                        SocketStatus::Failed(e) => format!("BIRD not answering: {e}"),
                        _ => "BIRD's control socket is gone".to_string(),
                    };
                    known
                        .values()
                        .map(|s| BgpSession {
                            bgp_state: UNKNOWN.to_string(),
                            last_error: Some(why.clone()),
                            ..s.clone()
                        })
                        .collect()
                }
            };
            let mut next = BTreeMap::new();
            for mut session in now {
                // One instant, printed a millisecond apart: not a change
                // (and no re-establishment for bgp_flap).
                if let Some(old) = known.get(&session.protocol)
                    && same_since(&old.since, &session.since)
                {
                    session.since.clone_from(&old.since);
                }
                if known.get(&session.protocol) != Some(&session) {
                    changes.sessions.push(session.clone());
                }
                next.insert(session.protocol.clone(), session);
            }
            let before = std::mem::replace(known, next);
            changes.removed.extend(
                before
                    .into_values()
                    .filter(|s| !known.contains_key(&s.protocol)),
            );
        }
        changes
    }

    /// Every session as last read.
    pub fn sessions(&self) -> Vec<BgpSession> {
        self.sessions
            .values()
            .flat_map(|by_protocol| by_protocol.values())
            .cloned()
            .collect()
    }

    /// Each socket and whether it answered at the last reading.
    pub fn socket_status(&self) -> Vec<(String, bool)> {
        self.status
            .iter()
            .map(|(socket, status)| {
                let up = matches!(status, SocketStatus::Ok(_));
                (socket.display().to_string(), up)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::bgp::testing::session;

    /// A follower fed `readings` directly, one refresh each.
    fn feed(readings: Vec<BirdReading>) -> (BgpFollower, Vec<BgpChanges>) {
        let mut follower = BgpFollower {
            watcher: None,
            period: Duration::from_secs(1),
            status: BTreeMap::new(),
            sessions: BTreeMap::new(),
        };
        let changes = readings
            .into_iter()
            .map(|r| follower.apply(vec![(PathBuf::from("bird.ctl"), r)]))
            .collect();
        (follower, changes)
    }

    #[test]
    fn a_bird_that_stops_answering_leaves_its_sessions_unknown() {
        let up = session("10.0.0.2", "Established");
        let (follower, changes) = feed(vec![
            BirdReading::Sessions(vec![up.clone()]),
            BirdReading::Sessions(vec![up.clone()]),
            BirdReading::Failed("bird.ctl: Connection refused".into()),
            BirdReading::Failed("bird.ctl: Connection refused".into()),
            BirdReading::Absent,
        ]);
        // New at first; unchanged then; unknown once it fails (said once).
        let said: Vec<usize> = changes.iter().map(|c| c.sessions.len()).collect();
        assert_eq!(said, vec![1, 0, 1, 0, 1]);
        let failed = &changes[2].sessions[0];
        assert_eq!(failed.bgp_state, UNKNOWN);
        assert!(!failed.established());
        assert_eq!(
            failed.last_error.as_deref(),
            Some("BIRD not answering: bird.ctl: Connection refused")
        );
        let statuses: Vec<Vec<&str>> = changes
            .iter()
            .map(|c| c.sockets.iter().map(|(_, s)| s.name()).collect())
            .collect();
        assert_eq!(
            statuses,
            vec![vec!["ok"], vec![], vec!["failed"], vec![], vec!["absent"]]
        );
        assert_eq!(follower.sessions()[0].bgp_state, UNKNOWN);
        assert_eq!(
            follower.socket_status(),
            vec![("bird.ctl".to_string(), false)]
        );
    }

    #[test]
    fn a_since_printed_a_millisecond_apart_is_no_change() {
        let at = |since: &str| BgpSession {
            since: since.into(),
            ..session("10.0.0.2", "Established")
        };
        let (follower, changes) = feed(vec![
            BirdReading::Sessions(vec![at("11:28:31.894")]),
            BirdReading::Sessions(vec![at("11:28:31.895")]),
            BirdReading::Sessions(vec![at("11:28:31.894")]),
            // Re-established: a new since.
            BirdReading::Sessions(vec![at("11:30:02.100")]),
        ]);
        let said: Vec<usize> = changes.iter().map(|c| c.sessions.len()).collect();
        assert_eq!(said, vec![1, 0, 0, 1]);
        assert_eq!(follower.sessions()[0].since, "11:30:02.100");
    }

    #[test]
    fn a_protocol_removed_from_bird_is_said_once() {
        let (a, b) = (
            session("10.0.0.2", "Established"),
            session("10.0.0.3", "Established"),
        );
        let (follower, changes) = feed(vec![
            BirdReading::Sessions(vec![a.clone(), b.clone()]),
            BirdReading::Sessions(vec![a.clone()]),
            BirdReading::Sessions(vec![a.clone()]),
        ]);
        let removed: Vec<Vec<&str>> = changes
            .iter()
            .map(|c| c.removed.iter().map(|s| s.protocol.as_str()).collect())
            .collect();
        assert_eq!(removed, vec![vec![], vec!["Mesh_10_0_0_3"], vec![]]);
        assert_eq!(follower.sessions(), vec![a]);
    }

    #[test]
    fn an_absent_socket_has_no_sessions_and_is_said_once() {
        let (follower, changes) = feed(vec![BirdReading::Absent, BirdReading::Absent]);
        let said: Vec<usize> = changes.iter().map(|c| c.sockets.len()).collect();
        assert_eq!(said, vec![1, 0]);
        assert!(follower.sessions().is_empty());
    }
}
