//! Model control in the scheduler's machine: the models loaded and unloaded
//! at a client's request (relayed by a frontend), the states the frontends
//! and a following standby hear, and a standby adopting its primary's states.
//! The decisions are [`crate::node::proto::control`]'s; this is where the scheduler
//! carries them out (loads and unloads on a sub-cluster's backends).

use super::{Peer, SchedProto, DRAIN_QUIET, MOVE_LOAD_TIMEOUT};
use crate::core::{ModelId, Time};
use crate::node::proto::control::{Control, ControlMode, Decision};
use crate::node::proto::subclusters::Phase;
use crate::transport::ConnId;
use crate::wire::{ModelAvailability, ModelStateItem, Msg};
use std::collections::BTreeSet;

impl SchedProto {
    /// Model control: `mode`, and with `explicit` the models loaded at
    /// start (before any node registers; see [`crate::node::proto::control`]).
    pub fn set_model_control(&mut self, mode: ControlMode, loaded: &[ModelId]) {
        self.control = Control::new(mode, self.cfg.models.len(), |m| loaded.contains(&m));
    }

    /// Model `m`'s state under model control.
    pub fn model_availability(&self, m: ModelId) -> ModelAvailability {
        self.control.state(m)
    }

    /// The models' states under model control.
    pub fn model_states(&self) -> Vec<ModelStateItem> {
        (0..self.cfg.models.len() as u32)
            .map(|m| self.state_item(ModelId(m)))
            .collect()
    }

    /// Model `m`'s state with what runs its home sub-cluster's GPUs.
    pub(super) fn state_item(&self, m: ModelId) -> ModelStateItem {
        let mut item = self.control.item(m);
        item.devices = self.devices.of_sub(self.subs.home(m));
        item
    }

    /// Starts from a primary's models' states under model control (a standby
    /// taking over, before any node registers with it; see
    /// [`Control::adopt`]). Refused (nothing changes) once a backend
    /// registered, or when an item names a model this scheduler does not
    /// serve. Returns how many models changed.
    pub fn adopt_model_states(&mut self, items: &[ModelStateItem]) -> Result<usize, String> {
        if self
            .conns
            .values()
            .any(|pc| matches!(pc.peer, Peer::Backend { .. } | Peer::Loading { .. }))
        {
            return Err("backends registered already".into());
        }
        let n = self.control.adopt(items)?;
        self.tell_states();
        Ok(n)
    }

    /// A frontend relays a client's load (`load`) or unload of `model`.
    pub(super) fn model_control(&mut self, now: Time, c: ConnId, model: ModelId, load: bool) {
        if !matches!(
            self.conns.get(&c).map(|p| &p.peer),
            Some(Peer::Frontend { .. })
        ) {
            return self.reject(c, "ModelControl from a node that is not a frontend".into());
        }
        if model.idx() >= self.cfg.models.len() {
            return self.reject(
                c,
                format!("ModelControl for model {}, which is not served", model.0),
            );
        }
        match self.control.ask(model, load) {
            Decision::Refused(why) => {
                let mut item = self.state_item(model);
                item.reason = why;
                self.send(c, Msg::ModelStates { items: vec![item] })
            }
            Decision::AsIs => {
                let item = self.state_item(model);
                self.send(c, Msg::ModelStates { items: vec![item] })
            }
            d => self.carry_out(now, model, d),
        }
    }

    /// Under `--model-control-mode poll`, the repository's changes load
    /// (`load`) or unload `model` ([`crate::node::proto::repo_poll`]).
    pub fn repo_change(&mut self, now: Time, model: ModelId, load: bool) {
        if model.idx() >= self.cfg.models.len() {
            return;
        }
        match self.control.repo_change(model, load) {
            Decision::Refused(_) | Decision::AsIs => {}
            d => {
                let name = &self.cfg.models[model.idx()].name;
                tracing::info!(model = %name, load, "scheduler: the model repository changed");
                self.carry_out(now, model, d)
            }
        }
    }

