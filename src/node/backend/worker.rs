//! A GPU slot's worker (thread `gpu{g}-worker`, or `gpu{g}l{l}-worker` for a
//! lane: each lane runs one batch at a time, see [`super::lanes`]): takes the pulled plans in `exec_at`
//! order, sleeps until just before a plan's start and spins, runs the batch on the
//! executor (late tasks and missing inputs left out, see [`cut_batch`]), sends
//! the results to the frontends and `PlanDone` to the scheduler, counts the
//! outcome; installs and unloads models between batches. A model is opened
//! off the worker, on the GPU slot's loader (thread `{name}-loader`,
//! [`spawn_loader`]), so the GPU goes on running its other models' batches
//! while one loads; only an executor without a loader loads on the worker.

use super::channels::{send_counted, LoadJob, LoadSeq, Pulled, WorkerMsg};
use super::shared::Shared;
use crate::node::exec::isolate::run_isolating;
use crate::node::exec::stage::Staged;
use crate::node::exec::{Executor, Loader, Prepared};
use crate::node::proto::backend::{
    cut_batch, planned_profile, settle, Cut, Input, Missing, PlanMsg, PlanQueue, Settled,
};
use crate::wire::ModelId;
use crate::wire::{Msg, PlanStatus};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Nice value of the GPU worker threads (best effort): they sleep until a batch's
/// planned start and must win the CPU then.
const WORKER_NICE: i32 = -10;

/// A worker sleeps until this long before a batch's start, then spins.
const SPIN: Duration = Duration::from_micros(100);

/// Starts the worker of GPU slot `slot` (thread `{name}-worker`) on `exec`.
/// With a loader, `discard` goes to it: what an unload frees is freed there.
pub(super) fn spawn(
    name: &str,
    slot: u32,
    sh: Arc<Shared>,
    exec: Box<dyn Executor>,
    rx: Receiver<WorkerMsg>,
    discard: Option<Sender<Prepared>>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("{name}-worker"))
        .spawn(move || {
            crate::runtime::pin::set_timer_slack_ns(1);
            crate::runtime::pin::set_thread_nice(WORKER_NICE);
            worker(sh, slot, exec, rx, discard)
        })
}

/// Starts the loader of GPU slot `name` (thread `{name}-loader`): opens each
/// model of `jobs` with `loader` and hands it to the slot's worker (`worker`),
/// which installs it between batches; frees what the worker unloaded
/// (`discards`: dropping a model's sessions and giving its memory back to the
/// system takes milliseconds). Loads run one at a time, in order, at the
/// default priority (below the worker's: a load must not take the CPU from the
/// batches it no longer blocks). It stops when `jobs` is closed.
pub(super) fn spawn_loader(
    name: &str,
    sh: Arc<Shared>,
    loader: Arc<dyn Loader>,
    jobs: Receiver<LoadJob>,
    discards: Receiver<Prepared>,
    worker: Sender<WorkerMsg>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("{name}-loader"))
        .spawn(move || loop {
            crossbeam_channel::select! {
                recv(jobs) -> job => {
                    let Ok((model, seq, ack)) = job else { break };
                    if sh.dead.load(Ordering::Acquire) {
                        break;
                    }
                    let r = loader.prepare(&model).map_err(|e| format!("{e:#}"));
                    let m = WorkerMsg::Install(model, seq, r, ack);
                    if !send_counted(&worker, m, &sh.channel_waits) {
                        break;
                    }
                }
                recv(discards) -> p => {
                    if let Ok(p) = p {
                        loader.discard(p);
                    }
                }
            }
        })
}

/// Frees `p` on the loader (`discard`), or here when it has no room.
fn discard_off(discard: Option<&Sender<Prepared>>, p: Prepared) {
    if let Some(d) = discard {
        // Full or gone: dropped here instead.
        let _ = d.try_send(p);
    }
}

/// Runs one GPU: plans in `exec_at` order ([`PlanQueue`]; a plan that arrives
/// while the worker waits for a later one goes first), installs and unloads
/// models between batches. It sleeps until just before a plan's start, then
/// spins.
fn worker(
    sh: Arc<Shared>,
    slot: u32,
    mut exec: Box<dyn Executor>,
    rx: Receiver<WorkerMsg>,
    discard: Option<Sender<Prepared>>,
) {
    let mut queue: PlanQueue<Pulled> = PlanQueue::default();
    // The load of each model its loader is on (see `WorkerMsg::Loading`).
    let mut loading: HashMap<ModelId, LoadSeq> = HashMap::new();
    loop {
        let msg = match queue.next_at() {
            None => match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => break,
            },
            Some(at) => {
                let wake = sh
                    .clock
                    .instant_of(at)
                    .checked_sub(SPIN)
                    .unwrap_or(Instant::now());
                match rx.recv_deadline(wake) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
                        None
                    }
                }
            }
        };
        if let Some(m) = msg {
            for m in std::iter::once(m).chain(rx.try_iter()) {
                let d = discard.as_ref();
                receive(&sh, exec.as_mut(), &mut queue, &mut loading, d, m);
            }
            continue;
        }
        if let Some(at) = queue.next_at() {
            let at = sh.clock.instant_of(at);
            while Instant::now() < at {
                std::hint::spin_loop();
            }
        }
        if let Some((session, plan, inputs, staged)) = queue.pop_due(sh.clock.now()) {
            if !sh.current(session) {
                void(&sh, &plan);
            } else if !sh.dead.load(Ordering::Acquire) {
                run_plan(&sh, slot, exec.as_mut(), session, plan, inputs, staged);
            }
        }
    }
}

