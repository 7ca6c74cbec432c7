//! Nexus's squishy bin packing and prefix batching (papers/nexus.txt §4.1, §6).
//!
//! * [`squishy_pack`] places sessions (a model's batch profile, a latency SLO, a
//!   rate) on GPUs of one type. Saturated GPUs run a session alone at the largest batch
//!   `B` with `2 ℓ(B) <= L`; each residual rate gets the largest batch `b` with
//!   `ℓ(b) + b/r <= L`, a duty cycle `d = b/r` and an occupancy `ℓ(b)/d`.
//!   Residuals are placed best fit decreasing by occupancy: merging into a GPU
//!   takes the smaller duty cycle `d`, each session's batch becomes
//!   `b' = ⌊d · r⌋` with `ℓ(b')` from its profile, and fits when `Σ ℓ <= d` and
//!   every session's `d + ℓ(b') <= L`; among the GPUs it fits, the one left
//!   fullest.
//! * [`prefix_latency`] is a merged batch's latency when modules that declare the
//!   same prefix batch it together ([`merge_prefixes`] applies it to a plan):
//!   `ℓ_prefix(Σ b_i) + Σ ℓ_suffix_i(b_i)`.
//!
//! Latencies in profiles are looked up by linear interpolation between profiled
//! batches (exact at a profiled batch, the line through the last two beyond).

use super::{worst_case, Alloc, App, Config, Dispatch, ModulePlan, EPS};

/// A batch profile: (batch, latency s), batches increasing.
pub type Profile = Vec<(f64, f64)>;

/// Latency of batch `b` on profile `p` (linear between profiled batches).
pub fn latency(p: &[(f64, f64)], b: f64) -> f64 {
    if p.len() == 1 {
        return p[0].1 * b.max(1.0) / p[0].0.max(1.0);
    }
    let i = p.partition_point(|x| x.0 < b).clamp(1, p.len() - 1);
    let (b0, l0) = p[i - 1];
    let (b1, l1) = p[i];
    (l0 + (l1 - l0) * (b - b0) / (b1 - b0)).max(0.0)
}

#[derive(Debug, Clone)]
pub struct Session {
    pub profile: Profile,
    /// Latency SLO (s).
    pub slo: f64,
    /// Requests/s.
    pub rate: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    /// Sessions on it (indices), each with its batch.
    pub sessions: Vec<(usize, f64)>,
    /// Duty cycle (s); for a saturated GPU, its batch latency.
    pub duty: f64,
    /// Share of the duty cycle spent executing.
    pub occupancy: f64,
    pub saturated: bool,
}

/// Nexus's squishy bin packing; `None` if a session cannot meet its SLO.
pub fn squishy_pack(sessions: &[Session]) -> Option<Vec<Gpu>> {
    let mut gpus = Vec::new();
    let mut residual: Vec<(usize, f64, f64, f64)> = Vec::new(); // (session, rate, d, occ)
    for (i, s) in sessions.iter().enumerate() {
        if s.rate <= 0.0 {
            continue;
        }
        let (bsat, lsat) = s
            .profile
            .iter()
            .copied()
            .filter(|&(_, l)| 2.0 * l <= s.slo * (1.0 + EPS))
            .max_by(|a, b| a.0.total_cmp(&b.0))?;
        let tsat = bsat / lsat;
        let n = (s.rate / tsat + 1e-9).floor();
        for _ in 0..n as u64 {
            gpus.push(Gpu {
                sessions: vec![(i, bsat)],
                duty: lsat,
                occupancy: 1.0,
                saturated: true,
            });
        }
        let rest = s.rate - n * tsat;
        if rest > EPS * s.rate {
            let (b, l) = s
                .profile
                .iter()
                .copied()
                .filter(|&(b, l)| l + b / rest <= s.slo * (1.0 + EPS))
                .max_by(|a, b| a.0.total_cmp(&b.0))?;
            let d = b / rest;
            residual.push((i, rest, d, l / d));
        }
    }
    residual.sort_by(|a, b| b.3.total_cmp(&a.3));
    // Residual GPUs: (sessions with their rate, duty cycle).
    let mut shared: Vec<(Vec<(usize, f64)>, f64)> = Vec::new();
    let fits = |members: &[(usize, f64)], d: f64| -> Option<f64> {
        let mut busy = 0.0;
        for &(i, r) in members {
            let s = &sessions[i];
            let b = (d * r + 1e-9).floor().max(1.0);
            let l = latency(&s.profile, b);
            if d + l > s.slo * (1.0 + EPS) {
                return None;
            }
            busy += l;
        }
        (busy <= d * (1.0 + EPS)).then_some(busy / d)
    };
    for (i, r, d, occ) in residual {
        let mut best: Option<(usize, f64, f64)> = None;
        for (g, (members, gd)) in shared.iter().enumerate() {
            let nd = gd.min(d);
            let mut m = members.clone();
            m.push((i, r));
            if let Some(o) = fits(&m, nd) {
                if best.is_none_or(|b| o > b.1) {
                    best = Some((g, o, nd));
                }
            }
        }
        match best {
            Some((g, _, nd)) => {
                shared[g].0.push((i, r));
                shared[g].1 = nd;
            }
            None => {
                let _ = occ;
                shared.push((vec![(i, r)], d));
            }
        }
    }
    for (members, d) in shared {
        let occupancy = fits(&members, d).unwrap_or(1.0);
        gpus.push(Gpu {
            sessions: members
                .iter()
                .map(|&(i, r)| (i, (d * r + 1e-9).floor().max(1.0)))
                .collect(),
            duty: d,
            occupancy,
            saturated: false,
        });
    }
    Some(gpus)
}

