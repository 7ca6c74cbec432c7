//! Arbitrary bytes into the wire decoder, as one frame body and as a stream.
//! Checks: no panic; whatever decodes re-encodes to exactly the same bytes
//! (decoding is canonical); a `FrameReader` returns frames until its first error,
//! then that same error for ever.
#![no_main]

use fermata::wire::{decode, encode_to_vec, DecodeError, FrameReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // As one frame body.
    if let Ok(msg) = decode(data) {
        assert_eq!(&encode_to_vec(&msg)[4..], data, "not canonical");
    }

    // As a stream, fed in chunks whose size the first byte picks.
    let chunk = data.first().map_or(1, |&b| b as usize + 1);
    let mut reader = FrameReader::new();
    let mut failed: Option<DecodeError> = None;
    for c in data.chunks(chunk) {
        reader.feed(c);
        while let Some(next) = reader.next_msg() {
            match next {
                Ok(msg) => {
                    assert!(failed.is_none(), "a frame after an error");
                    let frame = encode_to_vec(&msg);
                    assert_eq!(decode(&frame[4..]).as_ref(), Ok(&msg));
                }
                Err(e) => {
                    if let Some(first) = &failed {
                        assert_eq!(first, &e, "the error changed");
                    }
                    failed = Some(e);
                    break;
                }
            }
        }
    }
    assert!(reader.buffered() <= data.len());
});
