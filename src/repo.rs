//! The model repository: real models on disk, their metadata and their measured
//! latency profiles.
//!
//! A repository is a directory (`models/` by default). Each model `STEM` has:
//!
//! * `STEM.onnx` — the ONNX file, with a dynamic first (batch) dimension;
//! * `STEM.json` — its [`ModelMeta`]: input and output tensors (name, KServe
//!   datatype, shape with `-1` as the batch dimension), default SLO, largest batch;
//! * `STEM.profile-DEVICE.json` — a [`ProfileFile`] written by `fermata profile`
//!   (`DEVICE` is `cpu` for the ONNX Runtime CPU provider, `cuda` for the CUDA
//!   provider). The scheduler refuses a model without one, and says how to make it.
//!
//! # One request's bytes
//! A request carries one sample. Its input bytes, as frontends store them and
//! backends pull them, are each input tensor's raw little-endian bytes for that
//! sample (the shape without the batch dimension), concatenated in the order of
//! `inputs`. A result's output bytes are laid out the same way from `outputs`.
//! [`ModelMeta::input_bytes`] and [`ModelMeta::output_bytes`] give the sizes.

use crate::core::{Dur, LatencyProfile, ModelSpec};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A tensor element type, named as in the KServe v2 protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DType {
    #[serde(rename = "BOOL")]
    Bool,
    #[serde(rename = "UINT8")]
    U8,
    #[serde(rename = "UINT16")]
    U16,
    #[serde(rename = "UINT32")]
    U32,
    #[serde(rename = "UINT64")]
    U64,
    #[serde(rename = "INT8")]
    I8,
    #[serde(rename = "INT16")]
    I16,
    #[serde(rename = "INT32")]
    I32,
    #[serde(rename = "INT64")]
    I64,
    #[serde(rename = "FP16")]
    F16,
    /// bfloat16: the top 16 bits of an FP32.
    #[serde(rename = "BF16")]
    BF16,
    #[serde(rename = "FP32")]
    F32,
    #[serde(rename = "FP64")]
    F64,
    /// Strings (bytes), for inputs: each element a fixed slot of
    /// [`BYTES_SLOT`] bytes, its length (u32, little-endian) then up to
    /// [`BYTES_MAX`] bytes. Fixed so that a sample's size stays fixed, as a
    /// frontend's input region and a backend's pull need.
    #[serde(rename = "BYTES")]
    Bytes,
}

/// The bytes a BYTES element takes in a sample.
pub const BYTES_SLOT: usize = 256;
/// The longest BYTES element.
pub const BYTES_MAX: usize = BYTES_SLOT - 4;

/// Appends BYTES element `e` as its slot; an error (for a message naming the
/// element) when it is too long or holds a NUL byte (ONNX Runtime's strings
/// end at the first NUL).
pub fn push_bytes_slot(e: &[u8], out: &mut Vec<u8>) -> std::result::Result<(), String> {
    if e.len() > BYTES_MAX {
        return Err(format!(
            "{} bytes, over the {BYTES_MAX} a BYTES element may hold",
            e.len()
        ));
    }
    if e.contains(&0) {
        return Err("a string with a NUL byte (ONNX Runtime's strings end at NUL)".into());
    }
    out.extend_from_slice(&(e.len() as u32).to_le_bytes());
    out.extend_from_slice(e);
    out.resize(out.len() + BYTES_MAX - e.len(), 0);
    Ok(())
}

/// The element a BYTES slot holds (a length past the slot reads as the whole
/// slot; slots come from [`push_bytes_slot`]).
pub fn bytes_of_slot(slot: &[u8]) -> &[u8] {
    let Some((len, rest)) = slot.split_first_chunk::<4>() else {
        return &[];
    };
    let n = (u32::from_le_bytes(*len) as usize).min(rest.len());
    &rest[..n]
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::F16 | DType::BF16 | DType::U16 | DType::I16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
            DType::Bytes => BYTES_SLOT,
        }
    }
    /// The KServe v2 name ("FP32", ...).
    pub fn kserve_name(self) -> &'static str {
        match self {
            DType::Bool => "BOOL",
            DType::U8 => "UINT8",
            DType::U16 => "UINT16",
            DType::U32 => "UINT32",
            DType::U64 => "UINT64",
            DType::I8 => "INT8",
            DType::I16 => "INT16",
            DType::I32 => "INT32",
            DType::I64 => "INT64",
            DType::F16 => "FP16",
            DType::BF16 => "BF16",
            DType::F32 => "FP32",
            DType::F64 => "FP64",
            DType::Bytes => "BYTES",
        }
    }
    /// Parses a KServe v2 name.
    pub fn from_kserve(s: &str) -> Option<DType> {
        Some(match s {
            "BOOL" => DType::Bool,
            "UINT8" => DType::U8,
            "UINT16" => DType::U16,
            "UINT32" => DType::U32,
            "UINT64" => DType::U64,
            "INT8" => DType::I8,
            "INT16" => DType::I16,
            "INT32" => DType::I32,
            "INT64" => DType::I64,
            "FP16" => DType::F16,
            "BF16" => DType::BF16,
            "FP32" => DType::F32,
            "FP64" => DType::F64,
            "BYTES" => DType::Bytes,
            _ => return None,
        })
    }
}

/// One input or output tensor of a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorMeta {
    pub name: String,
    pub datatype: DType,
    /// Full shape; the first dimension is the batch and must be `-1`.
    pub shape: Vec<i64>,
    /// For an integer input: the values the model takes, `[min, max]`
    /// inclusive (e.g. ids into an embedding table). A request with a value
    /// outside is answered 400 at the frontend, before it can fail a batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<[i64; 2]>,
}

