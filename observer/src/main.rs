//! The `observer` command.

use std::process::ExitCode;

use clap::Parser;
use observer::{
    cli::{Cli, Command},
    cmd,
    process::{heap, pipe},
};

fn main() -> ExitCode {
    heap::return_large_frees();
    tracing_subscriber::fmt()
        // A closed stderr drops the log instead of panicking (see process::pipe).
        .with_writer(pipe::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OBSERVER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Attach(args) => exit(
            cmd::attach::run(args).map(|()| ExitCode::SUCCESS),
            ExitCode::FAILURE,
        ),
        // 0 healthy, 1 problem found, 2 could not run (clap's usage errors
        // also exit 2).
        Command::Diagnose(args) => exit(cmd::diagnose::run(args).map(found), ExitCode::from(2)),
        Command::Lab(args) => exit(
            cmd::lab::run(args).map(|()| ExitCode::SUCCESS),
            ExitCode::FAILURE,
        ),
        // 0 ok, 1 damaged capture, 2 could not run (see `replay --help`).
        Command::Replay(args) => exit(
            cmd::replay::run(args).map(ExitCode::from),
            ExitCode::from(cmd::replay::EXIT_USAGE),
        ),
        // 0 every pair healthy, 1 a finding, 2 could not run.
        Command::Probe(args) => exit(cmd::probe::run(args).map(found), ExitCode::from(2)),
        // 0 healthy, 1 not, 2 could not read the file.
        Command::Health(args) => exit(cmd::health::run(args).map(found), ExitCode::from(2)),
        // 0 every pair healthy, 1 a pair with a problem, 2 could not run.
        Command::Cluster(args) => exit(cmd::cluster::run(args).map(found), ExitCode::from(2)),
        // 0 as designed, 1 with fallbacks, 2 cannot run.
        Command::Check(args) => exit(
            cmd::check::run(args.output).map(|verdict| ExitCode::from(verdict.exit_code())),
            ExitCode::from(2),
        ),
    }
}

/// 0 when a check found nothing (`healthy`), 1 when it found something.
fn found(healthy: bool) -> ExitCode {
    if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The exit status of a command: its own when it ran, 0 when the reader of
/// stdout or stderr went away (`| head`: the command stopped quietly, see
/// `process::pipe`), else `failed`, after printing the error.
fn exit(result: anyhow::Result<ExitCode>, failed: ExitCode) -> ExitCode {
    match result {
        Ok(status) => status,
        Err(e) if pipe::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            pipe::eprintln(format_args!("observer: error: {e:#}"));
            failed
        }
    }
}
