//! The observer's pure core: what the commands compute and print, apart
//! from the kernel. No eBPF object, no build script, no sockets: the fuzz
//! targets, the tests and the benches use it without building the
//! programs, and Cargo keeps `bpf`, `node` and `cmd` (in the `observer`
//! crate) out of it.
//!
//! - `model`: pure logic on plain data: rows, aggregation, anomalies,
//!   verdicts, the data-plane view, probes' plans (no I/O);
//! - `report`: JSON lines, the table, the textfile (imports `model` only;
//!   `cargo xtask layers` checks it);
//! - `capture`: pcap and pcapng files read into frames for `observer
//!   replay`;
//! - `parse`: what other programs say, read into the model: rtnetlink
//!   messages (`netlink`), ipset, iptables and nft output (`netfilter`),
//!   BIRD's control protocol (`bird`). The `observer` crate runs the
//!   programs and owns the sockets; the fuzz targets feed these the bytes.

pub mod capture;
pub mod model;
pub mod parse;
pub mod report;
