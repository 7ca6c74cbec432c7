//! The fuzz drivers (`fermata::fuzzing`, also run coverage-guided by the
//! cargo-fuzz targets in `fuzz/`) on seeded random inputs, so CI runs them on
//! stable: each node protocol machine and the TCP region frames get a few
//! thousand arbitrary event sequences. A failure prints the input to replay.

use fermata::fuzzing;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

const CASES: usize = 3000;

/// Runs `target` on CASES seeded inputs; returns how many reached its deepest
/// path.
fn run(name: &str, seed: u64, target: fn(&[u8]) -> u64) -> u64 {
    run_with(name, seed, target, random_bytes)
}

fn random_bytes(rng: &mut Xoshiro256PlusPlus) -> Vec<u8> {
    let len = rng.gen_range(0..2048);
    (0..len).map(|_| rng.gen()).collect()
}

fn run_with(
    name: &str,
    seed: u64,
    target: fn(&[u8]) -> u64,
    input: fn(&mut Xoshiro256PlusPlus) -> Vec<u8>,
) -> u64 {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut deep = 0;
    for case in 0..CASES {
        let data = input(&mut rng);
        let len = data.len();
        match std::panic::catch_unwind(|| target(&data)) {
            Ok(d) => deep += u64::from(d > 0),
            Err(_) => panic!("{name}: case {case} failed; input ({len} bytes): {data:?}"),
        }
    }
    eprintln!("{name}: {deep} of {CASES} inputs reached the deepest path");
    deep
}

#[test]
fn sched_proto() {
    assert!(run("sched_proto", 1, fuzzing::sched_proto) > 0);
}

/// Members joining and leaving: the scheduler's per-member state stays
/// bounded and is empty again once they are gone.
#[test]
fn sched_churn() {
    assert!(run("sched_churn", 7, fuzzing::sched_churn) > 0);
}

#[test]
fn backend_proto() {
    assert!(run("backend_proto", 2, fuzzing::backend_proto) > 0);
}

#[test]
fn frontend_ledger() {
    assert!(run("frontend_ledger", 3, fuzzing::frontend_ledger) > 0);
}

/// Region requests as a reader would send them (small offsets and lengths, some
/// out of bounds) mixed with garbage, then a cut-off tail.
fn region_input(rng: &mut Xoshiro256PlusPlus) -> Vec<u8> {
    let mut v = vec![rng.gen::<u8>()];
    for _ in 0..rng.gen_range(0..40) {
        if rng.gen_bool(0.7) {
            let r = fermata::transport::region_wire::Request {
                id: rng.gen(),
                offset: rng.gen_range(0..5000),
                len: rng.gen_range(0..300),
                cap: rng.gen(),
            };
            v.extend_from_slice(&r.encode());
        } else {
            v.extend((0..fermata::transport::region_wire::REQ_LEN).map(|_| rng.gen::<u8>()));
        }
    }
    v.extend((0..rng.gen_range(0..20)).map(|_| rng.gen::<u8>()));
    v
}

#[test]
fn region_frames() {
    assert!(run_with("region_frames", 4, fuzzing::region_frames, region_input) > 0);
}

/// The drivers check what they claim: a ledger that ended a request twice, or a
/// region answer that is not what was asked, would fail them. Here: inputs
/// built to reach the deep paths (an admitted request answered, then swept)
/// run clean, and a truncated region request is left for later.
#[test]
fn the_drivers_reach_their_checks() {
    // Step 0 (no time), op 0 (admit) ×2, then op 2 (answer admitted[..]), op 3
    // (sweep) after a long step.
    let ledger = [0u8, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 2, 3, 9, 9, 3];
    let _ = fuzzing::frontend_ledger(&ledger);
    let mut req = vec![0u8];
    req.extend_from_slice(
        &fermata::transport::region_wire::Request {
            id: 5,
            offset: 0,
            // The slot's header and part of its bytes (it holds 32 + 11).
            len: 40,
            // A multiple of 4: the driver makes it the slot's capability.
            cap: 4,
        }
        .encode(),
    );
    req.extend_from_slice(&[1, 2, 3]);
    assert_eq!(fuzzing::region_frames(&req), 1, "the read is served");
}

/// The secure channel's handshake and records: garbage to a listener,
/// handshakes with a byte changed on the way (none opens a channel) or left
/// alone (each opens one), records cut and changed.
#[test]
fn channel_handshake() {
    let deep = run("channel_handshake", 5, fuzzing::channel_handshake);
    assert!(deep > 0);
    // A handshake with a changed byte must not open: the first byte (odd:
    // change), flight 0, byte 3, xor 1 (the header's magic), and flight 1
    // byte 20 (the dialer's confirmation).
    assert_eq!(fuzzing::channel_handshake(&[1, 0, 0, 3, 0, 1]), 0);
    assert_eq!(fuzzing::channel_handshake(&[1, 1, 0, 20, 0, 1]), 0);
    // Left alone (even first byte), 456 bytes of records (200 + 256), none
    // changed (1 is not a multiple of 3): opens and carries them.
    assert_eq!(
        fuzzing::channel_handshake(&[0, 0, 0, 0, 0, 0, 200, 1, 0, 0, 1]),
        1
    );
}