impl TensorMeta {
    /// The first value of one sample's bytes `b` (this tensor's part of a
    /// request) outside [`TensorMeta::range`]: (element index, value).
    pub fn out_of_range(&self, b: &[u8]) -> Option<(usize, i64)> {
        let [lo, hi] = self.range?;
        let n = self.datatype.size();
        b.chunks_exact(n).enumerate().find_map(|(i, c)| {
            let v = match self.datatype {
                DType::I64 => i64::from_le_bytes(c.try_into().expect("8 bytes")),
                DType::I32 => i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64,
                DType::I16 => i16::from_le_bytes(c.try_into().expect("2 bytes")) as i64,
                DType::U16 => u16::from_le_bytes(c.try_into().expect("2 bytes")) as i64,
                DType::U32 => u32::from_le_bytes(c.try_into().expect("4 bytes")) as i64,
                // Above i64::MAX is above any range.
                DType::U64 => i64::try_from(u64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .unwrap_or(i64::MAX),
                DType::I8 => c[0] as i8 as i64,
                DType::U8 | DType::Bool => c[0] as i64,
                // Float inputs carry no range (`check` refuses one).
                _ => return None,
            };
            (v < lo || v > hi).then_some((i, v))
        })
    }
    /// The shape of one sample (without the batch dimension).
    pub fn sample_shape(&self) -> &[i64] {
        &self.shape[1..]
    }
    /// Elements in one sample.
    pub fn sample_elems(&self) -> usize {
        self.sample_shape().iter().map(|&d| d as usize).product()
    }
    /// Bytes in one sample.
    pub fn sample_bytes(&self) -> usize {
        self.sample_elems() * self.datatype.size()
    }
    fn check(&self, what: &str) -> Result<()> {
        if self.name.is_empty() {
            bail!("{what}: empty tensor name");
        }
        if self.shape.first() != Some(&-1) {
            bail!(
                "{what} `{}`: the first dimension must be -1 (the batch), got {:?}",
                self.name,
                self.shape
            );
        }
        if let Some(d) = self.sample_shape().iter().find(|&&d| d <= 0) {
            bail!(
                "{what} `{}`: every dimension after the batch must be positive, got {d} in {:?}",
                self.name,
                self.shape
            );
        }
        if let Some([lo, hi]) = self.range {
            let int = !matches!(
                self.datatype,
                DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::Bytes
            );
            if !int {
                bail!(
                    "{what} `{}`: a range is for integer tensors, not {}",
                    self.name,
                    self.datatype.kserve_name()
                );
            }
            if lo > hi {
                bail!("{what} `{}`: range [{lo}, {hi}] is empty", self.name);
            }
        }
        Ok(())
    }
}

/// A model's metadata file (`STEM.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelMeta {
    /// The served name (the file stem).
    pub name: String,
    pub inputs: Vec<TensorMeta>,
    pub outputs: Vec<TensorMeta>,
    /// Default SLO of a request (ms); a request's `timeout` parameter overrides it.
    pub slo_ms: f64,
    /// The largest batch the model is run with (and profiled up to).
    pub max_batch: u32,
    /// What the model is, for people.
    #[serde(default)]
    pub description: String,
    /// The batch-size buckets of shape-stable execution (see [`BucketPolicy`]): a
    /// batch runs padded to the smallest bucket that holds it, each bucket in a
    /// session that only ever sees that one shape. Increasing, each in
    /// 1..=max_batch; max_batch is added when missing. Absent: the device's
    /// default (powers of two up to max_batch on a GPU; exact shapes on the CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_buckets: Option<Vec<u32>>,
}

/// How batch sizes map to the shapes a model's sessions run.
///
/// ONNX Runtime's CUDA kernels (cuDNN convolutions above all) keep their tuned
/// state for the last input shape only: a session whose batch size changes from
/// run to run re-selects algorithms on every run and is one to two orders of
/// magnitude slower than one that always sees the same shape. Deferred batching
/// changes the batch size from batch to batch, so on a GPU each bucket gets its own
/// session. On the CPU the provider keeps no per-shape state and padding would cost
/// in proportion, so the default there is one session run at the exact size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketPolicy {
    /// The model's `batch_buckets`, else the device's default.
    Auto,
    /// One session, run at each batch's exact size.
    Exact,
    /// Powers of two up to max_batch (and max_batch).
    Pow2,
    /// These buckets (normalized like `batch_buckets`).
    List(Vec<u32>),
}

impl BucketPolicy {
    /// `auto`, `exact`, `pow2` or a list `1,4,16,64`.
    pub fn parse(s: &str) -> Result<BucketPolicy> {
        Ok(match s.trim() {
            "auto" => BucketPolicy::Auto,
            "exact" => BucketPolicy::Exact,
            "pow2" => BucketPolicy::Pow2,
            list => BucketPolicy::List(
                list.split(',')
                    .map(|t| {
                        t.trim().parse::<u32>().with_context(|| {
                            format!(
                                "buckets: {t:?} is not a batch size (use auto, exact, pow2 or a list like 1,4,16,64)"
                            )
                        })
                    })
                    .collect::<Result<_>>()?,
            ),
        })
    }

    /// The buckets of `meta` on a GPU (`gpu`) or the CPU; None: exact shapes.
    pub fn buckets(&self, meta: &ModelMeta, gpu: bool) -> Result<Option<Vec<u32>>> {
        match self {
            BucketPolicy::Exact => Ok(None),
            BucketPolicy::Pow2 => Ok(Some(pow2_buckets(meta.max_batch))),
            BucketPolicy::List(v) => normalize_buckets(v, meta.max_batch).map(Some),
            BucketPolicy::Auto => match &meta.batch_buckets {
                Some(v) => normalize_buckets(v, meta.max_batch).map(Some),
                None if gpu => Ok(Some(pow2_buckets(meta.max_batch))),
                None => Ok(None),
            },
        }
    }
}

/// 1, 2, 4, ... up to `max_batch`, and `max_batch` itself.
pub fn pow2_buckets(max_batch: u32) -> Vec<u32> {
    let mut v = Vec::new();
    let mut b = 1u32;
    while b < max_batch {
        v.push(b);
        b *= 2;
    }
    v.push(max_batch.max(1));
    v
}

