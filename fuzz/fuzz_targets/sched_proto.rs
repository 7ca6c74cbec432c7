//! Arbitrary bytes as a sequence of events for `fermata::fuzzing::sched_proto` (see
//! there for what is generated and checked).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fermata::fuzzing::sched_proto(data);
});
