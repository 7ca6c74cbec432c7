//! The state machine of one application request.

use super::{Budgets, DeadlineRule, EdgeKind, Graph};
use crate::core::Time;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// A task of one application request (unique within the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskKey(pub u32);

/// Where one input of a task comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Input {
    /// The graph edge (index into [`Graph::edges`]).
    pub edge: usize,
    /// The parent task whose output it is.
    pub task: TaskKey,
    /// For a fan-out edge, the item of the parent's output (its index along the
    /// leading dimension); `None` for a whole edge.
    pub item: Option<u32>,
}

/// A task to submit: one request to the step's model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSpec {
    pub key: TaskKey,
    pub step: usize,
    /// The fan-out context: one item index per fan-out edge from a root down to
    /// the step ([`Graph::context_edges`]).
    pub items: Vec<u32>,
    /// One input per edge into the step, in [`Graph::ins`] order.
    pub inputs: Vec<Input>,
    /// The deadline the runtime orders, batches and drops the task by.
    pub deadline: Time,
    /// The last deadline the rule gives the task: later than `deadline` only
    /// under [`DeadlineRule::LatestUseful`] while the task has not yet been
    /// dropped at its first one.
    pub latest: Time,
}

/// How an application request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every task finished, the last by the application's deadline.
    Good,
    /// Every task finished, the last after the application's deadline.
    Late,
    /// A task expired (it could not finish by its deadline): the request ends late,
    /// without outputs.
    Expired { task: TaskKey, step: usize },
    /// A task failed, or the request was aborted (`task` is `None`).
    Failed {
        task: Option<TaskKey>,
        step: Option<usize>,
        reason: String,
    },
}

impl Outcome {
    pub fn is_good(&self) -> bool {
        matches!(self, Outcome::Good)
    }
    /// Late or expired.
    pub fn is_late(&self) -> bool {
        matches!(self, Outcome::Late | Outcome::Expired { .. })
    }
    pub fn is_failed(&self) -> bool {
        matches!(self, Outcome::Failed { .. })
    }
}

/// The end of an application request, reported exactly once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    pub outcome: Outcome,
    /// When every task finished (`Good`/`Late`): for each application output, in
    /// order, the tasks whose outputs make it up, in item order (a fanned-out
    /// output is their concatenation; an empty list is an output with no items).
    pub outputs: Option<Vec<Vec<TaskKey>>>,
    /// Tasks still outstanding at the end: their results are to be ignored (a
    /// later report on one answers `discard`).
    pub cancelled: Vec<TaskKey>,
}

/// What one report changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Tasks to submit. After [`AppRun::expired`], a task already submitted
    /// may come back here with a later `deadline` (its last one, under
    /// [`DeadlineRule::LatestUseful`]): submit it again.
    pub tasks: Vec<TaskSpec>,
    /// The request ended with this report.
    pub end: Option<End>,
    /// The report is on a task of a request that had already ended: drop its output.
    pub discard: bool,
}

/// A report the state machine refuses (the state is unchanged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppError {
    UnknownTask(TaskKey),
    /// The task already finished, failed or expired.
    NotOutstanding(TaskKey),
    /// `done` lacked an item count for a fan-out edge out of the step, or gave one
    /// for an edge that is not a fan-out edge out of it, or gave one twice.
    Fanout {
        task: TaskKey,
        edge: usize,
    },
}

impl fmt::Display for AppError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppError::UnknownTask(k) => write!(f, "task {} is not part of the request", k.0),
            AppError::NotOutstanding(k) => write!(f, "task {} already ended", k.0),
            AppError::Fanout { task, edge } => write!(
                f,
                "task {}: the item count of edge {edge} is missing, repeated or not a fan-out edge of its step",
                task.0
            ),
        }
    }
}

impl std::error::Error for AppError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Outstanding,
    Done,
    Failed,
    Expired,
    /// Outstanding when the request ended.
    Cancelled,
    /// Reported after the request ended.
    Discarded,
}

/// One application request in flight.
#[derive(Debug, Clone)]
pub struct AppRun {
    graph: Arc<Graph>,
    rule: DeadlineRule,
    arrival: Time,
    deadline: Time,
    step_deadline: Vec<Time>,
    step_latest: Vec<Time>,
    tasks: Vec<TaskSpec>,
    state: Vec<State>,
    by_ctx: HashMap<(usize, Vec<u32>), TaskKey>,
    /// Parents still to finish of each join, per context.
    joins: HashMap<(usize, Vec<u32>), usize>,
    outstanding: usize,
    /// Cancelled tasks that have not reported since.
    unreported: usize,
    last_done: Time,
    ended: bool,
}

