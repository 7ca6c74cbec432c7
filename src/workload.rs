//! Workload files: which models, their latency profiles and SLOs, the GPUs, the
//! arrival process and popularity, network budgets. Parsed from TOML with errors
//! that name the problem (unknown model, SLO below l(1), zero GPUs, malformed TOML).
//!
//! ```toml
//! name = "resnet50_8gpu"
//! gpus = 8
//! arrival = "poisson"        # constant | poisson | gamma:SHAPE
//! popularity = "equal"       # equal | zipf:S
//! rate_rps = 5000            # default offered load for `fermata sim`
//! [[models]]
//! name = "resnet50"
//! alpha_ms = 1.053           # or: profile = "a100/ResNet50", or latency_ms = [...]
//! beta_ms = 5.072
//! slo_ms = 25
//! ```

use crate::core::{Dur, Gather, LatencyProfile, ModelSpec, NetBudget, Policy};
use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use std::path::Path;
use std::str::FromStr;

/// The Symphony paper's 1080Ti and A100 profiles (Appendix C), embedded.
pub const PAPER_PROFILES_CSV: &str = include_str!("../configs/profiles/model_profiles.csv");

/// Inter-arrival process of each model's requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    Constant,
    Poisson,
    /// Gamma-distributed gaps with this shape (1.0 = Poisson; smaller = burstier).
    Gamma(f64),
}

impl FromStr for Arrival {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "constant" | "uniform" => Ok(Arrival::Constant),
            "poisson" | "exponential" => Ok(Arrival::Poisson),
            _ => {
                if let Some(k) = s.strip_prefix("gamma:") {
                    match k.parse::<f64>() {
                        Ok(k) if k > 0.0 && k.is_finite() => Ok(Arrival::Gamma(k)),
                        _ => Err(format!("gamma shape must be a number > 0, got `{k}`")),
                    }
                } else {
                    Err(format!(
                        "unknown arrival process `{s}` (expected constant, poisson or gamma:SHAPE)"
                    ))
                }
            }
        }
    }
}

impl std::fmt::Display for Arrival {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arrival::Constant => write!(f, "constant"),
            Arrival::Poisson => write!(f, "poisson"),
            Arrival::Gamma(k) => write!(f, "gamma:{k}"),
        }
    }
}

/// How the aggregate rate is split over models.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Popularity {
    Equal,
    Zipf(f64),
}

impl FromStr for Popularity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "equal" {
            return Ok(Popularity::Equal);
        }
        if let Some(k) = s.strip_prefix("zipf:") {
            return match k.parse::<f64>() {
                Ok(k) if k >= 0.0 && k.is_finite() => Ok(Popularity::Zipf(k)),
                _ => Err(format!("zipf exponent must be a number >= 0, got `{k}`")),
            };
        }
        Err(format!(
            "unknown popularity `{s}` (expected equal or zipf:EXPONENT)"
        ))
    }
}

/// One model of a workload, resolved.
#[derive(Debug, Clone)]
pub struct WorkloadModel {
    pub spec: ModelSpec,
    /// Share of the aggregate rate (the shares sum to 1).
    pub share: f64,
    /// Piecewise-constant rate multipliers: (from time, multiplier), sorted.
    pub rate_trace: Vec<(Dur, f64)>,
    /// Bytes of one input (what the load generator sends; the distributed runtime
    /// moves them from frontend to backend).
    pub input_bytes: u32,
    /// The real model's tensors and SLO when it comes from a model repository
    /// ([`crate::repo`]); None for profile-only (emulated) models.
    pub meta: Option<crate::repo::ModelMeta>,
    /// Static GPU memory (MB) and the largest batch's dynamic memory (MB), when the
    /// file gives them (the epoch partitioner balances them).
    pub memory_mb: Option<f64>,
    pub dynamic_memory_mb: Option<f64>,
    /// The `profile = "GPU/MODEL"` it was taken from, if any.
    pub profile: Option<String>,
    /// The GPU type it runs on with typed sub-clusters: `gpu_type`, else the
    /// GPU of its `profile`; None: any.
    pub gpu_type: Option<String>,
}

