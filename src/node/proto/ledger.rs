//! A frontend's pending-request ledger as a pure state machine: every admitted
//! request ends exactly once — good, late, dropped or failed — by the first of its
//! answer (a result, a drop notice), a failure the driver reports (scheduler
//! lost, stopping) and the last-resort sweep at its deadline plus the grace.
//! Times are on the scheduler's clock; the sweep is a timer as data
//! ([`RequestLedger::poll_timeout`]).

use crate::core::{Dur, ModelId, TaskId, Time};
use crate::transport::InputRef;
use crate::wire::{task_id, DropReason, NodeId, Outcome, SubmitTask, TaskResult, TaskStatus};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// How a request ended, finer than its [`Outcome`] (what the HTTP API maps to
/// status codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Output by the deadline.
    Good,
    /// Output after the deadline.
    Late,
    /// The scheduler or a backend gave up on it (the reason; `NoGpu` also when the
    /// frontend knew no GPU was in service).
    Dropped(DropReason),
    /// No answer by the deadline plus the frontend's grace.
    TimedOut,
    /// Refused by the frontend: unknown model, bad SLO.
    BadRequest,
    /// The input region is full (too many requests in flight) or the input too large.
    RegionFull,
    /// The frontend has no scheduler (lost, or stopping).
    NoScheduler,
    /// The backend running it was lost.
    BackendLost,
    /// The backend could not read its input or run it.
    Failed,
}

impl Ended {
    /// The request's outcome: what a wire client is told and what is counted.
    pub fn outcome(self) -> Outcome {
        match self {
            Ended::Good => Outcome::Good,
            Ended::Late => Outcome::Late,
            Ended::Dropped(_) => Outcome::Dropped,
            _ => Outcome::Failed,
        }
    }
}

/// What answered a pending request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Its output, with the batch's start and end (scheduler clock) and size.
    Output {
        output: Vec<u8>,
        started: Time,
        finished: Time,
        batch_size: u32,
    },
    Dropped(DropReason),
    Failed(Ended, String),
}

impl Answer {
    /// A backend's result for one task.
    pub fn of_result(r: TaskResult) -> Answer {
        match r.status {
            TaskStatus::Ok => Answer::Output {
                output: r.output,
                started: r.started,
                finished: r.finished,
                batch_size: r.batch_size,
            },
            TaskStatus::Dropped(code) => Answer::Dropped(code),
            TaskStatus::InputMissing => {
                Answer::Failed(Ended::Failed, "the backend could not read the input".into())
            }
            TaskStatus::Failed => {
                Answer::Failed(Ended::Failed, "the backend failed to run the batch".into())
            }
        }
    }

    /// The scheduler's drop notice for one task.
    pub fn of_drop(code: DropReason) -> Answer {
        match code {
            // Lost with its backend: an explicit failure, not a scheduling decision.
            DropReason::BackendLost => {
                Answer::Failed(Ended::BackendLost, "the backend running it was lost".into())
            }
            c => Answer::Dropped(c),
        }
    }
}

/// A request that ended: everything the driver needs to answer its client.
#[derive(Debug)]
pub struct Finished<C> {
    pub id: TaskId,
    pub client: C,
    /// The model's index in the frontend's list.
    pub model: usize,
    /// Its slot in the region, to release.
    pub input: InputRef,
    pub ended: Ended,
    pub output: Vec<u8>,
    /// Why it was not good (empty when it was).
    pub message: String,
    /// From admission to the end.
    pub latency: Dur,
    /// From admission to the batch's start (zero when it did not run).
    pub queue: Dur,
    pub batch_size: u32,
    /// When its batch ended on the GPU (scheduler clock), when it ran.
    pub finished: Option<Time>,
    /// Its batch's run time on the GPU as its backend reported it (from the
    /// batch's start to its end; zero when it did not run).
    pub run: Dur,
}

struct Pending<C> {
    client: C,
    model: usize,
    arrival: Time,
    deadline: Time,
    input: InputRef,
    /// The task's capability: a result must carry it.
    cap: u64,
}

/// What the ledger counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LedgerCounts {
    pub admitted: u64,
    pub good: u64,
    pub late: u64,
    pub dropped: u64,
    pub failed: u64,
    /// Of `failed`: no answer by deadline + grace.
    pub timed_out: u64,
    /// Answers for requests that had already ended (ignored).
    pub stray_answers: u64,
    /// Results for pending requests with another capability than theirs
    /// (refused: not from the backend the task was planned on).
    pub forged_results: u64,
    /// Requests held while the scheduler was lost ([`RequestLedger::orphan_all`])
    /// and handed to the next one under a new id ([`RequestLedger::readmit`]).
    pub retried: u64,
}

