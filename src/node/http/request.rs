//! An inference request's JSON body, checked against the model (tensor names,
//! datatypes, shapes, byte counts; errors name the field) and turned into the
//! model's request bytes: each input tensor's raw little-endian sample bytes in
//! the model's input order, from JSON `data` or the binary tensor extension.
//!
//! A sample of one input sent as binary data is a view of the request's body,
//! not a copy of it: the frontend copies it once, into its input region (a
//! 224×224 FP32 image is 588 KiB, and a pass over it is a share of the
//! request's CPU that `scripts/large_input_cpu.py` measures).

use super::errors::{bad, Fail};
use super::tensor::{encode_elem, shape_text, JsonElems};
use crate::core::Dur;
use crate::repo::{push_bytes_slot, DType, ModelMeta, TensorMeta, BYTES_SLOT};
use bytes::Bytes;
use hyper::StatusCode;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The largest `parameters.timeout` accepted (microseconds): one hour.
pub const MAX_TIMEOUT_US: u64 = 3_600_000_000;

// The request's JSON is parsed under a budget ([`budget`]) so that what the
// parser holds stays within a small multiple of the body: tensor data at most
// the model's elements (plus slack), lists and parameter maps at most
// [`budget::ENTRIES`] entries in all, and a parameter that is an array or
// object kept as a short placeholder, not as a tree of values; `id` must be a
// string (the protocol's type; Triton answers 400 for another), or null.
#[derive(Deserialize)]
pub(in crate::node) struct InferRequest {
    #[serde(default, deserialize_with = "budget::id")]
    pub(in crate::node) id: Option<Value>,
    #[serde(default, deserialize_with = "budget::params")]
    pub(in crate::node) parameters: Option<Map<String, Value>>,
    #[serde(deserialize_with = "budget::list")]
    pub(in crate::node) inputs: Vec<InputTensor>,
    #[serde(default, deserialize_with = "budget::opt_list")]
    pub(in crate::node) outputs: Option<Vec<OutputRequest>>,
}

#[derive(Deserialize)]
pub(in crate::node) struct InputTensor {
    pub(in crate::node) name: String,
    #[serde(deserialize_with = "budget::list")]
    pub(in crate::node) shape: Vec<i64>,
    pub(in crate::node) datatype: String,
    #[serde(default, deserialize_with = "budget::params")]
    pub(in crate::node) parameters: Option<Map<String, Value>>,
    #[serde(default)]
    data: Option<JsonElems>,
}

impl InputTensor {
    /// An input whose data is `bytes` bytes of the binary part (the gRPC
    /// API's raw or typed contents, as little-endian bytes).
    pub(in crate::node) fn binary(
        name: String,
        datatype: String,
        shape: Vec<i64>,
        mut parameters: Map<String, Value>,
        bytes: usize,
    ) -> InputTensor {
        parameters.insert("binary_data_size".into(), Value::from(bytes as u64));
        InputTensor {
            name,
            shape,
            datatype,
            parameters: Some(parameters),
            data: None,
        }
    }
}

#[derive(Deserialize)]
pub(in crate::node) struct OutputRequest {
    pub(in crate::node) name: String,
    #[serde(default, deserialize_with = "budget::params")]
    pub(in crate::node) parameters: Option<Map<String, Value>>,
}

/// A checked request.
pub(in crate::node) struct Decoded {
    /// Each sample's request bytes (a request with a batch dimension of N has
    /// N; each becomes its own task). A sample of one binary input is a
    /// view of the body's bytes.
    pub(in crate::node) samples: Vec<Bytes>,
    pub(in crate::node) slo: Dur,
    pub(in crate::node) id: Option<Value>,
    /// The outputs to return, in the order asked.
    pub(in crate::node) outputs: Vec<OutSpec>,
}

/// An output to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::node) struct OutSpec {
    /// Its index in the model's outputs.
    pub(in crate::node) index: usize,
    /// As binary data after the JSON header.
    pub(in crate::node) binary: bool,
    /// Triton's classification extension (`parameters.classification`, the
    /// clients' `class_count`): the top k elements of each sample as `BYTES`
    /// "value:index" strings instead of the tensor.
    pub(in crate::node) classes: Option<usize>,
}

/// An input's parameters understood.
const INPUT_PARAMS: &[&str] = &["binary_data_size"];
/// An output's parameters understood.
const OUTPUT_PARAMS: &[&str] = &["binary_data", "classification"];

