//! Differential fuzzing of the two replay classifiers: the eBPF programs
//! run by BPF_PROG_TEST_RUN (`observer replay --kernel`) and the same
//! parser and checks compiled natively (`observer replay`, the default).
//! Random frames of every kind the parser knows (VLAN tags, IPv4 options
//! and fragments, IPv6 extension headers, every encapsulation, ICMP "too
//! big" quotes, inner packets, jumbo lengths) and mutations of them and of
//! the reference captures go through both engines; any difference in any
//! row (packets, bytes, inner sample, drop reasons) fails the test with the
//! first frame that shows it, hex-dumped and written as a pcap to replay.
//!
//! Settings (environment):
//! - `OBSERVER_DIFF_FRAMES`: frames to try (default 20,000: a few seconds,
//!   the `cargo xtask test` run);
//! - `OBSERVER_DIFF_SECONDS`: run for this long instead (`cargo xtask
//!   fuzz`);
//! - `OBSERVER_DIFF_SEED`: the generator's seed (default fixed, so that CI
//!   is repeatable; `cargo xtask fuzz` picks a new one and prints it).

mod support;

use std::time::{Duration, Instant};

use support::differential::{Budget, fuzz};

/// Frames of the `cargo test` run: a few seconds.
const DEFAULT_FRAMES: u64 = 20_000;
/// Fixed, so that CI is repeatable; `cargo xtask fuzz` picks new ones.
const DEFAULT_SEED: u64 = 0x0b5e_12ee_d1ff_0001;

fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let text = text.trim();
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={text}: {e}")))
}

#[test]
fn native_and_kernel_classifiers_agree_on_random_and_mutated_frames() {
    if !support::have_root("native_and_kernel_classifiers_agree_on_random_and_mutated_frames") {
        return;
    }
    let seed = env_u64("OBSERVER_DIFF_SEED").unwrap_or(DEFAULT_SEED);
    let (budget, told) = match env_u64("OBSERVER_DIFF_SECONDS") {
        Some(seconds) => (
            Budget::Until(Instant::now() + Duration::from_secs(seconds)),
            format!("{seconds} s"),
        ),
        None => {
            let frames = env_u64("OBSERVER_DIFF_FRAMES").unwrap_or(DEFAULT_FRAMES);
            (Budget::Frames(frames), format!("{frames} frames"))
        }
    };
    eprintln!("seed 0x{seed:x}, {told}");
    let agreement = fuzz(seed, budget).unwrap_or_else(|difference| panic!("{difference}"));
    eprintln!(
        "{} frames, {} rows: the same in both classifiers; {} took the VXLAN early exit, {} \
         skip the checks program on a flow whose facts flag nothing",
        agreement.frames, agreement.rows, agreement.common_vxlan, agreement.checks_skipped
    );
    assert!(agreement.rows > 0);
    // The generator must reach the early exit often enough to test it.
    assert!(
        agreement.common_vxlan * 100 >= agreement.frames,
        "only {} of {} frames took the VXLAN early exit",
        agreement.common_vxlan,
        agreement.frames
    );
    assert!(
        agreement.checks_skipped * 100 >= agreement.frames,
        "only {} of {} frames skip the checks program",
        agreement.checks_skipped,
        agreement.frames
    );
}
