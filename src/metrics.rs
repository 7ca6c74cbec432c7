//! Prometheus metrics on `prometheus-client`, the Prometheus project's Rust client:
//! its counter and gauge types and its two encoders, the text format 0.0.4 (the
//! default) and OpenMetrics 1.0 (when a scrape's `Accept` asks for it,
//! [`Format::from_accept`]). Every exposition ends with the process's
//! `process_*` series (Linux `/proc`) and `fermata_build_info`.
//!
//! The hot path only touches atomics: a node keeps handles to its [`Counter`]s,
//! [`Gauge`]s and [`Histogram`]s (one per label set, created when the node starts or
//! when a model or GPU appears) and updates them with relaxed atomic adds.
//! [`Histogram`] is ours, not the library's: the library's takes a mutex on every
//! observation; ours is three relaxed atomic adds and encodes itself through the
//! library's encoder like any other metric.
//!
//! [`Registry`] is a node's set of families. It is ours because the library's
//! registry cannot do two things a node needs: several nodes in one process
//! (backends of `fermata serve`) each register the same family and are exposed as
//! one family whose series differ by a label ([`render`] merges by name, through
//! the library's `Collector`), and a family's series can be computed at scrape time
//! with a label set that changes ([`Registry::collector`], for numbers a node
//! already keeps, such as per-GPU busy fractions). Registering takes the
//! registry's lock; so does a scrape.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::TypedMetric;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A family's type (the library's).
pub use prometheus_client::metrics::MetricType as Kind;

/// A monotonically increasing count (the library's, on an `AtomicU64`; clones
/// share the count).
pub type Counter = prometheus_client::metrics::counter::Counter;

/// A value that goes up and down (the library's, an f64 kept as its bits).
pub type Gauge = prometheus_client::metrics::gauge::Gauge<f64, AtomicU64>;

/// A series' labels, in order.
pub type Labels = Vec<(String, String)>;

/// The exposition formats a scrape can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4.
    Text,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when the `Accept` header lists `application/openmetrics-text`
    /// (as Prometheus does, first), the text format otherwise.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a)
                if a.split(',').any(|t| {
                    let mut p = t.split(';');
                    let ty = p.next().unwrap_or("").trim();
                    let q0 = p.any(|x| matches!(x.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
                    ty.eq_ignore_ascii_case("application/openmetrics-text") && !q0
                }) =>
            {
                Format::OpenMetrics
            }
            _ => Format::Text,
        }
    }

    /// The Content-Type of an exposition in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// Request latency buckets (seconds).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Batch size buckets.
pub const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

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

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // Non-cumulative counts per upper bound, +Inf last, as the encoder takes them.
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        encoder.encode_histogram::<NoLabelSet>(self.sum(), count, &buckets, None)
    }
    fn metric_type(&self) -> Kind {
        Kind::Histogram
    }
}

impl TypedMetric for Histogram {
    const TYPE: Kind = Kind::Histogram;
}

enum Series {
    Counter(Counter),
    Gauge(Gauge),
    Histogram(Arc<Histogram>),
}

impl Series {
    fn encode(&self, e: MetricEncoder) -> Result<(), std::fmt::Error> {
        match self {
            Series::Counter(c) => c.encode(e),
            Series::Gauge(g) => g.encode(e),
            Series::Histogram(h) => h.encode(e),
        }
    }
}

/// Values computed at scrape time: (labels, value) pairs.
pub type Collected = Vec<(Labels, f64)>;
type CollectFn = Box<dyn Fn() -> Collected + Send + Sync>;

struct Family {
    /// The exposed name (a counter's with its `_total`).
    name: String,
    help: String,
    kind: Kind,
    series: Vec<(Labels, Series)>,
    collectors: Vec<CollectFn>,
}

/// A node's metric families.
#[derive(Default)]
pub struct Registry {
    families: Mutex<Vec<Family>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Registry")
    }
}

