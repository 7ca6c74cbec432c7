//! The API's responses: a body with its content type, a JSON document, and an
//! inference's answer (its outputs as JSON `data` or binary tensors after the
//! JSON header, with Fermata's latency, queuing delay and batch size).

use super::errors::{failure_message, status_of, Fail};
use super::request::OutSpec;
use super::tensor::{decode_elems, HEADER_LEN};
use crate::node::frontend::InferDone;
use crate::repo::{DType, ModelMeta};
use crate::wire::ModelInfo;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

pub(super) type Resp = Response<Full<Bytes>>;

pub(super) fn respond(code: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

pub(super) fn json_resp(code: StatusCode, v: &Value) -> Resp {
    respond(code, "application/json", v.to_string())
}

/// Whether every sample ended good with the model's output size; else the
/// request's error: the first sample's that did not, naming it.
pub(in crate::node) fn check_done(
    info: &ModelInfo,
    meta: &ModelMeta,
    done: &[InferDone],
) -> Result<(), Fail> {
    let n = done.len();
    for (j, d) in done.iter().enumerate() {
        let code = status_of(d.ended);
        if code != StatusCode::OK {
            let msg = failure_message(info, d.clone());
            return Err((
                code,
                if n > 1 {
                    format!("sample {j} of the request's {n}: {msg}")
                } else {
                    msg
                },
            ));
        }
        if d.output.len() != meta.output_bytes() {
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "the backend returned {} output bytes; the model's outputs are {} bytes",
                    d.output.len(),
                    meta.output_bytes()
                ),
            ));
        }
    }
    Ok(())
}

/// What a response tells of how its samples ran (its `fermata_*`
/// parameters): the slowest sample's latency and time in the queue (µs), and
/// the largest batch one ran in.
pub(in crate::node) struct Summary {
    pub(in crate::node) latency_us: f64,
    pub(in crate::node) queue_us: f64,
    pub(in crate::node) batch_size: u32,
}

impl Summary {
    pub(in crate::node) fn of(done: &[InferDone]) -> Summary {
        let most = |f: fn(&InferDone) -> f64| done.iter().map(f).fold(0.0, f64::max);
        Summary {
            latency_us: most(|d| d.latency.as_secs_f64() * 1e6),
            queue_us: most(|d| d.queue.as_secs_f64() * 1e6),
            batch_size: done.iter().map(|d| d.batch_size).max().unwrap_or(0),
        }
    }
}

/// The HTTP answer for a finished request: its samples' answers, in order.
/// One sample that did not end good fails the request with its status.
pub(super) fn answer(
    info: &ModelInfo,
    meta: &ModelMeta,
    id: &Option<Value>,
    outputs: &[OutSpec],
    done: &[InferDone],
) -> Result<Resp, Fail> {
    check_done(info, meta, done)?;
    let (outs, bin) = output_tensors(meta, outputs, |o| output_raw(meta, o, done));
    Ok(finish(
        &info.name,
        id,
        outputs,
        outs,
        bin,
        Summary::of(done),
    ))
}

/// The HTTP answer for a finished application request: each sample's
/// answer, in order; one sample that failed fails the request with its status.
pub(super) fn app_answer(
    meta: &ModelMeta,
    id: &Option<Value>,
    outputs: &[OutSpec],
    done: Vec<Result<crate::node::apps::AppDone, Fail>>,
) -> Result<Resp, Fail> {
    let n = done.len();
    let mut ok = Vec::with_capacity(n);
    for (j, d) in done.into_iter().enumerate() {
        match d {
            Ok(d) => ok.push(d),
            Err((code, msg)) if n > 1 => {
                return Err((code, format!("sample {j} of the request's {n}: {msg}")))
            }
            Err(e) => return Err(e),
        }
    }
    let (outs, bin) = output_tensors(meta, outputs, |o| app_output_raw(meta, o, &ok));
    let sum = Summary {
        latency_us: ok
            .iter()
            .map(|d| d.latency.as_secs_f64() * 1e6)
            .fold(0.0, f64::max),
        queue_us: ok
            .iter()
            .map(|d| d.queue.as_secs_f64() * 1e6)
            .fold(0.0, f64::max),
        batch_size: ok.iter().map(|d| d.batch_size).max().unwrap_or(0),
    };
    Ok(finish(&meta.name, id, outputs, outs, bin, sum))
}

/// The response of a good request: its JSON part, then its binary outputs.
fn finish(
    name: &str,
    id: &Option<Value>,
    outputs: &[OutSpec],
    outs: Vec<Value>,
    bin: Vec<u8>,
    sum: Summary,
) -> Resp {
    let mut body = json!({
        "model_name": name,
        "model_version": "1",
        "outputs": outs,
        "parameters": {
            "fermata_latency_us": sum.latency_us,
            "fermata_queue_us": sum.queue_us,
            "fermata_batch_size": sum.batch_size,
        },
    });
    if let Some(id) = id {
        body["id"] = id.clone();
    }
    let head = body.to_string();
    if bin.is_empty() && !outputs.iter().any(|o| o.binary) {
        return respond(StatusCode::OK, "application/json", head);
    }
    let hl = head.len();
    let mut all = head.into_bytes();
    all.extend_from_slice(&bin);
    let mut r = respond(StatusCode::OK, "application/octet-stream", all);
    r.headers_mut().insert(
        HEADER_LEN,
        HeaderValue::from_str(&hl.to_string()).expect("a number is a header value"),
    );
    r
}