/// Refuses any parameter of `p` (at `what`) outside `known`, naming it and,
/// for the ones other servers know, why Fermata does not take it: a client
/// asking for something is told, not silently served without it.
fn check_params(p: &Option<Map<String, Value>>, known: &[&str], what: &str) -> Result<(), Fail> {
    let Some(p) = p else { return Ok(()) };
    for k in p.keys() {
        if known.contains(&k.as_str()) {
            continue;
        }
        let why = match k.as_str() {
            k if k.starts_with("shared_memory_") => {
                "shared memory is not supported: send the tensor's data in the request"
            }
            _ => "unknown parameter",
        };
        let known = known
            .iter()
            .map(|k| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(bad(format!(
            "{what}.parameters.{k} is not supported ({why}); supported here: {known}"
        )));
    }
    Ok(())
}

/// Checks a request's parameters. `timeout` and `binary_data_output` are
/// read where they act. `priority`, `sequence_id`, `sequence_start` and
/// `sequence_end` are checked for the types Triton gives them and have no
/// effect, as in Triton for a model without priority levels and without a
/// sequence batcher: every request is at the default level (requests are
/// ordered by their deadlines) and every model is stateless. Other (custom)
/// parameters are taken and ignored, as Triton hands them to the model's
/// backend and ONNX Runtime's ignores them; those naming shared memory are
/// refused, since Fermata does not read it and serving without it would
/// answer for the wrong tensor.
fn check_request_params(p: &Option<Map<String, Value>>) -> Result<(), Fail> {
    let Some(p) = p else { return Ok(()) };
    for (k, v) in p {
        let ok = match k.as_str() {
            "priority" => v.as_u64().is_some(),
            "sequence_id" => v.as_u64().is_some() || v.is_string(),
            "sequence_start" | "sequence_end" => v.is_boolean(),
            k if k.starts_with("shared_memory_") => {
                return Err(bad(format!(
                    "request.parameters.{k} is not supported (shared memory is not supported: \
                     send the tensor's data in the request)"
                )))
            }
            _ => true,
        };
        if !ok {
            let want = match k.as_str() {
                "priority" => "an unsigned integer",
                "sequence_id" => "an unsigned integer or a string",
                _ => "true or false",
            };
            return Err(bad(format!(
                "request.parameters.{k} must be {want}, got {v}"
            )));
        }
    }
    Ok(())
}

/// The most samples one request may carry: the model's largest batch.
fn max_samples(meta: &ModelMeta) -> usize {
    meta.max_batch.max(1) as usize
}

fn param_bool(p: &Option<Map<String, Value>>, key: &str, what: &str) -> Result<Option<bool>, Fail> {
    match p.as_ref().and_then(|p| p.get(key)) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(bad(format!(
            "{what}.parameters.{key} must be true or false, got {v}"
        ))),
    }
}

