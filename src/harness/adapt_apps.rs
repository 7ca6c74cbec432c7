//! A fan-out jump through a real application with real processes on loopback
//! (`fermata bench adapt-apps`, tests/replan_procs.rs): a scheduler serving
//! a model repository, one backend running ONNX Runtime on the CPU
//! (`--executor onnx`), one frontend serving the repository's ensemble
//! `detect_classify` over HTTP (or several: the client sends to the first,
//! the others re-plan on the scheduler's sums alone), and an open-loop HTTP
//! client.
//!
//! The detector scores 8 patches and passes on those whose score is over its
//! threshold, each one request to `mlp`: the input decides the fan-out. The
//! client first finds a patch the detector passes (it asks the detector alone
//! about one random patch: if it does not pass, its negation does), then
//! sends application requests with `items_before` copies of it (and zero
//! patches, which never pass) and, from `jump_at_s` on, `items_after` copies.
//! With re-planning on (`--replan-every-s`), the frontend measures the
//! fan-out per epoch and re-plans the application when it drifts. The report
//! gives, per window of one epoch, the requests sent in it and the share not
//! answered 200 within the SLO, the frontend's re-plans before the jump and
//! at the end, and the plan in force at the end.

use super::http_load::{self, LoadSpec};
use super::procs::{ProcCluster, ProcOpts};
use crate::workload::Arrival;
use anyhow::{anyhow, bail, Context, Result};
use hyper::body::Bytes;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The application and the models it runs (as in models/apps).
pub const APP: &str = "detect_classify";
const DETECTOR: &str = "detector";
/// The detector's patches per input and features per patch.
const SLOTS: usize = 8;
const FEATURES: usize = 64;

#[derive(Debug, Clone, Serialize)]
pub struct Options {
    /// The repository holding `detector`, `mlp` and `detect_classify`
    /// (models/apps); copied, with the application's SLO set to `slo_ms`.
    pub models: PathBuf,
    /// Application requests per second (Poisson).
    pub rate_rps: f64,
    /// Items per request (patches that pass) before and from the jump.
    pub items_before: u32,
    pub items_after: u32,
    /// When the inputs change (s from the start of the load), the length of
    /// the run (s) and of the frontend's re-planning epoch (s; also the
    /// report's window).
    pub jump_at_s: f64,
    pub duration_s: f64,
    pub epoch_s: f64,
    /// The application's SLO (ms).
    pub slo_ms: f64,
    /// Whether the frontend re-plans (`--replan-every-s`), the epochs a
    /// drift must last first (`--replan-confirm`) and the parent outputs an
    /// epoch needs to measure a fan-out (`--replan-min-samples`).
    pub replan: bool,
    pub confirm: u32,
    pub min_samples: u64,
    /// Frontends serving the application (each with its HTTP API and the
    /// same re-planning settings); the client sends to the first only, so
    /// the others re-plan on the sums of the application's counters over
    /// every frontend (the scheduler's) alone.
    pub frontends: u32,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            models: PathBuf::from("models/apps"),
            rate_rps: 40.0,
            items_before: 1,
            items_after: 3,
            jump_at_s: 4.0,
            duration_s: 12.0,
            epoch_s: 1.0,
            slo_ms: 500.0,
            replan: true,
            confirm: 2,
            min_samples: 20,
            frontends: 1,
        }
    }
}

impl Options {
    pub fn check(&self) -> Result<()> {
        if !(self.rate_rps.is_finite() && self.rate_rps > 0.0 && self.rate_rps <= 5000.0) {
            bail!("the rate must be in (0, 5000] requests/s");
        }
        if self.items_before as usize > SLOTS || self.items_after as usize > SLOTS {
            bail!("at most {SLOTS} items per request (the detector's slots)");
        }
        if !(self.epoch_s >= 0.2 && self.epoch_s <= 60.0) {
            bail!("the epoch must be 0.2 to 60 s");
        }
        if !(self.duration_s.is_finite() && self.duration_s / self.epoch_s <= 600.0) {
            bail!("at most 600 windows");
        }
        if !(self.jump_at_s >= 0.0 && self.jump_at_s < self.duration_s) {
            bail!("the jump must come within the run");
        }
        if !(self.slo_ms.is_finite() && self.slo_ms >= 1.0 && self.slo_ms <= 60_000.0) {
            bail!("the SLO must be 1 ms to 60 s");
        }
        if self.confirm == 0 || self.min_samples == 0 {
            bail!("confirm and min_samples must be at least 1");
        }
        if !(1..=8).contains(&self.frontends) {
            bail!("1 to 8 frontends");
        }
        Ok(())
    }
}

