//! The observers on the lab's nodes: this same binary, run as `observer
//! diagnose --netns <node> --output json eth0` per node, concurrently;
//! their JSON lines are collected per node and passed to the view as they
//! come.

use std::{
    io::{BufRead, BufReader, Read},
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        mpsc::{Receiver, RecvTimeoutError, Sender, channel},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{
    cleanup::{Cleanup, check_interrupted},
    topology::UNDERLAY,
    view::View,
};

/// The observers' `--interval`: the live view's refresh.
const INTERVAL: &str = "1s";

/// What a reader thread saw on an observer's stdout.
enum Event {
    Line(usize, String),
    Closed(usize),
}

/// One node's observer: the node's name (in messages and the view), its
/// namespace, and its arguments beyond the lab's own (`--tunnel-device`,
/// `--bird-socket`).
pub struct ObserverSpec {
    /// The node's name in the lab.
    pub node: String,
    /// Its network namespace.
    pub namespace: String,
    /// Further `observer diagnose` arguments.
    pub args: Vec<String>,
}

/// The running observers, one per node.
pub struct Observers {
    /// The nodes' names, in spawn order.
    nodes: Vec<String>,
    children: Vec<usize>,
    events: Receiver<Event>,
    stderr: Vec<Arc<Mutex<String>>>,
    commands: Vec<String>,
    /// Every JSON line printed, per node.
    pub lines: Vec<Vec<Value>>,
    ready: Vec<bool>,
    closed: Vec<bool>,
}

/// Where the node observers write besides their output lines
/// (`lab --textfile-dir`, `lab --capture-dir`).
#[derive(Clone, Copy, Default)]
pub struct Outputs<'a> {
    /// Their textfiles go to `<this>/<node>/`.
    pub textfile_root: Option<&'a Path>,
    /// Their evidence goes to `<this>/<node>/`.
    pub capture_root: Option<&'a Path>,
}

impl<'a> Outputs<'a> {
    /// The directories `args` names.
    pub fn of(args: &'a crate::cli::LabArgs) -> Outputs<'a> {
        Outputs {
            textfile_root: args.textfile_dir.as_deref(),
            capture_root: args.capture_dir.as_deref(),
        }
    }
}

impl Observers {
    /// Starts one observer per node of `specs`, on the lab's underlay
    /// interface. The lab stops them ([`Observers::stop`]) once the traffic
    /// ended; `backstop` is their `--duration`, should the lab be killed
    /// before.
    /// Each observer is named `--node-name <node>`; with `outputs`'
    /// directories, it writes its textfile to `textfile_root/<node>/` and
    /// its evidence to `capture_root/<node>/`.
    pub fn spawn(
        lab: &mut Cleanup,
        specs: &[ObserverSpec],
        backstop: Duration,
        outputs: Outputs<'_>,
    ) -> Result<Observers> {
        let exe =
            std::env::current_exe().context("finding this program's path to run the observers")?;
        let (tx, events) = channel();
        let mut observers = Observers {
            nodes: specs.iter().map(|s| s.node.clone()).collect(),
            children: Vec::new(),
            events,
            stderr: Vec::new(),
            commands: Vec::new(),
            lines: vec![Vec::new(); specs.len()],
            ready: vec![false; specs.len()],
            closed: vec![false; specs.len()],
        };
        let duration = format!("{}ms", backstop.as_millis());
        for (i, spec) in specs.iter().enumerate() {
            let mut args: Vec<&str> = vec![
                "diagnose",
                "--netns",
                &spec.namespace,
                "--output",
                "json",
                "--interval",
                INTERVAL,
                "--duration",
                &duration,
            ];
            args.extend(["--node-name", &spec.node]);
            let textfile_dir = outputs.textfile_root.map(|root| root.join(&spec.node));
            if let Some(dir) = &textfile_dir {
                std::fs::create_dir_all(dir).with_context(|| {
                    format!("creating the textfile directory {}", dir.display())
                })?;
                args.extend([
                    "--textfile-dir",
                    dir.to_str()
                        .context("a textfile directory that is no UTF-8")?,
                ]);
            }
            let capture_dir = outputs.capture_root.map(|root| root.join(&spec.node));
            if let Some(dir) = &capture_dir {
                args.extend([
                    "--capture-dir",
                    dir.to_str()
                        .context("an evidence directory that is no UTF-8")?,
                ]);
            }
            args.extend(spec.args.iter().map(String::as_str));
            args.push(UNDERLAY);
            observers
                .commands
                .push(format!("observer {}", args.join(" ")));
            let mut cmd = Command::new(&exe);
            cmd.args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let index = lab.spawn(&format!("the observer on {}", spec.node), &mut cmd)?;
            let child = lab.child(index);
            let stdout = child.stdout.take().expect("stdout is piped");
            let stderr = child.stderr.take().expect("stderr is piped");
            read_lines(i, stdout, tx.clone());
            observers.stderr.push(collect(stderr));
            observers.children.push(index);
        }
        Ok(observers)
    }

