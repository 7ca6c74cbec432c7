//! Applications: a DAG of models served as one request.
//!
//! [`Graph`] is a checked application graph: steps (each names a model) and edges
//! parent → child. An edge is [`EdgeKind::Whole`] (the child gets the parent's
//! output as is) or [`EdgeKind::Fanout`] (a parent output whose leading dimension
//! is N becomes N tasks of the child, one per item). Every step runs in a
//! *fan-out context*: the item indices along the fan-out edges from a root to it.
//! A step with several parents (a join) runs once per context, when all its
//! parents have finished in that context; its parents must therefore be in the
//! same fan-out context, which [`Graph::new`] checks.
//!
//! [`AppRun`] is the pure state machine of one application request (no clock, no
//! I/O): the serving frontend and the simulator drive it with task completions,
//! failures and expiries, and it answers with the tasks to submit next and, once,
//! how the request ended. [`Budgets`] and [`DeadlineRule`] give each task its
//! deadline, and under [`DeadlineRule::LatestUseful`] a second, last one.

pub mod drift;
pub mod replan;
mod run;
#[cfg(test)]
mod tests;

pub use drift::{DriftConfig, DriftDetector, Measured, Replan};
pub use replan::{
    LatencySeen, NewPlan, Replanner, StepProfile, MAX_LATENCY_RATIO, MIN_LATENCY_RATIO,
};
pub use run::{AppError, AppRun, End, Input, Outcome, Progress, TaskKey, TaskSpec};

use crate::core::Dur;
use std::collections::{HashMap, HashSet};
use std::fmt;

/// How a parent's output reaches a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EdgeKind {
    /// The child gets the parent's output as is: one child task per parent task.
    Whole,
    /// A parent output with leading dimension N becomes N child tasks, one per item.
    Fanout,
}

/// One step of an application: a name unique in the application and the model it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub name: String,
    pub model: String,
}

impl Step {
    pub fn new(name: &str, model: &str) -> Step {
        Step {
            name: name.to_string(),
            model: model.to_string(),
        }
    }
}

/// An edge as written: step names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeSpec {
    pub from: String,
    pub to: String,
    pub kind: EdgeKind,
}

impl EdgeSpec {
    pub fn whole(from: &str, to: &str) -> EdgeSpec {
        EdgeSpec {
            from: from.to_string(),
            to: to.to_string(),
            kind: EdgeKind::Whole,
        }
    }
    pub fn fanout(from: &str, to: &str) -> EdgeSpec {
        EdgeSpec {
            from: from.to_string(),
            to: to.to_string(),
            kind: EdgeKind::Fanout,
        }
    }
}

/// A checked edge: step indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub kind: EdgeKind,
}

/// Default bound on the tasks one application request may create (fan-out counts
/// come from model outputs, which are untrusted).
pub const DEFAULT_MAX_TASKS: usize = 65_536;

/// Why an application graph is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GraphError {
    Empty,
    DuplicateStep(String),
    UnknownStep {
        edge: (String, String),
        step: String,
    },
    SelfLoop(String),
    DuplicateEdge(String, String),
    /// Steps on a cycle (in the order of the cycle).
    Cycle(Vec<String>),
    /// A join whose parents are in different fan-out contexts.
    JoinContexts {
        join: String,
        /// Each parent edge with the fan-out edges (`from→to`) above the join through it.
        parents: Vec<(String, Vec<String>)>,
    },
    UnknownOutput(String),
    NoOutputs,
}

impl fmt::Display for GraphError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GraphError::Empty => write!(f, "the application has no steps"),
            GraphError::DuplicateStep(s) => write!(f, "step '{s}' is declared twice"),
            GraphError::UnknownStep { edge, step } => write!(
                f,
                "edge '{}' -> '{}' names step '{step}', which the application does not declare",
                edge.0, edge.1
            ),
            GraphError::SelfLoop(s) => write!(f, "step '{s}' feeds itself"),
            GraphError::DuplicateEdge(a, b) => write!(f, "edge '{a}' -> '{b}' is declared twice"),
            GraphError::Cycle(c) => write!(f, "steps form a cycle: {}", c.join(" -> ")),
            GraphError::JoinContexts { join, parents } => {
                write!(
                    f,
                    "step '{join}' joins parents in different fan-out contexts:"
                )?;
                for (p, ctx) in parents {
                    if ctx.is_empty() {
                        write!(f, " '{p}' (not fanned out)")?;
                    } else {
                        write!(f, " '{p}' (fanned out by {})", ctx.join(", "))?;
                    }
                }
                Ok(())
            }
            GraphError::UnknownOutput(s) => {
                write!(f, "application output names unknown step '{s}'")
            }
            GraphError::NoOutputs => write!(f, "the application declares no outputs"),
        }
    }
}

