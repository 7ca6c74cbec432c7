//! What runs each model, as the frontends report it (the `kind` of Triton's
//! `instance_group`): the GPUs in service of each sub-cluster counted by
//! what runs them ([`DeviceKind`]: a real GPU, the CPU, or an emulation, as
//! each backend registers them), and what the frontends were last told of
//! each model (the counts of its home sub-cluster).
//!
//! Pure bookkeeping (no clock, no I/O); [`super::sched::SchedProto`] calls
//! it when GPUs enter or leave service and when a model changes home, and
//! sends the models whose counts changed in `ModelStates`.
//!
//! [`DeviceKind`]: crate::wire::DeviceKind

use crate::core::ModelId;
use crate::wire::DeviceCounts;

/// GPUs in service per sub-cluster, by kind, and what each model's
/// frontends were told.
#[derive(Debug, Clone)]
pub struct Devices {
    per_sub: Vec<DeviceCounts>,
    told: Vec<DeviceCounts>,
}

impl Devices {
    /// `subs` sub-clusters with no GPU in service; `models` models, of
    /// which frontends were told nothing yet (all zero).
    pub fn new(subs: u32, models: usize) -> Devices {
        Devices {
            per_sub: vec![DeviceCounts::default(); subs as usize],
            told: vec![DeviceCounts::default(); models],
        }
    }

    /// GPUs of sub-cluster `sub` enter service.
    pub fn up(&mut self, sub: u32, c: DeviceCounts) {
        if let Some(s) = self.per_sub.get_mut(sub as usize) {
            *s = s.plus(c);
        }
    }

    /// GPUs of sub-cluster `sub` leave service.
    pub fn down(&mut self, sub: u32, c: DeviceCounts) {
        if let Some(s) = self.per_sub.get_mut(sub as usize) {
            *s = s.minus(c);
        }
    }

    /// The GPUs in service of sub-cluster `sub`.
    pub fn of_sub(&self, sub: u32) -> DeviceCounts {
        self.per_sub.get(sub as usize).copied().unwrap_or_default()
    }

    /// The models (by id) whose home's counts differ from what their
    /// frontends were told (`homes[m]`: model m's sub-cluster); from now on
    /// they count as told.
    pub fn changed(&mut self, homes: &[u32]) -> Vec<ModelId> {
        let mut out = Vec::new();
        for (m, &home) in homes.iter().enumerate() {
            let now = self.of_sub(home);
            if let Some(t) = self.told.get_mut(m) {
                if *t != now {
                    *t = now;
                    out.push(ModelId(m as u32));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(gpu: u32, cpu: u32, emulated: u32) -> DeviceCounts {
        DeviceCounts { gpu, cpu, emulated }
    }

    #[test]
    fn models_hear_of_their_home_only_when_it_changes() {
        let mut d = Devices::new(2, 3);
        let homes = [0, 1, 1];
        assert!(d.changed(&homes).is_empty(), "nothing in service: as told");
        d.up(1, c(0, 2, 0));
        assert_eq!(d.changed(&homes), vec![ModelId(1), ModelId(2)]);
        assert!(d.changed(&homes).is_empty(), "told once");
        d.up(0, c(1, 0, 0));
        d.up(0, c(0, 0, 3));
        assert_eq!(d.of_sub(0), c(1, 0, 3));
        assert_eq!(d.changed(&homes), vec![ModelId(0)]);
        // Model 0 moves to sub-cluster 1: it hears the CPUs there.
        assert_eq!(d.changed(&[1, 1, 1]), vec![ModelId(0)]);
        d.down(1, c(0, 2, 0));
        assert_eq!(d.of_sub(1), c(0, 0, 0));
        assert_eq!(
            d.changed(&[1, 1, 1]),
            vec![ModelId(0), ModelId(1), ModelId(2)]
        );
    }

    #[test]
    fn counts_never_wrap_and_unknown_sub_clusters_are_ignored() {
        let mut d = Devices::new(1, 1);
        d.down(0, c(1, 1, 1));
        assert_eq!(d.of_sub(0), c(0, 0, 0));
        d.up(0, c(u32::MAX, 0, 0));
        d.up(0, c(5, 0, 0));
        assert_eq!(d.of_sub(0).gpu, u32::MAX);
        d.up(7, c(1, 0, 0));
        assert_eq!(d.of_sub(7), c(0, 0, 0));
        assert_eq!(d.changed(&[9]), Vec::<ModelId>::new());
    }
}