/// One window of one epoch's length.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    pub start_s: f64,
    /// Items per request sent in it.
    pub items: u32,
    pub offered: u64,
    pub ok: u64,
    /// Answered 200, within the SLO or after it.
    pub answered_200: u64,
    /// Share of its requests not answered 200 within the SLO.
    pub bad: f64,
    pub unanswered: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub options: Options,
    pub windows: Vec<Window>,
    /// `fermata_app_replans_total` just before the first window of the
    /// jump, and at the end.
    pub replans_before_jump: u64,
    pub replans: u64,
    /// The planned fan-out of detector → mlp just before the first window
    /// of the jump (a re-plan before it can only be a latency one).
    pub planned_fanout_before_jump: Option<f64>,
    /// The plan in force at the end: the planned fan-out of detector → mlp
    /// and each step's budget (ms).
    pub planned_fanout: Option<f64>,
    pub budgets_ms: Vec<(String, f64)>,
    /// Each step's run time over its profile as the frontend measured it
    /// (`fermata_app_latency_ratio`) and the ratio the plan in force scales
    /// its profile by (`fermata_app_planned_latency_ratio`), at the end.
    pub latency_ratio: Vec<(String, f64)>,
    pub planned_latency_ratio: Vec<(String, f64)>,
    /// The client's requests: sent, with no answer (any status counts as
    /// one), and answered 200.
    pub offered: u64,
    pub unanswered: u64,
    pub answered_200: u64,
    /// The application's statistics at the frontend (Triton's `success`
    /// and `fail` counts): each request the door let in ends in exactly one
    /// of them (one the door refuses is answered without counting).
    pub server_success: u64,
    pub server_fail: u64,
    /// The frontend's items per parent output on detector → mlp at the end.
    pub fanout_outputs: u64,
    pub fanout_items: u64,
    /// The frontends the client did not send to (all but the first), at
    /// the end: what each re-planned on the sums alone.
    pub idle_frontends: Vec<IdleFrontend>,
    /// The processes' final reports.
    pub scheduler: Option<Value>,
    pub backends: Vec<Option<Value>>,
    pub frontends: Vec<Option<Value>>,
}

/// A frontend that served no request of the client, at the end of the run.
#[derive(Debug, Clone, Serialize)]
pub struct IdleFrontend {
    /// Application requests it received itself (Triton's `success` +
    /// `fail`).
    pub requests: u64,
    /// Its re-plans, the plan in force (planned fan-out of detector → mlp,
    /// budgets in ms), and the frontends and requests of the last sums it
    /// heard (`fermata_app_frontends_summed`,
    /// `fermata_app_requests_summed_total`).
    pub replans: u64,
    pub planned_fanout: Option<f64>,
    pub budgets_ms: Vec<(String, f64)>,
    pub frontends_summed: u64,
    pub requests_summed: u64,
}

impl Report {
    /// Requests sent from `from_s` on and the share of them that were bad.
    pub fn bad_from(&self, from_s: f64) -> (u64, f64) {
        let w: Vec<&Window> = self
            .windows
            .iter()
            .filter(|w| w.start_s >= from_s - 1e-9)
            .collect();
        let offered: u64 = w.iter().map(|w| w.offered).sum();
        let ok: u64 = w.iter().map(|w| w.ok).sum();
        let bad = if offered == 0 {
            0.0
        } else {
            (offered - ok) as f64 / offered as f64
        };
        (offered, bad)
    }
}

