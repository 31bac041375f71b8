//! The BGP sessions a monitor follows: the latest readings of the BIRD
//! control sockets (read on `node::bird`'s thread), what changed since
//! the previous interval, and each socket's status, logged once per
//! change (an absent socket is said once, not every interval).

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use crate::{
    model::bgp::{BgpSession, BirdReading},
    node::bird::BirdWatcher,
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
}

/// The followed sessions.
pub struct BgpFollower {
    watcher: Option<BirdWatcher>,
    status: BTreeMap<PathBuf, SocketStatus>,
    /// Every session as last read; a socket that fails keeps its
    /// sessions from the previous read.
    sessions: BTreeMap<PathBuf, Vec<BgpSession>>,
}

impl BgpFollower {
    /// Starts reading `sockets` every `period` (nothing without sockets).
    pub fn start(sockets: Vec<PathBuf>, period: Duration) -> BgpFollower {
        BgpFollower {
            watcher: (!sockets.is_empty()).then(|| BirdWatcher::start(sockets, period)),
            status: BTreeMap::new(),
            sessions: BTreeMap::new(),
        }
    }

    /// Takes the latest readings; returns what changed.
    pub fn refresh(&mut self) -> BgpChanges {
        let Some(watcher) = &self.watcher else {
            return BgpChanges::default();
        };
        let mut changes = BgpChanges::default();
        for (socket, reading) in watcher.latest() {
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
                changes.sockets.push((socket.display().to_string(), status));
            }
            match reading {
                BirdReading::Sessions(now) => {
                    let before = self.sessions.get(&socket);
                    changes.sessions.extend(
                        now.iter()
                            .filter(|s| before.is_none_or(|b| !b.contains(s)))
                            .cloned(),
                    );
                    self.sessions.insert(socket, now);
                }
                BirdReading::Absent => {
                    self.sessions.remove(&socket);
                }
                // Kept: one failed read does not make sessions disappear.
                BirdReading::Failed(_) => {}
            }
        }
        changes
    }

    /// Every session as last read.
    pub fn sessions(&self) -> Vec<BgpSession> {
        self.sessions.values().flatten().cloned().collect()
    }
}
