//! Binary encoding of [`Msg`] (the layout is described in [`super`]).
//!
//! Encoding computes the exact frame size first, reserves it once, then writes every
//! field in place: no allocation per field. It does not check the limits
//! ([`MAX_FRAME`], [`MAX_STR`], [`MAX_ITEMS`]); a peer refuses a frame that exceeds
//! them, so senders keep their messages within them.
//!
//! Decoding checks every length against its limit and then against the bytes left in
//! the frame (a vector's count times the smallest encoding of one item) before it
//! allocates anything, so a corrupt or hostile frame costs one [`DecodeError`], never
//! a panic or a large allocation.

use super::{
    AppCounters, DeviceCounts, DeviceKind, DropReason, Dur, GpuId, GpuInfo, ModelAvailability,
    ModelId, ModelInfo, ModelStateItem, Msg, Outcome, PlanId, PlanStatus, PlanTask, RegionInfo,
    Role, StepLatency, SubmitTask, TaskId, TaskResult, TaskStatus, Time, WireProfile, MAX_FRAME,
    MAX_ITEMS, MAX_STR, PROTOCOL_VERSION,
};

/// Bytes of the length prefix in front of every frame body.
pub const LEN_PREFIX: usize = 4;
/// Bytes of the body header: u16 version + u8 message tag.
const HEADER: usize = 3;

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The frame ended inside a field: `field` needs `need` bytes, `have` are left.
    Truncated {
        field: &'static str,
        need: usize,
        have: usize,
    },
    /// A length field exceeds its limit (`what`: the field, or "frame").
    TooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
    /// Another protocol version.
    Version { got: u16, want: u16 },
    /// Unknown message tag or enum value (`what`: "message" or the field).
    BadTag { what: &'static str, tag: u8 },
    /// Invalid content (bad UTF-8, trailing bytes...).
    Invalid(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated { field, need, have } => write!(
                f,
                "frame truncated at field `{field}`: needs {need} bytes, only {have} left"
            ),
            DecodeError::TooLarge { what, len, max } => write!(
                f,
                "`{what}` too large: length {len} exceeds the limit of {max}"
            ),
            DecodeError::Version { got, want } => write!(
                f,
                "protocol version {got} not supported (this build speaks version {want})"
            ),
            DecodeError::BadTag { what, tag } => write!(f, "unknown tag {tag} for `{what}`"),
            DecodeError::Invalid(why) => write!(f, "invalid frame: {why}"),
        }
    }
}
impl std::error::Error for DecodeError {}

// ---------------------------------------------------------------------------------
// Reading

/// A cursor over one frame body.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// The body as shared bytes (`buf` is all of it): byte fields of
    /// [`SHARE_FROM`] bytes and more are decoded as views of it.
    shared: Option<&'a bytes::Bytes>,
}

/// The size from which a byte field of a body decoded by [`decode_shared`]
/// is a view of the body rather than a copy (a view keeps the whole body
/// alive, so small fields are copied).
pub const SHARE_FROM: usize = 16 << 10;

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let have = self.left();
        if n > have {
            return Err(DecodeError::Truncated {
                field,
                need: n,
                have,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let s = self.take(N, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        self.array(field).map(u16::from_le_bytes)
    }

    /// A u32 length or count, checked against `max` and then against the bytes left
    /// (`n * min_item` must fit), before anything is allocated for it.
    fn len(
        &mut self,
        field: &'static str,
        max: usize,
        min_item: usize,
    ) -> Result<usize, DecodeError> {
        let n = u32::from_le_bytes(self.array(field)?) as usize;
        if n > max {
            return Err(DecodeError::TooLarge {
                what: field,
                len: n,
                max,
            });
        }
        let need = n.saturating_mul(min_item);
        let have = self.left();
        if need > have {
            return Err(DecodeError::Truncated { field, need, have });
        }
        Ok(n)
    }
}

// ---------------------------------------------------------------------------------
// Field encodings

/// A type with a wire encoding.
trait Wire: Sized {
    /// Fewest bytes one value takes (bounds a vector's count before allocating).
    const MIN: usize;
    /// Bytes this value takes.
    fn size(&self) -> usize;
    fn put(&self, out: &mut Vec<u8>);
    /// `field`: the field being read, for errors (structs name their own fields).
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError>;
}

/// A length as its u32 field. Lengths past u32 cannot be framed at all (and are far
/// past every limit), so this is a bug in the sender.
fn len32(n: usize) -> u32 {
    u32::try_from(n).expect("wire field longer than 4 GiB")
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            const MIN: usize = std::mem::size_of::<$t>();
            #[inline]
            fn size(&self) -> usize {
                <Self as Wire>::MIN
            }
            #[inline]
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
                r.array(field).map(<$t>::from_le_bytes)
            }
        }
    )*};
}
wire_int!(u32, u64, i64);

/// The typed ids and times: their integer.
macro_rules! wire_newtype {
    ($($t:ident($inner:ty)),*) => {$(
        impl Wire for $t {
            const MIN: usize = std::mem::size_of::<$inner>();
            #[inline]
            fn size(&self) -> usize {
                <Self as Wire>::MIN
            }
            #[inline]
            fn put(&self, out: &mut Vec<u8>) {
                self.0.put(out);
            }
            #[inline]
            fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
                <$inner>::get(r, field).map($t)
            }
        }
    )*};
}
wire_newtype!(
    TaskId(u64),
    PlanId(u64),
    ModelId(u32),
    GpuId(u32),
    Time(i64),
    Dur(i64)
);

