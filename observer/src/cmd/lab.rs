//! `observer lab`: the incident rebuilt in network namespaces. The lab is
//! a component of its own (`crate::lab`), which runs this binary on every
//! node as a user would.

use anyhow::Result;

use crate::cli::LabArgs;

/// Runs `observer lab`.
pub fn run(args: LabArgs) -> Result<()> {
    crate::lab::run(args)
}
