//! The KServe v2 (Open Inference Protocol) HTTP API of a frontend, and the
//! Prometheus `/metrics` endpoint of every node.
//!
//! The server is hyper 1 (HTTP/1.1 with keep-alive) on its own small tokio runtime,
//! with hand-written routing: tokio is already the TCP transport's runtime, hyper is
//! the HTTP implementation under axum and most of the ecosystem, and the handful of
//! fixed routes does not need a framework's router, extractors or tower layers.
//!
//! An inference request is parsed and checked here (tensor names, datatypes,
//! shapes, byte counts; errors name the field), turned into each sample's request
//! bytes ([`crate::repo`]: each input tensor's raw little-endian sample bytes in the
//! model's input order) and handed to the frontend's event loop in-process, a
//! task per sample ([`FrontendHandle::infer`](super::frontend::FrontendHandle::infer));
//! the answers come back on oneshot channels, the outputs are joined in the
//! samples' order and the request's status is the first sample's that was not
//! good, mapped as follows:
//!
//! | outcome | status |
//! |---|---|
//! | output by the deadline | 200 |
//! | malformed JSON, unknown/missing/duplicate input, wrong shape, batch, datatype or byte count, bad or unsupported parameter, duplicate output | 400 |
//! | unknown model or route | 404 |
//! | body (compressed or not) or tensor over the limits | 413 |
//! | a `Content-Encoding` other than gzip, deflate or identity | 415 |
//! | dropped because it could not meet its deadline (expired, early drop, too late on its backend), queue full, overloaded, input region full; refused at the door before its body was read | 429 |
//! | the backend failed to run it or read its input | 500 |
//! | no GPU in service, no scheduler, its backend lost, scheduler shutting down | 503 |
//! | late (output after the deadline) or no answer by the deadline plus the frontend's grace | 504 |
//!
//! Models without metadata (emulated, profile-only) appear as one `UINT8` input
//! `input` of shape `[-1, input_bytes]` and one `UINT8` output `output` of shape
//! `[-1, 16]` (the emulated GPU's length and checksum).
//!
//! # Files
//! * `options.rs`: the settings ([`HttpOpts`]).
//! * `server.rs`: [`HttpServer`]: the runtime, the accept loop (accept errors
//!   back off and are logged once per interval), each connection's header
//!   timeout, stop.
//! * `conns.rs`: the connection cap; at the cap the longest-waiting connection
//!   gives way.
//! * `routes.rs`: the routes and their handlers.
//! * `request.rs`: an inference request's JSON, checked, to request bytes.
//! * `response.rs`: responses, and an inference's answer (its outputs).
//! * `tensor.rs`: tensor data between JSON and bytes ([`f32_to_f16`],
//!   [`HEADER_LEN`]).
//! * `errors.rs`: error responses; status codes and messages of the outcomes.
//! * `model.rs`: a model as the API shows it (its tensors, its metadata).
//! * `triton.rs`: Triton's documents: a model's configuration and statistics.
//! * `metrics.rs`: the API's Prometheus series.
//! * `body_budget.rs`: the total of request bodies (and gRPC messages)
//!   buffered at once; stalled bodies give way.
//! * `admission.rs`: the door: requests refused before their body is read
//!   (deadline, the model's queue ahead, the decoding backlog).

mod admission;
pub(in crate::node) mod body_budget;
mod conns;
pub(in crate::node) mod errors;
mod metrics;
pub(in crate::node) mod model;
mod options;
pub(in crate::node) mod request;
pub(in crate::node) mod response;
mod routes;
pub(in crate::node) mod server;
mod tensor;
pub(in crate::node) mod triton;

pub use body_budget::{default_buffered_bytes, BodyBudget};
pub use options::{
    default_max_connections, default_threads, raise_open_file_limit, HttpOpts, DEFAULT_MAX_PENDING,
    RESERVED_FDS,
};
pub use request::MAX_TIMEOUT_US;
pub use routes::JsonGet;
pub use server::{Drained, HttpServer};
pub use tensor::{decode_elems, f16_to_f32, f32_to_f16, HEADER_LEN};