/// The tensors' names, for messages.
fn names(ts: &[TensorMeta]) -> String {
    ts.iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks an inference request against the model and builds its samples'
/// request bytes.
pub(super) fn decode_request(
    meta: &ModelMeta,
    head: &[u8],
    bin: &Bytes,
    max_tensor: usize,
) -> Result<Decoded, Fail> {
    let total: usize = meta.inputs.iter().map(|t| t.sample_elems()).sum();
    let req: InferRequest = budget::parse(head, total.saturating_mul(max_samples(meta)))?;
    decode_parsed(meta, req, bin, max_tensor)
}

/// Checks a parsed request (JSON's, or the gRPC API's with every input in
/// the binary part `bin`) against the model and builds its samples.
pub(in crate::node) fn decode_parsed(
    meta: &ModelMeta,
    req: InferRequest,
    bin: &Bytes,
    max_tensor: usize,
) -> Result<Decoded, Fail> {
    check_request_params(&req.parameters)?;
    let slo = slo_param(&req.parameters)?;
    let all_binary = param_bool(&req.parameters, "binary_data_output", "request")?.unwrap_or(false);
    let samples = decode_inputs(meta, &req.inputs, bin, max_tensor)?;
    let outputs = requested_outputs(meta, req.outputs.as_deref(), all_binary)?;
    Ok(Decoded {
        samples,
        slo,
        id: req.id,
        outputs,
    })
}

/// A raw binary body (`Inference-Header-Content-Length: 0`, Triton's binary
/// extension without a JSON header): the whole body is the data of the
/// model's one input, as many samples as it holds; every output is returned
/// as binary data.
pub(super) fn decode_raw(meta: &ModelMeta, body: &Bytes) -> Result<Decoded, Fail> {
    let [t] = meta.inputs.as_slice() else {
        return Err(bad(format!(
            "a raw binary body (Inference-Header-Content-Length: 0) is the data of a model's only input, but model `{}` has {} inputs ({}): send a JSON header",
            meta.name,
            meta.inputs.len(),
            names(&meta.inputs)
        )));
    };
    if t.datatype == DType::Bytes {
        return raw_bytes_element(meta, t, body);
    }
    let sb = t.sample_bytes();
    let n = match body.len().checked_div(sb) {
        Some(n) if n > 0 && body.len().is_multiple_of(sb) => n,
        _ => {
            return Err(bad(format!(
                "a raw binary body of {} bytes is not a whole number of samples of input `{}` ({} {}: {sb} bytes each)",
                body.len(),
                t.name,
                shape_text(t.sample_shape()),
                t.datatype.kserve_name()
            )))
        }
    };
    if n > max_samples(meta) {
        return Err(bad(format!(
            "a raw binary body of {n} samples is over the model's max_batch_size {}",
            max_samples(meta)
        )));
    }
    if let (Some((i, v)), Some([lo, hi])) = (t.out_of_range(body), t.range) {
        return Err(bad(format!(
            "input `{}`: element {i} is {v}, outside the model's range [{lo}, {hi}]",
            t.name
        )));
    }
    Ok(raw_decoded(
        meta,
        (0..n).map(|j| body.slice(j * sb..(j + 1) * sb)).collect(),
    ))
}

/// A raw body's request: these samples, the model's SLO, every output as
/// binary data.
fn raw_decoded(meta: &ModelMeta, samples: Vec<Bytes>) -> Decoded {
    Decoded {
        samples,
        slo: Dur::ZERO,
        id: None,
        outputs: (0..meta.outputs.len())
            .map(|index| OutSpec {
                index,
                binary: true,
                classes: None,
            })
            .collect(),
    }
}

/// A raw body for a BYTES input: the body is one element (as Triton takes
/// it), so the input must hold one element per sample; one sample.
fn raw_bytes_element(meta: &ModelMeta, t: &TensorMeta, body: &[u8]) -> Result<Decoded, Fail> {
    if t.sample_elems() != 1 {
        return Err(bad(format!(
            "a raw binary body for BYTES input `{}` is one element, but the input holds {} per sample (shape {}): send a JSON header",
            t.name,
            t.sample_elems(),
            shape_text(&t.shape)
        )));
    }
    let mut sample = Vec::with_capacity(t.sample_bytes());
    push_bytes_slot(body, &mut sample)
        .map_err(|e| bad(format!("input `{}`: the raw body is {e}", t.name)))?;
    Ok(raw_decoded(meta, vec![sample.into()]))
}

/// The SLO: parameters.timeout in microseconds (Triton's unit); 0 or absent:
/// the model's default.
fn slo_param(p: &Option<Map<String, Value>>) -> Result<Dur, Fail> {
    match p.as_ref().and_then(|p| p.get("timeout")) {
        None => Ok(Dur::ZERO),
        Some(v) => match v.as_u64() {
            Some(us) if us <= MAX_TIMEOUT_US => Ok(Dur::from_us(us as i64)),
            _ => Err(bad(format!(
                "parameters.timeout must be an integer number of microseconds from 0 to {MAX_TIMEOUT_US}, got {v}"
            ))),
        },
    }
}

/// Each sample's request bytes: every model input's data, found by name, cut
/// into samples and joined in the model's input order; `bin` is the binary
/// data after the JSON header. Every input carries the same number of samples.
fn decode_inputs(
    meta: &ModelMeta,
    inputs: &[InputTensor],
    bin: &Bytes,
    max_tensor: usize,
) -> Result<Vec<Bytes>, Fail> {
    let mut parts: Vec<Option<Bytes>> = vec![None; meta.inputs.len()];
    let mut bin_at = 0usize;
    let mut batch: Option<(usize, usize)> = None;
    for (k, t) in inputs.iter().enumerate() {
        let mi = match_input(meta, &parts, k, t)?;
        let want = &meta.inputs[mi];
        check_params(&t.parameters, INPUT_PARAMS, &format!("inputs[{k}]"))?;
        let dt = check_datatype(want, k, t)?;
        let (n, expect) = check_shape(want, dt, (k, t), max_tensor, max_samples(meta))?;
        match batch {
            Some((b, first)) if b != n => {
                return Err(bad(format!(
                    "input `{}`: batch dimension {n} (inputs[{k}].shape[0]), but input `{}` has {b}: every input carries the same samples",
                    t.name, inputs[first].name
                )))
            }
            _ => batch = Some((n, k)),
        }
        let data = match data_of(k, t)? {
            Data::Binary(size) => binary_data(want, &expect, t, size, bin, &mut bin_at)?,
            Data::Json(v) => json_data(want, dt, &expect, k, t, v)?.into(),
        };
        if let (Some((i, v)), Some([lo, hi])) = (want.out_of_range(&data), want.range) {
            return Err(bad(format!(
                "input `{}`: element {i} is {v}, outside the model's range [{lo}, {hi}]",
                t.name
            )));
        }
        parts[mi] = Some(data);
    }
    if bin_at != bin.len() {
        return Err(bad(format!(
            "{} bytes of binary data after the JSON header, but the inputs' parameters.binary_data_size add up to {bin_at}",
            bin.len()
        )));
    }
    let mut all = Vec::with_capacity(parts.len());
    for (t, p) in meta.inputs.iter().zip(parts) {
        match p {
            Some(b) => all.push(b),
            None => {
                return Err(bad(format!(
                    "missing input `{}`; the model's inputs are: {}",
                    t.name,
                    names(&meta.inputs)
                )))
            }
        }
    }
    let n = batch.map_or(1, |(n, _)| n);
    if let [one] = all.as_slice() {
        // One input: each sample is a view of its data.
        let sb = meta.inputs[0].sample_bytes();
        if n == 1 {
            return Ok(vec![one.clone()]);
        }
        return Ok((0..n).map(|j| one.slice(j * sb..(j + 1) * sb)).collect());
    }
    Ok((0..n)
        .map(|j| {
            let mut s = Vec::with_capacity(meta.input_bytes());
            for (t, b) in meta.inputs.iter().zip(&all) {
                let sb = t.sample_bytes();
                s.extend_from_slice(&b[j * sb..(j + 1) * sb]);
            }
            Bytes::from(s)
        })
        .collect())
}

/// The index of the model's input that `t` (`inputs[k]`) names, not given before.
fn match_input(
    meta: &ModelMeta,
    parts: &[Option<Bytes>],
    k: usize,
    t: &InputTensor,
) -> Result<usize, Fail> {
    let Some(mi) = meta.inputs.iter().position(|x| x.name == t.name) else {
        return Err(bad(format!(
            "unknown input `{}` (inputs[{k}].name); the model's inputs are: {}",
            t.name,
            names(&meta.inputs)
        )));
    };
    if parts[mi].is_some() {
        return Err(bad(format!(
            "input `{}` is given twice (inputs[{k}])",
            t.name
        )));
    }
    Ok(mi)
}

/// `t`'s datatype, which must be the model's.
fn check_datatype(want: &TensorMeta, k: usize, t: &InputTensor) -> Result<DType, Fail> {
    let dt = DType::from_kserve(&t.datatype).ok_or_else(|| {
        bad(format!(
            "input `{}`: unknown datatype `{}` (inputs[{k}].datatype)",
            t.name, t.datatype
        ))
    })?;
    if dt != want.datatype {
        return Err(bad(format!(
            "input `{}`: datatype {} (inputs[{k}].datatype), the model expects {}",
            t.name,
            t.datatype,
            want.datatype.kserve_name()
        )));
    }
    Ok(dt)
}

/// Checks `t` (`inputs[k]`)'s shape: its size first (bounded before anything
/// is allocated), then a batch dimension of 1 to `max_samples` followed by
/// one sample of the model's input; returns the batch and that shape.
fn check_shape(
    want: &TensorMeta,
    dt: DType,
    (k, t): (usize, &InputTensor),
    max_tensor: usize,
    max_samples: usize,
) -> Result<(usize, Vec<i64>), Fail> {
    let mut elems: u64 = 1;
    for &d in &t.shape {
        if d < 0 {
            return Err(bad(format!(
                "input `{}`: negative dimension in shape {} (inputs[{k}].shape)",
                t.name,
                shape_text(&t.shape)
            )));
        }
        elems = elems.checked_mul(d as u64).ok_or_else(|| {
            bad(format!(
                "input `{}`: shape {} has more elements than fit in 64 bits (inputs[{k}].shape)",
                t.name,
                shape_text(&t.shape)
            ))
        })?;
    }
    let bytes = elems.checked_mul(dt.size() as u64).ok_or_else(|| {
        bad(format!(
            "input `{}`: shape {} has more bytes than fit in 64 bits (inputs[{k}].shape)",
            t.name,
            shape_text(&t.shape)
        ))
    })?;
    if bytes > max_tensor as u64 {
        return Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "input `{}`: shape {} is {bytes} bytes, over the limit of {max_tensor} bytes per tensor (--http-max-tensor-bytes)",
                t.name,
                shape_text(&t.shape)
            ),
        ));
    }
    let n = t.shape.first().copied().unwrap_or(1);
    let mut expect = vec![n];
    expect.extend_from_slice(want.sample_shape());
    if t.shape != expect {
        return Err(bad(format!(
            "input `{}`: shape {} (inputs[{k}].shape), expected {} (a batch dimension, then the model's sample shape)",
            t.name,
            shape_text(&t.shape),
            shape_text(&expect)
        )));
    }
    if n == 0 {
        return Err(bad(format!(
            "input `{}`: batch dimension 0 (inputs[{k}].shape[0]): a request carries at least one sample",
            t.name
        )));
    }
    if n as usize > max_samples {
        return Err(bad(format!(
            "input `{}`: batch dimension {n} (inputs[{k}].shape[0]) is over the model's max_batch_size {max_samples}",
            t.name
        )));
    }
    Ok((n as usize, expect))
}

