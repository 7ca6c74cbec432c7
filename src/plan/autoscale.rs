//! Autoscaling (Symphony Section 3.5): the signals, the advice, and the closed
//! loop that acts on it.
//!
//! Deferred scheduling packs work onto the lowest-numbered GPUs, so at light
//! load whole GPUs with the highest ids stay idle. Two numbers over a sliding
//! window say how many GPUs the load needs: the GPUs' idle fraction f and the
//! bad rate r (requests dropped or finished past their deadline). With N GPUs in
//! service, when r is above its threshold the load needs about N·r/(1−r) more
//! (the bad share, served at the present goodput per GPU); when f is above its
//! threshold N·f GPUs' worth of time is idle, and the highest-numbered GPUs are
//! the ones to release.
//!
//! [`advise`] turns the signals into advice naming GPUs and backends;
//! [`Controller`] (the loop behind `fermata autoscale`) decides launches and
//! drains from successive advice with a provisioning delay, cool-downs and
//! bounds. Both are pure: time comes in as seconds.

use serde::{Deserialize, Serialize};

/// The window both signals are measured over (the scheduler's GPU busy window).
pub const SIGNAL_WINDOW_S: f64 = 10.0;

/// The signals of a set of GPUs (a sub-cluster or the whole cluster) over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signals {
    /// The window the figures cover (s; shorter right after a start).
    pub window_s: f64,
    /// GPUs in service now (draining ones left out).
    pub gpus: u32,
    /// Mean idle fraction of the GPUs in service over the window (0..1).
    pub idle_fraction: f64,
    /// Tasks that reached the scheduler in the window.
    pub tasks: u64,
    /// Of those, bad: dropped, failed or finished past their deadline.
    pub bad: u64,
    /// bad / tasks (0 without tasks).
    pub bad_rate: f64,
    /// GPUs' worth of work the load brings ([`demand_gpus`]), when known.
    #[serde(default)]
    pub demand_gpus: Option<f64>,
    /// That demand's trend (GPUs per second, negative when it falls; 0 when
    /// unknown): the least-squares slope over the last [`TREND_SPAN_S`].
    #[serde(default)]
    pub demand_rise_per_s: f64,
    /// The window the demand's rates cover (s; [`DEMAND_WINDOW_S`] once the
    /// scheduler has run that long).
    #[serde(default)]
    pub demand_window_s: f64,
}

impl Signals {
    /// Signals over `window_s` with `bad` of `tasks` bad (the bad rate their
    /// ratio, at most 1), the demand unknown.
    pub fn new(window_s: f64, gpus: u32, idle_fraction: f64, tasks: u64, bad: u64) -> Signals {
        Signals {
            window_s,
            gpus,
            idle_fraction,
            tasks,
            bad,
            bad_rate: if tasks == 0 {
                0.0
            } else {
                (bad as f64 / tasks as f64).min(1.0)
            },
            demand_gpus: None,
            demand_rise_per_s: 0.0,
            demand_window_s: 0.0,
        }
    }
}

/// The GPUs' worth of work a load brings when each model runs the largest
/// batch its rate fills within its SLO: Σ λ·l(b)/b over the models (rate λ
/// requests/s, SLO, profile l), b the largest batch with (b−1)/λ + l(b) ≤ SLO
/// (the first request waits for the other b−1 to arrive, then the batch runs).
///
/// Unlike the busy time, this does not grow when deferred batching lets
/// batches fill spare GPU time, and unlike the largest batch the profile
/// allows it does not assume a rate that fills it: on the paper's A100
/// profiles (24 models, `fermata bench fig15`, from 10% to the peak of the
/// trace) it is 0.87–0.96 of the fewest GPUs the simulated capacity curve says
/// the load needs at 64 GPUs, 0.93–1.00 at 512.
pub fn demand_gpus<'a>(
    models: impl IntoIterator<Item = (f64, &'a crate::core::LatencyProfile, crate::core::Dur)>,
) -> f64 {
    let mut d = 0.0;
    for (rate, profile, slo) in models {
        if !(rate > 0.0 && rate.is_finite()) {
            continue;
        }
        let slo = slo.as_secs_f64();
        // (b−1)/λ + l(b) grows with b; a model whose SLO is under l(1) runs
        // batches of one (as many as it can).
        let b = crate::core::profile::largest_fitting(profile.max_batch(), |b| {
            (b as f64 - 1.0) / rate + profile.latency(b).as_secs_f64() <= slo
        })
        .max(1);
        d += rate * profile.latency(b).as_secs_f64() / b as f64;
    }
    d
}

/// Thresholds of the advice.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdviceConfig {
    /// Advise adding GPUs when the bad rate is above this.
    pub bad_threshold: f64,
    /// Advise releasing GPUs when the idle fraction is above this.
    pub idle_threshold: f64,
    /// Signals over fewer tasks than this (and a window shorter than half the
    /// full one) advise nothing: too little to go on.
    pub min_tasks: u64,
    /// 0: the paper's rule. Above 0, the advice keeps this share of the GPUs'
    /// time spare (an extension: a reactive loop adds GPUs only after requests
    /// went bad): with the bad rate under its threshold, the busy GPUs'
    /// worth N·(1−f) needs ceil(N·(1−f)/(1−headroom)) GPUs; fewer in service
    /// is an add, and with f above the idle threshold the release comes down
    /// to that many instead of N·f.
    #[serde(default)]
    pub headroom: f64,
    /// 0: off. Above 0 (with the signals' demand known and the bad rate under
    /// its threshold): the GPUs the load needs are W = ceil(demand / u), the
    /// demand carried along its trend; fewer in service is an add up to W,
    /// more than [`RELEASE_BAND`]·W a release down to it (another extension;
    /// the band keeps the count from following every wiggle of the rates).
    #[serde(default)]
    pub target_utilization: f64,
    /// With `target_utilization`: size for the demand this many seconds past
    /// the middle of the window it is measured over, along its trend: the
    /// time until GPUs the next decision adds are in service (half the
    /// demand's window, the decision interval and the provisioning delay).
    #[serde(default)]
    pub lookahead_s: f64,
}