/// Checks a bucket list (increasing, each in 1..=max_batch) and appends
/// `max_batch` when it is missing, so that every batch has a bucket.
pub fn normalize_buckets(v: &[u32], max_batch: u32) -> Result<Vec<u32>> {
    if v.is_empty() {
        bail!("`batch_buckets` is empty (leave it out for the device's default)");
    }
    for w in v.windows(2) {
        if w[1] <= w[0] {
            bail!("`batch_buckets` must be increasing, got {v:?}");
        }
    }
    if let Some(&b) = v.iter().find(|&&b| b == 0 || b > max_batch) {
        bail!("`batch_buckets`: {b} is not in 1..={max_batch} (max_batch), in {v:?}");
    }
    let mut v = v.to_vec();
    if v.last() != Some(&max_batch) {
        v.push(max_batch);
    }
    Ok(v)
}

/// The bucket a batch of `b` runs in: the smallest bucket >= b (None when b is
/// larger than every bucket).
pub fn bucket_of(buckets: &[u32], b: u32) -> Option<u32> {
    let i = buckets.partition_point(|&x| x < b);
    buckets.get(i).copied()
}

/// Buckets chosen from a latency curve so that padding wastes little: from
/// `max_batch` down, a new bucket starts at the largest b whose own latency is
/// more than `waste` (a fraction) below the latency of the bucket above it. So a
/// batch never pays more than `1 + waste` times its exact-size latency (by `lat`).
pub fn buckets_for_waste(lat: impl Fn(u32) -> f64, max_batch: u32, waste: f64) -> Vec<u32> {
    let mut v = vec![max_batch];
    let mut top = lat(max_batch);
    for b in (1..max_batch).rev() {
        let l = lat(b);
        if top > (1.0 + waste) * l {
            v.push(b);
            top = l;
        }
    }
    v.reverse();
    v
}

/// Largest per-request input or output a model may declare.
pub const MAX_SAMPLE_BYTES: usize = crate::workload::MAX_INPUT_BYTES as usize;

impl ModelMeta {
    /// Checks the metadata makes sense; errors name the field.
    pub fn validate(&self) -> Result<()> {
        if self.name.is_empty() {
            bail!("`name` is empty");
        }
        if self.inputs.is_empty() {
            bail!("`inputs` is empty");
        }
        if self.outputs.is_empty() {
            bail!("`outputs` is empty");
        }
        for t in &self.inputs {
            t.check("input")?;
        }
        for t in &self.outputs {
            t.check("output")?;
            if t.datatype == DType::Bytes {
                bail!(
                    "output `{}`: BYTES outputs are not supported (BYTES is for inputs)",
                    t.name
                );
            }
        }
        if !(self.slo_ms.is_finite() && self.slo_ms > 0.0) {
            bail!("`slo_ms` must be positive, got {}", self.slo_ms);
        }
        if !(1..=1024).contains(&self.max_batch) {
            bail!("`max_batch` must be in 1..=1024, got {}", self.max_batch);
        }
        if self.input_bytes() == 0 || self.input_bytes() > MAX_SAMPLE_BYTES {
            bail!(
                "one sample's inputs are {} bytes; the limit is {MAX_SAMPLE_BYTES}",
                self.input_bytes()
            );
        }
        if self.output_bytes() > MAX_SAMPLE_BYTES {
            bail!(
                "one sample's outputs are {} bytes; the limit is {MAX_SAMPLE_BYTES}",
                self.output_bytes()
            );
        }
        if let Some(v) = &self.batch_buckets {
            normalize_buckets(v, self.max_batch)?;
        }
        Ok(())
    }
    /// Bytes of one request's inputs (all input tensors of one sample).
    pub fn input_bytes(&self) -> usize {
        self.inputs.iter().map(TensorMeta::sample_bytes).sum()
    }
    /// Bytes of one result's outputs.
    pub fn output_bytes(&self) -> usize {
        self.outputs.iter().map(TensorMeta::sample_bytes).sum()
    }
    /// A plausible request for this model (one sample in the request layout):
    /// floats uniform in [-1, 1), integers in 0..8, bytes in 0..8, booleans 0/1
    /// (small integers are valid ids for the shipped models' lookups). Profilers,
    /// load generators and tests send these.
    pub fn sample_input(&self, rng: &mut impl rand::RngCore) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.input_bytes());
        let unit =
            |rng: &mut dyn rand::RngCore| (rng.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0;
        for t in &self.inputs {
            // Small values, inside the tensor's range when it has one.
            let (lo, span) = match t.range {
                Some([lo, hi]) => (lo, (hi - lo).clamp(0, 7) as u32 + 1),
                None => (0, 8),
            };
            for _ in 0..t.sample_elems() {
                let small = lo.wrapping_add((rng.next_u32() % span) as i64);
                match t.datatype {
                    DType::F32 => b.extend_from_slice(&unit(rng).to_le_bytes()),
                    DType::F64 => b.extend_from_slice(&(unit(rng) as f64).to_le_bytes()),
                    DType::F16 => {
                        b.extend_from_slice(&half::f16::from_f32(unit(rng)).to_le_bytes())
                    }
                    DType::BF16 => {
                        b.extend_from_slice(&half::bf16::from_f32(unit(rng)).to_le_bytes())
                    }
                    DType::Bool => b.push(small as u8 & 1),
                    DType::U8 | DType::I8 => b.push(small as u8),
                    DType::U16 | DType::I16 => b.extend_from_slice(&(small as u16).to_le_bytes()),
                    DType::U32 | DType::I32 => b.extend_from_slice(&(small as u32).to_le_bytes()),
                    DType::U64 | DType::I64 => b.extend_from_slice(&small.to_le_bytes()),
                    // A short lowercase word.
                    DType::Bytes => {
                        let w: Vec<u8> = (0..1 + small as usize % 8)
                            .map(|_| b'a' + (rng.next_u32() % 26) as u8)
                            .collect();
                        push_bytes_slot(&w, &mut b).expect("a short word");
                    }
                }
            }
        }
        b
    }
    pub fn from_json(text: &str) -> Result<ModelMeta> {
        let m: ModelMeta = serde_json::from_str(text)?;
        m.validate()?;
        Ok(m)
    }
}

