//! Model control at the frontend: the models' states as the scheduler tells
//! them (`ModelStates`), and clients' loads and unloads relayed to it
//! (`ModelControl`), each answered once the model's state settles.
//!
//! The HTTP and gRPC handlers call [`FrontendHandle::control_model`]; the
//! request reaches the event loop through a channel the loop empties each
//! turn, and the answer through a watch of the states' version. A request
//! still waited for when the frontend joins another scheduler (a standby
//! that took over, or the same one after a lost connection) is asked of it
//! again: the scheduler it was sent to may have died before acting on it,
//! and asking again what was already done changes nothing there.

use super::event_loop::Loop;
use super::handle::FrontendHandle;
use crate::core::ModelId;
use crate::wire::{DeviceCounts, ModelAvailability, ModelStateItem, Msg};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

/// How long a load or unload is waited for before the client hears a
/// timeout (the model may still get there; the index shows it).
pub const CONTROL_WAIT: Duration = Duration::from_secs(300);

/// Loads and unloads queued for the loop, at most this many (a client that
/// asks faster is refused).
const CONTROL_QUEUE: usize = 1024;

/// Every model's state as last told, with counts of the items heard for
/// each (a waiter judges only what came after its own request).
pub(super) struct ModelStates {
    state: Vec<Told>,
    /// What runs each model's GPUs, as last told (all zero: none in service).
    devices: Vec<DeviceCounts>,
    /// Each model's loads and unloads still waited for.
    open: Vec<Open>,
}

/// One model's loads and unloads still waited for: how many, and what the
/// last one asked (true: a load).
#[derive(Clone, Copy, Default)]
struct Open {
    waiting: u32,
    load: bool,
}

/// One model's state as last told, and how many items were heard for it.
#[derive(Clone)]
struct Told {
    state: ModelAvailability,
    reason: String,
    mark: Mark,
    /// `mark.moved` when the frontend last joined a scheduler. A load asked
    /// again there is judged by what that scheduler said since: a standby
    /// that never heard the primary's "loading" tells the model unavailable
    /// at first, which does not mean the load was undone.
    moved_at_join: u64,
}

/// How many items were heard for one model: all of them, and those that
/// said anything but unavailable. A load's waiter takes "unavailable" as
/// the load's end only once its model was heard in another state since the
/// request: an item sent before the scheduler took the request (another
/// model's change, its GPUs' count) still says unavailable.
#[derive(Clone, Copy, Default)]
struct Mark {
    heard: u64,
    moved: u64,
}

/// The models' states and the queue of control requests, shared by the
/// loop and the handlers.
pub(super) struct ControlShared {
    states: Mutex<ModelStates>,
    version: tokio::sync::watch::Sender<u64>,
    pub(super) requests: crossbeam_channel::Sender<(ModelId, bool)>,
    pub(super) inbox: crossbeam_channel::Receiver<(ModelId, bool)>,
}

impl ControlShared {
    /// `models` models, all ready until the scheduler says otherwise (it
    /// tells every state right after registering).
    pub(super) fn new(models: usize) -> ControlShared {
        let (requests, inbox) = crossbeam_channel::bounded(CONTROL_QUEUE);
        ControlShared {
            states: Mutex::new(ModelStates {
                state: vec![
                    Told {
                        state: ModelAvailability::Ready,
                        reason: String::new(),
                        mark: Mark::default(),
                        moved_at_join: 0,
                    };
                    models
                ],
                devices: vec![DeviceCounts::default(); models],
                open: vec![Open::default(); models],
            }),
            version: tokio::sync::watch::Sender::new(0),
            requests,
            inbox,
        }
    }

    pub(super) fn state(&self, m: usize) -> (ModelAvailability, String) {
        let s = self.states.lock().expect("model states lock");
        s.state
            .get(m)
            .map(|t| (t.state, t.reason.clone()))
            .unwrap_or((ModelAvailability::Unavailable, String::new()))
    }

