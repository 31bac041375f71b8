//! `observer health`: the DaemonSet's liveness and startup probe without
//! a shell in the image: the textfile is recent and names attached
//! programs (`model::health` judges, this reads the file).

use std::time::SystemTime;

use anyhow::{Context, Result};

use crate::{
    cli::HealthArgs,
    model::health::{Reading, judge},
    parse::exposition::first_value,
    report::textfile::TEXTFILE_NAME,
};

/// Runs the check; `Ok(true)` when healthy (one line on stdout says so).
pub fn run(args: HealthArgs) -> Result<bool> {
    let path = args.textfile_dir.join(TEXTFILE_NAME);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {}: no textfile there (the observer is not running, or writes another \
             --textfile-dir)",
            path.display()
        )
    })?;
    let modified = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .with_context(|| format!("reading the modification time of {}", path.display()))?;
    let reading = Reading {
        age: SystemTime::now()
            .duration_since(modified)
            .unwrap_or_default(),
        programs_attached: first_value(&text, "observer_programs_attached"),
    };
    match judge(reading, args.max_age) {
        Ok(()) => {
            println!(
                "healthy: {} written {}s ago, {} programs attached",
                path.display(),
                reading.age.as_secs(),
                reading.programs_attached.unwrap_or(0.0)
            );
            Ok(true)
        }
        Err(why) => {
            println!("unhealthy: {}: {why}", path.display());
            Ok(false)
        }
    }
}