    /// Carries out a load or unload that control decided.
    fn carry_out(&mut self, now: Time, model: ModelId, d: Decision) {
        let name = self.cfg.models[model.idx()].name.clone();
        match d {
            Decision::Refused(_) | Decision::AsIs => return,
            Decision::Load => {
                tracing::info!(model = %name, "scheduler: model load asked");
                self.load_since.insert(model, now);
                self.load_on(self.subs.home(model), model);
            }
            Decision::KeepLoaded => {
                tracing::info!(model = %name, "scheduler: model load asked while it drained; it stays");
            }
            Decision::Drain => {
                tracing::info!(model = %name, "scheduler: model unload asked; its requests finish first");
            }
            Decision::CancelLoad => {
                tracing::info!(model = %name, "scheduler: model unload asked while it loaded");
                self.load_since.remove(&model);
                let home = self.subs.home(model);
                self.unload(home, model);
            }
        }
        self.check_control(now);
        self.tell_states();
    }

    /// A load asked for failed: its sub-cluster's backends unload it.
    pub(super) fn fail_load(&mut self, model: ModelId, why: String) {
        self.control.load_failed(model, why);
        self.load_since.remove(&model);
        let home = self.subs.home(model);
        self.unload(home, model);
        self.tell_states();
    }

    /// Every frontend hears the models whose state, or whose home's GPUs
    /// in service ([`crate::node::proto::devices`]), changed.
    pub(super) fn tell_states(&mut self) {
        let mut ms: BTreeSet<ModelId> = self
            .control
            .take_changes()
            .into_iter()
            .map(|i| i.model)
            .collect();
        ms.extend(self.devices.changed(self.subs.homes()));
        if ms.is_empty() {
            return;
        }
        let items: Vec<ModelStateItem> = ms.into_iter().map(|m| self.state_item(m)).collect();
        // A following standby hears them too: it takes them over.
        let followers: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, pc)| pc.follows.is_some())
            .map(|(&c, _)| c)
            .collect();
        for c in followers {
            self.send(
                c,
                Msg::ModelStates {
                    items: items.clone(),
                },
            );
        }
        for c in self.frontend_conns() {
            self.send(
                c,
                Msg::ModelStates {
                    items: items.clone(),
                },
            );
        }
    }

    /// Loads and unloads forward: a loading model that every backend in
    /// service of its sub-cluster holds is ready (one not loaded in
    /// [`MOVE_LOAD_TIMEOUT`] fails); a draining model with no task left (past
    /// the latest deadline it was given plus [`DRAIN_QUIET`], no plan of it in
    /// flight, no move under way) is unloaded.
    pub(super) fn check_control(&mut self, now: Time) {
        if self.control.mode() == ControlMode::None {
            // Only what runs the models can change.
            return self.tell_states();
        }
        for m in self.control.in_state(ModelAvailability::Loading) {
            if !self.sub_missing(self.subs.home(m), m) {
                self.load_since.remove(&m);
                self.control.loaded(m);
                tracing::info!(model = m.0, "scheduler: model loaded");
            } else if self
                .load_since
                .get(&m)
                .is_some_and(|&t| now - t > MOVE_LOAD_TIMEOUT)
            {
                self.fail_load(m, format!("not loaded within {MOVE_LOAD_TIMEOUT:?}"));
            }
        }
        for m in self.control.in_state(ModelAvailability::Unloading) {
            if let Some(mv) = self.subs.moving(m) {
                if mv.phase == Phase::Loading {
                    self.abort_move(m);
                }
                continue;
            }
            let in_flight = self
                .plans
                .lock()
                .expect("plans lock")
                .model_plans(m, |_| true);
            if now < self.subs.last_deadline(m) + DRAIN_QUIET || in_flight > 0 {
                continue;
            }
            self.control.unloaded(m);
            tracing::info!(model = m.0, "scheduler: model unloaded");
            let home = self.subs.home(m);
            self.unload(home, m);
        }
        self.tell_states();
    }
}
