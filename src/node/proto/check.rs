//! Range checks at the edge: what a peer sends becomes a typed value only after
//! these. A value out of range is a protocol error (the peer's connection closes
//! with the reason) or, where an honest peer can produce it (a measurement after a
//! long pause), it is clamped.

use crate::core::{Dur, ModelId, Task, TaskId, Time};
use crate::wire::{task_owner, NodeId, SubmitTask};

/// The longest SLO a request may ask for. Anything longer is no latency
/// objective, and bounding it keeps every deadline far from the ends of `i64`.
pub const MAX_SLO: Dur = Dur(3_600_000_000_000);

/// How far a task's arrival may lie from the scheduler's clock (either side):
/// frontends stamp arrivals on their estimate of that clock, wrong by at most
/// half a round trip, so a whole SLO of error is a broken or hostile peer.
pub const MAX_ARRIVAL_SKEW: Dur = MAX_SLO;

/// Ceiling on a delay a node reports (control delay, pull time): a measurement
/// taken across a long pause is honest but useless, and the scheduler caps its
/// budget far below this anyway.
pub const MAX_MEASURED: Dur = Dur(10_000_000_000);

/// Longest batch a backend may report (start to finish) for the busy metrics.
pub const MAX_BATCH_SPAN: Dur = Dur(60_000_000_000);

/// A request's SLO: zero means the model's default.
pub fn slo(requested: Dur, default: Dur) -> Result<Dur, String> {
    let ns = requested.0;
    if ns < 0 {
        return Err(format!(
            "the SLO must be >= 0 ns (0 = the model's default), got {ns} ns"
        ));
    }
    if ns > MAX_SLO.0 {
        return Err(format!(
            "the SLO must be at most {} ns (one hour), got {ns} ns",
            MAX_SLO.0
        ));
    }
    Ok(if ns == 0 { default } else { requested })
}

/// A delay a node measured (zero = none yet), clamped to `[0, MAX_MEASURED]`.
pub fn measured(d: Dur) -> Dur {
    Dur(d.0.clamp(0, MAX_MEASURED.0))
}

/// A pull cost a backend reported, each part clamped like [`measured`].
pub fn measured_pull(f: crate::core::PullFit) -> crate::core::PullFit {
    crate::core::PullFit {
        fixed: measured(f.fixed),
        per_mib: measured(f.per_mib),
    }
}

/// The busy time of a batch a backend reports, clamped to `[0, MAX_BATCH_SPAN]`.
pub fn batch_span(started: Time, finished: Time) -> Dur {
    Dur(finished
        .0
        .saturating_sub(started.0)
        .clamp(0, MAX_BATCH_SPAN.0))
}

/// What a submitted task is, after its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// For the core.
    Task(ModelId, Task),
    /// A model id the scheduler does not serve (the task is dropped with
    /// `UnknownModel`; the frontend's models list may be older than ours).
    UnknownModel(TaskId),
}

/// Checks a task that frontend `sender` submitted at scheduler time `now`, with
/// `models` models served. An error is a protocol violation.
pub fn submit_task(
    now: Time,
    sender: NodeId,
    models: usize,
    t: &SubmitTask,
) -> Result<Submitted, String> {
    if task_owner(t.id) != sender {
        return Err(format!(
            "task id {} does not carry the frontend's node id {sender}",
            t.id
        ));
    }
    let (arrival, deadline) = (t.arrival, t.deadline);
    if (arrival - now).0.saturating_abs() > MAX_ARRIVAL_SKEW.0 {
        return Err(format!(
            "task {}: arrival {} ns is more than {} s from the scheduler's clock ({} ns)",
            t.id,
            arrival.0,
            MAX_ARRIVAL_SKEW.as_secs_f64(),
            now.0
        ));
    }
    if deadline < arrival || deadline - arrival > MAX_SLO {
        return Err(format!(
            "task {}: deadline {} ns is not within {} s after its arrival {} ns",
            t.id,
            deadline.0,
            MAX_SLO.as_secs_f64(),
            arrival.0
        ));
    }
    if t.model.idx() >= models {
        return Ok(Submitted::UnknownModel(t.id));
    }
    Ok(Submitted::Task(
        t.model,
        Task {
            id: t.id,
            arrival,
            deadline,
            tag: t.input,
            cap: t.cap,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::task_id;

    #[test]
    fn slo_bounds() {
        let d = Dur::from_ms(40);
        assert_eq!(slo(Dur(0), d), Ok(d));
        assert_eq!(slo(Dur(5), d), Ok(Dur(5)));
        assert!(slo(Dur(-1), d).unwrap_err().contains(">= 0"));
        assert!(slo(Dur(i64::MAX), d).unwrap_err().contains("one hour"));
        assert_eq!(slo(MAX_SLO, d), Ok(MAX_SLO));
    }

    #[test]
    fn measurements_and_spans_are_clamped() {
        assert_eq!(measured(Dur(i64::MAX)), MAX_MEASURED);
        assert_eq!(measured(Dur(-7)), Dur(0));
        assert_eq!(measured(Dur(1234)), Dur(1234));
        assert_eq!(batch_span(Time(i64::MIN), Time(i64::MAX)), MAX_BATCH_SPAN);
        assert_eq!(batch_span(Time(10), Time(5)), Dur(0));
        assert_eq!(batch_span(Time(5), Time(10)), Dur(5));
    }

    #[test]
    fn submitted_tasks() {
        let now = Time(1_000_000_000);
        let t = |owner, arrival, deadline, model| SubmitTask {
            id: task_id(owner, 1),
            model: ModelId(model),
            arrival: Time(arrival),
            deadline: Time(deadline),
            input: 9,
            cap: 77,
        };
        let ok = t(3, now.0, now.0 + 40_000_000, 1);
        match submit_task(now, 3, 2, &ok).unwrap() {
            Submitted::Task(m, task) => {
                assert_eq!(m, ModelId(1));
                assert_eq!(task.deadline, Time(now.0 + 40_000_000));
                assert_eq!((task.tag, task.cap), (9, 77));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            submit_task(now, 3, 1, &ok).unwrap(),
            Submitted::UnknownModel(ok.id)
        );
        assert!(submit_task(now, 4, 2, &ok)
            .unwrap_err()
            .contains("node id 4"));
        for bad in [
            t(3, now.0, i64::MAX, 0),
            t(3, now.0, now.0 - 1, 0),
            t(3, i64::MIN, now.0, 0),
            t(3, i64::MAX, i64::MAX, 0),
        ] {
            assert!(submit_task(now, 3, 2, &bad).is_err(), "{bad:?}");
        }
    }
}