impl Wire for bool {
    const MIN: usize = 1;
    fn size(&self) -> usize {
        1
    }
    fn put(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        match r.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(DecodeError::BadTag { what: field, tag }),
        }
    }
}

/// u32 byte length + UTF-8 bytes; at most [`MAX_STR`] bytes.
impl Wire for String {
    const MIN: usize = 4;
    fn size(&self) -> usize {
        4 + self.len()
    }
    fn put(&self, out: &mut Vec<u8>) {
        put_bytes(self.as_bytes(), out);
    }
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        let n = r.len(field, MAX_STR, 1)?;
        let bytes = r.take(n, field)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(DecodeError::Invalid(format!(
                "field `{field}` is not valid UTF-8 ({e})"
            ))),
        }
    }
}

/// Appends `b` as a u32 byte length and the bytes.
fn put_bytes(b: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&len32(b.len()).to_le_bytes());
    out.extend_from_slice(b);
}

/// u32 byte length + bytes; at most [`MAX_FRAME`] bytes (the frame bounds it anyway).
impl Wire for Vec<u8> {
    const MIN: usize = 4;
    fn size(&self) -> usize {
        4 + self.len()
    }
    fn put(&self, out: &mut Vec<u8>) {
        put_bytes(self, out);
    }
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        let n = r.len(field, MAX_FRAME, 1)?;
        Ok(r.take(n, field)?.to_vec())
    }
}

/// As `Vec<u8>`; decoded into a buffer of its own, or as a view of a shared
/// body ([`decode_shared`]) from [`SHARE_FROM`] bytes.
impl Wire for bytes::Bytes {
    const MIN: usize = 4;
    fn size(&self) -> usize {
        4 + self.len()
    }
    fn put(&self, out: &mut Vec<u8>) {
        put_bytes(self, out);
    }
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        let n = r.len(field, MAX_FRAME, 1)?;
        let at = r.pos;
        let b = r.take(n, field)?;
        Ok(match r.shared {
            Some(body) if n >= SHARE_FROM => body.slice(at..at + n),
            _ => bytes::Bytes::copy_from_slice(b),
        })
    }
}

/// u32 count + items; at most [`MAX_ITEMS`] items.
impl<T: Wire> Wire for Vec<T> {
    const MIN: usize = 4;
    fn size(&self) -> usize {
        4 + self.iter().map(Wire::size).sum::<usize>()
    }
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&len32(self.len()).to_le_bytes());
        for x in self {
            x.put(out);
        }
    }
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        // T::MIN >= 1 for every item type, so `n` items cannot outnumber the bytes left.
        let n = r.len(field, MAX_ITEMS, T::MIN.max(1))?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(T::get(r, field)?);
        }
        Ok(v)
    }
}

/// u8 0 (None) or 1 (Some) + the value.
impl<T: Wire> Wire for Option<T> {
    const MIN: usize = 1;
    fn size(&self) -> usize {
        1 + self.as_ref().map_or(0, Wire::size)
    }
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(x) => {
                out.push(1);
                x.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        match r.u8(field)? {
            0 => Ok(None),
            1 => T::get(r, field).map(Some),
            tag => Err(DecodeError::BadTag { what: field, tag }),
        }
    }
}

/// Fieldless enums: one u8 tag.
macro_rules! wire_enum {
    ($ty:ident { $($tag:literal => $var:ident),* $(,)? }) => {
        impl Wire for $ty {
            const MIN: usize = 1;
            fn size(&self) -> usize {
                1
            }
            fn put(&self, out: &mut Vec<u8>) {
                out.push(match self {
                    $($ty::$var => $tag,)*
                });
            }
            fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
                match r.u8(field)? {
                    $($tag => Ok($ty::$var),)*
                    tag => Err(DecodeError::BadTag { what: field, tag }),
                }
            }
        }
    };
}

wire_enum!(Role { 0 => Backend, 1 => Frontend });
wire_enum!(DeviceKind { 0 => Gpu, 1 => Cpu, 2 => Emulated });
wire_enum!(ModelAvailability {
    0 => Unavailable,
    1 => Loading,
    2 => Ready,
    3 => Unloading
});
wire_enum!(PlanStatus { 0 => Ran, 1 => TooLate, 2 => Failed });
wire_enum!(Outcome { 0 => Good, 1 => Late, 2 => Dropped, 3 => Failed });
wire_enum!(DropReason {
    0 => Expired,
    1 => EarlyDrop,
    2 => QueueFull,
    3 => ModelRemoved,
    4 => Overloaded,
    5 => Shutdown,
    6 => TooLate,
    7 => BackendLost,
    8 => UnknownModel,
    9 => NoGpu,
});

/// u8 tag (Ok 0, Dropped 1, InputMissing 2, Failed 3); Dropped adds its DropReason.
impl Wire for TaskStatus {
    const MIN: usize = 1;
    fn size(&self) -> usize {
        match self {
            TaskStatus::Dropped(_) => 2,
            _ => 1,
        }
    }
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            TaskStatus::Ok => out.push(0),
            TaskStatus::Dropped(code) => {
                out.push(1);
                code.put(out);
            }
            TaskStatus::InputMissing => out.push(2),
            TaskStatus::Failed => out.push(3),
        }
    }
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        match r.u8(field)? {
            0 => Ok(TaskStatus::Ok),
            1 => DropReason::get(r, field).map(TaskStatus::Dropped),
            2 => Ok(TaskStatus::InputMissing),
            3 => Ok(TaskStatus::Failed),
            tag => Err(DecodeError::BadTag { what: field, tag }),
        }
    }
}

