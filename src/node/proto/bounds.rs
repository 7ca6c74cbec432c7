//! What bounds the scheduler's per-member state: GPU ids given back when their
//! backend leaves and given again ([`GpuIds`]), the limits on members and on
//! GPUs per member ([`Limits`]), and the rate limit on the warnings about
//! refused members ([`RefusalLog`]). Pure, like the rest of the protocol: time
//! comes in.
//!
//! # GPU ids
//! Every table indexed by GPU id (the owner here, the core's free times and
//! bookings, the driver's routes and busy times, the metrics' series) is as
//! long as the highest id given, so ids are dense and come back: a departed
//! backend's ids wait [`GPU_ID_QUARANTINE`] (so that no plan the core decided
//! on them before it saw them go is still on its way to their routes), then
//! the lowest free ones go to the next backend. A backend that needs more ids
//! than are free waits while any are in quarantine rather than growing the
//! tables (at most the quarantine: backends wait in the order they came, so
//! none that came later takes the ids first); the tables grow only when no id
//! is in quarantine and the free ones are too few, and then every slot is
//! owned. So the number of GPU slots is the most GPUs that were ever owned at
//! once, however often members come and go.

use crate::core::{Dur, GpuId, Time};
use crate::wire::NodeId;
use std::collections::{BTreeSet, VecDeque};

/// How long a departed backend's GPU ids wait before they are given again:
/// five times [`super::sched::DRAIN_QUIET`], the time within which a plan the
/// core decided just before it saw a GPU leave reaches the dispatch path.
pub const GPU_ID_QUARANTINE: Dur = Dur(500_000_000);

/// Default limit on the GPUs one backend registers (`--max-gpus-per-member`).
pub const DEFAULT_MAX_GPUS_PER_MEMBER: u32 = 1024;

/// Default limit on members registered at once, backends and frontends
/// (`--max-members`).
pub const DEFAULT_MAX_MEMBERS: u32 = 1024;

/// How often a refused member is warned about: the first refusal at once, then
/// at most one warning per period, with the count of those not warned about.
pub const REFUSAL_WARN_PERIOD: Dur = Dur(10_000_000_000);

/// Limits on what members may hold of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// GPUs one backend may register.
    pub max_gpus_per_member: u32,
    /// Members (backends, loading or in service, and frontends) registered at
    /// once.
    pub max_members: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_gpus_per_member: DEFAULT_MAX_GPUS_PER_MEMBER,
            max_members: DEFAULT_MAX_MEMBERS,
        }
    }
}

/// The GPU ids: who owns each, which are free, which wait in quarantine.
#[derive(Debug, Default)]
pub struct GpuIds {
    /// Owner of each id given (None: free or in quarantine).
    owner: Vec<Option<NodeId>>,
    /// Free ids, given lowest first.
    free: BTreeSet<u32>,
    /// Ids in quarantine, with when they are free, in that order.
    quarantine: VecDeque<(Time, Vec<GpuId>)>,
    quarantined: usize,
}

impl GpuIds {
    /// GPU slots: the highest id given plus one (every table indexed by GPU id
    /// is this long).
    pub fn slots(&self) -> usize {
        self.owner.len()
    }

    /// Ids owned by a backend.
    pub fn owned(&self) -> usize {
        self.owner.len() - self.free.len() - self.quarantined
    }

    /// Ids waiting in quarantine.
    pub fn quarantined(&self) -> usize {
        self.quarantined
    }

    /// The backend owning `gpu` (None: free, in quarantine, or never given).
    pub fn owner(&self, gpu: GpuId) -> Option<NodeId> {
        self.owner.get(gpu.idx()).copied().flatten()
    }

    /// When the next ids leave quarantine.
    pub fn next_release(&self) -> Option<Time> {
        self.quarantine.front().map(|(t, _)| *t)
    }

    /// Frees the ids whose quarantine is over at `now`.
    pub fn release(&mut self, now: Time) {
        while let Some((t, _)) = self.quarantine.front() {
            if *t > now {
                break;
            }
            let (_, ids) = self.quarantine.pop_front().expect("front");
            self.quarantined -= ids.len();
            self.free.extend(ids.iter().map(|g| g.0));
        }
    }