/// One requested output of an application's answers: the rows of every
/// sample, in order (a fanned-out output has as many as its items), as
/// [`output_raw`] gives a model's.
pub(in crate::node) fn app_output_raw(
    meta: &ModelMeta,
    o: &OutSpec,
    done: &[crate::node::apps::AppDone],
) -> (&'static str, Vec<i64>, Vec<u8>) {
    let t = &meta.outputs[o.index];
    let rows = done
        .iter()
        .flat_map(|d| d.outputs[o.index].iter().map(Vec::as_slice));
    tensor_of(t.datatype, t.sample_shape(), o.classes, rows)
}

/// Rows of one output as a tensor (the top classes of each with `classes`).
fn tensor_of<'a>(
    dt: DType,
    sample_shape: &[i64],
    classes: Option<usize>,
    rows: impl Iterator<Item = &'a [u8]> + Clone,
) -> (&'static str, Vec<i64>, Vec<u8>) {
    let mut shape = vec![rows.clone().count() as i64];
    let mut bytes = Vec::new();
    match classes {
        None => {
            shape.extend_from_slice(sample_shape);
            rows.for_each(|r| bytes.extend_from_slice(r));
            (dt.kserve_name(), shape, bytes)
        }
        Some(k) => {
            shape.push(k as i64);
            for c in rows.flat_map(|r| top_classes(dt, r, k)) {
                bytes.extend_from_slice(&(c.len() as u32).to_le_bytes());
                bytes.extend_from_slice(c.as_bytes());
            }
            ("BYTES", shape, bytes)
        }
    }
}

/// One requested output of the samples' output bytes (each sample's outputs
/// one after the other, in the model's order) as a tensor: its datatype, its
/// shape (the batch dimension first) and its bytes (the top classes as
/// `BYTES`: each string after its 4-byte little-endian length).
pub(in crate::node) fn output_raw(
    meta: &ModelMeta,
    o: &OutSpec,
    done: &[InferDone],
) -> (&'static str, Vec<i64>, Vec<u8>) {
    let t = &meta.outputs[o.index];
    let off: usize = meta.outputs[..o.index]
        .iter()
        .map(|t| t.sample_bytes())
        .sum();
    let rows = done.iter().map(|d| &d.output[off..off + t.sample_bytes()]);
    tensor_of(t.datatype, t.sample_shape(), o.classes, rows)
}

/// The requested `outputs` as JSON tensors, and the binary data of those
/// asked as binary.
fn output_tensors(
    meta: &ModelMeta,
    outputs: &[OutSpec],
    raw: impl Fn(&OutSpec) -> (&'static str, Vec<i64>, Vec<u8>),
) -> (Vec<Value>, Vec<u8>) {
    let mut bin = Vec::new();
    let mut outs = Vec::with_capacity(outputs.len());
    for o in outputs {
        let t = &meta.outputs[o.index];
        let (datatype, shape, bytes) = raw(o);
        let mut v = json!({"name": t.name, "datatype": datatype, "shape": shape});
        if o.binary {
            v["parameters"] = json!({"binary_data_size": bytes.len()});
            bin.extend_from_slice(&bytes);
        } else if o.classes.is_some() {
            v["data"] = json!(bytes_strings(&bytes));
        } else {
            v["data"] = Value::Array(decode_elems(t.datatype, &bytes));
        }
        outs.push(v);
    }
    (outs, bin)
}

/// `BYTES` elements (each after its 4-byte little-endian length) as strings.
fn bytes_strings(mut b: &[u8]) -> Vec<String> {
    let mut v = Vec::new();
    while b.len() >= 4 {
        let n = u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as usize;
        let end = (4 + n).min(b.len());
        v.push(String::from_utf8_lossy(&b[4..end]).into_owned());
        b = &b[end..];
    }
    v
}

/// Triton's classification of one sample's output: its `k` largest elements,
/// largest first (ties: the lower index first), each as "value:index" (a
/// float with six decimals, as Triton writes it).
fn top_classes(dt: DType, row: &[u8], k: usize) -> Vec<String> {
    let elems = decode_elems(dt, row);
    let mut idx: Vec<(usize, f64)> = elems
        .iter()
        .enumerate()
        .map(|(i, v)| {
            (
                i,
                v.as_f64()
                    .unwrap_or(if v == &Value::Bool(true) { 1.0 } else { 0.0 }),
            )
        })
        .collect();
    idx.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    idx.truncate(k);
    let float = matches!(dt, DType::F16 | DType::BF16 | DType::F32 | DType::F64);
    idx.into_iter()
        .map(|(i, v)| {
            if float {
                format!("{v:.6}:{i}")
            } else {
                format!("{}:{i}", v as i64)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_classes_are_the_largest_first_as_value_index() {
        let row: Vec<u8> = [0.1f32, 0.7, -2.0, 0.7, 0.3]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        assert_eq!(
            top_classes(DType::F32, &row, 3),
            vec!["0.700000:1", "0.700000:3", "0.300000:4"]
        );
        let ints: Vec<u8> = [4i64, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(top_classes(DType::I64, &ints, 1), vec!["9:1"]);
    }
}
