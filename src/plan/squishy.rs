//! Greedy squishy bin packing: Nexus (SOSP'19) Section 6.1, Algorithm 1.
//!
//! A *session* is one model at one latency SLO `L` with request rate `R`; `l(b)` is
//! its batch latency. A GPU node runs its sessions round-robin, one batch each per
//! duty cycle `d`, so a request waits at most `d` and then its batch runs: the
//! worst-case latency is `d + l(b)`.
//!
//! 1. SCHEDULESATURATE: `B = max b` with `2 l(B) <= L`, `T = B / l(B)`. The session
//!    gets `n = floor(R / T)` dedicated nodes (batch `B`, duty `l(B)`, occupancy 1).
//!    The residual `r = R - n T` is scheduled in step 2.
//! 2. SCHEDULERESIDUE: each residual load first gets a node of its own, with the
//!    paper's `b = max b` where `l(b) + b / r <= L`, `d = b / r` and `occ = l(b) / d`.
//!    Going by decreasing occupancy, each joins the existing node whose merge gives
//!    the highest occupancy (best fit), or stays on a node of its own.
//! 3. MERGENODES (Figure 7): the merged duty cycle is `d = min(d1, d2)`. Sessions on
//!    the longer-cycle node are re-batched to `b' = ceil(d * r)` (at least 1). We round
//!    up so each session still gets its rate (`b' / d >= r`). The merge is accepted if
//!    `d + l(b') <= L` for every session and `sum l(b') <= d`. The merged occupancy is
//!    `sum l / d`, taken from the batches actually chosen.
//!
//! Conventions, all chosen to keep plans valid:
//! * Duty cycles are whole ns, rounded down (`floor(b * 1e9 / r)`): a shorter cycle
//!   only raises the served rate and lowers latency.
//! * The paper's residue `b` may not exist (`l(1) + 1/r > L` at tiny rates), or may
//!   overload its node (`l(b) > b / r`). We then take the `b <= B` with the lowest
//!   occupancy whose `d = min(b / r, L - l(b))` is at least `l(b)`. For a tiny rate this
//!   is batch 1 with `d = L - l(1)`: the node just runs more often. `b = B` always
//!   qualifies, since `r < T`.
//! * [`SquishyError::Infeasible`] iff a session with positive rate has `2 l(1) > L`.
//!   No node can serve it then, because `l(b) <= d` and `d + l(b) <= L` imply
//!   `2 l(b) <= L`. Malformed input (an empty, non-positive or decreasing profile, a
//!   non-positive SLO, a negative/NaN/infinite rate) is reported the same way.
//!   Rate-0 sessions are skipped and get no node. A residual below `1e-12 R` after
//!   `n >= 1` saturated nodes is floating-point noise and is dropped.

/// A session: one model at one latency SLO with an expected request rate.
#[derive(Debug, Clone)]
pub struct Session {
    /// Model index.
    pub model: u32,
    /// Latency SLO in nanoseconds.
    pub slo_ns: i64,
    /// Expected request rate (requests per second).
    pub rate_rps: f64,
    /// batch latency in ns for batch sizes 1..=latency_ns.len(); latency_ns[b-1] = l(b);
    /// non-decreasing.
    pub latency_ns: Vec<i64>,
}

/// One session's share of a GPU node.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// Model index of the session.
    pub model: u32,
    /// Batch size executed once per duty cycle.
    pub batch: u32,
    /// Request rate (requests per second) routed to this node for the session.
    pub rate_rps: f64,
}

/// One GPU's plan: sessions executed round-robin within a duty cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePlan {
    /// Sessions on this GPU, in round-robin order.
    pub sessions: Vec<Assignment>,
    /// Duty cycle in nanoseconds; `sum l(batch) <= duty_cycle_ns`.
    pub duty_cycle_ns: i64,
    /// Busy fraction of the duty cycle: `sum l(batch) / duty_cycle_ns` (in `(0, 1]`).
    pub occupancy: f64,
}

/// Why no plan could be produced.
#[derive(Debug, Clone, PartialEq)]
pub enum SquishyError {
    /// The session cannot meet its SLO on any node (`2 l(1) > SLO`) or is malformed.
    Infeasible {
        /// Model index of the offending session.
        model: u32,
        /// Human-readable cause.
        reason: String,
    },
}

