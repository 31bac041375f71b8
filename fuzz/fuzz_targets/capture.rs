//! Arbitrary bytes as a capture file: `observer replay`'s reader and frame
//! normaliser must end every input with frames or an error, never a panic,
//! a hang or an unbounded allocation.

#![no_main]

use libfuzzer_sys::fuzz_target;

// From the pure core crate, which has no build script (the observer
// crate's builds eBPF programs).
use observer_core::capture;

fuzz_target!(|data: &[u8]| {
    let Ok(frames) = capture::frames(data) else {
        return;
    };
    let mut last = 0;
    for frame in frames {
        let Ok(frame) = frame else {
            break;
        };
        // Numbers count up from 1 without gaps.
        assert_eq!(frame.number, last + 1);
        last = frame.number;
        let _ = frame.truncated();
        let _ = capture::outer_source(&frame.data);
    }
});
