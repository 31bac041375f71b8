//! The lab's traffic: one `ping` process per (source, target, block,
//! size), between pod addresses only, with a fixed count so that every
//! packet is known; and their summaries once they end.

use std::{
    io::Read,
    net::Ipv4Addr,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use serde::Serialize;

use super::{
    cleanup::{Cleanup, check_interrupted},
    scenarios::PingSpec,
    topology::{Block, NODES, Names},
};

/// Time between echo requests of one ping (`ping -i`).
pub const PING_INTERVAL: Duration = Duration::from_millis(100);
/// How long a ping waits for the last answer before giving up (`ping -W`).
pub const PING_LINGER: Duration = Duration::from_secs(1);

/// A ping process of the lab.
pub struct RunningPing {
    spec: PingSpec,
    child: usize,
}

/// What one ping reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PingResult {
    /// Sending node.
    pub from: &'static str,
    /// Target node.
    pub to: &'static str,
    /// Pod block used.
    pub block: Block,
    /// ICMP payload bytes.
    pub size: u16,
    /// Source pod address.
    pub src: Ipv4Addr,
    /// Target pod address.
    pub dst: Ipv4Addr,
    /// Echo requests sent.
    pub transmitted: u64,
    /// Replies received.
    pub received: u64,
}

/// Starts every ping of `specs`, each sending `count` requests.
pub fn start(
    lab: &mut Cleanup,
    names: &Names,
    specs: &[PingSpec],
    count: u64,
) -> Result<Vec<RunningPing>> {
    specs
        .iter()
        .map(|&spec| {
            let (from, to) = (&NODES[spec.from], &NODES[spec.to]);
            let (src, dst) = (from.pod(spec.block), to.pod(spec.block));
            let what = format!("ping {} {src} -> {} {dst}", from.name, to.name);
            let ping = Ping {
                namespace: &names.nodes[spec.from],
                src,
                dst,
                size: spec.size,
                count,
            };
            Ok(RunningPing {
                spec,
                child: ping.spawn(lab, &what)?,
            })
        })
        .collect()
}

/// One `ping` between two addresses of the lab, from `namespace`.
pub struct Ping<'a> {
    /// Where it runs.
    pub namespace: &'a str,
    /// Source address (`ping -I`).
    pub src: Ipv4Addr,
    /// Target.
    pub dst: Ipv4Addr,
    /// ICMP payload bytes.
    pub size: u16,
    /// Echo requests, one every [`PING_INTERVAL`].
    pub count: u64,
}

impl Ping<'_> {
    /// Starts it; returns its index in `lab`.
    pub fn spawn(&self, lab: &mut Cleanup, what: &str) -> Result<usize> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.namespace, "ping"])
            .args(["-n", "-q", "-c", &self.count.to_string()])
            .args(["-i", &PING_INTERVAL.as_secs_f64().to_string()])
            .args(["-W", &PING_LINGER.as_secs().to_string()])
            .args(["-s", &self.size.to_string(), "-I", &self.src.to_string()])
            .arg(self.dst.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        lab.spawn(what, &mut cmd)
    }
}

/// Whether every ping has ended (its status is kept for [`finish`]).
pub fn all_ended(lab: &mut Cleanup, pings: &[RunningPing]) -> Result<bool> {
    for ping in pings {
        if lab.child(ping.child).try_wait()?.is_none() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Waits (at most `timeout` overall) for every ping to end and reads its
/// summary. A ping still running then is an error: its counts would not
/// match what the observers saw.
pub fn finish(
    lab: &mut Cleanup,
    pings: Vec<RunningPing>,
    timeout: Duration,
) -> Result<Vec<PingResult>> {
    let deadline = Instant::now() + timeout;
    let mut results = Vec::new();
    for ping in pings {
        let (from, to) = (&NODES[ping.spec.from], &NODES[ping.spec.to]);
        let what = format!("ping {} -> {}", from.name, to.name);
        let (transmitted, received) = ended(lab, ping.child, &what, deadline)?;
        results.push(PingResult {
            from: from.name,
            to: to.name,
            block: ping.spec.block,
            size: ping.spec.size,
            src: from.pod(ping.spec.block),
            dst: to.pod(ping.spec.block),
            transmitted,
            received,
        });
    }
    Ok(results)
}

/// Waits until the ping `child` (named `what`) ends, by `deadline`;
/// its (transmitted, received).
pub fn ended(lab: &mut Cleanup, child: usize, what: &str, deadline: Instant) -> Result<(u64, u64)> {
    let child = lab.child(child);
    let status = loop {
        check_interrupted()?;
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            bail!(
                "a ping ({what}) was still running when the observers stopped; \
                 the machine is too slow for this --duration: give a longer one"
            );
        }
        thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_string(&mut stdout)?;
    }
    if let Some(mut err) = child.stderr.take() {
        err.read_to_string(&mut stderr)?;
    }
    match summary(&stdout) {
        Some(counts) => Ok(counts),
        None => bail!(
            "{what} ended ({status}) without a summary: {}{}",
            stdout.trim(),
            stderr.trim()
        ),
    }
}

/// (transmitted, received) from ping's `N packets transmitted, M received, ...`.
fn summary(stdout: &str) -> Option<(u64, u64)> {
    let line = stdout.lines().find(|l| l.contains("packets transmitted"))?;
    let mut numbers = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u64>().ok());
    Some((numbers.next()??, numbers.next()??))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_summary_line() {
        let out = "PING 10.42.168.210 (10.42.168.210) from 10.42.182.1 : 56(84) bytes of data.\n\n--- 10.42.168.210 ping statistics ---\n53 packets transmitted, 0 received, 100% packet loss, time 5200ms\n";
        assert_eq!(summary(out), Some((53, 0)));
        let with_errors =
            "5 packets transmitted, 3 received, +2 errors, 40% packet loss, time 400ms\n";
        assert_eq!(summary(with_errors), Some((5, 3)));
        assert_eq!(summary("ping: connect: Network is unreachable\n"), None);
    }
}
