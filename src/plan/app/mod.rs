//! Planning multi-model applications at the lowest cost.
//!
//! The problem, as data: hardware types with prices, module profiles per hardware
//! type, an application (a DAG of modules under one end-to-end SLO), and plans.
//! Everything here is pure: no I/O and no clock. Latencies are seconds, rates
//! requests per second, prices per hour.
//!
//! * [`file`] reads an application file (TOML) into a checked [`App`].
//! * [`module`] plans one module at one latency budget (Algorithm 1, the exact
//!   list search, dummies) and computes worst cases under each dispatch policy.
//! * [`planners`] plans whole applications: `fermata`, `exact`, `harpagon`,
//!   `piccolo`, `scrooge`, `nexus`, `inferline`, `clipper`.
//! * [`fermata`] is the `fermata` planner, [`choose`] its exact choice of one
//!   point per module on forests, [`nexus`] Nexus's squishy bin packing and
//!   prefix batching.

pub mod choose;
pub mod exact;
pub mod fermata;
pub mod file;
pub mod integral;
pub mod module;
pub mod nexus;
pub mod planners;

use serde::Serialize;

/// Relative tolerance of latency and rate comparisons.
pub const EPS: f64 = 1e-9;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HwKind {
    Gpu,
    Cpu,
}

#[derive(Debug, Clone, Serialize)]
pub struct Hardware {
    pub name: String,
    pub kind: HwKind,
    /// Price per hour (any currency; only ratios matter).
    pub price: f64,
    /// Memory in MB (0: not stated).
    pub memory_mb: f64,
}

/// One profiled configuration of a module on one hardware type.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Config {
    /// Index into [`App::hardware`].
    pub hw: usize,
    pub batch: u32,
    /// Batches of the module running at once on one machine.
    pub concurrency: u32,
    /// Latency of one batch (s).
    pub latency: f64,
    /// Requests/s one machine sustains: `batch * concurrency / latency` unless the
    /// profile states it.
    pub throughput: f64,
}