/// Concurrency-1 profile of `cfgs` on hardware `hw`: (batch, latency), batches
/// increasing.
fn profile_on(cfgs: &[Config], hw: usize) -> Profile {
    let mut p: Profile = cfgs
        .iter()
        .filter(|c| c.hw == hw && c.concurrency == 1)
        .map(|c| (f64::from(c.batch), c.latency))
        .collect();
    p.sort_by(|a, b| a.0.total_cmp(&b.0));
    p.dedup_by(|a, b| a.0 == b.0);
    p
}

/// Nexus's plan of a merged session (rate `r`, budget `l`) whose batch of `B`
/// items takes `lat(B)`: saturated machines at the largest `B` with
/// `2 lat(B) <= l`, the rest on one machine at the largest `B` with
/// `lat(B) + B / rest <= l`, else a duty cycle at the lowest occupancy.
/// Returns (allocations, dummy rate).
fn merged_plan(
    hw: usize,
    r: f64,
    l: f64,
    bmax: u32,
    lat: impl Fn(f64) -> f64,
) -> Option<(Vec<Alloc>, f64)> {
    let cfgs: Vec<Config> = (1..=bmax)
        .map(|b| Config::new(hw, b, 1, lat(f64::from(b))))
        .filter(|c| c.latency > 0.0 && c.latency.is_finite())
        .collect();
    let sat = cfgs
        .iter()
        .filter(|c| 2.0 * c.latency <= l * (1.0 + EPS))
        .max_by_key(|c| c.batch)?;
    let n = (r / sat.throughput + 1e-9).floor();
    let rest = r - n * sat.throughput;
    let mut out = Vec::new();
    if n > 0.0 {
        out.push(Alloc {
            config: *sat,
            count: n,
        });
    }
    let mut dummy = 0.0;
    if rest > EPS * r {
        let res = cfgs
            .iter()
            .filter(|c| {
                c.latency + f64::from(c.batch) / rest <= l * (1.0 + EPS) && c.throughput >= rest
            })
            .max_by_key(|c| c.batch);
        match res {
            Some(c) if c.batch == sat.batch && n > 0.0 => out[0].count += rest / c.throughput,
            Some(c) => out.push(Alloc {
                config: *c,
                count: rest / c.throughput,
            }),
            None => {
                let (c, occ) = cfgs
                    .iter()
                    .filter_map(|c| {
                        let d = (f64::from(c.batch) / rest).min(l - c.latency);
                        (d >= c.latency && d > 0.0).then(|| (*c, c.latency / d))
                    })
                    .min_by(|a, b| a.1.total_cmp(&b.1))?;
                dummy = occ * c.throughput - rest;
                out.push(Alloc {
                    config: c,
                    count: occ,
                });
            }
        }
    }
    Some((out, dummy))
}

