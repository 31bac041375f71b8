//! Probing inside a long run (`attach --probe-interval`, `diagnose
//! --probe`): a thread that does `observer probe`'s work now and then,
//! with probe's default bounds, and hands each run to the monitor through
//! a bounded queue. The monitor never waits for it, except `diagnose` for
//! its one run at the end.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel},
    },
    thread,
    time::Duration,
};

use anyhow::{Context, Result};

use crate::{
    model::{dataplane::DeclaredTunnel, probe::Run},
    monitor::probe::{Settings, probe_once},
    node,
};

/// Runs waiting for the monitor; more are dropped (and counted).
const QUEUE: usize = 4;

/// The probing thread. Dropping it stops the thread after its current
/// run (it is not waited for: a run of many peers may take minutes).
pub struct ProbeWorker {
    runs: Receiver<Result<Run, String>>,
    stop: Option<SyncSender<()>>,
    /// Runs dropped because the monitor had not taken the earlier ones.
    pub dropped: Arc<AtomicU64>,
    /// The last error said, so a failing run is logged once, not every
    /// time.
    last_error: Option<String>,
}

impl ProbeWorker {
    /// Starts probing now, then every `every` (once without). The thread
    /// inherits the caller's network namespace and capabilities.
    pub fn start(
        declared: Vec<DeclaredTunnel>,
        settings: Settings,
        every: Option<Duration>,
    ) -> Result<ProbeWorker> {
        let (tx, runs) = sync_channel(QUEUE);
        let (stop, stopped) = sync_channel::<()>(1);
        let dropped = Arc::new(AtomicU64::new(0));
        let counter = dropped.clone();
        thread::Builder::new()
            .name("probe".into())
            .spawn(move || {
                loop {
                    let run = node::dataplane::read_declaring(&declared)
                        .and_then(|view| probe_once(&view, &settings))
                        .map_err(|e| format!("{e:#}"));
                    match tx.try_send(run) {
                        Ok(()) => {}
                        Err(TrySendError::Full(_)) => {
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(TrySendError::Disconnected(_)) => return,
                    }
                    let Some(every) = every else { return };
                    match stopped.recv_timeout(every) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                }
            })
            .context("starting the probing thread")?;
        Ok(ProbeWorker {
            runs,
            stop: Some(stop),
            dropped,
            last_error: None,
        })
    }

    /// The runs that ended since the last call; a failed run is logged
    /// (once per distinct error) and left out.
    pub fn take(&mut self) -> Vec<Run> {
        let mut runs = Vec::new();
        while let Ok(result) = self.runs.try_recv() {
            if let Some(run) = self.keep(result) {
                runs.push(run);
            }
        }
        runs
    }

    /// The error of the latest run taken, when it failed.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Waits at most `timeout` for the next run: `Err` with the run's
    /// error when it failed or did not end in time.
    pub fn wait(&mut self, timeout: Duration) -> Result<Run, String> {
        match self.runs.recv_timeout(timeout) {
            Ok(result) => result,
            Err(_) => Err(format!("the probe run did not end within {timeout:?}")),
        }
    }

    fn keep(&mut self, result: Result<Run, String>) -> Option<Run> {
        match result {
            Ok(run) => {
                self.last_error = None;
                Some(run)
            }
            Err(error) => {
                if self.last_error.as_ref() != Some(&error) {
                    tracing::warn!(%error, "probe run failed; probing goes on at the next period");
                    self.last_error = Some(error);
                }
                None
            }
        }
    }
}

impl Drop for ProbeWorker {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.try_send(());
        }
    }
}
