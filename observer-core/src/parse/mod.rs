//! Parsers of what other programs say about the node, with no I/O: the
//! `observer` crate's `node` layer runs the tools and reads the sockets
//! (its `store` layer asks Prometheus),
//! and hands the bytes here; the fuzz targets (`fuzz/`) call the same
//! functions on arbitrary input. Each parser skips what it does not know
//! and never panics.

pub mod bird;
pub mod exposition;
pub mod kallsyms;
pub mod netfilter;
pub mod netlink;
pub mod prometheus;
