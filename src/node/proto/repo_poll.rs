//! `--model-control-mode poll` (Triton's): what the repository's changes
//! ask of model control. The scheduler looks at its model repository every
//! `--repository-poll-secs` ([`Scan`]: each served model's files, by a
//! fingerprint of their sizes and modification times) and [`RepoPoll::step`]
//! turns the differences into loads and unloads:
//!
//! * a model whose files are gone is unloaded (its requests finish first);
//! * a loaded model whose files changed is unloaded, and loaded again at the
//!   next look (its new files; Triton instead keeps the old version serving
//!   until the new one is ready);
//! * a model not loaded whose files are there is loaded, once per version of
//!   its files: a load that failed is tried again only when they change;
//! * a model that appears in the repository but was not served at start is
//!   not served (the served models are numbered at start): it is reported
//!   once, for the operator to restart the scheduler.
//!
//! Pure: the scheduler's driver scans the folder and carries the changes out
//! ([`crate::node::proto::sched::SchedProto::repo_change`]).

use crate::core::ModelId;
use crate::wire::ModelAvailability;
use std::collections::BTreeSet;

/// The sizes and modification times of a model's files, hashed.
pub type Fingerprint = u64;

/// One look at the repository.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Each served model's fingerprint (by id; `None`: its files are gone).
    pub models: Vec<Option<Fingerprint>>,
    /// Models in the repository that are not served, by name.
    pub unknown: Vec<String>,
}

/// What a look at the repository asks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Models to load (`true`) or unload (`false`).
    pub models: Vec<(ModelId, bool)>,
    /// Models in the repository not served, not reported before.
    pub new_unknown: Vec<String>,
}

/// What the earlier looks saw.
#[derive(Debug, Clone, Default)]
pub struct RepoPoll {
    /// The previous look's fingerprints.
    last: Vec<Option<Fingerprint>>,
    /// The fingerprint each model's last load was asked with.
    asked: Vec<Option<Fingerprint>>,
    reported: BTreeSet<String>,
}

impl RepoPoll {
    pub fn new() -> RepoPoll {
        RepoPoll::default()
    }

    /// The changes `scan` asks, given each model's state now.
    pub fn step(&mut self, scan: &Scan, state: impl Fn(ModelId) -> ModelAvailability) -> Changes {
        use ModelAvailability::*;
        let n = scan.models.len();
        self.last.resize(n, None);
        self.asked.resize(n, None);
        let mut out = Changes::default();
        for (i, &now) in scan.models.iter().enumerate() {
            let m = ModelId(i as u32);
            let now_state = state(m);
            let held = matches!(now_state, Ready | Loading);
            match now {
                None => {
                    self.asked[i] = None;
                    if held {
                        out.models.push((m, false));
                    }
                }
                Some(f) => {
                    let changed = self.last[i].is_some_and(|l| l != f);
                    if held && changed {
                        self.asked[i] = None;
                        out.models.push((m, false));
                    } else if now_state == Unavailable && self.asked[i] != Some(f) {
                        self.asked[i] = Some(f);
                        out.models.push((m, true));
                    }
                }
            }
            self.last[i] = now;
        }
        for name in &scan.unknown {
            if self.reported.insert(name.clone()) {
                out.new_unknown.push(name.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ModelAvailability::*;

    fn scan(v: &[Option<u64>]) -> Scan {
        Scan {
            models: v.to_vec(),
            unknown: Vec::new(),
        }
    }

    /// Model states that follow the changes at once (loads and unloads
    /// complete between looks, unless `fail` says a load fails).
    struct Cluster {
        state: Vec<ModelAvailability>,
    }

    impl Cluster {
        fn apply(&mut self, ch: &Changes, fail: &[u32]) {
            for &(m, load) in &ch.models {
                self.state[m.idx()] = match (load, fail.contains(&m.0)) {
                    (true, false) => Ready,
                    _ => Unavailable,
                };
            }
        }
    }

    #[test]
    fn removed_models_unload_and_come_back_when_put_back() {
        let mut p = RepoPoll::new();
        let mut c = Cluster {
            state: vec![Ready, Ready],
        };
        let st = |c: &Cluster| {
            let s = c.state.clone();
            move |m: ModelId| s[m.idx()]
        };
        // Unchanged: nothing asked.
        for _ in 0..3 {
            let ch = p.step(&scan(&[Some(1), Some(2)]), st(&c));
            assert!(ch.models.is_empty(), "{ch:?}");
        }
        // Model 1's files removed: unloaded once.
        let ch = p.step(&scan(&[Some(1), None]), st(&c));
        assert_eq!(ch.models, vec![(ModelId(1), false)]);
        c.apply(&ch, &[]);
        assert!(p.step(&scan(&[Some(1), None]), st(&c)).models.is_empty());
        // Put back unchanged: loaded again.
        let ch = p.step(&scan(&[Some(1), Some(2)]), st(&c));
        assert_eq!(ch.models, vec![(ModelId(1), true)]);
        c.apply(&ch, &[]);
        assert!(p.step(&scan(&[Some(1), Some(2)]), st(&c)).models.is_empty());
    }

    #[test]
    fn a_changed_model_reloads_and_a_failed_load_waits_for_new_files() {
        let mut p = RepoPoll::new();
        let mut c = Cluster { state: vec![Ready] };
        let st = |c: &Cluster| {
            let s = c.state.clone();
            move |m: ModelId| s[m.idx()]
        };
        assert!(p.step(&scan(&[Some(1)]), st(&c)).models.is_empty());
        // Its files change: unloaded, then loaded at the next look.
        let ch = p.step(&scan(&[Some(5)]), st(&c));
        assert_eq!(ch.models, vec![(ModelId(0), false)]);
        c.apply(&ch, &[]);
        let ch = p.step(&scan(&[Some(5)]), st(&c));
        assert_eq!(ch.models, vec![(ModelId(0), true)]);
        // ... and that load fails: not tried again with the same files.
        c.apply(&ch, &[0]);
        for _ in 0..3 {
            assert!(p.step(&scan(&[Some(5)]), st(&c)).models.is_empty());
        }
        // New files: tried again.
        let ch = p.step(&scan(&[Some(6)]), st(&c));
        assert_eq!(ch.models, vec![(ModelId(0), true)]);
        c.apply(&ch, &[]);
        assert_eq!(c.state, vec![Ready]);
        // While a model drains, nothing is asked of it.
        c.state[0] = Unloading;
        assert!(p.step(&scan(&[Some(7)]), st(&c)).models.is_empty());
    }

    #[test]
    fn a_model_not_served_is_reported_once() {
        let mut p = RepoPoll::new();
        let s = Scan {
            models: vec![Some(1)],
            unknown: vec!["new".into()],
        };
        assert_eq!(p.step(&s, |_| Ready).new_unknown, vec!["new".to_string()]);
        assert!(p.step(&s, |_| Ready).new_unknown.is_empty());
    }
}