impl std::error::Error for GraphError {}

/// A checked application graph.
#[derive(Debug, Clone)]
pub struct Graph {
    steps: Vec<Step>,
    edges: Vec<Edge>,
    /// Edge indices into each step, and out of it.
    ins: Vec<Vec<usize>>,
    outs: Vec<Vec<usize>>,
    topo: Vec<usize>,
    /// The fan-out edges from a root down to each step (its context's shape).
    contexts: Vec<Vec<usize>>,
    outputs: Vec<usize>,
    max_tasks: usize,
}

impl Graph {
    /// Checks and builds a graph. `outputs` names, in order, the step whose output
    /// makes up each application output (a step may be named more than once).
    pub fn new(
        steps: Vec<Step>,
        edges: &[EdgeSpec],
        outputs: &[&str],
    ) -> Result<Graph, GraphError> {
        if steps.is_empty() {
            return Err(GraphError::Empty);
        }
        let mut index = HashMap::new();
        for (i, s) in steps.iter().enumerate() {
            if index.insert(s.name.clone(), i).is_some() {
                return Err(GraphError::DuplicateStep(s.name.clone()));
            }
        }
        let n = steps.len();
        let mut checked = Vec::with_capacity(edges.len());
        let mut seen = HashSet::new();
        for e in edges {
            let look = |s: &str| {
                index
                    .get(s)
                    .copied()
                    .ok_or_else(|| GraphError::UnknownStep {
                        edge: (e.from.clone(), e.to.clone()),
                        step: s.to_string(),
                    })
            };
            let (from, to) = (look(&e.from)?, look(&e.to)?);
            if from == to {
                return Err(GraphError::SelfLoop(e.from.clone()));
            }
            if !seen.insert((from, to)) {
                return Err(GraphError::DuplicateEdge(e.from.clone(), e.to.clone()));
            }
            checked.push(Edge {
                from,
                to,
                kind: e.kind,
            });
        }
        let mut ins = vec![Vec::new(); n];
        let mut outs = vec![Vec::new(); n];
        for (i, e) in checked.iter().enumerate() {
            ins[e.to].push(i);
            outs[e.from].push(i);
        }
        let topo = match topo(n, &checked, &outs) {
            Ok(t) => t,
            Err(cycle) => {
                return Err(GraphError::Cycle(
                    cycle.iter().map(|&v| steps[v].name.clone()).collect(),
                ))
            }
        };
        // Each step's context shape: the same through every parent edge.
        let mut contexts: Vec<Vec<usize>> = vec![Vec::new(); n];
        for &v in &topo {
            let through = |ei: usize| {
                let e = &checked[ei];
                let mut c = contexts[e.from].clone();
                if e.kind == EdgeKind::Fanout {
                    c.push(ei);
                }
                c
            };
            let Some(&first) = ins[v].first() else {
                continue;
            };
            let ctx = through(first);
            if ins[v].iter().any(|&ei| through(ei) != ctx) {
                let name = |ei: usize| {
                    let e = &checked[ei];
                    format!("{}->{}", steps[e.from].name, steps[e.to].name)
                };
                let parents = ins[v]
                    .iter()
                    .map(|&ei| {
                        (
                            steps[checked[ei].from].name.clone(),
                            through(ei).into_iter().map(name).collect(),
                        )
                    })
                    .collect();
                return Err(GraphError::JoinContexts {
                    join: steps[v].name.clone(),
                    parents,
                });
            }
            contexts[v] = ctx;
        }
        if outputs.is_empty() {
            return Err(GraphError::NoOutputs);
        }
        let outputs = outputs
            .iter()
            .map(|o| {
                index
                    .get(*o)
                    .copied()
                    .ok_or_else(|| GraphError::UnknownOutput(o.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Graph {
            steps,
            edges: checked,
            ins,
            outs,
            topo,
            contexts,
            outputs,
            max_tasks: DEFAULT_MAX_TASKS,
        })
    }

    /// Bounds the tasks one request may create; past it the request fails.
    pub fn with_max_tasks(mut self, max_tasks: usize) -> Graph {
        self.max_tasks = max_tasks.max(1);
        self
    }
    pub fn max_tasks(&self) -> usize {
        self.max_tasks
    }
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }
    pub fn step(&self, name: &str) -> Option<usize> {
        self.steps.iter().position(|s| s.name == name)
    }
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }
    /// The edge index from `from` to `to`, if any.
    pub fn edge(&self, from: usize, to: usize) -> Option<usize> {
        self.outs
            .get(from)?
            .iter()
            .copied()
            .find(|&ei| self.edges[ei].to == to)
    }
    /// Edge indices into `step`.
    pub fn ins(&self, step: usize) -> &[usize] {
        &self.ins[step]
    }
    /// Edge indices out of `step`.
    pub fn outs(&self, step: usize) -> &[usize] {
        &self.outs[step]
    }
    /// The fan-out edges out of `step`: `AppRun::done` needs an item count for each.
    pub fn fanout_outs(&self, step: usize) -> impl Iterator<Item = usize> + '_ {
        self.outs[step]
            .iter()
            .copied()
            .filter(|&ei| self.edges[ei].kind == EdgeKind::Fanout)
    }
    /// Steps without parents.
    pub fn roots(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.steps.len()).filter(|&v| self.ins[v].is_empty())
    }
    /// Steps in a topological order.
    pub fn topo(&self) -> &[usize] {
        &self.topo
    }
    /// The fan-out edges from a root down to `step`.
    pub fn context_edges(&self, step: usize) -> &[usize] {
        &self.contexts[step]
    }
    /// The step behind each application output, in order.
    pub fn outputs(&self) -> &[usize] {
        &self.outputs
    }
}

