//! Facts read from the node the observer runs on: its data plane through
//! netlink, Calico's allow-sets and rule counters through the node's tools,
//! network namespaces, privileges, the kernel's tunnel device kinds and
//! the names of its functions.

pub mod allowsets;
pub mod bird;
pub mod dataplane;
pub mod kallsyms;
pub mod localnet;
pub mod netfilter;
pub mod netns;
pub mod preflight;
pub mod probe;
pub mod tools;
pub mod tunnel_kinds;
