//! The two halves of the core (ModelShard and Ranker) joined by messages with random
//! delays, as the real-time runtime joins them by channels: no GPU is ever booked
//! twice, no batch is planned past its deadline, and every request ends exactly once.

use fermata::core::rank::{RankOutput, Ranker};
use fermata::core::shard::{ModelShard, ToRank};
use fermata::core::{
    DispatcherConfig, Dur, LatencyProfile, ModelId, ModelSpec, Output, Policy, Task, TaskId, Time,
};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

enum Msg {
    Rank(ToRank),
    Shard(usize, RankOutput),
}

fn run(seed: u64, policy: Policy, max_delay_us: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let (models, gpus, shards) = (6u32, 4u32, 2usize);
    let mut cfg = DispatcherConfig::new(policy, gpus);
    cfg.gather = policy.default_gather();
    cfg.net.ctrl = Dur::from_us(300);
    cfg.check_invariants = true;
    let mut sh: Vec<ModelShard> = (0..shards)
        .map(|k| ModelShard::new(cfg.clone(), k as u32, shards as u32))
        .collect();
    let mut rank = Ranker::new(policy, gpus);
    for m in 0..models {
        let spec = ModelSpec {
            name: format!("m{m}"),
            profile: LatencyProfile::linear_ms(0.3 + 0.2 * m as f64, 2.0, 32).unwrap(),
            slo: Dur::from_ms(15 + 3 * m as i64),
        };
        sh[m as usize % shards].add_model(ModelId(m), spec);
        rank.add_model(ModelId(m));
    }
    let mut inflight: BinaryHeap<Reverse<(Time, u64)>> = BinaryHeap::new();
    let mut msgs: HashMap<u64, Msg> = HashMap::new();
    let mut seq = 0u64;
    let mut ended: HashMap<u64, u8> = HashMap::new();
    let mut gpu_free: HashMap<u32, Time> = HashMap::new();
    let mut next_arrival = Time::ZERO;
    let end = Time::ZERO + Dur::from_ms(400);
    let mut id = 0u64;
    let mut now = Time::ZERO;
    let mut to_rank_last = vec![Time::ZERO; shards];
    let mut to_shard_last = vec![Time::ZERO; shards];
    loop {
        let tm = inflight.peek().map(|r| r.0 .0);
        let tr = rank.next_timeout();
        let ts = sh.iter().filter_map(|s| s.next_timeout()).min();
        let ta = (next_arrival < end).then_some(next_arrival);
        let Some(t) = [tm, tr, ts, ta].into_iter().flatten().min() else {
            break;
        };
        now = now.max(t);
        if ta == Some(t) {
            let m = rng.below(models as u64) as u32;
            let task = Task {
                id: TaskId(id),
                arrival: now,
                deadline: now + Dur::from_ms(15 + 3 * m as i64),
                tag: 0,
                cap: 0,
            };
            id += 1;
            sh[m as usize % shards].handle_request(now, ModelId(m), task);
            next_arrival = now + Dur::from_us(50 + rng.below(400) as i64);
        } else if tm == Some(t) {
            let Reverse((_, k)) = inflight.pop().unwrap();
            match msgs.remove(&k).unwrap() {
                Msg::Rank(m) => rank.handle_from_models(now, m),
                Msg::Shard(k, o) => sh[k].handle_rank_output(now, o),
            }
        } else if tr == Some(t) {
            rank.handle_timeout(now);
        } else {
            for s in sh.iter_mut() {
                if s.next_timeout().is_some_and(|x| x <= now) {
                    s.handle_timeout(now);
                }
            }
        }
        // Route every output with a random delay, first in first out per channel
        // (as crossbeam channels are): a later send never arrives earlier.
        for (k, s) in sh.iter_mut().enumerate() {
            s.flush();
            while let Some(m) = s.poll_rank() {
                let d = Dur::from_us(rng.below(max_delay_us + 1) as i64);
                let at = (now + d).max(to_rank_last[k]);
                to_rank_last[k] = at;
                inflight.push(Reverse((at, seq)));
                msgs.insert(seq, Msg::Rank(m));
                seq += 1;
            }
            while let Some(o) = s.poll_output() {
                match o {
                    Output::Dispatch(p) => {
                        let f = gpu_free.entry(p.gpu.0).or_insert(Time::EPOCH_MIN);
                        assert!(
                            p.exec_at >= *f,
                            "seed {seed}: GPU {:?} booked twice (shard {k})",
                            p.gpu
                        );
                        *f = p.finish_at;
                        for t in &p.tasks {
                            assert!(p.finish_at <= t.deadline, "planned past its deadline");
                            assert!(ended.insert(t.id.0, 1).is_none(), "ended twice");
                        }
                    }
                    Output::Drop { task, .. } => {
                        assert!(ended.insert(task.id.0, 2).is_none(), "ended twice");
                    }
                    Output::Preempt { .. } => {}
                }
            }
        }
        while let Some(o) = rank.poll_output() {
            let k = o.model().idx() % shards;
            let d = Dur::from_us(rng.below(max_delay_us + 1) as i64);
            let at = (now + d).max(to_shard_last[k]);
            to_shard_last[k] = at;
            inflight.push(Reverse((at, seq)));
            msgs.insert(seq, Msg::Shard(k, o));
            seq += 1;
        }
    }
    assert_eq!(
        ended.len() as u64,
        id,
        "seed {seed}: every request ends exactly once"
    );
    let dispatched = ended.values().filter(|&&v| v == 1).count();
    assert!(
        dispatched as u64 * 2 > id,
        "seed {seed}: most requests are served at this load"
    );
}

#[test]
fn delayed_messages_never_book_a_gpu_twice_or_lose_a_request() {
    for seed in 1..=12 {
        run(seed, Policy::Deferred, 200);
        run(seed, Policy::Eager, 200);
    }
}

#[test]
fn zero_delay_split_runs_like_a_single_thread() {
    for seed in 1..=4 {
        run(seed, Policy::Deferred, 0);
    }
}