impl Default for AdviceConfig {
    fn default() -> Self {
        AdviceConfig {
            bad_threshold: 0.01,
            idle_threshold: 0.3,
            min_tasks: 50,
            headroom: 0.0,
            target_utilization: 0.0,
            lookahead_s: 0.0,
        }
    }
}

/// A GPU slot in service and the backend that has it. Without lanes a slot
/// is a GPU; with them (`fermata backend --lanes E`) it is one of the E lanes
/// of a device, and the advice adds and releases whole devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuOwner {
    /// The slot's global id (what the scheduler's core plans).
    pub gpu: u32,
    pub node: u64,
    /// The backend's registered name.
    pub name: String,
    /// The device on its backend the slot is a lane of (its slot index / lanes).
    #[serde(default)]
    pub device: u32,
    /// Lanes of that device (1: the slot is the GPU).
    #[serde(default = "one")]
    pub lanes: u32,
}

fn one() -> u32 {
    1
}

/// What to do about the GPUs' number. The signals and the rules count slots
/// (the GPUs the core plans); with lanes the advice is then turned into whole
/// devices: an add of k slots is ceil(k / lanes) GPUs, a release frees only
/// devices all of whose lanes fit in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    /// "add", "release" or "hold".
    pub action: String,
    /// GPUs (devices) to add (ceil(N·r/(1−r)) slots, in devices).
    pub add_gpus: u32,
    /// The slots to release (floor(N·f), at most N − 1): the highest ids in
    /// service, every lane of each device released.
    pub release_gpus: Vec<u32>,
    /// GPUs (devices) `release_gpus` makes up.
    #[serde(default)]
    pub release_count: u32,
    /// GPUs (devices) in service.
    #[serde(default)]
    pub gpus_in_service: u32,
    /// Lanes per GPU (1 without lanes).
    #[serde(default = "one")]
    pub lanes: u32,
    /// The backends all of whose GPUs are in `release_gpus` (highest GPU first):
    /// the ones to drain and stop. (node id, name)
    pub release_backends: Vec<(u64, String)>,
    /// Why, for people.
    pub reason: String,
}

impl Default for Advice {
    /// Nothing to do, no reason given.
    fn default() -> Advice {
        Advice {
            action: "hold".into(),
            add_gpus: 0,
            release_gpus: Vec::new(),
            release_count: 0,
            gpus_in_service: 0,
            lanes: 1,
            release_backends: Vec::new(),
            reason: String::new(),
        }
    }
}

/// The advice for `s` over the GPU slots `owners` (those in service), in
/// whole GPUs.
pub fn advise(s: &Signals, owners: &[GpuOwner], cfg: &AdviceConfig) -> Advice {
    in_devices(advise_slots(s, owners, cfg), owners)
}

/// The advice in slots turned into whole devices (see [`Advice`]); the same
/// advice when every slot is a GPU.
fn in_devices(mut a: Advice, owners: &[GpuOwner]) -> Advice {
    // Devices in service: ((node, device), lanes, its slots).
    let mut devs: Vec<((u64, u32), u32, Vec<u32>)> = Vec::new();
    for o in owners {
        match devs.iter_mut().find(|d| d.0 == (o.node, o.device)) {
            Some(d) => d.2.push(o.gpu),
            None => devs.push(((o.node, o.device), o.lanes.max(1), vec![o.gpu])),
        }
    }
    let lanes = devs.iter().map(|d| d.1).max().unwrap_or(1);
    a.gpus_in_service = devs.len() as u32;
    a.lanes = lanes;
    a.release_count = a.release_gpus.len() as u32;
    if lanes == 1 {
        return a;
    }
    match a.action.as_str() {
        "add" => {
            let slots = a.add_gpus;
            a.add_gpus = slots.div_ceil(lanes);
            a.reason = format!(
                "{}; {slots} slots of {lanes} lanes: add {} GPUs",
                a.reason, a.add_gpus
            );
            a
        }
        "release" => {
            // Whole devices, the one with the highest slot id first, as many
            // as fit in the slots the rule frees.
            let k = a.release_gpus.len();
            for d in &mut devs {
                d.2.sort_unstable_by(|x, y| y.cmp(x));
            }
            devs.sort_by_key(|d| std::cmp::Reverse(d.2.first().copied()));
            let mut ids = Vec::new();
            let mut count = 0;
            for d in &devs {
                if ids.len() + d.2.len() > k {
                    break;
                }
                ids.extend(&d.2);
                count += 1;
            }
            let reason = if count == 0 {
                format!("{}; {k} slots are under one GPU of {lanes} lanes", a.reason)
            } else {
                format!(
                    "{}; {k} slots of {lanes} lanes: release {count} GPUs",
                    a.reason
                )
            };
            Advice {
                action: if count == 0 { "hold" } else { "release" }.into(),
                release_backends: backends_within(owners, &ids),
                release_gpus: ids,
                release_count: count,
                gpus_in_service: a.gpus_in_service,
                lanes,
                reason,
                ..Advice::default()
            }
        }
        _ => a,
    }
}

