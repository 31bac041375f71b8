//! The `observer` command.

use std::process::ExitCode;

use clap::Parser;
use observer::cli::{Cli, Command};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OBSERVER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Attach(args) => observer::attach::run(args),
        Command::Replay(args) => return observer::replay::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("observer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
