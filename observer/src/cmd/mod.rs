//! The commands, one a module, each thin: parse its settings, call the
//! engine (`monitor`) or the layers below, hand the result to `report`.
//! No command imports another.

pub mod attach;
pub mod check;
pub mod cluster;
pub mod diagnose;
pub mod health;
pub mod lab;
pub mod probe;
pub mod replay;