    /// What runs model `m`'s GPUs, as the scheduler last told.
    pub(super) fn devices(&self, m: usize) -> DeviceCounts {
        let s = self.states.lock().expect("model states lock");
        s.devices.get(m).copied().unwrap_or_default()
    }

    /// Where model `m`'s items stand, for a waiter to judge only those
    /// that come after.
    #[cfg(test)]
    fn mark(&self, m: usize) -> Mark {
        let s = self.states.lock().expect("model states lock");
        s.state.get(m).map_or(Mark::default(), |t| t.mark)
    }

    /// The end of a load (`load`) or unload of model `m` (`name`) asked at
    /// `before`, by the items heard since: None while it has not ended.
    fn outcome(
        &self,
        m: usize,
        name: &str,
        load: bool,
        before: Mark,
    ) -> Option<Result<(), String>> {
        use ModelAvailability::*;
        let s = self.states.lock().expect("model states lock");
        let t = s.state.get(m)?;
        if t.mark.heard <= before.heard {
            return None;
        }
        if !t.reason.is_empty() {
            return Some(Err(t.reason.clone()));
        }
        match (load, t.state) {
            (true, Ready) | (false, Unavailable) => Some(Ok(())),
            (true, Unavailable) if t.mark.moved > before.moved.max(t.moved_at_join) => {
                Some(Err(format!("model '{name}' was unloaded while it loaded")))
            }
            _ => None,
        }
    }

    /// A waiter on model `m` begins (`load` is what it asked): the mark it
    /// judges from.
    fn begin(&self, m: usize, load: bool) -> Mark {
        let mut s = self.states.lock().expect("model states lock");
        if let Some(o) = s.open.get_mut(m) {
            o.waiting += 1;
            o.load = load;
        }
        s.state.get(m).map_or(Mark::default(), |t| t.mark)
    }

    /// A waiter on model `m` ended (answered, timed out, or its client gone).
    fn end(&self, m: usize) {
        let mut s = self.states.lock().expect("model states lock");
        if let Some(o) = s.open.get_mut(m) {
            o.waiting = o.waiting.saturating_sub(1);
        }
    }

    /// The frontend joined a scheduler: loads waited for are judged by what
    /// it says from now on (see [`Told::moved_at_join`]).
    pub(super) fn joined(&self) {
        let mut s = self.states.lock().expect("model states lock");
        for t in &mut s.state {
            t.moved_at_join = t.mark.moved;
        }
    }

    /// The loads and unloads still waited for, one per model (the last
    /// asked), to ask a new scheduler again.
    pub(super) fn open_requests(&self) -> Vec<(ModelId, bool)> {
        let s = self.states.lock().expect("model states lock");
        s.open
            .iter()
            .enumerate()
            .filter(|(_, o)| o.waiting > 0)
            .map(|(m, o)| (ModelId(m as u32), o.load))
            .collect()
    }

    fn apply(&self, items: &[ModelStateItem]) {
        {
            let mut s = self.states.lock().expect("model states lock");
            for i in items {
                if let Some(t) = s.state.get_mut(i.model.idx()) {
                    t.state = i.state;
                    // A model's reason is bounded like every wire string;
                    // kept short for the index.
                    t.reason = i.reason.chars().take(512).collect();
                    t.mark.heard += 1;
                    t.mark.moved += u64::from(i.state != ModelAvailability::Unavailable);
                }
                if let Some(d) = s.devices.get_mut(i.model.idx()) {
                    *d = i.devices;
                }
            }
        }
        self.version.send_modify(|v| *v += 1);
    }
}

impl Loop {
    /// `ModelStates` from the scheduler.
    pub(super) fn model_states(&mut self, items: Vec<ModelStateItem>) {
        for i in &items {
            tracing::info!(model = i.model.0, state = i.state.triton_name(), reason = %i.reason, "frontend: model state");
        }
        self.state.control.apply(&items);
    }

