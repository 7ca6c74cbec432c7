//! A GPU slot's puller (thread `gpu{g}-pull`, or `gpu{g}l{l}-pull` for a lane): reads each plan's inputs one-sided
//! from the frontends' regions as soon as the plan arrives, so the pull overlaps
//! the previous batch, then hands the plan to the GPU's worker. A model its
//! executor stages ([`crate::node::exec::stage`]) is pulled straight into the
//! buffer the batch runs from, one row per task.

use super::channels::{send_counted, Queued, WorkerMsg};
use super::shared::Shared;
use crate::core::Dur;
use crate::node::exec::stage::{StagePool, Staged};
use crate::node::proto::backend::{
    classify_head, classify_input, hopeless, pull_budget, pull_requests, Input, Missing, PlanMsg,
};
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Starts the puller of GPU slot `name` (`gpu{g}`, or `gpu{g}l{l}` for a lane),
/// with its executor's staging buffers (`stage`), if it lends any.
pub(super) fn spawn(
    name: &str,
    slot: u32,
    sh: Arc<Shared>,
    stage: Option<Arc<StagePool>>,
    rx: Receiver<Queued>,
    worker: Sender<WorkerMsg>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("{name}-pull"))
        .spawn(move || {
            crate::runtime::pin::set_thread_nice(PULLER_NICE);
            puller(sh, slot, stage, rx, worker)
        })
}

/// Nice value of the pullers (best effort), the GPU workers' own: a pull must
/// end before its batch's planned start, and a puller that loses the CPU to
/// busier threads makes the batch start late.
const PULLER_NICE: i32 = -10;

/// Pulls each plan's inputs as soon as it arrives, then hands it to the worker.
fn puller(
    sh: Arc<Shared>,
    slot: u32,
    stage: Option<Arc<StagePool>>,
    rx: Receiver<Queued>,
    worker: Sender<WorkerMsg>,
) {
    while let Ok((session, plan)) = rx.recv() {
        if sh.dead.load(Ordering::Acquire) {
            break;
        }
        // A void plan (its scheduler was lost) is not pulled; the worker drops it.
        let (inputs, staged) = if sh.current(session) {
            pull(&sh, slot, stage.as_ref(), &plan)
        } else {
            (Vec::new(), None)
        };
        let run = WorkerMsg::Run(session, plan, inputs, staged);
        if !send_counted(&worker, run, &sh.channel_waits) {
            break;
        }
    }
}

/// Reads `plan`'s inputs (an error: why one could not be read, counted by reason), for GPU
/// slot `slot`: into a staged buffer of `stage` when its executor stages the
/// plan's model, else each into a buffer of the pool.
fn pull(
    sh: &Shared,
    slot: u32,
    stage: Option<&Arc<StagePool>>,
    plan: &PlanMsg,
) -> (Vec<Result<Input, Missing>>, Option<Staged>) {
    let now = sh.clock.now();
    sh.lead_arrived
        .lock()
        .expect("lock")
        .push((plan.exec_at - now).0);
    let prof = sh.profiles.read().expect("lock").get(&plan.model).cloned();
    // The inputs of tasks already lost are not read (their tasks are
    // dropped as unread); the others may take until the batch's latest start.
    let skip = hopeless(plan, prof.as_ref(), now);
    let budget = pull_budget(plan, prof.as_ref(), now, &skip);
    let all = pull_requests(&plan.tasks);
    let kept: Vec<usize> = (0..all.len()).filter(|&i| !skip[i]).collect();
    let reqs: Vec<_> = kept.iter().map(|&i| all[i]).collect();
    let timeout = Duration::from_nanos(budget.0 as u64);
    // Rows by task, skipped ones included (the worker closes up the rows of
    // the tasks it leaves out).
    let mut staged = stage.and_then(|p| p.take(plan.model, plan.tasks.len()));
    let bufs = sh.take_buffers(reqs.len());
    let bytes: u64 = reqs.iter().map(|r| r.len as u64).sum();
    // The slot's batch edges before and after the pull: odd, or moved, means
    // the pull ran while the slot ran a batch (the one before this plan).
    let edges = &sh.slot_edges[slot as usize];
    let e0 = edges.load(Ordering::Acquire);
    let t0 = Instant::now();
    // Per task: a skipped one is unread, as one whose read timed out.
    let mut got: Vec<Result<Input, Missing>> = skip
        .iter()
        .map(|&s| Err(if s { Missing::Timeout } else { Missing::Error }))
        .collect();
    match staged.as_mut() {
        None => {
            let read = sh.reader.read_many_into(&reqs, timeout, bufs);
            for (r, &i) in read.into_iter().zip(&kept) {
                let t = &plan.tasks[i];
                // Each input stays in the slot it was read into (header first).
                got[i] = classify_input(r, t.id, t.cap);
            }
        }
        Some(st) => {
            // Each payload lands in its task's row: in process copied out of
            // the frontend's region, over TCP read and opened there. An input
            // of another size than the model's cannot be a row of its tensor.
            let row = st.row_bytes();
            let mut rows = st.rows_mut();
            let mut mine: Vec<&mut [u8]> =
                kept.iter().map(|&i| std::mem::take(&mut rows[i])).collect();
            let (read, in_place, back) = sh.reader.read_many_rows(&reqs, timeout, bufs, &mut mine);
            sh.give_buffers(back);
            for (r, &i) in read.into_iter().zip(&kept) {
                let t = &plan.tasks[i];
                got[i] = classify_head(r, t.id, t.cap, row).map(|()| Input {
                    slot: Vec::new(),
                    len: row,
                });
            }
            if !in_place {
                // Read into a buffer first, then copied into the row.
                let n: usize = got.iter().flatten().map(|i| i.len).sum();
                sh.input_bytes_gathered
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }
    let el = t0.elapsed();
    let overlapped = e0 % 2 == 1 || edges.load(Ordering::Acquire) != e0;
    let lead = plan.exec_at - sh.clock.now();
    sh.lead_pulled.lock().expect("lock").push(lead.0);
    if !reqs.is_empty() {
        sh.pull
            .lock()
            .expect("lock")
            .push(el.as_nanos() as i64 / reqs.len() as i64);
        sh.observe_pull(
            reqs.len(),
            bytes,
            Dur::from_std(el),
            lead < Dur::ZERO,
            overlapped,
        );
    }
    for (r, &skipped) in got.iter().zip(&skip) {
        match r {
            _ if skipped => sh.inputs_skipped.fetch_add(1, Ordering::Relaxed),
            Err(why) => sh.missing_why[*why as usize].fetch_add(1, Ordering::Relaxed),
            Ok(_) => 0,
        };
    }
    let landed: usize = got.iter().flatten().map(|i| i.len).sum();
    sh.input_bytes_pulled
        .fetch_add(landed as u64, Ordering::Relaxed);
    (got, staged)
}