/// Kahn's order, or the steps of one cycle.
fn topo(n: usize, edges: &[Edge], outs: &[Vec<usize>]) -> Result<Vec<usize>, Vec<usize>> {
    let mut indeg = vec![0usize; n];
    for e in edges {
        indeg[e.to] += 1;
    }
    let mut q: Vec<usize> = (0..n).rev().filter(|&v| indeg[v] == 0).collect();
    let mut out = Vec::with_capacity(n);
    while let Some(v) = q.pop() {
        out.push(v);
        for &ei in &outs[v] {
            let t = edges[ei].to;
            indeg[t] -= 1;
            if indeg[t] == 0 {
                q.push(t);
            }
        }
    }
    if out.len() == n {
        return Ok(out);
    }
    // Every step left has a parent left: walk parents until one repeats.
    let mut parent = vec![usize::MAX; n];
    for e in edges {
        if indeg[e.to] > 0 && indeg[e.from] > 0 {
            parent[e.to] = e.from;
        }
    }
    let start = (0..n).find(|&v| indeg[v] > 0).expect("a step on a cycle");
    let mut pos = vec![usize::MAX; n];
    let mut walk = Vec::new();
    let mut v = start;
    while pos[v] == usize::MAX {
        pos[v] = walk.len();
        walk.push(v);
        v = parent[v];
    }
    let mut cycle = walk.split_off(pos[v]);
    cycle.reverse();
    cycle.push(cycle[0]);
    Err(cycle)
}

/// Which deadline each task gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadlineRule {
    /// Arrival plus the planned budgets cumulative along the longest path from a
    /// root up to and including the step.
    Static,
    /// The application's deadline (arrival + SLO) minus the planned budgets of the
    /// steps still to run after this one on the longest remaining path: time a
    /// step did not use flows downstream.
    SlackForwarding,
    /// Slack forwarding's deadline orders and batches a task; a task the runtime
    /// drops at it gets a second, last deadline: the application's deadline minus
    /// the least latencies ([`Budgets::with_least`]) of the steps still to run
    /// on the longest remaining path, the latest at which the request can still
    /// end within its SLO. The request ends only when a task misses that one.
    LatestUseful,
}

impl DeadlineRule {
    pub fn name(self) -> &'static str {
        match self {
            DeadlineRule::Static => "static",
            DeadlineRule::SlackForwarding => "slack-forwarding",
            DeadlineRule::LatestUseful => "latest-useful",
        }
    }
}