    /// Relays the loads and unloads clients asked for.
    pub(super) fn control_requests(&mut self) {
        while let Ok((model, load)) = self.state.control.inbox.try_recv() {
            if !self.sched_ok() {
                let item = ModelStateItem {
                    model,
                    state: self.state.control.state(model.idx()).0,
                    reason: "the frontend has no scheduler".into(),
                    devices: self.state.control.devices(model.idx()),
                };
                self.state.control.apply(&[item]);
                continue;
            }
            let _ = self.sched.send(Msg::ModelControl { model, load });
        }
    }

    /// Asks the scheduler just joined for the loads and unloads still
    /// waited for (see the module's head).
    pub(super) fn ask_open_again(&mut self) {
        self.state.control.joined();
        for (model, load) in self.state.control.open_requests() {
            tracing::info!(
                model = model.0,
                load,
                "frontend: asking the scheduler again for a model load or unload"
            );
            let _ = self.sched.send(Msg::ModelControl { model, load });
        }
    }
}

impl FrontendHandle {
    /// What runs model `model`'s (index) GPUs: its home sub-cluster's GPUs
    /// in service, by kind, as the scheduler last told (all zero: none, or
    /// not told yet; an application has none of its own).
    pub fn model_devices(&self, model: usize) -> DeviceCounts {
        self.state.control.devices(model)
    }

    /// Model `model`'s (index) state under model control, and why it is
    /// unavailable when a load failed. Past the models come the
    /// applications (index `models().len() + k` is application k, as the
    /// HTTP and gRPC servers list them): one is ready when every model its
    /// steps run is, else it has the state of the first that is not.
    pub fn model_state(&self, model: usize) -> (ModelAvailability, String) {
        let n = self.models().len();
        let Some(app) = model.checked_sub(n).and_then(|k| self.apps().get(k)) else {
            return self.state.control.state(model);
        };
        for m in app.step_models() {
            let (st, reason) = self.state.control.state(m);
            if st != ModelAvailability::Ready {
                let name = &self.models()[m].name;
                let why = if reason.is_empty() {
                    format!("its model '{name}' is not loaded")
                } else {
                    format!("its model '{name}': {reason}")
                };
                return (st, why);
            }
        }
        (ModelAvailability::Ready, String::new())
    }

