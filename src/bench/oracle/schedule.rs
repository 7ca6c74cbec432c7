//! The offline reference's problem (every arrival of a run, the models'
//! timings, the GPUs) and its schedules, with the check that a schedule is one
//! a real cluster could run.

use std::fmt;

/// One model's timings in nanoseconds.
#[derive(Debug, Clone)]
pub struct ModelTiming {
    /// `lat[b]`: l(b) for b in 1..=max batch (`lat[0]` unused).
    pub lat: Vec<i64>,
    /// `delay[b]`: the network's delay before a batch of b can start.
    pub delay: Vec<i64>,
    pub slo: i64,
    /// The response margin: a batch must end this long before its head's
    /// deadline.
    pub resp: i64,
}

impl ModelTiming {
    pub fn max_batch(&self) -> usize {
        self.lat.len() - 1
    }

    /// The least GPU time a request can cost: l(b)/b at the largest batch that
    /// fits the SLO (the smallest batch's if none does).
    pub fn least_per_request(&self) -> f64 {
        (1..=self.max_batch())
            .filter(|&b| self.delay[b] + self.lat[b] + self.resp <= self.slo)
            .map(|b| self.lat[b] as f64 / b as f64)
            .fold(self.lat[1] as f64, f64::min)
    }

    /// The latest end of a batch whose head arrived at `head`.
    pub fn due(&self, head: i64) -> i64 {
        head + self.slo - self.resp
    }
}

/// What the search schedules: the arrivals of every model in time order and
/// the GPUs they share.
#[derive(Debug, Clone)]
pub struct Problem {
    pub models: Vec<ModelTiming>,
    pub gpus: usize,
    /// (model, arrival in ns), sorted by arrival.
    pub arr: Vec<(u16, i64)>,
}

/// A batch as run: its requests (indices into [`Problem::arr`], one model's),
/// the GPU it ran on and when it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub model: u16,
    pub reqs: Vec<u32>,
    pub gpu: u16,
    pub start: i64,
}

/// A schedule of every request: each is in one batch or dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    pub batches: Vec<Batch>,
    pub dropped: Vec<u32>,
}

/// Why a schedule could not run as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Infeasible {
    /// A request in no batch and not dropped, or in two places.
    NotOnce(u32),
    /// A request index past the trace.
    NoSuchRequest(u32),
    /// Batch `usize` holds no request, more than its model's largest batch,
    /// or a request of another model.
    BadBatch(usize),
    /// Batch `usize` runs on a GPU that does not exist.
    NoSuchGpu(usize),
    /// Batch `usize` starts before its last request (plus the network's
    /// delay) is there.
    EarlyStart(usize),
    /// Batch `usize` ends after its head's deadline (less the response margin).
    Late(usize),
    /// Batches `usize` and `usize` overlap on one GPU.
    Overlap(usize, usize),
}

impl fmt::Display for Infeasible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Infeasible::NotOnce(r) => write!(f, "request {r} is not scheduled exactly once"),
            Infeasible::NoSuchRequest(r) => write!(f, "request {r} is past the trace"),
            Infeasible::BadBatch(b) => write!(f, "batch {b} is empty, too large or mixes models"),
            Infeasible::NoSuchGpu(b) => write!(f, "batch {b} runs on no GPU of the cluster"),
            Infeasible::EarlyStart(b) => {
                write!(f, "batch {b} starts before its inputs are there")
            }
            Infeasible::Late(b) => write!(f, "batch {b} ends after its head's deadline"),
            Infeasible::Overlap(a, b) => write!(f, "batches {a} and {b} overlap on one GPU"),
        }
    }
}

impl std::error::Error for Infeasible {}

impl Problem {
    /// The end of batch `b` of `s` (its start plus l(size)).
    pub fn end(&self, b: &Batch) -> i64 {
        b.start + self.models[b.model as usize].lat[b.reqs.len()]
    }

