//! Fixtures shared by the observer's integration tests (`observer/tests/`), its
//! benches and `cargo xtask soak`: network namespaces behind guards
//! ([`netns`]), the two-namespace veth pair with optional VXLAN devices
//! that most namespace tests and the soak run in ([`pair`]), and a
//! raw-frame flood ([`storm`]). (BIRD, which `observer lab` runs
//! too, is the lab's own: `observer::lab::bird`.)
//!
//! std, libc and serde_json only, and nothing of the observer: what runs
//! the observer and reads its output stays in `observer/tests/support`.

pub mod netns;
pub mod pair;
pub mod storm;