/// The advice for `s` over the GPU slots `owners`, in slots.
fn advise_slots(s: &Signals, owners: &[GpuOwner], cfg: &AdviceConfig) -> Advice {
    let hold = |reason: String| Advice {
        reason,
        ..Advice::default()
    };
    let n = s.gpus as f64;
    if s.tasks < cfg.min_tasks && s.window_s < SIGNAL_WINDOW_S / 2.0 {
        return hold(format!(
            "too little to go on ({} tasks in {:.1} s)",
            s.tasks, s.window_s
        ));
    }
    if s.bad_rate > cfg.bad_threshold {
        // r close to 1 says little about how much is missing: cap the step.
        let r = s.bad_rate.min(0.9);
        let add = if s.gpus == 0 {
            1
        } else {
            (n * r / (1.0 - r)).ceil().max(1.0) as u32
        };
        // On the demand too: what it says is missing, if that is more.
        let (add, rule) = match demand_band(s, cfg) {
            Some((w, _)) if w > s.gpus && w - s.gpus > add => {
                (w - s.gpus, "up to ceil(demand / U)")
            }
            _ => (add, "N·r/(1−r)"),
        };
        return self::add(
            add,
            format!(
                "bad rate {:.2}% > {:.2}% over {:.1} s on {} GPUs: add {rule} = {add}",
                s.bad_rate * 100.0,
                cfg.bad_threshold * 100.0,
                s.window_s,
                s.gpus
            ),
        );
    }
    if let Some(band) = demand_band(s, cfg) {
        return advise_demand(s, owners, cfg, band);
    }
    // With a headroom: the GPUs the busy time needs with that much spare.
    let want = (cfg.headroom > 0.0 && s.gpus > 0).then(|| {
        let busy = n * (1.0 - s.idle_fraction).clamp(0.0, 1.0);
        ((busy / (1.0 - cfg.headroom.min(0.9))).ceil() as u32).max(1)
    });
    if let Some(want) = want.filter(|&w| w > s.gpus) {
        let k = want - s.gpus;
        return add(
            k,
            format!(
                "idle {:.1}% < headroom {:.1}% on {} GPUs: add {k} (busy N·(1−f) / (1 − headroom) = {want})",
                s.idle_fraction * 100.0,
                cfg.headroom * 100.0,
                s.gpus
            ),
        );
    }
    if s.idle_fraction > cfg.idle_threshold && s.gpus > 1 {
        let k = match want {
            Some(w) => s.gpus.saturating_sub(w),
            None => (n * s.idle_fraction).floor() as u32,
        }
        .min(s.gpus - 1);
        if k == 0 {
            return hold(format!(
                "idle {:.1}% is under one GPU",
                s.idle_fraction * 100.0
            ));
        }
        return release(
            owners,
            k,
            format!(
                "idle {:.1}% > {:.1}% over {:.1} s on {} GPUs: release {} = {k} (the highest ids)",
                s.idle_fraction * 100.0,
                cfg.idle_threshold * 100.0,
                s.window_s,
                s.gpus,
                if want.is_some() {
                    "N − N·(1−f)/(1−headroom)"
                } else {
                    "N·f"
                }
            ),
        );
    }
    hold(format!(
        "bad rate {:.2}% and idle {:.1}% within the thresholds",
        s.bad_rate * 100.0,
        s.idle_fraction * 100.0
    ))
}

/// Advice to add `k` GPUs.
fn add(k: u32, reason: String) -> Advice {
    Advice {
        action: "add".into(),
        add_gpus: k,
        reason,
        ..Advice::default()
    }
}

/// Advice to release the `k` highest GPU ids of `owners`, and the backends
/// all of whose GPUs are among them (highest first).
fn release(owners: &[GpuOwner], k: u32, reason: String) -> Advice {
    let mut ids: Vec<u32> = owners.iter().map(|o| o.gpu).collect();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    ids.truncate(k as usize);
    Advice {
        action: "release".into(),
        release_backends: backends_within(owners, &ids),
        release_gpus: ids,
        reason,
        ..Advice::default()
    }
}

/// The backends of `owners` all of whose GPUs are among `ids`, the one with
/// the highest GPU first: (node id, name).
fn backends_within(owners: &[GpuOwner], ids: &[u32]) -> Vec<(u64, String)> {
    let mut backends: Vec<(u32, u64, String)> = Vec::new();
    for o in owners {
        if backends.iter().any(|b| b.1 == o.node) {
            continue;
        }
        let all: Vec<u32> = owners
            .iter()
            .filter(|x| x.node == o.node)
            .map(|x| x.gpu)
            .collect();
        if all.iter().all(|g| ids.contains(g)) {
            backends.push((*all.iter().max().unwrap(), o.node, o.name.clone()));
        }
    }
    backends.sort_by_key(|b| std::cmp::Reverse(b.0));
    backends.into_iter().map(|b| (b.1, b.2)).collect()
}

/// The look-ahead adds or takes at most this share of the demand: a load that
/// starts or a burst is not a trend to carry on.
pub const LOOKAHEAD_CAP: f64 = 0.25;

/// The window the demand's rates are measured over (s): half the signals'
/// window, so that a step of the load shows within seconds.
pub const DEMAND_WINDOW_S: f64 = SIGNAL_WINDOW_S / 2.0;

/// The span the demand's trend is fitted over (s): one and a half signal
/// windows, enough samples to halve the noise of one window's difference
/// without lagging a turn of the load by more than a window.
pub const TREND_SPAN_S: f64 = 1.5 * SIGNAL_WINDOW_S;

/// Above this many times W GPUs in service, the demand's advice releases down
/// to W.
pub const RELEASE_BAND: f64 = 1.05;

/// With `cfg.target_utilization` > 0 and the demand known: W, the GPUs the
/// load needs at that utilization, and the demand it is sized for. The
/// demand is measured over a window whose middle lies `demand_window_s / 2`
/// back; along its trend it is sized for the larger of the demand now (what a
/// release must leave GPUs for) and `lookahead_s` past the window's middle
/// (when GPUs the next decision adds would be in service).
fn demand_band(s: &Signals, cfg: &AdviceConfig) -> Option<(u32, f64)> {
    let demand = s.demand_gpus.filter(|_| cfg.target_utilization > 0.0)?;
    let u = cfg.target_utilization.clamp(0.05, 1.0);
    let cap = LOOKAHEAD_CAP * demand;
    let along = |secs: f64| (s.demand_rise_per_s * secs.max(0.0)).clamp(-cap, cap);
    let level = demand + along(s.demand_window_s / 2.0).max(along(cfg.lookahead_s));
    let w = ((level / u).ceil() as u32).max(1);
    Some((w, level))
}

