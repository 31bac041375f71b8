//! observer: per-peer counters of encapsulated traffic at the wire, and why
//! tunnel packets die.
//!
//! The data path reads one way:
//!
//! ```text
//! bpf (kernel maps) -> model::rows -> model::aggregate -> model::anomalies
//!                                      (with node facts) -> report (lines, table, textfile)
//! ```
//!
//! Layers, each a folder (see ARCHITECTURE.md):
//! - `cli`: command-line types and the settings they make;
//! - `bpf`: the only code that touches the eBPF object: load, attach, maps,
//!   BTF, test runs, kernel features;
//! - `node`: facts read from the node: data plane, allow-sets, netfilter
//!   counters, tools, namespaces, privileges;
//! - `model`: pure logic on plain data: rows, aggregation, cross-check,
//!   anomalies (no I/O, no aya), in the `observer-core` crate;
//! - `report`: JSON lines, the table, the textfile, in `observer-core`;
//! - `store`: the Prometheus HTTP API client of `observer cluster`;
//! - `cmd`: the commands, which drive the others.
//!
//! `model` and `report` cannot import `bpf`, `node` or `cmd`: they are
//! another crate (`cargo xtask layers` checks the rules within each).

pub mod bpf;
pub mod cli;
pub mod cmd;
pub mod lab;
pub mod monitor;
pub mod node;
pub mod process;
pub mod store;

// The pure layers are the `observer-core` crate, re-exported so that every
// layer of this crate names them as before.
pub use observer_core::{model, parse, report};
