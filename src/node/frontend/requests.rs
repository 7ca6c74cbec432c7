//! A request's life at the frontend's loop: admission ([`Loop::infer`]: the
//! model, the SLO, a GPU in service, a slot in the region; else refused at once)
//! and its one answer ([`Loop::finish`], [`Loop::answer`]: the slot freed, the
//! per-model series counted, the client answered on its connection or oneshot).

use super::event_loop::Loop;
use super::handle::{InferDone, LocalInfer};
use super::Ended;
use crate::core::{Dur, Outcome, TaskId};
use crate::node::proto::check;
use crate::node::proto::ledger::{Answer, Finished};
use crate::transport::ConnId;
use crate::wire::{DropReason, Msg};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Who waits for a request's answer.
pub(super) enum Client {
    /// A wire client: its connection and request id.
    Conn(ConnId, u64),
    /// An in-process client (HTTP).
    Local(tokio::sync::oneshot::Sender<InferDone>),
}

impl Loop {
    /// Answers `client` (a request of model `model`, its index, when known).
    fn reply(&mut self, client: Client, model: Option<usize>, done: InferDone) {
        match client {
            Client::Conn(c, req) => {
                if let Some(conn) = self.clients.get(&c) {
                    // The reply is handed to the client's connection now.
                    if let (Some(m), Some(f)) = (model, done.finished_at) {
                        self.state.record_margin(m, f.elapsed());
                    }
                    let _ = conn.send(Msg::InferReply {
                        req,
                        status: done.ended.outcome(),
                        latency: Dur::from_std(done.latency),
                        queue: Dur::from_std(done.queue),
                        batch_size: done.batch_size,
                        output: done.output,
                        message: done.message,
                    });
                }
            }
            // A client that went away (HTTP connection closed) is not waiting.
            Client::Local(tx) => {
                let _ = tx.send(done);
            }
        }
    }

    /// A request refused before admission (`model`: its index when it is known).
    fn refuse(
        &mut self,
        client: Client,
        received: Instant,
        model: Option<usize>,
        ended: Ended,
        why: String,
    ) {
        let st = model.map(|i| &self.stats[i]);
        match ended.outcome() {
            // Counted as dropped, not failed: a scheduling outcome.
            Outcome::Dropped => self.report.dropped += 1,
            _ => self.report.failed += 1,
        }
        if let Some(s) = st {
            s.count_end(ended);
            s.latency.observe_duration(received.elapsed());
        }
        if ended == Ended::BadRequest {
            self.report.bad_requests += 1;
            self.bad_requests.inc();
        }
        let done = InferDone::unserved(ended, why, received.elapsed());
        self.reply(client, model, done);
    }

    /// Request `id` got its answer.
    pub(super) fn finish(&mut self, id: TaskId, answer: Answer) {
        let now = self.clock.now();
        if let Some(f) = self.ledger.finish(now, id, answer) {
            self.answer(f);
        }
    }

    /// A request ended: its slot is free, its client answered, its stats counted.
    pub(super) fn answer(&mut self, f: Finished<Client>) {
        self.region.release(f.input);
        let st = &self.stats[f.model];
        let outcome = f.ended.outcome();
        st.count_end(f.ended);
        if matches!(outcome, Outcome::Good | Outcome::Late) {
            st.queue.observe(f.queue.0.max(0) as u64);
        }
        let latency = Duration::from_nanos(f.latency.0.max(0) as u64);
        st.latency.observe_duration(latency);
        let done = InferDone {
            ended: f.ended,
            output: f.output,
            message: f.message,
            latency,
            queue: Duration::from_nanos(f.queue.0.max(0) as u64),
            batch_size: f.batch_size,
            finished_at: f.finished.map(|t| self.clock.instant_of(t)),
            run: Duration::from_nanos(f.run.0.max(0) as u64),
        };
        self.reply(f.client, Some(f.model), done);
    }

    pub(super) fn local(&mut self, l: LocalInfer) {
        self.loop_wait.observe_duration(l.handed.elapsed());
        self.infer(
            Client::Local(l.reply),
            &l.model,
            l.slo,
            &l.input,
            l.received,
        );
    }

    /// Admits a request (its task goes out with the next `Submit`) or refuses it.
    /// `received`: when the request's first byte was read; its SLO runs from
    /// there, so the deadline covers reading it and answering it.
    pub(super) fn infer(
        &mut self,
        client: Client,
        model: &str,
        slo: Dur,
        input: &[u8],
        received: Instant,
    ) {
        self.report.requests += 1;
        let Some(&mi) = self.by_name.get(model) else {
            let known: Vec<&str> = self.models.iter().map(|m| m.name.as_str()).collect();
            let why = format!("unknown model `{model}` (served: {})", known.join(", "));
            return self.refuse(client, received, None, Ended::BadRequest, why);
        };
        let m = &self.models[mi];
        let slo = match check::slo(slo, m.slo) {
            Ok(slo) => slo,
            Err(why) => return self.refuse(client, received, Some(mi), Ended::BadRequest, why),
        };
        if !self.away && self.state.gpus.load(Ordering::Acquire) == 0 {
            let why = format!("no GPU in service: no backend can serve model `{model}` now");
            return self.refuse(
                client,
                received,
                Some(mi),
                Ended::Dropped(DropReason::NoGpu),
                why,
            );
        }
        // What it waited already (the accept queue, reading and decoding,
        // this loop's queue) and the least time any answer takes leave no
        // time before its deadline: refused before its input is copied.
        let waited = Dur::from_std(received.elapsed());
        if waited + self.need[mi] >= slo {
            let why = format!(
                "waited {:.1} ms before admission: its SLO of {:.1} ms cannot be met (the model takes {:.1} ms at batch 1)",
                waited.as_ms_f64(),
                slo.as_ms_f64(),
                self.need[mi].as_ms_f64()
            );
            return self.refuse(
                client,
                received,
                Some(mi),
                Ended::Dropped(DropReason::Expired),
                why,
            );
        }
        let mid = m.id;
        let cap = self.caps.next_cap();
        let Some(r) = self.region.put(self.ledger.next_id().0, cap, input) else {
            let why = format!(
                "input region full or input too large ({} bytes)",
                input.len()
            );
            return self.refuse(client, received, Some(mi), Ended::RegionFull, why);
        };
        let arrival = self.clock.now() - Dur::from_std(received.elapsed());
        if self.away {
            // No scheduler to submit it to: held for the next one, as the
            // requests pending at the loss are, until its deadline.
            let o = self.ledger.hold(arrival, mi, slo, client, r, cap);
            let slo = std::time::Duration::from_nanos(slo.ns().max(0) as u64);
            // A checked SLO is bounded, so the deadline is a real instant.
            let deadline = received.checked_add(slo).unwrap_or(received);
            return self.hold(o, received, deadline);
        }
        let task = self.ledger.admit(arrival, mi, mid, slo, client, r, cap);
        self.submit.push(task);
    }
}