impl AppRun {
    /// Starts a request that arrived at `arrival`: the root steps' tasks.
    ///
    /// Panics if `budgets` were made for a graph with another number of steps.
    pub fn start(
        graph: &Arc<Graph>,
        budgets: &Budgets,
        rule: DeadlineRule,
        arrival: Time,
    ) -> (AppRun, Vec<TaskSpec>) {
        let n = graph.steps().len();
        assert_eq!(budgets.per_step.len(), n, "budgets of another graph");
        let step_deadline = (0..n).map(|v| arrival + budgets.offset(rule, v)).collect();
        let step_latest = (0..n).map(|v| arrival + budgets.latest(rule, v)).collect();
        let mut run = AppRun {
            graph: Arc::clone(graph),
            rule,
            arrival,
            deadline: arrival + budgets.slo,
            step_deadline,
            step_latest,
            tasks: Vec::new(),
            state: Vec::new(),
            by_ctx: HashMap::new(),
            joins: HashMap::new(),
            outstanding: 0,
            unreported: 0,
            last_done: arrival,
            ended: false,
        };
        let roots: Vec<usize> = graph.roots().collect();
        let tasks = roots
            .into_iter()
            .map(|r| run.spawn(r, Vec::new(), Vec::new()))
            .collect();
        (run, tasks)
    }

    fn spawn(&mut self, step: usize, items: Vec<u32>, inputs: Vec<Input>) -> TaskSpec {
        let key = TaskKey(self.tasks.len() as u32);
        let spec = TaskSpec {
            key,
            step,
            items: items.clone(),
            inputs,
            deadline: self.step_deadline[step],
            latest: self.step_latest[step],
        };
        self.by_ctx.insert((step, items), key);
        self.tasks.push(spec.clone());
        self.state.push(State::Outstanding);
        self.outstanding += 1;
        spec
    }

    /// Looks a report's task up: `Ok(None)` when the request already ended (the
    /// report is to be discarded).
    fn check(&mut self, key: TaskKey) -> Result<Option<usize>, AppError> {
        let i = key.0 as usize;
        match self.state.get(i) {
            None => Err(AppError::UnknownTask(key)),
            Some(State::Outstanding) => Ok(Some(i)),
            Some(State::Cancelled) => {
                self.state[i] = State::Discarded;
                self.unreported -= 1;
                Ok(None)
            }
            Some(_) => Err(AppError::NotOutstanding(key)),
        }
    }

    fn discard() -> Progress {
        Progress {
            discard: true,
            ..Progress::default()
        }
    }

    /// Ends the request with `outcome`, cancelling every outstanding task.
    fn end(&mut self, outcome: Outcome) -> End {
        self.ended = true;
        let mut cancelled = Vec::new();
        for (i, s) in self.state.iter_mut().enumerate() {
            if *s == State::Outstanding {
                *s = State::Cancelled;
                cancelled.push(TaskKey(i as u32));
            }
        }
        self.outstanding = 0;
        self.unreported = cancelled.len();
        End {
            outcome,
            outputs: None,
            cancelled,
        }
    }

    /// Task `key` finished at `now`. `fanout` gives, for each fan-out edge out of
    /// its step ([`Graph::fanout_outs`]), the leading dimension of the output it
    /// carries: `(edge index, items)`.
    pub fn done(
        &mut self,
        key: TaskKey,
        now: Time,
        fanout: &[(usize, u32)],
    ) -> Result<Progress, AppError> {
        let Some(i) = self.check(key)? else {
            return Ok(Self::discard());
        };
        let graph = Arc::clone(&self.graph);
        let step = self.tasks[i].step;
        // Exactly one count per fan-out edge out of the step.
        let mut counts: Vec<(usize, u32)> = Vec::new();
        for &(edge, n) in fanout {
            let ok = graph
                .edges()
                .get(edge)
                .is_some_and(|e| e.from == step && e.kind == EdgeKind::Fanout)
                && !counts.iter().any(|&(e, _)| e == edge);
            if !ok {
                return Err(AppError::Fanout { task: key, edge });
            }
            counts.push((edge, n));
        }
        if let Some(missing) = graph
            .fanout_outs(step)
            .find(|e| !counts.iter().any(|&(c, _)| c == *e))
        {
            return Err(AppError::Fanout {
                task: key,
                edge: missing,
            });
        }
        self.state[i] = State::Done;
        self.outstanding -= 1;
        self.last_done = self.last_done.max(now);
        let new: u64 =
            counts.iter().map(|&(_, n)| u64::from(n)).sum::<u64>() + graph.outs(step).len() as u64;
        if self.tasks.len() as u64 + new > graph.max_tasks() as u64 {
            let e = &graph.edges()[counts.iter().max_by_key(|c| c.1).map_or(0, |c| c.0)];
            let reason = format!(
                "the fan-out of '{}' -> '{}' would take the request past {} tasks",
                graph.steps()[e.from].name,
                graph.steps()[e.to].name,
                graph.max_tasks()
            );
            let end = self.end(Outcome::Failed {
                task: Some(key),
                step: Some(step),
                reason,
            });
            return Ok(Progress {
                tasks: Vec::new(),
                end: Some(end),
                discard: false,
            });
        }
        let items = self.tasks[i].items.clone();
        let mut tasks = Vec::new();
        for &ei in graph.outs(step) {
            let child = graph.edges()[ei].to;
            match graph.edges()[ei].kind {
                EdgeKind::Fanout => {
                    let n = counts.iter().find(|c| c.0 == ei).map_or(0, |c| c.1);
                    for item in 0..n {
                        let mut ctx = items.clone();
                        ctx.push(item);
                        let input = Input {
                            edge: ei,
                            task: key,
                            item: Some(item),
                        };
                        tasks.push(self.spawn(child, ctx, vec![input]));
                    }
                }
                EdgeKind::Whole => {
                    let parents = graph.ins(child);
                    if parents.len() > 1 {
                        let left = self
                            .joins
                            .entry((child, items.clone()))
                            .or_insert(parents.len());
                        *left -= 1;
                        if *left > 0 {
                            continue;
                        }
                        self.joins.remove(&(child, items.clone()));
                    }
                    let inputs = parents
                        .iter()
                        .map(|&pe| Input {
                            edge: pe,
                            task: self.by_ctx[&(graph.edges()[pe].from, items.clone())],
                            item: None,
                        })
                        .collect();
                    tasks.push(self.spawn(child, items.clone(), inputs));
                }
            }
        }
        let end = (self.outstanding == 0).then(|| {
            self.ended = true;
            let outcome = if self.last_done <= self.deadline {
                Outcome::Good
            } else {
                Outcome::Late
            };
            End {
                outcome,
                outputs: Some(self.outputs()),
                cancelled: Vec::new(),
            }
        });
        Ok(Progress {
            tasks,
            end,
            discard: false,
        })
    }