/// A latency profile measured by `fermata profile` (`STEM.profile-DEVICE.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    pub model: String,
    /// `onnx` (ONNX Runtime, CPU provider), `cuda` (ONNX Runtime, CUDA provider)
    /// or `emulated`.
    pub executor: String,
    /// What it ran on, for people (CPU model, GPU name).
    pub device: String,
    /// The fit l(b) = alpha_ms * b + beta_ms, what the scheduler uses.
    pub alpha_ms: f64,
    pub beta_ms: f64,
    pub max_batch: u32,
    /// What was measured: batch sizes and l(b) median and p99 over the repeats (ms).
    pub batch_sizes: Vec<u32>,
    pub median_ms: Vec<f64>,
    pub p99_ms: Vec<f64>,
    pub repeats: u32,
    /// How well the line fits the medians.
    pub fit: LinearFit,
    /// When it was measured (RFC 3339 or seconds since the epoch; for people).
    #[serde(default)]
    pub measured_at: String,
    /// The buckets the executor ran (empty: exact shapes). With buckets the
    /// scheduler plans with the step function l(bucket(b)) of the medians (each
    /// bucket must be among `batch_sizes`), not with the line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<u32>,
    /// The same batch sizes measured with one shape repeated (`median_ms` is
    /// measured inside a random mixed sequence of batch sizes, as serving sees it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub same_shape_median_ms: Vec<f64>,
    /// Batches that ran at once on the device while it was measured
    /// (`fermata profile --lanes E`): the profile is then d(b, E), what a
    /// backend with `--lanes E` plans each lane with.
    #[serde(default = "one_lane", skip_serializing_if = "is_one_lane")]
    pub lanes: u32,
}

fn one_lane() -> u32 {
    1
}

fn is_one_lane(l: &u32) -> bool {
    *l == 1
}

impl ProfileFile {
    pub fn validate(&self) -> Result<()> {
        if !(self.alpha_ms.is_finite() && self.alpha_ms >= 0.0) {
            bail!("`alpha_ms` must be >= 0, got {}", self.alpha_ms);
        }
        if !(self.beta_ms.is_finite() && self.beta_ms >= 0.0) {
            bail!("`beta_ms` must be >= 0, got {}", self.beta_ms);
        }
        if self.alpha_ms == 0.0 && self.beta_ms == 0.0 {
            bail!("`alpha_ms` and `beta_ms` are both 0");
        }
        if self.max_batch == 0 {
            bail!("`max_batch` must be positive");
        }
        if self.batch_sizes.len() != self.median_ms.len()
            || self.p99_ms.len() != self.median_ms.len()
        {
            bail!("`batch_sizes`, `median_ms` and `p99_ms` differ in length");
        }
        if !self.same_shape_median_ms.is_empty()
            && self.same_shape_median_ms.len() != self.median_ms.len()
        {
            bail!("`same_shape_median_ms` and `median_ms` differ in length");
        }
        if self.median_ms.iter().any(|m| !(m.is_finite() && *m > 0.0)) {
            bail!("`median_ms` must be positive");
        }
        let max_lanes = crate::node::backend::lanes::MAX_LANES;
        if self.lanes == 0 || self.lanes > max_lanes {
            bail!("`lanes` must be 1 to {max_lanes}, got {}", self.lanes);
        }
        if !self.buckets.is_empty() {
            let b = normalize_buckets(&self.buckets, self.max_batch)?;
            if b != self.buckets {
                bail!(
                    "`buckets` {:?} must end at max_batch {}",
                    self.buckets,
                    self.max_batch
                );
            }
            if let Some(x) = b.iter().find(|x| !self.batch_sizes.contains(x)) {
                bail!("bucket {x} was not measured (it is not in `batch_sizes`)");
            }
            if self.max_batch > crate::core::profile::MAX_BATCH_LIMIT {
                bail!("`max_batch` {} is too large", self.max_batch);
            }
        }
        Ok(())
    }
    /// The scheduler's profile: the line alpha_ms * b + beta_ms; with buckets, the
    /// step function l(b) = median at bucket(b), made non-decreasing, so the
    /// scheduler knows that a batch just past a bucket edge costs the next bucket.
    pub fn latency_profile(&self) -> Result<LatencyProfile> {
        if self.buckets.is_empty() {
            return LatencyProfile::linear(
                Dur::from_ms_f64(self.alpha_ms),
                Dur::from_ms_f64(self.beta_ms),
                self.max_batch,
            )
            .map_err(|e| anyhow::anyhow!("bad profile: {e}"));
        }
        let median_at = |x: u32| {
            self.batch_sizes
                .iter()
                .position(|&s| s == x)
                .map(|i| self.median_ms[i])
        };
        let mut lat = Vec::with_capacity(self.max_batch as usize);
        let mut prev = Dur::ZERO;
        for b in 1..=self.max_batch {
            let bucket = bucket_of(&self.buckets, b)
                .ok_or_else(|| anyhow::anyhow!("bad profile: no bucket holds batch {b}"))?;
            let ms = median_at(bucket)
                .ok_or_else(|| anyhow::anyhow!("bad profile: bucket {bucket} not measured"))?;
            let l = Dur::from_ms_f64(ms).max(prev).max(Dur(1));
            lat.push(l);
            prev = l;
        }
        LatencyProfile::table(lat).map_err(|e| anyhow::anyhow!("bad profile: {e}"))
    }
    pub fn load(path: &Path) -> Result<ProfileFile> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let p: ProfileFile = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a profile file", path.display()))?;
        p.validate()
            .with_context(|| format!("{}: bad profile", path.display()))?;
        Ok(p)
    }
    pub fn save(&self, path: &Path) -> Result<()> {
        self.validate()?;
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
    }
}

