//! The HTTP API's Prometheus series: responses by status code, and per model the
//! time from an infer request's headers to its response.

use crate::metrics::{Counter, Histogram, Registry, LATENCY_BUCKETS};
use hyper::StatusCode;
use std::sync::Arc;

/// The status codes counted.
const CODES: [u16; 11] = [200, 400, 404, 405, 413, 429, 500, 503, 504, 411, 408];

/// Responses by status code.
pub(super) struct Codes {
    by_code: Vec<(u16, Counter)>,
}

impl Codes {
    pub(super) fn new(reg: &Registry) -> Codes {
        Codes {
            by_code: CODES
                .iter()
                .map(|&c| {
                    (
                        c,
                        reg.counter(
                            "fermata_http_responses_total",
                            "HTTP responses of the frontend's API, by status code.",
                            &[("code", &c.to_string())],
                        ),
                    )
                })
                .collect(),
        }
    }
    pub(super) fn count(&self, code: StatusCode) {
        if let Some((_, c)) = self.by_code.iter().find(|(x, _)| *x == code.as_u16()) {
            c.inc();
        }
    }
}

/// Per model: from an infer request's receipt to its response.
pub(super) fn infer_time_histograms<'a>(
    reg: &Registry,
    models: impl Iterator<Item = &'a str>,
) -> Vec<Arc<Histogram>> {
    models
        .map(|m| {
            reg.histogram(
                "fermata_http_request_duration_seconds",
                "Infer requests over HTTP: from the request's headers to its response.",
                &[("model", m)],
                Histogram::seconds(LATENCY_BUCKETS),
            )
        })
        .collect()
}