/// Where an input tensor's data is.
enum Data<'a> {
    /// `parameters.binary_data_size` bytes of the binary data.
    Binary(u64),
    /// JSON `data`.
    Json(&'a JsonElems),
}

/// Where `t`'s data is: JSON `data` or binary (exactly one of them).
fn data_of(k: usize, t: &InputTensor) -> Result<Data<'_>, Fail> {
    let bin_size = match t
        .parameters
        .as_ref()
        .and_then(|p| p.get("binary_data_size"))
    {
        None => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            bad(format!(
                "input `{}`: parameters.binary_data_size must be a byte count, got {v}",
                t.name
            ))
        })?),
    };
    match (bin_size, &t.data) {
        (Some(_), Some(_)) => Err(bad(format!(
            "input `{}`: both `data` and parameters.binary_data_size are given",
            t.name
        ))),
        (None, None) => Err(bad(format!(
            "input `{}`: no `data` and no parameters.binary_data_size (inputs[{k}])",
            t.name
        ))),
        (Some(n), None) => Ok(Data::Binary(n)),
        (None, Some(v)) => Ok(Data::Json(v)),
    }
}

/// `t`'s `n` bytes from the binary data at `bin_at` (moved past them); a BYTES
/// input's as slots.
fn binary_data(
    want: &TensorMeta,
    expect: &[i64],
    t: &InputTensor,
    n: u64,
    bin: &Bytes,
    bin_at: &mut usize,
) -> Result<Bytes, Fail> {
    let left = bin.len() - *bin_at;
    if n > left as u64 {
        return Err(bad(format!(
            "input `{}`: parameters.binary_data_size is {n} but only {left} bytes of binary data are left after the JSON header",
            t.name
        )));
    }
    let data = &bin[*bin_at..*bin_at + n as usize];
    if want.datatype == DType::Bytes {
        let out = bytes_slots(want, expect, t, data)?;
        *bin_at += data.len();
        return Ok(out.into());
    }
    let need = want.sample_bytes() * expect[0] as usize;
    if data.len() != need {
        return Err(bad(format!(
            "input `{}`: parameters.binary_data_size is {n} bytes, the tensor {} {} needs {need}",
            t.name,
            shape_text(expect),
            want.datatype.kserve_name()
        )));
    }
    let at = *bin_at;
    *bin_at += need;
    Ok(bin.slice(at..at + need))
}

