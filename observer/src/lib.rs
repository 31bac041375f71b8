//! observer: per-peer counters of encapsulated traffic at the wire.
pub mod flows;
pub mod loader;
pub mod ports;
pub mod testrun;
