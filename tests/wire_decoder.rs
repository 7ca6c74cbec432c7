//! The wire codec against arbitrary messages and hostile bytes: every message
//! round-trips, every accepted frame is the canonical encoding of what it decodes to,
//! cut, oversized, mislabelled or garbage frames fail with the right error and never
//! panic or allocate much, and `FrameReader` splits a stream however it is chunked.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use fermata::wire::codec::frame_len;
use fermata::wire::{
    decode, decode_shared, encode, encode_to_vec, AppCounters, DecodeError, DeviceCounts,
    DeviceKind, DropReason, FrameReader, GpuInfo, ModelAvailability, ModelInfo, ModelStateItem,
    Msg, Outcome, PlanStatus, PlanTask, RegionInfo, Role, StepLatency, SubmitTask, TaskResult,
    TaskStatus, WireProfile, MAX_FRAME, MAX_ITEMS, MAX_STR, PROTOCOL_VERSION,
};
use fermata::wire::{Dur, GpuId, ModelId, PlanId, TaskId, Time};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::Union;

// ---------------------------------------------------------------------------------
// The largest single allocation made by this thread, to show that hostile lengths are
// refused before anything is allocated for them.

struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|m| m.set(m.get().max(layout.size())));
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LARGEST.try_with(|m| m.set(m.get().max(new_size)));
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// `f()` and the largest allocation it made on this thread.
fn largest_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|m| m.set(0));
    let r = f();
    (r, LARGEST.with(|m| m.get()))
}

// ---------------------------------------------------------------------------------
// Strategies

fn arb_str() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => vec(any::<char>(), 0..24).prop_map(String::from_iter),
        2 => Just(String::new()),
        1 => (0..=MAX_STR).prop_map(|n| "x".repeat(n)),
        // Exactly MAX_STR bytes of two-byte characters.
        1 => Just("é".repeat(MAX_STR / 2)),
    ]
}

fn arb_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => vec(any::<u8>(), 0..64),
        2 => Just(Vec::new()),
        1 => (0usize..300_000, any::<u8>()).prop_map(|(n, b)| vec![b; n]),
    ]
}

/// Mostly short vectors, sometimes empty, sometimes a few hundred items.
fn arb_vec<T: std::fmt::Debug + Clone + 'static>(
    item: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = Vec<T>> {
    let item = item.boxed();
    prop_oneof![
        8 => vec(item.clone(), 0..6),
        2 => Just(Vec::new()),
        1 => vec(item, 0..300),
    ]
}

fn arb_role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Backend), Just(Role::Frontend)]
}

fn arb_drop_reason() -> impl Strategy<Value = DropReason> {
    prop::sample::select(DropReason::ALL.to_vec())
}

fn arb_plan_status() -> impl Strategy<Value = PlanStatus> {
    prop_oneof![
        Just(PlanStatus::Ran),
        Just(PlanStatus::TooLate),
        Just(PlanStatus::Failed)
    ]
}

fn arb_task_status() -> impl Strategy<Value = TaskStatus> {
    prop_oneof![
        Just(TaskStatus::Ok),
        arb_drop_reason().prop_map(TaskStatus::Dropped),
        Just(TaskStatus::InputMissing),
        Just(TaskStatus::Failed),
    ]
}

fn arb_reply_status() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::Good),
        Just(Outcome::Late),
        Just(Outcome::Dropped),
        Just(Outcome::Failed),
    ]
}

fn arb_profile() -> impl Strategy<Value = WireProfile> {
    prop_oneof![
        (any::<i64>(), any::<i64>(), any::<u32>()).prop_map(|(alpha_ns, beta_ns, max_batch)| {
            WireProfile::Linear {
                alpha_ns,
                beta_ns,
                max_batch,
            }
        }),
        arb_vec(any::<i64>()).prop_map(|lat_ns| WireProfile::Table { lat_ns }),
    ]
}

fn arb_model() -> impl Strategy<Value = ModelInfo> {
    (
        any::<u32>(),
        arb_str(),
        any::<i64>(),
        arb_profile(),
        any::<u32>(),
        arb_str(),
    )
        .prop_map(
            |(id, name, slo_ns, profile, input_bytes, meta_json)| ModelInfo {
                id: ModelId(id),
                name,
                slo: Dur(slo_ns),
                profile,
                input_bytes,
                meta_json,
            },
        )
}

