//! observer: per-peer counters of encapsulated traffic at the wire.
//!
//! Modules by concern: `loader` owns the eBPF object and its attachments,
//! `flows` decodes kernel rows, `aggregate` keeps monotonic totals and
//! rates, `output` renders them, `attach` is the command's run loop, and
//! `testrun` runs programs on frames without a device.

pub mod aggregate;
pub mod allowsets;
pub mod attach;
pub mod checks;
pub mod cli;
pub mod drops;
pub mod flows;
pub mod kernel_btf;
pub mod loader;
pub mod localnet;
pub mod mirror;
pub mod netfilter;
pub mod netns;
pub mod output;
pub mod ports;
pub mod preflight;
pub mod testrun;