impl std::fmt::Display for SquishyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let SquishyError::Infeasible { model, reason } = self;
        write!(f, "model {model} infeasible: {reason}")
    }
}

impl std::error::Error for SquishyError {}

/// A session's share of a residual node: input index, batch size, rate (r/s).
#[derive(Debug, Clone, Copy)]
struct Slot(usize, usize, f64);

/// A residual node: its slots, duty cycle and busy time per cycle (both ns).
#[derive(Debug, Clone)]
struct Node {
    slots: Vec<Slot>,
    duty: i64,
    busy: i64,
}

impl Node {
    fn occ(&self) -> f64 {
        self.busy as f64 / self.duty as f64
    }
}

fn lat(s: &Session, b: usize) -> i64 {
    s.latency_ns[b - 1]
}

fn err(s: &Session, reason: String) -> SquishyError {
    let model = s.model;
    SquishyError::Infeasible { model, reason }
}

/// Longest whole-ns cycle in which `b` requests arrive at rate `r`: `floor(b * 1e9 / r)`.
fn gather_ns(b: usize, r: f64) -> i64 {
    (b as f64 * 1e9 / r).floor() as i64 // saturating cast
}

fn validate(s: &Session) -> Result<(), SquishyError> {
    let l = &s.latency_ns;
    if !s.rate_rps.is_finite() || s.rate_rps < 0.0 || s.slo_ns <= 0 {
        let why = format!("bad rate {} or SLO {}", s.rate_rps, s.slo_ns);
        return Err(err(s, why));
    }
    if l.first().is_none_or(|&l1| l1 <= 0) || l.windows(2).any(|w| w[1] < w[0]) {
        let why = "profile must be non-empty, positive and non-decreasing";
        return Err(err(s, why.into()));
    }
    if l[0].saturating_mul(2) > s.slo_ns {
        let why = format!("2*l(1) = 2*{} ns > SLO {} ns", l[0], s.slo_ns);
        return Err(err(s, why));
    }
    Ok(())
}

/// SCHEDULERESIDUE lines 13-15, with the fallback described in the module docs.
fn residue_node(s: &Session, idx: usize, r: f64) -> Result<Node, SquishyError> {
    let fits = |b: usize| lat(s, b).saturating_add(gather_ns(b, r)) <= s.slo_ns;
    let occ = |(b, d): (usize, i64)| lat(s, b) as f64 / d as f64;
    let (batch, duty) = match (1..=s.latency_ns.len()).filter(|&b| fits(b)).max() {
        Some(b) if lat(s, b) <= gather_ns(b, r) => (b, gather_ns(b, r)),
        _ => (1..=s.latency_ns.len())
            .filter(|&b| lat(s, b).saturating_mul(2) <= s.slo_ns)
            .map(|b| (b, gather_ns(b, r).min(s.slo_ns - lat(s, b))))
            .filter(|&(b, d)| lat(s, b) <= d)
            .reduce(|best, c| if occ(c) < occ(best) { c } else { best })
            .ok_or_else(|| err(s, format!("no batch serves residual {r} r/s")))?,
    };
    let (slots, busy) = (vec![Slot(idx, batch, r)], lat(s, batch));
    Ok(Node { slots, duty, busy })
}

/// MERGENODES (Figure 7): `a`'s sessions come first; `None` if the merge is infeasible.
fn merge_nodes(sessions: &[Session], a: &Node, b: &Node) -> Option<Node> {
    let duty = a.duty.min(b.duty);
    let (mut slots, mut busy) = (Vec::with_capacity(a.slots.len() + b.slots.len()), 0i64);
    for node in [a, b] {
        for &Slot(idx, batch, rate) in &node.slots {
            let s = &sessions[idx];
            let batch = if node.duty == duty {
                batch
            } else {
                (duty as f64 * rate / 1e9).ceil().max(1.0) as usize
            };
            if batch > s.latency_ns.len() || duty.saturating_add(lat(s, batch)) > s.slo_ns {
                return None;
            }
            busy = busy.saturating_add(lat(s, batch));
            slots.push(Slot(idx, batch, rate));
        }
    }
    (busy <= duty).then_some(Node { slots, duty, busy })
}