/// Runs the cluster of `exe` (the `fermata` binary) in a fresh folder under
/// the system's temporary folder.
pub fn run(exe: &Path, o: &Options) -> Result<Report> {
    o.check()?;
    let dir = std::env::temp_dir().join(format!(
        "fermata-adapt-apps-{}-{}",
        std::process::id(),
        run_tag()
    ));
    let r = copy_repo(&o.models, &dir, o.slo_ms).and_then(|()| run_in(exe, o, &dir));
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn run_tag() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Copies the detector, mlp and the application into `to`, the
/// application's SLO set to `slo_ms`.
fn copy_repo(from: &Path, to: &Path, slo_ms: f64) -> Result<()> {
    fn copy_dir(from: &Path, to: &Path) -> Result<()> {
        std::fs::create_dir_all(to).with_context(|| to.display().to_string())?;
        for e in std::fs::read_dir(from).with_context(|| from.display().to_string())? {
            let p = e?.path();
            let dest = to.join(p.file_name().expect("a file name"));
            if p.is_dir() {
                copy_dir(&p, &dest)?;
            } else {
                std::fs::copy(&p, &dest).with_context(|| p.display().to_string())?;
            }
        }
        Ok(())
    }
    for m in [DETECTOR, "mlp", APP] {
        copy_dir(&from.join(m), &to.join(m))?;
    }
    let cfg = to.join(APP).join("config.pbtxt");
    let text = std::fs::read_to_string(&cfg)?;
    let key = r#"key: "slo_ms" value: { string_value: ""#;
    let at = text
        .find(key)
        .ok_or_else(|| anyhow!("{}: no slo_ms parameter", cfg.display()))?
        + key.len();
    let end = at
        + text[at..]
            .find('"')
            .ok_or_else(|| anyhow!("{}: a bad slo_ms", cfg.display()))?;
    let text = format!("{}{slo_ms}{}", &text[..at], &text[end..]);
    std::fs::write(&cfg, text)?;
    Ok(())
}

/// `items` copies of `patch` then zero patches, as one application request.
fn body(patch: &[f32], items: u32) -> Bytes {
    let mut data = Vec::with_capacity(SLOTS * FEATURES);
    for s in 0..SLOTS {
        if s < items as usize {
            data.extend_from_slice(patch);
        } else {
            data.extend(std::iter::repeat_n(0.0f32, FEATURES));
        }
    }
    Bytes::from(
        json!({"inputs": [{
            "name": "PATCHES", "shape": [1, SLOTS, FEATURES], "datatype": "FP32", "data": data
        }]})
        .to_string(),
    )
}

/// A patch the detector passes: a random one, or its negation.
fn passing_patch(addr: SocketAddr) -> Result<Vec<f32>> {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
    for _ in 0..8 {
        let p: Vec<f32> = (0..FEATURES).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut data = p.clone();
        data.extend(std::iter::repeat_n(0.0f32, (SLOTS - 1) * FEATURES));
        let req = json!({"inputs": [{
            "name": "patches", "shape": [1, SLOTS, FEATURES], "datatype": "FP32", "data": data
        }]});
        // The first inferences of a fresh backend may miss the detector's
        // 20-ms SLO (a cold session): a few tries.
        let mut tries = 0;
        let (status, b) = loop {
            let (status, b) = http_load::post(
                addr,
                &format!("/v2/models/{DETECTOR}/infer"),
                Bytes::from(req.to_string()),
            )?;
            tries += 1;
            if status == 200 || tries >= 50 {
                break (status, b);
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if status != 200 {
            bail!(
                "the detector answered {status}: {}",
                String::from_utf8_lossy(&b)
            );
        }
        let v: Value = serde_json::from_slice(&b)?;
        let count = v["outputs"]
            .as_array()
            .and_then(|o| o.iter().find(|t| t["name"] == "count"))
            .and_then(|t| t["data"][0].as_i64())
            .ok_or_else(|| anyhow!("no count in the detector's answer: {v}"))?;
        let score = v["outputs"]
            .as_array()
            .and_then(|o| o.iter().find(|t| t["name"] == "scores"))
            .and_then(|t| t["data"][0].as_f64());
        match count {
            1 => return Ok(p),
            // Not passed: its negation scores 1 - score, over the threshold
            // unless the score is 0.5 exactly (then try another).
            0 if score != Some(0.5) => return Ok(p.iter().map(|x| -x).collect()),
            _ => {}
        }
    }
    bail!("no patch found that the detector passes")
}

/// The value of the series `name{labels}` in a Prometheus text.
fn series(text: &str, name_labels: &str) -> Option<f64> {
    let prefix = format!("{name_labels} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

fn replans(http: &str) -> Result<u64> {
    let text = super::churn::get_metrics(http)?;
    let v = series(
        &text,
        &format!("fermata_app_replans_total{{app=\"{APP}\"}}"),
    )
    .ok_or_else(|| anyhow!("no fermata_app_replans_total for {APP} in /metrics"))?;
    Ok(v as u64)
}

/// Each step's budget (ms) in the plan in force, from a frontend's metrics.
fn budgets(text: &str) -> Vec<(String, f64)> {
    [DETECTOR, "mlp"]
        .iter()
        .filter_map(|s| {
            series(
                text,
                &format!("fermata_app_budget_ms{{app=\"{APP}\",step=\"{s}\"}}"),
            )
            .map(|v| (s.to_string(), v))
        })
        .collect()
}

/// The application's statistics at the frontend whose HTTP API is at
/// `http`: Triton's `success` and `fail` counts.
fn app_stats(http: &str) -> Result<(u64, u64)> {
    let stats: Value = serde_json::from_str(&super::churn::http_get(
        http,
        &format!("/v2/models/{APP}/stats"),
    )?)?;
    let inf = &stats["model_stats"][0]["inference_stats"];
    let count = |k: &str| inf[k]["count"].as_u64().unwrap_or(0);
    Ok((count("success"), count("fail")))
}

/// What a frontend the client did not send to planned (its HTTP API's
/// metrics and statistics).
fn idle_frontend(http: &str, edge: &str) -> Result<IdleFrontend> {
    let text = super::churn::get_metrics(http)?;
    let app = |name: &str| series(&text, &format!("{name}{{app=\"{APP}\"}}")).unwrap_or(0.0) as u64;
    let (success, fail) = app_stats(http)?;
    Ok(IdleFrontend {
        requests: success + fail,
        replans: app("fermata_app_replans_total"),
        planned_fanout: series(&text, &format!("fermata_app_planned_fanout{edge}")),
        budgets_ms: budgets(&text),
        frontends_summed: app("fermata_app_frontends_summed"),
        requests_summed: app("fermata_app_requests_summed_total"),
    })
}

fn run_in(exe: &Path, o: &Options, dir: &Path) -> Result<Report> {
    let d = dir.display().to_string();
    let mut frontend_args: Vec<String> = ["--apps", &d, "--http-listen", "127.0.0.1:0"]
        .map(String::from)
        .to_vec();
    if o.replan {
        frontend_args.extend([
            "--replan-every-s".into(),
            o.epoch_s.to_string(),
            "--replan-confirm".into(),
            o.confirm.to_string(),
            "--replan-min-samples".into(),
            o.min_samples.to_string(),
        ]);
    }
    let po = ProcOpts {
        models: Some(dir.to_path_buf()),
        backend_args: vec![(
            0,
            ["--executor", "onnx", "--models", &d]
                .map(String::from)
                .to_vec(),
        )],
        frontend_args,
        frontends: o.frontends,
        ..ProcOpts::new(dir.join("unused.toml"))
    };
    let mut c = ProcCluster::start(exe, &po)?;
    let mut https = Vec::new();
    for f in &mut c.frontends {
        https.push(f.wait_for("the HTTP API", Duration::from_secs(20), |l| {
            l.strip_prefix("fermata frontend HTTP API listening on ")
                .map(|a| a.trim().to_string())
        })?);
    }
    let http = https[0].clone();
    let addr: SocketAddr = http.parse().with_context(|| http.clone())?;
    http_load::wait_ready(addr, APP, Duration::from_secs(60))?;
    let patch = passing_patch(addr)?;
    let before = body(&patch, o.items_before);
    let after = body(&patch, o.items_after);
    let n = (o.duration_s / o.epoch_s).round().max(1.0) as usize;
    let t0 = Instant::now();
    let mut runs = Vec::with_capacity(n);
    let mut replans_before_jump = None;
    let mut planned_fanout_before_jump = None;
    let edge = format!("{{app=\"{APP}\",from=\"{DETECTOR}\",to=\"mlp\"}}");
    for i in 0..n {
        let start_s = i as f64 * o.epoch_s;
        let jumped = start_s >= o.jump_at_s - 1e-9;
        if jumped && replans_before_jump.is_none() {
            replans_before_jump = Some(replans(&http)?);
            let text = super::churn::get_metrics(&http)?;
            planned_fanout_before_jump =
                series(&text, &format!("fermata_app_planned_fanout{edge}"));
        }
        let at = Duration::from_secs_f64(start_s);
        if let Some(wait) = at.checked_sub(t0.elapsed()) {
            std::thread::sleep(wait);
        }
        let items = if jumped {
            o.items_after
        } else {
            o.items_before
        };
        let spec = LoadSpec {
            addr,
            model: APP.into(),
            bodies: vec![if jumped {
                after.clone()
            } else {
                before.clone()
            }],
            slo: Duration::from_secs_f64(o.slo_ms / 1e3),
            rate_rps: o.rate_rps,
            arrival: Arrival::Poisson,
            warmup: Duration::ZERO,
            duration: Duration::from_secs_f64(o.epoch_s),
            seed: i as u64 + 1,
            warm_conns: 0,
            server_pid: None,
            stall: None,
        };
        let h = std::thread::spawn(move || http_load::run_load(&spec));
        runs.push((start_s, items, h));
    }
    let mut windows = Vec::with_capacity(n);
    for (start_s, items, h) in runs {
        let r = h.join().map_err(|_| anyhow!("an HTTP client panicked"))??;
        let c = r.counts;
        windows.push(Window {
            start_s,
            items,
            offered: c.offered,
            ok: c.ok,
            answered_200: c.ok + c.late_200,
            bad: c.bad_pct() / 100.0,
            unanswered: c.unanswered,
        });
    }
    let text = super::churn::get_metrics(&http)?;
    let replans = series(
        &text,
        &format!("fermata_app_replans_total{{app=\"{APP}\"}}"),
    )
    .unwrap_or(0.0) as u64;
    let planned_fanout = series(&text, &format!("fermata_app_planned_fanout{edge}"));
    let fanout_outputs =
        series(&text, &format!("fermata_app_fanout_outputs_total{edge}")).unwrap_or(0.0) as u64;
    let fanout_items =
        series(&text, &format!("fermata_app_fanout_items_total{edge}")).unwrap_or(0.0) as u64;
    let budgets_ms = budgets(&text);
    let per_step = |name: &str| -> Vec<(String, f64)> {
        [DETECTOR, "mlp"]
            .iter()
            .filter_map(|s| {
                series(&text, &format!("{name}{{app=\"{APP}\",step=\"{s}\"}}"))
                    .map(|v| (s.to_string(), v))
            })
            .collect()
    };
    let latency_ratio = per_step("fermata_app_latency_ratio");
    let planned_latency_ratio = per_step("fermata_app_planned_latency_ratio");
    let (server_success, server_fail) = app_stats(&http)?;
    let mut idle_frontends = Vec::new();
    for h in &https[1..] {
        idle_frontends.push(idle_frontend(h, &edge)?);
    }
    let reps = c.stop();
    Ok(Report {
        options: o.clone(),
        offered: windows.iter().map(|w| w.offered).sum(),
        unanswered: windows.iter().map(|w| w.unanswered).sum(),
        answered_200: windows.iter().map(|w| w.answered_200).sum(),
        windows,
        replans_before_jump: replans_before_jump.unwrap_or(replans),
        planned_fanout_before_jump,
        replans,
        planned_fanout,
        budgets_ms,
        latency_ratio,
        planned_latency_ratio,
        server_success,
        server_fail,
        fanout_outputs,
        fanout_items,
        idle_frontends,
        scheduler: reps.scheduler,
        backends: reps.backends,
        frontends: reps.frontends,
    })
}