/// Default input size: one 224x224 RGB image of u8 (147 KiB, the paper's ~150 KB).
pub const DEFAULT_INPUT_BYTES: u32 = 224 * 224 * 3;
/// Largest input a model may declare (a region slot holds at most 16 MiB).
pub const MAX_INPUT_BYTES: u32 = (1 << 24) - 64;

/// A resolved workload.
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub gpus: u32,
    pub models: Vec<WorkloadModel>,
    pub arrival: Arrival,
    pub popularity: Popularity,
    pub rate_rps: f64,
    pub warmup: Dur,
    pub duration: Dur,
    pub policy: Policy,
    /// Batch gathering for every policy; None: each policy's default.
    pub gather: Option<Gather>,
    pub net: NetBudget,
    /// Relative standard deviation of GPU execution time (0 = exact profile).
    pub exec_jitter: f64,
    pub frontends: u32,
    pub seed: u64,
    /// Deferred's "defer only when it pays" threshold (see
    /// `DispatcherConfig::eager_cost_max`).
    pub eager_cost_max: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    name: Option<String>,
    description: Option<String>,
    gpus: Option<i64>,
    arrival: Option<String>,
    popularity: Option<String>,
    rate_rps: Option<f64>,
    warmup_s: Option<f64>,
    duration_s: Option<f64>,
    policy: Option<String>,
    gather: Option<String>,
    seed: Option<u64>,
    frontends: Option<u32>,
    eager_cost_max: Option<f64>,
    profiles_file: Option<String>,
    network: Option<RawNetwork>,
    #[serde(default)]
    models: Vec<RawModel>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNetwork {
    ctrl_us: Option<f64>,
    data_fixed_us: Option<f64>,
    data_us: Option<f64>,
    resp_us: Option<f64>,
    slack_us: Option<f64>,
    exec_jitter: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: Option<String>,
    profile: Option<String>,
    alpha_ms: Option<f64>,
    beta_ms: Option<f64>,
    latency_ms: Option<Vec<f64>>,
    slo_ms: Option<f64>,
    max_batch: Option<u32>,
    copies: Option<u32>,
    weight: Option<f64>,
    rate_trace: Option<Vec<(f64, f64)>>,
    input_bytes: Option<u32>,
    memory_mb: Option<f64>,
    dynamic_memory_mb: Option<f64>,
    gpu_type: Option<String>,
}

/// One row of a profiles CSV: gpu,model,alpha_ms,beta_ms,slo_ms.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileRow {
    pub gpu: String,
    pub model: String,
    pub alpha_ms: f64,
    pub beta_ms: f64,
    pub slo_ms: f64,
}

/// Parses a profiles CSV (header `gpu,model,alpha_ms,beta_ms,slo_ms`).
pub fn parse_profiles_csv(text: &str) -> Result<Vec<ProfileRow>> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || (i == 0 && line.starts_with("gpu,")) {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != 5 {
            bail!(
                "profiles line {}: expected 5 fields gpu,model,alpha_ms,beta_ms,slo_ms, got {}",
                i + 1,
                f.len()
            );
        }
        let num = |s: &str, what: &str| -> Result<f64> {
            s.parse::<f64>()
                .map_err(|_| anyhow!("profiles line {}: {what} `{s}` is not a number", i + 1))
        };
        rows.push(ProfileRow {
            gpu: f[0].to_string(),
            model: f[1].to_string(),
            alpha_ms: num(f[2], "alpha_ms")?,
            beta_ms: num(f[3], "beta_ms")?,
            slo_ms: num(f[4], "slo_ms")?,
        });
    }
    Ok(rows)
}

impl Workload {
    /// The central dispatcher's configuration for this workload and `policy` (the
    /// simulator and the real-time runtime build it the same way).
    pub fn dispatcher_config(
        &self,
        policy: crate::core::Policy,
        check: bool,
    ) -> crate::core::DispatcherConfig {
        let mut cfg = crate::core::DispatcherConfig::new(policy, self.gpus);
        cfg.gather = self.gather.unwrap_or_else(|| policy.default_gather());
        cfg.net = self.net;
        cfg.check_invariants = check;
        cfg.eager_cost_max = self.eager_cost_max;
        cfg
    }

