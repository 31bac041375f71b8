//! The view kept current: what the monitor reads every interval.

use anyhow::Result;

use super::{ChangeWatcher, read_declaring};
use crate::model::dataplane::{DataPlane, DeclaredTunnel};

/// The data-plane view of the namespace it was created in, re-read in
/// full when notifications say something changed or were lost (an
/// overrun), and after a failed read. A read that changes are racing with
/// is followed by another: the flag is taken before the read, so a change
/// during it raises it again.
pub struct LiveView {
    view: Option<DataPlane>,
    declared: Vec<DeclaredTunnel>,
    /// `None` when notifications could not be subscribed: then every
    /// refresh re-reads.
    watcher: Option<ChangeWatcher>,
    /// The previous read's error, logged once until it changes; while set,
    /// every refresh re-reads (its change flag was taken by that read).
    last_error: Option<String>,
}

impl LiveView {
    /// A view counting the `declared` devices as tunnels, kept current by
    /// `watcher` (created in the calling thread's namespace, like the
    /// reads); when that failed, says so and re-reads at every refresh.
    /// Nothing is read before the first [`LiveView::refresh`].
    pub fn new(declared: Vec<DeclaredTunnel>, watcher: Result<ChangeWatcher>) -> LiveView {
        let watcher = watcher
            .inspect_err(|e| {
                tracing::warn!(
                    error = %format!("{e:#}"),
                    "no netlink change notifications; the data plane is re-read every interval"
                )
            })
            .ok();
        LiveView {
            view: None,
            declared,
            watcher,
            last_error: None,
        }
    }

    /// Re-reads the view when netlink reported a change or lost
    /// notifications, or the previous read failed (always the first
    /// time); true when the view differs from the previous one. A failed
    /// read keeps the previous view and is logged.
    pub fn refresh(&mut self) -> bool {
        let changed = self.watcher.as_ref().is_none_or(|w| w.take_changed());
        if !changed && self.view.is_some() && self.last_error.is_none() {
            return false;
        }
        match read_declaring(&self.declared) {
            Ok(view) => {
                self.last_error = None;
                if self.view.as_ref() == Some(&view) {
                    return false;
                }
                self.view = Some(view);
                true
            }
            Err(e) => {
                let error = format!("{e:#}");
                if self.last_error.as_ref() != Some(&error) {
                    tracing::error!(
                        error,
                        "cannot read the data plane (routes, FDB, devices); anomalies use the last view"
                    );
                    self.last_error = Some(error);
                }
                false
            }
        }
    }

    /// The latest view read; `None` before the first successful read.
    pub fn view(&self) -> Option<&DataPlane> {
        self.view.as_ref()
    }

    /// Overruns of the change notifications since the start (0 without a
    /// watcher).
    pub fn overruns(&self) -> u64 {
        self.watcher.as_ref().map_or(0, ChangeWatcher::overruns)
    }
}