/// The planner's latency budget of each step and the application's SLO, with the
/// deadline offsets from arrival each rule gives each step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budgets {
    pub per_step: Vec<Dur>,
    pub slo: Dur,
    /// The least time each step's task takes (a batch of one on the fastest
    /// hardware planned for it); zero unless set by [`Budgets::with_least`].
    pub least: Vec<Dur>,
    static_off: Vec<Dur>,
    slack_off: Vec<Dur>,
    latest_off: Vec<Dur>,
}

/// Why budgets are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetError {
    Count { steps: usize, budgets: usize },
    Negative(String),
    Slo,
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetError::Count { steps, budgets } => {
                write!(f, "{budgets} budgets for {steps} steps")
            }
            BudgetError::Negative(s) => write!(f, "step '{s}' has a negative budget"),
            BudgetError::Slo => write!(f, "the SLO must be positive"),
        }
    }
}

impl std::error::Error for BudgetError {}

impl Budgets {
    pub fn new(graph: &Graph, per_step: Vec<Dur>, slo: Dur) -> Result<Budgets, BudgetError> {
        let n = graph.steps.len();
        if per_step.len() != n {
            return Err(BudgetError::Count {
                steps: n,
                budgets: per_step.len(),
            });
        }
        if let Some(v) = (0..n).find(|&v| per_step[v] < Dur::ZERO) {
            return Err(BudgetError::Negative(graph.steps[v].name.clone()));
        }
        if slo <= Dur::ZERO {
            return Err(BudgetError::Slo);
        }
        let mut cum = vec![Dur::ZERO; n];
        for &v in &graph.topo {
            let before = graph.ins[v]
                .iter()
                .map(|&ei| cum[graph.edges[ei].from])
                .max()
                .unwrap_or(Dur::ZERO);
            cum[v] = before + per_step[v];
        }
        let slack_off: Vec<Dur> = remaining(graph, &per_step)
            .iter()
            .map(|&r| slo - r)
            .collect();
        Ok(Budgets {
            least: vec![Dur::ZERO; n],
            latest_off: vec![slo; n],
            per_step,
            slo,
            static_off: cum,
            slack_off,
        })
    }

    /// Sets the least latency of each step, from which [`DeadlineRule::LatestUseful`]
    /// gives each step its last deadline: the SLO minus the least latencies of the
    /// steps after it on the longest remaining path (never before its planned
    /// deadline under slack forwarding).
    pub fn with_least(mut self, graph: &Graph, least: Vec<Dur>) -> Result<Budgets, BudgetError> {
        let n = graph.steps.len();
        if least.len() != n {
            return Err(BudgetError::Count {
                steps: n,
                budgets: least.len(),
            });
        }
        if let Some(v) = (0..n).find(|&v| least[v] < Dur::ZERO) {
            return Err(BudgetError::Negative(graph.steps[v].name.clone()));
        }
        self.latest_off = remaining(graph, &least)
            .iter()
            .zip(&self.slack_off)
            .map(|(&r, &planned)| (self.slo - r).max(planned))
            .collect();
        self.least = least;
        Ok(self)
    }

    /// The deadline of `step`'s tasks under `rule`, as an offset from arrival:
    /// the one that orders and batches them.
    pub fn offset(&self, rule: DeadlineRule, step: usize) -> Dur {
        match rule {
            DeadlineRule::Static => self.static_off[step],
            DeadlineRule::SlackForwarding | DeadlineRule::LatestUseful => self.slack_off[step],
        }
    }

    /// The last deadline of `step`'s tasks under `rule`, as an offset from
    /// arrival: past it the task is of no use to its request. The same as
    /// [`Budgets::offset`] but under [`DeadlineRule::LatestUseful`].
    pub fn latest(&self, rule: DeadlineRule, step: usize) -> Dur {
        match rule {
            DeadlineRule::LatestUseful => self.latest_off[step],
            _ => self.offset(rule, step),
        }
    }
}

/// For each step, the longest sum of `per_step` over the steps after it on a
/// path to a sink (the step itself excluded).
fn remaining(graph: &Graph, per_step: &[Dur]) -> Vec<Dur> {
    let mut rem = vec![Dur::ZERO; per_step.len()];
    for &v in graph.topo.iter().rev() {
        rem[v] = graph.outs[v]
            .iter()
            .map(|&ei| {
                let c = graph.edges[ei].to;
                per_step[c] + rem[c]
            })
            .max()
            .unwrap_or(Dur::ZERO);
    }
    rem
}
