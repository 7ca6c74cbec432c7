//! The scheduler's in-flight plans: each dispatched plan belongs to one backend
//! and one of its GPUs until that backend reports it done or is lost. A backend
//! may only report its own plans on the GPU they were sent to.
//!
//! The plan watchdog: each plan is due back by its planned end `finish_at =
//! exec_at + l(b)` plus a grace of `max(grace, l(b))`; [`PlanLedger::overdue`]
//! names the backends with a plan past that, which the scheduler takes out of
//! service (a backend that still answers pings but no longer finishes plans
//! would otherwise keep being given work while its tasks wait for the
//! frontends' fallback).

use crate::core::{Dur, GpuId, ModelId, Plan, PlanId, TaskId, Time};
use crate::wire::NodeId;
use std::collections::HashMap;

#[derive(Debug, Clone)]
struct InFlight {
    backend: NodeId,
    gpu: GpuId,
    model: ModelId,
    /// Its tasks and their deadlines (to count those it ends past).
    tasks: Vec<(TaskId, Time)>,
    /// Its planned run time (`finish_at - exec_at`).
    span: Dur,
    /// When the report is overdue (scheduler time).
    due: Time,
}

/// A plan reported done: its task count, and how many of them it finished past
/// their deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub model: ModelId,
    pub tasks: usize,
    pub late: usize,
    /// Its tasks' deadlines (in the plan's order).
    pub deadlines: Vec<Time>,
    /// Its planned run time (`finish_at - exec_at`), which the backend judged
    /// its tasks by ([`super::backend::planned_profile`]).
    pub span: Dur,
}

/// A plan not reported done in time, the worst of its backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overdue {
    pub backend: NodeId,
    pub plan: PlanId,
    pub gpu: GpuId,
    /// How long past its due time.
    pub late: Dur,
}

/// The default grace after a plan's planned end before the watchdog acts.
pub const PLAN_GRACE: Dur = Dur(500_000_000);

/// Why a reported plan was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No such plan in flight: reported twice, or never sent (counted, ignored).
    Unknown,
    /// The plan is another backend's, or was sent to another GPU: a protocol
    /// violation by the reporter.
    NotYours(String),
}

/// Plans sent and not yet reported done.
#[derive(Debug)]
pub struct PlanLedger {
    plans: HashMap<PlanId, InFlight>,
    grace: Dur,
}

impl Default for PlanLedger {
    fn default() -> Self {
        PlanLedger::new(PLAN_GRACE)
    }
}

impl PlanLedger {
    /// A ledger whose plans are overdue `max(grace, l(b))` after their planned end.
    pub fn new(grace: Dur) -> PlanLedger {
        PlanLedger {
            plans: HashMap::new(),
            grace,
        }
    }

