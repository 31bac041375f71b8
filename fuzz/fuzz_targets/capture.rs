//! Arbitrary bytes as a capture file: `observer replay`'s reader and frame
//! normaliser must end every input with frames or an error, never a panic,
//! a hang or an unbounded allocation.

#![no_main]

use libfuzzer_sys::fuzz_target;

// The module itself, not the observer crate: the crate's build script
// builds eBPF programs, which a sanitizer build cannot.
#[path = "../../observer/src/cmd/replay/capture.rs"]
#[allow(dead_code)]
mod capture;

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
