//! Nexus as a baseline on the same interface (Nexus, SOSP'19, Sections 6.1 and 6.3).
//!
//! * Epoch planning: squishy bin packing ([`crate::plan::squishy`]) of the models'
//!   expected rates gives each GPU a list of sessions (model, target batch).
//! * Routing: each frontend keeps its own smooth weighted round-robin per model over
//!   the GPUs that host the model, weighted by the rate planned on each.
//! * Backends: each GPU owns one queue per hosted model and, whenever it is free,
//!   cycles to the next session that has requests, gathers with early drop (window =
//!   the planned batch) and runs at most the planned batch.
//!
//! There is no global view: a request waits on the GPU it was routed to, which is
//! what makes Nexus fall behind deferred scheduling under bursts.
//! Simplification: a request is in its backend's queue as soon as it reaches the
//! scheduler (the frontend pushes inputs with the request), and the whole plan is
//! computed once from the offered rates (an oracle for the epoch's rate).

use super::dispatcher::{Counters, Output, Plan};
use super::ids::{GpuId, ModelId, PlanId};
use super::model::{DropReason, ModelSpec, Task};
use super::policy::NetBudget;
use super::structs::IndexedHeap;
use super::time::{Dur, Time};
use super::Scheduler;
use crate::plan::squishy::{squishy_bin_packing, NodePlan, Session};
use std::collections::VecDeque;

#[derive(Debug, Clone)]
struct BackendSession {
    model: usize,
    batch: u32,
    queue: VecDeque<Task>,
}

#[derive(Debug, Clone)]
struct Backend {
    sessions: Vec<BackendSession>,
    /// The next session of the current duty cycle.
    rr: usize,
    free_at: Time,
    /// The last batch dispatched here: only its report says when the GPU frees
    /// (a report of an earlier batch arrives when a later one may already run).
    last_plan: Option<PlanId>,
    /// The planned duty cycle of a shared node (the shortest of the nodes mapped to
    /// this GPU); zero for a GPU that runs a single session back to back.
    duty: Dur,
    /// When the current cycle started (`None`: idle, the next request starts one).
    cycle_start: Option<Time>,
    /// Whether the current cycle ran any batch.
    cycle_ran: bool,
}

/// Smooth weighted round-robin over (gpu, session index) targets.
#[derive(Debug, Clone)]
struct Wrr {
    targets: Vec<(usize, usize, f64)>,
    current: Vec<f64>,
}

impl Wrr {
    fn pick(&mut self) -> Option<(usize, usize)> {
        if self.targets.is_empty() {
            return None;
        }
        let total: f64 = self.targets.iter().map(|t| t.2).sum();
        let mut best = 0;
        for i in 0..self.targets.len() {
            self.current[i] += self.targets[i].2;
            if self.current[i] > self.current[best] {
                best = i;
            }
        }
        self.current[best] -= total;
        let (g, s, _) = self.targets[best];
        Some((g, s))
    }
}

/// The Nexus scheduling core.
pub struct NexusCore {
    specs: Vec<ModelSpec>,
    net: NetBudget,
    backends: Vec<Backend>,
    /// routes[frontend][model]
    routes: Vec<Vec<Wrr>>,
    timers: IndexedHeap<Time>,
    outputs: VecDeque<Output>,
    next_plan: u64,
    counters: Counters,
    /// GPUs the plan asked for (may exceed the cluster: then nodes share GPUs).
    pub planned_gpus: usize,
}