impl Config {
    pub fn new(hw: usize, batch: u32, concurrency: u32, latency: f64) -> Config {
        Config {
            hw,
            batch,
            concurrency,
            latency,
            throughput: f64::from(batch) * f64::from(concurrency) / latency,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Module {
    pub name: String,
    /// Every profiled configuration, on every hardware type it has a profile for.
    pub configs: Vec<Config>,
    /// The prefix this module shares with others (Nexus prefix batching): its
    /// configurations are the whole module's, the prefix's are the shared layers'.
    pub prefix: Option<Prefix>,
}

/// Layers several modules share (the same trunk under different heads).
#[derive(Debug, Clone, Serialize)]
pub struct Prefix {
    pub name: String,
    /// The prefix's own profile on each hardware type it has one for.
    pub configs: Vec<Config>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    /// Mean items one input of `from` produces for `to`.
    pub fanout: f64,
}

/// A checked application: a DAG (acyclic, every module known), positive SLO,
/// finite non-negative rates.
#[derive(Debug, Clone, Serialize)]
pub struct App {
    pub name: String,
    pub hardware: Vec<Hardware>,
    pub modules: Vec<Module>,
    pub edges: Vec<Edge>,
    /// End-to-end SLO (s) on every root-to-sink path.
    pub slo: f64,
    /// Request rate of every module (req/s).
    pub rates: Vec<f64>,
}

impl App {
    pub fn price(&self, c: &Config) -> f64 {
        self.hardware[c.hw].price
    }
    /// The application as measured: each edge's mean fan-out `fanout[e]` and each
    /// module's latencies scaled by `latency_ratio[v]` (observed over profiled;
    /// throughputs divided by it). A module with parents gets its rate scaled
    /// by how its inflow changed (Σ fan-out × parent rate, new over old; the
    /// new inflow itself where the old one was 0); roots keep theirs.
    pub fn remeasured(&self, fanout: &[f64], latency_ratio: &[f64]) -> Result<App, String> {
        if fanout.len() != self.edges.len() || latency_ratio.len() != self.modules.len() {
            return Err(format!(
                "{} fan-outs and {} latency ratios for {} edges and {} modules",
                fanout.len(),
                latency_ratio.len(),
                self.edges.len(),
                self.modules.len()
            ));
        }
        if let Some(f) = fanout.iter().find(|f| !(f.is_finite() && **f >= 0.0)) {
            return Err(format!("fan-out {f} is not a finite mean >= 0"));
        }
        if let Some(k) = latency_ratio
            .iter()
            .find(|k| !(k.is_finite() && **k > 0.0 && **k <= 1e3))
        {
            return Err(format!("latency ratio {k} must be in (0, 1000]"));
        }
        let mut a = self.clone();
        for (e, &f) in a.edges.iter_mut().zip(fanout) {
            e.fanout = f;
        }
        for (m, &k) in a.modules.iter_mut().zip(latency_ratio) {
            let scale = |c: &mut Config| {
                c.latency *= k;
                c.throughput /= k;
            };
            m.configs.iter_mut().for_each(scale);
            if let Some(p) = &mut m.prefix {
                p.configs.iter_mut().for_each(scale);
            }
        }
        for v in self.topo() {
            if self.parents(v).next().is_none() {
                continue;
            }
            let inflow = |app: &App, rates: &[f64]| -> f64 {
                app.edges
                    .iter()
                    .filter(|e| e.to == v)
                    .map(|e| e.fanout * rates[e.from])
                    .sum()
            };
            let old = inflow(self, &self.rates);
            let new = inflow(&a, &a.rates);
            a.rates[v] = if old > 0.0 {
                self.rates[v] * new / old
            } else {
                new
            };
        }
        Ok(a)
    }
    pub fn parents(&self, v: usize) -> impl Iterator<Item = usize> + '_ {
        self.edges.iter().filter(move |e| e.to == v).map(|e| e.from)
    }
    pub fn children(&self, v: usize) -> impl Iterator<Item = usize> + '_ {
        self.edges.iter().filter(move |e| e.from == v).map(|e| e.to)
    }
    /// Modules in a topological order (the DAG is checked acyclic).
    pub fn topo(&self) -> Vec<usize> {
        topo_order(self.modules.len(), &self.edges).expect("checked acyclic")
    }
    /// Every root-to-sink path (module indices). Bounded by [`MAX_PATHS`] at load.
    pub fn paths(&self) -> Vec<Vec<usize>> {
        let n = self.modules.len();
        let mut out = Vec::new();
        let roots: Vec<usize> = (0..n)
            .filter(|&v| self.parents(v).next().is_none())
            .collect();
        let mut stack: Vec<Vec<usize>> = roots.into_iter().map(|r| vec![r]).collect();
        while let Some(p) = stack.pop() {
            let last = *p.last().unwrap();
            let ch: Vec<usize> = self.children(last).collect();
            if ch.is_empty() {
                out.push(p);
            } else {
                for c in ch {
                    let mut q = p.clone();
                    q.push(c);
                    stack.push(q);
                }
            }
        }
        out
    }
    /// The largest budget module `v` can have within `slo` with every other
    /// module's worst case at `lat`: `slo` less the longest path through `v`
    /// with `v`'s own latency left out.
    pub fn room_within(&self, slo: f64, lat: &[f64], v: usize) -> f64 {
        let order = self.topo();
        let l = |u: usize| if u == v { 0.0 } else { lat[u] };
        let mut head = vec![0.0f64; lat.len()];
        for &u in &order {
            head[u] = self.parents(u).map(|x| head[x]).fold(0.0, f64::max) + l(u);
        }
        let mut tail = vec![0.0f64; lat.len()];
        for &u in order.iter().rev() {
            tail[u] = self.children(u).map(|c| tail[c]).fold(0.0, f64::max) + l(u);
        }
        slo - head[v] - tail[v]
    }
    /// Longest path with per-module latencies `lat`: (length, path).
    pub fn longest_path(&self, lat: &[f64]) -> (f64, Vec<usize>) {
        let order = self.topo();
        let n = self.modules.len();
        let mut dist = vec![0.0f64; n];
        let mut prev = vec![usize::MAX; n];
        for &v in &order {
            let mut best = 0.0;
            for u in self.parents(v) {
                if prev[v] == usize::MAX || dist[u] > best {
                    best = dist[u];
                    prev[v] = u;
                }
            }
            dist[v] = best + lat[v];
        }
        let (mut v, len) =
            dist.iter().enumerate().fold(
                (0, f64::NEG_INFINITY),
                |a, (i, &d)| if d > a.1 { (i, d) } else { a },
            );
        let mut path = vec![v];
        while prev[v] != usize::MAX {
            v = prev[v];
            path.push(v);
        }
        path.reverse();
        (len, path)
    }
}

/// Bound on root-to-sink paths of an application file.
pub const MAX_PATHS: usize = 10_000;

/// Kahn's order, or `Err(a module on a cycle)`.
pub fn topo_order(n: usize, edges: &[Edge]) -> Result<Vec<usize>, usize> {
    let mut indeg = vec![0usize; n];
    for e in edges {
        indeg[e.to] += 1;
    }
    let mut q: Vec<usize> = (0..n).filter(|&v| indeg[v] == 0).collect();
    q.reverse();
    let mut out = Vec::with_capacity(n);
    while let Some(v) = q.pop() {
        out.push(v);
        for e in edges.iter().filter(|e| e.from == v) {
            indeg[e.to] -= 1;
            if indeg[e.to] == 0 {
                q.push(e.to);
            }
        }
    }
    if out.len() == n {
        Ok(out)
    } else {
        Err((0..n).find(|&v| indeg[v] > 0).unwrap_or(0))
    }
}

/// How a module's requests are spread over its machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dispatch {
    /// Batch-aware, throughput-cost order (Piccolo, Harpagon): machine `i` waits
    /// for a batch at `w_i`, the rate of every machine no more cost-efficient.
    ThroughputCost,
    /// Each machine forms its batches from its own rate `f` (round robin of single
    /// requests, Scrooge's per-machine rate): worst case `d + b / f`, `2d` when full.
    RoundRobin,
}