/// A pending request taken out of the ledger while the frontend has no
/// scheduler ([`RequestLedger::orphan_all`]): it waits for the next scheduler
/// ([`RequestLedger::readmit`]) or ends ([`RequestLedger::end_orphan`]). Its
/// times are on the lost scheduler's clock.
#[derive(Debug)]
pub struct Orphan<C> {
    pub id: TaskId,
    pub client: C,
    /// The model's index in the frontend's list.
    pub model: usize,
    pub arrival: Time,
    pub deadline: Time,
    pub input: InputRef,
    pub cap: u64,
}

/// The pending requests of one frontend; `C` is how the driver reaches a client.
pub struct RequestLedger<C> {
    node: NodeId,
    grace: Dur,
    next_seq: u64,
    pending: HashMap<TaskId, Pending<C>>,
    /// (deadline + grace, task) for the sweep.
    timeouts: BinaryHeap<Reverse<(Time, TaskId)>>,
    counts: LedgerCounts,
}

impl<C> RequestLedger<C> {
    /// The ledger of frontend `node`; a request unanswered by its deadline plus
    /// `grace` fails.
    pub fn new(node: NodeId, grace: Dur) -> RequestLedger<C> {
        RequestLedger {
            node,
            grace,
            next_seq: 0,
            pending: HashMap::new(),
            timeouts: BinaryHeap::new(),
            counts: LedgerCounts::default(),
        }
    }

    /// The frontend's node id from now on (it registered again and was given a
    /// new one): new requests' ids carry it; pending ones keep theirs, so their
    /// answers still match. Sequence numbers go on, so no id is given twice.
    pub fn set_node(&mut self, node: NodeId) {
        self.node = node;
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn counts(&self) -> LedgerCounts {
        self.counts
    }

    pub fn contains(&self, id: TaskId) -> bool {
        self.pending.contains_key(&id)
    }

    /// The id the next admitted request gets.
    pub fn next_id(&self) -> TaskId {
        task_id(self.node, self.next_seq + 1)
    }

    /// Admits a request that arrived at `now` (the frontend's receipt of its
    /// first byte: the client's SLO runs from there) for model `model` (index;
    /// `model_id` its scheduler id) with a checked `slo`, its input at `input`
    /// readable with capability `cap` (which its result must carry, see
    /// [`RequestLedger::result`]); returns the task to submit. The deadline
    /// saturates, so no SLO can wrap it.
    #[allow(clippy::too_many_arguments)]
    pub fn admit(
        &mut self,
        now: Time,
        model: usize,
        model_id: ModelId,
        slo: Dur,
        client: C,
        input: InputRef,
        cap: u64,
    ) -> SubmitTask {
        self.counts.admitted += 1;
        let p = Pending {
            client,
            model,
            arrival: now,
            deadline: now + slo,
            input,
            cap,
        };
        self.enter(p, model_id)
    }

    /// Enters `p` as pending under the next id, with its sweep; its task.
    fn enter(&mut self, p: Pending<C>, model_id: ModelId) -> SubmitTask {
        self.next_seq += 1;
        let id = task_id(self.node, self.next_seq);
        let task = SubmitTask {
            id,
            model: model_id,
            arrival: p.arrival,
            deadline: p.deadline,
            input: p.input.pack(),
            cap: p.cap,
        };
        self.timeouts.push(Reverse((p.deadline + self.grace, id)));
        self.pending.insert(id, p);
        task
    }

    /// A backend's result for a request: ends it when it carries the request's
    /// capability (only the scheduler and the backend the task was planned on
    /// were given it); one with another capability is refused and counted
    /// (`forged_results`), and the request goes on waiting for its real answer.
    pub fn result(&mut self, now: Time, r: TaskResult) -> Option<Finished<C>> {
        if let Some(p) = self.pending.get(&r.id) {
            if p.cap != r.cap {
                self.counts.forged_results += 1;
                return None;
            }
        }
        let id = r.id;
        self.finish(now, id, Answer::of_result(r))
    }

    /// Request `id` is answered at `now`; None when it had already ended.
    pub fn finish(&mut self, now: Time, id: TaskId, answer: Answer) -> Option<Finished<C>> {
        let Some(p) = self.pending.remove(&id) else {
            self.counts.stray_answers += 1;
            return None;
        };
        let mut run = Dur::ZERO;
        let (ended, output, message, queue, batch_size, finished) = match answer {
            Answer::Output {
                output,
                started,
                finished,
                batch_size,
            } => {
                let queue = (started - p.arrival).max(Dur::ZERO);
                let ran = Some(finished);
                run = (finished - started).max(Dur::ZERO);
                if now <= p.deadline {
                    self.counts.good += 1;
                    (Ended::Good, output, String::new(), queue, batch_size, ran)
                } else {
                    self.counts.late += 1;
                    let why = "result arrived after the deadline".to_string();
                    (Ended::Late, output, why, queue, batch_size, ran)
                }
            }
            Answer::Dropped(code) => {
                self.counts.dropped += 1;
                let why = format!("dropped by the scheduler: {code:?}");
                (Ended::Dropped(code), Vec::new(), why, Dur::ZERO, 0, None)
            }
            Answer::Failed(ended, why) => {
                self.counts.failed += 1;
                (ended, Vec::new(), why, Dur::ZERO, 0, None)
            }
        };
        Some(Finished {
            id,
            client: p.client,
            model: p.model,
            input: p.input,
            ended,
            output,
            message,
            latency: (now - p.arrival).max(Dur::ZERO),
            queue,
            batch_size,
            finished,
            run,
        })
    }

    /// When the sweep is next due.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timeouts.peek().map(|r| r.0 .0)
    }