fn owned(labels: &[(&str, &str)]) -> Labels {
    labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
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
        assert!(
            kind != Kind::Counter || name.ends_with("_total"),
            "counter {name} must end with _total"
        );
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

    fn series(&self, name: &str, help: &str, kind: Kind, labels: &[(&str, &str)], s: Series) {
        let l = owned(labels);
        self.with_family(name, help, kind, |f| {
            f.series.retain(|(x, _)| *x != l);
            f.series.push((l, s));
        });
    }

    /// A counter series (replacing one with the same labels); `name` ends with
    /// `_total`.
    pub fn counter(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Counter {
        let c = Counter::default();
        self.series(
            name,
            help,
            Kind::Counter,
            labels,
            Series::Counter(c.clone()),
        );
        c
    }

    pub fn gauge(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Gauge {
        let g = Gauge::default();
        self.series(name, help, Kind::Gauge, labels, Series::Gauge(g.clone()));
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
            Series::Histogram(h.clone()),
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
            matches!(kind, Kind::Counter | Kind::Gauge),
            "collectors give counters or gauges"
        );
        self.with_family(name, help, kind, |fam| fam.collectors.push(Box::new(f)));
    }

    /// This registry alone, in the text format.
    pub fn render(self: &Arc<Self>) -> String {
        render(std::slice::from_ref(self), Format::Text)
    }

    /// Removes the series of `name` with exactly these labels.
    pub fn remove(&self, name: &str, labels: &[(&str, &str)]) {
        let l = owned(labels);
        let mut fams = self.families.lock().expect("metrics lock");
        if let Some(f) = fams.iter_mut().find(|f| f.name == name) {
            f.series.retain(|(x, _)| *x != l);
        }
    }
}

/// Several registries as the library's `Collector`: one descriptor per family
/// name (the first registration's help and type), then every registry's series of
/// that name and type.
#[derive(Debug)]
struct Merged {
    regs: Vec<Arc<Registry>>,
    format: Format,
}

/// OpenMetrics wants `\`, `"` and newlines escaped in HELP; the library's
/// OpenMetrics encoder writes the text as given (its 0.0.4 encoder escapes).
fn help_text(help: &str, format: Format) -> std::borrow::Cow<'_, str> {
    if format == Format::OpenMetrics && help.contains(['\\', '"', '\n']) {
        help.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
            .into()
    } else {
        help.into()
    }
}

impl Collector for Merged {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let guards: Vec<_> = self
            .regs
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
        for (name, help, kind) in names {
            // The encoders add a counter's `_total` themselves.
            let base = match kind {
                Kind::Counter => name.strip_suffix("_total").unwrap_or(name),
                _ => name,
            };
            let help = help_text(help, self.format);
            let mut me = encoder.encode_descriptor(base, &help, None, kind)?;
            for g in &guards {
                for f in g.iter().filter(|f| f.name == name && f.kind == kind) {
                    for (labels, s) in &f.series {
                        s.encode(me.encode_family(labels)?)?;
                    }
                    for c in &f.collectors {
                        for (l, v) in c() {
                            let e = me.encode_family(&l)?;
                            match kind {
                                Kind::Counter => ConstCounter::new(v).encode(e)?,
                                _ => ConstGauge::new(v).encode(e)?,
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Renders several registries as one exposition in `format`, merging families by
/// name, then the process's series and the build's.
pub fn render(regs: &[Arc<Registry>], format: Format) -> String {
    let mut r = prometheus_client::registry::Registry::default();
    r.register_collector(Box::new(Merged {
        regs: regs.to_vec(),
        format,
    }));
    r.register_collector(Box::new(Process));
    let mut out = String::new();
    let done = match format {
        Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut out, &r),
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &r),
    };
    done.expect("writing to a String");
    out
}

/// The process's series in the names every Prometheus client uses (from
/// `/proc/self`; none where it cannot be read), and `fermata_build_info`.
#[derive(Debug)]
struct Process;

/// What `/proc/self/stat` says (fields 14, 15, 20, 22, 23 and 24).
struct ProcStat {
    /// utime + stime, in clock ticks.
    cpu_ticks: u64,
    threads: u64,
    /// Since boot, in clock ticks.
    start_ticks: u64,
    vsize: u64,
    rss_pages: u64,
}

fn proc_stat() -> Option<ProcStat> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: fields 3.. follow its last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3.
    let n = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some(ProcStat {
        cpu_ticks: n(14)? + n(15)?,
        threads: n(20)?,
        start_ticks: n(22)?,
        vsize: n(23)?,
        rss_pages: n(24)?,
    })
}

/// Boot time, seconds since the epoch (`btime` of `/proc/stat`).
fn boot_time() -> Option<u64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

/// The soft limit on open files.
fn max_fds() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0).then_some(r.rlim_cur)
}

/// The features this binary was built with.
fn build_features() -> &'static str {
    match (cfg!(feature = "cuda"), cfg!(feature = "rdma")) {
        (true, true) => "cuda,rdma",
        (true, false) => "cuda",
        (false, true) => "rdma",
        (false, false) => "",
    }
}

fn one<M: EncodeMetric>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: Kind,
    m: M,
) -> Result<(), std::fmt::Error> {
    m.encode(e.encode_descriptor(name, help, None, kind)?)
}

