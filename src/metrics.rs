//! Prometheus metrics: a small in-house registry rendered in the text exposition
//! format 0.0.4.
//!
//! The hot path only touches atomics: a node keeps `Arc`s to its [`Counter`]s,
//! [`Gauge`]s and [`Histogram`]s (one per label set, created when the node starts or
//! when a model or GPU appears) and updates them with relaxed atomic adds. The
//! registry's lock is taken only to add a series and to render a scrape.
//! [`Registry::collector`] adds a family whose values are computed at scrape time
//! (for numbers a node already keeps, such as per-GPU busy fractions).
//!
//! Several registries can be rendered as one exposition ([`render`]): families with
//! the same name are merged, so nodes of one kind in one process (backends of
//! `fermata serve`) share a family and differ by a label.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The Content-Type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Request latency buckets (seconds).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Batch size buckets.
pub const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down (an f64 stored as its bits).
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    #[inline]
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// A histogram with fixed buckets. Values are observed as integers in a base unit
/// (`scale` base units per exposed unit: 1e9 for seconds observed in nanoseconds,
/// 1 for batch sizes), so an observation is three relaxed atomic adds.
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds in exposed units, ascending.
    bounds: Box<[f64]>,
    /// The same in base units.
    limits: Box<[u64]>,
    scale: f64,
    /// Per bucket (not cumulative); the last is +Inf.
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &[f64], scale: f64) -> Histogram {
        let mut b: Vec<f64> = bounds.iter().copied().filter(|v| v.is_finite()).collect();
        b.sort_by(f64::total_cmp);
        b.dedup();
        let limits = b.iter().map(|v| (v * scale).floor() as u64).collect();
        Histogram {
            buckets: (0..=b.len()).map(|_| AtomicU64::new(0)).collect(),
            bounds: b.into(),
            limits,
            scale,
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
    /// A histogram of seconds, observed as durations.
    pub fn seconds(bounds: &[f64]) -> Histogram {
        Histogram::new(bounds, 1e9)
    }
    /// Observes `v` base units.
    #[inline]
    pub fn observe(&self, v: u64) {
        let i = self.limits.partition_point(|&l| l < v);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(v, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
    #[inline]
    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_nanos().min(u64::MAX as u128) as u64);
    }
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
    /// Sum in exposed units.
    pub fn sum(&self) -> f64 {
        self.sum.load(Ordering::Relaxed) as f64 / self.scale
    }
    /// Cumulative counts per bound, +Inf last.
    pub fn cumulative(&self) -> Vec<u64> {
        let mut acc = 0;
        self.buckets
            .iter()
            .map(|b| {
                acc += b.load(Ordering::Relaxed);
                acc
            })
            .collect()
    }
}

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

enum Metric {
    Counter(Arc<Counter>),
    Gauge(Arc<Gauge>),
    Histogram(Arc<Histogram>),
}

/// Values computed at scrape time: (labels, value) pairs.
pub type Collected = Vec<(Vec<(String, String)>, f64)>;
type CollectFn = Box<dyn Fn() -> Collected + Send + Sync>;

struct Family {
    name: String,
    help: String,
    kind: Kind,
    /// (rendered labels without braces, metric)
    series: Vec<(String, Metric)>,
    collectors: Vec<CollectFn>,
}

/// A set of metric families.
#[derive(Default)]
pub struct Registry {
    families: Mutex<Vec<Family>>,
}

/// Renders label pairs as `a="x",b="y"` (values escaped).
fn labels_text<K: AsRef<str>, V: AsRef<str>>(labels: &[(K, V)]) -> String {
    let mut s = String::new();
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(k.as_ref());
        s.push_str("=\"");
        for c in v.as_ref().chars() {
            match c {
                '\\' => s.push_str("\\\\"),
                '"' => s.push_str("\\\""),
                '\n' => s.push_str("\\n"),
                c => s.push(c),
            }
        }
        s.push('"');
    }
    s
}