fn assignment(model: u32, batch: usize, rate_rps: f64) -> Assignment {
    let batch = u32::try_from(batch).unwrap_or(u32::MAX);
    Assignment {
        model,
        batch,
        rate_rps,
    }
}

/// Returns the node plans (saturated nodes first). Errors if a session cannot meet its SLO
/// even with batch 1.
///
/// Precisely: [`SquishyError::Infeasible`] iff some session with a positive rate has
/// `2 * l(1) > slo_ns` (or is malformed, see module docs). `l(1) + 1/r > slo` alone is
/// not an error: the residue node then shortens its duty cycle to `slo - l(1)`.
pub fn squishy_bin_packing(sessions: &[Session]) -> Result<Vec<NodePlan>, SquishyError> {
    let (mut plan, mut residues) = (Vec::new(), Vec::new());
    // SCHEDULESATURATE
    for (idx, s) in sessions.iter().enumerate() {
        if s.rate_rps == 0.0 {
            continue;
        }
        validate(s)?;
        let feasible = |b: &usize| lat(s, *b).saturating_mul(2) <= s.slo_ns;
        let big_b = (1..=s.latency_ns.len()).rfind(feasible).unwrap_or(1);
        let (l_big, t) = (lat(s, big_b), big_b as f64 * 1e9 / lat(s, big_b) as f64);
        let n = (s.rate_rps / t).floor() as usize;
        plan.extend((0..n).map(|_| NodePlan {
            sessions: vec![assignment(s.model, big_b, t)],
            duty_cycle_ns: l_big,
            occupancy: 1.0,
        }));
        let r = s.rate_rps - n as f64 * t;
        if r > 0.0 && !(n > 0 && r <= 1e-12 * s.rate_rps) {
            residues.push(residue_node(s, idx, r)?);
        }
    }
    // SCHEDULERESIDUE: best-fit decreasing on occupancy.
    residues.sort_by(|a, b| b.occ().total_cmp(&a.occ()));
    let mut nodes: Vec<Node> = Vec::new();
    for res in residues {
        let best = (0..nodes.len())
            .filter_map(|i| merge_nodes(sessions, &nodes[i], &res).map(|m| (i, m)))
            .reduce(|best, c| if c.1.occ() > best.1.occ() { c } else { best });
        match best {
            Some((i, merged)) => nodes[i] = merged,
            None => nodes.push(res),
        }
    }
    plan.extend(nodes.iter().map(|node| {
        NodePlan {
            sessions: (node.slots.iter())
                .map(|&Slot(i, b, r)| assignment(sessions[i].model, b, r))
                .collect(),
            duty_cycle_ns: node.duty,
            occupancy: node.occ(),
        }
    }));
    Ok(plan)
}

