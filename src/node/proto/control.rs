//! Model control (Triton's `--model-control-mode`): which models are loaded,
//! and loads and unloads that clients ask for while requests keep coming.
//!
//! Pure bookkeeping (no clock, no I/O): each model's [`ModelAvailability`],
//! the answer to each load or unload asked, and the states that changed
//! (what the scheduler tells its frontends). [`super::sched::SchedProto`]
//! carries the decisions out with the machinery of live model moves: a load
//! sends `LoadModel` to the backends of the model's sub-cluster and the
//! model is ready once every backend in service there confirmed it; an
//! unload stops new requests at once (frontends refuse them, the scheduler
//! drops any that were under way), lets those taken finish (past the latest
//! deadline given, and no plan of the model in flight), then unloads it.
//!
//! * `none` (the default, as Triton's): every model is loaded at start and
//!   loads and unloads are refused.
//! * `explicit`: only the models named at start (`--load-model`) are loaded;
//!   clients load and unload the others.
//! * `poll`: every model is loaded at start; then the repository's changes
//!   load and unload models ([`super::repo_poll`]: a model whose files are
//!   removed is unloaded, one put back or changed is loaded again), and
//!   clients' loads and unloads are refused (as Triton refuses them).
//!
//! A standby that takes over starts from its primary's states
//! ([`Control::adopt`]), so the loads and unloads done there survive.

use crate::core::ModelId;
use crate::wire::{ModelAvailability, ModelStateItem};
use std::collections::BTreeSet;

/// `--model-control-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ControlMode {
    #[default]
    None,
    Explicit,
    Poll,
}

impl std::str::FromStr for ControlMode {
    type Err = String;
    fn from_str(s: &str) -> Result<ControlMode, String> {
        match s {
            "none" => Ok(ControlMode::None),
            "explicit" => Ok(ControlMode::Explicit),
            "poll" => Ok(ControlMode::Poll),
            other => Err(format!(
                "unknown --model-control-mode {other:?} (none, explicit or poll)"
            )),
        }
    }
}

/// What the scheduler must do for a load or unload asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Refused: the asker hears the model's state with this reason.
    Refused(String),
    /// Nothing to do (loaded already, or not loaded): the asker hears the
    /// state as it is.
    AsIs,
    /// Load it on its sub-cluster's backends.
    Load,
    /// It was being unloaded and still is on its backends: it takes requests
    /// again.
    KeepLoaded,
    /// Stop taking its requests; unload it once those taken have finished.
    Drain,
    /// It was loading: unload it now (no request was taken).
    CancelLoad,
}

/// Every model's state under model control.
#[derive(Debug, Clone)]
pub struct Control {
    mode: ControlMode,
    state: Vec<ModelAvailability>,
    /// Why a model is unavailable (a failed load), else empty.
    reason: Vec<String>,
    changed: BTreeSet<ModelId>,
}

impl Control {
    /// `models` models; with `explicit`, those for which `loaded` is true
    /// start loaded (every one does with `none` and `poll`).
    pub fn new(mode: ControlMode, models: usize, loaded: impl Fn(ModelId) -> bool) -> Control {
        let state = (0..models as u32)
            .map(|m| {
                if mode != ControlMode::Explicit || loaded(ModelId(m)) {
                    ModelAvailability::Ready
                } else {
                    ModelAvailability::Unavailable
                }
            })
            .collect();
        Control {
            mode,
            state,
            reason: vec![String::new(); models],
            changed: BTreeSet::new(),
        }
    }

    pub fn mode(&self) -> ControlMode {
        self.mode
    }

    pub fn state(&self, m: ModelId) -> ModelAvailability {
        self.state
            .get(m.idx())
            .copied()
            .unwrap_or(ModelAvailability::Unavailable)
    }

    /// Whether `m`'s new requests are taken.
    #[inline]
    pub fn takes_requests(&self, m: ModelId) -> bool {
        self.state.get(m.idx()) == Some(&ModelAvailability::Ready)
    }

    /// Whether `m` must be on its sub-cluster's GPUs (loading, loaded or
    /// draining): a backend that joins loads it.
    pub fn held(&self, m: ModelId) -> bool {
        self.state(m) != ModelAvailability::Unavailable
    }

    /// Models in `state`, by id.
    pub fn in_state(&self, state: ModelAvailability) -> Vec<ModelId> {
        (0..self.state.len() as u32)
            .map(ModelId)
            .filter(|&m| self.state(m) == state)
            .collect()
    }

    /// A client asks to load (`load`) or unload `m` (a model id in range).
    pub fn ask(&mut self, m: ModelId, load: bool) -> Decision {
        match self.mode {
            ControlMode::None => return Decision::Refused(
                "explicit model load / unload is not allowed: the scheduler runs with --model-control-mode none".into(),
            ),
            ControlMode::Poll => return Decision::Refused(
                "explicit model load / unload is not allowed if polling is enabled: the scheduler runs with --model-control-mode poll (the repository's changes load and unload models)".into(),
            ),
            ControlMode::Explicit => {}
        }
        self.change(m, load)
    }

