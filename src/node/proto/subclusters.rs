//! Sub-clusters in one scheduler (paper Sections 3.5 and 4.4): which
//! sub-cluster serves each model, and models moving between them while
//! requests keep coming.
//!
//! Every GPU belongs to one sub-cluster (its backend's), and every GPU of a
//! sub-cluster holds the same models: those whose *home* it is, plus those
//! moving in or out. Each sub-cluster has its own dispatcher; a model's new
//! tasks go to its home's.
//!
//! A move of model m from sub-cluster A to B, live:
//! 1. **Loading**: B's backends are told to load m (`LoadModel`). Tasks still
//!    go to A.
//! 2. **Switched**: once every backend in service in B has confirmed m (and B
//!    has a GPU in service), m's home becomes B: new tasks go to B's
//!    dispatcher ([`super::sched::Action::Route`]). The tasks already queued
//!    in A stay there and are served (or dropped at their deadline) by A's
//!    GPUs, which still hold m: none is dropped for the move, none is served
//!    twice. `drain_until` is the latest deadline of a task that went to A.
//! 3. **Done**: after `drain_until` plus [`super::sched::DRAIN_QUIET`], and
//!    once no plan of m is in flight on A's backends, A's backends unload m
//!    (`UnloadModel`). No plan of m can follow: A's dispatcher has no task of
//!    m left.
//!
//! A load that fails on a backend of B aborts the move before the switch (m
//! stays home in A; B's backends unload it). A model moves once at a time.
//! This is the bookkeeping of models; the backends' side (who must load what,
//! who confirmed) lives in [`super::sched::SchedProto`].

use crate::core::{ModelId, Time};
use std::collections::BTreeMap;

/// Where a moving model is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The target's backends load it; tasks go to the source.
    Loading,
    /// Tasks go to the target; the source finishes what it queued, all of
    /// which ends by `drain_until` (the latest deadline it was given).
    Switched { drain_until: Time },
}

/// A model on its way from one sub-cluster to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub from: u32,
    pub to: u32,
    pub phase: Phase,
    /// When it started.
    pub since: Time,
}

/// Moves counted (the scheduler's report).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MoveStats {
    pub started: u64,
    pub switched: u64,
    pub done: u64,
    pub aborted: u64,
}

/// The models' sub-clusters and their moves.
#[derive(Debug, Clone)]
pub struct SubClusters {
    count: u32,
    home: Vec<u32>,
    moves: BTreeMap<ModelId, Move>,
    /// Per model: the latest deadline of a task submitted (to its home then).
    last_deadline: Vec<Time>,
    /// Bumped at every change of a home (what a following standby is sent).
    version: u64,
    /// The GPU type of each sub-cluster (empty: untyped, any GPU anywhere).
    /// A backend joins a sub-cluster of its GPUs' type, and a model moves only
    /// between sub-clusters of one type: its initial home's, which the
    /// partitioner chose by the model's type.
    types: Vec<String>,
    pub stats: MoveStats,
}