    /// Checks that `s` is a schedule a cluster can run: every request once
    /// (in one batch or dropped), every batch of one model and of a size its
    /// profile has, started once its last input is there, ended by its head's
    /// deadline, and no two batches at once on one GPU.
    pub fn verify(&self, s: &Schedule) -> Result<(), Infeasible> {
        let n = self.arr.len();
        let mut seen = vec![false; n];
        let mut mark = |r: u32| -> Result<(), Infeasible> {
            let slot = seen
                .get_mut(r as usize)
                .ok_or(Infeasible::NoSuchRequest(r))?;
            if *slot {
                return Err(Infeasible::NotOnce(r));
            }
            *slot = true;
            Ok(())
        };
        for &r in &s.dropped {
            mark(r)?;
        }
        let mut per_gpu: Vec<Vec<(i64, i64, usize)>> = vec![Vec::new(); self.gpus];
        for (k, b) in s.batches.iter().enumerate() {
            let Some(m) = self.models.get(b.model as usize) else {
                return Err(Infeasible::BadBatch(k));
            };
            if b.reqs.is_empty() || b.reqs.len() > m.max_batch() {
                return Err(Infeasible::BadBatch(k));
            }
            let (mut head, mut last) = (i64::MAX, i64::MIN);
            for &r in &b.reqs {
                mark(r)?;
                let (model, t) = self.arr[r as usize];
                if model != b.model {
                    return Err(Infeasible::BadBatch(k));
                }
                head = head.min(t);
                last = last.max(t);
            }
            if b.start < last + m.delay[b.reqs.len()] {
                return Err(Infeasible::EarlyStart(k));
            }
            let end = self.end(b);
            if end > m.due(head) {
                return Err(Infeasible::Late(k));
            }
            per_gpu
                .get_mut(b.gpu as usize)
                .ok_or(Infeasible::NoSuchGpu(k))?
                .push((b.start, end, k));
        }
        if let Some(r) = seen.iter().position(|&x| !x) {
            return Err(Infeasible::NotOnce(r as u32));
        }
        for g in &mut per_gpu {
            g.sort_unstable();
            for w in g.windows(2) {
                if w[1].0 < w[0].1 {
                    return Err(Infeasible::Overlap(w[0].2, w[1].2));
                }
            }
        }
        Ok(())
    }

    /// The fewest drops of any schedule, by exhaustive search: every split of
    /// the requests into drops and batches (any subsets of one model's
    /// requests), every order of the batches and every GPU for each. Only for
    /// tiny problems (it is exponential); the beam search is checked against
    /// it.
    #[cfg(test)]
    pub fn brute_force_min_drops(&self) -> u32 {
        let n = self.arr.len();
        assert!(n <= 8, "brute force is for tiny problems");
        let mut best = n as u32;
        // Each request's batch: None = dropped, Some(k) = batch k (batches
        // numbered in order of their first request).
        let mut assign: Vec<Option<usize>> = vec![None; n];
        self.brute_rec(0, 0, &mut assign, &mut best);
        best
    }

    #[cfg(test)]
    fn brute_rec(&self, i: usize, nb: usize, assign: &mut Vec<Option<usize>>, best: &mut u32) {
        let drops = assign[..i].iter().filter(|a| a.is_none()).count() as u32;
        if drops >= *best {
            return;
        }
        if i == assign.len() {
            let mut batches: Vec<Vec<u32>> = vec![Vec::new(); nb];
            for (r, a) in assign.iter().enumerate() {
                if let Some(k) = a {
                    batches[*k].push(r as u32);
                }
            }
            if self.some_order_fits(&batches) {
                *best = drops;
            }
            return;
        }
        // Into a batch first (good schedules found early prune the rest),
        // dropped last.
        for k in 0..=nb {
            // Only batches of this request's model.
            if k < nb {
                let first = assign[..i].iter().position(|a| *a == Some(k)).unwrap();
                if self.arr[first].0 != self.arr[i].0 {
                    continue;
                }
            }
            assign[i] = Some(k);
            self.brute_rec(i + 1, nb.max(k + 1), assign, best);
        }
        assign[i] = None;
        self.brute_rec(i + 1, nb, assign, best);
    }

