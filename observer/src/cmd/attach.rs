//! `observer attach`: the [`Monitor`] run until a signal, `--duration` or
//! a closed stdout ends it, printing and exporting every interval.

use anyhow::Result;

use crate::{
    cli::AttachArgs,
    monitor::{Monitor, Options},
    node::netns,
    report::Format,
};

/// Runs the attach command: prints every interval until a signal,
/// `--duration` or a closed stdout ends the run.
pub fn run(args: AttachArgs) -> Result<()> {
    // Namespace first: setns only moves the calling thread, so it must
    // happen before the runtime starts any.
    if let Some(name) = &args.netns {
        netns::enter(name)?;
    }
    let format = Format::or_default(args.output);
    let options = Options {
        format,
        print: true,
        duration: args.duration,
        probe_once: false,
    };
    let mut monitor = Monitor::start(&args, options)?;
    loop {
        let is_final = monitor.wait();
        monitor.tick(is_final)?;
        if is_final {
            break;
        }
    }
    monitor.finish();
    Ok(())
}
