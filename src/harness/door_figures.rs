//! What a server's `/metrics` says of its front door after a load
//! ([`DoorFigures`]): `fermata bench http` reads it back after each run
//! ([`super::http_load`]), so that a refusal can be told apart by where its
//! time went.

use serde::Serialize;

/// What the server's `/metrics` says of its door and of where requests
/// waited (`node::http::metrics`), warm-up included.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DoorFigures {
    /// Refusals at the door by reason.
    pub refused_deadline: u64,
    pub refused_queue: u64,
    pub refused_backlog: u64,
    /// Of the door's refusals, the share decided within 5 ms of the
    /// request's first byte (the server's own clock, before the answer is
    /// written).
    pub refused_within_5ms: f64,
    /// Mean wait per stage of the requests taken, ms: `head` (first byte to
    /// the handler), `read`, `decode`, `answer` (hand-over to the answer).
    pub head_mean_ms: f64,
    pub read_mean_ms: f64,
    pub decode_mean_ms: f64,
    pub answer_mean_ms: f64,
    /// The share of requests whose head waited more than 5 ms.
    pub head_over_5ms: f64,
    /// Connections the server's cap closed: the longest-waiting to admit a
    /// new one, and new ones refused with every connection in a request.
    pub conns_evicted: u64,
    pub conns_refused: u64,
}

impl DoorFigures {
    /// From a Prometheus text exposition; None without the door's series.
    pub fn of_metrics(text: &str) -> Option<DoorFigures> {
        // (name, labels, value) of each sample line.
        let samples: Vec<(&str, &str, f64)> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (key, v) = l.rsplit_once(' ')?;
                let v: f64 = v.parse().ok()?;
                let (name, labels) = key.split_once('{').unwrap_or((key, "}"));
                Some((name, labels.trim_end_matches('}'), v))
            })
            .collect();
        let get = |name: &str, has: &[&str]| -> Option<f64> {
            samples
                .iter()
                .find(|(n, l, _)| *n == name && has.iter().all(|h| l.contains(h)))
                .map(|s| s.2)
        };
        let refused = |r: &str| {
            get("fermata_http_refused_total", &[&format!("reason=\"{r}\"")]).map(|v| v as u64)
        };
        let (refused_deadline, refused_queue, refused_backlog) =
            (refused("deadline")?, refused("queue")?, refused("backlog")?);
        let share = |num: Option<f64>, den: Option<f64>| match (num, den) {
            (Some(n), Some(d)) if d > 0.0 => n / d,
            _ => 0.0,
        };
        let refused_within_5ms = share(
            get("fermata_http_refusal_seconds_bucket", &["le=\"0.005\""]),
            get("fermata_http_refusal_seconds_count", &[]),
        );
        let stage = |st: &str| {
            let l = format!("stage=\"{st}\"");
            1e3 * share(
                get("fermata_http_wait_seconds_sum", &[&l]),
                get("fermata_http_wait_seconds_count", &[&l]),
            )
        };
        let head = "stage=\"head\"";
        let heads = get("fermata_http_wait_seconds_count", &[head]);
        let head_within_5ms = share(
            get("fermata_http_wait_seconds_bucket", &[head, "le=\"0.005\""]),
            heads,
        );
        let closed = |r: &str| {
            get(
                "fermata_http_connections_closed_total",
                &[&format!("reason=\"{r}\"")],
            )
            .unwrap_or(0.0) as u64
        };
        Some(DoorFigures {
            conns_evicted: closed("evicted"),
            conns_refused: closed("refused"),
            refused_deadline,
            refused_queue,
            refused_backlog,
            refused_within_5ms,
            head_mean_ms: stage("head"),
            read_mean_ms: stage("read"),
            decode_mean_ms: stage("decode"),
            answer_mean_ms: stage("answer"),
            head_over_5ms: if heads.unwrap_or(0.0) > 0.0 {
                1.0 - head_within_5ms
            } else {
                0.0
            },
        })
    }
}
