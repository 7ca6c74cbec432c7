//! The load generator: drives frontends with the simulator's arrival processes
//! (same per-model seeds), open loop, and reports what clients saw: goodput, bad
//! rate, latency percentiles and the batch-size distribution, in the simulator's
//! [`RunResult`] so the same reports and the same goodput search apply.
//!
//! Every request is accounted for exactly once: a second answer for a request is
//! counted as a duplicate; a request with no answer by the end of the drain is
//! counted as unanswered (and as bad). A frontend that closes its connection
//! (it died, or shed the load generator) does not end the run: the requests open
//! on it are counted as unanswered at once, named by frontend in
//! [`LoadReport::lost`], and later arrivals go round-robin over the frontends
//! still connected (with none left, they count as unanswered unsent). With
//! `verify`, outputs are checked against the emulated GPU's (the input's length
//! and hash).
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
use crate::wire::{ModelInfo, Msg, Outcome};
use crate::workload::{Arrival, Workload};
use anyhow::{bail, Context, Result};
use crossbeam_channel::{Receiver, RecvTimeoutError};
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
    /// Of `failed`, by the frontend's message: at most [`FAILED_REASONS`]
    /// distinct messages, most frequent first once the run ends; the rest
    /// counted under [`OTHER_REASONS`].
    pub failed_reasons: Vec<(String, u64)>,
    /// Requests in the window never answered: those sent whose frontend was
    /// lost or that had no answer by the end, and those never sent.
    pub unanswered: u64,
    /// Requests answered (window or not).
    pub answered: u64,
    /// Requests never sent, no frontend being left to take them (window or
    /// not); `sent - answered` were in flight when their frontend was lost
    /// (or unanswered at the end).
    pub never_sent: u64,
    pub duplicates: u64,
    pub wrong_outputs: u64,
    /// How late requests were sent after their arrival time, p99 (us).
    pub send_lag_p99_us: f64,
    /// The frontends whose connection ended before the run did, in the order
    /// they went.
    pub lost: Vec<LostFrontend>,
}

impl LoadReport {
    /// Checks a run that nothing disturbed: more than `min_offered` requests
    /// offered, none failed, unanswered or answered twice, and a bad rate
    /// below `max_bad`; panics naming what did not hold (for tests).
    pub fn assert_served(&self, min_offered: u64, max_bad: f64) {
        assert!(
            self.sim.offered() > min_offered,
            "offered {}",
            self.sim.offered()
        );
        assert_eq!(self.failed, 0, "no request failed");
        assert_eq!(self.unanswered, 0, "every request answered");
        assert_eq!(self.duplicates, 0);
        assert!(
            self.sim.bad_rate() < max_bad,
            "bad rate {} (offered {})",
            self.sim.bad_rate(),
            self.sim.offered()
        );
    }
}

/// A frontend whose connection ended during the run, and what it took along.
#[derive(Debug, Clone)]
pub struct LostFrontend {
    pub addr: String,
    /// Why the connection ended, as the transport said.
    pub reason: String,
    /// Seconds into the run when it ended.
    pub at_secs: f64,
    /// Requests it had been sent and had not answered (all of them, window or
    /// not); those in the measured window are in `unanswered` too.
    pub open: u64,
    /// The first few of those, for the log: (request id, model).
    pub examples: Vec<(u64, String)>,
}

/// How many unanswered requests a lost frontend names.
const LOST_EXAMPLES: usize = 5;

/// Most distinct failure messages a report keeps.
pub const FAILED_REASONS: usize = 8;
/// What the failures past [`FAILED_REASONS`] distinct messages are counted
/// under.
pub const OTHER_REASONS: &str = "(other reasons)";