    pub fn len(&self) -> usize {
        self.plans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    /// `plan` was sent to `backend` (its GPU) with these tasks (id, deadline).
    pub fn sent(
        &mut self,
        plan: &Plan,
        backend: NodeId,
        tasks: impl IntoIterator<Item = (TaskId, Time)>,
    ) {
        let span = (plan.finish_at - plan.exec_at).max(Dur::ZERO);
        self.plans.insert(
            plan.id,
            InFlight {
                backend,
                gpu: plan.gpu,
                model: plan.model,
                tasks: tasks.into_iter().collect(),
                span,
                due: plan.finish_at + self.grace.max(span),
            },
        );
    }

    /// The backends with a plan overdue at `now`, each with its most overdue
    /// plan (the lowest id on a tie), in backend order.
    pub fn overdue(&self, now: Time) -> Vec<Overdue> {
        let mut worst: HashMap<NodeId, Overdue> = HashMap::new();
        for (&id, f) in &self.plans {
            if now <= f.due {
                continue;
            }
            let o = Overdue {
                backend: f.backend,
                plan: id,
                gpu: f.gpu,
                late: now - f.due,
            };
            let w = worst.entry(f.backend).or_insert_with(|| o.clone());
            if (o.late, std::cmp::Reverse(o.plan)) > (w.late, std::cmp::Reverse(w.plan)) {
                *w = o;
            }
        }
        let mut v: Vec<Overdue> = worst.into_values().collect();
        v.sort_unstable_by_key(|o| o.backend);
        v
    }

    /// The plan could not be sent after all: its tasks.
    pub fn unsent(&mut self, plan: PlanId) -> Vec<TaskId> {
        self.plans
            .remove(&plan)
            .map(|f| f.tasks.into_iter().map(|t| t.0).collect())
            .unwrap_or_default()
    }

    /// `backend` reports `plan` done on `gpu` at `finished`: the plan's task
    /// count and how many it ended late, when it is that backend's plan on that GPU.
    pub fn done(
        &mut self,
        backend: NodeId,
        plan: PlanId,
        gpu: GpuId,
        finished: Time,
    ) -> Result<Done, Refused> {
        let Some(f) = self.plans.get(&plan) else {
            return Err(Refused::Unknown);
        };
        if f.backend != backend {
            return Err(Refused::NotYours(format!(
                "plan {} is not this backend's (node {backend})",
                plan.0
            )));
        }
        if f.gpu != gpu {
            return Err(Refused::NotYours(format!(
                "plan {} was sent to GPU {}, not GPU {}",
                plan.0, f.gpu.0, gpu.0
            )));
        }
        let f = self.plans.remove(&plan).expect("looked up above");
        let late = f.tasks.iter().filter(|t| finished > t.1).count();
        Ok(Done {
            model: f.model,
            tasks: f.tasks.len(),
            late,
            deadlines: f.tasks.into_iter().map(|t| t.1).collect(),
            span: f.span,
        })
    }

    /// Plans in flight of `model` on the backends `on` names (a model leaving
    /// a sub-cluster is unloaded from its backends only once this is 0).
    pub fn model_plans(&self, model: ModelId, on: impl Fn(NodeId) -> bool) -> usize {
        self.plans
            .values()
            .filter(|f| f.model == model && on(f.backend))
            .count()
    }

    /// Plans in flight on `backend`.
    pub fn backend_plans(&self, backend: NodeId) -> usize {
        self.plans.values().filter(|f| f.backend == backend).count()
    }

    /// `backend` is lost: the tasks of every plan it had not reported done.
    pub fn take_backend(&mut self, backend: NodeId) -> Vec<TaskId> {
        let ids: Vec<PlanId> = self
            .plans
            .iter()
            .filter(|(_, f)| f.backend == backend)
            .map(|(&id, _)| id)
            .collect();
        let mut tasks = Vec::new();
        for id in ids {
            if let Some(f) = self.plans.remove(&id) {
                tasks.extend(f.tasks.into_iter().map(|t| t.0));
            }
        }
        tasks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tasks with no deadline to miss.
    fn ids(ids: &[u64]) -> Vec<(TaskId, Time)> {
        ids.iter().map(|&i| (TaskId(i), Time::NEVER)).collect()
    }

    fn plan(id: u64, gpu: u32, exec_ms: i64, finish_ms: i64) -> Plan {
        Plan {
            id: PlanId(id),
            gpu: GpuId(gpu),
            exec_at: Time(exec_ms * 1_000_000),
            finish_at: Time(finish_ms * 1_000_000),
            model: crate::core::ModelId(0),
            tasks: Vec::new(),
        }
    }

    #[test]
    fn only_the_owner_reports_a_plan_and_only_once() {
        let mut l = PlanLedger::default();
        l.sent(&plan(1, 0, 0, 5), 7, ids(&[10, 11]));
        l.sent(&plan(2, 1, 0, 5), 8, ids(&[12]));
        assert!(matches!(
            l.done(8, PlanId(1), GpuId(1), Time(0)),
            Err(Refused::NotYours(_))
        ));
        assert!(matches!(
            l.done(7, PlanId(1), GpuId(3), Time(0)),
            Err(Refused::NotYours(_))
        ));
        assert_eq!(
            l.done(7, PlanId(1), GpuId(0), Time(0)).map(|d| d.tasks),
            Ok(2)
        );
        assert_eq!(
            l.done(7, PlanId(1), GpuId(0), Time(0)),
            Err(Refused::Unknown)
        );
        assert_eq!(l.take_backend(8), vec![TaskId(12)]);
        assert!(l.is_empty());
        l.sent(&plan(3, 0, 0, 5), 7, ids(&[1]));
        assert_eq!(l.unsent(PlanId(3)), vec![TaskId(1)]);
        assert_eq!(l.unsent(PlanId(3)), Vec::<TaskId>::new());
    }

    #[test]
    fn a_plan_is_overdue_after_its_end_plus_the_larger_of_the_grace_and_its_span() {
        let ms = |m: i64| Time(m * 1_000_000);
        let mut l = PlanLedger::new(Dur::from_ms(100));
        // Short batch: due 10 + 100 ms.
        l.sent(&plan(1, 0, 0, 10), 7, ids(&[1]));
        // Long batch (300 ms): due 400 + 300 ms.
        l.sent(&plan(2, 1, 100, 400), 8, ids(&[2]));
        assert!(l.overdue(ms(110)).is_empty(), "due at, not after");
        let o = l.overdue(ms(111));
        assert_eq!(
            o,
            vec![Overdue {
                backend: 7,
                plan: PlanId(1),
                gpu: GpuId(0),
                late: Dur::from_ms(1)
            }]
        );
        assert_eq!(l.overdue(ms(700)).len(), 1, "the long one has until 700");
        assert_eq!(l.overdue(ms(701)).len(), 2);
        // Reported: no longer overdue; the worst plan of a backend is named.
        assert_eq!(
            l.done(7, PlanId(1), GpuId(0), Time(0)).map(|d| d.tasks),
            Ok(1)
        );
        l.sent(&plan(3, 1, 0, 10), 8, ids(&[3]));
        let o = l.overdue(ms(800));
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].plan, PlanId(3), "the later due one is less late");
        assert_eq!(o[0].late, Dur::from_ms(690));
    }
}
