//! Runs the node's own tools (ipset, nft, iptables-save, ip) whose output
//! the observer reads, with typed errors that say whether the tool is
//! missing, failed or hung.

use std::{
    io::Read,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

/// How long a tool may take. iptables and nft wait for the xtables lock,
/// which Calico's Felix holds while it rewrites rules: a hung tool must not
/// stop the observer.
pub const TIMEOUT: Duration = Duration::from_secs(10);

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
    output_within(tool, args, what, TIMEOUT)
}

fn output_within(
    tool: &str,
    args: &[&str],
    what: &str,
    timeout: Duration,
) -> Result<String, ToolError> {
    let command = || format!("{tool} {}", args.join(" "));
    let io = |e: std::io::Error| ToolError::Io {
        tool: tool.to_string(),
        message: e.to_string(),
    };
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                ToolError::NotInstalled {
                    tool: tool.to_string(),
                    what: what.to_string(),
                }
            } else {
                io(e)
            }
        })?;
    // Both pipes are drained while waiting: a tool writing more than a
    // pipe holds would otherwise never exit.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
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
    let output = std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    if !output.status.success() {
        return Err(ToolError::Failed {
            command: command(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
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
        let err = output_within("sleep", &["30"], "its rules", Duration::from_millis(200))
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
