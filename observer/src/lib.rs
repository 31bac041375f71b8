//! observer: per-peer counters of encapsulated traffic at the wire, and why
//! tunnel packets die.
//!
//! Modules by concern:
//! - `loader` owns the eBPF object, its attachments and kernel facts (BTF);
//! - `flows` and `drops` decode kernel rows; `aggregate` keeps monotonic
//!   totals and rates; `output` renders them; `attach` is the run loop;
//! - `allowsets`, `netfilter`, `localnet` read the node (sets, rule
//!   counters, vxlan devices, MTU) through `tools`; `checks` refreshes those
//!   facts and `mirror` writes them into the programs' maps;
//! - `kernel_btf` reads drop reason names and sk_buff offsets;
//! - `testrun` runs programs on frames without a device; `replay` feeds
//!   capture files through them.

pub mod aggregate;
pub mod allowsets;
pub mod attach;
pub mod checks;
pub mod cli;
pub mod drops;
pub mod export;
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
pub mod replay;
pub mod settings;
pub mod testrun;
pub mod tools;
