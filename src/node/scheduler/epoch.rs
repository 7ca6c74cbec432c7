//! The epoch partitioner of a running scheduler with several sub-clusters
//! (paper Section 4.4): every epoch, the models' measured request rates (and
//! their memory) go to Appendix A's MILP ([`crate::plan::partition`]) with the
//! current assignment and a move bound; a better assignment becomes model
//! moves ([`crate::node::proto::sched::SchedProto::repartition`]).
//!
//! The solve runs on its own thread, so the scheduler's event loop never
//! waits for HiGHS; the answer is picked up on a later turn of the loop.

use crate::plan::partition::{solve_milp, Instance, MilpOptions, PartModel};
use anyhow::{bail, Context, Result};
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
    /// The GPU type of each sub-cluster (`--subcluster-types`; empty:
    /// untyped). Typed, the partition is one per type: a type's models
    /// over that type's sub-clusters, each balanced on its own.
    pub types: Vec<String>,
}

impl Default for EpochOpts {
    fn default() -> Self {
        EpochOpts {
            subclusters: 1,
            every: Duration::from_secs(300),
            max_moves: Some(8),
            time_limit: Duration::from_secs(2),
            min_gain: 0.05,
            types: Vec::new(),
        }
    }
}

/// One type's share of a typed partition: its models and its sub-clusters.
#[derive(Debug, Clone, PartialEq)]
struct Group {
    models: Vec<usize>,
    subs: Vec<u32>,
}

/// The groups of sub-clusters by type (one group of everything, untyped),
/// with the model of each index placed by `type_of` (an index into
/// `opts.types`' distinct names).
fn groups(
    opts: &EpochOpts,
    n_models: usize,
    type_of: impl Fn(usize) -> Result<usize>,
) -> Result<Vec<Group>> {
    use crate::node::proto::subclusters::same_gpu_type;
    if opts.types.is_empty() {
        return Ok(vec![Group {
            models: (0..n_models).collect(),
            subs: (0..opts.subclusters).collect(),
        }]);
    }
    let mut out: Vec<Group> = Vec::new();
    let mut first: Vec<usize> = Vec::new();
    for (s, t) in opts.types.iter().enumerate() {
        match first.iter().position(|&f| same_gpu_type(&opts.types[f], t)) {
            Some(g) => out[g].subs.push(s as u32),
            None => {
                first.push(s);
                out.push(Group {
                    models: Vec::new(),
                    subs: vec![s as u32],
                });
            }
        }
    }
    for m in 0..n_models {
        let t = type_of(m)?;
        let g = first
            .iter()
            .position(|&f| same_gpu_type(&opts.types[f], &opts.types[t]))
            .expect("a listed type");
        out[g].models.push(m);
    }
    Ok(out)
}

/// Where each model's type sits in `opts.types` for the first assignment:
/// its declared type, or the only type there is.
fn declared_types(
    models: &[PartModel],
    model_types: &[Option<String>],
    opts: &EpochOpts,
) -> impl Fn(usize) -> Result<usize> {
    use crate::node::proto::subclusters::same_gpu_type;
    let types = opts.types.clone();
    let names: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
    let declared: Vec<Option<String>> = (0..models.len())
        .map(|m| model_types.get(m).cloned().flatten())
        .collect();
    move |m| {
        let distinct = types
            .iter()
            .enumerate()
            .filter(|(i, t)| !types[..*i].iter().any(|u| same_gpu_type(u, t)))
            .count();
        match &declared[m] {
            Some(t) => types
                .iter()
                .position(|u| same_gpu_type(u, t))
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "model {:?} runs on GPU type {t:?}, but no sub-cluster has it (--subcluster-types {})",
                        names[m],
                        types.join(",")
                    )
                }),
            None if distinct == 1 => Ok(0),
            None => bail!(
                "model {:?} names no gpu_type, and the sub-clusters are of {distinct} types (--subcluster-types {}): give each model a gpu_type in the workload",
                names[m],
                types.join(",")
            ),
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
/// scheduler is not serving yet). `model_types`: each model's GPU type where
/// it names one (used with typed sub-clusters).
pub fn initial(
    models: &[PartModel],
    model_types: &[Option<String>],
    opts: &EpochOpts,
) -> Result<Vec<u32>> {
    if !opts.types.is_empty() && opts.types.len() != opts.subclusters as usize {
        bail!(
            "--subcluster-types names {} types for --subclusters {}: name one per sub-cluster",
            opts.types.len(),
            opts.subclusters
        );
    }
    if opts.subclusters <= 1 {
        if let Some(t) = opts.types.first() {
            // One sub-cluster: every model must run on its type.
            let type_of = declared_types(models, model_types, opts);
            for m in 0..models.len() {
                type_of(m).with_context(|| format!("the only sub-cluster is of type {t:?}"))?;
            }
        }
        return Ok(vec![0; models.len()]);
    }
    let groups = groups(
        opts,
        models.len(),
        declared_types(models, model_types, opts),
    )?;
    let mut out = vec![0u32; models.len()];
    for g in &groups {
        if g.models.len() < g.subs.len() {
            let what = match opts.types.get(g.subs[0] as usize) {
                Some(t) => format!("GPU type {t:?}"),
                None => "the cluster".to_string(),
            };
            bail!(
                "{} sub-clusters of {what} for {} models: each sub-cluster needs a model (use --subclusters {} or fewer)",
                g.subs.len(),
                g.models.len(),
                opts.subclusters as usize - (g.subs.len() - g.models.len())
            );
        }
        let (a, _) = solve_group(models, g, opts, None)?;
        for (&m, s) in g.models.iter().zip(a) {
            out[m] = s;
        }
    }
    Ok(out)
}