/// Prefix batching on a Nexus plan: the modules that declare the same prefix
/// (and have a rate) run as one session whose batch of `B` items holds
/// `B · r_i / R` of each (`R = Σ r_i`) and takes
/// `ℓ_prefix(B) + Σ ℓ_suffix_i(B · r_i / R)`, the suffix's latency being the
/// module's less the prefix's at the same batch; at the smallest budget of the
/// group, on the hardware type where it is cheapest. Adopted where it costs less
/// than the modules apart: the first module's machines serve the group, the
/// others name it in `served_by`.
pub fn merge_prefixes(app: &App, mods: &mut [ModulePlan]) {
    let prices: Vec<f64> = app.hardware.iter().map(|h| h.price).collect();
    let mut names: Vec<&str> = app
        .modules
        .iter()
        .filter_map(|m| m.prefix.as_ref().map(|p| p.name.as_str()))
        .collect();
    names.sort();
    names.dedup();
    for name in names {
        let g: Vec<usize> = (0..app.modules.len())
            .filter(|&v| {
                app.rates[v] > 0.0
                    && mods[v].served_by.is_none()
                    && app.modules[v]
                        .prefix
                        .as_ref()
                        .is_some_and(|p| p.name == name)
            })
            .collect();
        if g.len() < 2 {
            continue;
        }
        let prefix = app.modules[g[0]]
            .prefix
            .as_ref()
            .expect("grouped by prefix");
        let l = g
            .iter()
            .map(|&v| mods[v].budget)
            .fold(f64::INFINITY, f64::min);
        let r: f64 = g.iter().map(|&v| app.rates[v]).sum();
        let apart: f64 = g.iter().map(|&v| mods[v].cost).sum();
        let mut best: Option<(f64, Vec<Alloc>, f64)> = None;
        for h in 0..app.hardware.len() {
            let pp = profile_on(&prefix.configs, h);
            let members: Vec<Profile> = g
                .iter()
                .map(|&v| profile_on(&app.modules[v].configs, h))
                .collect();
            if pp.is_empty() || members.iter().any(|m| m.is_empty()) {
                continue;
            }
            // Each suffix: the module's latency less the prefix's, batch by batch.
            let suffixes: Vec<Profile> = members
                .iter()
                .map(|m| {
                    m.iter()
                        .map(|&(b, lb)| (b, (lb - latency(&pp, b)).max(0.0)))
                        .collect()
                })
                .collect();
            let bmax = members
                .iter()
                .map(|m| m.last().map_or(1.0, |x| x.0))
                .sum::<f64>()
                .min(f64::from(super::file::MAX_BATCH)) as u32;
            let share: Vec<f64> = g.iter().map(|&v| app.rates[v] / r).collect();
            let lat = |b: f64| {
                let parts: Vec<(&[(f64, f64)], f64)> = suffixes
                    .iter()
                    .zip(&share)
                    .map(|(s, x)| (s.as_slice(), b * x))
                    .collect();
                prefix_latency(&pp, &parts)
            };
            if let Some((a, dummy)) = merged_plan(h, r, l, bmax, lat) {
                let cost = super::alloc_cost(&a, &prices);
                if best.as_ref().is_none_or(|b| cost < b.0) {
                    best = Some((cost, a, dummy));
                }
            }
        }
        let Some((cost, allocs, dummy)) = best else {
            continue;
        };
        if cost >= apart * (1.0 - 1e-9) {
            continue;
        }
        let lead = g[0];
        let worst = worst_case(&allocs, Dispatch::RoundRobin, &prices);
        let m = &mut mods[lead];
        m.allocs = allocs;
        m.cost = cost;
        m.dummy = dummy;
        m.worst = worst;
        m.dispatch = Dispatch::RoundRobin;
        let lead_name = m.name.clone();
        for &v in &g[1..] {
            let m = &mut mods[v];
            m.allocs.clear();
            m.cost = 0.0;
            m.dummy = 0.0;
            m.worst = worst;
            m.served_by = Some(lead_name.clone());
        }
    }
}

/// Latency of one merged batch of modules sharing a prefix: the prefix runs once
/// on `Σ b_i` items, then each module's suffix on its own `b_i`.
pub fn prefix_latency(prefix: &[(f64, f64)], suffixes: &[(&[(f64, f64)], f64)]) -> f64 {
    let total: f64 = suffixes.iter().map(|s| s.1).sum();
    latency(prefix, total)
        + suffixes
            .iter()
            .map(|(p, b)| if *b > 0.0 { latency(p, *b) } else { 0.0 })
            .sum::<f64>()
}
