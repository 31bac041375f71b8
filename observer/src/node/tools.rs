//! Runs the node's own tools (ipset, nft, iptables-save, ip) whose output
//! the observer reads, with errors that say whether the tool is missing,
//! failed or hung.

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

/// Runs `tool args...`; stdout on success, else a one-line explanation
/// (`X is not installed (or not on PATH): <what> cannot be read`, or that it
/// did not answer within [`TIMEOUT`]).
pub fn output(tool: &str, args: &[&str], what: &str) -> Result<String, String> {
    output_within(tool, args, what, TIMEOUT)
}

fn output_within(
    tool: &str,
    args: &[&str],
    what: &str,
    timeout: Duration,
) -> Result<String, String> {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                format!("{tool} is not installed (or not on PATH): {what} cannot be read")
            } else {
                format!("running {tool}: {e}")
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
                return Err(format!(
                    "{tool} {} did not answer within {}s (is another process holding its lock?): {what} not read this time",
                    args.join(" "),
                    timeout.as_secs()
                ));
            }
            Err(e) => return Err(format!("waiting for {tool}: {e}")),
        }
    };
    let output = std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    if !output.status.success() {
        return Err(format!(
            "{tool} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
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
            "observer-no-such-tool is not installed (or not on PATH): its sets cannot be read"
        );
    }

    #[test]
    fn a_hung_tool_is_killed_and_named() {
        let started = Instant::now();
        let err =
            output_within("sleep", &["30"], "its rules", Duration::from_millis(200)).unwrap_err();
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
        assert!(err.ends_with(": boom"), "{err}");
        assert_eq!(output("sh", &["-c", "echo ok"], "x").unwrap(), "ok\n");
    }
}
