//! The lab's probes: `observer probe --netns <node>` on every node at
//! once; their JSON lines are collected per node. After the pings, once
//! the observers stopped (so the pings' counts stay the pings'; the BGP
//! scenarios too, over IPIP); or, with `--probe`, in place of the pings
//! while the observers watch.

use std::{
    io::Read,
    process::{Command, Stdio},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::cleanup::{Cleanup, check_interrupted};

/// One node's probe run.
pub struct NodeProbe {
    /// Its command line.
    pub command: String,
    /// The JSON lines it printed.
    pub lines: Vec<Value>,
    child: usize,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

/// Reads all of `pipe` on a thread of its own (so a full pipe never
/// blocks the process writing it).
fn read_all(mut pipe: impl Read + Send + 'static) -> Option<JoinHandle<String>> {
    Some(thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    }))
}

/// Starts `observer probe` in each of `namespaces` with `args` beyond the
/// namespace and the output format.
pub fn start(lab: &mut Cleanup, namespaces: &[String], args: &[String]) -> Result<Vec<NodeProbe>> {
    let exe = std::env::current_exe().context("finding this program's path to run the probes")?;
    namespaces
        .iter()
        .map(|namespace| {
            let mut all: Vec<&str> = vec!["probe", "--netns", namespace, "--output", "json"];
            all.extend(args.iter().map(String::as_str));
            let mut cmd = Command::new(&exe);
            cmd.args(&all)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let child = lab.spawn(&format!("the probe in {namespace}"), &mut cmd)?;
            let process = lab.child(child);
            let stdout = read_all(process.stdout.take().context("probe stdout")?);
            let stderr = read_all(process.stderr.take().context("probe stderr")?);
            Ok(NodeProbe {
                command: format!("observer {}", all.join(" ")),
                lines: Vec::new(),
                child,
                stdout,
                stderr,
            })
        })
        .collect()
}

/// [`start`] then [`finish`] with nothing else to watch meanwhile (the
/// observers stopped): the probes' runs, read.
pub fn run(
    lab: &mut Cleanup,
    namespaces: &[String],
    args: &[String],
    timeout: Duration,
) -> Result<Vec<NodeProbe>> {
    let mut probes = start(lab, namespaces, args)?;
    let pause = || {
        thread::sleep(Duration::from_millis(50));
        Ok(())
    };
    finish(lab, &mut probes, pause, timeout)?;
    Ok(probes)
}

/// Waits until every probe run ended, at most `timeout`, calling `pump`
/// meanwhile (the observers' lines, when they still run; else a pause);
/// reads their lines. A run that could not probe (exit status 2) fails the
/// lab.
pub fn finish(
    lab: &mut Cleanup,
    probes: &mut [NodeProbe],
    mut pump: impl FnMut() -> Result<()>,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut statuses = vec![None; probes.len()];
    while statuses.iter().any(Option::is_none) {
        check_interrupted()?;
        if Instant::now() >= deadline {
            bail!("the probes did not end within {timeout:?}");
        }
        pump()?;
        for (probe, status) in probes.iter().zip(statuses.iter_mut()) {
            if status.is_none() {
                *status = lab.child(probe.child).try_wait()?;
            }
        }
    }
    let joined =
        |handle: Option<JoinHandle<String>>| handle.and_then(|h| h.join().ok()).unwrap_or_default();
    for (probe, status) in probes.iter_mut().zip(statuses) {
        let status = status.unwrap_or_default();
        let stdout = joined(probe.stdout.take());
        let stderr = joined(probe.stderr.take());
        if !matches!(status.code(), Some(0 | 1)) {
            bail!("{} failed ({status}): {}", probe.command, stderr.trim());
        }
        probe.lines = stdout
            .lines()
            .map(|line| {
                serde_json::from_str(line).with_context(|| {
                    format!("{} printed a line that is not JSON: {line}", probe.command)
                })
            })
            .collect::<Result<_>>()?;
    }
    Ok(())
}