    /// For each application output, its step's tasks in item order.
    fn outputs(&self) -> Vec<Vec<TaskKey>> {
        self.graph
            .outputs()
            .iter()
            .map(|&s| {
                let mut t: Vec<&TaskSpec> = self.tasks.iter().filter(|t| t.step == s).collect();
                t.sort_by(|a, b| a.items.cmp(&b.items));
                t.into_iter().map(|t| t.key).collect()
            })
            .collect()
    }

    /// Task `key` failed: the request fails now (unless it already ended).
    pub fn failed(&mut self, key: TaskKey, reason: &str) -> Result<Progress, AppError> {
        let Some(i) = self.check(key)? else {
            return Ok(Self::discard());
        };
        self.state[i] = State::Failed;
        let step = self.tasks[i].step;
        let end = self.end(Outcome::Failed {
            task: Some(key),
            step: Some(step),
            reason: reason.to_string(),
        });
        Ok(Progress {
            tasks: Vec::new(),
            end: Some(end),
            discard: false,
        })
    }

    /// Task `key` expired (the runtime dropped it at its deadline). If its rule
    /// gives it a later, last deadline it has not had yet, the task stays
    /// outstanding and comes back in `tasks` with that deadline, to be submitted
    /// again; otherwise the request ends late now (unless it already ended).
    pub fn expired(&mut self, key: TaskKey) -> Result<Progress, AppError> {
        let Some(i) = self.check(key)? else {
            return Ok(Self::discard());
        };
        let t = &mut self.tasks[i];
        if t.deadline < t.latest {
            t.deadline = t.latest;
            return Ok(Progress {
                tasks: vec![t.clone()],
                end: None,
                discard: false,
            });
        }
        self.state[i] = State::Expired;
        let step = self.tasks[i].step;
        let end = self.end(Outcome::Expired { task: key, step });
        Ok(Progress {
            tasks: Vec::new(),
            end: Some(end),
            discard: false,
        })
    }

    /// Ends the request from outside (the client went away, shutdown); `None` if
    /// it had already ended.
    pub fn abort(&mut self, reason: &str) -> Option<End> {
        if self.ended {
            return None;
        }
        Some(self.end(Outcome::Failed {
            task: None,
            step: None,
            reason: reason.to_string(),
        }))
    }

    pub fn graph(&self) -> &Arc<Graph> {
        &self.graph
    }
    pub fn rule(&self) -> DeadlineRule {
        self.rule
    }
    pub fn arrival(&self) -> Time {
        self.arrival
    }
    /// The application's deadline: arrival + SLO.
    pub fn deadline(&self) -> Time {
        self.deadline
    }
    /// The deadline of `step`'s tasks in this request.
    pub fn step_deadline(&self, step: usize) -> Time {
        self.step_deadline[step]
    }
    /// The last deadline of `step`'s tasks in this request (the same as
    /// [`AppRun::step_deadline`] but under [`DeadlineRule::LatestUseful`]).
    pub fn step_latest(&self, step: usize) -> Time {
        self.step_latest[step]
    }
    pub fn task(&self, key: TaskKey) -> Option<&TaskSpec> {
        self.tasks.get(key.0 as usize)
    }
    /// Tasks submitted and not yet reported (0 once the request ended).
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }
    /// Tasks created so far.
    pub fn tasks_created(&self) -> usize {
        self.tasks.len()
    }
    /// Tasks cancelled by the end that have not reported since (a driver that
    /// waits for every report keeps the request until this is 0).
    pub fn unreported(&self) -> usize {
        self.unreported
    }
    pub fn ended(&self) -> bool {
        self.ended
    }
}
