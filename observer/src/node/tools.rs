//! Runs the node's own tools (ipset, nft, iptables-save, ip) whose output
//! the observer reads, with typed errors that say whether the tool is
//! missing, failed or hung; with `--host-root DIR`, the host's own tools,
//! run chrooted into the host's root filesystem mounted at DIR (an image
//! that holds nothing but the observer, in the host's iptables mode).

use std::{
    ffi::CString,
    io::Read,
    os::unix::{ffi::OsStrExt, process::CommandExt},
    path::Path,
    process::{Command, Stdio},
    sync::OnceLock,
    thread,
    time::{Duration, Instant},
};

/// How long a tool may take. iptables and nft wait for the xtables lock,
/// which Calico's Felix holds while it rewrites rules: a hung tool must not
/// stop the observer.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The most standard output a tool may give. What the observer reads is
/// small (Calico's 50,000 rules are about 10 MiB of `iptables-save`; a
/// set of 65,536 prefixes, what the programs hold, about 2 MiB of `ipset
/// save`); a ruleset or set that others control must not make the
/// observer hold gigabytes.
pub const MAX_OUTPUT: u64 = 32 << 20;

/// The most standard error kept for a message.
const MAX_STDERR: u64 = 16 << 10;

/// The host root the tools run in (`--host-root`), set once at start.
static HOST_ROOT: OnceLock<(String, CString)> = OnceLock::new();

/// The PATH tools are looked up in inside the host root (the image's own
/// PATH names only /usr/bin).
const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// From now on, runs every tool chrooted into `root` (the host's root
/// filesystem, e.g. a hostPath of `/` mounted at `/host`); needs
/// CAP_SYS_CHROOT. Fails when `root` is no directory, or a root was set
/// already.
pub fn run_in_host_root(root: &Path) -> anyhow::Result<()> {
    if !root.is_dir() {
        anyhow::bail!(
            "--host-root {}: no such directory (mount the host's / there, read-only)",
            root.display()
        );
    }
    let c = CString::new(root.as_os_str().as_bytes())?;
    HOST_ROOT
        .set((root.display().to_string(), c))
        .map_err(|_| anyhow::anyhow!("--host-root is set once"))
}

/// Why a tool's output could not be had. Callers branch on the kind: a
/// tool that is not installed is not asked again within the same read;
/// after a timeout or failure what it should have read is kept from the
/// previous read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ToolError {
    /// The executable is not on PATH.
    #[error("{tool} is not installed (or not on PATH): {what} cannot be read")]
    NotInstalled {
        /// The executable.
        tool: String,
        /// What the observer wanted from it.
        what: String,
    },
    /// It ran longer than the timeout and was killed.
    #[error(
        "{command} did not answer within {}s (is another process holding its lock?): {what} not read this time",
        timeout.as_secs()
    )]
    TimedOut {
        /// The command line.
        command: String,
        /// The timeout it exceeded.
        timeout: Duration,
        /// What the observer wanted from it.
        what: String,
    },
    /// It exited with a failure status.
    #[error("{command}: {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// It wrote more than [`MAX_OUTPUT`] (the rest was read and dropped,
    /// so it could finish).
    #[error(
        "{command} wrote more than {} MiB: {what} not read (more than the observer reads)",
        limit >> 20
    )]
    TooLarge {
        /// The command line.
        command: String,
        /// The limit it exceeded, in bytes.
        limit: u64,
        /// What the observer wanted from it.
        what: String,
    },
    /// Starting or waiting for it failed otherwise.
    #[error("running {tool}: {message}")]
    Io {
        /// The executable.
        tool: String,
        /// The system's error.
        message: String,
    },
}

/// Runs `tool args...`; stdout on success, else why not (see [`ToolError`];
/// a tool that does not answer within [`TIMEOUT`] is killed).
pub fn output(tool: &str, args: &[&str], what: &str) -> Result<String, ToolError> {
    output_within(tool, args, what, TIMEOUT, MAX_OUTPUT)
}

