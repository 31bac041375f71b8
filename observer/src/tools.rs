//! Runs the node's own tools (ipset, nft, iptables-save, ip) whose output
//! the observer reads, with errors that say whether the tool is missing or
//! failed.

use std::process::Command;

/// Runs `tool args...`; stdout on success, else a one-line explanation
/// (`X is not installed (or not on PATH): <what> cannot be read`).
pub fn output(tool: &str, args: &[&str], what: &str) -> Result<String, String> {
    let output = Command::new(tool).args(args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!("{tool} is not installed (or not on PATH): {what} cannot be read")
        } else {
            format!("running {tool}: {e}")
        }
    })?;
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
    fn failure_carries_stderr() {
        let err = output("sh", &["-c", "echo boom >&2; exit 3"], "x").unwrap_err();
        assert!(err.ends_with(": boom"), "{err}");
        assert_eq!(output("sh", &["-c", "echo ok"], "x").unwrap(), "ok\n");
    }
}