    /// Reads and validates a workload file.
    pub fn from_file(path: &Path) -> Result<Workload> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read workload file {}", path.display()))?;
        Workload::from_toml(&text, path.parent())
            .with_context(|| format!("invalid workload file {}", path.display()))
    }

    /// Parses a workload from TOML text; `base` resolves `profiles_file`.
    pub fn from_toml(text: &str, base: Option<&Path>) -> Result<Workload> {
        let raw: RawWorkload = toml::from_str(text)
            .map_err(|e| anyhow!("malformed TOML: {}", e.to_string().trim()))?;
        let _ = raw.description;
        let gpus = raw.gpus.ok_or_else(|| anyhow!("missing `gpus`"))?;
        if gpus <= 0 {
            bail!("`gpus` must be at least 1, got {gpus}");
        }
        if gpus > 65536 {
            bail!("`gpus` = {gpus} is above the limit of 65536");
        }
        if raw.models.is_empty() {
            bail!("no models: add at least one [[models]] table");
        }
        let profiles = match &raw.profiles_file {
            Some(p) => {
                let path = base.map(|b| b.join(p)).unwrap_or_else(|| p.into());
                let t = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read profiles_file {}", path.display()))?;
                parse_profiles_csv(&t)?
            }
            None => parse_profiles_csv(PAPER_PROFILES_CSV)?,
        };
        let mut models = Vec::new();
        let mut weights = Vec::new();
        let mut traces = Vec::new();
        let mut inputs = Vec::new();
        let mut mems = Vec::new();
        for (i, m) in raw.models.iter().enumerate() {
            let (specs, w, tr) = resolve_model(m, &profiles)
                .with_context(|| format!("model #{} ({})", i + 1, m.label()))?;
            let ib = m.input_bytes.unwrap_or(DEFAULT_INPUT_BYTES);
            if !(1..=MAX_INPUT_BYTES).contains(&ib) {
                bail!(
                    "model #{} ({}): `input_bytes` must be between 1 and {MAX_INPUT_BYTES}, got {ib}",
                    i + 1,
                    m.label()
                );
            }
            for (what, v) in [
                ("memory_mb", m.memory_mb),
                ("dynamic_memory_mb", m.dynamic_memory_mb),
            ] {
                if let Some(v) = v {
                    if !(v.is_finite() && (0.0..=1e9).contains(&v)) {
                        bail!(
                            "model #{} ({}): `{what}` must be between 0 and 1e9 MB, got {v}",
                            i + 1,
                            m.label()
                        );
                    }
                }
            }
            let gpu_type = match &m.gpu_type {
                Some(t) if t.trim().is_empty() || t.len() > 128 => bail!(
                    "model #{} ({}): `gpu_type` must be a name of 1 to 128 characters",
                    i + 1,
                    m.label()
                ),
                Some(t) => Some(t.trim().to_string()),
                None => m
                    .profile
                    .as_deref()
                    .and_then(|p| p.split_once('/'))
                    .map(|(gpu, _)| gpu.to_string()),
            };
            for s in specs {
                models.push(s);
                weights.push(w);
                traces.push(tr.clone());
                inputs.push(ib);
                mems.push((
                    m.memory_mb,
                    m.dynamic_memory_mb,
                    m.profile.clone(),
                    gpu_type.clone(),
                ));
            }
        }
        if models.len() > 100_000 {
            bail!("{} models is above the limit of 100000", models.len());
        }
        let popularity: Popularity = raw
            .popularity
            .as_deref()
            .unwrap_or("equal")
            .parse()
            .map_err(|e: String| anyhow!("`popularity`: {e}"))?;
        // Popularity ranks models in file order; explicit weights multiply it.
        let mut shares: Vec<f64> = weights
            .iter()
            .enumerate()
            .map(|(rank, w)| match popularity {
                Popularity::Equal => *w,
                Popularity::Zipf(s) => w / ((rank + 1) as f64).powf(s),
            })
            .collect();
        let total: f64 = shares.iter().sum();
        if total <= 0.0 || !total.is_finite() {
            bail!("model weights must be positive");
        }
        shares.iter_mut().for_each(|s| *s /= total);
        let arrival: Arrival = raw
            .arrival
            .as_deref()
            .unwrap_or("poisson")
            .parse()
            .map_err(|e: String| anyhow!("`arrival`: {e}"))?;
        let policy: Policy = raw
            .policy
            .as_deref()
            .unwrap_or("deferred")
            .parse()
            .map_err(|e: String| anyhow!("`policy`: {e}"))?;
        let gather: Option<Gather> = raw
            .gather
            .as_deref()
            .map(|g| g.parse().map_err(|e: String| anyhow!("`gather`: {e}")))
            .transpose()?;
        let net_raw = raw.network.unwrap_or_default();
        let us = |v: Option<f64>, what: &str| -> Result<Dur> {
            let v = v.unwrap_or(0.0);
            if !(0.0..=1e6).contains(&v) {
                bail!("network.{what} must be between 0 and 1e6 us, got {v}");
            }
            Ok(Dur::from_us_f64(v))
        };
        let net = NetBudget {
            ctrl: us(net_raw.ctrl_us, "ctrl_us")?,
            data_fixed: us(net_raw.data_fixed_us, "data_fixed_us")?,
            data_per_req: us(net_raw.data_us, "data_us")?,
            resp: us(net_raw.resp_us, "resp_us")?,
            slack: us(net_raw.slack_us, "slack_us")?,
            hold_fixed: Dur::ZERO,
            hold_per_req: Dur::ZERO,
        };
        let exec_jitter = net_raw.exec_jitter.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&exec_jitter) {
            bail!("network.exec_jitter must be in [0, 1], got {exec_jitter}");
        }
        for wm in &models {
            let s: &ModelSpec = wm;
            let need = s.profile.latency(1) + net.delay(1) + net.resp;
            if s.slo < need {
                bail!(
                    "model `{}`: SLO {} ms is below l(1) + network = {:.3} ms; it can never be served",
                    s.name,
                    s.slo.as_ms_f64(),
                    need.as_ms_f64()
                );
            }
        }
        let secs = |v: Option<f64>, dflt: f64, what: &str, min: f64| -> Result<Dur> {
            let v = v.unwrap_or(dflt);
            if !(v >= min && v <= 86_400.0) {
                bail!("`{what}` must be between {min} and 86400 s, got {v}");
            }
            Ok(Dur::from_secs_f64(v))
        };
        let rate = raw.rate_rps.unwrap_or(1000.0);
        if !(rate > 0.0 && rate.is_finite()) {
            bail!("`rate_rps` must be > 0, got {rate}");
        }
        Ok(Workload {
            name: raw.name.unwrap_or_else(|| "workload".into()),
            gpus: gpus as u32,
            models: models
                .into_iter()
                .zip(shares)
                .zip(traces)
                .zip(inputs)
                .zip(mems)
                .map(
                    |((((spec, share), rate_trace), input_bytes), mem)| WorkloadModel {
                        spec,
                        share,
                        rate_trace,
                        input_bytes,
                        meta: None,
                        memory_mb: mem.0,
                        dynamic_memory_mb: mem.1,
                        profile: mem.2,
                        gpu_type: mem.3,
                    },
                )
                .collect(),
            arrival,
            popularity,
            rate_rps: rate,
            warmup: secs(raw.warmup_s, 5.0, "warmup_s", 0.0)?,
            duration: secs(raw.duration_s, 20.0, "duration_s", 0.001)?,
            policy,
            gather,
            net,
            exec_jitter,
            frontends: raw.frontends.unwrap_or(1).max(1),
            seed: raw.seed.unwrap_or(1),
            eager_cost_max: match raw.eager_cost_max {
                None => crate::core::dispatcher::DEFAULT_EAGER_COST_MAX,
                Some(g) if (0.0..=1e6).contains(&g) => g,
                Some(g) => bail!("`eager_cost_max` must be in [0, 1e6], got {g}"),
            },
        })
    }

    pub fn specs(&self) -> Vec<ModelSpec> {
        self.models.iter().map(|m| m.spec.clone()).collect()
    }
}

