//! A whole cluster in one process: scheduler, backends and frontends as objects
//! over one transport (in-process by default). `fermata serve` runs one with load;
//! tests and benchmarks start one and drive it.

use super::backend::{BackendNode, BackendOpts, BackendReport};
use super::frontend::{FrontendNode, FrontendOpts, FrontendReport};
use super::scheduler::{SchedReport, SchedulerNode, SchedulerOpts};
use crate::core::GpuId;
use crate::harness::loadgen::{self, LoadReport, LoadgenOpts};
use crate::transport::Transport;
use crate::workload::Workload;
use anyhow::Result;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Shape of an in-process cluster.
#[derive(Debug, Clone)]
pub struct ClusterOpts {
    /// Backend nodes; the workload's GPUs are split among them.
    pub backends: u32,
    pub frontends: u32,
    pub model_threads: usize,
    /// Listen addresses are "{host}:0" (TCP) or "{name}:0" (in-process).
    pub host: String,
    pub region_bytes: u64,
    /// The first frontend also serves the KServe v2 HTTP API with these settings;
    /// its `/metrics` shows every node of the cluster.
    pub http: Option<super::http::HttpOpts>,
    /// The first frontend also serves the KServe v2 gRPC API with these.
    pub grpc: Option<super::grpc::GrpcOpts>,
    /// Scheduler thread spin/poll times (us).
    pub rank_spin_us: u64,
    pub model_spin_us: u64,
    /// The backends' executor kind (`emulated`, `onnx`, `cuda`) and where real
    /// models' files are.
    pub executor: String,
    pub models_dir: std::path::PathBuf,
    /// The applications (ensembles) the frontends serve over the models.
    pub apps: Vec<crate::triton_ensemble::EnsembleConfig>,
    /// Re-plan the applications on their measured fan-out
    /// (`FrontendOpts::replan`).
    pub replan: Option<super::frontend::ReplanOpts>,
    /// `cuda`: the CUDA device of each GPU of a backend (default: GPU g on device g).
    pub cuda_devices: Option<Vec<u32>>,
    /// Batches each backend GPU runs at once (`BackendOpts::lanes`).
    pub lanes: u32,
    /// The scheduler's frontrun slack (`SchedulerOpts::min_slack`).
    pub min_slack: crate::core::Dur,
    /// Sub-clusters and the epoch partitioner (`SchedulerOpts::epoch`).
    pub epoch: super::scheduler::epoch::EpochOpts,
    /// Model control (`SchedulerOpts::control`).
    pub control: super::scheduler::ModelControlOpts,
    /// The scheduler's latency scaling (`SchedulerOpts::latency`).
    pub latency: crate::node::proto::latency_scale::LatencyScaleConfig,
    /// Models the emulated executor slows down, timed from the cluster's
    /// start (`--emulated-slowdown`).
    pub emulated_slowdown: Vec<crate::node::exec::slowdown::Slowdown>,
}

impl Default for ClusterOpts {
    fn default() -> Self {
        ClusterOpts {
            backends: 1,
            frontends: 1,
            model_threads: 1,
            host: "fermata".into(),
            region_bytes: 1 << 30,
            http: None,
            grpc: None,
            rank_spin_us: 20,
            model_spin_us: 20,
            executor: "emulated".into(),
            models_dir: "models".into(),
            apps: Vec::new(),
            replan: None,
            cuda_devices: None,
            lanes: 1,
            min_slack: SchedulerOpts::default().min_slack,
            epoch: Default::default(),
            control: Default::default(),
            latency: Default::default(),
            emulated_slowdown: Vec::new(),
        }
    }
}

/// A running cluster.
pub struct Cluster {
    pub scheduler: SchedulerNode,
    pub backends: Vec<BackendNode>,
    /// Global GPU ids of each backend.
    pub backend_gpus: Vec<Vec<GpuId>>,
    pub frontends: Vec<FrontendNode>,
}

/// What the nodes reported when the cluster stopped.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClusterReport {
    pub scheduler: SchedReport,
    pub backends: Vec<BackendReport>,
    pub frontends: Vec<FrontendReport>,
}