/// u8 tag (Linear 0, Table 1) + the variant's fields.
impl Wire for WireProfile {
    const MIN: usize = 1 + 4;
    fn size(&self) -> usize {
        1 + match self {
            WireProfile::Linear {
                alpha_ns,
                beta_ns,
                max_batch,
            } => alpha_ns.size() + beta_ns.size() + max_batch.size(),
            WireProfile::Table { lat_ns } => lat_ns.size(),
        }
    }
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            WireProfile::Linear {
                alpha_ns,
                beta_ns,
                max_batch,
            } => {
                out.push(0);
                alpha_ns.put(out);
                beta_ns.put(out);
                max_batch.put(out);
            }
            WireProfile::Table { lat_ns } => {
                out.push(1);
                lat_ns.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        match r.u8(field)? {
            0 => Ok(WireProfile::Linear {
                alpha_ns: Wire::get(r, "WireProfile.alpha_ns")?,
                beta_ns: Wire::get(r, "WireProfile.beta_ns")?,
                max_batch: Wire::get(r, "WireProfile.max_batch")?,
            }),
            1 => Ok(WireProfile::Table {
                lat_ns: Wire::get(r, "WireProfile.lat_ns")?,
            }),
            tag => Err(DecodeError::BadTag { what: field, tag }),
        }
    }
}

/// Fields in declaration order (the destructuring makes a forgotten field a compile
/// error). Errors name the fields `Type.field`.
macro_rules! wire_struct {
    ($ty:ident { $($f:ident: $t:ty),* $(,)? }) => {
        impl Wire for $ty {
            const MIN: usize = 0 $(+ <$t as Wire>::MIN)*;
            fn size(&self) -> usize {
                let $ty { $($f),* } = self;
                0 $(+ $f.size())*
            }
            fn put(&self, out: &mut Vec<u8>) {
                let $ty { $($f),* } = self;
                $($f.put(out);)*
            }
            fn get(r: &mut Reader<'_>, _field: &'static str) -> Result<Self, DecodeError> {
                Ok($ty {
                    $($f: <$t as Wire>::get(r, concat!(stringify!($ty), ".", stringify!($f)))?,)*
                })
            }
        }
    };
}

wire_struct!(ModelStateItem {
    model: ModelId,
    state: ModelAvailability,
    reason: String,
    devices: DeviceCounts,
});
wire_struct!(AppCounters {
    app: String,
    fanout: Vec<(u64, u64)>,
    latency: Vec<StepLatency>,
    requests: u64,
});
wire_struct!(StepLatency {
    observed_ns: u64,
    profiled_ns: u64,
    samples: u64,
});
wire_struct!(DeviceCounts {
    gpu: u32,
    cpu: u32,
    emulated: u32,
});
wire_struct!(GpuInfo {
    local: u32,
    name: String,
    mem_bytes: u64,
    device: DeviceKind,
    lanes: u32,
});
wire_struct!(ModelInfo {
    id: ModelId,
    name: String,
    slo: Dur,
    profile: WireProfile,
    input_bytes: u32,
    meta_json: String,
});
wire_struct!(RegionInfo {
    addr: String,
    region: u32,
    len: u64,
    rkey: u32,
    base: u64,
});
wire_struct!(SubmitTask {
    id: TaskId,
    model: ModelId,
    arrival: Time,
    deadline: Time,
    input: u64,
    cap: u64,
});
wire_struct!(PlanTask {
    id: TaskId,
    deadline: Time,
    input: u64,
    cap: u64,
});
wire_struct!(TaskResult {
    id: TaskId,
    status: TaskStatus,
    started: Time,
    finished: Time,
    batch_size: u32,
    output: Vec<u8>,
    cap: u64,
});

/// Pairs, as their two fields in order: `(task id, code)` of `Msg::Dropped`,
/// `(model id, margin)` of `Msg::Margins`.
impl<A: Wire, B: Wire> Wire for (A, B) {
    const MIN: usize = A::MIN + B::MIN;
    fn size(&self) -> usize {
        self.0.size() + self.1.size()
    }
    fn put(&self, out: &mut Vec<u8>) {
        self.0.put(out);
        self.1.put(out);
    }
    fn get(r: &mut Reader<'_>, field: &'static str) -> Result<Self, DecodeError> {
        Ok((A::get(r, field)?, B::get(r, field)?))
    }
}

// ---------------------------------------------------------------------------------
// Messages

/// One line per message: its tag and its fields in declaration order. Generates the
/// tag, size, encoder and decoder of [`Msg`] (exhaustive matches: a new variant or
/// field not listed here is a compile error).
macro_rules! wire_messages {
    ($($tag:literal => $name:ident { $($f:ident),* $(,)? }),* $(,)?) => {
        /// The message tag of `msg`.
        pub fn tag_of(msg: &Msg) -> u8 {
            match msg {
                $(Msg::$name { .. } => $tag,)*
            }
        }

        fn fields_size(msg: &Msg) -> usize {
            match msg {
                $(Msg::$name { $($f),* } => 0 $(+ $f.size())*,)*
            }
        }

        fn put_fields(msg: &Msg, out: &mut Vec<u8>) {
            match msg {
                $(Msg::$name { $($f),* } => { $($f.put(out);)* })*
            }
        }

        fn get_fields(tag: u8, r: &mut Reader<'_>) -> Result<Msg, DecodeError> {
            match tag {
                $($tag => Ok(Msg::$name {
                    $($f: Wire::get(r, concat!(stringify!($name), ".", stringify!($f)))?,)*
                }),)*
                tag => Err(DecodeError::BadTag { what: "message", tag }),
            }
        }
    };
}