    /// Under `poll`, the repository's changes load (`load`) or unload `m`;
    /// refused under the other modes.
    pub fn repo_change(&mut self, m: ModelId, load: bool) -> Decision {
        if self.mode != ControlMode::Poll {
            return Decision::Refused("the scheduler does not poll its repository".into());
        }
        self.change(m, load)
    }

    fn change(&mut self, m: ModelId, load: bool) -> Decision {
        use ModelAvailability::*;
        let Some(&now) = self.state.get(m.idx()) else {
            return Decision::Refused(format!("no model {}", m.0));
        };
        let (next, d) = match (now, load) {
            (Ready | Loading, true) | (Unavailable, false) => return Decision::AsIs,
            (Unloading, false) => return Decision::AsIs,
            (Unavailable, true) => (Loading, Decision::Load),
            (Unloading, true) => (Ready, Decision::KeepLoaded),
            (Ready, false) => (Unloading, Decision::Drain),
            (Loading, false) => (Unavailable, Decision::CancelLoad),
        };
        self.set(m, next, String::new());
        d
    }

    /// Starts from a primary's states (a standby taking over, before any
    /// backend registers): a model loaded or loading there is loaded, as if
    /// named at start (the backends that register load it); one unloading
    /// or unavailable there is not (its unload completes: a backend drops
    /// at its registration what the scheduler does not ask for), with the
    /// reason of a failed load kept. Under `none` every model stays loaded.
    /// Refused (nothing changes) when an item names a model out of range.
    /// Returns how many models changed.
    pub fn adopt(&mut self, items: &[ModelStateItem]) -> Result<usize, String> {
        use ModelAvailability::*;
        if let Some(i) = items.iter().find(|i| i.model.idx() >= self.state.len()) {
            return Err(format!(
                "the primary's model {} is not served here ({} models)",
                i.model.0,
                self.state.len()
            ));
        }
        if self.mode == ControlMode::None {
            return Ok(0);
        }
        let mut n = 0;
        for i in items {
            let (next, reason) = match i.state {
                Ready | Loading => (Ready, String::new()),
                Unloading => (Unavailable, String::new()),
                Unavailable => (Unavailable, i.reason.chars().take(512).collect()),
            };
            if self.state[i.model.idx()] != next || self.reason[i.model.idx()] != reason {
                self.set(i.model, next, reason);
                n += 1;
            }
        }
        Ok(n)
    }

    /// Every backend in service of `m`'s sub-cluster holds it.
    pub fn loaded(&mut self, m: ModelId) {
        if self.state(m) == ModelAvailability::Loading {
            self.set(m, ModelAvailability::Ready, String::new());
        }
    }

    /// Its load failed (or took too long): unavailable, with why.
    pub fn load_failed(&mut self, m: ModelId, why: String) {
        if self.state(m) == ModelAvailability::Loading {
            self.set(m, ModelAvailability::Unavailable, why);
        }
    }

    /// A draining model has finished its requests and is unloaded.
    pub fn unloaded(&mut self, m: ModelId) {
        if self.state(m) == ModelAvailability::Unloading {
            self.set(m, ModelAvailability::Unavailable, String::new());
        }
    }

    fn set(&mut self, m: ModelId, state: ModelAvailability, reason: String) {
        self.state[m.idx()] = state;
        self.reason[m.idx()] = reason;
        self.changed.insert(m);
    }

    pub fn item(&self, m: ModelId) -> ModelStateItem {
        ModelStateItem {
            model: m,
            state: self.state(m),
            reason: self.reason.get(m.idx()).cloned().unwrap_or_default(),
            devices: Default::default(),
        }
    }

    /// Every model's state (what a frontend hears when it joins).
    pub fn all(&self) -> Vec<ModelStateItem> {
        (0..self.state.len() as u32)
            .map(|m| self.item(ModelId(m)))
            .collect()
    }

