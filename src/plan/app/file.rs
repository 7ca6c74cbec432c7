//! The application file (TOML), described in docs/planning.md, read into a
//! checked [`App`]. Every malformed, hostile or infeasible file gets an error that
//! names what is wrong; sizes are bounded so that memory stays bounded.

use super::{topo_order, App, Config, Edge, Hardware, HwKind, Module, Prefix, MAX_PATHS};
use serde::Deserialize;
use std::collections::HashMap;

pub const MAX_MODULES: usize = 200;
pub const MAX_HARDWARE: usize = 32;
pub const MAX_EDGES: usize = 2_000;
pub const MAX_CONFIGS: usize = 2_000;
pub const MAX_BATCH: u32 = 4_096;
pub const MAX_CONCURRENCY: u32 = 64;
pub const MAX_RATE: f64 = 1e6;
pub const MAX_FANOUT: f64 = 1e4;
/// Seconds.
pub const MAX_LATENCY: f64 = 3_600.0;
pub const MAX_PRICE: f64 = 1e6;
/// Machines one module may need (rate / throughput of its fastest configuration).
pub const MAX_MACHINES: f64 = 1e5;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppFile {
    pub name: Option<String>,
    pub slo_ms: f64,
    pub ingress_rps: Option<f64>,
    #[serde(default)]
    pub hardware: Vec<HardwareFile>,
    #[serde(default)]
    pub modules: Vec<ModuleFile>,
    #[serde(default)]
    pub edges: Vec<EdgeFile>,
    /// Shared prefixes (Nexus prefix batching): the profile of the shared layers.
    #[serde(default)]
    pub prefixes: Vec<PrefixFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixFile {
    pub name: String,
    #[serde(default)]
    pub profiles: Vec<ProfileFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareFile {
    pub name: String,
    pub kind: String,
    pub price: f64,
    #[serde(default)]
    pub memory_mb: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleFile {
    pub name: String,
    pub rate_rps: Option<f64>,
    pub prefix: Option<String>,
    #[serde(default)]
    pub profiles: Vec<ProfileFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    pub hardware: String,
    /// Linear profile: latency(b) = alpha_ms * b + beta_ms.
    pub alpha_ms: Option<f64>,
    pub beta_ms: Option<f64>,
    /// Batch sizes of the linear profile (default 1, 2, 4, ... up to max_batch).
    pub batches: Option<Vec<u32>>,
    pub max_batch: Option<u32>,
    /// Latency factor at concurrency 1, 2, ... (linear profile; default [1.0]).
    pub concurrency_factors: Option<Vec<f64>>,
    /// Measured entries instead.
    #[serde(default)]
    pub entries: Vec<EntryFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntryFile {
    pub batch: u32,
    #[serde(default = "one")]
    pub concurrency: u32,
    pub latency_ms: f64,
    pub throughput_rps: Option<f64>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeFile {
    pub from: String,
    pub to: String,
    #[serde(default = "unit")]
    pub fanout: f64,
}

fn unit() -> f64 {
    1.0
}

fn check(what: &str, x: f64, lo: f64, hi: f64) -> Result<f64, String> {
    if !x.is_finite() || x < lo || x > hi {
        return Err(format!("{what} is {x}: it must lie in [{lo}, {hi}]"));
    }
    Ok(x)
}

fn check_pos(what: &str, x: f64, hi: f64) -> Result<f64, String> {
    if !x.is_finite() || x <= 0.0 || x > hi {
        return Err(format!("{what} is {x}: it must be > 0 and at most {hi}"));
    }
    Ok(x)
}

/// Parses and checks an application file.
pub fn parse(text: &str) -> Result<App, String> {
    if text.len() > 4 << 20 {
        return Err("the application file is over 4 MiB".into());
    }
    let f: AppFile = toml::from_str(text).map_err(|e| format!("application file: {e}"))?;
    build(f)
}

/// Checks a parsed application file.
pub fn build(f: AppFile) -> Result<App, String> {
    let slo = check_pos("slo_ms", f.slo_ms, MAX_LATENCY * 1e3)? / 1e3;
    if f.hardware.is_empty() {
        return Err("no [[hardware]]".into());
    }
    if f.hardware.len() > MAX_HARDWARE {
        return Err(format!("more than {MAX_HARDWARE} hardware types"));
    }
    if f.modules.is_empty() {
        return Err("no [[modules]]".into());
    }
    if f.modules.len() > MAX_MODULES {
        return Err(format!("more than {MAX_MODULES} modules"));
    }
    if f.edges.len() > MAX_EDGES {
        return Err(format!("more than {MAX_EDGES} edges"));
    }
    let mut hw_idx = HashMap::new();
    let mut hardware = Vec::new();
    for h in &f.hardware {
        let kind = match h.kind.as_str() {
            "gpu" | "GPU" => HwKind::Gpu,
            "cpu" | "CPU" => HwKind::Cpu,
            k => {
                return Err(format!(
                    "hardware {}: kind {k:?} is neither gpu nor cpu",
                    h.name
                ))
            }
        };
        let price = check_pos(&format!("hardware {} price", h.name), h.price, MAX_PRICE)?;
        let memory_mb = check(
            &format!("hardware {} memory_mb", h.name),
            h.memory_mb,
            0.0,
            1e9,
        )?;
        if hw_idx.insert(h.name.clone(), hardware.len()).is_some() {
            return Err(format!("hardware {} is listed twice", h.name));
        }
        hardware.push(Hardware {
            name: h.name.clone(),
            kind,
            price,
            memory_mb,
        });
    }
    if f.prefixes.len() > MAX_MODULES {
        return Err(format!("more than {MAX_MODULES} prefixes"));
    }
    let mut prefixes: HashMap<String, Prefix> = HashMap::new();
    for p in &f.prefixes {
        let mut configs = Vec::new();
        for pf in &p.profiles {
            let Some(&hw) = hw_idx.get(&pf.hardware) else {
                return Err(format!(
                    "prefix {}: a profile on hardware {:?}, which no [[hardware]] declares",
                    p.name, pf.hardware
                ));
            };
            let cpu = hardware[hw].kind == HwKind::Cpu;
            expand(&format!("prefix {}", p.name), hw, cpu, pf, &mut configs)?;
            if configs.len() > MAX_CONFIGS {
                return Err(format!(
                    "prefix {}: more than {MAX_CONFIGS} configurations",
                    p.name
                ));
            }
        }
        let prefix = Prefix {
            name: p.name.clone(),
            configs,
        };
        if prefixes.insert(p.name.clone(), prefix).is_some() {
            return Err(format!("prefix {} is listed twice", p.name));
        }
    }
    let mut mod_idx = HashMap::new();
    let mut modules = Vec::new();
    for m in &f.modules {
        if mod_idx.insert(m.name.clone(), modules.len()).is_some() {
            return Err(format!("module {} is listed twice", m.name));
        }
        let mut configs = Vec::new();
        for p in &m.profiles {
            let Some(&hw) = hw_idx.get(&p.hardware) else {
                return Err(format!(
                    "module {}: a profile on hardware {:?}, which no [[hardware]] declares",
                    m.name, p.hardware
                ));
            };
            let cpu = hardware[hw].kind == HwKind::Cpu;
            expand(&m.name, hw, cpu, p, &mut configs)?;
            if configs.len() > MAX_CONFIGS {
                return Err(format!(
                    "module {}: more than {MAX_CONFIGS} configurations",
                    m.name
                ));
            }
        }
        if configs.is_empty() {
            return Err(format!(
                "module {} has no profile on any hardware type: it cannot be placed",
                m.name
            ));
        }
        let prefix = match &m.prefix {
            None => None,
            Some(p) => Some(prefixes.get(p).cloned().ok_or_else(|| {
                format!(
                    "module {}: prefix {p:?} is not declared in [[prefixes]]",
                    m.name
                )
            })?),
        };
        modules.push(Module {
            name: m.name.clone(),
            configs,
            prefix,
        });
    }
    let mut edges = Vec::new();
    for e in &f.edges {
        let from = *mod_idx
            .get(&e.from)
            .ok_or_else(|| format!("edge {} -> {}: unknown module {:?}", e.from, e.to, e.from))?;
        let to = *mod_idx
            .get(&e.to)
            .ok_or_else(|| format!("edge {} -> {}: unknown module {:?}", e.from, e.to, e.to))?;
        if from == to {
            return Err(format!(
                "edge {} -> {}: a cycle (a module feeding itself)",
                e.from, e.to
            ));
        }
        if edges.iter().any(|x: &Edge| x.from == from && x.to == to) {
            return Err(format!("edge {} -> {} is listed twice", e.from, e.to));
        }
        let fanout = check(
            &format!("edge {} -> {} fanout", e.from, e.to),
            e.fanout,
            0.0,
            MAX_FANOUT,
        )?;
        edges.push(Edge { from, to, fanout });
    }
    let order = topo_order(modules.len(), &edges).map_err(|v| {
        format!(
            "the modules form a cycle (module {} is on one): an application must be a DAG",
            modules[v].name
        )
    })?;
    // Rates: explicit where given, else Σ fan-out · parent rate, roots the ingress.
    let ingress = match f.ingress_rps {
        Some(x) => Some(check("ingress_rps", x, 0.0, MAX_RATE)?),
        None => None,
    };
    let mut rates = vec![0.0; modules.len()];
    for &v in &order {
        let m = &f.modules[v];
        let has_parents = edges.iter().any(|e| e.to == v);
        rates[v] = match m.rate_rps {
            Some(r) => check(&format!("module {} rate_rps", m.name), r, 0.0, MAX_RATE)?,
            None if !has_parents => ingress.ok_or_else(|| {
                format!(
                    "module {} has no parent and no rate_rps, and the file has no ingress_rps",
                    m.name
                )
            })?,
            None => {
                let r: f64 = edges
                    .iter()
                    .filter(|e| e.to == v)
                    .map(|e| e.fanout * rates[e.from])
                    .sum();
                check(
                    &format!("module {} rate (from its parents)", m.name),
                    r,
                    0.0,
                    MAX_RATE,
                )?
            }
        };
        let tmax = modules[v]
            .configs
            .iter()
            .map(|c| c.throughput)
            .fold(0.0, f64::max);
        if rates[v] / tmax > MAX_MACHINES {
            return Err(format!(
                "module {}: {} req/s needs over {MAX_MACHINES} machines",
                m.name, rates[v]
            ));
        }
    }
    let app = App {
        name: f.name.unwrap_or_else(|| "app".into()),
        hardware,
        modules,
        edges,
        slo,
        rates,
    };
    // Bound the number of root-to-sink paths (diamonds multiply them).
    let mut npaths = vec![0f64; app.modules.len()];
    for &v in order.iter().rev() {
        let ch: Vec<usize> = app.children(v).collect();
        npaths[v] = if ch.is_empty() {
            1.0
        } else {
            ch.iter().map(|&c| npaths[c]).sum()
        };
    }
    let total: f64 = (0..app.modules.len())
        .filter(|&v| app.parents(v).next().is_none())
        .map(|v| npaths[v])
        .sum();
    if total > MAX_PATHS as f64 {
        return Err(format!(
            "the DAG has {total} root-to-sink paths, over {MAX_PATHS}"
        ));
    }
    check_slo(&app)?;
    Ok(app)
}

/// The smallest worst case a module can reach: one configuration, every machine
/// full (a dummy tops the last one up), so its batches form at `t * ceil(r / t)`.
pub fn min_latency(app: &App, v: usize) -> f64 {
    let r = app.rates[v];
    if r <= 0.0 {
        return 0.0;
    }
    app.modules[v]
        .configs
        .iter()
        .map(|c| {
            let n = (r / c.throughput).ceil().max(1.0);
            c.latency + f64::from(c.batch) / (n * c.throughput)
        })
        .fold(f64::INFINITY, f64::min)
}

/// An SLO below what the longest path can reach is refused, naming the path.
pub fn check_slo(app: &App) -> Result<(), String> {
    let lat: Vec<f64> = (0..app.modules.len())
        .map(|v| min_latency(app, v))
        .collect();
    let (len, path) = app.longest_path(&lat);
    if len > app.slo * (1.0 + 1e-9) {
        let names: Vec<&str> = path.iter().map(|&v| app.modules[v].name.as_str()).collect();
        return Err(format!(
            "infeasible SLO: path {} can reach {:.3} ms at the least, over the SLO of {:.3} ms",
            names.join(" -> "),
            len * 1e3,
            app.slo * 1e3
        ));
    }
    Ok(())
}

fn expand(
    module: &str,
    hw: usize,
    cpu: bool,
    p: &ProfileFile,
    out: &mut Vec<Config>,
) -> Result<(), String> {
    let what = format!("module {module} on {}", p.hardware);
    let mut push = |b: u32, e: u32, lat_ms: f64, t: Option<f64>| -> Result<(), String> {
        if b == 0 || b > MAX_BATCH {
            return Err(format!("{what}: batch {b} outside 1..={MAX_BATCH}"));
        }
        if e == 0 || e > MAX_CONCURRENCY {
            return Err(format!(
                "{what}: concurrency {e} outside 1..={MAX_CONCURRENCY}"
            ));
        }
        if cpu && b != 1 {
            return Err(format!("{what}: a CPU module runs at batch 1, not {b}"));
        }
        let lat = check_pos(&format!("{what} latency_ms"), lat_ms, MAX_LATENCY * 1e3)? / 1e3;
        if lat < 1e-6 {
            return Err(format!("{what}: latency {lat_ms} ms is under 1 us"));
        }
        let mut c = Config::new(hw, b, e, lat);
        if let Some(t) = t {
            c.throughput = check_pos(&format!("{what} throughput_rps"), t, MAX_RATE)?;
        }
        if out.len() > MAX_CONFIGS {
            return Err(format!("{what}: more than {MAX_CONFIGS} configurations"));
        }
        out.push(c);
        Ok(())
    };
    match (p.alpha_ms, p.beta_ms, p.entries.is_empty()) {
        (Some(a), Some(b0), true) => {
            let a = check(&format!("{what} alpha_ms"), a, 0.0, MAX_LATENCY * 1e3)?;
            let b0 = check(&format!("{what} beta_ms"), b0, 0.0, MAX_LATENCY * 1e3)?;
            let batches: Vec<u32> = match &p.batches {
                Some(v) => {
                    if v.len() > MAX_CONFIGS {
                        return Err(format!("{what}: over {MAX_CONFIGS} batch sizes"));
                    }
                    v.clone()
                }
                None if cpu => vec![1],
                None => {
                    let max = p.max_batch.unwrap_or(64).clamp(1, MAX_BATCH);
                    let mut v = vec![];
                    let mut b = 1;
                    while b <= max {
                        v.push(b);
                        b *= 2;
                    }
                    v
                }
            };
            let factors = p.concurrency_factors.clone().unwrap_or_else(|| vec![1.0]);
            if factors.is_empty() || factors.len() > MAX_CONCURRENCY as usize {
                return Err(format!(
                    "{what}: 1 to {MAX_CONCURRENCY} concurrency_factors"
                ));
            }
            for (i, &fct) in factors.iter().enumerate() {
                check_pos(&format!("{what} concurrency factor"), fct, 1e3)?;
                for &b in &batches {
                    push(b, i as u32 + 1, fct * (a * f64::from(b) + b0), None)?;
                }
            }
        }
        (None, None, false) => {
            for e in &p.entries {
                push(e.batch, e.concurrency, e.latency_ms, e.throughput_rps)?;
            }
        }
        _ => {
            return Err(format!(
                "{what}: give either alpha_ms and beta_ms (a linear profile) or entries"
            ))
        }
    }
    Ok(())
}