/// One message to the worker: a load, install or unload now, a plan into the
/// queue.
fn receive(
    sh: &Shared,
    exec: &mut dyn Executor,
    queue: &mut PlanQueue<Pulled>,
    loading: &mut HashMap<ModelId, LoadSeq>,
    discard: Option<&Sender<Prepared>>,
    m: WorkerMsg,
) {
    match m {
        WorkerMsg::Load(model, seq, ack) => {
            let r = exec
                .load(&model)
                .map(|()| exec.device_bytes(model.id))
                .map_err(|e| format!("{e:#}"));
            send_counted(&ack, (model.id, seq, r), &sh.channel_waits);
        }
        WorkerMsg::Loading(model, seq) => {
            loading.insert(model, seq);
        }
        WorkerMsg::Install(model, seq, r, ack) => {
            if loading.get(&model.id) != Some(&seq) {
                // Unloaded, or loaded again, while it loaded: the scheduler
                // no longer waits for this load (nor counts its answer).
                if let Ok(p) = r {
                    discard_off(discard, p);
                }
                return;
            }
            loading.remove(&model.id);
            let r = r.and_then(|p| {
                exec.install(&model, p)
                    .map(|()| exec.device_bytes(model.id))
                    .map_err(|e| format!("{e:#}"))
            });
            send_counted(&ack, (model.id, seq, r), &sh.channel_waits);
        }
        WorkerMsg::Confirm(model, seq, ack) => {
            send_counted(
                &ack,
                (model, seq, Ok(exec.device_bytes(model))),
                &sh.channel_waits,
            );
        }
        WorkerMsg::Unload(model) => {
            loading.remove(&model);
            // An executor without a loader frees it here (`detach`'s default).
            if let Some(p) = exec.detach(model) {
                discard_off(discard, p);
            }
        }
        WorkerMsg::Run(session, plan, ..) if !sh.current(session) => void(sh, &plan),
        WorkerMsg::Run(session, plan, inputs, staged) => {
            queue.push(plan.exec_at, (session, plan, inputs, staged))
        }
    }
}

/// A plan of a scheduler session that ended is not run: that scheduler failed
/// its tasks at their frontends when it lost this backend (or its frontends
/// failed them when they lost it), and a new scheduler knows nothing of it, so
/// running it would take GPU time the new plans were given.
fn void(sh: &Shared, plan: &PlanMsg) {
    sh.plans_void.fetch_add(1, Ordering::Relaxed);
    sh.plans_ended.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(
        plan = plan.id.0,
        "backend: a plan of a lost scheduler is not run"
    );
}

/// Runs a due plan (see [`cut_batch`]: late tasks and missing inputs are left
/// out), reports to the frontends and the scheduler, recycles the input buffers
/// (a staged buffer goes back to its pool when dropped).
fn run_plan(
    sh: &Shared,
    slot: u32,
    exec: &mut dyn Executor,
    session: u64,
    plan: PlanMsg,
    inputs: Vec<Result<Input, Missing>>,
    mut staged: Option<Staged>,
) {
    let start = sh.clock.now();
    let delay = (start - plan.exec_at).0.max(0);
    sh.start_delay.lock().expect("lock").push(delay);
    sh.start_delay_hist.observe(delay as u64);
    let present: Vec<bool> = inputs.iter().map(Result::is_ok).collect();
    let prof = sh.profiles.read().expect("lock").get(&plan.model).cloned();
    // Tasks are judged by the profile the scheduler planned with (scaled
    // where the model runs slower than profiled).
    let planned = prof
        .as_ref()
        .map(|p| planned_profile(p, plan.tasks.len(), plan.span));
    let mut cut = cut_batch(&plan.tasks, &present, start, planned.as_deref());
    cut.split_unread(|i| matches!(inputs[i], Err(Missing::Timeout)));
    let outputs = on_lane(sh, slot, || {
        execute(sh, exec, &plan, &cut, &inputs, staged.as_mut())
    });
    let finished = sh.clock.now();
    // The batch's time against the model's given profile (unscaled).
    let profiled = match (&prof, u32::try_from(cut.run.len())) {
        (Some(p), Ok(b)) if b > 0 => p.latency(b).0,
        _ => 0,
    };
    if profiled > 0 {
        let per_mille = (finished - start).0.saturating_mul(1000) / profiled;
        sh.run_over_profile.lock().expect("lock").push(per_mille);
        sh.run_over_profile_hist.observe(per_mille.max(0) as u64);
    }
    let settled = settle(&plan, &cut, start, finished, Ok(outputs));
    count(sh, &plan, &cut, &settled);
    sh.plans_ended.fetch_add(1, Ordering::Relaxed);
    if sh.dead.load(Ordering::Acquire) {
        return;
    }
    {
        let fes = sh.frontends.read().expect("lock");
        for (fe, items) in settled.results {
            if let Some(c) = fes.get(&fe) {
                let _ = c.send(Msg::Results { items });
            }
        }
    }
    // A report to a scheduler that was lost meanwhile would go to its
    // successor, which never sent this plan: it is not sent.
    if sh.current(session) {
        let _ = sh.sched().send(settled.done);
    }
    sh.recycle(inputs);
}