wire_messages! {
    1 => Register { role, name, gpus, ctrl_addr, region },
    2 => RegisterAck { node, gpu_ids, models, heartbeat_ms, term },
    3 => Unregister { reason },
    4 => LoadModel { model },
    5 => UnloadModel { model },
    6 => ModelLoaded { model, ok, error, device_bytes },
    7 => FrontendUp { node, ctrl_addr, region },
    8 => FrontendDown { node },
    9 => Submit { tasks },
    10 => Plan { id, model, gpu, exec_at, finish_at, sent, tasks },
    11 => PlanDone { id, gpu, status, started, finished, missing },
    12 => Results { items },
    13 => Dropped { items },
    14 => Ping { seq, sent, ctrl_delay, pull, pull_per_mib, pull_hold, pull_hold_per_mib, term },
    15 => Pong { seq, echo, sched, term },
    16 => Infer { req, model, slo, input },
    17 => InferReply { req, status, latency, queue, batch_size, output, message },
    18 => ListModels {},
    19 => Models { models },
    20 => Error { message },
    21 => Capacity { gpus },
    22 => Margins { items },
    23 => Drain { reason },
    24 => Drained {},
    25 => Follow {},
    26 => Assignment { homes },
    27 => Fence { term },
    28 => ModelControl { model, load },
    29 => ModelStates { items },
    30 => AppCounts { counters },
    31 => AppTotals { counters, frontends },
    32 => LatencyScales { ppm },
}

/// Bytes of `msg`'s whole frame, length prefix included (what [`encode`] appends).
pub fn frame_len(msg: &Msg) -> usize {
    LEN_PREFIX + HEADER + fields_size(msg)
}

/// Appends `msg` as one whole frame (length prefix included) to `out`. Reserves the
/// frame's exact size once. Does not check the protocol limits (see the module doc).
pub fn encode(msg: &Msg, out: &mut Vec<u8>) {
    let body = HEADER + fields_size(msg);
    out.reserve(LEN_PREFIX + body);
    let start = out.len();
    out.extend_from_slice(&len32(body).to_le_bytes());
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out.push(tag_of(msg));
    put_fields(msg, out);
    debug_assert_eq!(
        out.len() - start,
        LEN_PREFIX + body,
        "size of {}",
        msg.kind()
    );
}

/// [`encode`], except that the input of an `Infer` of at least `min_tail`
/// bytes (its last field) is not appended: it is returned, and the frame is
/// what `out` got followed by it. A writer sends it from where it lies
/// rather than copying a large input into its buffer first.
pub fn encode_split(msg: &Msg, out: &mut Vec<u8>, min_tail: usize) -> Option<bytes::Bytes> {
    let Msg::Infer {
        req,
        model,
        slo,
        input,
    } = msg
    else {
        encode(msg, out);
        return None;
    };
    if input.len() < min_tail {
        encode(msg, out);
        return None;
    }
    let start = out.len();
    encode(
        &Msg::Infer {
            req: *req,
            model: model.clone(),
            slo: *slo,
            input: bytes::Bytes::new(),
        },
        out,
    );
    // The head ends with the input's (empty) length field: both lengths
    // grow by the input's.
    let body = out.len() - start - LEN_PREFIX + input.len();
    out[start..start + LEN_PREFIX].copy_from_slice(&len32(body).to_le_bytes());
    let at = out.len() - 4;
    out[at..].copy_from_slice(&len32(input.len()).to_le_bytes());
    Some(input.clone())
}

/// `msg` as one whole frame.
pub fn encode_to_vec(msg: &Msg) -> Vec<u8> {
    let mut v = Vec::new();
    encode(msg, &mut v);
    v
}

/// Decodes one frame body (the bytes after the u32 length prefix). The body must hold
/// exactly one message: trailing bytes are an error.
pub fn decode(body: &[u8]) -> Result<Msg, DecodeError> {
    decode_in(Reader {
        buf: body,
        pos: 0,
        shared: None,
    })
}

/// As [`decode`], with the message's byte fields of [`SHARE_FROM`] bytes and
/// more (a request's input) as views of `body` instead of copies.
pub fn decode_shared(body: &bytes::Bytes) -> Result<Msg, DecodeError> {
    decode_in(Reader {
        buf: body,
        pos: 0,
        shared: Some(body),
    })
}

fn decode_in(mut r: Reader<'_>) -> Result<Msg, DecodeError> {
    let body = r.buf;
    if body.len() > MAX_FRAME {
        return Err(DecodeError::TooLarge {
            what: "frame",
            len: body.len(),
            max: MAX_FRAME,
        });
    }
    let got = r.u16("version")?;
    if got != PROTOCOL_VERSION {
        return Err(DecodeError::Version {
            got,
            want: PROTOCOL_VERSION,
        });
    }
    let tag = r.u8("message tag")?;
    let msg = get_fields(tag, &mut r)?;
    if r.left() != 0 {
        return Err(DecodeError::Invalid(format!(
            "{} trailing bytes after a {} message",
            r.left(),
            msg.kind()
        )));
    }
    Ok(msg)
}

/// Buffer capacity a [`FrameReader`] keeps between frames.
const KEEP_CAPACITY: usize = 1 << 20;

/// Splits a byte stream into frames and decodes them.
#[derive(Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    start: usize,
    /// The first error; returned again by every later call.
    err: Option<DecodeError>,
}

impl FrameReader {
    pub fn new() -> FrameReader {
        FrameReader::default()
    }