/// One group's instance: its models over its sub-clusters (local indices),
/// with the current assignment mapped to them.
fn instance(
    models: &[PartModel],
    g: &Group,
    current: Option<&[u32]>,
    max_moves: Option<usize>,
) -> Instance {
    let local = |s: u32| g.subs.iter().position(|&x| x == s);
    Instance {
        models: g.models.iter().map(|&m| models[m].clone()).collect(),
        subclusters: g.subs.len(),
        rate_max_rps: f64::INFINITY,
        memory_max_mb: f64::INFINITY,
        weight: 1.0,
        current: current.map(|c| g.models.iter().map(|&m| local(c[m])).collect()),
        max_moves: current.and(max_moves),
    }
}

/// A group's objective before and after a solve, and the moves it makes.
type GroupGain = (f64, f64, usize);

/// Solves one group: its models' sub-clusters (global ids, in the group's
/// order) and, with a current assignment, the objective before and after.
fn solve_group(
    models: &[PartModel],
    g: &Group,
    opts: &EpochOpts,
    current: Option<(&[u32], Option<usize>)>,
) -> Result<(Vec<u32>, Option<GroupGain>)> {
    if g.models.is_empty() {
        return Ok((Vec::new(), None));
    }
    if g.subs.len() == 1 {
        let before_after = current.map(|_| (0.0, 0.0, 0));
        return Ok((vec![g.subs[0]; g.models.len()], before_after));
    }
    let inst = instance(models, g, current.map(|c| c.0), current.and_then(|c| c.1));
    let before = inst.current.as_ref().and_then(|c| {
        let cur: Option<Vec<usize>> = c.iter().copied().collect();
        cur.map(|cur| inst.evaluate(&cur).objective)
    });
    let sol = solve_milp(&inst, &milp(opts))?;
    let a = sol.assignment.iter().map(|&s| g.subs[s]).collect();
    let stats = current.map(|_| {
        (
            before.unwrap_or(f64::INFINITY),
            sol.eval.objective,
            sol.eval.moves,
        )
    });
    Ok((a, stats))
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
        let (tx, rx) = bounded(1);
        let (opts, current) = (self.opts.clone(), homes.to_vec());
        let spawned = std::thread::Builder::new()
            .name("sched-partition".into())
            .spawn(move || {
                let _ = tx.send(solve(&models, &opts, &current, rates));
            });
        match spawned {
            Ok(_) => self.pending = Some(rx),
            Err(e) => tracing::warn!(error = %e, "scheduler: cannot start the epoch partition"),
        }
        None
    }
}

