//! The commands: each drives `bpf`, `node`, `model` and `report` for one
//! job.

pub mod attach;
pub mod bgp;
pub mod check;
pub mod checks;
pub mod diagnose;
pub mod heap;
pub mod lab;
pub mod pipe;
pub mod privileges;
pub mod probe;
pub mod probing;
pub mod replay;