    /// The sweep: requests with no answer by their deadline plus the grace fail.
    pub fn handle_timeout(&mut self, now: Time) -> Vec<Finished<C>> {
        let mut out = Vec::new();
        while let Some(&Reverse((t, id))) = self.timeouts.peek() {
            if t > now {
                break;
            }
            self.timeouts.pop();
            if self.pending.contains_key(&id) {
                self.counts.timed_out += 1;
                let why = "no result by the deadline plus grace".to_string();
                out.extend(self.finish(now, id, Answer::Failed(Ended::TimedOut, why)));
            }
        }
        out
    }

    /// Takes every pending request out, in id order, to hand to the next
    /// scheduler: the lost one's plans for them are void, and its clock with
    /// them. They are not ended; the caller readmits or ends each.
    pub fn orphan_all(&mut self) -> Vec<Orphan<C>> {
        let mut ids: Vec<TaskId> = self.pending.keys().copied().collect();
        ids.sort_unstable();
        self.timeouts.clear();
        ids.into_iter()
            .filter_map(|id| {
                let p = self.pending.remove(&id)?;
                Some(Orphan {
                    id,
                    client: p.client,
                    model: p.model,
                    arrival: p.arrival,
                    deadline: p.deadline,
                    input: p.input,
                    cap: p.cap,
                })
            })
            .collect()
    }

    /// Takes a request that arrived at `now` (as [`RequestLedger::admit`])
    /// while the frontend has no scheduler to submit it to: it is held as an
    /// orphan from the start, under an id of its own, and waits for the next
    /// scheduler ([`RequestLedger::readmit`]) or ends
    /// ([`RequestLedger::end_orphan`]) like those pending at the loss.
    pub fn hold(
        &mut self,
        now: Time,
        model: usize,
        slo: Dur,
        client: C,
        input: InputRef,
        cap: u64,
    ) -> Orphan<C> {
        self.counts.admitted += 1;
        self.next_seq += 1;
        Orphan {
            id: task_id(self.node, self.next_seq),
            client,
            model,
            arrival: now,
            deadline: now + slo,
            input,
            cap,
        }
    }

    /// Admits orphan `o` again under a new id, with its arrival and deadline
    /// on the new scheduler's clock; the task to submit (same input, same
    /// capability). A result for its old id is a stray from then on.
    pub fn readmit(
        &mut self,
        o: Orphan<C>,
        model_id: ModelId,
        arrival: Time,
        deadline: Time,
    ) -> SubmitTask {
        self.counts.retried += 1;
        let p = Pending {
            client: o.client,
            model: o.model,
            arrival,
            deadline,
            input: o.input,
            cap: o.cap,
        };
        self.enter(p, model_id)
    }

    /// Orphan `o` ends without a scheduler (`ended`, `why`; `latency` from its
    /// arrival): counted as failed.
    pub fn end_orphan(
        &mut self,
        o: Orphan<C>,
        ended: Ended,
        why: &str,
        latency: Dur,
    ) -> Finished<C> {
        self.counts.failed += 1;
        Finished {
            id: o.id,
            client: o.client,
            model: o.model,
            input: o.input,
            ended,
            output: Vec::new(),
            message: why.to_string(),
            latency: latency.max(Dur::ZERO),
            queue: Dur::ZERO,
            batch_size: 0,
            finished: None,
            run: Dur::ZERO,
        }
    }