fn output_within(
    tool: &str,
    args: &[&str],
    what: &str,
    timeout: Duration,
    max_output: u64,
) -> Result<String, ToolError> {
    let command = || format!("{tool} {}", args.join(" "));
    let io = |e: std::io::Error| ToolError::Io {
        tool: tool.to_string(),
        message: e.to_string(),
    };
    let mut cmd = Command::new(tool);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let host_root = HOST_ROOT.get();
    if let Some((_, root)) = host_root {
        cmd.env("PATH", HOST_PATH);
        let root = root.clone();
        // SAFETY: between fork and exec only chroot(2) and chdir(2), which
        // are async-signal-safe, on memory prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::chroot(root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().map_err(|e| match (e.kind(), host_root) {
        (std::io::ErrorKind::NotFound, None) => ToolError::NotInstalled {
            tool: tool.to_string(),
            what: what.to_string(),
        },
        (std::io::ErrorKind::NotFound, Some((shown, _))) => ToolError::NotInstalled {
            tool: format!("{tool} (looked for in --host-root {shown})"),
            what: what.to_string(),
        },
        (_, Some((shown, _))) => ToolError::Io {
            tool: format!("{tool} in --host-root {shown} (entering it needs CAP_SYS_CHROOT)"),
            message: e.to_string(),
        },
        (_, None) => io(e),
    })?;
    // Both pipes are drained while waiting: a tool writing more than a
    // pipe holds would otherwise never exit. Past `limit` bytes the rest is
    // read and dropped (memory stays bounded, the tool still finishes);
    // the thread says how many bytes it dropped.
    let drain = |pipe: Option<Box<dyn Read + Send>>, limit: u64| {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            let mut dropped = 0;
            if let Some(mut pipe) = pipe {
                let _ = (&mut pipe).take(limit).read_to_end(&mut bytes);
                dropped = std::io::copy(&mut pipe, &mut std::io::sink()).unwrap_or(0);
            }
            (bytes, dropped)
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        max_output,
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        MAX_STDERR,
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ToolError::TimedOut {
                    command: command(),
                    timeout,
                    what: what.to_string(),
                });
            }
            Err(e) => return Err(io(e)),
        }
    };
    let (stdout, stdout_dropped) = stdout.join().unwrap_or_default();
    let (stderr, _) = stderr.join().unwrap_or_default();
    if !status.success() {
        return Err(ToolError::Failed {
            command: command(),
            stderr: String::from_utf8_lossy(&stderr).trim().to_string(),
        });
    }
    if stdout_dropped > 0 {
        return Err(ToolError::TooLarge {
            command: command(),
            limit: max_output,
            what: what.to_string(),
        });
    }
    // Rule comments and set names are other people's bytes: invalid UTF-8
    // becomes U+FFFD rather than an error, so one odd comment does not
    // hide every counter.
    Ok(String::from_utf8_lossy(&stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tool_is_named() {
        let err = output("observer-no-such-tool", &[], "its sets").unwrap_err();
        assert_eq!(
            err,
            ToolError::NotInstalled {
                tool: "observer-no-such-tool".into(),
                what: "its sets".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "observer-no-such-tool is not installed (or not on PATH): its sets cannot be read"
        );
    }

    #[test]
    fn a_hung_tool_is_killed_and_named() {
        let started = Instant::now();
        let err = output_within(
            "sleep",
            &["30"],
            "its rules",
            Duration::from_millis(200),
            MAX_OUTPUT,
        )
        .unwrap_err()
        .to_string();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            err.starts_with("sleep 30 did not answer within 0s"),
            "{err}"
        );
        assert!(err.ends_with("its rules not read this time"), "{err}");
    }

    #[test]
    fn large_output_is_read_whole() {
        let out = output("sh", &["-c", "head -c 1000000 /dev/zero | tr '\\0' x"], "x").unwrap();
        assert_eq!(out.len(), 1_000_000);
    }

    #[test]
    fn output_past_the_limit_is_refused_and_the_tool_still_finishes() {
        let started = Instant::now();
        let err = output_within(
            "sh",
            &["-c", "head -c 5000000 /dev/zero"],
            "its sets",
            Duration::from_secs(30),
            1 << 20,
        )
        .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "not killed by the timeout"
        );
        assert_eq!(
            err.to_string(),
            "sh -c head -c 5000000 /dev/zero wrote more than 1 MiB: its sets not read \
             (more than the observer reads)"
        );
        let exact = output_within(
            "sh",
            &["-c", "head -c 1048576 /dev/zero"],
            "x",
            TIMEOUT,
            1 << 20,
        );
        assert_eq!(exact.unwrap().len(), 1 << 20, "the limit itself is read");
        let noisy =
            output("sh", &["-c", "head -c 1000000 /dev/zero >&2; exit 1"], "x").unwrap_err();
        assert!(
            matches!(&noisy, ToolError::Failed { stderr, .. } if stderr.len() == MAX_STDERR as usize),
            "stderr kept up to its limit"
        );
    }

    #[test]
    fn invalid_utf8_is_replaced_not_refused() {
        let out = output("printf", &["a\\377b"], "x").unwrap();
        assert_eq!(out, "a\u{fffd}b");
    }

    #[test]
    fn failure_carries_stderr() {
        let err = output("sh", &["-c", "echo boom >&2; exit 3"], "x").unwrap_err();
        assert_eq!(
            err,
            ToolError::Failed {
                command: "sh -c echo boom >&2; exit 3".into(),
                stderr: "boom".into()
            }
        );
        assert_eq!(output("sh", &["-c", "echo ok"], "x").unwrap(), "ok\n");
    }
}
