//! Arbitrary text as the `--config` file, parsed and resolved as `observer
//! attach --config FILE` (no options otherwise) does: no panic, and a
//! resolved file names its interfaces and a finite drop rate; a refused
//! one says why.

#![no_main]

use std::sync::LazyLock;

use clap::Parser;
use libfuzzer_sys::fuzz_target;
use observer::cli::{
    AttachArgs, Cli, Command,
    settings::{FileConfig, Settings},
};

static ARGS: LazyLock<AttachArgs> = LazyLock::new(|| {
    match Cli::try_parse_from(["observer", "attach", "--config", "fuzzed.toml"]) {
        Ok(Cli {
            command: Command::Attach(args),
            ..
        }) => args,
        other => panic!("`observer attach --config` parsed as {other:?}"),
    }
});

fuzz_target!(|data: &[u8]| {
    // The file is read as UTF-8 (`read_to_string`): other bytes never get here.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = match FileConfig::parse(text) {
        Ok(file) => file,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    match Settings::resolve(&ARGS, file) {
        Ok(settings) => {
            assert!(!settings.interfaces.is_empty());
            assert!(settings.thresholds.drop_spike_pps.is_finite());
            assert!(settings.fixed_changes(&settings).is_empty());
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
