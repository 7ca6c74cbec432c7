//! The scheduler's settings ([`SchedulerOpts`]).

use crate::core::Dur;
use std::time::Duration;

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct SchedulerOpts {
    pub listen: String,
    pub model_threads: usize,
    /// How often nodes ping (told to them in `RegisterAck`).
    pub heartbeat: Duration,
    /// A node silent this long is removed.
    pub node_timeout: Duration,
    /// The plan watchdog's grace: a backend that has not reported a plan done
    /// by its planned end plus `max(plan_grace, l(b))` is removed and the plan's
    /// tasks fail.
    pub plan_grace: Duration,
    /// How often the measured network budget is applied.
    pub net_update: Duration,
    /// RankThread spin before a timer, and ModelThread poll before parking (see
    /// [`RtConfig`](crate::runtime::sched::RtConfig)); 0 saves CPU where the
    /// scheduler shares few cores.
    pub rank_spin: Dur,
    pub model_spin: Dur,
    /// Ceilings on the measured d_ctrl and d_data (per task): a burst of slow
    /// probes must not make every request unschedulable.
    pub max_ctrl: Dur,
    pub max_data: Dur,
    /// Ceiling on a model's measured response margin (what frontends report in
    /// `Margins`): a frontend stalled for a while must not make its models
    /// unschedulable.
    pub max_margin: Dur,
    /// Floor on the frontrun slack ([`NetBudget::slack`](crate::core::NetBudget::slack)):
    /// how long before its latest start a deferred batch is planned at the
    /// latest, for the timing error of real threads and networks.
    pub min_slack: Dur,
    /// A hot standby of the primary at this address: it follows the primary
    /// and serves only once the primary is gone ([`super::standby`]).
    pub standby_of: Option<String>,
    /// The autoscaling advice's thresholds (bad rate, idle fraction).
    pub advice: crate::plan::autoscale::AdviceConfig,
    /// Sub-clusters and the epoch partitioner.
    pub epoch: super::epoch::EpochOpts,
    /// Members registered at once and GPUs per backend: a registration past
    /// either is refused with an `Error` naming the limit.
    pub limits: crate::node::proto::bounds::Limits,
    /// Model control: which models load at start, and whether clients load
    /// and unload them.
    pub control: ModelControlOpts,
    /// Planning each model with its measured latency (`--latency-rescale`,
    /// [`crate::node::proto::latency_scale`]).
    pub latency: crate::node::proto::latency_scale::LatencyScaleConfig,
}

/// `--model-control-mode`, `--load-model` and `--repository-poll-secs`.
#[derive(Debug, Clone)]
pub struct ModelControlOpts {
    pub mode: crate::node::proto::control::ControlMode,
    /// With `explicit`: the models loaded at start, by name.
    pub load: Vec<String>,
    /// The model repository served (`--models`), which `poll` looks at.
    pub repository: Option<std::path::PathBuf>,
    /// With `poll`: how often the repository is looked at.
    pub poll_every: Duration,
}

impl Default for ModelControlOpts {
    fn default() -> Self {
        ModelControlOpts {
            mode: Default::default(),
            load: Vec::new(),
            repository: None,
            poll_every: Duration::from_secs(15),
        }
    }
}

impl Default for SchedulerOpts {
    fn default() -> Self {
        SchedulerOpts {
            listen: "127.0.0.1:0".into(),
            model_threads: 1,
            heartbeat: Duration::from_millis(100),
            node_timeout: Duration::from_millis(1000),
            plan_grace: Duration::from_millis(500),
            net_update: Duration::from_millis(200),
            rank_spin: Dur::from_us(100),
            model_spin: Dur::from_us(100),
            max_ctrl: Dur::from_us(2000),
            max_data: Dur::from_us(500),
            max_margin: Dur::from_us(5000),
            min_slack: Dur::from_us(500),
            standby_of: None,
            advice: crate::plan::autoscale::AdviceConfig::default(),
            epoch: super::epoch::EpochOpts::default(),
            limits: crate::node::proto::bounds::Limits::default(),
            control: ModelControlOpts::default(),
            latency: Default::default(),
        }
    }
}
