//! Small helpers shared by the tasks: where the workspace is, running
//! commands with an echo, and timing.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use anyhow::{Context, Result, bail};

/// The workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// A `cargo` command in the workspace root, using the cargo that runs us
/// (`$CARGO`, set by `cargo run`) so the toolchain stays the same.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

/// The command line of `cmd` as one displayable string.
pub fn display(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    // Show `cargo`, not the full path of the toolchain's binary.
    if cmd.get_program() == std::env::var_os("CARGO").unwrap_or_default().as_os_str() {
        text = "cargo".to_string();
    }
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&quote(arg));
    }
    text
}

/// `arg` as one shell word: as is when it is plain, else single-quoted.
pub fn quote(arg: &OsStr) -> String {
    let s = arg.to_string_lossy();
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@+,%".contains(c))
    {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Runs `cmd` with inherited stdio, echoing it first; fails on a non-zero exit.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = display(cmd);
    println!("$ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its output; fails (showing stderr) on a
/// non-zero exit.
pub fn output(cmd: &mut Command) -> Result<Output> {
    let line = display(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// True when running as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `1.23s` style duration.
pub fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}
