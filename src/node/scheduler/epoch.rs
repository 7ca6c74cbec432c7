//! The epoch partitioner of a running scheduler with several sub-clusters
//! (paper Section 4.4): every epoch, the models' measured request rates (and
//! their memory) go to Appendix A's MILP ([`crate::plan::partition`]) with the
//! current assignment and a move bound; a better assignment becomes model
//! moves ([`crate::node::proto::sched::SchedProto::repartition`]).
//!
//! The solve runs on its own thread, so the scheduler's event loop never
//! waits for HiGHS; the answer is picked up on a later turn of the loop.

use crate::plan::partition::{solve_milp, Instance, MilpOptions, PartModel};
use anyhow::{bail, Result};
use crossbeam_channel::{bounded, Receiver, TryRecvError};
use std::time::{Duration, Instant};

/// The most sub-clusters one scheduler runs (each is a RankThread and its
/// ModelThreads).
pub const MAX_SUBCLUSTERS: u32 = 64;

/// How the scheduler re-partitions.
#[derive(Debug, Clone)]
pub struct EpochOpts {
    /// Sub-clusters (1: no partitioning).
    pub subclusters: u32,
    /// How often the partitioner re-runs on the measured rates.
    pub every: Duration,
    /// At most this many models change sub-cluster per epoch (equation 10).
    pub max_moves: Option<usize>,
    /// The MILP's time limit per epoch.
    pub time_limit: Duration,
    /// A new assignment is taken only when it lowers the objective
    /// (ΔR + w·ΔS, fractions of the average) by at least this much: moving
    /// models costs loads, a tie or a rounding is not worth one.
    pub min_gain: f64,
}

impl Default for EpochOpts {
    fn default() -> Self {
        EpochOpts {
            subclusters: 1,
            every: Duration::from_secs(300),
            max_moves: Some(8),
            time_limit: Duration::from_secs(2),
            min_gain: 0.05,
        }
    }
}

/// An epoch's answer.
#[derive(Debug, Clone)]
pub struct Repartition {
    /// The new sub-cluster of each model, by model id.
    pub assignment: Vec<u32>,
    /// The objective before (current assignment, new rates) and after.
    pub before: f64,
    pub after: f64,
    pub rates: Vec<f64>,
}

/// The first assignment, from the workload's rates (a blocking solve: the
/// scheduler is not serving yet).
pub fn initial(models: &[PartModel], opts: &EpochOpts) -> Result<Vec<u32>> {
    if opts.subclusters <= 1 {
        return Ok(vec![0; models.len()]);
    }
    if models.len() < opts.subclusters as usize {
        bail!(
            "{} sub-clusters for {} models: each sub-cluster needs a model (use --subclusters {} or fewer)",
            opts.subclusters,
            models.len(),
            models.len()
        );
    }
    let inst = instance(models.to_vec(), opts, None);
    let sol = solve_milp(&inst, &milp(opts))?;
    Ok(sol.assignment.iter().map(|&s| s as u32).collect())
}

fn instance(models: Vec<PartModel>, opts: &EpochOpts, current: Option<&[u32]>) -> Instance {
    Instance {
        models,
        subclusters: opts.subclusters as usize,
        rate_max_rps: f64::INFINITY,
        memory_max_mb: f64::INFINITY,
        weight: 1.0,
        current: current.map(|c| c.iter().map(|&s| Some(s as usize)).collect()),
        max_moves: current.and(opts.max_moves),
    }
}

fn milp(opts: &EpochOpts) -> MilpOptions {
    MilpOptions {
        time_limit: opts.time_limit,
        // One thread: the scheduler's own threads need the cores.
        threads: Some(1),
        ..MilpOptions::default()
    }
}

/// The measured rates of one epoch, the solve in flight, the next epoch.
pub struct EpochPlanner {
    opts: EpochOpts,
    next: Instant,
    since: Instant,
    counts: Vec<u64>,
    pending: Option<Receiver<Result<Option<Repartition>>>>,
}

impl EpochPlanner {
    pub fn new(opts: EpochOpts, now: Instant) -> EpochPlanner {
        EpochPlanner {
            next: now + opts.every,
            since: now,
            counts: Vec::new(),
            pending: None,
            opts,
        }
    }

    /// Whether [`EpochPlanner::poll`] has anything to do at `now` (an epoch
    /// ended, or a solve is in flight): the event loop asks before it
    /// gathers the counts.
    pub fn wants(&self, now: Instant) -> bool {
        self.opts.subclusters > 1 && (self.pending.is_some() || now >= self.next)
    }

