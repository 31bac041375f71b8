//! `--metrics-listen ADDR`: the textfile's families on `GET /metrics`, for
//! Prometheus to scrape the observer directly (a ServiceMonitor) instead
//! of through node_exporter. A thread of its own answers one connection at
//! a time with the latest text the interval encoded; a slow or silent
//! client is cut off after a few seconds, and a request is read up to 8
//! KiB, so no client can hold the thread or grow memory.
//!
//! HTTP by hand: one GET of one path with one body is all it serves, and
//! an HTTP server crate would bring a runtime or a pool for that.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
    thread,
    time::Duration,
};

use anyhow::{Context, Result};

/// How long a client may take to send its request or read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest request head read.
const MAX_REQUEST: u64 = 8 * 1024;

/// The latest exposition text, shared with the serving thread.
#[derive(Clone, Default)]
pub struct Latest(Arc<Mutex<Option<String>>>);

impl Latest {
    /// Replaces the text served.
    pub fn set(&self, text: String) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
    }

    fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Binds `addr`: before the capabilities are dropped, so that a port
/// below 1024 works.
pub fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).with_context(|| {
        format!(
            "--metrics-listen {addr}: cannot listen there (in use, or not this host's address?)"
        )
    })
}

/// Serves `latest` on `listener` from a thread of its own (started after
/// the capabilities were dropped: threads keep the ones they start with);
/// returns the bound address.
pub fn serve(listener: TcpListener, latest: Latest) -> Result<SocketAddr> {
    let bound = listener.local_addr()?;
    thread::Builder::new()
        .name("metrics".to_string())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(e) = answer(stream, &latest) {
                    tracing::debug!(error = %e, "metrics client");
                }
            }
        })
        .context("starting the metrics thread")?;
    tracing::info!(listen = %bound, "serving the textfile's metrics on /metrics");
    Ok(bound)
}

fn answer(stream: TcpStream, latest: &Latest) -> std::io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut reader = BufReader::new((&stream).take(MAX_REQUEST));
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // The rest of the head, up to the empty line (or the size cap).
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let mut words = request_line.split_whitespace();
    let (method, path) = (words.next(), words.next());
    let (status, body) = match (method, path.map(|p| p.split('?').next().unwrap_or(p))) {
        (Some("GET"), Some("/metrics")) => match latest.get() {
            Some(text) => ("200 OK", text),
            None => (
                "503 Service Unavailable",
                "no interval has been read yet\n".to_string(),
            ),
        },
        (Some("GET"), _) => ("404 Not Found", "only /metrics is served\n".to_string()),
        _ => ("405 Method Not Allowed", "GET /metrics\n".to_string()),
    };
    let mut out = &stream;
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    #[test]
    fn serves_the_latest_text_on_metrics_only() {
        let latest = Latest::default();
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = serve(listener, latest.clone()).unwrap();
        let request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        assert!(get(addr, request).starts_with("HTTP/1.1 503 "));
        latest.set("observer_build_info 1\n".to_string());
        let response = get(addr, request);
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.ends_with("\r\n\r\nobserver_build_info 1\n"),
            "{response}"
        );
        assert!(get(addr, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(get(addr, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
    }

    #[test]
    fn a_taken_address_is_named() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = bind(taken.local_addr().unwrap()).unwrap_err();
        assert!(format!("{e:#}").contains("cannot listen there"), "{e:#}");
    }
}
