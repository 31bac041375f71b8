//! BIRD's control protocol: a reply read off the control socket, and the
//! BGP sessions of a `show protocols all` reply. `observer`'s
//! `node::bird` owns the socket and the reading thread.
//!
//! Why by hand: no crate speaks BIRD's control protocol. It is line based
//! (BIRD's `doc/reply_codes`): a reply line starts with a four-digit code
//! and `-` when more lines follow or a space on the last line; a line
//! starting with a space continues the previous code. `1002` lines are
//! the protocol table, `1006` lines a protocol's details.

use std::{
    io::{BufRead, Read},
    time::{Duration, Instant},
};

use crate::model::bgp::BgpSession;

/// How long BIRD may take to answer one read.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// Largest reply read: a BIRD with thousands of sessions answers in a few
/// MiB; anything longer is cut and reported.
const MAX_REPLY_BYTES: usize = 16 << 20;

/// Sessions kept per socket, so that a misconfigured BIRD cannot grow the
/// observer's memory or its series without bound.
pub const MAX_SESSIONS: usize = 4096;

/// Reads lines up to and including the reply's last one (a code followed
/// by a space), within [`TIMEOUT`] for the whole reply and
/// [`MAX_REPLY_BYTES`].
pub fn read_reply(reader: &mut impl BufRead, lines: &mut Vec<String>) -> std::io::Result<()> {
    let started = Instant::now();
    let mut bytes = 0;
    loop {
        if started.elapsed() > TIMEOUT {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no whole reply within {}s", TIMEOUT.as_secs()),
            ));
        }
        let mut line = Vec::new();
        let room = (MAX_REPLY_BYTES - bytes) as u64 + 1;
        let n = reader.by_ref().take(room).read_until(b'\n', &mut line)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "BIRD closed the connection in the middle of a reply",
            ));
        }
        bytes += n;
        if bytes > MAX_REPLY_BYTES {
            return Err(std::io::Error::other(format!(
                "reply longer than {MAX_REPLY_BYTES} bytes"
            )));
        }
        let line = String::from_utf8_lossy(&line)
            .trim_end_matches('\n')
            .to_string();
        let last = code_of(&line).is_some() && line.as_bytes().get(4) == Some(&b' ');
        lines.push(line);
        if last {
            return Ok(());
        }
    }
}

/// The four-digit code a reply line starts with, if it has one.
pub fn code_of(line: &str) -> Option<u16> {
    let head = line.get(..4)?;
    let sep = line.as_bytes().get(4).copied();
    if !head.bytes().all(|b| b.is_ascii_digit()) || !matches!(sep, Some(b'-' | b' ') | None) {
        return None;
    }
    head.parse().ok()
}

/// The BGP sessions in a `show protocols all` reply read from `socket`;
/// an error for BIRD's error replies (codes 8000 and up).
pub fn parse_protocols(socket: &str, reply: &[String]) -> Result<Vec<BgpSession>, String> {
    let mut sessions: Vec<BgpSession> = Vec::new();
    // Whether the protocol being read is a BGP one.
    let mut in_bgp = false;
    let mut code = 0;
    for line in reply {
        let text = match code_of(line) {
            Some(c) => {
                code = c;
                line.get(5..).unwrap_or("")
            }
            None => line.strip_prefix(' ').unwrap_or(line),
        };
        if code >= 8000 {
            return Err(format!("{socket}: BIRD answered: {}", text.trim()));
        }
        match code {
            1002 => {
                in_bgp = false;
                let columns: Vec<&str> = text.split_whitespace().collect();
                if columns.get(1) != Some(&"BGP") || sessions.len() >= MAX_SESSIONS {
                    continue;
                }
                in_bgp = true;
                let mut since = columns.get(4).copied().unwrap_or("").to_string();
                // "iso long" time formats put a time after the date.
                if let Some(time) = columns.get(5).filter(|t| t.contains(':')) {
                    since = format!("{since} {time}");
                }
                sessions.push(BgpSession {
                    socket: socket.to_string(),
                    protocol: columns[0].to_string(),
                    neighbor: None,
                    neighbor_as: None,
                    local_as: None,
                    state: columns.get(3).copied().unwrap_or("").to_string(),
                    bgp_state: String::new(),
                    since,
                    last_error: None,
                    routes_imported: 0,
                    routes_exported: 0,
                    updates_filtered: 0,
                });
            }
            1006 if in_bgp => {
                let Some(session) = sessions.last_mut() else {
                    continue;
                };
                detail(session, text.trim());
            }
            _ => {}
        }
    }
    Ok(sessions)
}