    /// Loads (`load`) or unloads model `model` (index) through the
    /// scheduler, waiting up to `wait` for the outcome: a load ends when the
    /// model is ready, an unload once it is unloaded (its requests taken
    /// before the unload finished first). Err: the scheduler's reason (model
    /// control off, a failed load), a timeout, or no scheduler.
    pub async fn control_model(
        &self,
        model: usize,
        load: bool,
        wait: Duration,
    ) -> Result<(), String> {
        let c = &self.state.control;
        if let Some(app) = model
            .checked_sub(self.models().len())
            .and_then(|k| self.apps().get(k))
        {
            return Err(format!(
                "'{}' is an application: load and unload the models its steps run",
                app.meta.name
            ));
        }
        if model >= self.models().len() {
            return Err(format!("no model {model}"));
        }
        if self.state.stopped.load(Ordering::Acquire) {
            return Err("the frontend is stopping".into());
        }
        let mut rx = c.version.subscribe();
        let before = c.begin(model, load);
        // Ends the wait however this future ends (a client that goes away
        // drops it).
        struct Waiting<'a>(&'a ControlShared, usize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.end(self.1);
            }
        }
        let _waiting = Waiting(c, model);
        c.requests
            .try_send((ModelId(model as u32), load))
            .map_err(|_| "too many model loads and unloads at once; try again".to_string())?;
        let name = &self.models()[model].name;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(r) = c.outcome(model, name, load, before) {
                return r;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err("the frontend stopped".into()),
                Err(_) => {
                    let what = if load { "load" } else { "unload" };
                    return Err(format!(
                        "the {what} of model '{name}' did not finish within {wait:?} (its state: {})",
                        c.state(model).0.triton_name()
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(m: u32, state: ModelAvailability, reason: &str) -> ModelStateItem {
        ModelStateItem {
            model: ModelId(m),
            state,
            reason: reason.into(),
            devices: DeviceCounts::default(),
        }
    }

    /// An item the scheduler sent before it took a load (the model still
    /// unavailable) does not end the load; the load ends ready, or as
    /// unloaded once the model was heard loading, or with the scheduler's
    /// reason.
    #[test]
    fn a_load_is_judged_by_the_items_after_the_scheduler_took_it() {
        use ModelAvailability::*;
        let c = ControlShared::new(2);
        c.apply(&[item(1, Unavailable, "")]);
        let before = c.mark(1);
        assert_eq!(c.outcome(1, "b", true, before), None, "nothing heard yet");
        c.apply(&[item(1, Unavailable, "")]);
        assert_eq!(
            c.outcome(1, "b", true, before),
            None,
            "sent before the load was taken"
        );
        c.apply(&[item(0, Ready, "")]);
        assert_eq!(
            c.outcome(1, "b", true, before),
            None,
            "another model's item"
        );
        c.apply(&[item(1, Loading, "")]);
        assert_eq!(c.outcome(1, "b", true, before), None);
        c.apply(&[item(1, Ready, "")]);
        assert_eq!(c.outcome(1, "b", true, before), Some(Ok(())));

        // Loading, then unloaded (both heard before the waiter looks).
        let before = c.mark(1);
        c.apply(&[item(1, Unavailable, "")]);
        let again = c.mark(1);
        c.apply(&[item(1, Loading, "")]);
        c.apply(&[item(1, Unavailable, "")]);
        assert_eq!(
            c.outcome(1, "b", true, again),
            Some(Err("model 'b' was unloaded while it loaded".into()))
        );
        // An unload ends once unavailable, whatever came before.
        assert_eq!(c.outcome(1, "b", false, before), Some(Ok(())));

        // The scheduler's reason ends it at once.
        let before = c.mark(1);
        c.apply(&[item(1, Unavailable, "no GPU can hold it")]);
        assert_eq!(
            c.outcome(1, "b", true, before),
            Some(Err("no GPU can hold it".into()))
        );
    }

    /// The loads and unloads still waited for are one per model, the last
    /// asked, until every waiter on it ended.
    #[test]
    fn the_open_requests_are_those_still_waited_for() {
        let c = ControlShared::new(3);
        assert!(c.open_requests().is_empty());
        c.begin(2, true);
        c.begin(0, true);
        c.begin(0, false);
        assert_eq!(
            c.open_requests(),
            vec![(ModelId(0), false), (ModelId(2), true)]
        );
        c.end(0);
        assert_eq!(
            c.open_requests(),
            vec![(ModelId(0), false), (ModelId(2), true)],
            "one waiter on model 0 left"
        );
        c.end(0);
        c.end(2);
        assert!(c.open_requests().is_empty());
        c.end(2);
        assert!(c.open_requests().is_empty(), "an extra end is harmless");
    }

    /// A load heard loading at one scheduler, then asked again of the one
    /// the frontend joins: that one's first "unavailable" does not end it,
    /// an unload there after it was heard loading does.
    #[test]
    fn a_load_asked_again_is_judged_by_the_scheduler_joined() {
        use ModelAvailability::*;
        let c = ControlShared::new(1);
        c.apply(&[item(0, Unavailable, "")]);
        let before = c.begin(0, true);
        c.apply(&[item(0, Loading, "")]);
        c.joined();
        c.apply(&[item(0, Unavailable, "")]);
        assert_eq!(
            c.outcome(0, "a", true, before),
            None,
            "the new one's first word"
        );
        c.apply(&[item(0, Loading, "")]);
        assert_eq!(c.outcome(0, "a", true, before), None);
        c.apply(&[item(0, Unavailable, "")]);
        assert_eq!(
            c.outcome(0, "a", true, before),
            Some(Err("model 'a' was unloaded while it loaded".into()))
        );
        c.apply(&[item(0, Ready, "")]);
        assert_eq!(c.outcome(0, "a", true, before), Some(Ok(())));
    }
}
