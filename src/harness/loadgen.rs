//! The load generator: drives frontends with the simulator's arrival processes
//! (same per-model seeds), open loop, and reports what clients saw: goodput, bad
//! rate, latency percentiles and the batch-size distribution, in the simulator's
//! [`RunResult`] so the same reports and the same goodput search apply.
//!
//! Every request is accounted for exactly once: a second answer for a request is
//! counted as a duplicate; a request with no answer by the end of the drain is
//! counted as unanswered (and as bad). With `verify`, outputs are checked against
//! the emulated GPU's (the input's length and hash).
//!
//! Real models (those the frontend lists with metadata, from a model repository)
//! get valid inputs in the model's byte layout instead of random bytes: see
//! [`crate::repo::ModelMeta::sample_input`]. Their outputs are checked only for length (the model's
//! output bytes per request), since the load generator cannot compute them.

use crate::arrivals::{model_gens, MergedArrivals};
use crate::core::{Dur, Time};
use crate::node::exec::emulated_output;
use crate::run::{new_hist, ModelResult, RunResult};
use crate::transport::{Conn, Event, Transport};
use crate::wire::{Msg, Outcome};
use crate::workload::{Arrival, Workload};
use anyhow::{bail, Context, Result};
use crossbeam_channel::RecvTimeoutError;
use hdrhistogram::Histogram;
use rand::{RngCore, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Load generator settings.
#[derive(Debug, Clone)]
pub struct LoadgenOpts {
    /// Frontend addresses; requests go round-robin.
    pub frontends: Vec<String>,
    pub rate_rps: f64,
    pub arrival: Arrival,
    pub seed: u64,
    pub warmup: Dur,
    pub duration: Dur,
    /// After the last arrival, wait this long for answers.
    pub drain: Duration,
    /// Check outputs against the emulated GPU's.
    pub verify: bool,
    /// Distinct inputs per model.
    pub pool: usize,
}

impl LoadgenOpts {
    pub fn new(frontends: Vec<String>, w: &Workload) -> LoadgenOpts {
        LoadgenOpts {
            frontends,
            rate_rps: w.rate_rps,
            arrival: w.arrival,
            seed: w.seed,
            warmup: w.warmup,
            duration: w.duration,
            drain: Duration::from_secs(5),
            verify: true,
            pool: 8,
        }
    }
}

/// What the clients saw.
pub struct LoadReport {
    /// Per model over the measured window (`dropped` includes failed and
    /// unanswered requests).
    pub sim: RunResult,
    /// Client-side latency of answered requests in the window (us).
    pub latency_us: Histogram<u64>,
    pub sent: u64,
    pub failed: u64,
    pub unanswered: u64,
    pub duplicates: u64,
    pub wrong_outputs: u64,
    /// How late requests were sent after their arrival time, p99 (us).
    pub send_lag_p99_us: f64,
}

impl LoadReport {
    pub fn json(&self, w: &Workload) -> serde_json::Value {
        let mut v = crate::run::run_json(w, &self.sim);
        let l = &self.latency_us;
        if let serde_json::Value::Object(m) = &mut v {
            m.insert(
                "latency_ms_p50".into(),
                (l.value_at_quantile(0.5) as f64 / 1e3).into(),
            );
            m.insert(
                "latency_ms_p99".into(),
                (l.value_at_quantile(0.99) as f64 / 1e3).into(),
            );
            m.insert("latency_ms_max".into(), (l.max() as f64 / 1e3).into());
            m.insert("sent".into(), self.sent.into());
            m.insert("failed".into(), self.failed.into());
            m.insert("unanswered".into(), self.unanswered.into());
            m.insert("duplicates".into(), self.duplicates.into());
            m.insert("wrong_outputs".into(), self.wrong_outputs.into());
            m.insert("send_lag_us_p99".into(), self.send_lag_p99_us.into());
        }
        v
    }
}

/// What a good output of one pooled input must be.
enum Expect {
    /// Exactly these bytes (the emulated GPU's output).
    Bytes(Vec<u8>),
    /// This many bytes (a real model's outputs per request).
    Len(usize),
}

impl Expect {
    fn ok(&self, out: &[u8]) -> bool {
        match self {
            Expect::Bytes(b) => out == b.as_slice(),
            Expect::Len(n) => out.len() == *n,
        }
    }
}

struct Rec {
    model: u32,
    pool: u32,
    sent: Instant,
    in_window: bool,
    done: bool,
}

/// Runs the load against the frontends and waits for the answers.
pub fn run(transport: Arc<dyn Transport>, w: &Workload, o: &LoadgenOpts) -> Result<LoadReport> {
    if o.frontends.is_empty() {
        bail!("no frontend address given");
    }
    if !(o.rate_rps > 0.0 && o.rate_rps.is_finite()) {
        bail!("the rate must be > 0, got {}", o.rate_rps);
    }
    let wall = Instant::now();
    let (tx, rx) = crate::transport::event_channel();
    let mut conns: Vec<Arc<dyn Conn>> = Vec::new();
    for a in &o.frontends {
        conns.push(
            transport
                .connect(a, tx.clone())
                .with_context(|| format!("cannot reach the frontend at {a}"))?,
        );
    }
    drop(tx);
    conns[0]
        .send(Msg::ListModels)
        .map_err(|e| anyhow::anyhow!("frontend: {e}"))?;
    let served = loop {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Event::Msg(_, Msg::Models { models })) => break models,
            Ok(Event::Closed(_, r)) => bail!("the frontend closed the connection: {r}"),
            Ok(_) => {}
            Err(_) => bail!("no model list from the frontend in 5 s"),
        }
    };
    // Workload model i -> (name, input pool, expected outputs).
    let mut names = Vec::new();
    let mut pools: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut expect: Vec<Vec<Expect>> = Vec::new();
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(o.seed ^ 0x1f2e3d4c);
    for m in &w.models {
        let Some(info) = served.iter().find(|s| s.name == m.spec.name) else {
            bail!(
                "the frontend does not serve model `{}` of the workload (it serves: {})",
                m.spec.name,
                served
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        };
        names.push(info.name.clone());
        let meta = match info.meta() {
            None => None,
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => bail!("model `{}`: the frontend sent bad metadata: {e}", info.name),
        };
        let mut p = Vec::new();
        for _ in 0..o.pool.max(1) {
            p.push(match &meta {
                Some(m) => m.sample_input(&mut rng),
                None => {
                    let mut b = vec![0u8; info.input_bytes as usize];
                    rng.fill_bytes(&mut b);
                    b
                }
            });
        }
        expect.push(
            p.iter()
                .map(|b| match &meta {
                    Some(m) => Expect::Len(m.output_bytes()),
                    None => Expect::Bytes(emulated_output(b)),
                })
                .collect(),
        );
        pools.push(p);
    }
    let mut arrivals = MergedArrivals::new(
        model_gens(w, o.arrival, o.rate_rps, o.seed, None),
        Time::ZERO + o.warmup + o.duration,
    );
    let win_start = Time::ZERO + o.warmup;
    let mut models: Vec<ModelResult> = w
        .models
        .iter()
        .map(|m| ModelResult::new(&m.spec.name))
        .collect();
    let mut recs: Vec<Rec> = Vec::with_capacity(
        (o.rate_rps * (o.warmup + o.duration).as_secs_f64() * 1.1) as usize + 16,
    );
    let mut rep = LoadReport {
        sim: RunResult {
            policy: w.policy,
            rate_rps: o.rate_rps,
            models: Vec::new(),
            gpu_busy: Vec::new(),
            sim_requests: 0,
            wall_secs: 0.0,
            plans: Vec::new(),
            preemptions: 0,
            window: o.duration,
        },
        latency_us: new_hist(),
        sent: 0,
        failed: 0,
        unanswered: 0,
        duplicates: 0,
        wrong_outputs: 0,
        send_lag_p99_us: 0.0,
    };
    let mut lag = new_hist();
    let mut open = 0u64;
    let t0 = Instant::now() + Duration::from_millis(20);
    let mut last_arrival = t0;
    let handle = |ev: Event,
                  recs: &mut Vec<Rec>,
                  models: &mut Vec<ModelResult>,
                  rep: &mut LoadReport,
                  open: &mut u64| {
        let Event::Msg(
            _,
            Msg::InferReply {
                req,
                status,
                queue,
                batch_size,
                output,
                ..
            },
        ) = ev
        else {
            return;
        };
        let Some(r) = recs.get_mut(req as usize) else {
            return;
        };
        if r.done {
            rep.duplicates += 1;
            return;
        }
        r.done = true;
        *open -= 1;
        if !r.in_window {
            return;
        }
        let mr = &mut models[r.model as usize];
        let wrong = o.verify
            && matches!(status, Outcome::Good | Outcome::Late)
            && !expect[r.model as usize][r.pool as usize].ok(&output);
        if wrong {
            rep.wrong_outputs += 1;
        }
        match status {
            Outcome::Good if !wrong => mr.good += 1,
            Outcome::Late if !wrong => mr.late += 1,
            Outcome::Dropped => mr.dropped += 1,
            _ => {
                rep.failed += 1;
                mr.dropped += 1;
            }
        }
        if batch_size > 0 {
            let b = batch_size as usize;
            if mr.batch_requests.len() <= b {
                mr.batch_requests.resize(b + 1, 0);
            }
            mr.batch_requests[b] += 1;
            mr.queuing_us
                .saturating_record((queue.0 / 1000).max(1) as u64);
        }
        if matches!(status, Outcome::Good | Outcome::Late) {
            rep.latency_us
                .saturating_record(r.sent.elapsed().as_micros().max(1) as u64);
        }
    };
    loop {
        let now = Instant::now();
        let rel = Time(now.saturating_duration_since(t0).as_nanos() as i64);
        while let Some((_, t)) = arrivals.peek() {
            if t > rel {
                break;
            }
            let (m, t) = arrivals.pop().expect("peeked");
            let req = recs.len() as u64;
            let pool = (req % pools[m].len() as u64) as u32;
            let in_window = t >= win_start;
            if in_window {
                models[m].offered += 1;
            }
            lag.saturating_record(((rel - t).0 / 1000).max(1) as u64);
            recs.push(Rec {
                model: m as u32,
                pool,
                sent: now,
                in_window,
                done: false,
            });
            open += 1;
            rep.sent += 1;
            let c = &conns[(req % conns.len() as u64) as usize];
            if let Err(e) = c.send(Msg::Infer {
                req,
                model: names[m].clone(),
                slo: Dur::ZERO,
                input: pools[m][pool as usize].clone(),
            }) {
                bail!("cannot send to the frontend: {e}");
            }
            last_arrival = now;
        }
        let done_sending = arrivals.is_empty();
        if done_sending && (open == 0 || now.duration_since(last_arrival) > o.drain) {
            break;
        }
        let wait = match arrivals.peek() {
            Some((_, t)) => Duration::from_nanos((t - rel).0.max(0) as u64),
            None => Duration::from_millis(5),
        };
        match rx.recv_timeout(wait.min(Duration::from_millis(5))) {
            Ok(ev) => {
                if let Event::Closed(_, r) = &ev {
                    if !done_sending || open > 0 {
                        bail!("a frontend closed the connection: {r}");
                    }
                }
                handle(ev, &mut recs, &mut models, &mut rep, &mut open);
                while let Ok(ev) = rx.try_recv() {
                    handle(ev, &mut recs, &mut models, &mut rep, &mut open);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    for r in recs.iter().filter(|r| !r.done && r.in_window) {
        rep.unanswered += 1;
        models[r.model as usize].dropped += 1;
    }
    for c in &conns {
        c.close("load generator done");
    }
    rep.send_lag_p99_us = lag.value_at_quantile(0.99) as f64;
    rep.sim.models = models;
    rep.sim.sim_requests = rep.sent;
    rep.sim.wall_secs = wall.elapsed().as_secs_f64();
    Ok(rep)
}