/// Whether two GPU type names are the same type: compared without case and
/// surrounding blanks ("A100" is "a100 ").
pub fn same_gpu_type(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

impl SubClusters {
    /// `count` sub-clusters; `home[m]` is model m's. Every model in one of them.
    pub fn new(count: u32, home: Vec<u32>) -> Result<SubClusters, String> {
        if count == 0 {
            return Err("at least one sub-cluster is needed".into());
        }
        if let Some((m, &s)) = home.iter().enumerate().find(|(_, &s)| s >= count) {
            return Err(format!(
                "model {m} is assigned to sub-cluster {s}, but there are {count} (0 to {})",
                count - 1
            ));
        }
        Ok(SubClusters {
            count,
            last_deadline: vec![Time::EPOCH_MIN; home.len()],
            home,
            moves: BTreeMap::new(),
            version: 0,
            types: Vec::new(),
            stats: MoveStats::default(),
        })
    }

    /// The same sub-clusters, sub-cluster `s` of GPU type `types[s]` (one name
    /// per sub-cluster, none empty; an empty list leaves them untyped).
    pub fn with_types(mut self, types: Vec<String>) -> Result<SubClusters, String> {
        if types.is_empty() {
            return Ok(self);
        }
        if types.len() != self.count as usize {
            return Err(format!(
                "{} GPU types for {} sub-clusters: name one type per sub-cluster",
                types.len(),
                self.count
            ));
        }
        if let Some(s) = types.iter().position(|t| t.trim().is_empty()) {
            return Err(format!("sub-cluster {s} has an empty GPU type"));
        }
        self.types = types.iter().map(|t| t.trim().to_string()).collect();
        Ok(self)
    }

    /// Sub-cluster `sub`'s GPU type (None: untyped).
    pub fn gpu_type(&self, sub: u32) -> Option<&str> {
        self.types.get(sub as usize).map(String::as_str)
    }

    /// Every sub-cluster's GPU type (empty: untyped).
    pub fn types(&self) -> &[String] {
        &self.types
    }

    /// The sub-clusters a backend whose GPUs are of type `gpu_type` may join:
    /// all of them when untyped, else those of that type.
    pub fn of_type(&self, gpu_type: &str) -> Vec<u32> {
        (0..self.count)
            .filter(|&s| self.gpu_type(s).is_none_or(|t| same_gpu_type(t, gpu_type)))
            .collect()
    }

    /// Whether sub-clusters `a` and `b` are of one GPU type (always, untyped).
    pub fn same_type(&self, a: u32, b: u32) -> bool {
        match (self.gpu_type(a), self.gpu_type(b)) {
            (Some(x), Some(y)) => same_gpu_type(x, y),
            _ => self.types.is_empty(),
        }
    }

    /// Changes with every home (see [`SubClusters::adopt`] and moves' switches).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Takes `homes` (a primary's, for a standby that takes over) as every
    /// model's home: the models whose home changed, with their new one. Only
    /// with no move under way; `homes` must name every model and valid
    /// sub-clusters.
    pub fn adopt(&mut self, homes: &[u32]) -> Result<Vec<(ModelId, u32)>, String> {
        if homes.len() != self.home.len() {
            return Err(format!(
                "the assignment names {} models, this scheduler has {}",
                homes.len(),
                self.home.len()
            ));
        }
        if let Some((m, &s)) = homes.iter().enumerate().find(|(_, &s)| s >= self.count) {
            return Err(format!(
                "the assignment puts model {m} in sub-cluster {s}, but there are {}",
                self.count
            ));
        }
        if !self.moves.is_empty() {
            return Err(format!("{} models are moving", self.moves.len()));
        }
        if let Some((m, (&new, &old))) = homes
            .iter()
            .zip(&self.home)
            .enumerate()
            .find(|(_, (&new, &old))| !self.same_type(new, old))
        {
            return Err(format!(
                "the assignment moves model {m} from sub-cluster {old} to {new}, of another GPU type"
            ));
        }
        let changed: Vec<(ModelId, u32)> = homes
            .iter()
            .zip(&self.home)
            .enumerate()
            .filter(|(_, (new, old))| new != old)
            .map(|(m, (&new, _))| (ModelId(m as u32), new))
            .collect();
        if !changed.is_empty() {
            self.home.copy_from_slice(homes);
            self.version += 1;
        }
        Ok(changed)
    }

    /// One sub-cluster serving all `models`.
    pub fn single(models: usize) -> SubClusters {
        SubClusters::new(1, vec![0; models]).expect("one sub-cluster")
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Where model `m`'s new tasks go.
    #[inline]
    pub fn home(&self, m: ModelId) -> u32 {
        self.home.get(m.idx()).copied().unwrap_or(0)
    }

    /// Every model's home, by model id.
    pub fn homes(&self) -> &[u32] {
        &self.home
    }

    /// Whether the GPUs of `sub` must hold model `m` (its home, or a move
    /// in or out of `sub` is under way).
    pub fn holds(&self, sub: u32, m: ModelId) -> bool {
        self.home(m) == sub
            || self
                .moves
                .get(&m)
                .is_some_and(|mv| mv.from == sub || mv.to == sub)
    }

    /// The models `sub`'s GPUs must hold, by id.
    pub fn held_by(&self, sub: u32) -> Vec<ModelId> {
        (0..self.home.len() as u32)
            .map(ModelId)
            .filter(|&m| self.holds(sub, m))
            .collect()
    }

    /// A task of `m` with this deadline went to its home.
    #[inline]
    pub fn submitted(&mut self, m: ModelId, deadline: Time) {
        if let Some(d) = self.last_deadline.get_mut(m.idx()) {
            *d = (*d).max(deadline);
        }
    }

    /// The latest deadline of a task of `m` submitted so far.
    pub fn last_deadline(&self, m: ModelId) -> Time {
        self.last_deadline
            .get(m.idx())
            .copied()
            .unwrap_or(Time::EPOCH_MIN)
    }

    /// Starts moving `m` to `to`; false (nothing changes) when it is home
    /// there already, is moving, either is out of range, or `to` is of another
    /// GPU type than its home.
    pub fn start(&mut self, now: Time, m: ModelId, to: u32) -> bool {
        if m.idx() >= self.home.len() || to >= self.count || self.moves.contains_key(&m) {
            return false;
        }
        let from = self.home[m.idx()];
        if from == to || !self.same_type(from, to) {
            return false;
        }
        self.moves.insert(
            m,
            Move {
                from,
                to,
                phase: Phase::Loading,
                since: now,
            },
        );
        self.stats.started += 1;
        true
    }

    /// The moves under way, by model id.
    pub fn moves(&self) -> Vec<(ModelId, Move)> {
        self.moves.iter().map(|(&m, &mv)| (m, mv)).collect()
    }

    pub fn moving(&self, m: ModelId) -> Option<Move> {
        self.moves.get(&m).copied()
    }

    /// `m`'s target has it loaded: new tasks go there from now on.
    pub fn switch(&mut self, m: ModelId) -> Option<Move> {
        let mv = self.moves.get_mut(&m)?;
        if mv.phase != Phase::Loading {
            return None;
        }
        mv.phase = Phase::Switched {
            drain_until: self.last_deadline[m.idx()],
        };
        self.home[m.idx()] = mv.to;
        self.version += 1;
        self.stats.switched += 1;
        Some(*mv)
    }

    /// `m`'s source has nothing of it left: the move is over.
    pub fn finish(&mut self, m: ModelId) -> Option<Move> {
        let mv = self.moves.remove(&m)?;
        self.stats.done += 1;
        Some(mv)
    }

    /// `m` cannot be loaded at its target: it stays home (only before the
    /// switch; after it the source's GPUs may not have it any more).
    pub fn abort(&mut self, m: ModelId) -> Option<Move> {
        if self.moves.get(&m)?.phase != Phase::Loading {
            return None;
        }
        let mv = self.moves.remove(&m)?;
        self.stats.aborted += 1;
        Some(mv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_holds_the_model_in_both_until_it_is_done() {
        let mut s = SubClusters::new(2, vec![0, 0, 1]).unwrap();
        assert_eq!(s.held_by(0), vec![ModelId(0), ModelId(1)]);
        s.submitted(ModelId(1), Time(50));
        s.submitted(ModelId(1), Time(40));
        assert!(s.start(Time(1), ModelId(1), 1));
        assert!(!s.start(Time(2), ModelId(1), 0), "one move at a time");
        assert!(!s.start(Time(2), ModelId(0), 0), "already home");
        assert!(!s.start(Time(2), ModelId(0), 2), "no sub-cluster 2");
        assert_eq!(
            s.home(ModelId(1)),
            0,
            "tasks go to the source while loading"
        );
        assert!(s.holds(0, ModelId(1)) && s.holds(1, ModelId(1)));
        let mv = s.switch(ModelId(1)).unwrap();
        assert_eq!(
            mv.phase,
            Phase::Switched {
                drain_until: Time(50)
            }
        );
        assert_eq!(s.home(ModelId(1)), 1);
        assert!(s.holds(0, ModelId(1)), "the source drains it");
        assert!(s.abort(ModelId(1)).is_none(), "no abort after the switch");
        s.finish(ModelId(1)).unwrap();
        assert!(!s.holds(0, ModelId(1)));
        assert_eq!(s.held_by(1), vec![ModelId(1), ModelId(2)]);
        assert_eq!(
            s.stats,
            MoveStats {
                started: 1,
                switched: 1,
                done: 1,
                aborted: 0
            }
        );
    }

    #[test]
    fn typed_subclusters_take_their_type_and_keep_models_within_it() {
        let s = SubClusters::new(3, vec![0, 1, 2])
            .unwrap()
            .with_types(vec!["A100".into(), "1080Ti".into(), " a100".into()])
            .unwrap();
        assert_eq!(s.of_type("a100 "), vec![0, 2]);
        assert_eq!(s.of_type("1080ti"), vec![1]);
        assert!(s.of_type("H100").is_empty());
        let mut s2 = s.clone();
        assert!(!s2.start(Time(0), ModelId(0), 1), "A100 to 1080Ti");
        assert!(s2.start(Time(0), ModelId(0), 2), "A100 to A100");
        let mut s3 = s.clone();
        assert!(s3
            .adopt(&[1, 1, 2])
            .unwrap_err()
            .contains("another GPU type"));
        assert_eq!(s3.adopt(&[2, 1, 0]).unwrap().len(), 2);
        // Untyped: any GPU anywhere.
        let u = SubClusters::new(2, vec![0]).unwrap();
        assert_eq!(u.of_type("anything"), vec![0, 1]);
        assert!(u.same_type(0, 1));
        let e = SubClusters::new(2, vec![0])
            .unwrap()
            .with_types(vec!["A100".into()])
            .unwrap_err();
        assert!(e.contains("one type per sub-cluster"), "{e}");
        assert!(SubClusters::new(1, vec![0])
            .unwrap()
            .with_types(vec![" ".into()])
            .is_err());
    }

    #[test]
    fn an_aborted_move_leaves_the_model_home() {
        let mut s = SubClusters::new(3, vec![2]).unwrap();
        assert!(s.start(Time(0), ModelId(0), 0));
        s.abort(ModelId(0)).unwrap();
        assert_eq!(s.home(ModelId(0)), 2);
        assert!(!s.holds(0, ModelId(0)));
        assert!(SubClusters::new(2, vec![0, 2])
            .unwrap_err()
            .contains("model 1"));
        assert!(SubClusters::new(0, vec![]).is_err());
    }
}
