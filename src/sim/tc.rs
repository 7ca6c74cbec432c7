//! Throughput-cost (TC) dispatch, as Harpagon and Piccolo describe it: a module's
//! machines are ranked by throughput per price; requests are gathered into whole
//! batches of the target machine's batch size and each batch goes to the
//! best-ranked machine that is free (machines of equal rank take batches in
//! turn), so a machine gathers its batch at the rate of every machine ranked no
//! better. Harpagon fills batches with dummy requests; here a batch that would
//! otherwise miss its head's deadline leaves partial instead. Nothing is dropped.
//!
//! A pure state machine behind the core's [`Scheduler`] interface, driven by the
//! application simulator; one instance serves one model on its own machines.

use crate::core::{
    Counters, GpuId, LatencyProfile, ModelId, Output, Plan, PlanId, Scheduler, Task, Time,
};
use std::collections::VecDeque;

/// One machine lane as TC sees it.
#[derive(Debug, Clone)]
pub struct TcLane {
    /// Whole batches of this size.
    pub batch: u32,
    pub profile: LatencyProfile,
    /// Throughput per price of the lane's machine (its rank; higher first).
    pub ratio: f64,
}

pub struct TcDispatch {
    model: ModelId,
    lanes: Vec<TcLane>,
    /// Lane indices by rank, best first.
    order: Vec<usize>,
    free_at: Vec<Time>,
    /// Next lane to try first within each group of equal rank (by position in `order`).
    turn: Vec<usize>,
    open: Vec<Task>,
    target: Option<usize>,
    out: VecDeque<Output>,
    next_plan: u64,
    counters: Counters,
}

impl TcDispatch {
    pub fn new(model: ModelId, lanes: Vec<TcLane>) -> TcDispatch {
        assert!(!lanes.is_empty(), "TC dispatch needs a lane");
        let mut order: Vec<usize> = (0..lanes.len()).collect();
        order.sort_by(|&a, &b| lanes[b].ratio.total_cmp(&lanes[a].ratio).then(a.cmp(&b)));
        let n = lanes.len();
        TcDispatch {
            model,
            lanes,
            order,
            free_at: vec![Time::EPOCH_MIN; n],
            turn: vec![0; n],
            open: Vec::new(),
            target: None,
            out: VecDeque::new(),
            next_plan: 0,
            counters: Counters::default(),
        }
    }

    /// The best-ranked lane free at `now` (equal ranks in turn), else the lane
    /// free soonest.
    fn pick(&mut self, now: Time) -> usize {
        let mut i = 0;
        while i < self.order.len() {
            let r = self.lanes[self.order[i]].ratio;
            let mut j = i;
            while j < self.order.len() && self.lanes[self.order[j]].ratio == r {
                j += 1;
            }
            let len = j - i;
            for k in 0..len {
                let pos = i + (self.turn[i] + k) % len;
                let lane = self.order[pos];
                if self.free_at[lane] <= now {
                    self.turn[i] = (pos - i + 1) % len;
                    return lane;
                }
            }
            i = j;
        }
        *self
            .order
            .iter()
            .min_by_key(|&&l| self.free_at[l])
            .expect("a lane")
    }

    fn send(&mut self, now: Time) {
        let Some(lane) = self.target.take() else {
            return;
        };
        let tasks = std::mem::take(&mut self.open);
        let exec_at = now.max(self.free_at[lane]);
        let finish_at = exec_at + self.lanes[lane].profile.latency(tasks.len() as u32);
        self.free_at[lane] = finish_at;
        self.counters.dispatched += tasks.len() as u64;
        self.counters.queued -= tasks.len() as u64;
        self.next_plan += 1;
        self.out.push_back(Output::Dispatch(Plan {
            id: PlanId(self.next_plan),
            model: self.model,
            gpu: GpuId(lane as u32),
            exec_at,
            finish_at,
            tasks,
        }));
    }

    /// When the open batch must leave so that its head still meets its deadline.
    fn due(&self) -> Option<Time> {
        let lane = self.target?;
        let head = self.open.iter().map(|t| t.deadline).min()?;
        Some(head - self.lanes[lane].profile.latency(self.open.len() as u32 + 1))
    }
}