    /// `n` ids for backend `node` at `now`: the lowest free ones, and new ones
    /// past the last when the free ones are too few and none is in
    /// quarantine. None when too few are free and some are in quarantine: ask
    /// again once they are out ([`GpuIds::next_release`]).
    pub fn take(&mut self, now: Time, node: NodeId, n: usize) -> Option<Vec<GpuId>> {
        self.release(now);
        if self.free.len() < n && self.quarantined > 0 {
            return None;
        }
        let mut ids = Vec::with_capacity(n);
        while ids.len() < n {
            let Some(g) = self.free.pop_first() else {
                break;
            };
            ids.push(GpuId(g));
        }
        let grow = n - ids.len();
        let first = self.owner.len() as u32;
        ids.extend((first..first + grow as u32).map(GpuId));
        self.owner.resize(self.owner.len() + grow, None);
        for g in &ids {
            self.owner[g.idx()] = Some(node);
        }
        Some(ids)
    }

    /// A backend left at `now`: its ids go into quarantine (ids it does not
    /// own are left alone).
    pub fn give_back(&mut self, now: Time, node: NodeId, ids: &[GpuId]) {
        let mut back = Vec::with_capacity(ids.len());
        for g in ids {
            if let Some(o) = self.owner.get_mut(g.idx()) {
                if *o == Some(node) {
                    *o = None;
                    back.push(*g);
                }
            }
        }
        if back.is_empty() {
            return;
        }
        self.quarantined += back.len();
        self.quarantine.push_back((now + GPU_ID_QUARANTINE, back));
    }
}

/// The rate limit on warnings about refused members (a member retrying a
/// refused registration in a loop must not fill the log).
#[derive(Debug, Clone, Default)]
pub struct RefusalLog {
    last: Option<Time>,
    unwarned: u64,
    /// Refusals so far.
    pub total: u64,
}