/// The advice on the load's demand (the bad rate is under its threshold):
/// fewer than W GPUs in service is an add up to W, more than
/// [`RELEASE_BAND`]·W a release down to it, in between a hold.
fn advise_demand(
    s: &Signals,
    owners: &[GpuOwner],
    cfg: &AdviceConfig,
    (w, demand): (u32, f64),
) -> Advice {
    let u = cfg.target_utilization;
    let n = s.gpus;
    if n < w {
        let k = w - n;
        return add(
            k,
            format!("demand {demand:.1} GPUs / {u:.2} = {w} > {n} in service: add {k}"),
        );
    }
    if n as f64 > RELEASE_BAND * w as f64 && n > 1 {
        let k = (n - w).min(n - 1);
        return release(
            owners,
            k,
            format!(
                "demand {demand:.1} GPUs / {u:.2} = {w}; {n} in service > {RELEASE_BAND}·{w}: release {k} (the highest ids)"
            ),
        );
    }
    Advice {
        reason: format!("demand {demand:.1} GPUs / {u:.2} = {w}; {n} in service"),
        ..Advice::default()
    }
}

/// The load's demand over time, for its trend.
#[derive(Debug, Default, Clone)]
pub struct DemandTrend {
    /// (time s, demand GPUs)
    samples: std::collections::VecDeque<(f64, f64)>,
}

impl DemandTrend {
    /// Records `demand` at `now` (s) and returns its trend in GPUs per second
    /// (negative when it falls): the least-squares slope over the samples of
    /// the last `span` seconds, 0 until they cover half of it. A slope over
    /// two windows of samples halves the noise one window's difference has.
    pub fn push(&mut self, now: f64, demand: f64, span: f64) -> f64 {
        if !demand.is_finite() {
            return 0.0;
        }
        self.samples.push_back((now, demand));
        while self.samples.front().is_some_and(|s| now - s.0 > span) {
            self.samples.pop_front();
        }
        let first = self.samples.front().map_or(now, |s| s.0);
        if now - first < span / 2.0 || self.samples.len() < 2 {
            return 0.0;
        }
        let n = self.samples.len() as f64;
        let (tm, dm) = self
            .samples
            .iter()
            .fold((0.0, 0.0), |(a, b), s| (a + s.0 / n, b + s.1 / n));
        let (num, den) = self.samples.iter().fold((0.0, 0.0), |(a, b), s| {
            (a + (s.0 - tm) * (s.1 - dm), b + (s.0 - tm) * (s.0 - tm))
        });
        if den > 0.0 {
            num / den
        } else {
            0.0
        }
    }
}

/// Running totals sampled over time, for the figures over the last window.
#[derive(Debug, Default, Clone)]
pub struct TotalsWindow {
    /// (time s, tasks, bad)
    samples: std::collections::VecDeque<(f64, u64, u64)>,
}

impl TotalsWindow {
    /// Records the totals at `now` (s) and returns (span s, tasks, bad) over the
    /// last `window` seconds (since the first sample, until a window has passed).
    pub fn push(&mut self, now: f64, tasks: u64, bad: u64, window: f64) -> (f64, u64, u64) {
        self.samples.push_back((now, tasks, bad));
        while self.samples.len() > 2 && now - self.samples[1].0 >= window {
            self.samples.pop_front();
        }
        let (t0, n0, b0) = self.samples[0];
        (now - t0, tasks.saturating_sub(n0), bad.saturating_sub(b0))
    }
}

/// The closed loop's settings (`fermata autoscale`).
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerConfig {
    /// GPUs each launched backend brings.
    pub gpus_per_backend: u32,
    /// Bounds on the backends in service (launched ones still starting count).
    pub min_backends: u32,
    pub max_backends: u32,
    /// After a launch, the next launch waits this long (s).
    pub up_cooldown_s: f64,
    /// After a drain, or a launch, the next drain waits this long (s).
    pub down_cooldown_s: f64,
    /// A launched backend counts as starting for this long (s, counted from
    /// the latest launch): until it is in service or this passes, no drain,
    /// and an add launches only what the starting ones do not cover.
    pub provisioning_s: f64,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            gpus_per_backend: 1,
            min_backends: 1,
            max_backends: 16,
            up_cooldown_s: 30.0,
            down_cooldown_s: 120.0,
            provisioning_s: 60.0,
        }
    }
}

/// What the loop does now.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Start this many backends.
    Launch(u32),
    /// Drain and stop these backends (node id, name).
    Drain(Vec<(u64, String)>),
    /// Nothing, and why.
    Hold(String),
}

/// The loop's memory between steps.
#[derive(Debug, Clone)]
pub struct Controller {
    cfg: ControllerConfig,
    last_up: Option<f64>,
    last_down: Option<f64>,
    /// Launches not yet seen in service: (when, how many in service then + launched).
    pending: Option<(f64, u32)>,
    /// Backends told to drain and not yet gone: (node, when).
    draining: Vec<(u64, f64)>,
}

