//! The API's responses: a body with its content type, a JSON document, and an
//! inference's answer (its outputs as JSON `data` or binary tensors after the
//! JSON header, with Fermata's latency, queuing delay and batch size).

use super::errors::{failure_message, status_of, Fail};
use super::tensor::{decode_elems, HEADER_LEN};
use crate::node::frontend::InferDone;
use crate::repo::ModelMeta;
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

/// The HTTP answer for a finished request.
pub(super) fn answer(
    info: &ModelInfo,
    meta: &ModelMeta,
    id: &Option<Value>,
    outputs: &[(usize, bool)],
    d: InferDone,
) -> Result<Resp, Fail> {
    let code = status_of(d.ended);
    if code != StatusCode::OK {
        return Err((code, failure_message(info, d)));
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
    let (outs, bin) = output_tensors(meta, outputs, &d.output);
    let mut body = json!({
        "model_name": info.name,
        "model_version": "1",
        "outputs": outs,
        "parameters": {
            "fermata_latency_us": d.latency.as_secs_f64() * 1e6,
            "fermata_queue_us": d.queue.as_secs_f64() * 1e6,
            "fermata_batch_size": d.batch_size,
        },
    });
    if let Some(id) = id {
        body["id"] = id.clone();
    }
    let head = body.to_string();
    if bin.is_empty() && !outputs.iter().any(|o| o.1) {
        return Ok(respond(StatusCode::OK, "application/json", head));
    }
    let hl = head.len();
    let mut all = head.into_bytes();
    all.extend_from_slice(&bin);
    let mut r = respond(StatusCode::OK, "application/octet-stream", all);
    r.headers_mut().insert(
        HEADER_LEN,
        HeaderValue::from_str(&hl.to_string()).expect("a number is a header value"),
    );
    Ok(r)
}

/// The requested `outputs` of the request's `output` bytes: their JSON tensors,
/// and the binary data of those asked as binary.
fn output_tensors(
    meta: &ModelMeta,
    outputs: &[(usize, bool)],
    output: &[u8],
) -> (Vec<Value>, Vec<u8>) {
    let mut offs = Vec::with_capacity(meta.outputs.len());
    let mut at = 0;
    for t in &meta.outputs {
        offs.push(at);
        at += t.sample_bytes();
    }
    let mut bin = Vec::new();
    let mut outs = Vec::with_capacity(outputs.len());
    for &(i, binary) in outputs {
        let t = &meta.outputs[i];
        let bytes = &output[offs[i]..offs[i] + t.sample_bytes()];
        let mut shape = vec![1i64];
        shape.extend_from_slice(t.sample_shape());
        let mut o = json!({"name": t.name, "datatype": t.datatype.kserve_name(), "shape": shape});
        if binary {
            o["parameters"] = json!({"binary_data_size": bytes.len()});
            bin.extend_from_slice(bytes);
        } else {
            o["data"] = Value::Array(decode_elems(t.datatype, bytes));
        }
        outs.push(o);
    }
    (outs, bin)
}