impl NexusCore {
    /// Plans the epoch for the expected `rates_rps` (one per model).
    pub fn new(
        specs: Vec<ModelSpec>,
        rates_rps: &[f64],
        gpus: u32,
        frontends: u32,
        net: NetBudget,
    ) -> NexusCore {
        let gpus = gpus.max(1) as usize;
        let sessions: Vec<Session> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| Session {
                model: i as u32,
                slo_ns: (s.slo - net.resp - net.delay(1)).0,
                rate_rps: rates_rps.get(i).copied().unwrap_or(0.0).max(1e-9),
                latency_ns: (1..=s.profile.max_batch())
                    .map(|b| s.profile.latency(b).0)
                    .collect(),
            })
            .collect();
        // Given G GPUs, Nexus plans with headroom: scale the expected rates up by the
        // largest factor whose plan still fits on G GPUs, so that all GPUs are used.
        let fits = |k: f64| -> Option<Vec<NodePlan>> {
            let scaled: Vec<Session> = sessions
                .iter()
                .map(|s| Session {
                    rate_rps: s.rate_rps * k,
                    ..s.clone()
                })
                .collect();
            squishy_bin_packing(&scaled)
                .ok()
                .filter(|n| n.len() <= gpus)
        };
        let (mut lo, mut hi) = (1.0f64, 64.0f64);
        let mut best = None;
        if let Some(n) = fits(1.0) {
            best = Some(n);
            for _ in 0..24 {
                let mid = (lo * hi).sqrt();
                match fits(mid) {
                    Some(n) => {
                        lo = mid;
                        best = Some(n);
                    }
                    None => hi = mid,
                }
            }
        }
        let planned = match best {
            Some(n) => Ok(n),
            None => squishy_bin_packing(&sessions),
        };
        let nodes: Vec<NodePlan> = match planned {
            Ok(n) => n,
            Err(_) => {
                // Some model cannot meet 2*l(1) <= SLO: fall back to one session of
                // batch 1 per model, spread over the GPUs.
                sessions
                    .iter()
                    .map(|s| NodePlan {
                        sessions: vec![crate::plan::squishy::Assignment {
                            model: s.model,
                            batch: 1,
                            rate_rps: s.rate_rps,
                        }],
                        duty_cycle_ns: s.latency_ns[0],
                        occupancy: 1.0,
                    })
                    .collect()
            }
        };
        let planned_gpus = nodes.len();
        let mut backends: Vec<Backend> = (0..gpus)
            .map(|_| Backend {
                sessions: Vec::new(),
                rr: 0,
                free_at: Time::EPOCH_MIN,
                last_plan: None,
                duty: Dur::ZERO,
                cycle_start: None,
                cycle_ran: false,
            })
            .collect();
        // Node i runs on GPU i mod G (an overloaded plan shares GPUs).
        let mut targets: Vec<Vec<(usize, usize, f64)>> = vec![Vec::new(); specs.len()];
        for (i, node) in nodes.iter().enumerate() {
            let g = i % gpus;
            // A node that runs one session back to back has no cycle to wait for.
            if node.sessions.len() > 1 {
                let d = Dur(node.duty_cycle_ns);
                let b = &mut backends[g];
                b.duty = if b.duty == Dur::ZERO {
                    d
                } else {
                    b.duty.min(d)
                };
            }
            for a in &node.sessions {
                let m = a.model as usize;
                let b = &mut backends[g];
                let si = match b.sessions.iter().position(|s| s.model == m) {
                    Some(si) => {
                        b.sessions[si].batch = b.sessions[si].batch.max(a.batch);
                        si
                    }
                    None => {
                        b.sessions.push(BackendSession {
                            model: m,
                            batch: a.batch.max(1),
                            queue: VecDeque::new(),
                        });
                        b.sessions.len() - 1
                    }
                };
                match targets[m].iter_mut().find(|t| t.0 == g) {
                    Some(t) => t.2 += a.rate_rps,
                    None => targets[m].push((g, si, a.rate_rps.max(1e-9))),
                }
            }
        }
        let routes = (0..frontends.max(1))
            .map(|f| {
                targets
                    .iter()
                    .map(|t| {
                        // Stagger frontends so they do not all start on the same GPU.
                        let mut t = t.clone();
                        if !t.is_empty() {
                            let k = f as usize % t.len();
                            t.rotate_left(k);
                        }
                        Wrr {
                            current: vec![0.0; t.len()],
                            targets: t,
                        }
                    })
                    .collect()
            })
            .collect();
        NexusCore {
            specs,
            net,
            backends,
            routes,
            timers: IndexedHeap::new(),
            outputs: VecDeque::new(),
            next_plan: 0,
            counters: Counters::default(),
            planned_gpus,
        }
    }

    fn drop_task(&mut self, m: usize, task: Task, reason: DropReason) {
        self.counters.queued -= 1;
        self.counters.dropped += 1;
        self.outputs.push_back(Output::Drop {
            model: ModelId(m as u32),
            task,
            reason,
        });
    }

    /// Runs backend `g`'s duty cycle: the sessions in turn, one batch each, then
    /// wait for the cycle's end before the next cycle. A cycle in which nothing ran
    /// leaves the GPU idle until the next request.
    fn try_run(&mut self, g: usize, now: Time) {
        let n = self.backends[g].sessions.len();
        if n == 0 {
            self.timers.remove(g);
            return;
        }
        if now < self.backends[g].free_at {
            self.timers.set(g, self.backends[g].free_at);
            return;
        }
        if self.backends[g].rr == 0 {
            let b = &mut self.backends[g];
            match b.cycle_start {
                Some(c) if now < c + b.duty => {
                    self.timers.set(g, c + b.duty);
                    return;
                }
                _ => {
                    b.cycle_start = Some(now);
                    b.cycle_ran = false;
                }
            }
        }
        while self.backends[g].rr < n {
            let si = self.backends[g].rr;
            self.backends[g].rr += 1;
            if self.run_session(g, si, now) {
                self.backends[g].cycle_ran = true;
                return;
            }
        }
        // End of the cycle.
        let b = &mut self.backends[g];
        b.rr = 0;
        let pending = b.sessions.iter().any(|s| !s.queue.is_empty());
        match b.cycle_start {
            Some(c) if b.cycle_ran => self.timers.set(g, (c + b.duty).max(now)),
            _ if pending => self.timers.set(g, now),
            _ => {
                b.cycle_start = None;
                self.timers.remove(g);
            }
        }
    }

    /// Gathers session `si` of GPU `g` with early drop and dispatches at most its
    /// planned batch. Returns whether a batch was dispatched.
    fn run_session(&mut self, g: usize, si: usize, now: Time) -> bool {
        let (m, target) = {
            let s = &self.backends[g].sessions[si];
            (s.model, s.batch)
        };
        let resp = self.net.resp;
        let start = now.max(self.backends[g].free_at);
        // Early drop: the first request whose window fits; drop the ones before.
        loop {
            let prof = &self.specs[m].profile;
            let q = &self.backends[g].sessions[si].queue;
            let Some(head) = q.front().copied() else {
                return false;
            };
            let w = (target as usize).min(q.len()) as u32;
            if start + prof.latency(w) <= head.deadline - resp {
                break;
            }
            let alone = start + prof.latency(1) <= head.deadline - resp;
            self.backends[g].sessions[si].queue.pop_front();
            let reason = if alone {
                DropReason::EarlyDrop
            } else {
                DropReason::Expired
            };
            self.drop_task(m, head, reason);
        }
        let prof = &self.specs[m].profile;
        let q = &mut self.backends[g].sessions[si].queue;
        let head = *q.front().expect("non-empty");
        let cap = target.min(q.len() as u32);
        let bs = prof
            .max_batch_within(head.deadline - resp - start, Dur::ZERO, cap)
            .max(1);
        let tasks: Vec<Task> = q.drain(..bs as usize).collect();
        let finish_at = start + prof.latency(bs);
        self.counters.queued -= bs as u64;
        self.counters.dispatched += bs as u64;
        self.counters.plans += 1;
        let id = PlanId(self.next_plan);
        self.next_plan += 1;
        self.backends[g].free_at = finish_at;
        self.backends[g].last_plan = Some(id);
        self.outputs.push_back(Output::Dispatch(Plan {
            id,
            model: ModelId(m as u32),
            gpu: GpuId(g as u32),
            exec_at: start,
            finish_at,
            tasks,
        }));
        self.timers.set(g, finish_at);
        true
    }
}

