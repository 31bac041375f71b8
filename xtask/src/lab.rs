//! `cargo xtask lab`: builds the release observer, then becomes `observer
//! lab` (the incident rebuilt in network namespaces, see docs/lab.md), with
//! the options given after `lab` passed through.

use std::{os::unix::process::CommandExt, process::Command};

use anyhow::{Context, Result};

use crate::util::workspace_root;

/// Options of `cargo xtask lab`: everything is passed to `observer lab`.
#[derive(clap::Args)]
pub struct LabArgs {
    /// Options of `observer lab` (e.g. `--scenario mtu --duration 30s
    /// --output json`); `cargo xtask lab -- --help` lists them.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "OPTIONS"
    )]
    options: Vec<String>,
}

/// Builds the observer and replaces this process with `observer lab`, so
/// that Ctrl-C reaches the lab alone and its cleanup runs undisturbed.
pub fn lab(args: &LabArgs) -> Result<()> {
    crate::build_release()?;
    let observer = workspace_root().join("target/release/observer");
    let err = Command::new(&observer)
        .arg("lab")
        .args(&args.options)
        .exec();
    Err(err).with_context(|| format!("cannot run {}", observer.display()))
}
