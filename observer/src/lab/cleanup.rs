//! Everything the lab must undo, and when: a guard that owns the lab's
//! namespaces, child processes and userspace tunnels and removes them on
//! drop (normal end, error or panic), the SIGINT/SIGTERM/SIGHUP flag that
//! turns a signal into an orderly drop, and the removal of namespaces left
//! by a lab that was killed with SIGKILL.

use std::{
    path::Path,
    process::{Child, Command},
    sync::atomic::{AtomicI32, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{shell::run_tool, tunnel::Tunnel};
use crate::process::pipe;

/// Prefix of every namespace the lab creates: `obslab-<pid>-<role>`.
pub const PREFIX: &str = "obslab-";

/// How long children get between SIGTERM and SIGKILL. The observers print
/// their final counters and close their bpf links within it.
const TERM_GRACE: Duration = Duration::from_secs(5);

/// The signal that asked the lab to stop (0: none yet).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    // Only an atomic store: anything else is not async-signal-safe.
    STOP_SIGNAL.store(signal, Ordering::SeqCst);
}

/// Makes SIGINT, SIGTERM and SIGHUP set the stop flag instead of killing
/// the process, so that the guard's drop removes the lab.
pub fn install_signal_handlers() -> Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction with a handler that only stores an
        // atomic; sigaction(2) validates the rest.
        let ret = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if ret != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("installing the handler of signal {signal}"));
        }
    }
    Ok(())
}

/// Fails with the signal's name once SIGINT/SIGTERM/SIGHUP arrived; called
/// between steps and while waiting, so an interrupted lab unwinds to the
/// guard's drop.
pub fn check_interrupted() -> Result<()> {
    let name = match STOP_SIGNAL.load(Ordering::SeqCst) {
        0 => return Ok(()),
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "SIGHUP",
    };
    bail!("interrupted by {name} (the lab has been removed)")
}

/// What the lab created; dropping it stops the children (SIGTERM, then
/// SIGKILL after a grace period), stops the userspace tunnels and deletes
/// the namespaces, which removes every device in them.
#[derive(Default)]
pub struct Cleanup {
    namespaces: Vec<String>,
    children: Vec<(String, Child)>,
    tunnels: Vec<Tunnel>,
}

impl Cleanup {
    /// Creates namespace `name` and takes charge of deleting it.
    pub fn add_namespace(&mut self, name: &str) -> Result<()> {
        run_tool("ip", &["netns", "add", name])?;
        self.namespaces.push(name.to_string());
        Ok(())
    }

    /// Spawns `cmd` in its own process group (a Ctrl-C on the terminal
    /// reaches only the lab, which then stops the children in order) and
    /// keeps it; returns its index for [`Cleanup::child`].
    pub fn spawn(&mut self, what: &str, cmd: &mut Command) -> Result<usize> {
        use std::os::unix::process::CommandExt;
        let child = cmd
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {what} ({:?})", cmd.get_program()))?;
        self.children.push((what.to_string(), child));
        Ok(self.children.len() - 1)
    }

    /// The child spawned as `index`.
    pub fn child(&mut self, index: usize) -> &mut Child {
        &mut self.children[index].1
    }

    /// Keeps a userspace tunnel running until the lab is removed.
    pub fn add_tunnel(&mut self, tunnel: Tunnel) {
        self.tunnels.push(tunnel);
    }

    /// SIGTERM to every child still running, SIGKILL to those still there
    /// after [`TERM_GRACE`]; all are reaped.
    fn stop_children(&mut self) {
        for (_, child) in &mut self.children {
            if let Ok(None) = child.try_wait() {
                // SAFETY: kill(2) of our own child, not yet reaped, so the
                // pid cannot have been reused.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + TERM_GRACE;
        for (what, child) in &mut self.children {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() < deadline => {
                        thread::sleep(Duration::from_millis(20))
                    }
                    Ok(None) => {
                        pipe::eprintln(format_args!(
                            "lab: {what} ignored SIGTERM for {TERM_GRACE:?}; killing it"
                        ));
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        self.children.clear();
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.stop_children();
        self.tunnels.clear();
        for ns in &self.namespaces {
            if let Err(e) = run_tool("ip", &["netns", "del", ns]) {
                pipe::eprintln(format_args!("lab: cleanup: {e:#}"));
            }
        }
        if !self.namespaces.is_empty() {
            pipe::eprintln(format_args!(
                "lab: removed namespaces {}",
                self.namespaces.join(" ")
            ));
        }
    }
}

/// Deletes namespaces of labs whose process no longer exists (killed with
/// SIGKILL, so their guard never ran).
pub fn remove_stale_labs() {
    let Ok(list) = run_tool("ip", &["netns", "list"]) else {
        return;
    };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // Its daemons (a BGP scenario's BIRD) would keep the namespace
        // alive, unnamed, after the name is deleted.
        if let Ok(pids) = run_tool("ip", &["netns", "pids", name]) {
            for pid in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                // SAFETY: kill(2) with a pid listed in the stale namespace
                // just now; a left-over process of a lab that is gone.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        match run_tool("ip", &["netns", "del", name]) {
            Ok(_) => pipe::eprintln(format_args!(
                "lab: removed {name}, left by an earlier lab that was killed"
            )),
            Err(e) => pipe::eprintln(format_args!(
                "lab: cannot remove stale namespace {name}: {e:#}"
            )),
        }
    }
}