impl Scheduler for TcDispatch {
    fn handle_request(&mut self, now: Time, _model: ModelId, task: Task, _frontend: u32) {
        self.counters.received += 1;
        self.counters.queued += 1;
        if self.target.is_none() {
            self.target = Some(self.pick(now));
        }
        self.open.push(task);
        let lane = self.target.expect("set");
        let cap = self.lanes[lane]
            .batch
            .min(self.lanes[lane].profile.max_batch());
        if self.open.len() as u32 >= cap {
            self.send(now);
        }
    }
    fn handle_timeout(&mut self, now: Time) {
        if self.due().is_some_and(|t| t <= now) {
            self.send(now);
        }
    }
    fn handle_gpu_report(&mut self, _now: Time, gpu: GpuId, _plan: PlanId, free_at: Time) {
        if let Some(f) = self.free_at.get_mut(gpu.idx()) {
            *f = free_at;
        }
    }
    fn next_timeout(&self) -> Option<Time> {
        self.due()
    }
    fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }
    fn counters(&self) -> Counters {
        self.counters.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Dur, TaskId};

    fn task(id: u64, at: Time, deadline: Time) -> Task {
        Task {
            id: TaskId(id),
            arrival: at,
            deadline,
            tag: 0,
            cap: 0,
        }
    }

    fn plans(s: &mut TcDispatch) -> Vec<Plan> {
        let mut v = Vec::new();
        while let Some(o) = s.poll_output() {
            let Output::Dispatch(p) = o else {
                panic!("TC never drops")
            };
            v.push(p);
        }
        v
    }

    #[test]
    fn whole_batches_go_to_the_best_ranked_free_machine_in_turn() {
        let prof = LatencyProfile::linear_ms(1.0, 4.0, 8).unwrap();
        let lane = |batch, ratio| TcLane {
            batch,
            profile: prof.clone(),
            ratio,
        };
        // Two machines ranked 3 (batch 4), one ranked 2 (batch 2).
        let mut s = TcDispatch::new(ModelId(0), vec![lane(2, 2.0), lane(4, 3.0), lane(4, 3.0)]);
        let far = Time::ZERO + Dur::from_ms(1000);
        let mut id = 0;
        let mut feed = |s: &mut TcDispatch, n: usize, at: Time| {
            for _ in 0..n {
                s.handle_request(at, ModelId(0), task(id, at, far), 0);
                id += 1;
            }
        };
        feed(&mut s, 4, Time::ZERO);
        feed(&mut s, 4, Time::ZERO);
        // Both rank-3 machines are busy: the rank-2 one takes a batch of 2.
        feed(&mut s, 2, Time::ZERO);
        let p = plans(&mut s);
        let got: Vec<(u32, usize)> = p.iter().map(|p| (p.gpu.0, p.tasks.len())).collect();
        assert_eq!(got, vec![(1, 4), (2, 4), (0, 2)]);
        // All busy: the next batch targets the lane free soonest and waits for it.
        feed(&mut s, 4, Time::ZERO);
        let p = plans(&mut s);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].gpu.0, 0);
        assert_eq!(p[0].exec_at, Time::ZERO + Dur::from_ms(6));
    }

    #[test]
    fn a_batch_that_would_miss_its_head_leaves_partial() {
        let prof = LatencyProfile::linear_ms(1.0, 4.0, 8).unwrap();
        let mut s = TcDispatch::new(
            ModelId(0),
            vec![TcLane {
                batch: 8,
                profile: prof,
                ratio: 1.0,
            }],
        );
        let deadline = Time::ZERO + Dur::from_ms(20);
        s.handle_request(Time::ZERO, ModelId(0), task(0, Time::ZERO, deadline), 0);
        // A batch of 2 takes 6 ms: it must leave by 14 ms.
        assert_eq!(s.next_timeout(), Some(Time::ZERO + Dur::from_ms(14)));
        s.handle_timeout(Time::ZERO + Dur::from_ms(14));
        let p = plans(&mut s);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].tasks.len(), 1);
        assert!(p[0].finish_at <= deadline);
        assert_eq!(s.next_timeout(), None);
        assert_eq!(s.counters().dispatched, 1);
    }
}
