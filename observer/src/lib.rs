//! observer: per-peer counters of encapsulated traffic at the wire, and why
//! tunnel packets die.
//!
//! Modules by concern:
//! - `loader` owns the eBPF object, its attachments and kernel facts (BTF);
//! - `flows` and `drops` decode kernel rows; `aggregate` keeps monotonic
//!   totals and rates; `output` renders them; `attach` is the run loop;
//! - `allowsets` and `netfilter` read the node's sets and rule counters
//!   through `tools`; `localnet` its MTUs and vxlan VNIs; `dataplane` its
//!   tunnel devices, routes, FDB and expected peers through netlink;
//!   `checks` refreshes those facts and `mirror` writes them into the
//!   programs' maps;
//! - `anomalies` turns counters and the node's view into per-peer problems;
//!   `diagnose` writes them up after a bounded run;
//! - `kernel_btf` reads drop reason names and sk_buff offsets;
//! - `testrun` runs programs on frames without a device; `replay` feeds
//!   capture files through them;
//! - `lab` rebuilds the overlay incident in network namespaces and
//!   diagnoses it with observers on every node.

pub mod aggregate;
pub mod allowsets;
pub mod anomalies;
pub mod attach;
pub mod check;
pub mod checks;
pub mod cli;
pub mod dataplane;
pub mod diagnose;
pub mod drops;
pub mod export;
pub mod features;
pub mod flows;
pub mod kernel_btf;
pub mod lab;
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
pub mod tunnel_kinds;
pub mod verifier_stats;
