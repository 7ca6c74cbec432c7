//! Arbitrary bytes as members joining and leaving the scheduler, for
//! `fermata::fuzzing::sched_churn` (see there for what is generated and
//! checked).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fermata::fuzzing::sched_churn(data);
});