fn value_text(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

impl Registry {
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    fn with_family<R>(
        &self,
        name: &str,
        help: &str,
        kind: Kind,
        f: impl FnOnce(&mut Family) -> R,
    ) -> R {
        let mut fams = self.families.lock().expect("metrics lock");
        let i = match fams.iter().position(|x| x.name == name) {
            Some(i) => {
                assert_eq!(
                    fams[i].kind, kind,
                    "metric {name} registered twice with two types"
                );
                i
            }
            None => {
                fams.push(Family {
                    name: name.into(),
                    help: help.into(),
                    kind,
                    series: Vec::new(),
                    collectors: Vec::new(),
                });
                fams.len() - 1
            }
        };
        f(&mut fams[i])
    }

    fn series(&self, name: &str, help: &str, kind: Kind, labels: &[(&str, &str)], m: Metric) {
        let l = labels_text(labels);
        self.with_family(name, help, kind, |f| {
            f.series.retain(|(x, _)| *x != l);
            f.series.push((l, m));
        });
    }

    /// A counter series (replacing one with the same labels).
    pub fn counter(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Arc<Counter> {
        let c = Arc::new(Counter::default());
        self.series(
            name,
            help,
            Kind::Counter,
            labels,
            Metric::Counter(c.clone()),
        );
        c
    }

    pub fn gauge(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Arc<Gauge> {
        let g = Arc::new(Gauge::default());
        self.series(name, help, Kind::Gauge, labels, Metric::Gauge(g.clone()));
        g
    }

    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        h: Histogram,
    ) -> Arc<Histogram> {
        let h = Arc::new(h);
        self.series(
            name,
            help,
            Kind::Histogram,
            labels,
            Metric::Histogram(h.clone()),
        );
        h
    }

    /// A family (counter or gauge) whose series are computed at every scrape.
    pub fn collector(
        &self,
        name: &str,
        help: &str,
        kind: Kind,
        f: impl Fn() -> Collected + Send + Sync + 'static,
    ) {
        assert!(
            kind != Kind::Histogram,
            "collectors give counters or gauges"
        );
        self.with_family(name, help, kind, |fam| fam.collectors.push(Box::new(f)));
    }

    /// Removes the series of `name` with exactly these labels.
    pub fn remove(&self, name: &str, labels: &[(&str, &str)]) {
        let l = labels_text(labels);
        let mut fams = self.families.lock().expect("metrics lock");
        if let Some(f) = fams.iter_mut().find(|f| f.name == name) {
            f.series.retain(|(x, _)| *x != l);
        }
    }

    /// This registry alone, in the text format.
    pub fn render(&self) -> String {
        render(&[self])
    }
}

fn sample(out: &mut String, name: &str, suffix: &str, labels: &str, extra: &str, v: &str) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || !extra.is_empty() {
        out.push('{');
        out.push_str(labels);
        if !labels.is_empty() && !extra.is_empty() {
            out.push(',');
        }
        out.push_str(extra);
        out.push('}');
    }
    out.push(' ');
    out.push_str(v);
    out.push('\n');
}

/// Renders several registries as one exposition, merging families by name (the
/// first registration's help and type win).
pub fn render(regs: &[&Registry]) -> String {
    let guards: Vec<_> = regs
        .iter()
        .map(|r| r.families.lock().expect("metrics lock"))
        .collect();
    let mut names: Vec<(&str, &str, Kind)> = Vec::new();
    for g in &guards {
        for f in g.iter() {
            if !names.iter().any(|(n, _, _)| *n == f.name) {
                names.push((&f.name, &f.help, f.kind));
            }
        }
    }
    let mut out = String::new();
    for (name, help, kind) in names {
        let _ = writeln!(out, "# HELP {name} {}", help.replace('\n', " "));
        let _ = writeln!(out, "# TYPE {name} {}", kind.name());
        for g in &guards {
            for f in g.iter().filter(|f| f.name == name && f.kind == kind) {
                for (labels, m) in &f.series {
                    match m {
                        Metric::Counter(c) => {
                            sample(&mut out, name, "", labels, "", &c.get().to_string())
                        }
                        Metric::Gauge(x) => {
                            sample(&mut out, name, "", labels, "", &value_text(x.get()))
                        }
                        Metric::Histogram(h) => {
                            let cum = h.cumulative();
                            for (b, n) in h.bounds.iter().zip(&cum) {
                                let le = format!("le=\"{}\"", value_text(*b));
                                sample(&mut out, name, "_bucket", labels, &le, &n.to_string());
                            }
                            let total = *cum.last().expect("+Inf bucket");
                            sample(
                                &mut out,
                                name,
                                "_bucket",
                                labels,
                                "le=\"+Inf\"",
                                &total.to_string(),
                            );
                            sample(&mut out, name, "_sum", labels, "", &value_text(h.sum()));
                            sample(&mut out, name, "_count", labels, "", &total.to_string());
                        }
                    }
                }
                for c in &f.collectors {
                    for (l, v) in c() {
                        sample(&mut out, name, "", &labels_text(&l), "", &value_text(v));
                    }
                }
            }
        }
    }
    out
}

/// Samples of a running total over a sliding window, to turn totals into figures
/// "over the last `span`" (a bad rate, a busy fraction).
#[derive(Debug, Default)]
pub struct Window<T> {
    samples: VecDeque<(Instant, T)>,
}

impl<T: Clone> Window<T> {
    /// Records `total` at `now` and returns the oldest sample that still covers
    /// `span` back from `now` (the first one ever, until `span` has passed).
    pub fn push(&mut self, now: Instant, total: T, span: Duration) -> (Instant, T) {
        self.samples.push_back((now, total));
        while self.samples.len() > 2 && now.duration_since(self.samples[1].0) >= span {
            self.samples.pop_front();
        }
        self.samples[0].clone()
    }
    /// Forgets every sample (a new start).
    pub fn clear(&mut self) {
        self.samples.clear();
    }
}

/// The `q` quantile (nearest rank) of `v`, which is sorted; 0 when `v` is empty.
pub fn sorted_quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_text_format() {
        let r = Registry::new();
        let c = r.counter(
            "fermata_requests_total",
            "Requests.",
            &[("model", "m\"1"), ("outcome", "good")],
        );
        c.add(3);
        let g = r.gauge("fermata_bad_rate", "Bad.", &[]);
        g.set(0.25);
        let h = r.histogram(
            "fermata_latency_seconds",
            "Latency.",
            &[("model", "a")],
            Histogram::seconds(&[0.001, 0.01]),
        );
        h.observe_duration(Duration::from_micros(500));
        h.observe_duration(Duration::from_millis(1));
        h.observe_duration(Duration::from_millis(5));
        h.observe_duration(Duration::from_secs(1));
        r.collector("fermata_gpu_busy_ratio", "Busy.", Kind::Gauge, || {
            vec![(vec![("gpu".to_string(), "0".to_string())], 0.5)]
        });
        let t = r.render();
        assert!(t.contains("# TYPE fermata_requests_total counter\n"), "{t}");
        assert!(
            t.contains("fermata_requests_total{model=\"m\\\"1\",outcome=\"good\"} 3\n"),
            "{t}"
        );
        assert!(t.contains("fermata_bad_rate 0.25\n"), "{t}");
        assert!(
            t.contains("fermata_latency_seconds_bucket{model=\"a\",le=\"0.001\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("fermata_latency_seconds_bucket{model=\"a\",le=\"0.01\"} 3\n"),
            "{t}"
        );
        assert!(
            t.contains("fermata_latency_seconds_bucket{model=\"a\",le=\"+Inf\"} 4\n"),
            "{t}"
        );
        assert!(
            t.contains("fermata_latency_seconds_sum{model=\"a\"} 1.0065\n"),
            "{t}"
        );
        assert!(
            t.contains("fermata_latency_seconds_count{model=\"a\"} 4\n"),
            "{t}"
        );
        assert!(t.contains("fermata_gpu_busy_ratio{gpu=\"0\"} 0.5\n"), "{t}");
    }

    #[test]
    fn merges_families_across_registries() {
        let a = Registry::new();
        let b = Registry::new();
        a.counter("x_total", "X.", &[("backend", "a")]).inc();
        b.counter("x_total", "X.", &[("backend", "b")]).add(2);
        let t = render(&[&a, &b]);
        assert_eq!(t.matches("# TYPE x_total counter").count(), 1, "{t}");
        assert!(t.contains("x_total{backend=\"a\"} 1\n"), "{t}");
        assert!(t.contains("x_total{backend=\"b\"} 2\n"), "{t}");
        a.remove("x_total", &[("backend", "a")]);
        assert!(!a.render().contains("backend=\"a\""));
    }
}