/// A least-squares line through measured points and how well it fits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinearFit {
    /// Slope (ms per request in the batch).
    pub alpha_ms: f64,
    /// Intercept (ms).
    pub beta_ms: f64,
    /// Root mean square of the residuals (ms).
    pub rmse_ms: f64,
    /// Largest |residual| / measured value.
    pub max_rel_err: f64,
    /// Coefficient of determination (1 when every point lies on the line).
    pub r2: f64,
}

/// Fits y = alpha * x + beta by ordinary least squares. Needs two distinct x.
pub fn fit_linear(x: &[f64], y: &[f64]) -> Result<LinearFit> {
    if x.len() != y.len() {
        bail!("{} batch sizes but {} latencies", x.len(), y.len());
    }
    let n = x.len() as f64;
    if x.len() < 2 {
        bail!("a fit needs at least two batch sizes");
    }
    let mx = x.iter().sum::<f64>() / n;
    let my = y.iter().sum::<f64>() / n;
    let sxx: f64 = x.iter().map(|v| (v - mx) * (v - mx)).sum();
    if sxx == 0.0 {
        bail!("a fit needs at least two different batch sizes");
    }
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let alpha = sxy / sxx;
    let beta = my - alpha * mx;
    let res: Vec<f64> = x
        .iter()
        .zip(y)
        .map(|(a, b)| b - (alpha * a + beta))
        .collect();
    let ss_res: f64 = res.iter().map(|r| r * r).sum();
    let ss_tot: f64 = y.iter().map(|v| (v - my) * (v - my)).sum();
    let max_rel_err = res
        .iter()
        .zip(y)
        .map(|(r, v)| if *v != 0.0 { (r / v).abs() } else { r.abs() })
        .fold(0.0, f64::max);
    Ok(LinearFit {
        alpha_ms: alpha,
        beta_ms: beta,
        rmse_ms: (ss_res / n).sqrt(),
        max_rel_err,
        r2: if ss_tot == 0.0 {
            1.0
        } else {
            1.0 - ss_res / ss_tot
        },
    })
}

/// The profile file name of a model for an executor (`onnx` → `cpu`, `cuda` →
/// `cuda`, anything else → itself).
pub fn profile_path(dir: &Path, stem: &str, executor: &str) -> PathBuf {
    let device = match executor {
        "onnx" | "cpu" => "cpu",
        other => other,
    };
    dir.join(format!("{stem}.profile-{device}.json"))
}

/// One model of a repository, resolved.
#[derive(Debug, Clone)]
pub struct RepoModel {
    pub meta: ModelMeta,
    /// The ONNX file.
    pub file: PathBuf,
    pub profile: ProfileFile,
}

impl RepoModel {
    /// The scheduler's view of it.
    pub fn spec(&self) -> Result<ModelSpec> {
        Ok(ModelSpec {
            name: self.meta.name.clone(),
            profile: self.profile.latency_profile()?,
            slo: Dur::from_ms_f64(self.meta.slo_ms),
        })
    }
}

/// Reads a model's metadata: `STEM.json` next to the `.onnx` file `onnx`, or,
/// when `onnx` is a Triton model directory, its `config.pbtxt`
/// ([`crate::triton_repo`]).
pub fn load_meta(onnx: &Path) -> Result<ModelMeta> {
    if crate::triton_repo::is_model_dir(onnx) {
        return Ok(crate::triton_repo::load(onnx)?.meta);
    }
    let json = onnx.with_extension("json");
    let text = std::fs::read_to_string(&json).with_context(|| {
        format!(
            "model {}: no metadata file {} (input/output names, shapes, dtypes, SLO; see models/README.md)",
            onnx.display(),
            json.display()
        )
    })?;
    let meta = ModelMeta::from_json(&text).with_context(|| format!("{}", json.display()))?;
    let stem = onnx.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if meta.name != stem {
        bail!(
            "{}: `name` is {:?} but the file stem is {stem:?}; they must match",
            json.display(),
            meta.name
        );
    }
    Ok(meta)
}

/// Where a model's profiles are kept: beside its `.onnx` file, or, for a Triton
/// model directory, in that directory (beside `config.pbtxt`).
pub fn profile_dir_of(model: &Path) -> PathBuf {
    if crate::triton_repo::is_model_dir(model) {
        return model.to_path_buf();
    }
    model
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The model file of model `name` in the repository `dir`: `dir/NAME.onnx`, or
/// the version that `dir/NAME/config.pbtxt` serves.
pub fn model_file(dir: &Path, name: &str) -> Result<PathBuf> {
    let flat = dir.join(format!("{name}.onnx"));
    let triton = dir.join(name);
    if !flat.exists() && crate::triton_repo::is_model_dir(&triton) {
        return Ok(crate::triton_repo::load(&triton)?.file);
    }
    Ok(flat)
}

/// The names of the models in the repository `dir` (each `NAME.onnx` and
/// each Triton model directory `NAME/`, ensembles left out), unsorted; none
/// when it cannot be read.
pub fn model_names(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| is_model_entry(p))
        .filter_map(|p| {
            let name = if p.is_file() {
                p.file_stem()
            } else {
                p.file_name()
            };
            name.and_then(|n| n.to_str()).map(str::to_string)
        })
        .collect()
}

/// Whether `p`, an entry of a model repository, is a model: a `NAME.onnx`
/// file or a Triton model directory (not an ensemble's).
fn is_model_entry(p: &Path) -> bool {
    p.extension().and_then(|e| e.to_str()) == Some("onnx") && p.is_file()
        || crate::triton_repo::is_model_dir(p) && !crate::triton_ensemble::is_ensemble_dir(p)
}