    /// Appends bytes read from the stream (ignored once the stream has failed).
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.err.is_some() {
            return;
        }
        if self.start > 0 {
            // Drop the frames already decoded (only what is left undecoded moves).
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes fed but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next whole frame decoded, None when more bytes are needed. A frame longer
    /// than [`MAX_FRAME`] is an error as soon as its length prefix arrives. After an
    /// error the stream is unusable (close the connection): every later call returns
    /// the same error.
    pub fn next_msg(&mut self) -> Option<Result<Msg, DecodeError>> {
        if let Some(e) = &self.err {
            return Some(Err(e.clone()));
        }
        let avail = &self.buf[self.start..];
        let prefix: [u8; LEN_PREFIX] = avail.get(..LEN_PREFIX)?.try_into().ok()?;
        let len = u32::from_le_bytes(prefix) as usize;
        if len > MAX_FRAME {
            return Some(Err(self.fail(DecodeError::TooLarge {
                what: "frame",
                len,
                max: MAX_FRAME,
            })));
        }
        // The buffer grows with the bytes that actually arrive, not with the length
        // announced (a peer announcing MAX_FRAME and sending nothing costs nothing).
        let body = avail.get(LEN_PREFIX..LEN_PREFIX + len)?;
        let res = decode(body);
        self.start += LEN_PREFIX + len;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            if self.buf.capacity() > KEEP_CAPACITY {
                // Do not hold on to the memory of one large frame.
                self.buf.shrink_to(KEEP_CAPACITY);
            }
        }
        Some(res.map_err(|e| self.fail(e)))
    }