/// Applies one `Key: value` line of a BGP protocol's details.
fn detail(session: &mut BgpSession, line: &str) {
    let Some((key, value)) = line.split_once(':') else {
        return;
    };
    let value = value.trim();
    match key {
        "BGP state" => session.bgp_state = value.to_string(),
        // A link-local neighbor carries its interface: `fe80::1%eth0`.
        "Neighbor address" => {
            session.neighbor = value.split('%').next().and_then(|a| a.parse().ok())
        }
        "Neighbor AS" => session.neighbor_as = value.parse().ok(),
        "Local AS" => session.local_as = value.parse().ok(),
        "Last error" => session.last_error = Some(value.to_string()),
        // Columns: received, rejected, filtered, ignored, accepted ("---"
        // where a count does not apply); one line per channel.
        "Import updates" => {
            let filtered = value.split_whitespace().nth(2);
            session.updates_filtered += filtered.and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
        }
        "Routes" => {
            // "1 imported, 1 exported, 1 preferred" (one line per channel;
            // some versions add "N filtered").
            for part in value.split(',') {
                let mut words = part.split_whitespace();
                let (Some(n), Some(what)) = (words.next(), words.next()) else {
                    continue;
                };
                let Ok(n) = n.parse::<u64>() else {
                    continue;
                };
                match what {
                    "imported" => session.routes_imported += n,
                    "exported" => session.routes_exported += n,
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn filtered_updates_are_summed_over_channels() {
        let reply = lines(
            "1002-Mesh_10_99_0_4 BGP        ---        up     12:00:01.000  Established\n\
             1006-  BGP state:          Established\n\
             \x20   Neighbor address: 10.99.0.4\n\
             \x20   Routes:         0 imported, 1 exported, 0 preferred\n\
             \x20   Route change stats:     received   rejected   filtered    ignored   accepted\n\
             \x20     Import updates:              2          0          2          0          0\n\
             \x20     Import withdraws:            0          0        ---          0          0\n\
             \x20     Import updates:              1          0          1          0          0\n\
             0000 \n",
        );
        let sessions = parse_protocols("bird.ctl", &reply).unwrap();
        assert_eq!(sessions.len(), 1);
        assert_eq!(
            (sessions[0].routes_imported, sessions[0].updates_filtered),
            (0, 3)
        );
    }

    #[test]
    fn an_established_session_with_its_routes() {
        let reply = lines(include_str!(
            "../../testdata/bird/show_protocols_all_established.txt"
        ));
        let sessions = parse_protocols("bird.ctl", &reply).unwrap();
        assert_eq!(
            sessions,
            vec![BgpSession {
                socket: "bird.ctl".into(),
                protocol: "Mesh_10_99_0_2".into(),
                neighbor: Some("10.99.0.2".parse().unwrap()),
                neighbor_as: Some(64512),
                local_as: Some(64512),
                state: "up".into(),
                bgp_state: "Established".into(),
                since: "07:40:16.188".into(),
                last_error: None,
                routes_imported: 1,
                routes_exported: 1,
                updates_filtered: 0,
            }]
        );
        assert!(sessions[0].established());
    }

    #[test]
    fn a_session_down_with_its_last_error() {
        let reply = lines(include_str!(
            "../../testdata/bird/show_protocols_all_active.txt"
        ));
        let sessions = parse_protocols("bird.ctl", &reply).unwrap();
        assert_eq!(sessions.len(), 1);
        let s = &sessions[0];
        assert_eq!(
            (s.state.as_str(), s.bgp_state.as_str(), s.since.as_str()),
            ("start", "Active", "07:40:19.573")
        );
        assert_eq!(s.last_error.as_deref(), Some("Socket: Connection refused"));
        assert_eq!((s.routes_imported, s.routes_exported), (0, 0));
        assert!(!s.established());
    }

    /// Calico's BIRD is a fork of BIRD 1.6 (one daemon per family, hence
    /// bird.ctl and bird6.ctl): its replies, captured from Debian's BIRD
    /// 1.6.8, put the channel's lines before the BGP ones and have no
    /// `Local AS`.
    #[test]
    fn bird_1_6_replies() {
        let established = lines(include_str!(
            "../../testdata/bird/bird16_show_protocols_all_established.txt"
        ));
        let sessions = parse_protocols("bird.ctl", &established).unwrap();
        assert_eq!(
            sessions,
            vec![BgpSession {
                socket: "bird.ctl".into(),
                protocol: "Mesh_10_98_0_2".into(),
                neighbor: Some("10.98.0.2".parse().unwrap()),
                neighbor_as: Some(64512),
                local_as: None,
                state: "up".into(),
                bgp_state: "Established".into(),
                since: "07:58:01".into(),
                last_error: None,
                routes_imported: 1,
                routes_exported: 1,
                updates_filtered: 0,
            }]
        );
        let down = lines(include_str!(
            "../../testdata/bird/bird16_show_protocols_all_active.txt"
        ));
        let s = &parse_protocols("bird.ctl", &down).unwrap()[0];
        assert_eq!(
            (
                s.state.as_str(),
                s.bgp_state.as_str(),
                s.last_error.as_deref()
            ),
            ("start", "Active", Some("Received: Administrative shutdown"))
        );
        assert_eq!((s.routes_imported, s.routes_exported), (0, 0));
    }

    #[test]
    fn a_link_local_neighbor_keeps_its_address() {
        let reply = lines(
            "1002-Mesh_fe80 BGP ---  up  07:40:16.188  Established\n\
             1006-  BGP state:          Established\n\
             \x20    Neighbor address: fe80::1%eth0\n\
             0000 ",
        );
        let sessions = parse_protocols("bird6.ctl", &reply).unwrap();
        assert_eq!(sessions[0].neighbor, Some("fe80::1".parse().unwrap()));
    }

    #[test]
    fn error_replies_and_the_reply_end_are_recognised() {
        let reply = lines("9001 Syntax error, unexpected END");
        assert_eq!(
            parse_protocols("bird.ctl", &reply),
            Err("bird.ctl: BIRD answered: Syntax error, unexpected END".to_string())
        );
        let mut reader = std::io::Cursor::new(b"2002-Name\n1002-x BGP\n 1006-\n0000 \nnext\n");
        let mut read = Vec::new();
        read_reply(&mut reader, &mut read).unwrap();
        assert_eq!(read.last().map(String::as_str), Some("0000 "));
        assert_eq!(code_of("1006-  BGP state:"), Some(1006));
        assert_eq!(code_of("     Neighbor address: 10.0.0.1"), None);
        assert_eq!(code_of("12345"), None);
    }
}