impl Collector for Process {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // SAFETY: sysconf reads a constant.
        let (tick, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if let (Some(st), true) = (proc_stat(), tick > 0 && page > 0) {
            let tick = tick as f64;
            one(
                &mut e,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                Kind::Counter,
                ConstCounter::new(st.cpu_ticks as f64 / tick),
            )?;
            one(
                &mut e,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                Kind::Gauge,
                ConstGauge::new(st.rss_pages as i64 * page),
            )?;
            one(
                &mut e,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                Kind::Gauge,
                ConstGauge::new(st.vsize as i64),
            )?;
            one(
                &mut e,
                "process_threads",
                "Number of OS threads in the process.",
                Kind::Gauge,
                ConstGauge::new(st.threads as i64),
            )?;
            if let Some(boot) = boot_time() {
                one(
                    &mut e,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    Kind::Gauge,
                    ConstGauge::new(boot as f64 + st.start_ticks as f64 / tick),
                )?;
            }
        }
        if let Ok(d) = std::fs::read_dir("/proc/self/fd") {
            one(
                &mut e,
                "process_open_fds",
                "Number of open file descriptors.",
                Kind::Gauge,
                ConstGauge::new(d.count() as i64),
            )?;
        }
        if let Some(m) = max_fds() {
            one(
                &mut e,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                Kind::Gauge,
                ConstGauge::new(m as i64),
            )?;
        }
        let labels = [
            ("version", env!("CARGO_PKG_VERSION")),
            ("features", build_features()),
        ];
        let mut me = e.encode_descriptor(
            "fermata_build_info",
            "1, labelled with the version of fermata and the cargo features it was built with.",
            None,
            Kind::Gauge,
        )?;
        ConstGauge::new(1i64).encode(me.encode_family(&labels)?)
    }
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

    /// A registry with one series of each kind, a collector and a help text
    /// that needs escaping.
    fn sample_registry() -> Arc<Registry> {
        let r = Registry::new();
        let c = r.counter(
            "fermata_requests_total",
            "Requests.",
            &[("model", "m\"1"), ("outcome", "good")],
        );
        c.inc_by(3);
        let g = r.gauge("fermata_bad_ratio", "Bad \\ \"ratio\"\nover 10 s.", &[]);
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
        r.collector(
            "fermata_busy_seconds_total",
            "Busy s.",
            Kind::Counter,
            || vec![(vec![("gpu".to_string(), "0".to_string())], 1.5)],
        );
        r
    }