/// Runs `f` (a batch) on GPU slot `slot`, kept in the lane book while it runs.
fn on_lane<T>(sh: &Shared, slot: u32, f: impl FnOnce() -> T) -> T {
    let began = sh.lanes.lock().expect("lock").begin(slot);
    if let Err(b) = began {
        tracing::error!(
            gpu = b.gpu,
            lane = b.lane,
            "backend: a lane started a batch while it ran one"
        );
    }
    let edges = &sh.slot_edges[slot as usize];
    edges.fetch_add(1, Ordering::AcqRel);
    let out = f();
    edges.fetch_add(1, Ordering::AcqRel);
    if began.is_ok() {
        sh.lanes.lock().expect("lock").end(slot);
    }
    out
}

/// The outputs of the tasks `cut` runs (none run: no outputs), one per task:
/// when the executor fails the batch, the requests that fail it are found and
/// fail alone ([`run_isolating`]); the errors are logged. A staged batch runs
/// from its buffer (the rows of the tasks left out are closed up first).
fn execute(
    sh: &Shared,
    exec: &mut dyn Executor,
    plan: &PlanMsg,
    cut: &Cut,
    inputs: &[Result<Input, Missing>],
    staged: Option<&mut Staged>,
) -> Vec<Option<Vec<u8>>> {
    let gathered = |n: usize| {
        sh.input_bytes_gathered
            .fetch_add(n as u64, Ordering::Relaxed);
    };
    let refs: Vec<&[u8]> = match staged {
        Some(st) => {
            let n = cut.run.len();
            gathered(st.compact(&cut.run));
            match exec.run_staged(plan.model, st, n) {
                Ok(out) if out.len() == n => return out.into_iter().map(Some).collect(),
                Ok(out) => tracing::error!(
                    plan = plan.id.0,
                    batch = n,
                    outputs = out.len(),
                    "backend: a staged batch came back with the wrong number of outputs"
                ),
                // Run again request by request below, to find who fails it.
                Err(_) => {}
            }
            (0..n).map(|k| st.row(k)).collect()
        }
        None => cut
            .run
            .iter()
            .map(|&i| inputs[i].as_ref().expect("present").bytes())
            .collect(),
    };
    if exec.copies_inputs() {
        gathered(refs.iter().map(|r| r.len()).sum());
    }
    let mut first = true;
    let (out, st) = run_isolating(exec, plan.model, &refs, &mut |e| {
        if std::mem::take(&mut first) {
            tracing::error!(plan = plan.id.0, model = plan.model.0, batch = refs.len(), error = %format!("{e:#}"), "backend: the executor failed a batch; looking for the requests that fail it");
        }
    });
    if st.failed > 0 || st.reruns > 0 {
        sh.isolate_reruns
            .fetch_add(st.reruns as u64, Ordering::Relaxed);
        tracing::warn!(
            plan = plan.id.0,
            model = plan.model.0,
            batch = refs.len(),
            failed = st.failed,
            reruns = st.reruns,
            "backend: a failed batch rerun in parts: `failed` requests failed (alone, or undecided when the rerun budget ran out), the others got their outputs"
        );
    }
    out
}

/// Counts a batch's outcome.
fn count(sh: &Shared, plan: &PlanMsg, cut: &Cut, s: &Settled) {
    let add = |a: &AtomicU64, n: usize| a.fetch_add(n as u64, Ordering::Relaxed);
    add(&sh.tasks_too_late, cut.too_late.len());
    match s.status {
        PlanStatus::Ran => {
            add(&sh.plans_run, 1);
            add(&sh.tasks_run, s.ran);
            add(&sh.tasks_failed, cut.run.len() - s.ran);
            if let Some(h) = sh.batch_sizes.read().expect("lock").get(&plan.model) {
                h.observe(s.ran as u64);
            }
        }
        PlanStatus::TooLate => {
            add(&sh.plans_too_late, 1);
        }
        PlanStatus::Failed => {
            add(&sh.plans_failed, 1);
            add(&sh.tasks_failed, cut.run.len());
        }
    }
}