/// A fingerprint of model `name`'s files in the repository `dir` (the
/// size and modification time of `NAME.onnx` and `NAME.json`, or of every
/// file of its Triton model directory, two levels deep): it changes when
/// they change. `None` when its model file is not there.
pub fn model_fingerprint(dir: &Path, name: &str) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let file = model_file(dir, name).ok()?;
    if !file.is_file() {
        return None;
    }
    let mut files = vec![file];
    let triton = dir.join(name);
    if crate::triton_repo::is_model_dir(&triton) {
        let mut level = vec![triton];
        for _ in 0..2 {
            let mut next = Vec::new();
            for d in level {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        next.push(p);
                    } else {
                        files.push(p);
                    }
                }
            }
            level = next;
        }
    } else {
        files.push(dir.join(format!("{name}.json")));
    }
    files.sort();
    files.dedup();
    // std's SipHash with fixed keys: the same files give the same value for
    // the life of the process, which is all a change check needs.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in &files {
        f.hash(&mut h);
        if let Ok(md) = std::fs::metadata(f) {
            md.len().hash(&mut h);
            md.modified().ok().hash(&mut h);
        }
    }
    Some(h.finish())
}

/// Loads every model in `dir`, sorted by name, with its metadata and its
/// profile for `executor`: each `NAME.onnx` (with `NAME.json`) and each Triton
/// model directory `NAME/config.pbtxt` ([`crate::triton_repo`]); ensembles
/// are applications, not models ([`crate::triton_ensemble::load_all`]). A model
/// without a profile is refused with the command that makes one; two models of
/// one name are refused.
pub fn load_repository(dir: &Path, executor: &str) -> Result<Vec<RepoModel>> {
    let rd = std::fs::read_dir(dir)
        .with_context(|| format!("reading the model repository {}", dir.display()))?;
    let mut entries: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| is_model_entry(p))
        .collect();
    entries.sort();
    if entries.is_empty() {
        bail!(
            "the model repository {} has no .onnx files and no Triton model directories \
             (MODEL/config.pbtxt); scripts/gen_models.py makes the shipped models",
            dir.display()
        );
    }
    let models: Vec<RepoModel> = entries
        .iter()
        .map(|f| load_model(f, executor))
        .collect::<Result<_>>()?;
    let mut names: Vec<&str> = models.iter().map(|m| m.meta.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        bail!(
            "the model repository {} has two models named {:?} (a NAME.onnx and a Triton \
             directory NAME/?)",
            dir.display(),
            w[0]
        );
    }
    Ok(models)
}

