//! The API's errors: [`Fail`] (status code and message), the error response
//! (`{"error": message}`), and the status code and message of a request that did
//! not end good (the table in the module docs).

use super::response::{json_resp, Resp};
use crate::node::frontend::{Ended, InferDone};
use crate::node::scheduler::drop_reason_label;
use crate::wire::{DropReason, ModelInfo};
use hyper::StatusCode;
use serde_json::json;
use std::time::Duration;

/// An error answer: status and message.
pub(in crate::node) type Fail = (StatusCode, String);

/// The error response: `{"error": msg}` with `code`.
pub(super) fn error(code: StatusCode, msg: impl Into<String>) -> Resp {
    let mut r = json_resp(code, &json!({ "error": msg.into() }));
    if code == StatusCode::SERVICE_UNAVAILABLE || code == StatusCode::TOO_MANY_REQUESTS {
        // Every 503 and 429 is for now (draining, no scheduler, the body
        // budget, overload): a client may try again in a second.
        r.headers_mut().insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("1"),
        );
    }
    r
}

/// A bad request (400).
pub(super) fn bad(msg: impl Into<String>) -> Fail {
    (StatusCode::BAD_REQUEST, msg.into())
}

/// A body over the limit (413).
pub(super) fn too_large_body(n: u64, max: usize) -> Fail {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "request body of {n} bytes is over the limit of {max} bytes (--http-max-body-bytes)"
        ),
    )
}

/// Why a request was dropped, in words.
fn drop_text(c: DropReason) -> &'static str {
    match c {
        DropReason::Expired => "it could not finish by its deadline even in a batch of one",
        DropReason::EarlyDrop => {
            "it could not meet its deadline in a batch the load needs (early drop)"
        }
        DropReason::TooLate => "its batch could not start in time for its deadline",
        DropReason::QueueFull => "the model's queue is full",
        DropReason::Overloaded => "the scheduler is overloaded",
        DropReason::ModelRemoved => "the model was removed",
        DropReason::Shutdown => "the scheduler is shutting down",
        DropReason::BackendLost => "the backend running it was lost",
        DropReason::UnknownModel => "the scheduler does not know the model",
        DropReason::NoGpu => "no GPU is in service: no backend can serve the model",
    }
}

/// The status code of a request that ended as `ended`.
pub(in crate::node) fn status_of(ended: Ended) -> StatusCode {
    match ended {
        Ended::Good => StatusCode::OK,
        Ended::Late | Ended::TimedOut => StatusCode::GATEWAY_TIMEOUT,
        Ended::Dropped(
            DropReason::NoGpu
            | DropReason::Shutdown
            | DropReason::ModelRemoved
            | DropReason::UnknownModel,
        )
        | Ended::NoScheduler
        | Ended::BackendLost => StatusCode::SERVICE_UNAVAILABLE,
        Ended::Dropped(DropReason::BackendLost) => StatusCode::SERVICE_UNAVAILABLE,
        Ended::Dropped(_) | Ended::RegionFull => StatusCode::TOO_MANY_REQUESTS,
        Ended::BadRequest => StatusCode::BAD_REQUEST,
        Ended::Failed => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The error message of a request of model `info` that did not end good.
pub(in crate::node) fn failure_message(info: &ModelInfo, d: InferDone) -> String {
    let ms = |x: Duration| x.as_secs_f64() * 1e3;
    match d.ended {
        Ended::Late => format!(
            "deadline exceeded: the result came after the deadline ({:.2} ms after receipt, SLO {:.2} ms by default)",
            ms(d.latency),
            info.slo.as_ms_f64()
        ),
        Ended::TimedOut => format!(
            "deadline exceeded: no result by the deadline plus the frontend's grace ({:.2} ms)",
            ms(d.latency)
        ),
        Ended::Dropped(c) => format!("dropped ({}): {}", drop_reason_label(c), drop_text(c)),
        _ => d.message,
    }
}
