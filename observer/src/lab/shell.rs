//! Runs the tools that build and tear down the lab (ip, iptables, ...),
//! with errors that name the command and what it printed.

use std::process::{Command, Stdio};

use anyhow::{Result, bail};

/// Runs `program args`: its stdout, or an error naming the command, how
/// it ended and what it printed on stderr.
pub fn run_tool(program: &str, args: &[&str]) -> Result<String> {
    let line = format!("{program} {}", args.join(" "));
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run `{line}`: {e}"))?;
    if !output.status.success() {
        bail!(
            "`{line}` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `ip netns exec NS argv...`; see [`run_tool`].
pub fn in_ns(ns: &str, argv: &[&str]) -> Result<String> {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(argv);
    run_tool("ip", &all)
}