/// Copies of the input bytes on their way from the requests to the
/// executors' buffers, per input byte the frontends admitted, by stage.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct InputCopies {
    /// Input bytes the frontends copied into their regions.
    pub stored_bytes: u64,
    /// Per admitted input byte: the store into the region, the pull into the
    /// backend's buffers, the executor's copy into its batch tensors, and
    /// their sum. (Copies inside the kernel's socket calls, over TCP, are not
    /// counted.)
    pub store: f64,
    pub pull: f64,
    pub gather: f64,
    pub total: f64,
}

impl ClusterReport {
    /// The copies per input byte (None before any input was stored).
    pub fn input_copies(&self) -> Option<InputCopies> {
        let stored: u64 = self.frontends.iter().map(|f| f.input_bytes_stored).sum();
        if stored == 0 {
            return None;
        }
        let pulled: u64 = self.backends.iter().map(|b| b.input_bytes_pulled).sum();
        let gathered: u64 = self.backends.iter().map(|b| b.input_bytes_gathered).sum();
        let per = |b: u64| b as f64 / stored as f64;
        Some(InputCopies {
            stored_bytes: stored,
            store: 1.0,
            pull: per(pulled),
            gather: per(gathered),
            total: per(stored + pulled + gathered),
        })
    }
}

impl Cluster {
    pub fn start(transport: Arc<dyn Transport>, w: &Workload, o: &ClusterOpts) -> Result<Cluster> {
        if o.backends == 0 || o.backends > w.gpus {
            anyhow::bail!(
                "backends must be between 1 and the workload's {} GPUs, got {}",
                w.gpus,
                o.backends
            );
        }
        if o.frontends == 0 {
            anyhow::bail!("at least one frontend is needed");
        }
        if let Some(r) = o
            .emulated_slowdown
            .iter()
            .find(|r| !w.models.iter().any(|m| m.spec.name == r.model))
        {
            anyhow::bail!(
                "--emulated-slowdown names {:?}, which the workload does not serve",
                r.model
            );
        }
        let slow = crate::node::exec::slowdown::Slowdowns::new(
            o.emulated_slowdown.clone(),
            Instant::now(),
        )
        .map_err(anyhow::Error::msg)?;
        if !o.epoch.types.is_empty() && (o.backends as usize) < o.epoch.types.len() {
            anyhow::bail!(
                "{} typed sub-clusters need at least as many backends (--backends {} or more)",
                o.epoch.types.len(),
                o.epoch.types.len()
            );
        }
        // The scheduler's limits take this cluster's own members whatever
        // their size (each backend and frontend registers once more when it
        // rejoins, after its last registration is gone).
        let defaults = crate::node::proto::bounds::Limits::default();
        let limits = crate::node::proto::bounds::Limits {
            max_gpus_per_member: defaults
                .max_gpus_per_member
                .max(w.gpus.div_ceil(o.backends).saturating_mul(o.lanes)),
            max_members: defaults
                .max_members
                .max(o.backends.saturating_add(o.frontends)),
        };
        let scheduler = SchedulerNode::start(
            transport.clone(),
            w,
            SchedulerOpts {
                listen: format!("{}:0", o.host),
                model_threads: o.model_threads,
                rank_spin: crate::core::Dur::from_us(o.rank_spin_us as i64),
                model_spin: crate::core::Dur::from_us(o.model_spin_us as i64),
                min_slack: o.min_slack,
                epoch: o.epoch.clone(),
                control: o.control.clone(),
                latency: o.latency,
                limits,
                ..SchedulerOpts::default()
            },
        )?;
        let mut backends = Vec::new();
        for b in 0..o.backends {
            // GPUs split as evenly as possible, the first backends get the extra ones.
            let n = w.gpus / o.backends + u32::from(b < w.gpus % o.backends);
            let mut bo = BackendOpts::with_executor_on(
                scheduler.addr(),
                n,
                &o.executor,
                &o.models_dir,
                o.cuda_devices.clone(),
            )?;
            bo.name = format!("backend{b}");
            bo.set_lanes(o.lanes)?;
            bo.set_emulated_slowdown(slow.clone())?;
            // Typed sub-clusters: backend b is of sub-cluster b's type (in
            // turn), so each sub-cluster gets backends.
            if let Some(t) = o.epoch.types.get(b as usize % o.epoch.types.len().max(1)) {
                bo.set_gpu_type(t)?;
            }
            backends.push(BackendNode::start(transport.clone(), bo)?);
        }
        // Real executors load every model (and, on a GPU, run each bucket once)
        // before the backend is ready: minutes for large models.
        let ready = Duration::from_secs(if o.executor == "emulated" { 10 } else { 600 });
        let mut backend_gpus = Vec::new();
        for b in &backends {
            backend_gpus.push(b.wait_ready(ready)?);
        }
        let mut frontends = Vec::new();
        for f in 0..o.frontends {
            let mut fo = FrontendOpts::new(scheduler.addr());
            fo.listen = format!("{}:0", o.host);
            fo.data_listen = format!("{}:0", o.host);
            fo.region_bytes = o.region_bytes;
            fo.name = format!("frontend{f}");
            fo.apps = o.apps.clone();
            fo.replan = o.replan.clone();
            if f == 0 {
                if let Some(h) = &o.http {
                    let mut h = h.clone();
                    h.extra_metrics.push(scheduler.metrics());
                    h.extra_metrics.extend(backends.iter().map(|b| b.metrics()));
                    fo.http = Some(h);
                }
                fo.grpc = o.grpc.clone();
            }
            frontends.push(FrontendNode::start(transport.clone(), fo)?);
        }
        Ok(Cluster {
            scheduler,
            backends,
            backend_gpus,
            frontends,
        })
    }

