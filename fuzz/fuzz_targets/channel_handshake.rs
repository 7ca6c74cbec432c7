//! Arbitrary bytes as a secure-channel handshake and records for
//! `fermata::fuzzing::channel_handshake` (see there for what is generated and
//! checked).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fermata::fuzzing::channel_handshake(data);
});