impl Workload {
    /// A workload serving every model of a repository ([`crate::repo::load_repository`]):
    /// each model's measured profile and default SLO, input size from its tensors,
    /// an equal share of `rate_rps`, Poisson arrivals, the deferred policy.
    pub fn from_repository(
        name: &str,
        models: &[crate::repo::RepoModel],
        gpus: u32,
        rate_rps: f64,
    ) -> Result<Workload> {
        use std::fmt::Write as _;
        let mut text = format!("name = {name:?}\ngpus = {gpus}\nrate_rps = {rate_rps}\n");
        for m in models {
            let _ = write!(
                text,
                "[[models]]\nname = {:?}\nalpha_ms = {}\nbeta_ms = {}\nslo_ms = {}\nmax_batch = {}\ninput_bytes = {}\n",
                m.meta.name,
                m.profile.alpha_ms,
                m.profile.beta_ms,
                m.meta.slo_ms,
                m.profile.max_batch.min(m.meta.max_batch),
                m.meta.input_bytes()
            );
        }
        let mut w = Workload::from_toml(&text, None)
            .with_context(|| format!("the workload of the model repository ({name})"))?;
        for (wm, m) in w.models.iter_mut().zip(models) {
            wm.meta = Some(m.meta.clone());
            // A bucketed profile is a step function l(bucket(b)) (a table); the
            // line above only made the text parse.
            if !m.profile.buckets.is_empty() {
                wm.spec.profile = m
                    .profile
                    .latency_profile()
                    .with_context(|| format!("model `{}`: its profile", m.meta.name))?;
            }
        }
        Ok(w)
    }
}