/// A BYTES input's binary data: its elements as the binary tensor extension
/// has them (each a u32 little-endian length, then its bytes), as slots.
fn bytes_slots(
    want: &TensorMeta,
    expect: &[i64],
    t: &InputTensor,
    mut data: &[u8],
) -> Result<Vec<u8>, Fail> {
    let need = want.sample_elems() * expect[0] as usize;
    let mut out = Vec::with_capacity(need * BYTES_SLOT);
    for j in 0..need {
        let Some((len, rest)) = data.split_first_chunk::<4>() else {
            return Err(bad(format!(
                "input `{}`: the BYTES data ends after {j} elements, the shape {} needs {need} (each a 4-byte length, then its bytes)",
                t.name,
                shape_text(expect)
            )));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if len > rest.len() {
            return Err(bad(format!(
                "input `{}`: BYTES element {j} says {len} bytes, {} are left",
                t.name,
                rest.len()
            )));
        }
        push_bytes_slot(&rest[..len], &mut out)
            .map_err(|e| bad(format!("input `{}`: BYTES element {j} is {e}", t.name)))?;
        data = &rest[len..];
    }
    if !data.is_empty() {
        return Err(bad(format!(
            "input `{}`: {} bytes of BYTES data are left after the {need} elements the shape {} holds",
            t.name,
            data.len(),
            shape_text(expect)
        )));
    }
    Ok(out)
}

/// `t`'s JSON `data` (nested arrays, row-major) as bytes of `dt`.
fn json_data(
    want: &TensorMeta,
    dt: DType,
    expect: &[i64],
    k: usize,
    t: &InputTensor,
    v: &JsonElems,
) -> Result<Vec<u8>, Fail> {
    let flat = &v.elems;
    let need = want.sample_elems() * expect[0] as usize;
    if flat.len() != need {
        return Err(bad(format!(
            "input `{}`: `data` has {} elements (inputs[{k}].data), the shape {} needs {}",
            t.name,
            flat.len(),
            shape_text(expect),
            need
        )));
    }
    let mut out = Vec::with_capacity(need * dt.size());
    if dt == DType::Bytes {
        for (j, &e) in flat.iter().enumerate() {
            let Some(st) = v.as_str(e) else {
                return Err(bad(format!(
                    "input `{}`: element {j} of `data` is {}, not a string (BYTES)",
                    t.name,
                    v.shown(e)
                )));
            };
            push_bytes_slot(st.as_bytes(), &mut out)
                .map_err(|e| bad(format!("input `{}`: element {j} of `data` is {e}", t.name)))?;
        }
        return Ok(out);
    }
    for (j, &e) in flat.iter().enumerate() {
        encode_elem(dt, e, &mut out).ok_or_else(|| {
            bad(format!(
                "input `{}`: element {j} of `data` is {}, not a valid {}",
                t.name,
                v.shown(e),
                dt.kserve_name()
            ))
        })?;
    }
    Ok(out)
}

/// The outputs to return (all when none are named), each as binary or not,
/// as a tensor or its top classes; an output asked twice is refused.
fn requested_outputs(
    meta: &ModelMeta,
    outputs: Option<&[OutputRequest]>,
    all_binary: bool,
) -> Result<Vec<OutSpec>, Fail> {
    let Some(os) = outputs else {
        return Ok((0..meta.outputs.len())
            .map(|index| OutSpec {
                index,
                binary: all_binary,
                classes: None,
            })
            .collect());
    };
    let mut v: Vec<OutSpec> = Vec::new();
    for (k, o) in os.iter().enumerate() {
        let Some(index) = meta.outputs.iter().position(|x| x.name == o.name) else {
            return Err(bad(format!(
                "unknown output `{}` (outputs[{k}].name); the model's outputs are: {}",
                o.name,
                names(&meta.outputs)
            )));
        };
        if v.iter().any(|s| s.index == index) {
            return Err(bad(format!(
                "output `{}` is requested twice (outputs[{k}])",
                o.name
            )));
        }
        let what = format!("outputs[{k}]");
        check_params(&o.parameters, OUTPUT_PARAMS, &what)?;
        let binary = param_bool(&o.parameters, "binary_data", &what)?.unwrap_or(all_binary);
        let classes = match o.parameters.as_ref().and_then(|p| p.get("classification")) {
            None => None,
            Some(c) => match c.as_u64() {
                Some(n) if n >= 1 => Some((n as usize).min(meta.outputs[index].sample_elems())),
                _ => {
                    return Err(bad(format!(
                        "{what}.parameters.classification must be a positive number of classes, got {c}"
                    )))
                }
            },
        };
        v.push(OutSpec {
            index,
            binary,
            classes,
        });
    }
    Ok(v)
}

/// What parsing a request's JSON may hold, per thread (the parse runs on one).
pub(super) mod budget {
    use super::{bad, Fail};
    use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use serde::{Deserialize, Deserializer};
    use serde_json::{Map, Value};
    use std::cell::Cell;
    use std::fmt;

    /// List entries and parameters in one request, in all (a request names a
    /// few tensors with a few parameters each).
    pub const ENTRIES: u32 = 1024;
    /// Tensor elements beyond the model's, so that an input with a few too
    /// many is still named in the error.
    pub const SLACK_ELEMS: usize = 4096;

    #[derive(Clone, Copy)]
    struct Left {
        elems: usize,
        entries: u32,
    }

    thread_local! {
        /// None: no budget (outside [`parse`]).
        static LEFT: Cell<Option<Left>> = const { Cell::new(None) };
        /// What ran out, when something did.
        static SPENT: Cell<Option<&'static str>> = const { Cell::new(None) };
    }

    /// Parses `head` as `T` holding at most `elems` (+ [`SLACK_ELEMS`]) tensor
    /// elements and [`ENTRIES`] entries.
    pub(in super::super) fn parse<T: for<'de> Deserialize<'de>>(
        head: &[u8],
        elems: usize,
    ) -> Result<T, Fail> {
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                LEFT.with(|l| l.set(None));
            }
        }
        let _reset = Reset;
        LEFT.with(|l| {
            l.set(Some(Left {
                elems: elems.saturating_add(SLACK_ELEMS),
                entries: ENTRIES,
            }))
        });
        SPENT.with(|s| s.set(None));
        serde_json::from_slice(head).map_err(|e| match SPENT.with(|s| s.take()) {
            Some("elems") => bad(format!(
                "the inputs' `data` hold more elements than a request of the model may carry ({elems} in all, at its max_batch_size)"
            )),
            Some(_) => bad(format!(
                "the request has more than {ENTRIES} list entries and parameters in all"
            )),
            // serde_json's recursion limit (128 levels) bounds the stack a
            // nested body can take; say so rather than "recursion limit".
            None if e.to_string().starts_with("recursion limit exceeded") => bad(format!(
                "malformed JSON request: nested deeper than 128 levels ({e})"
            )),
            None => bad(format!("malformed JSON request: {e}")),
        })
    }

    fn take<E: de::Error>(what: &'static str) -> Result<(), E> {
        let ok = LEFT.with(|l| match l.get() {
            None => true,
            Some(mut left) => {
                let ok = if what == "elems" {
                    left.elems.checked_sub(1).map(|n| left.elems = n).is_some()
                } else {
                    left.entries
                        .checked_sub(1)
                        .map(|n| left.entries = n)
                        .is_some()
                };
                l.set(Some(left));
                ok
            }
        });
        if ok {
            Ok(())
        } else {
            SPENT.with(|s| s.set(Some(what)));
            Err(E::custom(format!("over the request's budget of {what}")))
        }
    }

    /// One tensor element from the budget.
    pub(in super::super) fn take_elem<E: de::Error>() -> Result<(), E> {
        take("elems")
    }

    /// A list, one entry from the budget per element.
    pub fn list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Vec<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
                let mut v = Vec::new();
                loop {
                    take::<A::Error>("entries")?;
                    match seq.next_element()? {
                        Some(x) => v.push(x),
                        None => return Ok(v),
                    }
                }
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }

    /// [`list`], or null.
    pub fn opt_list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Option<Vec<T>>, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Option<Vec<T>>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array or null")
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                list(d).map(Some)
            }
        }
        d.deserialize_option(V(std::marker::PhantomData))
    }

    /// A scalar kept as it is; an array or object skipped (nothing held) and
    /// kept as a placeholder string, which any check of the value refuses.
    struct Scalar;

    impl<'de> DeserializeSeed<'de> for Scalar {
        type Value = Value;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Scalar {
        type Value = Value;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a value")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Value::String("(an array)".into()))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Value::String("(an object)".into()))
        }
    }

    /// `id`: a string, or null (no id); anything else is an error at once
    /// (an array or object is not parsed into a tree first).
    pub fn id<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Option<Value>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("the request `id` to be a string")
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Some(Value::String(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Some(Value::String(v)))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
        }
        d.deserialize_any(V)
    }

    /// A `parameters` object: each entry from the budget, each value a
    /// [`Scalar`]; null is no parameters.
    pub fn params<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Map<String, Value>>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Option<Map<String, Value>>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of parameters")
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut m = Map::new();
                loop {
                    take::<A::Error>("entries")?;
                    let Some(k) = map.next_key::<String>()? else {
                        return Ok(Some(m));
                    };
                    let v = map.next_value_seed(Scalar)?;
                    m.insert(k, v);
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ModelMeta {
        ModelMeta::from_json(
            r#"{"name":"m","inputs":[{"name":"x","datatype":"FP32","shape":[-1,2,2]},{"name":"ids","datatype":"INT64","shape":[-1,1]}],
               "outputs":[{"name":"y","datatype":"INT64","shape":[-1,2]}],"slo_ms":20,"max_batch":8}"#,
        )
        .unwrap()
    }

    #[test]
    fn json_inputs_become_request_bytes_in_model_order() {
        let m = meta();
        let body = br#"{"id":"a","parameters":{"timeout":1500},"inputs":[
            {"name":"ids","shape":[1,1],"datatype":"INT64","data":[-7]},
            {"name":"x","shape":[1,2,2],"datatype":"FP32","data":[[1,2],[3.5,4]]}]}"#;
        let d =
            decode_request(&m, body, &Bytes::new(), 1 << 20).unwrap_or_else(|e| panic!("{e:?}"));
        let mut want = Vec::new();
        for f in [1.0f32, 2.0, 3.5, 4.0] {
            want.extend_from_slice(&f.to_le_bytes());
        }
        want.extend_from_slice(&(-7i64).to_le_bytes());
        assert_eq!(d.samples, vec![want]);
        assert_eq!(d.slo, Dur(1_500_000));
        assert_eq!(
            d.outputs,
            vec![OutSpec {
                index: 0,
                binary: false,
                classes: None
            }]
        );
    }

    #[test]
    fn a_batch_dimension_makes_one_sample_per_row() {
        let m = meta();
        let body = br#"{"inputs":[
            {"name":"ids","shape":[2,1],"datatype":"INT64","data":[5,6]},
            {"name":"x","shape":[2,2,2],"datatype":"FP32","data":[1,2,3,4,5,6,7,8]}],
            "outputs":[{"name":"y","parameters":{"classification":5,"binary_data":true}}]}"#;
        let d =
            decode_request(&m, body, &Bytes::new(), 1 << 20).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(d.samples.len(), 2);
        let row = |xs: [f32; 4], id: i64| {
            let mut v: Vec<u8> = xs.iter().flat_map(|f| f.to_le_bytes()).collect();
            v.extend_from_slice(&id.to_le_bytes());
            v
        };
        assert_eq!(d.samples[0], row([1.0, 2.0, 3.0, 4.0], 5));
        assert_eq!(d.samples[1], row([5.0, 6.0, 7.0, 8.0], 6));
        // The top 5 of an output of 2 elements are its 2.
        assert_eq!(
            d.outputs,
            vec![OutSpec {
                index: 0,
                binary: true,
                classes: Some(2)
            }]
        );
        // Inputs with different batches, a batch of 0 and one over max_batch 8.
        let e = refused(
            r#"{"inputs":[{"name":"ids","shape":[2,1],"datatype":"INT64","data":[5,6]},
            {"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}]}"#,
        );
        assert!(
            e.1.contains("batch dimension 1") && e.1.contains("`ids` has 2"),
            "{e:?}"
        );
        let e =
            refused(r#"{"inputs":[{"name":"ids","shape":[0,1],"datatype":"INT64","data":[]}]}"#);
        assert!(e.1.contains("batch dimension 0"), "{e:?}");
        let e = refused(
            r#"{"inputs":[{"name":"ids","shape":[9,1],"datatype":"INT64","data":[1,1,1,1,1,1,1,1,1]}]}"#,
        );
        assert!(e.1.contains("over the model's max_batch_size 8"), "{e:?}");
    }

    #[test]
    fn parameters_are_taken_as_triton_takes_them_and_bad_ones_refused_by_name() {
        let ok_in = r#"{"name":"ids","shape":[1,1],"datatype":"INT64","data":[1]},{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}"#;
        // A stateless model without priority levels: sequence ids,
        // priorities and custom parameters are taken, without effect.
        for p in [
            r#"{"sequence_id":7,"sequence_start":true,"sequence_end":false}"#,
            r#"{"sequence_id":"client-a"}"#,
            r#"{"priority":1}"#,
            r#"{"my_knob":1,"note":"x"}"#,
        ] {
            let body = format!(r#"{{"inputs":[{ok_in}],"parameters":{p}}}"#);
            decode_request(&meta(), body.as_bytes(), &Bytes::new(), 1 << 20)
                .unwrap_or_else(|e| panic!("{p}: {e:?}"));
        }
        for (p, want) in [
            (
                r#"{"priority":-1}"#,
                "request.parameters.priority must be an unsigned integer",
            ),
            (
                r#"{"priority":"high"}"#,
                "request.parameters.priority must be an unsigned integer",
            ),
            (
                r#"{"sequence_id":1.5}"#,
                "request.parameters.sequence_id must be an unsigned integer or a string",
            ),
            (
                r#"{"sequence_end":1}"#,
                "request.parameters.sequence_end must be true or false",
            ),
            (
                r#"{"shared_memory_region":"r"}"#,
                "request.parameters.shared_memory_region is not supported",
            ),
        ] {
            let e = refused(&format!(r#"{{"inputs":[{ok_in}],"parameters":{p}}}"#));
            assert!(e.1.contains(want), "{p}: {e:?}");
        }
        let e = refused(
            r#"{"inputs":[{"name":"ids","shape":[1,1],"datatype":"INT64","data":[1],"parameters":{"my_knob":1}},{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}]}"#,
        );
        assert!(
            e.1.contains("inputs[0].parameters.my_knob is not supported (unknown parameter)"),
            "{e:?}"
        );
        let e = refused(
            r#"{"inputs":[{"name":"ids","shape":[1,1],"datatype":"INT64","parameters":{"shared_memory_region":"r"}}]}"#,
        );
        assert!(
            e.1.contains("inputs[0].parameters.shared_memory_region"),
            "{e:?}"
        );
        let e = refused(&format!(
            r#"{{"inputs":[{ok_in}],"outputs":[{{"name":"y"}},{{"name":"y"}}]}}"#
        ));
        assert!(
            e.1.contains("output `y` is requested twice (outputs[1])"),
            "{e:?}"
        );
        let e = refused(&format!(
            r#"{{"inputs":[{ok_in}],"outputs":[{{"name":"y","parameters":{{"classification":0}}}}]}}"#
        ));
        assert!(e.1.contains("classification must be a positive"), "{e:?}");
    }

    /// A model of one FP32 [-1, 2] input and output, batches up to `max`,
    /// and two samples of its input (1, 2 and 3, 4).
    fn one_input(max: u32) -> (ModelMeta, Vec<u8>) {
        let m = ModelMeta::from_json(&format!(
            r#"{{"name":"r","inputs":[{{"name":"x","datatype":"FP32","shape":[-1,2]}}],
               "outputs":[{{"name":"y","datatype":"FP32","shape":[-1,2]}}],"slo_ms":20,"max_batch":{max}}}"#
        ))
        .unwrap();
        let data = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        (m, data)
    }

    #[test]
    fn a_raw_body_is_the_only_inputs_samples() {
        let (m, body) = one_input(2);
        let d = decode_raw(&m, &Bytes::from(body.clone())).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(d.samples, vec![body[..8].to_vec(), body[8..].to_vec()]);
        assert!(d.outputs[0].binary);
        let e = decode_raw(&m, &Bytes::copy_from_slice(&body[..6]))
            .err()
            .unwrap();
        assert!(e.1.contains("not a whole number of samples"), "{e:?}");
        let e = decode_raw(&m, &[body.clone(), body[..8].to_vec()].concat().into())
            .err()
            .unwrap();
        assert!(e.1.contains("max_batch_size 2"), "{e:?}");
        let e = decode_raw(&meta(), &Bytes::from(body.clone()))
            .err()
            .unwrap();
        assert!(e.1.contains("has 2 inputs"), "{e:?}");
    }

    /// Whether `part` lies within `whole`'s bytes (a view of them, not a copy).
    fn within(part: &Bytes, whole: &Bytes) -> bool {
        let (p, w) = (part.as_ptr() as usize, whole.as_ptr() as usize);
        p >= w && p + part.len() <= w + whole.len()
    }

    #[test]
    fn binary_samples_of_one_input_are_views_of_the_body() {
        let (m, data) = one_input(4);
        // The binary extension: a JSON header, then the data.
        let head = r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"parameters":{"binary_data_size":16}}]}"#;
        let body = Bytes::from([head.as_bytes(), &data].concat());
        let bin = body.slice(head.len()..);
        let d =
            decode_request(&m, head.as_bytes(), &bin, 1 << 20).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(d.samples, vec![data[..8].to_vec(), data[8..].to_vec()]);
        assert!(d.samples.iter().all(|s| within(s, &body)), "samples copied");
        // One sample: the data itself.
        let head1 = head.replace("[2,2]", "[1,2]").replace(":16", ":8");
        let bin1 = Bytes::copy_from_slice(&data[..8]);
        let d = decode_request(&m, head1.as_bytes(), &bin1, 1 << 20)
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert!(within(&d.samples[0], &bin1) && d.samples[0].len() == 8);
        // A raw body: views as well.
        let raw = Bytes::from(data.clone());
        let d = decode_raw(&m, &raw).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(d.samples.len(), 2);
        assert!(d.samples.iter().all(|s| within(s, &raw)), "samples copied");
        // Two inputs are joined per sample: copies, each the sample's bytes.
        let two = [
            &[1.0f32, 2.0, 3.0, 4.0].map(f32::to_le_bytes).concat()[..],
            &7i64.to_le_bytes()[..],
        ]
        .concat();
        let head2 = r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2,2],"parameters":{"binary_data_size":16}},{"name":"ids","datatype":"INT64","shape":[1,1],"parameters":{"binary_data_size":8}}]}"#;
        let bin2 = Bytes::from(two.clone());
        let d = decode_request(&meta(), head2.as_bytes(), &bin2, 1 << 20)
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(d.samples, vec![two]);
        assert!(!within(&d.samples[0], &bin2));
    }

    /// The error of a request that `meta()` refuses.
    fn refused(b: &str) -> Fail {
        decode_request(&meta(), b.as_bytes(), &Bytes::new(), 1 << 20)
            .err()
            .unwrap()
    }

    #[test]
    fn bad_requests_name_the_field() {
        let err = refused;
        let ok_ids = r#"{"name":"ids","shape":[1,1],"datatype":"INT64","data":[1]}"#;
        let e = err(&format!(
            r#"{{"inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,"a"]}}]}}"#
        ));
        assert!(e.1.contains("element 3 of `data`"), "{e:?}");
        let e = err(&format!(
            r#"{{"inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3]}}]}}"#
        ));
        assert!(e.1.contains("`data` has 3 elements"), "{e:?}");
        let e = err(&format!(r#"{{"inputs":[{ok_ids}]}}"#));
        assert!(e.1.contains("missing input `x`"), "{e:?}");
        let e = err(&format!(r#"{{"inputs":[{ok_ids},{ok_ids}]}}"#));
        assert!(e.1.contains("given twice"), "{e:?}");
        let e = err(r#"{"inputs":[],"parameters":{"timeout":-1}}"#);
        assert!(e.1.contains("parameters.timeout"), "{e:?}");
        let e = err(
            r#"{"inputs":[{"name":"ids","shape":[1,100000000],"datatype":"INT64","data":[1]}]}"#,
        );
        assert_eq!(e.0, StatusCode::PAYLOAD_TOO_LARGE, "{e:?}");
        let e = err(&format!(
            r#"{{"inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}}],"outputs":[{{"name":"z"}}]}}"#
        ));
        assert!(e.1.contains("unknown output `z`"), "{e:?}");
    }

    /// The parse holds at most the model's elements (plus slack) and a bounded
    /// number of entries, whatever the body's size: a body far over either is
    /// refused while it is parsed, naming the limit; a parameter that is an
    /// array or object is not kept as a tree.
    #[test]
    fn parsing_is_bounded_by_the_model_not_the_body() {
        let m = meta();
        let err = refused;
        let ok_ids = r#"{"name":"ids","shape":[1,1],"datatype":"INT64","data":[1]}"#;
        let many = vec!["0"; 1_000_000].join(",");
        let e = err(&format!(
            r#"{{"inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[{many}]}}]}}"#
        ));
        assert_eq!(e.0, StatusCode::BAD_REQUEST);
        assert!(
            e.1.contains("more elements than a request of the model may carry (40 in all"),
            "{e:?}"
        );
        // A few too many still name the input.
        let e = err(&format!(
            r#"{{"inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4,5]}}]}}"#
        ));
        assert!(e.1.contains("`data` has 5 elements"), "{e:?}");
        let keys: Vec<String> = (0..5000).map(|i| format!(r#""k{i}":1"#)).collect();
        let e = err(&format!(
            r#"{{"inputs":[],"parameters":{{{}}}}}"#,
            keys.join(",")
        ));
        assert!(e.1.contains("more than 1024 list entries"), "{e:?}");
        let e = err(&format!(
            r#"{{"inputs":[{}]}}"#,
            vec![ok_ids; 2000].join(",")
        ));
        assert!(e.1.contains("more than 1024 list entries"), "{e:?}");
        let e = err(&format!(
            r#"{{"inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}}],"parameters":{{"timeout":[{many}]}}}}"#
        ));
        assert!(
            e.1.contains(r#"parameters.timeout must be"#) && e.1.contains("(an array)"),
            "{e:?}"
        );
        // Nested `data` is flattened up to the document's 128 levels; deeper
        // is refused saying so (and costs no stack either way).
        let nested = |depth: usize| {
            format!(
                r#"{{"inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":{}1,2,3,4{}}}]}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        decode_request(&m, nested(125).as_bytes(), &Bytes::new(), 1 << 20)
            .unwrap_or_else(|e| panic!("{e:?}"));
        for depth in [126, 100_000] {
            let e = err(&nested(depth));
            assert!(e.1.contains("nested deeper than 128 levels"), "{e:?}");
        }
        // The budget is the parse's only: a good request after a refused one.
        let ok = format!(
            r#"{{"id":"r1","inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}}]}}"#
        );
        let d = decode_request(&m, ok.as_bytes(), &Bytes::new(), 1 << 20)
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(d.id, Some(Value::String("r1".into())));
        // An `id` that is not a string: 400, whatever it is (an object is
        // not kept as a tree meanwhile).
        for (id, what) in [
            ("7", "integer"),
            ("true", "boolean"),
            (r#"{"a":[1,2]}"#, "map"),
        ] {
            let body = format!(
                r#"{{"id":{id},"inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}}]}}"#
            );
            let e = err(&body);
            assert_eq!(e.0, StatusCode::BAD_REQUEST);
            assert!(
                e.1.contains("expected the request `id` to be a string") && e.1.contains(what),
                "{e:?}"
            );
        }
        let null_id = format!(
            r#"{{"id":null,"inputs":[{ok_ids},{{"name":"x","shape":[1,2,2],"datatype":"FP32","data":[1,2,3,4]}}]}}"#
        );
        let d = decode_request(&m, null_id.as_bytes(), &Bytes::new(), 1 << 20)
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(d.id, None);
    }
}
