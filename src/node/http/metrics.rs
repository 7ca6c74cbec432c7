//! The HTTP API's Prometheus series: responses by status code, and per model the
//! time from an infer request's headers to its response.

use super::admission::Refusal;
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

/// Where an inference request waits between its first byte and its answer.
pub(super) struct Waits {
    /// From the first byte's arrival to the handler: the accept queue, the
    /// unread socket, the head.
    pub(super) head: Arc<Histogram>,
    /// Reading the body.
    pub(super) read: Arc<Histogram>,
    /// Decoding it (JSON or binary) to the samples.
    pub(super) decode: Arc<Histogram>,
    /// From the hand-over to the frontend's loop to the answer.
    pub(super) answer: Arc<Histogram>,
    /// From the first byte's arrival to a refusal at the door.
    pub(super) refusal: Arc<Histogram>,
    /// Refusals at the door, by [`Refusal`].
    pub(super) refused: Vec<Counter>,
}

impl Waits {
    pub(super) fn new(reg: &Registry) -> Waits {
        let stage = |s: &str| {
            reg.histogram(
                "fermata_http_wait_seconds",
                "Where HTTP infer requests wait: `head` (from the first byte's arrival to the handler: accept queue, unread socket, head), `read` (the body), `decode` (the body to samples), `answer` (from the hand-over to the frontend's loop to the answer).",
                &[("stage", s)],
                Histogram::seconds(LATENCY_BUCKETS),
            )
        };
        Waits {
            head: stage("head"),
            read: stage("read"),
            decode: stage("decode"),
            answer: stage("answer"),
            refusal: reg.histogram(
                "fermata_http_refusal_seconds",
                "HTTP infer requests refused at the door: from the first byte's arrival to the refusal.",
                &[],
                Histogram::seconds(LATENCY_BUCKETS),
            ),
            refused: Refusal::ALL
                .iter()
                .map(|r| {
                    reg.counter(
                        "fermata_http_refused_total",
                        "HTTP infer requests refused at the door before their body was read: `deadline` (waited past what their deadline allows), `queue` (their model's queue ahead is longer than their time left), `backlog` (--http-max-pending requests being read or decoded).",
                        &[("reason", r.label())],
                    )
                })
                .collect(),
        }
    }

    pub(super) fn refused(&self, r: Refusal) {
        if let Some(c) = self.refused.get(r as usize) {
            c.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::http_load::DoorFigures;
    use std::time::Duration;

    /// `fermata bench http` reads the door's series back from `/metrics`.
    #[test]
    fn the_door_s_series_read_back_as_the_bench_reads_them() {
        let reg = Registry::new();
        let w = Waits::new(&reg);
        assert_eq!(
            DoorFigures::of_metrics(&reg.render()),
            Some(DoorFigures::default()),
            "nothing refused or waited yet"
        );
        w.refused(Refusal::Deadline);
        w.refused(Refusal::Queue);
        w.refused(Refusal::Queue);
        w.refusal.observe_duration(Duration::from_millis(1));
        w.refusal.observe_duration(Duration::from_millis(1));
        w.refusal.observe_duration(Duration::from_millis(40));
        w.refusal.observe_duration(Duration::from_millis(60));
        w.head.observe_duration(Duration::from_millis(2));
        w.head.observe_duration(Duration::from_millis(10));
        w.decode.observe_duration(Duration::from_millis(1));
        let d = DoorFigures::of_metrics(&reg.render()).expect("the door's series");
        assert_eq!(
            (d.refused_deadline, d.refused_queue, d.refused_backlog),
            (1, 2, 0)
        );
        assert!((d.refused_within_5ms - 0.5).abs() < 1e-9, "{d:?}");
        assert!((d.head_mean_ms - 6.0).abs() < 1e-6, "{d:?}");
        assert!((d.head_over_5ms - 0.5).abs() < 1e-9, "{d:?}");
        assert!((d.decode_mean_ms - 1.0).abs() < 1e-6, "{d:?}");
        assert_eq!(d.read_mean_ms, 0.0);
        assert_eq!(DoorFigures::of_metrics("# nothing\nother_total 3\n"), None);
    }
}