impl std::ops::Deref for WorkloadModel {
    type Target = ModelSpec;
    fn deref(&self) -> &ModelSpec {
        &self.spec
    }
}

impl RawModel {
    fn label(&self) -> String {
        self.name
            .clone()
            .or_else(|| self.profile.clone())
            .unwrap_or_else(|| "unnamed".into())
    }
}

/// A `[[models]]` table resolved: its copies, weight and rate trace.
type ResolvedModel = (Vec<ModelSpec>, f64, Vec<(Dur, f64)>);

fn resolve_model(m: &RawModel, profiles: &[ProfileRow]) -> Result<ResolvedModel> {
    let mut slo_ms = m.slo_ms;
    let mut name = m.name.clone();
    // Linear (alpha_ms, beta_ms) or a table of latencies in ms.
    let (linear, table): (Option<(f64, f64)>, Option<&Vec<f64>>) = if let Some(p) = &m.profile {
        if m.alpha_ms.is_some() || m.beta_ms.is_some() || m.latency_ms.is_some() {
            bail!("give either `profile` or alpha_ms/beta_ms or latency_ms, not several");
        }
        let (gpu, model) = p.split_once('/').ok_or_else(|| {
            anyhow!("`profile` must be GPU/MODEL (e.g. a100/ResNet50), got `{p}`")
        })?;
        let row = profiles
            .iter()
            .find(|r| r.gpu.eq_ignore_ascii_case(gpu) && r.model.eq_ignore_ascii_case(model))
            .ok_or_else(|| {
                let known: Vec<&str> = profiles
                    .iter()
                    .filter(|r| r.gpu.eq_ignore_ascii_case(gpu))
                    .map(|r| r.model.as_str())
                    .collect();
                if known.is_empty() {
                    anyhow!("unknown model `{p}`: no profiles for GPU `{gpu}`")
                } else {
                    anyhow!("unknown model `{p}`: GPU `{gpu}` has {}", known.join(", "))
                }
            })?;
        slo_ms = slo_ms.or(Some(row.slo_ms));
        name = name.or_else(|| Some(row.model.clone()));
        (Some((row.alpha_ms, row.beta_ms)), None)
    } else if let Some(t) = &m.latency_ms {
        if m.alpha_ms.is_some() || m.beta_ms.is_some() {
            bail!("give either latency_ms or alpha_ms/beta_ms, not both");
        }
        if t.is_empty() {
            bail!("latency_ms is empty");
        }
        (None, Some(t))
    } else {
        let a = m
            .alpha_ms
            .ok_or_else(|| anyhow!("missing `alpha_ms` (or `profile`, or `latency_ms`)"))?;
        let b = m.beta_ms.ok_or_else(|| anyhow!("missing `beta_ms`"))?;
        if !(a >= 0.0 && a.is_finite() && b.is_finite()) {
            bail!("alpha_ms must be >= 0 and beta_ms finite");
        }
        (Some((a, b)), None)
    };
    let lat_ms = |bs: u32| -> Option<f64> {
        match (linear, table) {
            (Some((a, b)), _) => Some(a * bs as f64 + b),
            (None, Some(t)) => t.get(bs as usize - 1).copied(),
            (None, None) => None,
        }
    };
    let name = name.ok_or_else(|| anyhow!("missing `name`"))?;
    let slo_ms = slo_ms.ok_or_else(|| anyhow!("missing `slo_ms`"))?;
    if !(slo_ms > 0.0 && slo_ms.is_finite()) {
        bail!("`slo_ms` must be > 0, got {slo_ms}");
    }
    let slo = Dur::from_ms_f64(slo_ms);
    let l1 = lat_ms(1).unwrap_or(0.0);
    if l1 > slo_ms {
        bail!("SLO {slo_ms} ms is below l(1) = {l1:.3} ms; no batch can meet it");
    }
    // Default max batch: the largest b with l(b) <= SLO (nothing larger can ever run).
    let max_batch = match m.max_batch {
        Some(0) => bail!("`max_batch` must be at least 1"),
        Some(b) if b > crate::core::profile::MAX_BATCH_LIMIT => bail!(
            "`max_batch` {b} is above the limit {}",
            crate::core::profile::MAX_BATCH_LIMIT
        ),
        Some(b) => b,
        None => {
            let mut b = 1;
            while b < 1024 && lat_ms(b + 1).is_some_and(|l| l <= slo_ms) {
                b += 1;
            }
            b
        }
    };
    let profile = match (linear, table) {
        (Some((a, b)), _) => {
            LatencyProfile::linear(Dur::from_ms_f64(a), Dur::from_ms_f64(b), max_batch)
        }
        (None, Some(t)) => LatencyProfile::table(
            t.iter()
                .take(max_batch as usize)
                .map(|&x| Dur::from_ms_f64(x))
                .collect(),
        ),
        (None, None) => unreachable!("one of the profile forms was given"),
    }
    .map_err(|e| anyhow!("latency profile: {e}"))?;
    let copies = m.copies.unwrap_or(1);
    if copies == 0 || copies > 100_000 {
        bail!("`copies` must be between 1 and 100000, got {copies}");
    }
    let weight = m.weight.unwrap_or(1.0);
    if !(weight > 0.0 && weight.is_finite()) {
        bail!("`weight` must be > 0, got {weight}");
    }
    let mut trace = Vec::new();
    if let Some(tr) = &m.rate_trace {
        let mut last = -1.0;
        for &(t, x) in tr {
            if !(t >= 0.0 && t > last && t.is_finite()) {
                bail!("`rate_trace` times must be >= 0 and strictly increasing");
            }
            if !(x >= 0.0 && x.is_finite()) {
                bail!("`rate_trace` multipliers must be >= 0");
            }
            last = t;
            trace.push((Dur::from_secs_f64(t), x));
        }
    }
    let specs = (0..copies)
        .map(|i| ModelSpec {
            name: if copies == 1 {
                name.clone()
            } else {
                format!("{name}_{i}")
            },
            profile: profile.clone(),
            slo,
        })
        .collect();
    Ok((specs, weight, trace))
}