    fn fail(&mut self, e: DecodeError) -> DecodeError {
        self.err = Some(e.clone());
        self.buf = Vec::new();
        self.start = 0;
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body decoded shared gives its large inputs as views of it and
    /// copies its small ones; the message is the one `decode` gives.
    #[test]
    fn a_shared_body_lends_its_large_inputs() {
        for n in [SHARE_FROM - 1, SHARE_FROM, 602_112] {
            let msg = Msg::Infer {
                req: 7,
                model: "m".into(),
                slo: crate::core::Dur(5),
                input: (0..n).map(|k| k as u8).collect::<Vec<u8>>().into(),
            };
            let body = bytes::Bytes::from(encode_to_vec(&msg)[4..].to_vec());
            let got = decode_shared(&body).unwrap();
            assert_eq!(got, decode(&body).unwrap());
            assert_eq!(got, msg);
            let Msg::Infer { input, .. } = got else {
                unreachable!()
            };
            let (p, b) = (input.as_ptr() as usize, body.as_ptr() as usize);
            let view = p >= b && p + input.len() <= b + body.len();
            assert_eq!(view, n >= SHARE_FROM, "{n} bytes");
        }
    }

    /// A split frame is the whole frame cut before a large input: the same
    /// bytes, whatever the input's size, and it decodes to the message.
    #[test]
    fn a_split_frame_is_the_frame_cut_before_its_input() {
        for n in [0, 10, 1 << 16, 600_000] {
            let msg = Msg::Infer {
                req: 9,
                model: "resnet50".into(),
                slo: Dur(50_000),
                input: (0..n).map(|i| i as u8).collect::<Vec<u8>>().into(),
            };
            let mut head = vec![7u8; 3];
            let tail = encode_split(&msg, &mut head, 1 << 16);
            assert_eq!(tail.is_some(), n >= 1 << 16, "{n} bytes");
            let mut whole = vec![7u8; 3];
            encode(&msg, &mut whole);
            head.extend_from_slice(tail.as_deref().unwrap_or_default());
            assert_eq!(head, whole, "{n} bytes");
            assert_eq!(decode(&whole[3 + LEN_PREFIX..]).unwrap(), msg);
        }
        let other = Msg::ListModels;
        let mut out = Vec::new();
        assert_eq!(encode_split(&other, &mut out, 0), None);
        assert_eq!(out, encode_to_vec(&other));
    }

    #[test]
    fn drop_reason_index_is_its_wire_tag() {
        for (i, c) in DropReason::ALL.into_iter().enumerate() {
            assert_eq!(c.index(), i);
            let mut b = Vec::new();
            c.put(&mut b);
            assert_eq!(b, [i as u8], "{c:?}");
        }
    }

    fn model(id: u32) -> ModelInfo {
        ModelInfo {
            id: ModelId(id),
            name: format!("resnet{id}"),
            slo: Dur(25_000_000),
            profile: if id.is_multiple_of(2) {
                WireProfile::Linear {
                    alpha_ns: 1_000,
                    beta_ns: -7,
                    max_batch: 32,
                }
            } else {
                WireProfile::Table {
                    lat_ns: vec![1, 2, i64::MAX, i64::MIN],
                }
            },
            input_bytes: 602_112,
            meta_json: if id.is_multiple_of(2) {
                String::new()
            } else {
                "{\"name\":\"m\"}".into()
            },
        }
    }

    fn region() -> RegionInfo {
        RegionInfo {
            addr: "10.0.0.1:7001".into(),
            region: 3,
            len: 1 << 30,
            rkey: 0xdead_beef,
            base: u64::MAX,
        }
    }

    /// One of every variant (and of every enum value somewhere).
    fn samples() -> Vec<Msg> {
        vec![
            Msg::Register {
                role: Role::Backend,
                name: "gpu-box-1".into(),
                gpus: vec![
                    GpuInfo {
                        local: 0,
                        name: "H100".into(),
                        mem_bytes: 80 << 30,
                        device: DeviceKind::Gpu,
                        lanes: 1,
                    },
                    GpuInfo {
                        local: 1,
                        name: String::new(),
                        mem_bytes: 0,
                        device: DeviceKind::Emulated,
                        lanes: 1,
                    },
                ],
                ctrl_addr: String::new(),
                region: None,
            },
            Msg::Register {
                role: Role::Frontend,
                name: "fe-é".into(),
                gpus: vec![],
                ctrl_addr: "10.0.0.1:7000".into(),
                region: Some(region()),
            },
            Msg::RegisterAck {
                node: 7,
                gpu_ids: vec![GpuId(4), GpuId(5), GpuId(6)],
                models: vec![model(0), model(1)],
                heartbeat_ms: 100,
                term: 3,
            },
            Msg::Unregister {
                reason: "bye".into(),
            },
            Msg::LoadModel { model: model(2) },
            Msg::UnloadModel { model: ModelId(9) },
            Msg::ModelLoaded {
                model: ModelId(1),
                ok: true,
                error: String::new(),
                device_bytes: 123 << 20,
            },
            Msg::ModelLoaded {
                model: ModelId(1),
                ok: false,
                error: "out of memory".into(),
                device_bytes: 0,
            },
            Msg::FrontendUp {
                node: 3,
                ctrl_addr: "fe".into(),
                region: region(),
            },
            Msg::FrontendDown { node: 3 },
            Msg::Submit {
                tasks: vec![SubmitTask {
                    id: TaskId(1 << 40),
                    model: ModelId(2),
                    arrival: Time(-5),
                    deadline: Time(10),
                    input: 77,
                    cap: u64::MAX,
                }],
            },
            Msg::Plan {
                id: PlanId(11),
                model: ModelId(2),
                gpu: GpuId(1),
                exec_at: Time(100),
                finish_at: Time(200),
                sent: Time(0),
                tasks: vec![
                    PlanTask {
                        id: TaskId(1),
                        deadline: Time(300),
                        input: 5,
                        cap: 9,
                    };
                    3
                ],
            },
            Msg::PlanDone {
                id: PlanId(11),
                gpu: GpuId(1),
                status: PlanStatus::Ran,
                started: Time(101),
                finished: Time(199),
                missing: 0,
            },
            Msg::PlanDone {
                id: PlanId(12),
                gpu: GpuId(1),
                status: PlanStatus::TooLate,
                started: Time(0),
                finished: Time(0),
                missing: 2,
            },
            Msg::PlanDone {
                id: PlanId(13),
                gpu: GpuId(0),
                status: PlanStatus::Failed,
                started: Time(0),
                finished: Time(0),
                missing: 0,
            },
            Msg::Results {
                items: vec![
                    TaskResult {
                        id: TaskId(1),
                        status: TaskStatus::Ok,
                        started: Time(0),
                        finished: Time(5),
                        batch_size: 0,
                        output: vec![1, 2, 3],
                        cap: 3,
                    },
                    TaskResult {
                        id: TaskId(2),
                        status: TaskStatus::Dropped(DropReason::TooLate),
                        started: Time(0),
                        finished: Time(5),
                        batch_size: 0,
                        output: vec![],
                        cap: 3,
                    },
                    TaskResult {
                        id: TaskId(3),
                        status: TaskStatus::InputMissing,
                        started: Time(0),
                        finished: Time(5),
                        batch_size: 0,
                        output: vec![],
                        cap: 3,
                    },
                    TaskResult {
                        id: TaskId(4),
                        status: TaskStatus::Failed,
                        started: Time(0),
                        finished: Time(5),
                        batch_size: 0,
                        output: vec![0; 1000],
                        cap: 3,
                    },
                ],
            },
            Msg::Dropped {
                items: DropReason::ALL
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| (TaskId(i as u64 + 1), c))
                    .collect(),
            },
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
            Msg::Pong {
                seq: 1,
                echo: Time(2),
                sched: Time(3),
                term: 4,
            },
            Msg::Infer {
                req: 42,
                model: "resnet50".into(),
                slo: Dur::ZERO,
                input: vec![9; 4096].into(),
            },
            Msg::InferReply {
                req: 42,
                status: Outcome::Good,
                latency: Dur(1234),
                queue: Dur::ZERO,
                batch_size: 0,
                output: vec![1],
                message: String::new(),
            },
            Msg::InferReply {
                req: 43,
                status: Outcome::Late,
                latency: Dur(1),
                queue: Dur::ZERO,
                batch_size: 0,
                output: vec![],
                message: "late".into(),
            },
            Msg::InferReply {
                req: 44,
                status: Outcome::Dropped,
                latency: Dur(1),
                queue: Dur::ZERO,
                batch_size: 0,
                output: vec![],
                message: "dropped".into(),
            },
            Msg::InferReply {
                req: 45,
                status: Outcome::Failed,
                latency: Dur(1),
                queue: Dur::ZERO,
                batch_size: 0,
                output: vec![],
                message: "failed".into(),
            },
            Msg::ListModels,
            Msg::Models {
                models: vec![model(3)],
            },
            Msg::Error {
                message: "bad frame".into(),
            },
            Msg::Capacity { gpus: 8 },
            Msg::Margins {
                items: vec![(ModelId(0), Dur(250_000)), (ModelId(7), Dur::ZERO)],
            },
            Msg::Drain {
                reason: "scale down".into(),
            },
            Msg::Drained,
            Msg::Follow,
            Msg::Assignment {
                homes: vec![0, 2, 1],
            },
            Msg::Fence { term: u64::MAX },
            Msg::ModelControl {
                model: ModelId(3),
                load: true,
            },
            Msg::ModelStates {
                items: vec![
                    ModelStateItem {
                        model: ModelId(0),
                        state: ModelAvailability::Ready,
                        reason: String::new(),
                        devices: DeviceCounts::default(),
                    },
                    ModelStateItem {
                        model: ModelId(1),
                        state: ModelAvailability::Unavailable,
                        reason: "load failed".into(),
                        devices: DeviceCounts {
                            gpu: 2,
                            cpu: 1,
                            emulated: u32::MAX,
                        },
                    },
                ],
            },
            Msg::AppCounts {
                counters: AppCounters {
                    app: "detect_classify".into(),
                    fanout: vec![(10, 31), (0, 0)],
                    latency: vec![
                        StepLatency {
                            observed_ns: 5_000,
                            profiled_ns: 4_000,
                            samples: 3,
                        },
                        StepLatency::default(),
                    ],
                    requests: u64::MAX,
                },
            },
            Msg::AppTotals {
                counters: AppCounters::default(),
                frontends: 2,
            },
            Msg::LatencyScales {
                ppm: vec![1_000_000, 2_500_000, u32::MAX],
            },
        ]
    }