/// One line of a module's plan: `count` machines of one configuration; only the
/// last line of a module may have a fractional count.
#[derive(Debug, Clone, Serialize)]
pub struct Alloc {
    pub config: Config,
    pub count: f64,
}

impl Alloc {
    pub fn full(&self) -> u64 {
        (self.count + EPS).floor() as u64
    }
    pub fn partial(&self) -> f64 {
        let f = self.count - self.full() as f64;
        if f < EPS {
            0.0
        } else {
            f
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ModulePlan {
    pub name: String,
    /// Latency budget (s).
    pub budget: f64,
    /// Predicted worst case (s), at most the budget.
    pub worst: f64,
    pub rate: f64,
    pub allocs: Vec<Alloc>,
    pub dispatch: Dispatch,
    /// Dummy requests/s added so a machine runs full.
    pub dummy: f64,
    /// Fractional cost Σ price · count.
    pub cost: f64,
    /// Prefix batching: the module whose machines run this module's requests in
    /// merged batches (this module then has no machines of its own, and that
    /// module's machines serve both rates).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_by: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub planner: String,
    pub modules: Vec<ModulePlan>,
    /// Predicted end-to-end worst case (longest path of module worst cases, s).
    pub worst: f64,
    /// The path that gives it (module names).
    pub critical_path: Vec<String>,
    /// Σ price · machine count, partial machines counted by their fraction.
    pub cost: f64,
    /// Price of the machines rented once partial machines of each hardware type
    /// are placed together (best fit decreasing by capacity fraction).
    pub integral_cost: f64,
    /// The planner whose construction this is (`fermata`'s portfolio may return
    /// a peer's plan).
    pub origin: String,
}

/// Machines (rate each, config) of an allocation list, full ones first.
pub fn machines(allocs: &[Alloc]) -> Vec<(Config, f64)> {
    let mut m = Vec::new();
    for a in allocs {
        for _ in 0..a.full() {
            m.push((a.config, a.config.throughput));
        }
        let p = a.partial();
        if p > 0.0 {
            m.push((a.config, p * a.config.throughput));
        }
    }
    m
}

/// Worst case of a module's machines under `dispatch`; `prices` by hardware index.
pub fn worst_case(allocs: &[Alloc], dispatch: Dispatch, prices: &[f64]) -> f64 {
    // Identical machines grouped: [latency, batch, rate of one machine,
    // machines, rate / price]. On the stack for short lists: the branch and
    // bound of `fermata` calls this for every list it completes.
    const STACK: usize = 16;
    let mut stack = [[0.0f64; 5]; STACK];
    let mut heap = Vec::new();
    let g: &mut [[f64; 5]] = if 2 * allocs.len() <= STACK {
        &mut stack
    } else {
        heap.resize(2 * allocs.len(), [0.0f64; 5]);
        &mut heap
    };
    let mut m = 0;
    for a in allocs {
        let c = &a.config;
        let (d, b, p) = (c.latency, f64::from(c.batch), prices[c.hw]);
        let n = (a.count + EPS).floor();
        let frac = a.count - n;
        if n > 0.0 {
            g[m] = [d, b, c.throughput, n, c.throughput / p];
            m += 1;
        }
        if frac >= EPS {
            let f = frac * c.throughput;
            g[m] = [d, b, f, 1.0, f / p];
            m += 1;
        }
    }
    let g = &g[..m];
    let mut worst = 0.0f64;
    match dispatch {
        Dispatch::RoundRobin => {
            for x in g {
                worst = worst.max(x[0] + x[1] / x[2]);
            }
        }
        Dispatch::ThroughputCost => {
            for x in g {
                let lim = x[4] * (1.0 + EPS);
                let w: f64 = g.iter().filter(|y| y[4] <= lim).map(|y| y[2] * y[3]).sum();
                worst = worst.max(x[0] + x[1] / w);
            }
        }
    }
    worst
}

/// Fractional cost of allocation lists.
pub fn alloc_cost(allocs: &[Alloc], prices: &[f64]) -> f64 {
    allocs.iter().map(|a| a.count * prices[a.config.hw]).sum()
}

/// Integral cost: full machines at their price, partial machines of one hardware
/// type packed best fit decreasing by their capacity fraction.
pub fn integral_cost(modules: &[ModulePlan], hardware: &[Hardware]) -> f64 {
    let mut total = 0.0;
    for (h, hw) in hardware.iter().enumerate() {
        let mut parts = Vec::new();
        for m in modules {
            for a in &m.allocs {
                if a.config.hw == h {
                    total += a.full() as f64 * hw.price;
                    let p = a.partial();
                    if p > 0.0 {
                        parts.push(p);
                    }
                }
            }
        }
        parts.sort_by(|a, b| b.total_cmp(a));
        let mut bins: Vec<f64> = Vec::new();
        for p in parts {
            let best = bins
                .iter_mut()
                .filter(|b| **b + p <= 1.0 + EPS)
                .max_by(|a, b| a.total_cmp(b));
            match best {
                Some(b) => *b += p,
                None => bins.push(p),
            }
        }
        total += bins.len() as f64 * hw.price;
    }
    total
}

impl Plan {
    /// Completes a plan from its module plans.
    pub fn assemble(planner: &str, app: &App, modules: Vec<ModulePlan>) -> Plan {
        let lat: Vec<f64> = modules.iter().map(|m| m.worst).collect();
        let (worst, path) = app.longest_path(&lat);
        let cost = modules.iter().map(|m| m.cost).sum();
        let integral_cost = integral_cost(&modules, &app.hardware);
        Plan {
            planner: planner.to_string(),
            critical_path: path.iter().map(|&v| app.modules[v].name.clone()).collect(),
            modules,
            worst,
            cost,
            integral_cost,
            origin: planner.to_string(),
        }
    }

    /// Checks the plan against the application: every machine's worst case within
    /// its module's budget, every path's budgets within the SLO, every module's
    /// rate covered, one fractional count per module and only last. `Err` names
    /// the first violation.
    pub fn verify(&self, app: &App) -> Result<(), String> {
        let prices: Vec<f64> = app.hardware.iter().map(|h| h.price).collect();
        let tol = |x: f64| x * (1.0 + 1e-7) + 1e-9;
        // Rates merged into each module's batches by prefix batching.
        let mut merged = vec![0.0; self.modules.len()];
        for (v, m) in self.modules.iter().enumerate() {
            let Some(lead) = &m.served_by else { continue };
            let u = self
                .modules
                .iter()
                .position(|x| &x.name == lead && x.served_by.is_none())
                .ok_or_else(|| {
                    format!(
                        "{}: served by {lead}, which is not a serving module",
                        m.name
                    )
                })?;
            let same = |x: &ModulePlan| app.modules.iter().find(|y| y.name == x.name);
            let prefix = |x: &ModulePlan| same(x).and_then(|y| y.prefix.as_ref()).map(|p| &p.name);
            if prefix(m).is_none() || prefix(m) != prefix(&self.modules[u]) {
                return Err(format!(
                    "{}: served by {lead}, which shares no prefix with it",
                    m.name
                ));
            }
            if !m.allocs.is_empty() {
                return Err(format!(
                    "{}: served by {lead} and by machines of its own",
                    m.name
                ));
            }
            let w = worst_case(&self.modules[u].allocs, self.modules[u].dispatch, &prices);
            if w > tol(m.budget) {
                return Err(format!(
                    "{}: worst case {:.6} s (merged batches of {lead}) over its budget {:.6} s",
                    m.name, w, m.budget
                ));
            }
            merged[u] += app.rates[v];
        }
        for (v, m) in self.modules.iter().enumerate() {
            if m.served_by.is_some() {
                continue;
            }
            let served: f64 = m.allocs.iter().map(|a| a.count * a.config.throughput).sum();
            if tol(served) < app.rates[v] + merged[v] + m.dummy {
                return Err(format!(
                    "{}: machines serve {served} req/s of {} (+ {} dummy)",
                    m.name, app.rates[v], m.dummy
                ));
            }
            for (i, a) in m.allocs.iter().enumerate() {
                if i + 1 < m.allocs.len() && a.partial() > 0.0 {
                    return Err(format!("{}: a fractional count before the last", m.name));
                }
            }
            if app.rates[v] > 0.0 {
                let w = worst_case(&m.allocs, m.dispatch, &prices);
                if w > tol(m.budget) {
                    return Err(format!(
                        "{}: worst case {:.6} s over its budget {:.6} s",
                        m.name, w, m.budget
                    ));
                }
            }
        }
        let budgets: Vec<f64> = self.modules.iter().map(|m| m.budget).collect();
        let (len, path) = app.longest_path(&budgets);
        if len > tol(app.slo) {
            return Err(format!(
                "path {:?}: budgets sum to {:.6} s, over the SLO {:.6} s",
                path.iter()
                    .map(|&v| app.modules[v].name.as_str())
                    .collect::<Vec<_>>(),
                len,
                app.slo
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests;