    /// One turn of the loop: at an epoch's end, starts a solve on the rates
    /// since the last (`counts`: tasks submitted per model so far; `models`:
    /// their memory; `homes`: the current assignment); when a solve has
    /// answered with a better assignment, returns it.
    pub fn poll(
        &mut self,
        now: Instant,
        counts: &[u64],
        models: impl FnOnce() -> Vec<PartModel>,
        homes: &[u32],
    ) -> Option<Repartition> {
        if self.opts.subclusters <= 1 {
            return None;
        }
        if let Some(rx) = &self.pending {
            match rx.try_recv() {
                Ok(r) => {
                    self.pending = None;
                    match r {
                        Ok(r) => return r,
                        Err(e) => {
                            tracing::warn!(error = %format!("{e:#}"), "scheduler: the epoch partition failed; the assignment stays")
                        }
                    }
                }
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => self.pending = None,
            }
        }
        if now < self.next {
            return None;
        }
        self.next = now + self.opts.every;
        let secs = now.duration_since(self.since).as_secs_f64().max(1e-3);
        self.since = now;
        let rates: Vec<f64> = counts
            .iter()
            .enumerate()
            .map(|(m, &c)| c.saturating_sub(self.counts.get(m).copied().unwrap_or(0)) as f64 / secs)
            .collect();
        self.counts = counts.to_vec();
        if rates.iter().sum::<f64>() <= 0.0 {
            // No load: nothing to balance.
            return None;
        }
        let mut models = models();
        for (m, r) in models.iter_mut().zip(&rates) {
            m.rate_rps = *r;
        }
        let inst = instance(models, &self.opts, Some(homes));
        let (tx, rx) = bounded(1);
        let (opts, current) = (self.opts.clone(), homes.to_vec());
        let spawned = std::thread::Builder::new()
            .name("sched-partition".into())
            .spawn(move || {
                let _ = tx.send(solve(&inst, &opts, &current, rates));
            });
        match spawned {
            Ok(_) => self.pending = Some(rx),
            Err(e) => tracing::warn!(error = %e, "scheduler: cannot start the epoch partition"),
        }
        None
    }
}

/// The epoch's solve: Some when the new assignment beats the current one by
/// `min_gain`.
fn solve(
    inst: &Instance,
    opts: &EpochOpts,
    current: &[u32],
    rates: Vec<f64>,
) -> Result<Option<Repartition>> {
    let cur: Vec<usize> = current.iter().map(|&s| s as usize).collect();
    let before = inst.evaluate(&cur).objective;
    let sol = solve_milp(inst, &milp(opts))?;
    let after = sol.eval.objective;
    let r = Repartition {
        assignment: sol.assignment.iter().map(|&s| s as u32).collect(),
        before,
        after,
        rates,
    };
    tracing::info!(
        before,
        after,
        moves = sol.eval.moves,
        "scheduler: epoch partition"
    );
    Ok((before - after >= opts.min_gain && sol.eval.moves > 0).then_some(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models(rates: &[f64]) -> Vec<PartModel> {
        rates
            .iter()
            .enumerate()
            .map(|(i, &r)| PartModel {
                name: format!("m{i}"),
                rate_rps: r,
                // Rates only (no memory to balance).
                memory_mb: 0.0,
                dynamic_memory_mb: 0.0,
            })
            .collect()
    }

    #[test]
    fn an_epoch_moves_a_model_when_the_measured_rates_are_skewed() {
        let opts = EpochOpts {
            subclusters: 2,
            every: Duration::from_secs(1),
            max_moves: Some(1),
            ..EpochOpts::default()
        };
        let first = initial(&models(&[1.0; 4]), &opts).unwrap();
        assert_eq!(first.iter().filter(|&&s| s == 0).count(), 2, "{first:?}");
        let t0 = Instant::now();
        let mut p = EpochPlanner::new(opts, t0);
        let ms = || models(&[1.0; 4]);
        assert!(p.poll(t0, &[0; 4], ms, &first).is_none(), "not yet");
        // One epoch: the models of sub-cluster 0 take 90% of the load.
        let counts: Vec<u64> = first
            .iter()
            .map(|&s| if s == 0 { 450 } else { 50 })
            .collect();
        let t1 = t0 + Duration::from_secs(1);
        assert!(p.poll(t1, &counts, ms, &first).is_none(), "the solve runs");
        let mut got = None;
        for _ in 0..200 {
            std::thread::sleep(Duration::from_millis(25));
            if let Some(r) = p.poll(t1, &counts, ms, &first) {
                got = Some(r);
                break;
            }
        }
        let r = got.expect("an answer");
        let moved = r
            .assignment
            .iter()
            .zip(&first)
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(moved, 1, "the move bound: {r:?}");
        assert!(r.after < r.before, "{r:?}");
        // Rates the new assignment balances exactly: no answer worth a move.
        let t2 = t1 + Duration::from_secs(1);
        let new = r.assignment.clone();
        let per = |s: u32| new.iter().filter(|&&x| x == s).count() as u64;
        let even: Vec<u64> = counts
            .iter()
            .zip(&new)
            .map(|(c, &s)| c + 600 / per(s))
            .collect();
        assert!(p.poll(t2, &even, ms, &new).is_none());
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(25));
            assert!(p.poll(t2, &even, ms, &new).is_none(), "no move on balance");
        }
    }

    #[test]
    fn more_subclusters_than_models_is_an_error() {
        let opts = EpochOpts {
            subclusters: 3,
            ..EpochOpts::default()
        };
        let e = initial(&models(&[1.0, 2.0]), &opts).unwrap_err();
        assert!(e.to_string().contains("--subclusters 2"), "{e}");
    }
}
