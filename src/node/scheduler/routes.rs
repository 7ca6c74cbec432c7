//! Where plans and drops go ([`Routes`]): each GPU's backend connection and each
//! frontend's connection. The real-time scheduler's threads dispatch through it
//! (it is their [`Outlet`]: plans to the backend owning the GPU, drop notices to
//! the frontend owning the task); the event loop adds and removes routes as nodes
//! come and go.

use super::metrics::SchedMetrics;
use crate::core::{DropReason, GpuId, ModelId, Plan, Task, TaskId, Time};
use crate::node::proto::plans::PlanLedger;
use crate::node::proto::sched::{plan_msg, plan_tasks};
use crate::runtime::clock::Clock;
use crate::runtime::sched::{GpuReporter, Outlet};
use crate::transport::Conn;
use crate::wire::{drops_by_frontend, task_owner, Msg, NodeId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

struct GpuRoute {
    conn: Arc<dyn Conn>,
    backend: NodeId,
    /// Its sub-cluster (whose RankThread hears when it is free).
    sub: u32,
}

/// Where plans and drops go; shared by the ModelThreads and the event loop.
pub(super) struct Routes {
    gpus: RwLock<Vec<Option<GpuRoute>>>,
    frontends: RwLock<HashMap<NodeId, Arc<dyn Conn>>>,
    /// In flight plans (the protocol machine's ledger).
    plans: Arc<Mutex<PlanLedger>>,
    /// Each sub-cluster's RankThread, for GPU free times.
    pub(super) reporters: OnceLock<Vec<GpuReporter>>,
    clock: Clock,
    pub(super) plans_sent: AtomicU64,
    pub(super) lost: AtomicU64,
    pub(super) dropped: AtomicU64,
    /// Drops in the core per model id (a sub-cluster's bad rate).
    pub(super) dropped_by_model: Vec<AtomicU64>,
    pub(super) metrics: SchedMetrics,
}

impl Routes {
    pub(super) fn new(
        plans: Arc<Mutex<PlanLedger>>,
        clock: Clock,
        metrics: SchedMetrics,
    ) -> Routes {
        Routes {
            gpus: RwLock::new(Vec::new()),
            frontends: RwLock::new(HashMap::new()),
            plans,
            reporters: OnceLock::new(),
            clock,
            plans_sent: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            dropped_by_model: (0..metrics.tasks.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            metrics,
        }
    }

    /// Tells the tasks' frontends they were dropped.
    pub(super) fn notify(&self, tasks: impl IntoIterator<Item = TaskId>, code: DropReason) {
        let by_fe = drops_by_frontend(tasks, code);
        self.metrics.dropped(
            code,
            by_fe.iter().map(|(_, items)| items.len() as u64).sum(),
        );
        let fes = self.frontends.read().expect("routes lock");
        for (fe, items) in by_fe {
            if let Some(c) = fes.get(&fe) {
                let _ = c.send(Msg::Dropped { items });
            }
        }
    }

    /// The tasks' backend is gone: they end as `BackendLost` (none: nothing to do).
    fn lose(&self, tasks: impl ExactSizeIterator<Item = TaskId>) {
        if tasks.len() == 0 {
            return;
        }
        self.lost.fetch_add(tasks.len() as u64, Ordering::Relaxed);
        self.notify(tasks, DropReason::BackendLost);
    }

    /// A backend's GPUs are reached on `conn` from now on.
    pub(super) fn gpus_up(&self, conn: &Arc<dyn Conn>, backend: NodeId, sub: u32, gpus: &[GpuId]) {
        let mut g = self.gpus.write().expect("routes lock");
        for &id in gpus {
            if g.len() <= id.idx() {
                g.resize_with(id.idx() + 1, || None);
            }
            g[id.idx()] = Some(GpuRoute {
                conn: conn.clone(),
                backend,
                sub,
            });
        }
    }

    /// A backend's GPUs have no route any more.
    pub(super) fn gpus_down(&self, gpus: &[GpuId]) {
        let mut g = self.gpus.write().expect("routes lock");
        for &id in gpus {
            if let Some(r) = g.get_mut(id.idx()) {
                *r = None;
            }
        }
    }

    /// Plans of `backend` recorded after its routes went (see `gpus_down` in the
    /// event loop) end as `BackendLost`.
    pub(super) fn lose_backend(&self, backend: NodeId) {
        let late = self.plans.lock().expect("plans lock").take_backend(backend);
        self.lose(late.into_iter());
    }

    /// Drops for `node`'s tasks go to `conn` from now on.
    pub(super) fn frontend_up(&self, node: NodeId, conn: Arc<dyn Conn>) {
        self.frontends
            .write()
            .expect("routes lock")
            .insert(node, conn);
    }

    /// `node` is gone: its tasks are left out of plans, no drops go to it.
    pub(super) fn frontend_down(&self, node: NodeId) {
        self.frontends.write().expect("routes lock").remove(&node);
    }
}

impl Outlet for Routes {
    fn dispatch(&self, plan: Plan, sent_at: Time) {
        let tasks = {
            let fes = self.frontends.read().expect("routes lock");
            plan_tasks(&plan, |fe| fes.contains_key(&fe))
        };
        // The route lookup and the plan's record happen under the routes' read
        // lock: once a backend's routes are gone (write lock), no plan of it can
        // be recorded after the driver collects the last ones (`gpus_down`).
        let ntasks = tasks.len();
        let conn = {
            let g = self.gpus.read().expect("routes lock");
            let route = g
                .get(plan.gpu.idx())
                .and_then(|r| r.as_ref())
                .map(|r| (r.conn.clone(), r.backend, r.sub));
            let Some((conn, backend, sub)) = route else {
                drop(g);
                // The GPU's backend is gone (its GPUs are leaving service).
                self.lose(tasks.iter().map(|t| t.id));
                return;
            };
            if tasks.is_empty() {
                drop(g);
                // Every task's frontend is gone: the GPU is free again now.
                if let Some(r) = self.reporters.get().and_then(|r| r.get(sub as usize)) {
                    r.report(plan.gpu, plan.id, self.clock.now());
                }
                return;
            }
            self.plans.lock().expect("plans lock").sent(
                &plan,
                backend,
                tasks.iter().map(|t| (t.id, t.deadline)),
            );
            conn
        };
        let msg = plan_msg(&plan, tasks, sent_at);
        self.plans_sent.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.metrics.plans.get(plan.model.idx()) {
            c.inc();
            self.metrics.batch[plan.model.idx()].observe(ntasks as u64);
        }
        if conn.send(msg).is_err() {
            let lost = self.plans.lock().expect("plans lock").unsent(plan.id);
            self.lose(lost.into_iter());
        }
    }

    fn drop_task(&self, model: ModelId, task: Task, reason: DropReason, _at: Time) {
        // Called once per dropped task from the ModelThreads: straight to its
        // frontend, without `notify`'s grouping.
        self.dropped.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.dropped_by_model.get(model.idx()) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics.dropped(reason, 1);
        let fes = self.frontends.read().expect("routes lock");
        if let Some(c) = fes.get(&task_owner(task.id)) {
            let _ = c.send(Msg::Dropped {
                items: vec![(task.id, reason)],
            });
        }
    }
}