/// Counts a failure of `message` in `reasons` (bounded, see
/// [`FAILED_REASONS`]).
fn count_reason(reasons: &mut Vec<(String, u64)>, message: &str) {
    let message = if message.is_empty() {
        "(no message)"
    } else {
        message
    };
    if let Some(r) = reasons.iter_mut().find(|(m, _)| m == message) {
        r.1 += 1;
    } else if reasons.len() < FAILED_REASONS {
        reasons.push((message.to_string(), 1));
    } else if let Some(r) = reasons.iter_mut().find(|(m, _)| m == OTHER_REASONS) {
        r.1 += 1;
    } else {
        reasons.push((OTHER_REASONS.to_string(), 1));
    }
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
            m.insert(
                "failed_reasons".into(),
                self.failed_reasons
                    .iter()
                    .map(|(m, n)| serde_json::json!({"message": m, "count": n}))
                    .collect::<Vec<_>>()
                    .into(),
            );
            m.insert("unanswered".into(), self.unanswered.into());
            m.insert("answered".into(), self.answered.into());
            m.insert("never_sent".into(), self.never_sent.into());
            m.insert("duplicates".into(), self.duplicates.into());
            m.insert("wrong_outputs".into(), self.wrong_outputs.into());
            m.insert("send_lag_us_p99".into(), self.send_lag_p99_us.into());
            m.insert(
                "frontends_lost".into(),
                self.lost
                    .iter()
                    .map(|l| {
                        serde_json::json!({
                            "frontend": l.addr,
                            "reason": l.reason,
                            "at_s": l.at_secs,
                            "unanswered": l.open,
                            "examples": l.examples.iter()
                                .map(|(r, m)| serde_json::json!({"req": r, "model": m}))
                                .collect::<Vec<_>>(),
                        })
                    })
                    .collect::<Vec<_>>()
                    .into(),
            );
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
    /// The frontend it was sent to (an index into the connections), or
    /// `NOT_SENT` when no frontend was left.
    fe: u32,
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
    let (conns, rx) = connect(transport.as_ref(), o)?;
    let served = list_models(conns[0].as_ref(), &rx)?;
    let inputs = Inputs::new(w, o, &served)?;
    let mut d = Driver::new(w, o, conns, rx, inputs);
    d.drive();
    Ok(d.finish(wall))
}

/// The connections to the frontends, in the order of their addresses.
type Conns = Vec<Arc<dyn Conn>>;

/// `Rec::fe` of a request no frontend was left to take.
const NOT_SENT: u32 = u32::MAX;

/// Connects to every frontend; their events come on the one receiver.
fn connect(transport: &dyn Transport, o: &LoadgenOpts) -> Result<(Conns, Receiver<Event>)> {
    let (tx, rx) = crate::transport::event_channel();
    let mut conns: Conns = Vec::new();
    for a in &o.frontends {
        conns.push(
            transport
                .connect(a, tx.clone())
                .with_context(|| format!("cannot reach the frontend at {a}"))?,
        );
    }
    drop(tx);
    Ok((conns, rx))
}

/// Asks a frontend for the models it serves.
fn list_models(c: &dyn Conn, rx: &Receiver<Event>) -> Result<Vec<ModelInfo>> {
    c.send(Msg::ListModels)
        .map_err(|e| anyhow::anyhow!("frontend: {e}"))?;
    loop {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Event::Msg(_, Msg::Models { models })) => return Ok(models),
            Ok(Event::Closed(_, r)) => bail!("the frontend closed the connection: {r}"),
            Ok(_) => {}
            Err(_) => bail!("no model list from the frontend in 5 s"),
        }
    }
}

/// Per workload model i: its name at the frontend, its input pool and what
/// each pooled input's output must be.
struct Inputs {
    names: Vec<String>,
    pools: Vec<Vec<bytes::Bytes>>,
    expect: Vec<Vec<Expect>>,
}

impl Inputs {
    /// Makes the input pools of the workload's models (each must be served).
    fn new(w: &Workload, o: &LoadgenOpts, served: &[ModelInfo]) -> Result<Inputs> {
        let mut inputs = Inputs {
            names: Vec::new(),
            pools: Vec::new(),
            expect: Vec::new(),
        };
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
            inputs.names.push(info.name.clone());
            let (p, expect) = model_pool(info, o.pool.max(1), &mut rng)?;
            inputs.expect.push(expect);
            inputs
                .pools
                .push(p.into_iter().map(bytes::Bytes::from).collect());
        }
        Ok(inputs)
    }
}

