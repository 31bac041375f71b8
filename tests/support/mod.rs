//! Helpers shared by the integration tests: frame builders and network
//! namespace fixtures. Each test file uses a subset.
#![allow(dead_code)]

pub mod frames;
pub mod netns;