    pub fn frontend_addrs(&self) -> Vec<String> {
        self.frontends
            .iter()
            .map(|f| f.addr().to_string())
            .collect()
    }

    /// Stops every node: frontends first (their pending requests end), then
    /// backends, then the scheduler.
    pub fn stop(self) -> Result<ClusterReport> {
        let frontends = self.frontends.into_iter().map(|f| f.stop()).collect();
        let backends = self.backends.into_iter().map(|b| b.stop()).collect();
        let scheduler = self.scheduler.stop()?;
        Ok(ClusterReport {
            scheduler,
            backends,
            frontends,
        })
    }
}

/// One `fermata serve` run: start a cluster, drive it with the workload's load,
/// stop it.
pub struct ServeRun {
    pub load: LoadReport,
    pub cluster: ClusterReport,
    /// From the call to the cluster being ready for requests.
    pub startup: Duration,
    /// CPU time this process (the cluster's threads and the load
    /// generator's) used over the measured window, seconds; None when the
    /// load ended before the window did.
    pub window_cpu_s: Option<f64>,
}

pub fn serve(
    transport: Arc<dyn Transport>,
    w: &Workload,
    co: &ClusterOpts,
    lo: &LoadgenOpts,
) -> Result<ServeRun> {
    let t = Instant::now();
    let cluster = Cluster::start(transport.clone(), w, co)?;
    let startup = t.elapsed();
    let mut lo = lo.clone();
    lo.frontends = cluster.frontend_addrs();
    // The CPU this process uses over the measured window: sampled by a
    // thread at the window's ends as the load generator times them (its
    // arrivals start about 20 ms after the call, once connected).
    let secs = |d: crate::core::Dur| {
        Duration::try_from_secs_f64(d.as_secs_f64().max(0.0)).unwrap_or(Duration::MAX)
    };
    let (warmup, duration) = (secs(lo.warmup), secs(lo.duration));
    let (load, window_cpu_s) = std::thread::scope(|s| {
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let sampler = s.spawn(move || {
            let wait = |d: Duration| match stop_rx.recv_timeout(d) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Some(()),
                _ => None,
            };
            wait(warmup.saturating_add(Duration::from_millis(20)))?;
            let c0 = crate::harness::procs::self_cpu_seconds();
            wait(duration)?;
            Some(crate::harness::procs::self_cpu_seconds() - c0)
        });
        let load = loadgen::run(transport, w, &lo);
        drop(stop_tx);
        (load, sampler.join().ok().flatten())
    });
    let rep = cluster.stop()?;
    Ok(ServeRun {
        load: load?,
        cluster: rep,
        startup,
        window_cpu_s,
    })
}
