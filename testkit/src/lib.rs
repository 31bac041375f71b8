//! Fixtures shared by the observer's integration tests (`observer/tests/`), its
//! benches and `cargo xtask soak`: network namespaces behind guards
//! ([`netns`]), the two-namespace veth pair with optional VXLAN devices
//! that most namespace tests and the soak run in ([`pair`]), a
//! raw-frame flood ([`storm`]), and real BIRD daemons ([`bird`], also
//! run by `observer lab`'s BGP scenarios).
//!
//! std, libc and serde_json only, and nothing of the observer: what runs
//! the observer and reads its output stays in `observer/tests/support`.

pub mod bird;
pub mod netns;
pub mod pair;
pub mod storm;