fn arb_region() -> impl Strategy<Value = RegionInfo> {
    (
        arb_str(),
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(|(addr, region, len, rkey, base)| RegionInfo {
            addr,
            region,
            len,
            rkey,
            base,
        })
}

fn arb_gpu() -> impl Strategy<Value = GpuInfo> {
    (
        any::<u32>(),
        arb_str(),
        any::<u64>(),
        0usize..3,
        any::<u32>(),
    )
        .prop_map(|(local, name, mem_bytes, d, lanes)| GpuInfo {
            local,
            name,
            mem_bytes,
            device: [DeviceKind::Gpu, DeviceKind::Cpu, DeviceKind::Emulated][d],
            lanes,
        })
}

fn arb_submit_task() -> impl Strategy<Value = SubmitTask> {
    (
        any::<u64>(),
        any::<u32>(),
        any::<i64>(),
        any::<i64>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(id, model, arrival_ns, deadline_ns, input, cap)| SubmitTask {
                id: TaskId(id),
                model: ModelId(model),
                arrival: Time(arrival_ns),
                deadline: Time(deadline_ns),
                input,
                cap,
            },
        )
}

fn arb_plan_task() -> impl Strategy<Value = PlanTask> {
    (any::<u64>(), any::<i64>(), any::<u64>(), any::<u64>()).prop_map(
        |(id, deadline_ns, input, cap)| PlanTask {
            id: TaskId(id),
            deadline: Time(deadline_ns),
            input,
            cap,
        },
    )
}

fn arb_task_result() -> impl Strategy<Value = TaskResult> {
    (
        any::<u64>(),
        arb_task_status(),
        (any::<i64>(), any::<i64>(), any::<u32>()),
        prop_oneof![4 => vec(any::<u8>(), 0..32), 1 => Just(Vec::new())],
        any::<u64>(),
    )
        .prop_map(
            |(id, status, (started_ns, finished_ns, batch_size), output, cap)| TaskResult {
                id: TaskId(id),
                status,
                started: Time(started_ns),
                finished: Time(finished_ns),
                batch_size,
                output,
                cap,
            },
        )
}

/// Every variant of `Msg`, with arbitrary fields.
fn arb_msg() -> impl Strategy<Value = Msg> {
    let arms: Vec<BoxedStrategy<Msg>> = vec![
        (
            arb_role(),
            arb_str(),
            arb_vec(arb_gpu()),
            arb_str(),
            prop::option::of(arb_region()),
        )
            .prop_map(|(role, name, gpus, ctrl_addr, region)| Msg::Register {
                role,
                name,
                gpus,
                ctrl_addr,
                region,
            })
            .boxed(),
        (
            any::<u32>(),
            prop_oneof![
                8 => arb_vec(any::<u32>()),
                1 => (0..=MAX_ITEMS as u32).prop_map(|n| (0..n).collect::<Vec<u32>>()),
            ],
            arb_vec(arb_model()),
            any::<u32>(),
            any::<u64>(),
        )
            .prop_map(
                |(node, gpu_ids, models, heartbeat_ms, term)| Msg::RegisterAck {
                    node,
                    gpu_ids: gpu_ids.into_iter().map(GpuId).collect(),
                    models,
                    heartbeat_ms,
                    term,
                },
            )
            .boxed(),
        arb_str()
            .prop_map(|reason| Msg::Unregister { reason })
            .boxed(),
        arb_model()
            .prop_map(|model| Msg::LoadModel { model })
            .boxed(),
        any::<u32>()
            .prop_map(|model| Msg::UnloadModel {
                model: ModelId(model),
            })
            .boxed(),
        (any::<u32>(), any::<bool>(), arb_str(), any::<u64>())
            .prop_map(|(model, ok, error, device_bytes)| Msg::ModelLoaded {
                model: ModelId(model),
                ok,
                error,
                device_bytes,
            })
            .boxed(),
        (any::<u32>(), arb_str(), arb_region())
            .prop_map(|(node, ctrl_addr, region)| Msg::FrontendUp {
                node,
                ctrl_addr,
                region,
            })
            .boxed(),
        any::<u32>()
            .prop_map(|node| Msg::FrontendDown { node })
            .boxed(),
        arb_vec(arb_submit_task())
            .prop_map(|tasks| Msg::Submit { tasks })
            .boxed(),
        (
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            (any::<i64>(), any::<i64>(), any::<i64>()),
            arb_vec(arb_plan_task()),
        )
            .prop_map(
                |(id, model, gpu, (exec_at_ns, finish_at_ns, sent_ns), tasks)| Msg::Plan {
                    id: PlanId(id),
                    model: ModelId(model),
                    gpu: GpuId(gpu),
                    exec_at: Time(exec_at_ns),
                    finish_at: Time(finish_at_ns),
                    sent: Time(sent_ns),
                    tasks,
                },
            )
            .boxed(),
        (
            any::<u64>(),
            any::<u32>(),
            arb_plan_status(),
            any::<i64>(),
            any::<i64>(),
            any::<u32>(),
        )
            .prop_map(
                |(id, gpu, status, started_ns, finished_ns, missing)| Msg::PlanDone {
                    id: PlanId(id),
                    gpu: GpuId(gpu),
                    status,
                    started: Time(started_ns),
                    finished: Time(finished_ns),
                    missing,
                },
            )
            .boxed(),
        arb_vec(arb_task_result())
            .prop_map(|items| Msg::Results { items })
            .boxed(),
        arb_vec((any::<u64>().prop_map(TaskId), arb_drop_reason()))
            .prop_map(|items| Msg::Dropped { items })
            .boxed(),
        (
            any::<u64>(),
            any::<i64>(),
            any::<i64>(),
            any::<i64>(),
            any::<i64>(),
            any::<u64>(),
        )
            .prop_map(
                |(seq, sent_ns, ctrl_delay_ns, pull_ns, per_mib_ns, term)| Msg::Ping {
                    seq,
                    sent: Time(sent_ns),
                    ctrl_delay: Dur(ctrl_delay_ns),
                    pull: Dur(pull_ns),
                    pull_per_mib: Dur(per_mib_ns),
                    pull_hold: Dur(pull_ns.wrapping_add(per_mib_ns)),
                    pull_hold_per_mib: Dur(per_mib_ns.rotate_left(7)),
                    term,
                },
            )
            .boxed(),
        (any::<u64>(), any::<i64>(), any::<i64>(), any::<u64>())
            .prop_map(|(seq, echo_ns, sched_ns, term)| Msg::Pong {
                seq,
                echo: Time(echo_ns),
                sched: Time(sched_ns),
                term,
            })
            .boxed(),
        (any::<u64>(), arb_str(), any::<i64>(), arb_bytes())
            .prop_map(|(req, model, slo_ns, input)| Msg::Infer {
                req,
                model,
                slo: Dur(slo_ns),
                input: input.into(),
            })
            .boxed(),
        (
            any::<u64>(),
            arb_reply_status(),
            (any::<i64>(), any::<i64>(), any::<u32>()),
            arb_bytes(),
            arb_str(),
        )
            .prop_map(
                |(req, status, (latency_ns, queue_ns, batch_size), output, message)| {
                    Msg::InferReply {
                        req,
                        status,
                        latency: Dur(latency_ns),
                        queue: Dur(queue_ns),
                        batch_size,
                        output,
                        message,
                    }
                },
            )
            .boxed(),
        Just(Msg::ListModels).boxed(),
        arb_vec(arb_model())
            .prop_map(|models| Msg::Models { models })
            .boxed(),
        arb_str().prop_map(|message| Msg::Error { message }).boxed(),
        any::<u32>().prop_map(|gpus| Msg::Capacity { gpus }).boxed(),
        arb_vec((any::<u32>(), any::<i64>()))
            .prop_map(|v| Msg::Margins {
                items: v.into_iter().map(|(m, d)| (ModelId(m), Dur(d))).collect(),
            })
            .boxed(),
        arb_str().prop_map(|reason| Msg::Drain { reason }).boxed(),
        Just(Msg::Drained).boxed(),
        Just(Msg::Follow).boxed(),
        arb_vec(any::<u32>())
            .prop_map(|homes| Msg::Assignment { homes })
            .boxed(),
        any::<u64>().prop_map(|term| Msg::Fence { term }).boxed(),
        (any::<u32>(), any::<bool>())
            .prop_map(|(m, load)| Msg::ModelControl {
                model: ModelId(m),
                load,
            })
            .boxed(),
        arb_vec((any::<u32>(), 0u8..4, arb_str(), any::<[u32; 3]>()))
            .prop_map(|v| Msg::ModelStates {
                items: v
                    .into_iter()
                    .map(|(m, s, reason, [gpu, cpu, emulated])| ModelStateItem {
                        model: ModelId(m),
                        state: [
                            ModelAvailability::Unavailable,
                            ModelAvailability::Loading,
                            ModelAvailability::Ready,
                            ModelAvailability::Unloading,
                        ][s as usize],
                        reason,
                        devices: DeviceCounts { gpu, cpu, emulated },
                    })
                    .collect(),
            })
            .boxed(),
        arb_app_counters()
            .prop_map(|counters| Msg::AppCounts { counters })
            .boxed(),
        (arb_app_counters(), any::<u32>())
            .prop_map(|(counters, frontends)| Msg::AppTotals {
                counters,
                frontends,
            })
            .boxed(),
        arb_vec(any::<u32>())
            .prop_map(|ppm| Msg::LatencyScales { ppm })
            .boxed(),
    ];
    assert_eq!(arms.len(), 32, "one arm per variant");
    Union::new(arms)
}

fn arb_app_counters() -> impl Strategy<Value = AppCounters> {
    (
        arb_str(),
        arb_vec((any::<u64>(), any::<u64>())),
        arb_vec(any::<[u64; 3]>()),
        any::<u64>(),
    )
        .prop_map(|(app, fanout, latency, requests)| AppCounters {
            app,
            fanout,
            latency: latency
                .into_iter()
                .map(|[observed_ns, profiled_ns, samples]| StepLatency {
                    observed_ns,
                    profiled_ns,
                    samples,
                })
                .collect(),
            requests,
        })
}

// ---------------------------------------------------------------------------------
// Helpers

fn body(frame: &[u8]) -> &[u8] {
    let len = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize;
    assert_eq!(len, frame.len() - 4, "length prefix");
    &frame[4..]
}

/// A frame body: the current version, `tag`, then `rest`.
fn raw(tag: u8, rest: &[u8]) -> Vec<u8> {
    let mut b = PROTOCOL_VERSION.to_le_bytes().to_vec();
    b.push(tag);
    b.extend_from_slice(rest);
    b
}

/// Cut points to try in a body of `len` bytes: all of them for small bodies, an even
/// sample plus the last few for large ones.
fn cuts(len: usize) -> Vec<usize> {
    if len <= 4096 {
        return (0..len).collect();
    }
    let mut v: Vec<usize> = (0..len).step_by(len / 512).collect();
    v.extend(len - 64..len);
    v
}

/// Feeds `stream` in `chunks` and decodes every frame.
fn read_all(stream: &[u8], chunks: impl IntoIterator<Item = usize>) -> Vec<Msg> {
    let mut r = FrameReader::new();
    let mut got = Vec::new();
    let mut rest = stream;
    for n in chunks {
        if rest.is_empty() {
            break;
        }
        let (c, tail) = rest.split_at(n.clamp(1, rest.len()));
        rest = tail;
        r.feed(c);
        while let Some(m) = r.next_msg() {
            got.push(m.expect("valid stream"));
        }
    }
    // Whatever the chunk list left over, in one piece.
    r.feed(rest);
    while let Some(m) = r.next_msg() {
        got.push(m.expect("valid stream"));
    }
    assert_eq!(r.buffered(), 0, "nothing left over");
    got
}

fn too_large(what: &'static str, len: usize, max: usize) -> Result<Msg, DecodeError> {
    Err(DecodeError::TooLarge { what, len, max })
}

// ---------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn round_trip(msg in arb_msg()) {
        let frame = encode_to_vec(&msg);
        prop_assert_eq!(frame.len(), frame_len(&msg));
        prop_assert_eq!(decode(body(&frame)), Ok(msg.clone()));
        // Decoded with its large byte fields as views: the same message.
        let shared = bytes::Bytes::copy_from_slice(body(&frame));
        prop_assert_eq!(decode_shared(&shared), Ok(msg.clone()));
        // Appending to a buffer writes the same bytes after what is there.
        let mut out = b"xyz".to_vec();
        encode(&msg, &mut out);
        prop_assert_eq!(&out[3..], &frame[..]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn every_prefix_is_truncated(msg in arb_msg()) {
        let frame = encode_to_vec(&msg);
        let body = body(&frame);
        for n in cuts(body.len()) {
            match decode(&body[..n]) {
                Err(DecodeError::Truncated { need, have, .. }) => prop_assert!(need > have),
                other => prop_assert!(false, "{} cut at {}: {:?}", msg.kind(), n, other),
            }
            let cut = bytes::Bytes::copy_from_slice(&body[..n]);
            prop_assert!(
                matches!(decode_shared(&cut), Err(DecodeError::Truncated { .. })),
                "{} cut at {} decoded shared", msg.kind(), n
            );
        }
        // A FrameReader waits for the rest of a cut frame.
        for n in cuts(frame.len()) {
            let mut r = FrameReader::new();
            r.feed(&frame[..n]);
            prop_assert!(r.next_msg().is_none(), "cut at {}", n);
            r.feed(&frame[n..]);
            prop_assert_eq!(r.next_msg(), Some(Ok(msg.clone())));
        }
    }

    #[test]
    fn wrong_version_is_refused(msg in arb_msg(), version in any::<u16>()) {
        prop_assume!(version != PROTOCOL_VERSION);
        let mut frame = encode_to_vec(&msg);
        frame[4..6].copy_from_slice(&version.to_le_bytes());
        prop_assert_eq!(
            decode(&frame[4..]),
            Err(DecodeError::Version { got: version, want: PROTOCOL_VERSION })
        );
    }

    #[test]
    fn trailing_bytes_are_refused(msg in arb_msg(), extra in vec(any::<u8>(), 1..64)) {
        let frame = encode_to_vec(&msg);
        let mut body = body(&frame).to_vec();
        body.extend_from_slice(&extra);
        match decode(&body) {
            Err(DecodeError::Invalid(why)) => prop_assert!(why.contains("trailing"), "{}", why),
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn unknown_message_tag(tag in prop_oneof![Just(0u8), 33u8..=255], rest in vec(any::<u8>(), 0..64)) {
        prop_assert_eq!(decode(&raw(tag, &rest)), Err(DecodeError::BadTag { what: "message", tag }));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Random bytes: no panic, no allocation beyond a few times the input, and what
    /// is accepted is exactly the encoding of what it decodes to.
    #[test]
    fn garbage_never_panics(bytes in vec(any::<u8>(), 0..512)) {
        check_garbage(&bytes)?;
    }

    /// Random bytes behind a valid header, to get past the version and tag.
    #[test]
    fn garbage_after_a_valid_header(tag in 1u8..=20, rest in vec(any::<u8>(), 0..512)) {
        check_garbage(&raw(tag, &rest))?;
    }

    /// Valid frames with a few bytes overwritten.
    #[test]
    fn mutated_frames(
        msg in arb_msg(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let frame = encode_to_vec(&msg);
        let mut body = body(&frame).to_vec();
        for (at, b) in edits {
            let i = at.index(body.len());
            body[i] = b;
        }
        check_garbage(&body)?;
    }

    /// A stream of garbage through a FrameReader: no panic, and once it fails it
    /// stays failed.
    #[test]
    fn garbage_stream(bytes in vec(any::<u8>(), 0..2048), chunk in 1usize..64) {
        let mut r = FrameReader::new();
        let mut failed: Option<DecodeError> = None;
        for c in bytes.chunks(chunk) {
            r.feed(c);
            while let Some(m) = r.next_msg() {
                match (m, &failed) {
                    (Err(e), None) => { failed = Some(e); break; }
                    (Err(e), Some(f)) => { prop_assert_eq!(&e, f); break; }
                    (Ok(_), None) => {}
                    (Ok(m), Some(f)) => prop_assert!(false, "{:?} after {:?}", m, f),
                }
            }
        }
    }
}

fn check_garbage(body: &[u8]) -> Result<(), TestCaseError> {
    let (res, largest) = largest_alloc(|| decode(body));
    prop_assert!(
        largest <= 4 * body.len() + 4096,
        "{} bytes allocated for a {}-byte body",
        largest,
        body.len()
    );
    if let Ok(msg) = res {
        // Decoding is canonical: an accepted body is the encoding of its message.
        prop_assert_eq!(&encode_to_vec(&msg)[4..], body);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn frame_reader_random_chunks(
        msgs in vec(arb_msg(), 1..8),
        chunks in vec(1usize..5000, 0..64),
    ) {
        let mut stream = Vec::new();
        for m in &msgs {
            encode(m, &mut stream);
        }
        prop_assert_eq!(&read_all(&stream, chunks), &msgs);
    }
}

// ---------------------------------------------------------------------------------
// Fixed cases

/// Small messages of several kinds, back to back.
fn some_msgs() -> Vec<Msg> {
    vec![
        Msg::Ping {
            seq: 1,
            sent: Time(2),
            ctrl_delay: Dur(3),
            pull: Dur(4),
            pull_per_mib: Dur(5),
            pull_hold: Dur(7),
            pull_hold_per_mib: Dur(8),
            term: 6,
        },
        Msg::ListModels,
        Msg::Submit {
            tasks: vec![
                SubmitTask {
                    id: TaskId(1),
                    model: ModelId(2),
                    arrival: Time(3),
                    deadline: Time(4),
                    input: 5,
                    cap: 6,
                };
                10
            ],
        },
        Msg::Error {
            message: "é".repeat(100),
        },
        Msg::Infer {
            req: 9,
            model: "m".into(),
            slo: Dur::ZERO,
            input: (0..=255u8).collect::<Vec<u8>>().into(),
        },
        Msg::ListModels,
    ]
}

#[test]
fn frame_reader_one_byte_at_a_time() {
    let msgs = some_msgs();
    let mut stream = Vec::new();
    for m in &msgs {
        encode(m, &mut stream);
    }
    assert_eq!(read_all(&stream, std::iter::repeat(1)), msgs);
    // Everything at once.
    assert_eq!(read_all(&stream, [stream.len()]), msgs);
}

#[test]
fn frame_reader_refuses_a_huge_length_before_buffering() {
    for len in [MAX_FRAME + 1, u32::MAX as usize] {
        let mut r = FrameReader::new();
        r.feed(&encode_to_vec(&Msg::ListModels));
        r.feed(&(len as u32).to_le_bytes());
        assert_eq!(r.next_msg(), Some(Ok(Msg::ListModels)));
        let (m, largest) = largest_alloc(|| r.next_msg());
        assert_eq!(m, Some(too_large("frame", len, MAX_FRAME)));
        assert!(largest < 4096, "{largest} bytes allocated");
        // The rest of the stream is ignored; the error stays.
        r.feed(&[0; 100]);
        assert_eq!(r.next_msg(), Some(too_large("frame", len, MAX_FRAME)));
        assert_eq!(r.buffered(), 0);
    }
    // MAX_FRAME itself is fine: the reader waits for it, buffering only what came.
    let mut r = FrameReader::new();
    let (m, largest) = largest_alloc(|| {
        r.feed(&(MAX_FRAME as u32).to_le_bytes());
        r.feed(&[2, 0, 16]);
        r.next_msg()
    });
    assert_eq!(m, None);
    assert!(largest < 4096, "{largest} bytes allocated");
    assert_eq!(r.buffered(), 7);
}

#[test]
fn decode_refuses_a_body_over_max_frame() {
    let body = vec![0u8; MAX_FRAME + 1];
    assert_eq!(decode(&body), too_large("frame", MAX_FRAME + 1, MAX_FRAME));
}

#[test]
fn the_largest_frame_decodes() {
    // An Infer whose body is exactly MAX_FRAME bytes.
    let fixed = 3 + 8 + 4 + 8 + 4; // header, req, model "", slo_ns, input length
    let msg = Msg::Infer {
        req: 1,
        model: String::new(),
        slo: Dur::ZERO,
        input: vec![7; MAX_FRAME - fixed].into(),
    };
    let frame = encode_to_vec(&msg);
    assert_eq!(frame.len(), 4 + MAX_FRAME);
    let mut r = FrameReader::new();
    for c in frame.chunks(1 << 20) {
        r.feed(c);
    }
    assert_eq!(r.next_msg(), Some(Ok(msg)));
}

#[test]
fn strings_over_max_str() {
    let long = || "x".repeat(MAX_STR + 1);
    let region = |addr: String| RegionInfo {
        addr,
        region: 0,
        len: 0,
        rkey: 0,
        base: 0,
    };
    let model = |name: String| ModelInfo {
        id: ModelId(0),
        name,
        slo: Dur::ZERO,
        profile: WireProfile::Table { lat_ns: vec![] },
        input_bytes: 0,
        meta_json: String::new(),
    };
    let cases: Vec<(Msg, &str)> = vec![
        (
            Msg::Register {
                role: Role::Frontend,
                name: long(),
                gpus: vec![],
                ctrl_addr: String::new(),
                region: None,
            },
            "Register.name",
        ),
        (
            Msg::Register {
                role: Role::Backend,
                name: String::new(),
                gpus: vec![GpuInfo {
                    local: 0,
                    name: long(),
                    mem_bytes: 0,
                    device: fermata::wire::DeviceKind::Emulated,
                    lanes: 1,
                }],
                ctrl_addr: String::new(),
                region: None,
            },
            "GpuInfo.name",
        ),
        (
            Msg::Register {
                role: Role::Frontend,
                name: String::new(),
                gpus: vec![],
                ctrl_addr: long(),
                region: None,
            },
            "Register.ctrl_addr",
        ),
        (
            Msg::Register {
                role: Role::Frontend,
                name: String::new(),
                gpus: vec![],
                ctrl_addr: String::new(),
                region: Some(region(long())),
            },
            "RegionInfo.addr",
        ),
        (Msg::Unregister { reason: long() }, "Unregister.reason"),
        (
            Msg::LoadModel {
                model: model(long()),
            },
            "ModelInfo.name",
        ),
        (
            Msg::ModelLoaded {
                model: ModelId(0),
                ok: false,
                error: long(),
                device_bytes: 0,
            },
            "ModelLoaded.error",
        ),
        (
            Msg::FrontendUp {
                node: 0,
                ctrl_addr: long(),
                region: region(String::new()),
            },
            "FrontendUp.ctrl_addr",
        ),
        (
            Msg::Infer {
                req: 0,
                model: long(),
                slo: Dur::ZERO,
                input: Default::default(),
            },
            "Infer.model",
        ),
        (
            Msg::InferReply {
                req: 0,
                status: Outcome::Failed,
                latency: Dur::ZERO,
                queue: Dur::ZERO,
                batch_size: 0,
                output: vec![],
                message: long(),
            },
            "InferReply.message",
        ),
        (Msg::Error { message: long() }, "Error.message"),
    ];
    for (msg, field) in cases {
        let frame = encode_to_vec(&msg);
        assert_eq!(
            decode(body(&frame)),
            too_large(field, MAX_STR + 1, MAX_STR),
            "{}",
            msg.kind()
        );
    }
}

#[test]
fn counts_over_max_items() {
    // Encoded with MAX_ITEMS + 1 items (the encoder does not check).
    let msg = Msg::RegisterAck {
        node: 1,
        gpu_ids: vec![GpuId(0); MAX_ITEMS + 1],
        models: vec![],
        heartbeat_ms: 0,
        term: 0,
    };
    assert_eq!(
        decode(body(&encode_to_vec(&msg))),
        too_large("RegisterAck.gpu_ids", MAX_ITEMS + 1, MAX_ITEMS)
    );
    let msg = Msg::Dropped {
        items: vec![(TaskId(0), DropReason::Shutdown); MAX_ITEMS + 1],
    };
    assert_eq!(
        decode(body(&encode_to_vec(&msg))),
        too_large("Dropped.items", MAX_ITEMS + 1, MAX_ITEMS)
    );
}

/// Every vector, string and byte field with a length of u32::MAX and nothing after
/// it: refused as too large, without allocating.
#[test]
fn hostile_lengths_do_not_allocate() {
    // The counter sees allocations.
    let (v, largest) = largest_alloc(|| vec![1u8; 10_000]);
    assert!(largest >= v.len());
    const HUGE: [u8; 4] = [0xFF; 4];
    let huge = u32::MAX as usize;
    let at_end = |msg: Msg| {
        // `msg` ends with an empty vector or string: point its length at u32::MAX.
        let mut frame = encode_to_vec(&msg);
        let n = frame.len();
        assert_eq!(frame[n - 4..], [0; 4], "{}", msg.kind());
        frame[n - 4..].copy_from_slice(&HUGE);
        frame[4..].to_vec()
    };
    let model = ModelInfo {
        id: ModelId(0),
        name: String::new(),
        slo: Dur::ZERO,
        profile: WireProfile::Table { lat_ns: vec![] },
        input_bytes: 0,
        meta_json: String::new(),
    };
    let cases: Vec<(Vec<u8>, &str, usize)> = vec![
        (
            at_end(Msg::Submit { tasks: vec![] }),
            "Submit.tasks",
            MAX_ITEMS,
        ),
        (
            at_end(Msg::Plan {
                id: PlanId(0),
                model: ModelId(0),
                gpu: GpuId(0),
                exec_at: Time(0),
                finish_at: Time(0),
                sent: Time(0),
                tasks: vec![],
            }),
            "Plan.tasks",
            MAX_ITEMS,
        ),
        (
            at_end(Msg::Results { items: vec![] }),
            "Results.items",
            MAX_ITEMS,
        ),
        (
            at_end(Msg::Dropped { items: vec![] }),
            "Dropped.items",
            MAX_ITEMS,
        ),
        (
            at_end(Msg::Models { models: vec![] }),
            "Models.models",
            MAX_ITEMS,
        ),
        (
            at_end(Msg::Error {
                message: String::new(),
            }),
            "Error.message",
            MAX_STR,
        ),
        (
            at_end(Msg::Infer {
                req: 0,
                model: String::new(),
                slo: Dur::ZERO,
                input: Default::default(),
            }),
            "Infer.input",
            MAX_FRAME,
        ),
        (
            {
                let mut b = at_end(Msg::Results {
                    items: vec![TaskResult {
                        id: TaskId(0),
                        status: TaskStatus::Ok,
                        started: Time(0),
                        finished: Time(0),
                        batch_size: 0,
                        output: vec![],
                        cap: 0,
                    }],
                });
                // The output's length comes before the capability's 8 bytes.
                let n = b.len();
                b[n - 12..n - 8].copy_from_slice(&HUGE);
                b
            },
            "TaskResult.output",
            MAX_FRAME,
        ),
        // Register: role, name "", then the GPU count.
        (
            raw(1, &[0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]),
            "Register.gpus",
            MAX_ITEMS,
        ),
        // RegisterAck: node, then the GPU id count.
        (
            raw(2, &[0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]),
            "RegisterAck.gpu_ids",
            MAX_ITEMS,
        ),
        (
            {
                // RegisterAck: node, no GPU ids, then the model count.
                raw(2, &[0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF])
            },
            "RegisterAck.models",
            MAX_ITEMS,
        ),
        (
            {
                let mut b = at_end(Msg::LoadModel {
                    model: model.clone(),
                });
                // The Table's lat_ns count comes before input_bytes and meta_json:
                // end the frame there.
                b.truncate(b.len() - 8);
                let n = b.len();
                b[n - 4..].copy_from_slice(&HUGE);
                b
            },
            "WireProfile.lat_ns",
            MAX_ITEMS,
        ),
        (
            at_end(Msg::LoadModel {
                model: model.clone(),
            }),
            "ModelInfo.meta_json",
            MAX_STR,
        ),
    ];
    for (body, field, max) in cases {
        let (res, largest) = largest_alloc(|| decode(&body));
        assert_eq!(res, too_large(field, huge, max));
        assert!(largest < 4096, "{field}: {largest} bytes allocated");
    }
    // Within the limits but past the end of the frame: truncated, still no allocation.
    let mut body = raw(9, &(MAX_ITEMS as u32).to_le_bytes());
    body.extend_from_slice(&[0; 100]);
    let (res, largest) = largest_alloc(|| decode(&body));
    assert!(
        matches!(
            res,
            Err(DecodeError::Truncated {
                field: "Submit.tasks",
                ..
            })
        ),
        "{res:?}"
    );
    assert!(largest < 4096, "{largest} bytes allocated");
}

#[test]
fn unknown_enum_tags() {
    // ModelLoaded.ok is a bool: only 0 and 1.
    assert_eq!(
        decode(&raw(6, &[0, 0, 0, 0, 2, 0, 0, 0, 0])),
        Err(DecodeError::BadTag {
            what: "ModelLoaded.ok",
            tag: 2
        })
    );
    // PlanDone.status: id, gpu, then the status.
    let mut b = raw(11, &[0; 12]);
    b.push(3);
    b.extend_from_slice(&[0; 20]);
    assert_eq!(
        decode(&b),
        Err(DecodeError::BadTag {
            what: "PlanDone.status",
            tag: 3
        })
    );
    // Register.region: Option tag 2.
    let mut b = raw(1, &[1]);
    b.extend_from_slice(&[0; 12]);
    b.push(2);
    assert_eq!(
        decode(&b),
        Err(DecodeError::BadTag {
            what: "Register.region",
            tag: 2
        })
    );
    // TaskStatus 4, and Dropped with DropReason 10.
    for (status, code, tag) in [(4u8, None, 4u8), (1, Some(10u8), 10)] {
        let mut b = raw(12, &[1, 0, 0, 0]);
        b.extend_from_slice(&[0; 8]);
        b.push(status);
        b.extend(code);
        b.extend_from_slice(&[0; 32]);
        assert_eq!(
            decode(&b),
            Err(DecodeError::BadTag {
                what: "TaskResult.status",
                tag
            })
        );
    }
    // WireProfile 2.
    let mut b = raw(4, &[0; 4 + 4 + 8]);
    b.push(2);
    assert_eq!(
        decode(&b),
        Err(DecodeError::BadTag {
            what: "ModelInfo.profile",
            tag: 2
        })
    );
    // InferReply.status 4.
    let mut b = raw(17, &[0; 8]);
    b.push(4);
    assert_eq!(
        decode(&b),
        Err(DecodeError::BadTag {
            what: "InferReply.status",
            tag: 4
        })
    );
}

#[test]
fn errors_read_well() {
    let e = decode(&raw(9, &[2, 0, 0, 0, 1, 2, 3])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "frame truncated at field `Submit.tasks`: needs 88 bytes, only 3 left"
    );
    let e = decode(&raw(3, &[0xFF, 0xFF, 0x01, 0])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "`Unregister.reason` too large: length 131071 exceeds the limit of 65536"
    );
    let e = decode(&[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "frame truncated at field `version`: needs 2 bytes, only 0 left"
    );
}