    /// The command line of node `i`'s observer.
    pub fn command(&self, i: usize) -> &str {
        &self.commands[i]
    }

    /// Passes lines to `view` until every observer has reported its
    /// allow-sets (so its programs check sources before any traffic);
    /// returns when the first one was ready.
    pub fn wait_ready(&mut self, view: &mut View, timeout: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        let mut first = None;
        while self.ready.iter().any(|r| !r) {
            if Instant::now() >= deadline {
                bail!(
                    "the observers did not attach within {timeout:?} (on a slow or emulated machine raise --attach-timeout){}",
                    self.stderr_tails()
                );
            }
            if let Some(i) = self.next(view)? {
                bail!(
                    "the observer on {} exited before traffic started: {}",
                    self.nodes[i],
                    self.stderr_of(i)
                );
            }
            if self.ready.iter().any(|r| *r) {
                first.get_or_insert_with(Instant::now);
            }
        }
        Ok(first.unwrap_or_else(Instant::now))
    }

    /// Passes lines to `view` until every observer has ended; fails when
    /// one failed.
    pub fn wait_end(
        &mut self,
        lab: &mut Cleanup,
        view: &mut View,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.closed.iter().any(|c| !c) {
            if Instant::now() >= deadline {
                bail!(
                    "the observers did not stop within {timeout:?}{}",
                    self.stderr_tails()
                );
            }
            self.next(view)?;
        }
        for (i, &index) in self.children.iter().enumerate() {
            let status = lab.child(index).wait()?;
            // diagnose exits 1 when it found something: that is its answer.
            if !matches!(status.code(), Some(0 | 1)) {
                bail!(
                    "the observer on {} failed ({status}): {}",
                    self.nodes[i],
                    self.stderr_of(i)
                );
            }
        }
        Ok(())
    }

    /// Passes lines to `view` while the traffic runs (at most 100 ms);
    /// fails when an observer ended before it was stopped.
    pub fn pump(&mut self, view: &mut View) -> Result<()> {
        if let Some(i) = self.next(view)? {
            bail!(
                "the observer on {} exited before the traffic ended: {}",
                self.nodes[i],
                self.stderr_of(i)
            );
        }
        Ok(())
    }

    /// Ends every observer's run as SIGINT does: its final interval and
    /// write-up follow ([`Observers::wait_end`] collects them).
    pub fn stop(&mut self, lab: &mut Cleanup) {
        for &index in &self.children {
            let pid = lab.child(index).id();
            // SAFETY: kill(2) on our own child, which has not been reaped.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
        }
    }

    /// Handles the next event (or a 100 ms pause); returns the node whose
    /// observer closed its output, if one did.
    fn next(&mut self, view: &mut View) -> Result<Option<usize>> {
        check_interrupted()?;
        match self.events.recv_timeout(Duration::from_millis(100)) {
            Ok(Event::Line(i, text)) => {
                let line: Value = serde_json::from_str(&text).with_context(|| {
                    format!(
                        "the observer on {} printed a line that is not JSON: {text}",
                        self.nodes[i]
                    )
                })?;
                if line["type"] == "allow_set" {
                    self.ready[i] = true;
                }
                view.observer_line(i, &line)?;
                self.lines[i].push(line);
                Ok(None)
            }
            Ok(Event::Closed(i)) => {
                self.closed[i] = true;
                Ok(Some(i))
            }
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => bail!("every observer reader ended"),
        }
    }

    fn stderr_of(&self, i: usize) -> String {
        // The reader may still be draining the pipe of a process that just exited.
        thread::sleep(Duration::from_millis(100));
        let text = self.stderr[i].lock().map(|s| s.clone()).unwrap_or_default();
        let text = text.trim();
        if text.is_empty() {
            "(nothing on stderr)".to_string()
        } else {
            text.to_string()
        }
    }

    fn stderr_tails(&self) -> String {
        (0..self.nodes.len())
            .map(|i| format!("\n  {}: {}", self.nodes[i], self.stderr_of(i)))
            .collect()
    }
}

/// Sends each line of `pipe` as an event, then `Closed`.
fn read_lines(node: usize, pipe: impl Read + Send + 'static, tx: Sender<Event>) {
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(Event::Line(node, line)).is_err() {
                return;
            }
        }
        let _ = tx.send(Event::Closed(node));
    });
}

/// Collects everything `pipe` prints.
fn collect(mut pipe: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = text.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            if let Ok(mut s) = sink.lock() {
                s.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
    });
    text
}