/// Number of GPUs the plan needs.
pub fn gpus_needed(plan: &[NodePlan]) -> usize {
    plan.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    /// A session whose profile covers batches 1..=64.
    fn sess(model: u32, slo_ms: i64, rate_rps: f64, f: impl Fn(i64) -> i64) -> Session {
        let (slo_ns, latency_ns) = (slo_ms * MS, (1..=64).map(f).collect());
        Session {
            model,
            slo_ns,
            rate_rps,
            latency_ns,
        }
    }

    /// Section 4.1 / Table 2 profiles as straight lines through the table's points:
    /// A: l(b) = 50 + 3.125 b ms (l(8) = 75, l(16) = 100); B: through l(4) = 50 and
    /// l(16) = 125 ms, i.e. 25 + 6.25 b; C: through l(4) = 60 and l(16) = 125 ms.
    fn nexus_abc(ra: f64, rb: f64, rc: f64) -> Vec<Session> {
        vec![
            sess(0, 200, ra, |b| 50 * MS + 3_125_000 * b),
            sess(1, 250, rb, |b| 25 * MS + 6_250_000 * b),
            sess(2, 250, rc, |b| 60 * MS + (b - 4) * 65 * MS / 12),
        ]
    }

    /// Asserts the plan invariants (models must be unique) and returns the GPU count.
    fn check_plan(sessions: &[Session], plan: &[NodePlan]) -> usize {
        let (mut served, mut occ_sum) = (vec![0.0; sessions.len()], 0.0);
        for node in plan {
            let (duty, mut busy) = (node.duty_cycle_ns, 0);
            assert!(!node.sessions.is_empty() && duty > 0, "{node:?}");
            for a in &node.sessions {
                let i = sessions.iter().position(|s| s.model == a.model).unwrap();
                let (s, b) = (&sessions[i], a.batch as usize);
                assert!(b >= 1 && b <= s.latency_ns.len(), "{node:?}");
                busy += lat(s, b);
                assert!(duty + lat(s, b) <= s.slo_ns, "SLO: {node:?} {s:?}");
                let capacity = b as f64 * 1e9 / duty as f64;
                assert!(capacity >= a.rate_rps * (1.0 - 1e-9), "rate: {node:?}");
                served[i] += a.rate_rps;
            }
            assert!(busy <= duty, "overloaded: {node:?}");
            let occ = busy as f64 / duty as f64;
            assert!((node.occupancy - occ).abs() < 1e-9, "{node:?}");
            occ_sum += occ;
        }
        let mut lower_bound = 0.0;
        for (s, got) in sessions.iter().zip(served) {
            if s.rate_rps == 0.0 {
                continue;
            }
            assert!(got >= s.rate_rps * (1.0 - 1e-9), "{s:?} got {got}");
            // Any valid placement has 2 l(b) <= SLO, so GPU time per request is at
            // least min over those b of l(b)/b: a lower bound on total occupancy.
            let cost = (1..=s.latency_ns.len())
                .filter(|&b| 2 * lat(s, b) <= s.slo_ns)
                .map(|b| lat(s, b) as f64 / b as f64)
                .fold(f64::INFINITY, f64::min);
            lower_bound += s.rate_rps * cost / 1e9;
        }
        assert!(occ_sum >= lower_bound * (1.0 - 1e-9), "{occ_sum}");
        gpus_needed(plan)
    }

    #[test]
    fn nexus_section_4_1_colocates_a_and_b() {
        let sessions = nexus_abc(64.0, 32.0, 32.0);
        let plan = squishy_bin_packing(&sessions).unwrap();
        assert_eq!(check_plan(&sessions, &plan), 2);
        // A: batch 8 (75 ms) every 125 ms; B: batch 4 (50 ms) fits the 50 ms slack.
        let ab = vec![assignment(0, 8, 64.0), assignment(1, 4, 32.0)];
        assert_eq!((&plan[0].sessions, plan[0].duty_cycle_ns), (&ab, 125 * MS));
        assert!((plan[0].occupancy - 1.0).abs() < 1e-12);
        // C alone: a batch of 4 C tasks (60 ms) would not fit A's slack.
        assert_eq!(plan[1].sessions.len(), 1);
        assert_eq!(plan[1].sessions[0].model, 2);
    }

    #[test]
    fn nexus_section_4_1_saturated_throughputs() {
        // Table 2: A runs batch 16 at 160 r/s, B and C batch 16 at 128 r/s per GPU.
        let sessions = nexus_abc(320.0, 256.0, 256.0);
        let plan = squishy_bin_packing(&sessions).unwrap();
        assert_eq!(check_plan(&sessions, &plan), 6);
        let tput = [160.0, 128.0, 128.0];
        for (i, node) in plan.iter().enumerate() {
            let model = i as u32 / 2;
            let want = vec![assignment(model, 16, tput[model as usize])];
            assert_eq!((&node.sessions, node.occupancy), (&want, 1.0));
        }
    }

    #[test]
    fn resnet50_like_saturated_model() {
        let s = sess(7, 25, 4000.0, |b| 1_053_000 * b + 5_072_000);
        assert!(2 * s.latency_ns[6] <= 25 * MS && 2 * s.latency_ns[7] > 25 * MS);
        let plan = squishy_bin_packing(std::slice::from_ref(&s)).unwrap();
        let t = 7e9 / 12_443_000.0; // ~562.6 r/s per GPU: 7 full GPUs + 1 residue
        assert_eq!(check_plan(&[s], &plan), 8);
        for node in &plan[..7] {
            let want = vec![assignment(7, 7, t)];
            assert_eq!((&node.sessions, node.duty_cycle_ns), (&want, 12_443_000));
        }
        let residual = plan[7].sessions[0].rate_rps;
        assert!((residual - (4000.0 - 7.0 * t)).abs() < 1e-6);
    }

    #[test]
    fn infeasible_and_degenerate_inputs() {
        let bad = sess(3, 30, 10.0, |b| 20 * MS + b);
        let e = squishy_bin_packing(std::slice::from_ref(&bad)).unwrap_err();
        let SquishyError::Infeasible { model, .. } = e;
        assert_eq!(model, 3);
        let mut broken = bad.clone();
        broken.latency_ns.clear();
        assert!(squishy_bin_packing(&[broken]).is_err());
        let mut negative = bad.clone();
        negative.rate_rps = -1.0;
        assert!(squishy_bin_packing(&[negative]).is_err());
        // Rate-0 sessions get no node (even if infeasible); no sessions, no nodes.
        let mut idle = bad;
        idle.rate_rps = 0.0;
        assert_eq!(squishy_bin_packing(&[idle]), Ok(vec![]));
        assert_eq!(squishy_bin_packing(&[]), Ok(vec![]));
    }

    #[test]
    fn residue_fallbacks_keep_plans_valid() {
        // Tiny rate: l(1) + 1/r > SLO, so batch 1 runs every SLO - l(1) = 90 ms.
        let slow = sess(0, 100, 1.0, |b| 10 * MS * b);
        let plan = squishy_bin_packing(std::slice::from_ref(&slow)).unwrap();
        check_plan(&[slow], &plan);
        let got = (plan[0].sessions[0].batch, plan[0].duty_cycle_ns);
        assert_eq!(got, (1, 90 * MS));
        // Paper's b = 1 overloads its node (l(1) = 40 ms > 1/r = 33 ms): use b = 2.
        let mut s = sess(1, 100, 30.0, |b| 30 * MS + 10 * MS * b.min(2));
        s.latency_ns.truncate(2);
        let plan = squishy_bin_packing(std::slice::from_ref(&s)).unwrap();
        check_plan(&[s], &plan);
        let got = (plan[0].sessions[0].batch, plan[0].duty_cycle_ns);
        assert_eq!(got, (2, 50 * MS));
    }

    #[test]
    fn random_sessions_always_yield_valid_plans() {
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move |n: u64| {
            state = state.wrapping_mul(6_364_136_223_846_793_005);
            state = state.wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % n
        };
        let (mut plans, mut shared) = (0, 0);
        for _ in 0..400 {
            let sessions: Vec<Session> = (0..1 + next(12) as u32)
                .map(|model| {
                    let (beta, alpha) = ((1 + next(20) as i64) * MS, next(5_000_000) as i64);
                    let mut s = sess(model, 0, 0.0, |b| beta + alpha * b);
                    s.latency_ns.truncate(1 + next(64) as usize);
                    if next(2) == 0 {
                        // Arbitrary non-decreasing profile.
                        let mut l = beta;
                        for x in s.latency_ns.iter_mut() {
                            l += next(3_000_000) as i64;
                            *x = l;
                        }
                    }
                    s.slo_ns = (s.latency_ns[0] as f64 * (1.9 + next(200) as f64 / 10.0)) as i64;
                    s.rate_rps = match next(10) {
                        0 => 0.0,
                        1 => 0.01 * (1 + next(100)) as f64,
                        _ => 10f64.powf(next(4000) as f64 / 1000.0),
                    };
                    s
                })
                .collect();
            match squishy_bin_packing(&sessions) {
                Ok(plan) => {
                    check_plan(&sessions, &plan);
                    plans += 1;
                    shared += plan.iter().filter(|n| n.sessions.len() > 1).count();
                }
                Err(SquishyError::Infeasible { model, .. }) => {
                    let s = &sessions[model as usize];
                    assert!(s.rate_rps > 0.0 && 2 * s.latency_ns[0] > s.slo_ns);
                }
            }
        }
        // The generator must exercise both feasible plans and merged nodes.
        assert!(plans > 300 && shared > 100, "{plans} {shared}");
    }
}