/// `n` inputs for a model and their expected outputs: valid inputs in a real
/// model's layout (outputs checked for length), else random bytes (outputs
/// the emulated GPU's).
fn model_pool(
    info: &ModelInfo,
    n: usize,
    rng: &mut rand_xoshiro::Xoshiro256PlusPlus,
) -> Result<(Vec<Vec<u8>>, Vec<Expect>)> {
    let meta = match info.meta() {
        None => None,
        Some(Ok(m)) => Some(m),
        Some(Err(e)) => bail!("model `{}`: the frontend sent bad metadata: {e}", info.name),
    };
    let mut p = Vec::new();
    for _ in 0..n {
        p.push(match &meta {
            Some(m) => m.sample_input(rng),
            None => {
                let mut b = vec![0u8; info.input_bytes as usize];
                rng.fill_bytes(&mut b);
                b
            }
        });
    }
    let expect = p
        .iter()
        .map(|b| match &meta {
            Some(m) => Expect::Len(m.output_bytes()),
            None => Expect::Bytes(emulated_output(b)),
        })
        .collect();
    Ok((p, expect))
}

/// One load run: sends each arrival when it is due and counts the answers.
struct Driver<'a> {
    o: &'a LoadgenOpts,
    conns: Conns,
    rx: Receiver<Event>,
    inputs: Inputs,
    arrivals: MergedArrivals,
    win_start: Time,
    models: Vec<ModelResult>,
    recs: Vec<Rec>,
    rep: LoadReport,
    lag: Histogram<u64>,
    /// Requests sent and not answered yet.
    open: u64,
    /// Whether each connection is still up.
    live: Vec<bool>,
    /// The next connection to try (round-robin over the live ones).
    next: usize,
    t0: Instant,
    last_arrival: Instant,
}