impl RefusalLog {
    /// A refusal at `now`: Some(refusals not warned about since the last
    /// warning) when this one is to be warned about, None when not.
    pub fn hit(&mut self, now: Time) -> Option<u64> {
        self.total += 1;
        match self.last {
            Some(t) if now - t < REFUSAL_WARN_PERIOD => {
                self.unwarned += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.unwarned))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: Dur = GPU_ID_QUARANTINE;

    #[test]
    fn ids_come_back_after_the_quarantine_lowest_first() {
        let mut ids = GpuIds::default();
        let t = Time(0);
        let a = ids.take(t, 1, 3).unwrap();
        let b = ids.take(t, 2, 2).unwrap();
        assert_eq!(a, vec![GpuId(0), GpuId(1), GpuId(2)]);
        assert_eq!(b, vec![GpuId(3), GpuId(4)]);
        assert_eq!(ids.owner(GpuId(3)), Some(2));
        ids.give_back(t, 1, &a);
        assert_eq!(ids.owner(GpuId(1)), None);
        assert_eq!((ids.owned(), ids.quarantined(), ids.slots()), (2, 3, 5));
        // Within the quarantine: a backend of 2 waits for them.
        assert_eq!(ids.take(t + Dur(Q.0 / 2), 3, 2), None);
        assert_eq!(ids.next_release(), Some(t + Q));
        // After it: the lowest ids.
        assert_eq!(ids.take(t + Q, 3, 2).unwrap(), vec![GpuId(0), GpuId(1)]);
        assert_eq!(ids.slots(), 5);
        // More than are free, none in quarantine: the rest are new.
        assert_eq!(
            ids.take(t + Q, 4, 3).unwrap(),
            vec![GpuId(2), GpuId(5), GpuId(6)]
        );
        assert_eq!((ids.owned(), ids.slots()), (7, 7));
        // More than are free while some are in quarantine: it waits for them.
        ids.give_back(t + Q, 2, &b);
        assert_eq!(ids.take(t + Q, 5, 9), None);
        assert_eq!(ids.take(t + Q + Q, 5, 9).unwrap().len(), 9);
        assert_eq!((ids.owned(), ids.slots()), (14, 14));
    }

    #[test]
    fn only_the_owner_gives_ids_back() {
        let mut ids = GpuIds::default();
        let a = ids.take(Time(0), 1, 2).unwrap();
        ids.give_back(Time(0), 9, &a);
        assert_eq!(ids.owned(), 2);
        ids.give_back(Time(0), 1, &a);
        ids.give_back(Time(0), 1, &a);
        assert_eq!((ids.owned(), ids.quarantined()), (0, 2));
    }

    /// Members joining and leaving many times: the slots stay those of the
    /// most GPUs held at once.
    #[test]
    fn churn_keeps_the_slots_flat() {
        let mut ids = GpuIds::default();
        let mut t = Time(0);
        for i in 0..10_000u32 {
            let got = loop {
                match ids.take(t, i + 1, 64) {
                    Some(g) => break g,
                    None => t = ids.next_release().unwrap(),
                }
            };
            t += Dur::from_ms(1);
            ids.give_back(t, i + 1, &got);
        }
        assert_eq!(ids.slots(), 64);
    }

    #[test]
    fn refusals_are_warned_about_once_per_period_with_a_count() {
        let mut w = RefusalLog::default();
        let t = Time(0);
        assert_eq!(w.hit(t), Some(0));
        for i in 1..1000 {
            assert_eq!(w.hit(t + Dur(REFUSAL_WARN_PERIOD.0 * i / 1000)), None);
        }
        assert_eq!(w.hit(t + REFUSAL_WARN_PERIOD), Some(999));
        assert_eq!(w.total, 1001);
    }

    // The scheduler's protocol with these bounds.

    use crate::core::ModelId;
    use crate::node::proto::sched::{Action, SchedProto};
    use crate::node::proto::subclusters::SubClusters;
    use crate::transport::ConnId;
    use crate::wire::{GpuInfo, Msg, Role};

    fn proto(limits: Limits) -> SchedProto {
        crate::node::proto::sched::tests::proto_with_limits(SubClusters::single(2), limits)
    }

    fn actions(p: &mut SchedProto) -> Vec<Action> {
        std::iter::from_fn(|| p.poll_action()).collect()
    }

    /// A backend with `gpus` GPUs registers on `c` and confirms both models.
    fn backend(p: &mut SchedProto, now: Time, c: ConnId, gpus: u32) -> Vec<Action> {
        p.handle_accept(now, c);
        let gpus = (0..gpus)
            .map(|local| GpuInfo {
                local,
                name: "g".into(),
                mem_bytes: 1 << 30,
                device: crate::wire::DeviceKind::Emulated,
                lanes: 1,
            })
            .collect();
        let register = Msg::Register {
            role: Role::Backend,
            name: format!("be{c}"),
            gpus,
            ctrl_addr: String::new(),
            region: None,
        };
        p.handle_msg(now, c, register);
        for m in 0..2 {
            let loaded = Msg::ModelLoaded {
                model: ModelId(m),
                ok: true,
                error: String::new(),
                device_bytes: 0,
            };
            p.handle_msg(now, c, loaded);
        }
        actions(p)
    }

    fn frontend(p: &mut SchedProto, now: Time, c: ConnId) -> Vec<Action> {
        crate::node::proto::sched::tests::frontend_at(p, now, c);
        actions(p)
    }

    fn up(acts: &[Action]) -> Vec<u32> {
        acts.iter()
            .filter_map(|a| match a {
                Action::GpusUp { gpus, .. } => Some(gpus.iter().map(|g| g.0)),
                _ => None,
            })
            .flatten()
            .collect()
    }

    fn error_to(acts: &[Action], c: ConnId) -> Option<String> {
        let closed = acts
            .iter()
            .any(|a| matches!(a, Action::Close(x, _) if *x == c));
        let msg = acts.iter().find_map(|a| match a {
            Action::Send(x, Msg::Error { message }) if *x == c => Some(message.clone()),
            _ => None,
        });
        msg.filter(|_| closed)
    }

    /// A backend that leaves gives its GPU ids back: the next backend gets
    /// them once their quarantine is over (it waits for them meanwhile, its
    /// `RegisterAck` too), and the GPU slots stay those of one backend.
    #[test]
    fn a_departed_backends_gpu_ids_go_to_the_next_one_after_the_quarantine() {
        let mut p = proto(Limits::default());
        let t = Time(1_000_000_000);
        assert_eq!(up(&backend(&mut p, t, 1, 4)), vec![0, 1, 2, 3]);
        let bye = Msg::Unregister {
            reason: "bye".into(),
        };
        p.handle_msg(t, 1, bye);
        let acts = actions(&mut p);
        assert!(acts
            .iter()
            .any(|a| matches!(a, Action::GpusDown { gpus, .. } if gpus.len() == 4)));
        let acts = backend(&mut p, t + Dur::from_ms(1), 2, 4);
        assert!(up(&acts).is_empty(), "waits for the ids in quarantine");
        assert!(!acts
            .iter()
            .any(|a| matches!(a, Action::Send(2, Msg::RegisterAck { .. }))));
        assert_eq!(p.state_sizes().gpus_quarantined, 4);
        // The scheduler wakes up when they are free.
        let due = p.poll_timeout();
        assert!(due <= t + GPU_ID_QUARANTINE, "{due:?}");
        let mut now = due;
        let mut acts = Vec::new();
        while up(&acts).is_empty() {
            p.handle_timeout(now);
            acts = actions(&mut p);
            now = p.poll_timeout().max(now + Dur(1));
        }
        assert!(now - t <= GPU_ID_QUARANTINE + Dur::from_ms(100));
        assert_eq!(up(&acts), vec![0, 1, 2, 3]);
        assert!(acts.iter().any(|a| matches!(a,
            Action::Send(2, Msg::RegisterAck { gpu_ids, .. }) if gpu_ids.len() == 4)));
        let s = p.state_sizes();
        assert_eq!((s.gpu_slots, s.gpus_owned, s.gpus_quarantined), (4, 4, 0));
        assert_eq!(p.gpu_owner(GpuId(0)), p.backends().first().map(|b| b.node));
    }

    /// Backends and frontends joining and leaving a thousand times leave the
    /// scheduler's per-member state as one cycle left it.
    #[test]
    fn churn_leaves_the_per_member_state_as_one_cycle_leaves_it() {
        let mut p = proto(Limits::default());
        let mut now = Time(1_000_000_000);
        let mut after_one = None;
        for i in 0..1000u64 {
            let (b, f) = (2 * i + 1, 2 * i + 2);
            backend(&mut p, now, b, 8);
            frontend(&mut p, now, f);
            now += Dur::from_ms(10);
            p.handle_closed(now, b, "gone".into());
            p.handle_closed(now, f, "gone".into());
            actions(&mut p);
            // Past the quarantine, as the heartbeats go.
            let until = now + GPU_ID_QUARANTINE + Dur::from_ms(100);
            while now < until {
                now = p.poll_timeout().max(now + Dur::from_ms(1));
                p.handle_timeout(now);
                actions(&mut p);
            }
            let s = p.state_sizes();
            assert_eq!((s.conns, s.frontends, s.names, s.gpus_owned), (0, 0, 0, 0));
            match after_one {
                None => after_one = Some(s),
                Some(one) => assert_eq!(s, one, "after cycle {i}"),
            }
        }
        assert_eq!(after_one.map(|s| s.gpu_slots), Some(8));
    }

    /// Past a limit, a registration is refused with an `Error` naming it and
    /// the connection closed; a member leaving makes room again.
    #[test]
    fn registrations_past_the_limits_are_refused_with_an_error() {
        let mut p = proto(Limits {
            max_gpus_per_member: 4,
            max_members: 2,
        });
        let t = Time(1_000_000_000);
        let acts = backend(&mut p, t, 1, 5);
        let e = error_to(&acts, 1).expect("refused");
        assert!(
            e.contains("--max-gpus-per-member") && e.contains('4'),
            "{e}"
        );
        assert!(up(&acts).is_empty());
        assert_eq!(up(&backend(&mut p, t, 2, 4)), vec![0, 1, 2, 3]);
        assert!(error_to(&frontend(&mut p, t, 3), 3).is_none());
        let e = error_to(&frontend(&mut p, t, 4), 4).expect("refused");
        assert!(e.contains("--max-members 2"), "{e}");
        let e = error_to(&backend(&mut p, t, 5, 1), 5).expect("refused");
        assert!(e.contains("--max-members"), "{e}");
        assert_eq!(p.report().refused_for_limits, 3);
        p.handle_closed(t, 3, "gone".into());
        actions(&mut p);
        assert!(error_to(&frontend(&mut p, t, 6), 6).is_none());
        assert_eq!(p.state_sizes().conns, 2);
    }
}
