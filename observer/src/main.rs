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
    match cli.command {
        Command::Attach(args) => match observer::cmd::attach::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e, ExitCode::FAILURE),
        },
        // 0 healthy, 1 problem found, 2 could not run (clap's usage errors
        // also exit 2).
        Command::Diagnose(args) => match observer::cmd::diagnose::run(args) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => fail(e, ExitCode::from(2)),
        },
        Command::Lab(args) => match observer::cmd::lab::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e, ExitCode::FAILURE),
        },
        // 0 ok, 1 damaged capture, 2 could not run (see `replay --help`).
        Command::Replay(args) => observer::cmd::replay::run(args),
        // 0 as designed, 1 with fallbacks, 2 cannot run.
        Command::Check(args) => match observer::cmd::check::run(args.output) {
            Ok(verdict) => ExitCode::from(verdict.exit_code()),
            Err(e) => fail(e, ExitCode::from(2)),
        },
    }
}

fn fail(e: anyhow::Error, code: ExitCode) -> ExitCode {
    eprintln!("observer: error: {e:#}");
    code
}
