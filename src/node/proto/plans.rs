//! The scheduler's in-flight plans: each dispatched plan belongs to one backend
//! and one of its GPUs until that backend reports it done or is lost. A backend
//! may only report its own plans on the GPU they were sent to.

use crate::core::{GpuId, PlanId, TaskId};
use crate::wire::NodeId;
use std::collections::HashMap;

#[derive(Debug, Clone)]
struct InFlight {
    backend: NodeId,
    gpu: GpuId,
    tasks: Vec<TaskId>,
}

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
#[derive(Debug, Default)]
pub struct PlanLedger {
    plans: HashMap<PlanId, InFlight>,
}

impl PlanLedger {
    pub fn new() -> PlanLedger {
        PlanLedger::default()
    }

    pub fn len(&self) -> usize {
        self.plans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    /// `plan` was sent to `backend`'s `gpu` with these tasks.
    pub fn sent(&mut self, plan: PlanId, backend: NodeId, gpu: GpuId, tasks: Vec<TaskId>) {
        self.plans.insert(
            plan,
            InFlight {
                backend,
                gpu,
                tasks,
            },
        );
    }

    /// The plan could not be sent after all: its tasks.
    pub fn unsent(&mut self, plan: PlanId) -> Vec<TaskId> {
        self.plans
            .remove(&plan)
            .map(|f| f.tasks)
            .unwrap_or_default()
    }

    /// `backend` reports `plan` done on `gpu`: the plan's task count when it is
    /// that backend's plan on that GPU.
    pub fn done(&mut self, backend: NodeId, plan: PlanId, gpu: GpuId) -> Result<usize, Refused> {
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
        Ok(self.plans.remove(&plan).map_or(0, |f| f.tasks.len()))
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
                tasks.extend(f.tasks);
            }
        }
        tasks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owner_reports_a_plan_and_only_once() {
        let mut l = PlanLedger::new();
        l.sent(PlanId(1), 7, GpuId(0), vec![TaskId(10), TaskId(11)]);
        l.sent(PlanId(2), 8, GpuId(1), vec![TaskId(12)]);
        assert!(matches!(
            l.done(8, PlanId(1), GpuId(1)),
            Err(Refused::NotYours(_))
        ));
        assert!(matches!(
            l.done(7, PlanId(1), GpuId(3)),
            Err(Refused::NotYours(_))
        ));
        assert_eq!(l.done(7, PlanId(1), GpuId(0)), Ok(2));
        assert_eq!(l.done(7, PlanId(1), GpuId(0)), Err(Refused::Unknown));
        assert_eq!(l.take_backend(8), vec![TaskId(12)]);
        assert!(l.is_empty());
        l.sent(PlanId(3), 7, GpuId(0), vec![TaskId(1)]);
        assert_eq!(l.unsent(PlanId(3)), vec![TaskId(1)]);
        assert_eq!(l.unsent(PlanId(3)), Vec::<TaskId>::new());
    }
}
