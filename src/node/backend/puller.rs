//! A GPU slot's puller (thread `gpu{g}-pull`, or `gpu{g}l{l}-pull` for a lane): reads each plan's inputs one-sided
//! from the frontends' regions as soon as the plan arrives, so the pull overlaps
//! the previous batch, then hands the plan to the GPU's worker.

use super::channels::{send_counted, Queued, WorkerMsg};
use super::shared::Shared;
use crate::core::Dur;
use crate::node::proto::backend::{classify_input, pull_budget, pull_requests, Input, PlanMsg};
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Starts the puller of GPU slot `name` (`gpu{g}`, or `gpu{g}l{l}` for a lane).
pub(super) fn spawn(
    name: &str,
    slot: u32,
    sh: Arc<Shared>,
    rx: Receiver<Queued>,
    worker: Sender<WorkerMsg>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("{name}-pull"))
        .spawn(move || {
            crate::runtime::pin::set_thread_nice(PULLER_NICE);
            puller(sh, slot, rx, worker)
        })
}

/// Nice value of the pullers (best effort), the GPU workers' own: a pull must
/// end before its batch's planned start, and a puller that loses the CPU to
/// busier threads makes the batch start late.
const PULLER_NICE: i32 = -10;

/// Pulls each plan's inputs as soon as it arrives, then hands it to the worker.
fn puller(sh: Arc<Shared>, slot: u32, rx: Receiver<Queued>, worker: Sender<WorkerMsg>) {
    while let Ok((session, plan)) = rx.recv() {
        if sh.dead.load(Ordering::Acquire) {
            break;
        }
        // A void plan (its scheduler was lost) is not pulled; the worker drops it.
        let inputs = if sh.current(session) {
            pull(&sh, slot, &plan)
        } else {
            Vec::new()
        };
        let run = WorkerMsg::Run(session, plan, inputs);
        if !send_counted(&worker, run, &sh.channel_waits) {
            break;
        }
    }
}

/// Reads `plan`'s inputs (None: could not be read, counted by reason), for GPU
/// slot `slot`.
fn pull(sh: &Shared, slot: u32, plan: &PlanMsg) -> Vec<Option<Input>> {
    let reqs = pull_requests(&plan.tasks);
    // Reads may take until the batch's latest start.
    let now = sh.clock.now();
    sh.lead_arrived
        .lock()
        .expect("lock")
        .push((plan.exec_at - now).0);
    let prof = sh.profiles.read().expect("lock").get(&plan.model).cloned();
    let budget = pull_budget(plan, prof.as_ref(), now);
    let bufs = sh.take_buffers(reqs.len());
    let bytes: u64 = reqs.iter().map(|r| r.len as u64).sum();
    // The slot's batch edges before and after the pull: odd, or moved, means
    // the pull ran while the slot ran a batch (the one before this plan).
    let edges = &sh.slot_edges[slot as usize];
    let e0 = edges.load(Ordering::Acquire);
    let t0 = Instant::now();
    let got = sh
        .reader
        .read_many_into(&reqs, Duration::from_nanos(budget.0 as u64), bufs);
    let el = t0.elapsed();
    let overlapped = e0 % 2 == 1 || edges.load(Ordering::Acquire) != e0;
    let lead = plan.exec_at - sh.clock.now();
    sh.lead_pulled.lock().expect("lock").push(lead.0);
    if !plan.tasks.is_empty() {
        sh.pull
            .lock()
            .expect("lock")
            .push(el.as_nanos() as i64 / plan.tasks.len() as i64);
        sh.observe_pull(
            reqs.len(),
            bytes,
            Dur::from_std(el),
            lead < Dur::ZERO,
            overlapped,
        );
    }
    // Each input stays in the slot it was read into (header first): no copy.
    let inputs: Vec<Option<Input>> = got
        .into_iter()
        .zip(&plan.tasks)
        .map(|(r, t)| {
            classify_input(r, t.id, t.cap)
                .map_err(|why| sh.missing_why[why as usize].fetch_add(1, Ordering::Relaxed))
                .ok()
        })
        .collect();
    let landed: usize = inputs.iter().flatten().map(|i| i.len).sum();
    sh.input_bytes_pulled
        .fetch_add(landed as u64, Ordering::Relaxed);
    inputs
}