    fn body(frame: &[u8]) -> &[u8] {
        let len = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4, "length prefix");
        &frame[4..]
    }

    #[test]
    fn round_trip_every_variant() {
        let mut kinds = std::collections::BTreeSet::new();
        for msg in samples() {
            kinds.insert(msg.kind());
            let frame = encode_to_vec(&msg);
            assert_eq!(frame.len(), frame_len(&msg));
            assert_eq!(decode(body(&frame)).unwrap(), msg);
        }
        assert_eq!(kinds.len(), 32, "a sample of every variant");
    }

    #[test]
    fn encode_appends_and_reserves_once() {
        let msg = &samples()[2];
        let mut out = vec![0xAA, 0xBB];
        encode(msg, &mut out);
        assert_eq!(&out[..2], &[0xAA, 0xBB]);
        assert_eq!(&out[2..], &encode_to_vec(msg)[..]);
        let v = encode_to_vec(msg);
        assert_eq!(v.capacity(), v.len(), "exact reservation");
    }

    #[test]
    fn golden_bytes() {
        // The layout is the contract with other builds: pin it.
        let frame = encode_to_vec(&Msg::Pong {
            seq: 1,
            echo: Time(-1),
            sched: Time(0x0102),
            term: 5,
        });
        let mut want = vec![35, 0, 0, 0, 13, 0, 15];
        want.extend_from_slice(&1u64.to_le_bytes());
        want.extend_from_slice(&[0xFF; 8]);
        want.extend_from_slice(&[2, 1, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&5u64.to_le_bytes());
        assert_eq!(frame, want);

        let frame = encode_to_vec(&Msg::Results {
            items: vec![TaskResult {
                id: TaskId(2),
                status: TaskStatus::Dropped(DropReason::BackendLost),
                started: Time(0),
                finished: Time(3),
                batch_size: 0,
                output: vec![0xAB],
                cap: 0x0102_0304_0506_0708,
            }],
        });
        let mut want = vec![13, 0, 12, 1, 0, 0, 0];
        want.extend_from_slice(&2u64.to_le_bytes());
        want.extend_from_slice(&[1, 7]);
        want.extend_from_slice(&0i64.to_le_bytes());
        want.extend_from_slice(&3i64.to_le_bytes());
        want.extend_from_slice(&0u32.to_le_bytes());
        want.extend_from_slice(&[1, 0, 0, 0, 0xAB]);
        want.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(body(&frame), &want[..]);

        let frame = encode_to_vec(&Msg::Unregister {
            reason: "hi".into(),
        });
        assert_eq!(frame, vec![9, 0, 0, 0, 13, 0, 3, 2, 0, 0, 0, b'h', b'i']);
        assert_eq!(encode_to_vec(&Msg::ListModels), vec![3, 0, 0, 0, 13, 0, 18]);
    }

    #[test]
    fn every_prefix_is_truncated() {
        for msg in samples() {
            let frame = encode_to_vec(&msg);
            let body = body(&frame);
            for n in 0..body.len() {
                match decode(&body[..n]) {
                    Err(DecodeError::Truncated { need, have, .. }) => assert!(need > have),
                    other => panic!("{} cut at {n}: {other:?}", msg.kind()),
                }
            }
        }
    }

    #[test]
    fn huge_count_is_refused_before_allocating() {
        // Submit with a count of u32::MAX and nothing after it.
        let body = [13, 0, 9, 0xFF, 0xFF, 0xFF, 0xFF];
        assert_eq!(
            decode(&body),
            Err(DecodeError::TooLarge {
                what: "Submit.tasks",
                len: u32::MAX as usize,
                max: MAX_ITEMS
            })
        );
        // Within the limit but more items than bytes: truncated, counted in bytes.
        let mut body = vec![13, 0, 9];
        body.extend_from_slice(&(MAX_ITEMS as u32).to_le_bytes());
        body.extend_from_slice(&[0; 44]);
        assert_eq!(
            decode(&body),
            Err(DecodeError::Truncated {
                field: "Submit.tasks",
                need: MAX_ITEMS * 44,
                have: 44
            })
        );
    }

    #[test]
    fn limits() {
        // A string one byte over MAX_STR.
        let msg = Msg::Error {
            message: "x".repeat(MAX_STR + 1),
        };
        let frame = encode_to_vec(&msg);
        assert_eq!(
            decode(&frame[4..]),
            Err(DecodeError::TooLarge {
                what: "Error.message",
                len: MAX_STR + 1,
                max: MAX_STR
            })
        );
        let ok = Msg::Error {
            message: "x".repeat(MAX_STR),
        };
        assert_eq!(decode(&encode_to_vec(&ok)[4..]), Ok(ok));
        // MAX_ITEMS items are fine.
        let msg = Msg::RegisterAck {
            node: 1,
            gpu_ids: (0..MAX_ITEMS as u32).map(GpuId).collect(),
            models: vec![],
            heartbeat_ms: 1,
            term: 1,
        };
        assert_eq!(decode(&encode_to_vec(&msg)[4..]), Ok(msg));
    }

    #[test]
    fn header_errors() {
        assert_eq!(
            decode(&[1, 0, 18]),
            Err(DecodeError::Version {
                got: 1,
                want: PROTOCOL_VERSION
            })
        );
        assert_eq!(
            decode(&[13, 0, 0]),
            Err(DecodeError::BadTag {
                what: "message",
                tag: 0
            })
        );
        assert_eq!(
            decode(&[13, 0, 33]),
            Err(DecodeError::BadTag {
                what: "message",
                tag: 33
            })
        );
        let e = decode(&[13, 0, 18, 0]).unwrap_err();
        assert!(matches!(e, DecodeError::Invalid(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "invalid frame: 1 trailing bytes after a ListModels message"
        );
    }

    #[test]
    fn bad_enum_tags() {
        let mut body = vec![13, 0, 1, 2]; // Register, role 2
        body.extend_from_slice(&[0; 12]);
        assert_eq!(
            decode(&body),
            Err(DecodeError::BadTag {
                what: "Register.role",
                tag: 2
            })
        );
        let mut frame = encode_to_vec(&Msg::ModelLoaded {
            model: ModelId(1),
            ok: true,
            error: String::new(),
            device_bytes: 0,
        });
        frame[4 + 3 + 4] = 2;
        assert_eq!(
            decode(&frame[4..]),
            Err(DecodeError::BadTag {
                what: "ModelLoaded.ok",
                tag: 2
            })
        );
        let mut frame = encode_to_vec(&Msg::Dropped {
            items: vec![(TaskId(1), DropReason::Expired)],
        });
        let last = frame.len() - 1;
        frame[last] = 10;
        assert_eq!(
            decode(&frame[4..]),
            Err(DecodeError::BadTag {
                what: "Dropped.items",
                tag: 10
            })
        );
    }

    #[test]
    fn bad_utf8() {
        let frame = encode_to_vec(&Msg::Unregister {
            reason: "ab".into(),
        });
        let mut body = frame[4..].to_vec();
        let n = body.len();
        body[n - 1] = 0xFF;
        let e = decode(&body).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid frame: field `Unregister.reason` is not valid UTF-8"),
            "{e}"
        );
    }

    #[test]
    fn display_is_readable() {
        let e = decode(&[13, 0, 10, 1, 2]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "frame truncated at field `Plan.id`: needs 8 bytes, only 2 left"
        );
        assert_eq!(
            DecodeError::TooLarge {
                what: "frame",
                len: 10,
                max: 5
            }
            .to_string(),
            "`frame` too large: length 10 exceeds the limit of 5"
        );
        assert_eq!(
            DecodeError::Version { got: 9, want: 2 }.to_string(),
            "protocol version 9 not supported (this build speaks version 2)"
        );
        assert_eq!(
            DecodeError::BadTag {
                what: "message",
                tag: 99
            }
            .to_string(),
            "unknown tag 99 for `message`"
        );
    }

    #[test]
    fn frame_reader_splits_a_stream() {
        let msgs = samples();
        let mut stream = Vec::new();
        for m in &msgs {
            encode(m, &mut stream);
        }
        for chunk in [1, 2, 3, 7, 64, 1000, stream.len()] {
            let mut r = FrameReader::new();
            let mut got = Vec::new();
            for c in stream.chunks(chunk) {
                r.feed(c);
                while let Some(m) = r.next_msg() {
                    got.push(m.unwrap());
                }
            }
            assert_eq!(got, msgs, "chunk {chunk}");
            assert_eq!(r.buffered(), 0);
            assert!(r.next_msg().is_none());
        }
    }

    #[test]
    fn frame_reader_refuses_oversized_frame_at_once() {
        let mut r = FrameReader::new();
        r.feed(&((MAX_FRAME + 1) as u32).to_le_bytes());
        let want = DecodeError::TooLarge {
            what: "frame",
            len: MAX_FRAME + 1,
            max: MAX_FRAME,
        };
        assert_eq!(r.next_msg(), Some(Err(want.clone())));
        r.feed(&encode_to_vec(&Msg::ListModels));
        assert_eq!(r.next_msg(), Some(Err(want)), "sticky");
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn frame_reader_error_is_sticky() {
        let mut r = FrameReader::new();
        let mut stream = encode_to_vec(&Msg::ListModels);
        stream.extend_from_slice(&[3, 0, 0, 0, 99, 0, 18]); // version 99
        encode(&Msg::ListModels, &mut stream);
        r.feed(&stream);
        assert_eq!(r.next_msg(), Some(Ok(Msg::ListModels)));
        let want = Some(Err(DecodeError::Version {
            got: 99,
            want: PROTOCOL_VERSION,
        }));
        assert_eq!(r.next_msg(), want);
        assert_eq!(r.next_msg(), want);
    }
}