impl<'a> Driver<'a> {
    /// A run that starts 20 ms from now.
    fn new(
        w: &Workload,
        o: &'a LoadgenOpts,
        conns: Conns,
        rx: Receiver<Event>,
        inputs: Inputs,
    ) -> Driver<'a> {
        let arrivals = MergedArrivals::new(
            model_gens(w, o.arrival, o.rate_rps, o.seed, None),
            Time::ZERO + o.warmup + o.duration,
        );
        let models = w
            .models
            .iter()
            .map(|m| ModelResult::new(&m.spec.name))
            .collect();
        let recs = Vec::with_capacity(
            (o.rate_rps * (o.warmup + o.duration).as_secs_f64() * 1.1) as usize + 16,
        );
        let rep = empty_report(w, o);
        let lag = new_hist();
        let t0 = Instant::now() + Duration::from_millis(20);
        let live = vec![true; conns.len()];
        Driver {
            o,
            live,
            next: 0,
            conns,
            rx,
            inputs,
            arrivals,
            win_start: Time::ZERO + o.warmup,
            models,
            recs,
            rep,
            lag,
            open: 0,
            t0,
            last_arrival: t0,
        }
    }

    /// Sends the arrivals as they fall due and takes the answers, until all
    /// are sent and answered (or the drain time has passed since the last).
    fn drive(&mut self) {
        loop {
            let now = Instant::now();
            let mut rel = Time(now.saturating_duration_since(self.t0).as_nanos() as i64);
            if !self.live.contains(&true) {
                // Every frontend is gone: the rest of the arrivals are counted
                // (unsent, unanswered) at once rather than waited for.
                rel = Time(i64::MAX);
            }
            self.send_due(now, rel);
            let done_sending = self.arrivals.is_empty();
            if done_sending
                && (self.open == 0 || now.duration_since(self.last_arrival) > self.o.drain)
            {
                break;
            }
            let wait = match self.arrivals.peek() {
                Some((_, t)) => Duration::from_nanos((t - rel).0.max(0) as u64),
                None => Duration::from_millis(5),
            };
            match self.rx.recv_timeout(wait.min(Duration::from_millis(5))) {
                Ok(ev) => {
                    self.handle(ev);
                    while let Ok(ev) = self.rx.try_recv() {
                        self.handle(ev);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    if self.arrivals.is_empty() {
                        break;
                    }
                    std::thread::sleep(wait.min(Duration::from_millis(5)));
                }
            }
        }
    }

    /// Sends every arrival due by `rel` (the run's time at `now`).
    fn send_due(&mut self, now: Instant, rel: Time) {
        while let Some((_, t)) = self.arrivals.peek() {
            if t > rel {
                break;
            }
            let (m, t) = self.arrivals.pop().expect("peeked");
            let req = self.recs.len() as u64;
            let pool = (req % self.inputs.pools[m].len() as u64) as u32;
            let in_window = t >= self.win_start;
            if in_window {
                self.models[m].offered += 1;
            }
            self.recs.push(Rec {
                model: m as u32,
                pool,
                fe: NOT_SENT,
                sent: now,
                in_window,
                done: false,
            });
            self.last_arrival = now;
            // To the next live frontend; one whose connection refuses the send
            // is lost (its Closed event follows) and the next one is tried.
            // With none left the request is never sent, never answered
            // (`finish` counts it).
            while let Some(i) = self.pick() {
                let sent = self.conns[i].send(Msg::Infer {
                    req,
                    model: self.inputs.names[m].clone(),
                    slo: Dur::ZERO,
                    // Shared: the pooled input is sent without a copy.
                    input: self.inputs.pools[m][pool as usize].clone(),
                });
                if let Err(e) = sent {
                    let id = self.conns[i].id();
                    self.lose(id, format!("send failed: {e}"));
                    continue;
                }
                self.recs[req as usize].fe = i as u32;
                self.open += 1;
                self.rep.sent += 1;
                self.lag
                    .saturating_record(((rel - t).0 / 1000).max(1) as u64);
                break;
            }
        }
    }

    /// The next live frontend, round-robin; `None` when every one is gone.
    fn pick(&mut self) -> Option<usize> {
        let n = self.conns.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            if self.live[i] {
                self.next = (i + 1) % n;
                return Some(i);
            }
        }
        None
    }

    /// A frontend's connection ended: the requests open on it will not be
    /// answered; they are ended now (as unanswered, in `finish`) and named.
    fn lose(&mut self, conn: crate::transport::ConnId, reason: String) {
        let Some(i) = self.conns.iter().position(|c| c.id() == conn) else {
            return;
        };
        if !std::mem::replace(&mut self.live[i], false) {
            return;
        }
        let mut lost = LostFrontend {
            addr: self.o.frontends.get(i).cloned().unwrap_or_default(),
            reason,
            at_secs: self.t0.elapsed().as_secs_f64(),
            open: 0,
            examples: Vec::new(),
        };
        // Requests still open are counted as unanswered by `finish` (done stays
        // false); they are taken off `open` here so the drain need not wait.
        for (req, r) in self.recs.iter().enumerate() {
            if !r.done && r.fe == i as u32 {
                lost.open += 1;
                if lost.examples.len() < LOST_EXAMPLES {
                    lost.examples
                        .push((req as u64, self.inputs.names[r.model as usize].clone()));
                }
            }
        }
        self.open -= lost.open;
        self.rep.lost.push(lost);
    }

    /// Counts an answer (a second one for a request as a duplicate), and a
    /// frontend's connection ending; other events are ignored.
    fn handle(&mut self, ev: Event) {
        if let Event::Closed(c, why) = ev {
            if !self.arrivals.is_empty() || self.open > 0 {
                self.lose(c, why);
            }
            return;
        }
        let Event::Msg(
            _,
            Msg::InferReply {
                req,
                status,
                queue,
                batch_size,
                output,
                message,
                ..
            },
        ) = ev
        else {
            return;
        };
        let Some(r) = self.recs.get_mut(req as usize) else {
            return;
        };
        if r.fe == NOT_SENT || !self.live[r.fe as usize] {
            // From a frontend already counted lost (its last words raced the
            // close): it stays unanswered, as counted.
            return;
        }
        if r.done {
            self.rep.duplicates += 1;
            return;
        }
        r.done = true;
        self.open -= 1;
        if !r.in_window {
            return;
        }
        let mr = &mut self.models[r.model as usize];
        let answered = matches!(status, Outcome::Good | Outcome::Late);
        let wrong = self.o.verify
            && answered
            && !self.inputs.expect[r.model as usize][r.pool as usize].ok(&output);
        if wrong {
            self.rep.wrong_outputs += 1;
            count_reason(&mut self.rep.failed_reasons, "wrong output");
        } else if status == Outcome::Failed {
            count_reason(&mut self.rep.failed_reasons, &message);
        }
        count_outcome(mr, &mut self.rep, status, wrong);
        record_batch(mr, batch_size, queue);
        if answered {
            self.rep
                .latency_us
                .saturating_record(r.sent.elapsed().as_micros().max(1) as u64);
        }
    }

    /// Counts what was never answered, closes the connections and returns the
    /// report.
    fn finish(mut self, wall: Instant) -> LoadReport {
        for r in self.recs.iter().filter(|r| !r.done && r.in_window) {
            self.rep.unanswered += 1;
            self.models[r.model as usize].dropped += 1;
        }
        self.rep.answered = self.recs.iter().filter(|r| r.done).count() as u64;
        self.rep.never_sent = self.recs.iter().filter(|r| r.fe == NOT_SENT).count() as u64;
        for c in &self.conns {
            c.close("load generator done");
        }
        let mut rep = self.rep;
        rep.send_lag_p99_us = self.lag.value_at_quantile(0.99) as f64;
        rep.failed_reasons
            .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        rep.sim.models = self.models;
        rep.sim.sim_requests = rep.sent;
        rep.sim.wall_secs = wall.elapsed().as_secs_f64();
        rep
    }
}