    /// Whether the batches can all run in time in some order on some GPUs
    /// (each as early as its inputs and its GPU allow): a depth-first search
    /// over which batch goes next and on which GPU.
    #[cfg(test)]
    fn some_order_fits(&self, batches: &[Vec<u32>]) -> bool {
        let spans: Option<Vec<(i64, i64, i64)>> = batches
            .iter()
            .map(|b| {
                let m = &self.models[self.arr[b[0] as usize].0 as usize];
                if b.len() > m.max_batch() {
                    return None;
                }
                let last = b.iter().map(|&r| self.arr[r as usize].1).max().unwrap();
                let head = b.iter().map(|&r| self.arr[r as usize].1).min().unwrap();
                Some((last + m.delay[b.len()], m.lat[b.len()], m.due(head)))
            })
            .collect();
        let Some(spans) = spans else {
            return false;
        };
        fn dfs(spans: &[(i64, i64, i64)], placed: &mut [bool], free: &mut [i64]) -> bool {
            if placed.iter().all(|&p| p) {
                return true;
            }
            for k in 0..spans.len() {
                if placed[k] {
                    continue;
                }
                let (ready, lat, due) = spans[k];
                for g in 0..free.len() {
                    // GPUs free at the same time are alike.
                    if free[..g].contains(&free[g]) {
                        continue;
                    }
                    let end = ready.max(free[g]) + lat;
                    if end > due {
                        continue;
                    }
                    let was = free[g];
                    free[g] = end;
                    placed[k] = true;
                    let ok = dfs(spans, placed, free);
                    placed[k] = false;
                    free[g] = was;
                    if ok {
                        return true;
                    }
                }
            }
            false
        }
        dfs(
            &spans,
            &mut vec![false; spans.len()],
            &mut vec![i64::MIN / 4; self.gpus],
        )
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Two models on one GPU: l(b) = 2 + b ms, no network delay, SLO 10 ms.
    pub fn tiny(arr: &[(u16, i64)], gpus: usize) -> Problem {
        let ms = 1_000_000;
        let t = ModelTiming {
            lat: (0..=4).map(|b| (2 + b) * ms).collect(),
            delay: vec![0; 5],
            slo: 10 * ms,
            resp: 0,
        };
        Problem {
            models: vec![t.clone(), t],
            gpus,
            arr: arr.iter().map(|&(m, t)| (m, t * ms)).collect(),
        }
    }

    fn batch(model: u16, reqs: &[u32], gpu: u16, start_ms: i64) -> Batch {
        Batch {
            model,
            reqs: reqs.to_vec(),
            gpu,
            start: start_ms * 1_000_000,
        }
    }

    #[test]
    fn verify_accepts_a_feasible_schedule_and_names_each_fault() {
        // Model 0 at 0 and 1 ms, model 1 at 2 ms.
        let p = tiny(&[(0, 0), (0, 1), (1, 2)], 1);
        let ok = Schedule {
            // [1, 5) then [5, 8): both by their deadlines (10 and 12 ms).
            batches: vec![batch(0, &[0, 1], 0, 1), batch(1, &[2], 0, 5)],
            dropped: vec![],
        };
        assert_eq!(p.verify(&ok), Ok(()));
        let with = |f: &dyn Fn(&mut Schedule)| {
            let mut s = ok.clone();
            f(&mut s);
            p.verify(&s)
        };
        // Starting before the second request is there.
        assert_eq!(
            with(&|s| s.batches[0].start = 0),
            Err(Infeasible::EarlyStart(0))
        );
        // Both at 4 ms on one GPU: they overlap.
        assert_eq!(
            with(&|s| {
                s.batches[0].start = 4_000_000;
                s.batches[1].start = 4_000_000
            }),
            Err(Infeasible::Overlap(1, 0))
        );
        // The same on two GPUs is fine, on a third that is not there is not.
        let p2 = tiny(&[(0, 0), (0, 1), (1, 2)], 2);
        let mut s = ok.clone();
        s.batches[1].gpu = 1;
        s.batches[1].start = 2_000_000;
        assert_eq!(p2.verify(&s), Ok(()));
        s.batches[1].gpu = 2;
        assert_eq!(p2.verify(&s), Err(Infeasible::NoSuchGpu(1)));
        // Ending past the head's deadline (10 ms): [7, 11).
        assert_eq!(
            with(&|s| s.batches[0].start = 7_000_000),
            Err(Infeasible::Late(0))
        );
        // A request left out, or in two places.
        assert_eq!(
            with(&|s| s.batches[1].reqs.clear()),
            Err(Infeasible::BadBatch(1))
        );
        assert_eq!(
            with(&|s| {
                s.batches.pop();
            }),
            Err(Infeasible::NotOnce(2))
        );
        assert_eq!(with(&|s| s.dropped.push(0)), Err(Infeasible::NotOnce(0)));
        assert_eq!(
            with(&|s| s.dropped.push(9)),
            Err(Infeasible::NoSuchRequest(9))
        );
        // A batch mixing models, and one above the largest batch.
        assert_eq!(
            with(&|s| {
                s.batches.pop();
                s.batches[0].reqs.push(2)
            }),
            Err(Infeasible::BadBatch(0))
        );
        let p5 = tiny(&[(0, 0), (0, 0), (0, 0), (0, 0), (0, 0)], 1);
        let five = Schedule {
            batches: vec![batch(0, &[0, 1, 2, 3, 4], 0, 0)],
            dropped: vec![],
        };
        assert_eq!(p5.verify(&five), Err(Infeasible::BadBatch(0)));
    }

    #[test]
    fn brute_force_finds_the_fewest_drops() {
        // Three requests at once of one model fit one batch: no drop.
        assert_eq!(
            tiny(&[(0, 0), (0, 0), (0, 0)], 1).brute_force_min_drops(),
            0
        );
        // Five of one model at once: four fit ([0, 6)), the fifth alone would
        // end at 9 ms after them, which still fits: none dropped. Two models,
        // four each at once on one GPU: [0, 6) then [6, 12) is late for the
        // second, and a split does no better than dropping one model's batch
        // down to what fits (l(b) = 2 + b: a second batch of b ends at
        // 8 + b <= 10 for b <= 2): two dropped.
        assert_eq!(
            tiny(&[(0, 0), (0, 0), (0, 0), (0, 0), (0, 0)], 1).brute_force_min_drops(),
            0
        );
        let eight: Vec<(u16, i64)> = (0..8).map(|i| ((i / 4) as u16, 0)).collect();
        assert_eq!(tiny(&eight, 1).brute_force_min_drops(), 2);
        assert_eq!(tiny(&eight, 2).brute_force_min_drops(), 0);
    }
}