    /// The states that changed since the last call.
    pub fn take_changes(&mut self) -> Vec<ModelStateItem> {
        let ms = std::mem::take(&mut self.changed);
        ms.into_iter().map(|m| self.item(m)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ModelAvailability::*;

    #[test]
    fn none_loads_everything_and_refuses_control() {
        let mut c = Control::new(ControlMode::None, 2, |_| false);
        assert!(c.takes_requests(ModelId(0)) && c.takes_requests(ModelId(1)));
        assert!(matches!(c.ask(ModelId(0), false), Decision::Refused(r) if r.contains("none")));
        assert_eq!(c.state(ModelId(0)), Ready);
        assert!(c.take_changes().is_empty());
    }

    #[test]
    fn explicit_loads_drains_and_unloads_with_every_change_told() {
        let mut c = Control::new(ControlMode::Explicit, 3, |m| m == ModelId(2));
        assert_eq!(
            c.all().iter().map(|i| i.state).collect::<Vec<_>>(),
            vec![Unavailable, Unavailable, Ready]
        );
        assert_eq!(c.ask(ModelId(0), true), Decision::Load);
        assert_eq!(c.ask(ModelId(0), true), Decision::AsIs, "loading already");
        assert!(!c.takes_requests(ModelId(0)) && c.held(ModelId(0)));
        c.loaded(ModelId(0));
        assert!(c.takes_requests(ModelId(0)));
        assert_eq!(c.ask(ModelId(0), false), Decision::Drain);
        assert!(!c.takes_requests(ModelId(0)) && c.held(ModelId(0)));
        assert_eq!(c.ask(ModelId(0), true), Decision::KeepLoaded);
        assert!(c.takes_requests(ModelId(0)));
        assert_eq!(c.ask(ModelId(0), false), Decision::Drain);
        c.unloaded(ModelId(0));
        assert!(!c.held(ModelId(0)));
        assert_eq!(c.ask(ModelId(0), false), Decision::AsIs);
        // A load asked and unasked before it completes.
        assert_eq!(c.ask(ModelId(1), true), Decision::Load);
        assert_eq!(c.ask(ModelId(1), false), Decision::CancelLoad);
        assert_eq!(c.state(ModelId(1)), Unavailable);
        // A failed load says why; loaded() after it changes nothing.
        assert_eq!(c.ask(ModelId(1), true), Decision::Load);
        c.load_failed(ModelId(1), "no such file".into());
        c.loaded(ModelId(1));
        let ch = c.take_changes();
        assert_eq!(ch.len(), 2, "{ch:?}");
        assert_eq!(
            (ch[1].state, ch[1].reason.as_str()),
            (Unavailable, "no such file")
        );
        assert!(c.take_changes().is_empty());
        assert!(matches!(c.ask(ModelId(9), true), Decision::Refused(_)));
    }

    #[test]
    fn modes_parse_with_clear_errors() {
        assert_eq!("explicit".parse::<ControlMode>(), Ok(ControlMode::Explicit));
        assert_eq!("poll".parse::<ControlMode>(), Ok(ControlMode::Poll));
        assert!("x"
            .parse::<ControlMode>()
            .unwrap_err()
            .contains("none, explicit or poll"));
    }

    #[test]
    fn poll_loads_everything_refuses_clients_and_follows_the_repository() {
        let mut c = Control::new(ControlMode::Poll, 2, |_| false);
        assert!(c.takes_requests(ModelId(0)) && c.takes_requests(ModelId(1)));
        assert!(
            matches!(c.ask(ModelId(0), false), Decision::Refused(r) if r.contains("polling is enabled"))
        );
        assert_eq!(c.repo_change(ModelId(0), false), Decision::Drain);
        c.unloaded(ModelId(0));
        assert_eq!(c.state(ModelId(0)), Unavailable);
        assert_eq!(c.repo_change(ModelId(0), true), Decision::Load);
        c.loaded(ModelId(0));
        assert!(c.takes_requests(ModelId(0)));
        let mut e = Control::new(ControlMode::Explicit, 1, |_| true);
        assert!(matches!(
            e.repo_change(ModelId(0), false),
            Decision::Refused(_)
        ));
        assert!(e.takes_requests(ModelId(0)));
    }

    #[test]
    fn a_standby_adopts_what_was_loaded_and_unloaded_at_its_primary() {
        let item = |m: u32, state, reason: &str| ModelStateItem {
            model: ModelId(m),
            state,
            reason: reason.into(),
            devices: Default::default(),
        };
        // Started with models 0 and 1 loaded, as the primary was.
        let mut c = Control::new(ControlMode::Explicit, 5, |m| m.0 < 2);
        let primary = [
            item(0, Ready, ""),
            item(1, Unavailable, ""),
            item(2, Ready, ""),
            item(3, Loading, ""),
            item(4, Unavailable, "failed to load: no memory"),
        ];
        assert_eq!(c.adopt(&primary), Ok(4));
        assert_eq!(
            c.all().iter().map(|i| i.state).collect::<Vec<_>>(),
            vec![Ready, Unavailable, Ready, Ready, Unavailable]
        );
        assert_eq!(c.item(ModelId(4)).reason, "failed to load: no memory");
        assert_eq!(c.take_changes().len(), 4);
        // An unload under way at the primary completes.
        assert_eq!(c.adopt(&[item(2, Unloading, "")]), Ok(1));
        assert!(!c.held(ModelId(2)));
        assert_eq!(c.adopt(&[item(2, Unavailable, "")]), Ok(0));
        // Out of range: refused whole.
        assert!(c
            .adopt(&[item(0, Unavailable, ""), item(5, Ready, "")])
            .is_err());
        assert!(c.takes_requests(ModelId(0)));
        // Under `none` everything stays loaded.
        let mut n = Control::new(ControlMode::None, 2, |_| false);
        assert_eq!(n.adopt(&[item(0, Unavailable, "")]), Ok(0));
        assert!(n.takes_requests(ModelId(0)));
    }
}