    /// Every pending request fails (`ended`, `why`): the scheduler is lost or
    /// the frontend stops. In id order.
    pub fn fail_all(&mut self, now: Time, ended: Ended, why: &str) -> Vec<Finished<C>> {
        let mut ids: Vec<TaskId> = self.pending.keys().copied().collect();
        ids.sort_unstable();
        self.timeouts.clear();
        ids.into_iter()
            .filter_map(|id| self.finish(now, id, Answer::Failed(ended, why.to_string())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> InputRef {
        InputRef { offset: 0, len: 64 }
    }

    #[test]
    fn each_request_ends_once_by_the_first_answer() {
        let mut l: RequestLedger<u32> = RequestLedger::new(3, Dur::from_ms(100));
        let t0 = Time(1_000);
        let a = l.admit(t0, 0, ModelId(0), Dur::from_ms(10), 7, input(), 11);
        let b = l.admit(t0, 1, ModelId(5), Dur::from_ms(10), 8, input(), 12);
        assert_eq!(crate::wire::task_owner(a.id), 3);
        assert_eq!(b.model, ModelId(5));
        assert_eq!(a.deadline, t0 + Dur::from_ms(10));
        let out = Answer::Output {
            output: vec![1],
            started: t0 + Dur::from_ms(2),
            finished: t0 + Dur::from_ms(3),
            batch_size: 4,
        };
        let f = l.finish(t0 + Dur::from_ms(5), a.id, out.clone()).unwrap();
        assert_eq!((f.ended, f.client, f.batch_size), (Ended::Good, 7, 4));
        assert_eq!(f.queue, Dur::from_ms(2));
        // A second answer is a stray.
        assert!(l.finish(t0, a.id, out.clone()).is_none());
        // After the deadline: late.
        let f = l.finish(t0 + Dur::from_ms(11), b.id, out).unwrap();
        assert_eq!(f.ended, Ended::Late);
        let c = l.counts();
        assert_eq!((c.good, c.late, c.stray_answers), (1, 1, 1));
        assert!(l.is_empty());
    }

    /// Requests held over a lost scheduler: taken out in id order, readmitted
    /// under new ids with new times (their old ids' answers are strays), or
    /// ended as failed; each ends once.
    #[test]
    fn orphans_are_readmitted_under_new_ids_or_end_once() {
        let mut l: RequestLedger<u32> = RequestLedger::new(3, Dur::from_ms(100));
        let t0 = Time(1_000);
        let a = l.admit(t0, 0, ModelId(0), Dur::from_ms(10), 7, input(), 11);
        let b = l.admit(t0, 1, ModelId(5), Dur::from_ms(10), 8, input(), 12);
        let mut o = l.orphan_all();
        assert!(l.is_empty() && l.poll_timeout().is_none());
        assert_eq!(o.iter().map(|x| x.id).collect::<Vec<_>>(), vec![a.id, b.id]);
        // The frontend joined the next scheduler as node 4.
        l.set_node(4);
        let ob = o.pop().unwrap();
        let t = l.readmit(ob, ModelId(5), Time(50), Time(60));
        assert_eq!(crate::wire::task_owner(t.id), 4);
        assert_ne!(t.id, b.id);
        assert_eq!(
            (t.cap, t.arrival, t.deadline, t.model),
            (12, Time(50), Time(60), ModelId(5))
        );
        // The old id's answer is a stray; the new one's ends it, once.
        let out = Answer::Output {
            output: vec![1],
            started: Time(52),
            finished: Time(55),
            batch_size: 1,
        };
        assert!(l.finish(Time(55), b.id, out.clone()).is_none());
        let f = l.finish(Time(55), t.id, out).unwrap();
        assert_eq!((f.client, f.ended), (8, Ended::Good));
        // The other ends without a scheduler.
        let oa = o.pop().unwrap();
        let f = l.end_orphan(oa, Ended::NoScheduler, "gone", Dur::from_ms(12));
        assert_eq!(
            (f.id, f.client, f.ended.outcome()),
            (a.id, 7, Outcome::Failed)
        );
        let c = l.counts();
        assert_eq!(
            (c.admitted, c.retried, c.good, c.failed, c.stray_answers),
            (2, 1, 1, 1, 1)
        );
    }

    /// A request taken while there is no scheduler is held under an id no
    /// other request has, pending nothing, and is readmitted or ends once
    /// like an orphan of the loss.
    #[test]
    fn requests_taken_without_a_scheduler_are_held_as_orphans() {
        let mut l: RequestLedger<u32> = RequestLedger::new(3, Dur::from_ms(100));
        let t0 = Time(1_000);
        let a = l.admit(t0, 0, ModelId(0), Dur::from_ms(10), 7, input(), 11);
        let mut o = l.orphan_all();
        let h = l.hold(Time(1_500), 1, Dur::from_ms(20), 8, input(), 12);
        assert!(l.is_empty() && l.poll_timeout().is_none());
        assert_ne!(h.id, a.id);
        assert_eq!(
            (h.client, h.model, h.arrival, h.deadline, h.cap),
            (8, 1, Time(1_500), Time(1_500) + Dur::from_ms(20), 12)
        );
        let h2 = l.hold(Time(1_600), 0, Dur::from_ms(20), 9, input(), 13);
        assert!(h2.id > h.id);
        l.set_node(4);
        let t = l.readmit(h, ModelId(5), Time(50), Time(60));
        assert!(t.id > h2.id && crate::wire::task_owner(t.id) == 4);
        let f = l.finish(Time(55), t.id, Answer::Dropped(DropReason::Expired));
        assert_eq!(f.map(|f| f.client), Some(8));
        let f = l.end_orphan(h2, Ended::NoScheduler, "gone", Dur::from_ms(30));
        assert_eq!((f.client, f.ended.outcome()), (9, Outcome::Failed));
        let f = l.end_orphan(o.pop().unwrap(), Ended::NoScheduler, "gone", Dur::ZERO);
        assert_eq!(f.client, 7);
        let c = l.counts();
        assert_eq!((c.admitted, c.retried, c.dropped, c.failed), (3, 1, 1, 2));
    }

    /// A result must carry its task's capability: a forged one (another
    /// capability) ends nothing, and the real one still ends the request.
    #[test]
    fn results_without_the_tasks_capability_are_refused() {
        let mut l: RequestLedger<u32> = RequestLedger::new(3, Dur::from_ms(100));
        let t0 = Time(1_000);
        let a = l.admit(t0, 0, ModelId(0), Dur::from_ms(10), 7, input(), 0xfeed);
        assert_eq!(a.cap, 0xfeed);
        let r = |cap| TaskResult {
            id: a.id,
            status: TaskStatus::Ok,
            started: t0,
            finished: t0,
            batch_size: 1,
            output: vec![cap as u8],
            cap,
        };
        assert!(l.result(t0, r(0xfeee)).is_none());
        assert!(l.result(t0, r(0)).is_none());
        assert!(l.contains(a.id), "still waiting for its real answer");
        assert_eq!(l.counts().forged_results, 2);
        let f = l.result(t0, r(0xfeed)).expect("the real result ends it");
        assert_eq!((f.ended, f.output), (Ended::Good, vec![0xed]));
        assert_eq!(l.counts().good, 1);
    }

    #[test]
    fn the_sweep_fails_what_nobody_answered_and_saturates() {
        let mut l: RequestLedger<()> = RequestLedger::new(1, Dur::from_ms(100));
        let t0 = Time(0);
        let a = l.admit(t0, 0, ModelId(0), Dur::from_ms(10), (), input(), 13);
        // A deadline at the end of time never wraps into the past.
        let z = l.admit(t0, 0, ModelId(0), Dur(i64::MAX), (), input(), 14);
        assert_eq!(z.deadline, Time(i64::MAX));
        assert_eq!(l.poll_timeout(), Some(Time(110_000_000)));
        assert!(l.handle_timeout(Time(109_999_999)).is_empty());
        let f = l.handle_timeout(Time(110_000_000));
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].id, f[0].ended), (a.id, Ended::TimedOut));
        assert_eq!(l.poll_timeout(), Some(Time(i64::MAX)));
        let rest = l.fail_all(Time(5), Ended::NoScheduler, "gone");
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].ended.outcome(), Outcome::Failed);
        assert_eq!(l.counts().failed, 2);
        assert_eq!(l.counts().timed_out, 1);
    }

    #[test]
    fn answers_map_to_endings() {
        assert_eq!(
            Answer::of_drop(DropReason::BackendLost),
            Answer::Failed(Ended::BackendLost, "the backend running it was lost".into())
        );
        assert_eq!(
            Answer::of_drop(DropReason::Expired),
            Answer::Dropped(DropReason::Expired)
        );
        let r = TaskResult {
            id: TaskId(1),
            status: TaskStatus::InputMissing,
            started: Time(0),
            finished: Time(0),
            batch_size: 0,
            output: vec![],
            cap: 1,
        };
        assert!(matches!(
            Answer::of_result(r),
            Answer::Failed(Ended::Failed, _)
        ));
    }
}