/// The epoch's solve: Some when the new assignment beats the current one by
/// `min_gain`. Typed, each type's models (those whose home is of that type)
/// are balanced over that type's sub-clusters, the move bound shared in
/// turn; the objective is the sum over the types.
fn solve(
    models: &[PartModel],
    opts: &EpochOpts,
    current: &[u32],
    rates: Vec<f64>,
) -> Result<Option<Repartition>> {
    use crate::node::proto::subclusters::same_gpu_type;
    let home_type = |m: usize| -> Result<usize> {
        let t = opts
            .types
            .get(current[m] as usize)
            .context("a home outside the typed sub-clusters")?;
        Ok(opts
            .types
            .iter()
            .position(|u| same_gpu_type(u, t))
            .expect("its own type"))
    };
    let groups = groups(opts, models.len(), home_type)?;
    let mut assignment = current.to_vec();
    let (mut before, mut after, mut moves) = (0.0, 0.0, 0usize);
    for g in &groups {
        let left = opts.max_moves.map(|c| c.saturating_sub(moves));
        let (a, stats) = solve_group(models, g, opts, Some((current, left)))?;
        let Some((b, af, mv)) = stats else { continue };
        before += b;
        after += af;
        moves += mv;
        for (&m, s) in g.models.iter().zip(a) {
            assignment[m] = s;
        }
    }
    let r = Repartition {
        assignment,
        before,
        after,
        rates,
    };
    tracing::info!(before, after, moves, "scheduler: epoch partition");
    Ok((before - after >= opts.min_gain && moves > 0).then_some(r))
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
        let first = initial(&models(&[1.0; 4]), &[], &opts).unwrap();
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

    /// Typed sub-clusters: each model lands on a sub-cluster of its type, each
    /// type's models balanced over its own sub-clusters; an epoch keeps every
    /// model within its home's type.
    #[test]
    fn typed_subclusters_are_partitioned_per_type() {
        let opts = EpochOpts {
            subclusters: 3,
            types: vec!["A100".into(), "T4".into(), "a100".into()],
            max_moves: Some(4),
            ..EpochOpts::default()
        };
        let ty = |t: &str| Some(t.to_string());
        let types = vec![
            ty("A100"),
            ty("T4"),
            ty("A100"),
            ty("T4"),
            ty("A100"),
            ty("A100"),
        ];
        let ms = models(&[4.0, 1.0, 3.0, 1.0, 2.0, 1.0]);
        let first = initial(&ms, &types, &opts).unwrap();
        for (m, &s) in first.iter().enumerate() {
            let want_t4 = types[m].as_deref() == Some("T4");
            assert_eq!(s == 1, want_t4, "model {m} on sub-cluster {s}: {first:?}");
        }
        // The A100 models (rates 4, 3, 2, 1) split 5/5 over sub-clusters 0 and 2.
        let load = |s: u32| -> f64 {
            first
                .iter()
                .zip(&ms)
                .filter(|(&x, _)| x == s)
                .map(|(_, m)| m.rate_rps)
                .sum()
        };
        assert_eq!((load(0), load(2)), (5.0, 5.0), "{first:?}");
        // Skewed measured rates: the answer rebalances within the types.
        let cur = vec![0, 1, 0, 1, 2, 2];
        let r = solve(&ms, &opts, &cur, vec![1.0; 6])
            .unwrap()
            .expect("a better one");
        for (m, (&a, &c)) in r.assignment.iter().zip(&cur).enumerate() {
            assert_eq!(a == 1, c == 1, "model {m} changed type: {r:?}");
        }
        // Errors name the model and the flag.
        let e = initial(&ms, &[ty("H100")], &opts).unwrap_err().to_string();
        assert!(
            e.contains("\"m0\"") && e.contains("--subcluster-types"),
            "{e}"
        );
        let e = initial(&ms, &[], &opts).unwrap_err().to_string();
        assert!(e.contains("names no gpu_type"), "{e}");
        let e = initial(&ms[..2], &types[..2], &opts)
            .unwrap_err()
            .to_string();
        assert!(e.contains("each sub-cluster needs a model"), "{e}");
        let one = EpochOpts {
            subclusters: 1,
            types: vec!["T4".into()],
            ..EpochOpts::default()
        };
        assert_eq!(initial(&ms[..2], &[], &one).unwrap(), vec![0, 0]);
        assert!(initial(&ms[..2], &[ty("A100")], &one).is_err());
    }

    #[test]
    fn more_subclusters_than_models_is_an_error() {
        let opts = EpochOpts {
            subclusters: 3,
            ..EpochOpts::default()
        };
        let e = initial(&models(&[1.0, 2.0]), &[], &opts).unwrap_err();
        assert!(e.to_string().contains("--subclusters 2"), "{e}");
    }
}