    #[test]
    fn renders_the_text_format() {
        let t = sample_registry().render();
        for want in [
            "# TYPE fermata_requests_total counter\n",
            "fermata_requests_total{model=\"m\\\"1\",outcome=\"good\"} 3\n",
            // 0.0.4 escapes backslashes and newlines in HELP, not quotes.
            "# HELP fermata_bad_ratio Bad \\\\ \"ratio\"\\nover 10 s.\n",
            "fermata_bad_ratio 0.25\n",
            "# TYPE fermata_latency_seconds histogram\n",
            "fermata_latency_seconds_bucket{model=\"a\",le=\"0.001\"} 2\n",
            "fermata_latency_seconds_bucket{model=\"a\",le=\"0.01\"} 3\n",
            "fermata_latency_seconds_bucket{model=\"a\",le=\"+Inf\"} 4\n",
            "fermata_latency_seconds_sum{model=\"a\"} 1.0065\n",
            "fermata_latency_seconds_count{model=\"a\"} 4\n",
            "fermata_gpu_busy_ratio{gpu=\"0\"} 0.5\n",
            "# TYPE fermata_busy_seconds_total counter\n",
            "fermata_busy_seconds_total{gpu=\"0\"} 1.5\n",
            // The process's series and the build's.
            "# TYPE process_cpu_seconds_total counter\n",
            "# TYPE process_resident_memory_bytes gauge\n",
            "# TYPE process_open_fds gauge\n",
            "# TYPE process_start_time_seconds gauge\n",
            &format!(
                "fermata_build_info{{version=\"{}\",features=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION"),
                build_features()
            ),
        ] {
            assert!(t.contains(want), "no {want:?} in\n{t}");
        }
        assert!(!t.contains("# EOF"), "{t}");
        let rss = t
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse::<f64>().ok())
            .expect("the resident memory");
        assert!(rss > 1e6, "{rss}");
    }

    #[test]
    fn renders_openmetrics() {
        let t = render(&[sample_registry()], Format::OpenMetrics);
        for want in [
            // The family has no `_total`; its sample has.
            "# TYPE fermata_requests counter\n",
            "fermata_requests_total{model=\"m\\\"1\",outcome=\"good\"} 3\n",
            // OpenMetrics escapes quotes too.
            "# HELP fermata_bad_ratio Bad \\\\ \\\"ratio\\\"\\nover 10 s.\n",
            "fermata_latency_seconds_bucket{le=\"+Inf\",model=\"a\"} 4\n",
            "fermata_busy_seconds_total{gpu=\"0\"} 1.5\n",
            "# TYPE process_cpu_seconds counter\n",
        ] {
            assert!(t.contains(want), "no {want:?} in\n{t}");
        }
        assert!(t.ends_with("# EOF\n"), "{t}");
    }

    #[test]
    fn negotiates_the_format() {
        // What Prometheus 2.x/3.x send.
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::from_accept(Some(prom)), Format::OpenMetrics);
        assert_eq!(Format::from_accept(None), Format::Text);
        assert_eq!(Format::from_accept(Some("*/*")), Format::Text);
        assert_eq!(
            Format::from_accept(Some("text/plain;version=0.0.4")),
            Format::Text
        );
        assert_eq!(
            Format::from_accept(Some("application/openmetrics-text;q=0")),
            Format::Text
        );
        assert!(Format::OpenMetrics
            .content_type()
            .starts_with("application/openmetrics-text; version=1.0.0"));
    }

    #[test]
    fn merges_families_across_registries() {
        let a = Registry::new();
        let b = Registry::new();
        a.counter("x_total", "X.", &[("backend", "a")]).inc();
        b.counter("x_total", "X.", &[("backend", "b")]).inc_by(2);
        for f in [Format::Text, Format::OpenMetrics] {
            let t = render(&[a.clone(), b.clone()], f);
            assert_eq!(t.matches("# TYPE x").count(), 1, "{t}");
            assert!(t.contains("x_total{backend=\"a\"} 1\n"), "{t}");
            assert!(t.contains("x_total{backend=\"b\"} 2\n"), "{t}");
        }
        a.remove("x_total", &[("backend", "a")]);
        assert!(!a.render().contains("backend=\"a\""));
    }

    #[test]
    #[should_panic(expected = "must end with _total")]
    fn a_counter_ends_with_total() {
        Registry::new().counter("x", "X.", &[]);
    }
}