/// Loads one model (its `.onnx` path, or a Triton model directory) with its
/// metadata and profile.
pub fn load_model(onnx: &Path, executor: &str) -> Result<RepoModel> {
    let (meta, file) = if crate::triton_repo::is_model_dir(onnx) {
        let t = crate::triton_repo::load(onnx)?;
        (t.meta, t.file)
    } else {
        (load_meta(onnx)?, onnx.to_path_buf())
    };
    let dir = profile_dir_of(onnx);
    let dir = dir.as_path();
    let pp = profile_path(dir, &meta.name, executor);
    if !pp.exists() {
        bail!(
            "model `{}` has no {executor} latency profile ({} is missing); the scheduler \
             needs one. Make it with: fermata profile --model {} --executor {executor}",
            meta.name,
            pp.display(),
            onnx.display()
        );
    }
    let profile = ProfileFile::load(&pp)?;
    if profile.model != meta.name {
        bail!(
            "{}: the profile is for model {:?}, not {:?}",
            pp.display(),
            profile.model,
            meta.name
        );
    }
    Ok(RepoModel {
        meta,
        file,
        profile,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_slots_round_trip_and_refuse_what_onnx_runtime_cannot_take() {
        let mut b = Vec::new();
        push_bytes_slot(b"cat", &mut b).unwrap();
        push_bytes_slot("ünï".as_bytes(), &mut b).unwrap();
        push_bytes_slot(b"", &mut b).unwrap();
        assert_eq!(b.len(), 3 * BYTES_SLOT);
        assert_eq!(DType::Bytes.size(), BYTES_SLOT);
        let got: Vec<&[u8]> = b.chunks_exact(BYTES_SLOT).map(bytes_of_slot).collect();
        assert_eq!(got, [&b"cat"[..], "ünï".as_bytes(), b""]);
        push_bytes_slot(&[b'x'; BYTES_MAX], &mut b).unwrap();
        let e = push_bytes_slot(&[b'x'; BYTES_MAX + 1], &mut b).unwrap_err();
        assert!(e.contains("253 bytes, over the 252"), "{e}");
        assert!(push_bytes_slot(b"a\0b", &mut b)
            .unwrap_err()
            .contains("NUL"));
        // A length past the slot reads as the whole slot.
        let mut bad = vec![0xff; 4];
        bad.resize(BYTES_SLOT, b'y');
        assert_eq!(bytes_of_slot(&bad).len(), BYTES_MAX);
    }

    #[test]
    fn bytes_is_for_inputs() {
        let j = |out: &str| {
            format!(
                r#"{{"name":"m","inputs":[{{"name":"w","datatype":"BYTES","shape":[-1,1]}}],
                "outputs":[{{"name":"o","datatype":"{out}","shape":[-1,1]}}],"slo_ms":5,"max_batch":4}}"#
            )
        };
        assert!(ModelMeta::from_json(&j("FP32")).is_ok());
        let e = ModelMeta::from_json(&j("BYTES")).unwrap_err().to_string();
        assert!(e.contains("BYTES outputs are not supported"), "{e}");
        let ranged = r#"{"name":"m","inputs":[{"name":"w","datatype":"BYTES","shape":[-1,1],"range":[0,3]}],
            "outputs":[{"name":"o","datatype":"FP32","shape":[-1,1]}],"slo_ms":5,"max_batch":4}"#;
        let e = ModelMeta::from_json(ranged).unwrap_err().to_string();
        assert!(
            e.contains("a range is for integer tensors, not BYTES"),
            "{e}"
        );
    }

    #[test]
    fn buckets_policies_and_choice() {
        assert_eq!(pow2_buckets(64), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(pow2_buckets(48), vec![1, 2, 4, 8, 16, 32, 48]);
        assert_eq!(pow2_buckets(1), vec![1]);
        // The bucket of each batch size: the smallest bucket that holds it.
        let b = pow2_buckets(64);
        for (n, want) in [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (33, 64), (64, 64)] {
            assert_eq!(bucket_of(&b, n), Some(want), "batch {n}");
        }
        assert_eq!(bucket_of(&b, 65), None);
        assert_eq!(normalize_buckets(&[4, 16], 64).unwrap(), vec![4, 16, 64]);
        assert!(normalize_buckets(&[16, 4], 64).is_err());
        assert!(normalize_buckets(&[0, 4], 64).is_err());
        assert!(normalize_buckets(&[4, 128], 64).is_err());
        assert!(normalize_buckets(&[], 64).is_err());
        let mut m = meta();
        m.max_batch = 64;
        assert_eq!(BucketPolicy::Auto.buckets(&m, false).unwrap(), None);
        assert_eq!(
            BucketPolicy::Auto.buckets(&m, true).unwrap(),
            Some(pow2_buckets(64))
        );
        m.batch_buckets = Some(vec![8, 32]);
        m.validate().unwrap();
        assert_eq!(
            BucketPolicy::Auto.buckets(&m, false).unwrap(),
            Some(vec![8, 32, 64])
        );
        assert_eq!(BucketPolicy::Exact.buckets(&m, true).unwrap(), None);
        assert_eq!(
            BucketPolicy::parse("1, 16")
                .unwrap()
                .buckets(&m, true)
                .unwrap(),
            Some(vec![1, 16, 64])
        );
        assert!(BucketPolicy::parse("1,x").is_err());
        m.batch_buckets = Some(vec![32, 8]);
        assert!(m.validate().is_err());
        // From a latency curve: a flat start shares a bucket, a linear tail is cut
        // so that padding never costs more than 10%.
        let lat = |b: u32| if b <= 8 { 2.0 } else { 0.25 * b as f64 };
        let v = buckets_for_waste(lat, 64, 0.1);
        assert_eq!(v.first(), Some(&8), "{v:?}");
        assert_eq!(v.last(), Some(&64));
        for n in 1..=64 {
            let bk = bucket_of(&v, n).unwrap();
            assert!(
                lat(bk) <= 1.1 * lat(n) + 1e-9,
                "batch {n} in bucket {bk}: {v:?}"
            );
        }
    }

    fn meta() -> ModelMeta {
        ModelMeta {
            name: "mlp".into(),
            inputs: vec![TensorMeta {
                name: "x".into(),
                datatype: DType::F32,
                shape: vec![-1, 64],
                range: None,
            }],
            outputs: vec![TensorMeta {
                name: "y".into(),
                datatype: DType::F32,
                shape: vec![-1, 10],
                range: None,
            }],
            slo_ms: 20.0,
            max_batch: 64,
            description: String::new(),
            batch_buckets: None,
        }
    }

    #[test]
    fn meta_sizes_and_checks() {
        let m = meta();
        m.validate().unwrap();
        assert_eq!(m.input_bytes(), 256);
        assert_eq!(m.output_bytes(), 40);
        let text = serde_json::to_string(&m).unwrap();
        assert!(text.contains("\"FP32\""), "{text}");
        assert_eq!(ModelMeta::from_json(&text).unwrap(), m);
        let mut bad = m.clone();
        bad.inputs[0].shape = vec![1, 64];
        assert!(format!("{:#}", bad.validate().unwrap_err()).contains("first dimension"));
        let mut bad = m.clone();
        bad.outputs[0].shape = vec![-1, 0];
        assert!(format!("{:#}", bad.validate().unwrap_err()).contains("positive"));
        let mut bad = m;
        bad.slo_ms = 0.0;
        assert!(format!("{:#}", bad.validate().unwrap_err()).contains("slo_ms"));
        let e = ModelMeta::from_json(
            r#"{"name":"a","inputs":[],"outputs":[],"slo_ms":1,"max_batch":1,"extra":1}"#,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("extra"), "{e:#}");
        assert_eq!(DType::from_kserve("INT64"), Some(DType::I64));
        assert_eq!(DType::from_kserve("FP32").unwrap().kserve_name(), "FP32");
        assert_eq!(DType::from_kserve("float"), None);
        use rand::SeedableRng;
        let rng = |seed| rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
        let x = meta().sample_input(&mut rng(1));
        assert_eq!(x.len(), 256);
        assert_eq!(x, meta().sample_input(&mut rng(1)));
        assert_ne!(x, meta().sample_input(&mut rng(2)));
        assert!(x
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .all(|v| (-1.0..1.0).contains(&v)));
    }

    #[test]
    fn fit_recovers_a_line() {
        let x: Vec<f64> = [1u32, 2, 4, 8, 16, 32, 64]
            .iter()
            .map(|&b| b as f64)
            .collect();
        let y: Vec<f64> = x.iter().map(|b| 0.25 * b + 1.5).collect();
        let f = fit_linear(&x, &y).unwrap();
        assert!((f.alpha_ms - 0.25).abs() < 1e-12 && (f.beta_ms - 1.5).abs() < 1e-12);
        assert!(f.rmse_ms < 1e-12 && f.max_rel_err < 1e-12 && (f.r2 - 1.0).abs() < 1e-12);
        // Noise of +-0.1 ms alternating: the fit stays close and reports the error.
        let yn: Vec<f64> = y
            .iter()
            .enumerate()
            .map(|(i, v)| v + if i % 2 == 0 { 0.1 } else { -0.1 })
            .collect();
        let g = fit_linear(&x, &yn).unwrap();
        assert!((g.alpha_ms - 0.25).abs() < 0.01, "{g:?}");
        assert!((g.beta_ms - 1.5).abs() < 0.1, "{g:?}");
        assert!(g.rmse_ms > 0.05 && g.rmse_ms < 0.11, "{g:?}");
        assert!(g.r2 < 1.0 && g.r2 > 0.99, "{g:?}");
        assert!(fit_linear(&[1.0], &[1.0]).is_err());
        assert!(fit_linear(&[2.0, 2.0], &[1.0, 3.0]).is_err());
        assert!(fit_linear(&[1.0, 2.0], &[1.0]).is_err());
    }

    #[test]
    fn repository_round_trip_and_refusal() {
        let dir = std::env::temp_dir().join(format!("fermata-repo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let m = meta();
        std::fs::write(dir.join("mlp.onnx"), b"not read here").unwrap();
        std::fs::write(dir.join("mlp.json"), serde_json::to_string(&m).unwrap()).unwrap();
        let e = load_repository(&dir, "onnx").unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("no onnx latency profile") && msg.contains("fermata profile --model"),
            "{msg}"
        );
        let x = [1.0, 8.0, 32.0];
        let y = [1.2, 3.0, 9.0];
        let fit = fit_linear(&x, &y).unwrap();
        let p = ProfileFile {
            model: "mlp".into(),
            executor: "onnx".into(),
            device: "test cpu".into(),
            alpha_ms: fit.alpha_ms,
            beta_ms: fit.beta_ms.max(0.0),
            max_batch: 32,
            batch_sizes: vec![1, 8, 32],
            median_ms: y.to_vec(),
            p99_ms: y.iter().map(|v| v * 1.1).collect(),
            repeats: 10,
            fit,
            measured_at: "0".into(),
            buckets: Vec::new(),
            same_shape_median_ms: Vec::new(),
            lanes: 1,
        };
        let pp = profile_path(&dir, "mlp", "onnx");
        assert!(pp.ends_with("mlp.profile-cpu.json"));
        p.save(&pp).unwrap();
        assert_eq!(ProfileFile::load(&pp).unwrap(), p);
        let repo = load_repository(&dir, "onnx").unwrap();
        assert_eq!(repo.len(), 1);
        let spec = repo[0].spec().unwrap();
        assert_eq!(spec.name, "mlp");
        assert_eq!(spec.slo, Dur::from_ms(20));
        assert_eq!(spec.profile.max_batch(), 32);
        // A CUDA profile is a different file.
        assert!(load_repository(&dir, "cuda").is_err());

        // A bucketed profile: the scheduler plans with the step function
        // l(bucket(b)), and the repository's workload carries it.
        let mut stepped = p.clone();
        stepped.buckets = vec![8, 32];
        stepped.same_shape_median_ms = y.to_vec();
        stepped.save(&profile_path(&dir, "mlp", "cuda")).unwrap();
        let repo = load_repository(&dir, "cuda").unwrap();
        let lp = repo[0].spec().unwrap().profile;
        assert_eq!(lp.max_batch(), 32);
        for (b, ms) in [(1, 3.0), (8, 3.0), (9, 9.0), (32, 9.0)] {
            assert_eq!(lp.latency(b), Dur::from_ms_f64(ms), "l({b})");
        }
        // A batch just past a bucket edge costs the next bucket: with 5 ms the
        // largest batch is the edge, 8; with 9 ms all 32 fit.
        assert_eq!(lp.max_batch_within(Dur::from_ms(5), Dur::ZERO, 32), 8);
        assert_eq!(lp.max_batch_within(Dur::from_ms(9), Dur::ZERO, 32), 32);
        let w = crate::workload::Workload::from_repository("t", &repo, 1, 10.0).unwrap();
        assert_eq!(w.models[0].spec.profile, lp);
        // Every bucket must have been measured, and the list must end at max_batch.
        let mut bad = stepped.clone();
        bad.buckets = vec![4, 32];
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("bucket 4 was not measured"), "{e}");
        bad.buckets = vec![8];
        assert!(bad.validate().is_err());
        std::fs::remove_file(profile_path(&dir, "mlp", "cuda")).unwrap();
        // A stem that does not match the name is refused.
        std::fs::rename(dir.join("mlp.json"), dir.join("other.json")).unwrap();
        std::fs::rename(dir.join("mlp.onnx"), dir.join("other.onnx")).unwrap();
        let e = load_repository(&dir, "onnx").unwrap_err();
        assert!(format!("{e:#}").contains("file stem"), "{e:#}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn integer_ranges_are_checked_and_only_integers_have_one() {
        let t = |dt: &str, range: &str| {
            format!(
                r#"{{"name":"m","inputs":[{{"name":"ids","datatype":"{dt}","shape":[-1,3]{range}}}],
                "outputs":[{{"name":"o","datatype":"FP32","shape":[-1,1]}}],"slo_ms":5,"max_batch":4}}"#
            )
        };
        let m = ModelMeta::from_json(&t("INT64", r#","range":[0,31]"#)).unwrap();
        let ids = &m.inputs[0];
        let bytes = |v: [i64; 3]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(ids.out_of_range(&bytes([0, 31, 5])), None);
        assert_eq!(ids.out_of_range(&bytes([0, 32, -1])), Some((1, 32)));
        assert_eq!(ids.out_of_range(&bytes([-1, 0, 0])), Some((0, -1)));
        let m = ModelMeta::from_json(&t("INT32", r#","range":[-2,2]"#)).unwrap();
        let b: Vec<u8> = [1i32, -3, 0].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(m.inputs[0].out_of_range(&b), Some((1, -3)));
        // No range: nothing is out of it.
        let m = ModelMeta::from_json(&t("INT64", "")).unwrap();
        assert_eq!(m.inputs[0].out_of_range(&bytes([1 << 40, 0, 0])), None);
        let e = ModelMeta::from_json(&t("FP32", r#","range":[0,1]"#)).unwrap_err();
        assert!(
            format!("{e:#}").contains("a range is for integer tensors"),
            "{e:#}"
        );
        let e = ModelMeta::from_json(&t("INT64", r#","range":[3,1]"#)).unwrap_err();
        assert!(format!("{e:#}").contains("range [3, 1] is empty"), "{e:#}");
        // Sample inputs stay inside the range.
        let m = ModelMeta::from_json(&t("INT64", r#","range":[100,101]"#)).unwrap();
        use rand::SeedableRng;
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(1);
        for _ in 0..20 {
            assert_eq!(m.inputs[0].out_of_range(&m.sample_input(&mut rng)), None);
        }
    }
}
