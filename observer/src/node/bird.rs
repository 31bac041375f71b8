//! BIRD's control socket: the BGP sessions of the node's BIRD (Calico's
//! `bird.ctl` and `bird6.ctl`), read with `show protocols all` as
//! `birdc` would, on a thread of its own so that a slow or hung BIRD never
//! delays an interval.
//!
//! The protocol itself (a reply's lines, the sessions in it) is read by
//! `parse::bird`.

use std::{
    io::{BufReader, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        mpsc::{self, RecvTimeoutError, Sender},
    },
    thread,
    time::{Duration, Instant},
};

use crate::{
    model::bgp::BirdReading,
    parse::bird::{TIMEOUT, parse_protocols, read_reply},
};

/// Calico's BIRD control sockets (IPv4 and IPv6 BIRD), read by default.
pub const CALICO_SOCKETS: [&str; 2] = ["/var/run/calico/bird.ctl", "/var/run/calico/bird6.ctl"];

/// Reads the BGP sessions of the BIRD listening on `socket`.
pub fn read(socket: &Path) -> BirdReading {
    match ask(socket, "show protocols all") {
        Ok(reply) => match parse_protocols(&socket.display().to_string(), &reply) {
            Ok(sessions) => BirdReading::Sessions(sessions),
            Err(e) => BirdReading::Failed(e),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BirdReading::Absent,
        Err(e) => BirdReading::Failed(format!("{}: {e}", socket.display())),
    }
}

/// Sends `command` and returns the reply's lines (the greeting skipped).
fn ask(socket: &Path, command: &str) -> std::io::Result<Vec<String>> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut greeting = Vec::new();
    read_reply(&mut reader, &mut greeting)?;
    (&stream).write_all(format!("{command}\n").as_bytes())?;
    let mut reply = Vec::new();
    read_reply(&mut reader, &mut reply)?;
    Ok(reply)
}

/// The latest reading of each socket, with when it was made, shared with
/// the reading thread.
type Readings = Arc<Mutex<Vec<(PathBuf, BirdReading, Instant)>>>;

/// Reads every socket once per period on a thread of its own; the monitor
/// takes the latest readings at each interval. The thread ends when the
/// watcher is dropped.
pub struct BirdWatcher {
    latest: Readings,
    /// Dropping it wakes and ends the thread.
    _stop: Sender<()>,
}

impl BirdWatcher {
    /// Starts reading `sockets` now and then every `period`.
    pub fn start(sockets: Vec<PathBuf>, period: Duration) -> BirdWatcher {
        let latest: Readings = Arc::default();
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = Arc::clone(&latest);
        thread::spawn(move || {
            loop {
                let readings: Vec<(PathBuf, BirdReading, Instant)> = sockets
                    .iter()
                    .map(|socket| (socket.clone(), read(socket), Instant::now()))
                    .collect();
                *shared.lock().unwrap_or_else(|e| e.into_inner()) = readings;
                match stopped.recv_timeout(period) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
            }
        });
        BirdWatcher {
            latest,
            _stop: stop,
        }
    }

    /// The latest reading of every socket (empty before the first read
    /// finished). A reading older than `max_age` counts as failed: the
    /// reading thread is stuck (a BIRD whose connection backlog is full
    /// blocks even the connect).
    pub fn latest(&self, max_age: Duration) -> Vec<(PathBuf, BirdReading)> {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(socket, reading, at)| {
                let reading = if at.elapsed() > max_age {
                    BirdReading::Failed(format!(
                        "{}: no answer for {}s",
                        socket.display(),
                        at.elapsed().as_secs()
                    ))
                } else {
                    reading.clone()
                };
                (socket.clone(), reading)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_socket_is_absent() {
        let path =
            std::env::temp_dir().join(format!("observer-no-bird-{}.ctl", std::process::id()));
        assert_eq!(read(&path), BirdReading::Absent);
    }
}