impl Controller {
    pub fn new(cfg: ControllerConfig) -> Result<Controller, String> {
        if cfg.gpus_per_backend == 0 {
            return Err("GPUs per backend must be at least 1".into());
        }
        if cfg.min_backends > cfg.max_backends {
            return Err(format!(
                "the lower bound ({}) is above the upper bound ({})",
                cfg.min_backends, cfg.max_backends
            ));
        }
        for (what, v) in [
            ("up cool-down", cfg.up_cooldown_s),
            ("down cool-down", cfg.down_cooldown_s),
            ("provisioning delay", cfg.provisioning_s),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("the {what} must be >= 0 s"));
            }
        }
        Ok(Controller {
            cfg,
            last_up: None,
            last_down: None,
            pending: None,
            draining: Vec::new(),
        })
    }

    /// Backends being launched and not yet in service.
    pub fn starting(&self, in_service: u32) -> u32 {
        self.pending
            .map_or(0, |(_, want)| want.saturating_sub(in_service))
    }

    /// One step at `now` (s): the advice and the backends in service (not
    /// draining) as the scheduler reports them.
    pub fn step(&mut self, now: f64, advice: &Advice, backends: &[u64]) -> Decision {
        let in_service = backends.len() as u32;
        // Launches are done once in service or past the provisioning delay.
        if let Some((t, want)) = self.pending {
            if in_service >= want || now - t >= self.cfg.provisioning_s {
                self.pending = None;
            }
        }
        self.draining
            .retain(|(node, t)| backends.contains(node) && now - t < self.cfg.provisioning_s);
        let starting = self.starting(in_service);
        let total = in_service + starting;
        let cool_up = self
            .last_up
            .is_none_or(|t| now - t >= self.cfg.up_cooldown_s);
        if total < self.cfg.min_backends {
            let n = self.cfg.min_backends - total;
            return self.launch(now, in_service, starting, n);
        }
        if advice.action == "add" {
            // Backends still starting count toward the add (the advice counts
            // the GPUs in service): launch only what they do not cover, so a
            // load still rising while they start is not left waiting for them.
            let want = advice.add_gpus.div_ceil(self.cfg.gpus_per_backend).max(1);
            if starting >= want {
                return Decision::Hold(format!(
                    "{starting} backend(s) still starting cover the add"
                ));
            }
            if !cool_up {
                return Decision::Hold("in the cool-down after a launch".into());
            }
            if total >= self.cfg.max_backends {
                return Decision::Hold(format!(
                    "at the upper bound ({} backends)",
                    self.cfg.max_backends
                ));
            }
            let n = (want - starting).min(self.cfg.max_backends - total);
            return self.launch(now, in_service, starting, n);
        }
        if advice.action == "release" {
            if starting > 0 {
                return Decision::Hold(format!("{starting} backend(s) still starting"));
            }
            if !self.draining.is_empty() {
                return Decision::Hold("a drain is still under way".into());
            }
            let since = self
                .last_down
                .into_iter()
                .chain(self.last_up)
                .fold(f64::MIN, f64::max);
            if now - since < self.cfg.down_cooldown_s {
                return Decision::Hold("in the cool-down after a scaling step".into());
            }
            let room = in_service.saturating_sub(self.cfg.min_backends) as usize;
            if room == 0 {
                return Decision::Hold(format!(
                    "at the lower bound ({} backends)",
                    self.cfg.min_backends
                ));
            }
            let go: Vec<(u64, String)> = advice
                .release_backends
                .iter()
                .filter(|(n, _)| backends.contains(n))
                .take(room)
                .cloned()
                .collect();
            if go.is_empty() {
                return Decision::Hold("no whole backend among the GPUs to release".into());
            }
            self.last_down = Some(now);
            for (n, _) in &go {
                self.draining.push((*n, now));
            }
            return Decision::Drain(go);
        }
        Decision::Hold(advice.reason.clone())
    }

    fn launch(&mut self, now: f64, in_service: u32, starting: u32, n: u32) -> Decision {
        self.last_up = Some(now);
        self.pending = Some((now, in_service + starting + n));
        Decision::Launch(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(gpus: u32, idle: f64, tasks: u64, bad: u64) -> Signals {
        Signals::new(10.0, gpus, idle, tasks, bad)
    }

    /// With a headroom, nearly busy GPUs are an add before anything goes bad,
    /// and a release stops at the headroom instead of N·f; bad requests still
    /// follow the paper's rule.
    #[test]
    fn a_headroom_adds_before_requests_go_bad_and_releases_down_to_it() {
        let cfg = AdviceConfig {
            headroom: 0.2,
            idle_threshold: 0.3,
            ..AdviceConfig::default()
        };
        let o = owners(&[1; 10]);
        // 10 GPUs 95% busy: 9.5 / 0.8 = 11.9 -> 12: add 2.
        let a = advise(&sig(10, 0.05, 1000, 0), &o, &cfg);
        assert_eq!((a.action.as_str(), a.add_gpus), ("add", 2), "{a:?}");
        // 10 GPUs 40% busy: 4 / 0.8 = 5: release 5 (N·f would be 6).
        let a = advise(&sig(10, 0.6, 1000, 0), &o, &cfg);
        assert_eq!(a.release_gpus, vec![9, 8, 7, 6, 5], "{a:?}");
        // 25% idle is within both: hold.
        let a = advise(&sig(10, 0.25, 1000, 0), &o, &cfg);
        assert_eq!(a.action, "hold", "{a:?}");
        // Bad requests: N·r/(1−r) as without a headroom.
        let a = advise(&sig(10, 0.0, 1000, 100), &o, &cfg);
        assert_eq!(a.add_gpus, 2, "{a:?}");
        let paper = advise(&sig(10, 0.05, 1000, 0), &o, &AdviceConfig::default());
        assert_eq!(paper.action, "hold", "the paper's rule waits: {paper:?}");
    }

    /// The demand: each model at the largest batch its rate fills within its
    /// SLO; a model without load adds nothing.
    #[test]
    fn demand_counts_the_batch_each_rate_fills() {
        use crate::core::{Dur, LatencyProfile};
        let p = LatencyProfile::Linear {
            alpha: Dur::from_ms(1),
            beta: Dur::from_ms(5),
            max_batch: 32,
        };
        // 100 r/s, SLO 52 ms: (b−1)/100 + 0.001·b + 0.005 <= 0.052 up to b = 5.
        let d = demand_gpus([(100.0, &p, Dur::from_ms(52)), (0.0, &p, Dur::from_ms(52))]);
        assert!((d - 100.0 * 0.010 / 5.0).abs() < 1e-12, "{d}");
        // A rate high enough fills the largest batch: 32 in l(32) = 37 ms.
        let d = demand_gpus([(1e6, &p, Dur::from_ms(50))]);
        assert!((d - 1e6 * 0.037 / 32.0).abs() < 1e-6, "{d}");
        // An SLO under l(1): batches of one.
        let d = demand_gpus([(10.0, &p, Dur::from_ms(1))]);
        assert!((d - 10.0 * 0.006).abs() < 1e-12, "{d}");
    }

    /// On the demand: below W = ceil(demand/u) an add to W (for the demand
    /// along its trend), above 1.05·W a release to it, a hold between; bad
    /// requests add the larger of the paper's rule and that.
    #[test]
    fn demand_advice_keeps_the_gpus_in_a_band() {
        let cfg = AdviceConfig {
            target_utilization: 0.9,
            lookahead_s: 10.0,
            ..AdviceConfig::default()
        };
        let o = owners(&[1; 20]);
        let with = |gpus: u32, demand: f64, trend: f64| Signals {
            demand_gpus: Some(demand),
            demand_rise_per_s: trend,
            demand_window_s: 5.0,
            ..sig(gpus, 0.1, 1000, 0)
        };
        // 9 / 0.9 = 10 > 8: add 2.
        let a = advise(&with(8, 9.0, 0.0), &o[..8], &cfg);
        assert_eq!((a.action.as_str(), a.add_gpus), ("add", 2), "{a:?}");
        // Rising by 0.09 GPUs/s: 9.9 ten seconds on -> W = 11: add 1.
        let a = advise(&with(10, 9.0, 0.09), &o[..10], &cfg);
        assert_eq!(a.add_gpus, 1, "{a:?}");
        // A step is not a trend: the look-ahead adds at most a quarter of the
        // demand (11.25 / 0.9 = 12.5 -> 13).
        assert_eq!(advise(&with(10, 9.0, 10.0), &o[..10], &cfg).add_gpus, 3);
        // W = 10 in service: hold; 11 > 1.05·10: release the highest id.
        assert_eq!(advise(&with(10, 9.0, 0.0), &o[..10], &cfg).action, "hold");
        let a = advise(&with(11, 9.0, 0.0), &o[..11], &cfg);
        assert_eq!(a.release_gpus, vec![10], "{a:?}");
        // 20 in service for W = 10: release 10, the highest ids.
        let a = advise(&with(20, 9.0, 0.0), &o, &cfg);
        assert_eq!(a.release_gpus.len(), 10, "{a:?}");
        assert_eq!(a.release_gpus[0], 19);
        // Falling by 0.4 GPUs/s: the demand now (2.5 s past the window's
        // middle) is 9, W = 10, so 12 in service are 2 too many; flat, the
        // 10 measured would keep all 12 (W = 12).
        let a = advise(&with(12, 10.0, -0.4), &o[..12], &cfg);
        assert_eq!(a.release_gpus, vec![11, 10], "{a:?}");
        assert_eq!(advise(&with(12, 10.0, 0.0), &o[..12], &cfg).action, "hold");
        // Bad requests: N·r/(1−r), or what the demand says is missing if
        // that is more (18 / 0.9 = 20 for 10 in service).
        let bad = |demand: f64| Signals {
            demand_gpus: Some(demand),
            ..sig(10, 0.0, 1000, 100)
        };
        assert_eq!(advise(&bad(1.0), &o[..10], &cfg).add_gpus, 2);
        assert_eq!(advise(&bad(18.0), &o[..10], &cfg).add_gpus, 10);
    }

    /// The trend: the least-squares slope over the span, signed, 0 until the
    /// samples cover half of it; one outlier moves it less than a difference
    /// of two windows would.
    #[test]
    fn the_demand_trend_fits_a_line_over_its_span() {
        let mut t = DemandTrend::default();
        assert_eq!(t.push(0.0, 10.0, 15.0), 0.0);
        for i in 1..=6 {
            assert_eq!(t.push(i as f64, 10.0 + 0.5 * i as f64, 15.0), 0.0, "{i}");
        }
        let r = t.push(8.0, 14.0, 15.0);
        assert!((r - 0.5).abs() < 1e-9, "{r}");
        let mut t = DemandTrend::default();
        let mut r = 0.0;
        for i in 0..=30 {
            r = t.push(i as f64, 50.0 - i as f64, 15.0);
        }
        assert!((r + 1.0).abs() < 1e-9, "{r}");
        // Flat, then one sample 2 GPUs up: less than the 2 / 15 s a
        // difference across the span would say.
        let mut t = DemandTrend::default();
        for i in 0..15 {
            t.push(i as f64, 10.0, 15.0);
        }
        let r = t.push(15.0, 12.0, 15.0);
        assert!(r > 0.0 && r < 2.0 / 15.0 / 2.0, "{r}");
        assert_eq!(t.push(16.0, f64::NAN, 15.0), 0.0);
    }

    fn owners(per_backend: &[u32]) -> Vec<GpuOwner> {
        let mut v = Vec::new();
        let mut g = 0;
        for (i, &n) in per_backend.iter().enumerate() {
            for _ in 0..n {
                v.push(GpuOwner {
                    gpu: g,
                    node: i as u64 + 1,
                    name: format!("b{i}"),
                    device: g,
                    lanes: 1,
                });
                g += 1;
            }
        }
        v
    }

    /// Backends of `devices` GPUs with `lanes` lanes each; each backend's slots
    /// numbered from `first[i]` on.
    fn lane_owners(first: &[u32], devices: u32, lanes: u32) -> Vec<GpuOwner> {
        let mut v = Vec::new();
        for (i, &f) in first.iter().enumerate() {
            for slot in 0..devices * lanes {
                v.push(GpuOwner {
                    gpu: f + slot,
                    node: i as u64 + 1,
                    name: format!("b{i}"),
                    device: slot / lanes,
                    lanes,
                });
            }
        }
        v
    }

    /// With lanes the rules count slots and the advice whole GPUs: an add
    /// rounds up to devices, a release frees only devices all of whose lanes
    /// fit in it (the highest slot ids first), and less than one device is a
    /// hold.
    #[test]
    fn with_lanes_the_advice_counts_whole_gpus() {
        let cfg = AdviceConfig::default();
        // Two backends of 2 GPUs with 2 lanes: 8 slots, 4 GPUs.
        let o = lane_owners(&[0, 4], 2, 2);
        // 20% bad: 8 · 0.2 / 0.8 = 2 slots = 1 GPU; 1 slot is still 1 GPU.
        let a = advise(&sig(8, 0.0, 1000, 200), &o, &cfg);
        assert_eq!((a.action.as_str(), a.add_gpus), ("add", 1), "{a:?}");
        assert_eq!((a.gpus_in_service, a.lanes), (4, 2));
        let a = advise(&sig(8, 0.0, 1000, 20), &o, &cfg);
        assert_eq!(a.add_gpus, 1, "{a:?}");
        // Idle 50%: 4 slots, the second backend's 2 GPUs; it can stop.
        let a = advise(&sig(8, 0.5, 1000, 0), &o, &cfg);
        assert_eq!(a.action, "release", "{a:?}");
        assert_eq!(a.release_count, 2);
        assert_eq!(a.release_gpus, vec![7, 6, 5, 4]);
        assert_eq!(a.release_backends, vec![(2, "b1".to_string())]);
        // Idle 40%: 3 slots hold one GPU's 2 lanes, not half of another's.
        let a = advise(&sig(8, 0.4, 1000, 0), &o, &cfg);
        assert_eq!(
            (a.action.as_str(), a.release_count),
            ("release", 1),
            "{a:?}"
        );
        assert_eq!(a.release_gpus, vec![7, 6]);
        assert!(a.release_backends.is_empty());
        // One backend's 4 slots idle 35%: 1 slot is under one GPU.
        let a = advise(&sig(4, 0.35, 1000, 0), &lane_owners(&[0], 2, 2), &cfg);
        assert_eq!(a.action, "hold", "{a:?}");
        assert!(a.release_gpus.is_empty() && a.release_count == 0);
        assert!(a.reason.contains("under one GPU"), "{}", a.reason);
        // Slot ids not in device order (ids given back and taken again): a
        // GPU goes whole or not at all.
        let mut o = lane_owners(&[0], 2, 2);
        o[1].gpu = 9; // GPU 0's lanes: 0 and 9; GPU 1's: 2 and 3.
        let a = advise(&sig(4, 0.5, 1000, 0), &o, &cfg);
        assert_eq!(
            (a.action.as_str(), a.release_count),
            ("release", 1),
            "{a:?}"
        );
        assert_eq!(a.release_gpus, vec![9, 0]);
        // Without lanes, the advice is the slots' own.
        let a = advise(&sig(8, 0.5, 1000, 0), &owners(&[4, 4]), &cfg);
        assert_eq!((a.release_count, a.gpus_in_service, a.lanes), (4, 8, 1));
    }

    #[test]
    fn bad_rate_adds_n_r_over_1_minus_r() {
        let a = advise(
            &sig(8, 0.0, 1000, 200),
            &owners(&[8]),
            &AdviceConfig::default(),
        );
        assert_eq!(a.action, "add");
        // 8 · 0.2 / 0.8 = 2.
        assert_eq!(a.add_gpus, 2);
        let a = advise(
            &sig(10, 0.0, 1000, 20),
            &owners(&[10]),
            &AdviceConfig::default(),
        );
        assert_eq!(a.add_gpus, 1, "ceil(10 · 0.02 / 0.98) = 1");
        let a = advise(
            &sig(10, 0.0, 1000, 5),
            &owners(&[10]),
            &AdviceConfig::default(),
        );
        assert_eq!(a.action, "hold", "0.5% is under 1%");
    }

    #[test]
    fn idle_releases_the_highest_ids_and_whole_backends() {
        // Four backends of two GPUs; 45% idle of 8 = 3 GPUs: 7, 6, 5; only
        // backend 4 (GPUs 6, 7) is wholly among them.
        let a = advise(
            &sig(8, 0.45, 1000, 0),
            &owners(&[2, 2, 2, 2]),
            &AdviceConfig::default(),
        );
        assert_eq!(a.action, "release");
        assert_eq!(a.release_gpus, vec![7, 6, 5]);
        assert_eq!(a.release_backends, vec![(4, "b3".to_string())]);
        // Never all of them.
        let a = advise(
            &sig(2, 0.99, 1000, 0),
            &owners(&[1, 1]),
            &AdviceConfig::default(),
        );
        assert_eq!(a.release_gpus, vec![1]);
        // Too little data.
        let mut s = sig(4, 0.9, 3, 0);
        s.window_s = 1.0;
        assert_eq!(
            advise(&s, &owners(&[4]), &AdviceConfig::default()).action,
            "hold"
        );
    }

    #[test]
    fn totals_window_covers_the_last_window() {
        let mut w = TotalsWindow::default();
        assert_eq!(w.push(0.0, 0, 0, 10.0), (0.0, 0, 0));
        assert_eq!(w.push(5.0, 100, 1, 10.0), (5.0, 100, 1));
        // The oldest sample that still covers the window back from now.
        assert_eq!(w.push(12.0, 300, 2, 10.0), (12.0, 300, 2));
        assert_eq!(w.push(16.0, 400, 2, 10.0), (11.0, 300, 1));
    }

    fn add(n: u32) -> Advice {
        Advice {
            action: "add".into(),
            add_gpus: n,
            ..Advice::default()
        }
    }

    fn release(b: &[u64]) -> Advice {
        Advice {
            action: "release".into(),
            release_backends: b.iter().map(|&n| (n, format!("b{n}"))).collect(),
            ..Advice::default()
        }
    }

    #[test]
    fn launches_respect_bounds_provisioning_and_cool_down() {
        let mut c = Controller::new(ControllerConfig {
            gpus_per_backend: 2,
            min_backends: 1,
            max_backends: 4,
            up_cooldown_s: 10.0,
            down_cooldown_s: 30.0,
            provisioning_s: 5.0,
        })
        .unwrap();
        // Below the lower bound: launch at once.
        assert_eq!(c.step(0.0, &add(0), &[]), Decision::Launch(1));
        // 2 GPUs wanted = 1 backend: the one starting covers it.
        assert_eq!(
            c.step(1.0, &add(2), &[]),
            Decision::Hold("1 backend(s) still starting cover the add".into())
        );
        // 3 GPUs wanted = 2 backends, one starting: the cool-down holds the other.
        assert!(matches!(c.step(1.0, &add(3), &[]), Decision::Hold(_)));
        // In service: cool-down still on.
        assert!(matches!(c.step(2.0, &add(3), &[1]), Decision::Hold(_)));
        assert_eq!(c.step(10.0, &add(3), &[1]), Decision::Launch(2));
        // Upper bound: 3 in service + starting; want 5 more -> only 1.
        assert!(matches!(
            c.step(12.0, &add(10), &[1, 2, 3]),
            Decision::Hold(_)
        ));
        assert_eq!(c.step(20.0, &add(10), &[1, 2, 3]), Decision::Launch(1));
        assert_eq!(
            c.step(31.0, &add(10), &[1, 2, 3, 4]),
            Decision::Hold("at the upper bound (4 backends)".into())
        );
    }

    /// An add while backends start launches only what they do not cover, and
    /// a drain waits for them.
    #[test]
    fn starting_backends_count_toward_an_add() {
        let mut c = Controller::new(ControllerConfig {
            gpus_per_backend: 1,
            min_backends: 1,
            max_backends: 10,
            up_cooldown_s: 1.0,
            down_cooldown_s: 0.0,
            provisioning_s: 6.0,
        })
        .unwrap();
        assert_eq!(c.step(0.0, &add(2), &[1]), Decision::Launch(2));
        assert_eq!(c.starting(1), 2);
        // The load rose on while they start: 5 wanted, 2 starting: 3 more.
        assert_eq!(c.step(2.0, &add(5), &[1]), Decision::Launch(3));
        assert_eq!(c.starting(1), 5);
        assert!(matches!(c.step(4.0, &add(4), &[1]), Decision::Hold(_)));
        assert!(matches!(
            c.step(4.0, &release(&[1]), &[1]),
            Decision::Hold(_)
        ));
        // All in service: the next add is whole again.
        assert_eq!(
            c.step(5.0, &add(1), &[1, 2, 3, 4, 5, 6]),
            Decision::Launch(1)
        );
    }

    #[test]
    fn a_launch_that_never_shows_up_is_given_up_after_the_provisioning_delay() {
        let mut c = Controller::new(ControllerConfig {
            up_cooldown_s: 0.0,
            provisioning_s: 5.0,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.step(0.0, &add(1), &[1]), Decision::Launch(1));
        assert!(matches!(c.step(4.0, &add(1), &[1]), Decision::Hold(_)));
        assert_eq!(c.step(5.0, &add(1), &[1]), Decision::Launch(1));
    }

    #[test]
    fn drains_respect_the_lower_bound_and_the_cool_downs() {
        let mut c = Controller::new(ControllerConfig {
            min_backends: 2,
            max_backends: 8,
            up_cooldown_s: 0.0,
            down_cooldown_s: 30.0,
            provisioning_s: 20.0,
            ..Default::default()
        })
        .unwrap();
        // Lower bound 2 of 4: at most 2 go, highest first as advised.
        assert_eq!(
            c.step(0.0, &release(&[4, 3, 2]), &[1, 2, 3, 4]),
            Decision::Drain(vec![(4, "b4".into()), (3, "b3".into())])
        );
        // While they drain, nothing more.
        assert!(matches!(
            c.step(5.0, &release(&[2]), &[1, 2, 3, 4]),
            Decision::Hold(_)
        ));
        // Gone, but the cool-down holds.
        assert!(matches!(
            c.step(10.0, &release(&[2]), &[1, 2]),
            Decision::Hold(_)
        ));
        // At the lower bound.
        assert_eq!(
            c.step(40.0, &release(&[2]), &[1, 2]),
            Decision::Hold("at the lower bound (2 backends)".into())
        );
        // A launch resets the drain cool-down too.
        assert_eq!(c.step(41.0, &add(1), &[1, 2]), Decision::Launch(1));
        assert!(matches!(
            c.step(50.0, &release(&[3]), &[1, 2, 3]),
            Decision::Hold(_)
        ));
        assert_eq!(
            c.step(71.0, &release(&[3]), &[1, 2, 3]),
            Decision::Drain(vec![(3, "b3".into())])
        );
        assert!(Controller::new(ControllerConfig {
            min_backends: 3,
            max_backends: 2,
            ..Default::default()
        })
        .is_err());
    }
}
