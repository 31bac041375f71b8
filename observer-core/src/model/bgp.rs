//! BGP sessions as the node's BIRD reports them (Calico runs BIRD for its
//! BGP mesh): the facts behind `bgp` lines, the `observer_bgp_*` series
//! and the `bgp_down` anomaly. Read by `node::bird`.

use std::net::IpAddr;

use serde::Serialize;

/// The BGP state of an established session.
pub const ESTABLISHED: &str = "Established";

/// One BGP protocol of one BIRD instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BgpSession {
    /// The BIRD control socket it was read from.
    pub socket: String,
    /// BIRD's protocol name (Calico: `Mesh_10_0_0_2`, `Node_...`, `Global_...`).
    pub protocol: String,
    /// The neighbor's address, when BIRD reports one.
    pub neighbor: Option<IpAddr>,
    /// The neighbor's AS number.
    pub neighbor_as: Option<u32>,
    /// This side's AS number.
    pub local_as: Option<u32>,
    /// BIRD's protocol state: `up`, `start`, `down`, `stop`, `flush`.
    pub state: String,
    /// The BGP finite-state-machine state: `Established`, `Active`,
    /// `Connect`, `Idle`, `OpenSent`, `OpenConfirm`, `Down`.
    pub bgp_state: String,
    /// When the protocol last changed state, in BIRD's time format.
    pub since: String,
    /// BIRD's last error for the session (`Received: Administrative
    /// shutdown`, `Socket: Connection refused`, `Hold timer expired`).
    pub last_error: Option<String>,
    /// Routes imported from the neighbor, over all channels.
    pub routes_imported: u64,
    /// Routes exported to the neighbor, over all channels.
    pub routes_exported: u64,
    /// Route updates from the neighbor that the import filter rejected,
    /// since the session started (BIRD's `Import updates` "filtered").
    pub updates_filtered: u64,
}

impl BgpSession {
    /// Whether the session is established.
    pub fn established(&self) -> bool {
        self.bgp_state == ESTABLISHED
    }

    /// Whether BIRD answered for it (its state is not [`UNKNOWN`]).
    pub fn answered(&self) -> bool {
        self.bgp_state != UNKNOWN
    }
}

/// Whether BIRD's `since` read as `old`, then as `new`, names the same
/// instant. BIRD keeps the time on its monotonic clock and prints it on
/// the wall clock, so one `since` read twice can differ by a millisecond
/// (`11:28:31.894`, then `11:28:31.895`): times within half a second (on
/// the same date, when one is printed) are the same. And BIRD prints a
/// time of day for the last 20 hours and a date before: a time that
/// became a date is the same instant, aged.
pub fn same_since(old: &str, new: &str) -> bool {
    /// (date, seconds of the day) of `HH:MM:SS[.fff]`, `YYYY-MM-DD` or
    /// `YYYY-MM-DD HH:MM:SS[.fff]`.
    fn parts(text: &str) -> (Option<&str>, Option<f64>) {
        let (date, time) = match text.split_once(' ') {
            Some((date, time)) => (Some(date), Some(time)),
            None if text.contains(':') => (None, Some(text)),
            None => (Some(text), None),
        };
        let seconds = time.and_then(|time| {
            let mut fields = time.split(':');
            let (h, m, s) = (fields.next()?, fields.next()?, fields.next()?);
            if fields.next().is_some() {
                return None;
            }
            let (h, m, s): (u32, u32, f64) = (h.parse().ok()?, m.parse().ok()?, s.parse().ok()?);
            Some(f64::from(h * 3600 + m * 60) + s)
        });
        (date, seconds)
    }
    if old == new {
        return true;
    }
    match (parts(old), parts(new)) {
        ((old_date, Some(x)), (new_date, Some(y))) if old_date == new_date => {
            let diff = (x - y).abs();
            // Without a date, 23:59:59.999 and 00:00:00.001 are close.
            let diff = if old_date.is_none() {
                diff.min(86_400.0 - diff)
            } else {
                diff
            };
            diff < 0.5
        }
        ((None, Some(_)), (Some(_), None)) => true,
        _ => false,
    }
}

/// What one read of one BIRD control socket gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BirdReading {
    /// Its BGP sessions.
    Sessions(Vec<BgpSession>),
    /// No socket at that path: no BIRD there (or another path).
    Absent,
    /// It could not be read: why.
    Failed(String),
}

/// The BGP state given to the sessions of a BIRD that stopped answering:
/// their real state is unknown, and a BIRD that does not answer (killed,
/// hung, restarting) serves no routes either.
pub const UNKNOWN: &str = "Unknown";

/// BGP sessions for unit tests.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use super::BgpSession;

    /// A session of Calico's `bird.ctl` with `neighbor` (its mesh protocol
    /// name) in `bgp_state`, with one route exported.
    pub fn session(neighbor: &str, bgp_state: &str) -> BgpSession {
        let established = bgp_state == super::ESTABLISHED;
        BgpSession {
            socket: "/var/run/calico/bird.ctl".into(),
            protocol: format!("Mesh_{}", neighbor.replace('.', "_")),
            neighbor: neighbor.parse().ok(),
            neighbor_as: Some(64512),
            local_as: Some(64512),
            state: if established { "up" } else { "start" }.into(),
            bgp_state: bgp_state.into(),
            since: "07:40:19.573".into(),
            last_error: (!established).then(|| "Socket: Connection refused".into()),
            routes_imported: 0,
            routes_exported: 1,
            updates_filtered: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::same_since;

    #[test]
    fn since_jitters_by_a_millisecond_but_a_new_session_is_a_new_since() {
        assert!(same_since("11:28:31.894", "11:28:31.895"));
        assert!(same_since("23:59:59.999", "00:00:00.001"));
        assert!(!same_since("11:28:31.894", "11:28:33.001"));
        assert!(same_since("2026-12-01", "2026-12-01"));
        assert!(!same_since("2026-12-01", "2026-12-02"));
        // 20 hours on, BIRD prints the date: the same instant, aged; the
        // other way round it is a new session.
        assert!(same_since("11:28:31.894", "2026-12-02"));
        assert!(!same_since("2026-12-01", "11:28:31.894"));
        // "iso long" formats: a date and a time.
        assert!(same_since(
            "2026-12-01 11:28:31.894",
            "2026-12-01 11:28:31.895"
        ));
        assert!(!same_since(
            "2026-12-01 11:28:31.894",
            "2026-12-02 11:28:31.894"
        ));
        assert!(!same_since(
            "2026-12-01 23:59:59.999",
            "2026-12-02 00:00:00.001"
        ));
    }
}