/// A report with nothing counted yet.
fn empty_report(w: &Workload, o: &LoadgenOpts) -> LoadReport {
    LoadReport {
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
        failed_reasons: Vec::new(),
        unanswered: 0,
        answered: 0,
        never_sent: 0,
        duplicates: 0,
        wrong_outputs: 0,
        send_lag_p99_us: 0.0,
        lost: Vec::new(),
    }
}

/// Counts an answered request in the window by its outcome (a wrong output
/// counts as failed).
fn count_outcome(mr: &mut ModelResult, rep: &mut LoadReport, status: Outcome, wrong: bool) {
    match status {
        Outcome::Good if !wrong => mr.good += 1,
        Outcome::Late if !wrong => mr.late += 1,
        Outcome::Dropped => mr.dropped += 1,
        _ => {
            rep.failed += 1;
            mr.dropped += 1;
        }
    }
}

/// Records the size of the batch a request ran in and its queuing time (if
/// it ran).
fn record_batch(mr: &mut ModelResult, batch_size: u32, queue: Dur) {
    if batch_size > 0 {
        let b = batch_size as usize;
        if mr.batch_requests.len() <= b {
            mr.batch_requests.resize(b + 1, 0);
        }
        mr.batch_requests[b] += 1;
        mr.queuing_us
            .saturating_record((queue.0 / 1000).max(1) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::{count_reason, FAILED_REASONS, OTHER_REASONS};

    /// Failures are counted by message, at most `FAILED_REASONS` distinct
    /// ones; the rest go under one line, so a flood of distinct messages
    /// cannot grow the report.
    #[test]
    fn failure_reasons_are_counted_and_bounded() {
        let mut r = Vec::new();
        count_reason(&mut r, "region full");
        count_reason(&mut r, "region full");
        count_reason(&mut r, "");
        assert_eq!(
            r,
            vec![
                ("region full".to_string(), 2),
                ("(no message)".to_string(), 1)
            ]
        );
        for i in 0..100 {
            count_reason(&mut r, &format!("reason {i}"));
        }
        assert_eq!(r.len(), FAILED_REASONS + 1);
        let other = r.iter().find(|(m, _)| m == OTHER_REASONS).unwrap().1;
        assert_eq!(other, 100 - (FAILED_REASONS as u64 - 2));
        assert_eq!(r.iter().map(|(_, n)| n).sum::<u64>(), 103);
    }
}