impl Scheduler for NexusCore {
    fn handle_request(&mut self, now: Time, model: ModelId, task: Task, frontend: u32) {
        let m = model.idx();
        self.counters.received += 1;
        self.counters.queued += 1;
        let nf = self.routes.len();
        let Some((g, si)) = self.routes[frontend as usize % nf][m].pick() else {
            self.drop_task(m, task, DropReason::ModelRemoved);
            return;
        };
        self.backends[g].sessions[si].queue.push_back(task);
        if !self.timers.contains(g) {
            self.try_run(g, now);
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        while let Some((g, t)) = self.timers.peek() {
            if t > now {
                break;
            }
            self.try_run(g, now);
        }
    }

    fn handle_gpu_report(&mut self, now: Time, gpu: GpuId, plan: PlanId, free_at: Time) {
        let g = gpu.idx();
        if g >= self.backends.len() || self.backends[g].last_plan != Some(plan) {
            // An earlier batch's end: the GPU runs a later one, whose end is booked.
            self.handle_timeout(now);
            return;
        }
        self.backends[g].free_at = free_at;
        if self.timers.contains(g) {
            self.timers.set(g, free_at);
        }
        self.handle_timeout(now);
    }

    fn next_timeout(&self) -> Option<Time> {
        self.timers.peek().map(|(_, t)| t)
    }

    fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    fn counters(&self) -> Counters {
        self.counters.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ids::TaskId;
    use crate::core::profile::LatencyProfile;

    fn dispatches(c: &mut NexusCore) -> Vec<Plan> {
        let mut v = Vec::new();
        while let Some(o) = c.poll_output() {
            if let Output::Dispatch(p) = o {
                v.push(p);
            }
        }
        v
    }

    /// A batch's end is reported when the next batch may already have been
    /// dispatched at that very moment (the core's own timer fired first): the
    /// late report must not free the GPU that now runs the later batch, or the
    /// core would stack batches on it that it believes start at once.
    #[test]
    fn the_report_of_an_earlier_batch_does_not_free_a_gpu_running_a_later_one() {
        // l(b) = 1 ms * b + 5 ms, SLO 100 ms, one GPU.
        let spec = ModelSpec {
            name: "m".into(),
            profile: LatencyProfile::linear(Dur::from_ms(1), Dur::from_ms(5), 32).unwrap(),
            slo: Dur::from_ms(100),
        };
        // No network: every budget zero.
        let net = NetBudget::default();
        let mut c = NexusCore::new(vec![spec], &[100.0], 1, 1, net);
        let mut id = 0u64;
        let mut req = |c: &mut NexusCore, now: Time| {
            id += 1;
            let t = Task {
                id: TaskId(id),
                arrival: now,
                deadline: now + Dur::from_ms(100),
                tag: 0,
                cap: 0,
            };
            c.handle_request(now, ModelId(0), t, 0);
        };
        let t0 = Time(1_000_000_000);
        req(&mut c, t0);
        let a = dispatches(&mut c);
        assert_eq!(a.len(), 1, "an idle GPU runs the first request at once");
        assert_eq!(a[0].finish_at, t0 + Dur::from_ms(6));
        // Two requests queue while A runs; at A's end the timer fires first and
        // B (both requests) starts.
        req(&mut c, t0 + Dur::from_ms(1));
        req(&mut c, t0 + Dur::from_ms(2));
        assert!(dispatches(&mut c).is_empty(), "the GPU is busy");
        let f = a[0].finish_at;
        c.handle_timeout(f);
        let b = dispatches(&mut c);
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].exec_at, b[0].tasks.len()), (f, 2));
        // One more request, then A's report at the same moment.
        req(&mut c, f);
        c.handle_gpu_report(f, GpuId(0), a[0].id, f);
        assert!(
            dispatches(&mut c).is_empty(),
            "A's report must not free the GPU while B runs"
        );
        // B's own report frees it: the waiting request runs then.
        let g = b[0].finish_at;
        c.handle_gpu_report(g, GpuId(0), b[0].id, g);
        let next = dispatches(&mut c);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].exec_at, g);
    }
}
