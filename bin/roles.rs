//! The process roles: `fermata scheduler|backend|frontend|loadgen|serve`.

use anyhow::{bail, Context, Result};
use clap::Args;
use fermata::core::Dur;
use fermata::harness::loadgen::{self, LoadgenOpts};
use fermata::node::backend::{BackendNode, BackendOpts};
use fermata::node::frontend::{FrontendNode, FrontendOpts};
use fermata::node::http::{HttpOpts, HttpServer};
use fermata::node::scheduler::{SchedulerNode, SchedulerOpts};
use fermata::node::serve::{self, ClusterOpts};
use fermata::transport::auth::ClusterKey;
use fermata::transport::{self, Transport};
use fermata::workload::{Arrival, Workload};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The workload `fermata serve` runs when none is given.
pub const DEFAULT_WORKLOAD: &str = include_str!("../configs/workloads/resnet50_8gpu.toml");

extern "C" fn on_signal(_: libc::c_int) {
    fermata::node::request_stop();
}

/// SIGINT and SIGTERM set a flag that the role's main loop polls.
pub fn catch_signals() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

pub fn signalled() -> bool {
    fermata::node::stop_requested()
}

/// The HTTP API's limits and threads (`frontend --http-listen`, `serve --http-port`).
#[derive(Args, Clone)]
pub struct HttpArgs {
    /// Worker threads of the HTTP server (default: half the cores, 2 to 16).
    #[arg(long)]
    http_threads: Option<usize>,
    /// Largest HTTP request body in bytes; larger ones get 413.
    #[arg(long, default_value_t = 64 << 20)]
    http_max_body_bytes: usize,
    /// Largest input tensor a request may declare, in bytes; larger ones get 413.
    #[arg(long, default_value_t = fermata::workload::MAX_INPUT_BYTES as usize)]
    http_max_tensor_bytes: usize,
    /// Most bytes of request bodies buffered at once, all requests together;
    /// a body beyond gets 503 with Retry-After (default: a quarter of the
    /// machine's memory, at least 256 MiB).
    #[arg(long)]
    http_max_buffered_bytes: Option<usize>,
    /// Most HTTP connections open at once; a new one beyond closes the one that
    /// has waited longest for its next request (default: the open-file limit
    /// less 128).
    #[arg(long)]
    http_max_connections: Option<usize>,
    /// Most inference request bodies read and waiting to be decoded, or being
    /// decoded, at once; a request beyond is refused with 429 and Retry-After
    /// before its body is read.
    #[arg(long, default_value_t = fermata::node::http::DEFAULT_MAX_PENDING)]
    http_max_pending: usize,
    /// A connection that sends no complete request head within this time (an
    /// idle keep-alive connection included) is closed.
    #[arg(long, default_value_t = 30_000)]
    http_header_timeout_ms: u64,
    /// A request body that has not arrived within this time of its head gets 408.
    #[arg(long, default_value_t = 30_000)]
    http_body_timeout_ms: u64,
    /// On SIGTERM/SIGINT, readiness answers 503 ("draining") for this long
    /// while requests are still served, so that a load balancer polling it
    /// stops sending first (ms; 0 to skip).
    #[arg(long, default_value_t = 1_000)]
    http_drain_ready_ms: u64,
    /// Then the requests being answered get this long to finish before the
    /// server closes (ms).
    #[arg(long, default_value_t = 10_000)]
    http_drain_timeout_ms: u64,
}

impl HttpArgs {
    /// The gRPC API's settings: the HTTP API's limits and threads.
    fn grpc_opts(&self, listen: &str) -> Result<fermata::node::grpc::GrpcOpts> {
        let h = self.opts(listen)?;
        let mut g = fermata::node::grpc::GrpcOpts::new(listen);
        g.threads = h.threads;
        g.max_message_bytes = h.max_body_bytes;
        g.max_tensor_bytes = h.max_tensor_bytes;
        g.max_buffered_bytes = h.max_buffered_bytes;
        Ok(g)
    }

    /// The drain on a signal: readiness 503 for --http-drain-ready-ms, then
    /// the requests in flight (at most --http-drain-timeout-ms); logged.
    fn drain(&self, f: &fermata::node::frontend::FrontendNode) {
        let ready = Duration::from_millis(self.http_drain_ready_ms.min(600_000));
        let wait = Duration::from_millis(self.http_drain_timeout_ms.min(600_000));
        if let Some(d) = f.drain_http(ready, wait) {
            if d.left > 0 {
                tracing::warn!(
                    left = d.left,
                    took_ms = d.took.as_millis() as u64,
                    "http: drained with requests still in flight"
                );
            } else {
                tracing::info!(took_ms = d.took.as_millis() as u64, "http: drained");
            }
        }
    }

    fn opts(&self, listen: &str) -> Result<HttpOpts> {
        let mut o = HttpOpts::new(listen);
        if let Some(t) = self.http_threads {
            if !(1..=64).contains(&t) {
                bail!("--http-threads must be between 1 and 64");
            }
            o.threads = t;
        }
        if self.http_max_body_bytes == 0 || self.http_max_tensor_bytes == 0 {
            bail!("--http-max-body-bytes and --http-max-tensor-bytes must be positive");
        }
        if let Some(m) = self.http_max_connections {
            let fds = fermata::node::http::default_max_connections();
            if m == 0 || m > fds {
                bail!(
                    "--http-max-connections must be between 1 and {fds} (the open-file limit, `ulimit -n`, less {})",
                    fermata::node::http::RESERVED_FDS
                );
            }
            o.max_connections = m;
        }
        for (flag, ms) in [
            ("--http-header-timeout-ms", self.http_header_timeout_ms),
            ("--http-body-timeout-ms", self.http_body_timeout_ms),
        ] {
            if !(100..=3_600_000).contains(&ms) {
                bail!("{flag} must be between 100 and 3600000, got {ms}");
            }
        }
        o.header_timeout = Duration::from_millis(self.http_header_timeout_ms);
        o.body_timeout = Duration::from_millis(self.http_body_timeout_ms);
        o.max_body_bytes = self.http_max_body_bytes;
        o.max_tensor_bytes = self.http_max_tensor_bytes;
        if self.http_max_pending == 0 {
            bail!("--http-max-pending must be positive");
        }
        o.max_pending = self.http_max_pending;
        if let Some(b) = self.http_max_buffered_bytes {
            if b < self.http_max_body_bytes {
                bail!(
                    "--http-max-buffered-bytes ({b}) must be at least --http-max-body-bytes ({})",
                    self.http_max_body_bytes
                );
            }
            o.max_buffered_bytes = b;
        }
        Ok(o)
    }
}

/// Serves `/metrics` at `listen` when asked for; announces where.
fn metrics_server(
    role: &str,
    listen: &Option<String>,
    regs: Vec<Arc<fermata::metrics::Registry>>,
) -> Result<Option<HttpServer>> {
    let Some(l) = listen else {
        return Ok(None);
    };
    let s = HttpServer::start_metrics(l, regs).with_context(|| format!("--metrics-listen {l}"))?;
    announce(format!("fermata {role} metrics listening on {}", s.addr()));
    Ok(Some(s))
}

fn announce(line: String) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

/// The environment variable that names the cluster secret file when
/// `--cluster-secret-file` is not given.
pub const SECRET_ENV: &str = "FERMATA_CLUSTER_SECRET_FILE";

/// The cluster secret (every role).
#[derive(Args, Clone)]
pub struct SecretArgs {
    /// The cluster secret: a file only its owner can read (make one with
    /// `fermata secret PATH`); every node of a cluster must have the same.
    /// Every internal connection runs a Noise channel keyed by it (each
    /// side proves the secret and every frame is authenticated and
    /// encrypted; docs/security.md). Default: $FERMATA_CLUSTER_SECRET_FILE.
    #[arg(long, value_name = "PATH")]
    cluster_secret_file: Option<PathBuf>,
}

impl SecretArgs {
    fn path(&self) -> Option<PathBuf> {
        self.cluster_secret_file
            .clone()
            .or_else(|| std::env::var_os(SECRET_ENV).map(PathBuf::from))
    }

    /// The key a role needs to join a cluster over `transport` (none for the
    /// in-process transport, which never leaves the process).
    fn key_for(&self, transport: &str) -> Result<Option<ClusterKey>> {
        match self.path() {
            Some(p) => Ok(Some(ClusterKey::from_file(&p).context("--cluster-secret-file")?)),
            None if transport == "inproc" => Ok(None),
            None => bail!(
                "no cluster secret: give --cluster-secret-file PATH (or ${SECRET_ENV}); every node of the cluster needs the same file; make one with `fermata secret PATH`"
            ),
        }
    }

    /// The role's transport, every connection of it through the secure
    /// channel over the key, naming `role` when it dials.
    fn transport(&self, name: &str, role: &'static str) -> Result<Arc<dyn Transport>> {
        let key = self.key_for(name)?.map(|k| k.with_role(role));
        transport::by_name_keyed(name, key).with_context(|| format!("--transport {name}"))
    }

    /// `fermata serve`: the given secret, else a fresh one (the whole cluster
    /// is in this process).
    fn key_or_new(&self) -> Result<ClusterKey> {
        match self.path() {
            Some(p) => Ok(ClusterKey::from_file(&p).context("--cluster-secret-file")?),
            None => Ok(ClusterKey::generate()),
        }
    }
}

/// `fermata secret PATH`: makes a new cluster secret file.
#[derive(Args)]
pub struct SecretCmdArgs {
    /// The file to create (mode 0600; an existing file is never overwritten).
    path: PathBuf,
}

pub fn cmd_secret(a: SecretCmdArgs) -> Result<()> {
    ClusterKey::create_file(&a.path)?;
    announce(format!(
        "fermata secret: wrote a new cluster secret to {} (give every node --cluster-secret-file {})",
        a.path.display(),
        a.path.display()
    ));
    Ok(())
}

pub fn workload_of(path: &Option<PathBuf>) -> Result<Workload> {
    match path {
        Some(p) => Workload::from_file(p),
        None => {
            Workload::from_toml(DEFAULT_WORKLOAD, None).context("the embedded default workload")
        }
    }
}

#[derive(Args)]
pub struct SchedulerArgs {
    /// Workload file (TOML): the models served (their profiles and SLOs) and the
    /// policy. Default: the embedded ResNet50 workload.
    #[arg(long)]
    workload: Option<PathBuf>,
    /// Where nodes connect (TCP host:port).
    #[arg(long, default_value = "127.0.0.1:7300")]
    listen: String,
    /// ModelThreads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// tcp or rdma.
    #[arg(long, default_value = "tcp")]
    transport: String,
    #[command(flatten)]
    secret: SecretArgs,
    /// Start as a hot standby of the primary scheduler at ADDR: listen at
    /// --listen, follow the primary (a ping every heartbeat) and serve only
    /// once it is gone (its connection closed and not reopened, or 3 heartbeats
    /// without a pong). Nodes take both: --scheduler PRIMARY,STANDBY.
    #[arg(long, value_name = "ADDR")]
    standby_of: Option<String>,
    /// Heartbeat period told to nodes (ms).
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
    /// A node silent this long is removed (ms).
    #[arg(long, default_value_t = 1000)]
    node_timeout_ms: u64,
    /// Plan watchdog: a backend that has not reported a plan done this long
    /// (or the batch's own latency, if longer) after the plan's planned end is
    /// taken out of service and the plan's tasks fail (ms).
    #[arg(long, default_value_t = 500)]
    plan_grace_ms: u64,
    /// Log registrations, removals and budget changes to stderr (the log level
    /// info; see --log-level).
    #[arg(long)]
    verbose: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics, and the autoscaling
    /// signals and advice as JSON at http://ADDR/v1/autoscale.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Autoscaling advice: add GPUs when the bad rate over the last 10 s is
    /// above this fraction.
    #[arg(long, default_value_t = 0.01)]
    autoscale_bad_threshold: f64,
    /// Autoscaling advice: release GPUs when their idle fraction over the last
    /// 10 s is above this.
    #[arg(long, default_value_t = 0.3)]
    autoscale_idle_threshold: f64,
    /// Autoscaling advice: keep this share of the GPUs' time spare (0: the
    /// paper's rule, which adds GPUs only once requests go bad): add GPUs when
    /// the busy ones need more than N·(1 − headroom), release down to that.
    #[arg(long, default_value_t = 0.0)]
    autoscale_headroom: f64,
    /// Autoscaling advice on the load's demand (0: off, the paper's rule):
    /// the GPUs the load needs are its demand (Σ rate·l(b)/b, b the batch each
    /// model's rate fills within its SLO) over this utilization, the demand
    /// carried along its trend to now or --autoscale-lookahead-s on, whichever
    /// is more; kept within 1.0–1.05× of that. 0.9 measured best in `fermata
    /// bench fig15` (see docs/control-plane.md).
    #[arg(long, default_value_t = 0.0)]
    autoscale_target_utilization: f64,
    /// With --autoscale-target-utilization: how far past the middle of the
    /// demand's 5-s window to size for a rising demand (s): 2.5 s, the
    /// autoscaler's interval and the time a new backend takes to serve.
    #[arg(long, default_value_t = 15.0)]
    autoscale_lookahead_s: f64,
    #[command(flatten)]
    subclusters: SubclusterArgs,
    #[command(flatten)]
    control: ModelControlArgs,
    #[command(flatten)]
    spin: SpinArgs,
    /// Override every model's input size in bytes (what load generators send).
    #[arg(long)]
    input_bytes: Option<u32>,
    /// Override the workload's policy: deferred, symphony, eager or timeout:FRAC.
    #[arg(long)]
    policy: Option<String>,
    #[command(flatten)]
    repo: RepoArgs,
    /// Cap on the measured control-delay budget d_ctrl (us).
    #[arg(long, default_value_t = 2000)]
    max_ctrl_us: u64,
    /// Cap on the measured input-pull budget d_data per request (us).
    #[arg(long, default_value_t = 500)]
    max_data_us: u64,
    /// Cap on a model's measured response margin, from a batch's end to its
    /// results handed to the clients, as the frontends report it (us).
    #[arg(long, default_value_t = 5000)]
    max_margin_us: u64,
    /// A deferred batch is planned at least this long before its latest start
    /// (us), for timing error; matters for models whose l(b+1) - l(b) is smaller.
    #[arg(long, default_value_t = 500)]
    slack_us: u64,
    /// Most GPUs one backend may register: a backend registering more is
    /// refused with an error naming this limit (each GPU holds a slot in
    /// every per-GPU table of the scheduler).
    #[arg(long, default_value_t = fermata::node::proto::bounds::DEFAULT_MAX_GPUS_PER_MEMBER)]
    max_gpus_per_member: u32,
    /// Most members (backends and frontends) registered at once: a
    /// registration past it is refused with an error naming this limit.
    #[arg(long, default_value_t = fermata::node::proto::bounds::DEFAULT_MAX_MEMBERS)]
    max_members: u32,
    #[command(flatten)]
    latency: LatencyArgs,
}

/// The scheduler planning each model with its measured latency (scheduler,
/// serve).
#[derive(Args, Clone)]
pub struct LatencyArgs {
    /// on: a model whose batches run slower than its profile (the median and
    /// the p90 of its last 20 batches' run time over its profile both more
    /// than 15% off the scale in force) is planned with its profile times
    /// that p90 (1 to 4; never below its profile); off: always with its
    /// profile as given.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    latency_rescale: String,
}

impl LatencyArgs {
    pub fn config(&self) -> fermata::node::proto::latency_scale::LatencyScaleConfig {
        use fermata::node::proto::latency_scale::LatencyScaleConfig;
        if self.latency_rescale == "off" {
            LatencyScaleConfig::off()
        } else {
            LatencyScaleConfig::default()
        }
    }
}

/// A model slowed down mid-run on the emulated executor (backend, serve).
#[derive(Args, Clone)]
pub struct SlowdownArgs {
    /// With --executor emulated: from SECONDS after the start on, MODEL's
    /// batches take K times their profile (K 0.05 to 20; may repeat; the
    /// rule for a model that started last is in force), e.g.
    /// resnet50=1.5@3.
    #[arg(long, value_name = "MODEL=K@SECONDS")]
    pub emulated_slowdown: Vec<fermata::node::exec::slowdown::Slowdown>,
}

/// Re-planning the applications on their measured fan-outs and latencies
/// (frontend, serve).
#[derive(Args, Clone)]
pub struct ReplanArgs {
    /// Re-plan each application (ensemble) on what its inputs and GPUs do:
    /// every SECS, the frontend compares each fan-out edge's measured mean
    /// item count and each step's measured run time over its profile with
    /// the ones its plan assumes (1 until measured) and, on a drift past
    /// --replan-threshold, plans the application again with the fermata
    /// planner at the measured fan-outs, the profiles scaled by the
    /// measured ratios and the request rate; new requests get the new
    /// plan's budgets (docs/applications.md). Off by default: the budgets
    /// stay the configuration's.
    #[arg(long, value_name = "SECS")]
    replan_every_s: Option<f64>,
    /// With --replan-every-s: the relative drift |measured / planned - 1|
    /// past which a fan-out or a latency ratio has drifted.
    #[arg(long, default_value_t = 0.25)]
    replan_threshold: f64,
    /// With --replan-every-s: parent outputs an edge, or module answers a
    /// step, needs in the window to be measured.
    #[arg(long, default_value_t = 50)]
    replan_min_samples: u64,
    /// With --replan-every-s: epochs the measurement window spans.
    #[arg(long, default_value_t = 1)]
    replan_window: usize,
    /// With --replan-every-s: consecutive epochs with a drift before a re-plan.
    #[arg(long, default_value_t = 1)]
    replan_confirm: u32,
    /// With --replan-every-s: epochs after a re-plan in which nothing triggers.
    #[arg(long, default_value_t = 0)]
    replan_cooldown: u32,
}

impl ReplanArgs {
    /// The checked settings (None without --replan-every-s).
    fn opts(&self) -> Result<Option<fermata::node::frontend::ReplanOpts>> {
        let Some(s) = self.replan_every_s else {
            return Ok(None);
        };
        if !(s.is_finite() && s > 0.0) {
            bail!("--replan-every-s must be positive");
        }
        let o = fermata::node::frontend::ReplanOpts {
            every: Duration::from_secs_f64(s.min(1e6)),
            drift: fermata::app::DriftConfig {
                threshold: self.replan_threshold,
                window: self.replan_window,
                min_samples: self.replan_min_samples,
                confirm: self.replan_confirm,
                cooldown: self.replan_cooldown,
            },
        };
        o.check().context("--replan-*")?;
        Ok(Some(o))
    }
}

/// Sub-clusters and the epoch partitioner (scheduler, serve).
#[derive(Args, Clone)]
pub struct SubclusterArgs {
    /// Sub-clusters: each has its own dispatcher (a RankThread and its
    /// ModelThreads, --threads each) and holds its own models; a backend joins
    /// the one with the fewest GPUs. The models are partitioned by the
    /// workload's rates at start and re-partitioned on the measured rates
    /// every --epoch-s, moving models live.
    #[arg(long, default_value_t = 1)]
    subclusters: u32,
    /// With --subclusters > 1: how often the partitioner re-runs (s).
    #[arg(long, default_value_t = 300.0)]
    epoch_s: f64,
    /// With --subclusters > 1: at most this many models change sub-cluster per
    /// epoch (each one load and one unload).
    #[arg(long, default_value_t = 8)]
    max_moves: usize,
    /// With --subclusters > 1: the partitioner's time limit per epoch (s).
    #[arg(long, default_value_t = 2.0)]
    partition_time_limit_s: f64,
    /// The GPU type of each sub-cluster, comma-separated, one per sub-cluster
    /// (e.g. `A100,A100,T4`). A backend joins a sub-cluster of its GPUs' type
    /// (its --gpu-type) and is refused when none has it; each model runs on
    /// the sub-clusters of its type (`gpu_type` in the workload, else its
    /// profile's GPU), partitioned per type. Default: untyped.
    #[arg(long, value_delimiter = ',')]
    subcluster_types: Vec<String>,
}

impl SubclusterArgs {
    /// The checked settings.
    fn epoch_opts(&self) -> Result<fermata::node::scheduler::epoch::EpochOpts> {
        use fermata::node::scheduler::epoch::{EpochOpts, MAX_SUBCLUSTERS};
        if !(1..=MAX_SUBCLUSTERS).contains(&self.subclusters) {
            bail!(
                "--subclusters must be between 1 and {MAX_SUBCLUSTERS}, got {}",
                self.subclusters
            );
        }
        for (what, v) in [
            ("--epoch-s", self.epoch_s),
            ("--partition-time-limit-s", self.partition_time_limit_s),
        ] {
            if !(v.is_finite() && (0.1..=86_400.0).contains(&v)) {
                bail!("{what} must be between 0.1 and 86400 seconds, got {v}");
            }
        }
        Ok(EpochOpts {
            subclusters: self.subclusters,
            every: Duration::from_secs_f64(self.epoch_s),
            max_moves: Some(self.max_moves),
            time_limit: Duration::from_secs_f64(self.partition_time_limit_s),
            types: self.subcluster_types.clone(),
            ..Default::default()
        })
    }
}

/// Model control (scheduler, serve): Triton's `--model-control-mode`.
#[derive(Args, Clone)]
pub struct ModelControlArgs {
    /// none: every model is loaded at start and clients' loads and unloads
    /// are refused (Triton's default). explicit: only the --load-model
    /// models are loaded at start; clients load and unload models over
    /// HTTP (`POST /v2/repository/models/NAME/load|unload`) and gRPC
    /// (RepositoryModelLoad/Unload). poll: every model is loaded at start,
    /// then the model repository (--models) is looked at every
    /// --repository-poll-secs: a model whose files are removed is unloaded,
    /// one put back or changed is loaded (again); clients' loads and unloads
    /// are refused.
    #[arg(long, default_value = "none")]
    model_control_mode: String,
    /// With --model-control-mode explicit: a model loaded at start (repeat
    /// for several).
    #[arg(long = "load-model", value_name = "NAME")]
    load_model: Vec<String>,
    /// With --model-control-mode poll: seconds between looks at the model
    /// repository.
    #[arg(long, default_value_t = 15.0)]
    repository_poll_secs: f64,
}

impl ModelControlArgs {
    /// The options, with the model repository served (`--models`), if any.
    fn opts(
        &self,
        repository: Option<&Path>,
    ) -> Result<fermata::node::scheduler::ModelControlOpts> {
        if !(0.1..=86_400.0).contains(&self.repository_poll_secs) {
            bail!(
                "--repository-poll-secs must be between 0.1 and 86400, got {}",
                self.repository_poll_secs
            );
        }
        Ok(fermata::node::scheduler::ModelControlOpts {
            mode: self
                .model_control_mode
                .parse()
                .map_err(anyhow::Error::msg)?,
            load: self.load_model.clone(),
            repository: repository.map(Path::to_path_buf),
            poll_every: Duration::from_secs_f64(self.repository_poll_secs),
        })
    }
}

/// Serving a model repository instead of a workload file (scheduler, loadgen).
#[derive(Args, Clone)]
pub struct RepoArgs {
    /// Serve every model of this repository (their metadata and measured
    /// profiles) instead of --workload; backends then need --executor onnx|cuda.
    #[arg(long)]
    models: Option<PathBuf>,
    /// With --models: whose profiles to use (onnx: STEM.profile-cpu.json, cuda:
    /// STEM.profile-cuda.json).
    #[arg(long, default_value = "onnx")]
    profiles: String,
}

impl RepoArgs {
    /// The repository's workload, if --models was given (not with --workload).
    fn workload(&self, workload: &Option<PathBuf>, rate: Option<f64>) -> Result<Option<Workload>> {
        let Some(dir) = &self.models else {
            return Ok(None);
        };
        if workload.is_some() {
            bail!("give --workload or --models, not both");
        }
        repository_workload(dir, &self.profiles, 1, rate, 1).map(Some)
    }
}

/// Every model of the repository `dir` with its profile for `profiles` (onnx,
/// cuda), on `gpus` GPUs at `rate` (default [`REPO_DEFAULT_RATE`]). Each
/// profile must be d(b, `lanes`): measured with as many batches at once as
/// each GPU will run.
pub(crate) fn repository_workload(
    dir: &std::path::Path,
    profiles: &str,
    gpus: u32,
    rate: Option<f64>,
    lanes: u32,
) -> Result<Workload> {
    let models = fermata::repo::load_repository(dir, profiles)?;
    if let Some(m) = models.iter().find(|m| m.profile.lanes != lanes) {
        bail!(
            "{}'s {profiles} profile is d(b, {}), measured with {} batch(es) at once, but each \
             GPU runs {lanes} (--lanes {lanes}); measure d(b, {lanes}) with `fermata profile \
             --model {} --executor {profiles} --lanes {lanes}`",
            m.meta.name,
            m.profile.lanes,
            m.profile.lanes,
            m.file.display()
        );
    }
    Workload::from_repository(
        &format!("{} ({profiles})", dir.display()),
        &models,
        gpus,
        rate.unwrap_or(REPO_DEFAULT_RATE),
    )
}

#[derive(Args, Clone, Copy)]
pub struct SpinArgs {
    /// The RankThread spins this long before a timer instead of sleeping (us).
    #[arg(long, default_value_t = 100)]
    rank_spin_us: u64,
    /// A ModelThread polls this long for more work before it parks (us).
    #[arg(long, default_value_t = 100)]
    model_spin_us: u64,
}

/// Applies `--input-bytes`.
pub(crate) fn set_input_bytes(w: &mut Workload, b: Option<u32>) -> Result<()> {
    if let Some(b) = b {
        if !(1..=fermata::workload::MAX_INPUT_BYTES).contains(&b) {
            bail!(
                "--input-bytes must be between 1 and {}, got {b}",
                fermata::workload::MAX_INPUT_BYTES
            );
        }
        for m in &mut w.models {
            m.input_bytes = b;
        }
    }
    Ok(())
}

pub fn cmd_scheduler(a: SchedulerArgs) -> Result<()> {
    catch_signals();
    for (what, v) in [
        ("--autoscale-bad-threshold", a.autoscale_bad_threshold),
        ("--autoscale-idle-threshold", a.autoscale_idle_threshold),
    ] {
        if !(0.0..=1.0).contains(&v) {
            bail!("{what} must be a fraction between 0 and 1, got {v}");
        }
    }
    if !(0.0..=1.0).contains(&a.autoscale_target_utilization)
        || !(0.0..=3600.0).contains(&a.autoscale_lookahead_s)
    {
        bail!("--autoscale-target-utilization must be in [0, 1] and --autoscale-lookahead-s in [0, 3600]");
    }
    if !(0.0..0.9).contains(&a.autoscale_headroom) {
        bail!(
            "--autoscale-headroom must be in [0, 0.9), got {}",
            a.autoscale_headroom
        );
    }
    let max_gpus = fermata::wire::MAX_ITEMS as u32;
    if !(1..=max_gpus).contains(&a.max_gpus_per_member) || a.max_members < 2 {
        bail!(
            "--max-gpus-per-member must be between 1 and {max_gpus} (what one registration carries) and --max-members at least 2, got {} and {}",
            a.max_gpus_per_member,
            a.max_members
        );
    }
    let limits = fermata::node::proto::bounds::Limits {
        max_gpus_per_member: a.max_gpus_per_member,
        max_members: a.max_members,
    };
    let mut w = match a.repo.workload(&a.workload, None)? {
        Some(w) => w,
        None => workload_of(&a.workload)?,
    };
    if a.repo.models.is_some() && a.input_bytes.is_some() {
        bail!("--input-bytes is for emulated workloads; real models take their own inputs");
    }
    set_input_bytes(&mut w, a.input_bytes)?;
    if let Some(p) = &a.policy {
        w.policy = p.parse().map_err(anyhow::Error::msg).context("--policy")?;
    }
    if a.heartbeat_ms == 0 || a.node_timeout_ms <= a.heartbeat_ms {
        bail!("need 0 < --heartbeat-ms < --node-timeout-ms");
    }
    if a.plan_grace_ms < a.heartbeat_ms {
        bail!(
            "--plan-grace-ms must be at least --heartbeat-ms (the watchdog looks once a heartbeat)"
        );
    }
    let epoch = a.subclusters.epoch_opts()?;
    let s = SchedulerNode::start(
        a.secret.transport(&a.transport, "scheduler")?,
        &w,
        SchedulerOpts {
            listen: a.listen,
            model_threads: a.threads,
            heartbeat: Duration::from_millis(a.heartbeat_ms),
            node_timeout: Duration::from_millis(a.node_timeout_ms),
            plan_grace: Duration::from_millis(a.plan_grace_ms),
            rank_spin: Dur::from_us(a.spin.rank_spin_us as i64),
            model_spin: Dur::from_us(a.spin.model_spin_us as i64),
            max_ctrl: Dur::from_us(a.max_ctrl_us as i64),
            max_data: Dur::from_us(a.max_data_us as i64),
            max_margin: Dur::from_us(a.max_margin_us as i64),
            min_slack: Dur::from_us(a.slack_us as i64),
            standby_of: a.standby_of.clone(),
            advice: fermata::plan::autoscale::AdviceConfig {
                bad_threshold: a.autoscale_bad_threshold,
                idle_threshold: a.autoscale_idle_threshold,
                headroom: a.autoscale_headroom,
                target_utilization: a.autoscale_target_utilization,
                lookahead_s: a.autoscale_lookahead_s,
                ..Default::default()
            },
            epoch,
            limits,
            control: a.control.opts(a.repo.models.as_deref())?,
            latency: a.latency.config(),
            ..SchedulerOpts::default()
        },
    )?;
    match &a.standby_of {
        Some(p) => announce(format!(
            "fermata scheduler listening on {} (standby of {p})",
            s.addr()
        )),
        None => announce(format!("fermata scheduler listening on {}", s.addr())),
    }
    let m = match &a.metrics_listen {
        None => None,
        Some(l) => {
            let json: fermata::node::http::JsonGet = Arc::new(s.autoscale_json());
            let srv = HttpServer::start_metrics_with(
                l,
                vec![s.metrics()],
                vec![("v1/autoscale".into(), json)],
            )
            .with_context(|| format!("--metrics-listen {l}"))?;
            announce(format!(
                "fermata scheduler metrics listening on {}",
                srv.addr()
            ));
            Some(srv)
        }
    };
    let mut announced = false;
    let mut stepped_down = None;
    while !signalled() {
        std::thread::sleep(Duration::from_millis(5));
        if let Some(why) = s.stepped_down() {
            stepped_down = Some(why);
            break;
        }
        if let (Some(st), false) = (s.standby(), announced) {
            if let Some((why, after)) = st.took_over.lock().expect("lock").clone() {
                announce(format!(
                    "fermata scheduler took over ({why}; {:.1} ms after the last sign of it)",
                    after.as_secs_f64() * 1e3
                ));
                announced = true;
            }
        }
    }
    if let Some(m) = m {
        m.stop();
    }
    let rep = s.stop()?;
    announce(serde_json::to_string(&rep)?);
    if let Some(why) = stepped_down {
        announce(format!("fermata scheduler stepped down: {why}"));
        bail!(
            "this scheduler was {why}: it serves no more. Start it again with --standby-of the serving scheduler to have a standby"
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct BackendArgs {
    /// The scheduler's address; a primary and its standbys separated by
    /// commas (tried in turn).
    #[arg(long, default_value = "127.0.0.1:7300")]
    scheduler: String,
    /// GPUs on this backend (with --executor onnx: ONNX Runtime CPU workers, one
    /// session per model each; with cuda: CUDA devices 0..N).
    #[arg(long, default_value_t = 1)]
    gpus: u32,
    /// What runs the batches: emulated (waits l(b)), onnx (ONNX Runtime, CPU) or
    /// cuda (ONNX Runtime's CUDA provider; needs the `cuda` build feature).
    #[arg(long, default_value = "emulated")]
    executor: String,
    /// Where the onnx/cuda executors find each model's NAME.onnx.
    #[arg(long, default_value = "models")]
    models: PathBuf,
    /// With --executor cuda: the CUDA device of each GPU, e.g. 0,2 (one per
    /// --gpus; default: GPU g on device g).
    #[arg(long)]
    cuda_devices: Option<String>,
    /// The type its GPUs register as, which typed sub-clusters
    /// (the scheduler's --subcluster-types) match. Default: the device's
    /// name with --executor cuda, else the executor's name.
    #[arg(long)]
    gpu_type: Option<String>,
    /// Batches each GPU runs at once (1 to 64): each GPU registers with the
    /// scheduler as this many slots (lanes), each with its own executor (for
    /// cuda: its own sessions and streams on the GPU's device). The models'
    /// profiles must then be d(b, E), a batch's latency while E run at once:
    /// measure them with `fermata profile --lanes E`.
    #[arg(long, default_value_t = 1)]
    lanes: u32,
    #[arg(long, default_value = "backend")]
    name: String,
    /// tcp or rdma.
    #[arg(long, default_value = "tcp")]
    transport: String,
    #[command(flatten)]
    secret: SecretArgs,
    /// Log at level info (see --log-level).
    #[arg(long)]
    verbose: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// On SIGTERM or SIGINT, drain before leaving: the scheduler plans nothing
    /// more here, the plans already sent finish, then the backend unregisters
    /// (no request fails). Waits at most this long (s); 0: leave at once.
    #[arg(long, default_value_t = 30.0)]
    drain_timeout_s: f64,
    #[command(flatten)]
    slowdown: SlowdownArgs,
}

pub fn cmd_backend(a: BackendArgs) -> Result<()> {
    if !(a.drain_timeout_s.is_finite() && (0.0..=3600.0).contains(&a.drain_timeout_s)) {
        bail!("--drain-timeout-s must be between 0 and 3600");
    }
    catch_signals();
    let devices = cuda_devices_of(&a.cuda_devices)?;
    let mut o =
        BackendOpts::with_executor_on(&a.scheduler, a.gpus, &a.executor, &a.models, devices)
            .with_context(|| format!("--executor {}", a.executor))?;
    o.name = a.name;
    if let Some(t) = &a.gpu_type {
        o.set_gpu_type(t)?;
    }
    o.set_lanes(a.lanes)?;
    o.set_emulated_slowdown(
        fermata::node::exec::slowdown::Slowdowns::new(
            a.slowdown.emulated_slowdown.clone(),
            std::time::Instant::now(),
        )
        .map_err(anyhow::Error::msg)?,
    )?;
    let b = BackendNode::start(a.secret.transport(&a.transport, "backend")?, o)?;
    let ids = b.wait_ready(Duration::from_secs(30))?;
    announce(format!("fermata backend ready: GPUs {ids:?}"));
    let m = metrics_server("backend", &a.metrics_listen, vec![b.metrics()])?;
    // The backend rejoins on its own when it loses the scheduler; each return
    // is announced like the first start.
    let mut rejoins = 0;
    while !signalled() && !b.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
        if b.rejoins() > rejoins {
            rejoins = b.rejoins();
            announce(format!(
                "fermata backend back in service (rejoin {rejoins})"
            ));
        }
    }
    if let Some(m) = m {
        m.stop();
    }
    let lost = !signalled();
    let rep = if lost {
        b.join()
    } else if a.drain_timeout_s > 0.0 {
        announce("fermata backend draining".to_string());
        let (rep, clean) = b.drain("signalled", Duration::from_secs_f64(a.drain_timeout_s));
        announce(format!(
            "fermata backend {}",
            if clean {
                "drained"
            } else {
                "not drained in time; left anyway"
            }
        ));
        rep
    } else {
        b.stop()
    };
    announce(serde_json::to_string(&rep)?);
    if let Some(e) = rep.error {
        bail!("{e}");
    }
    Ok(())
}

#[derive(Args)]
pub struct FrontendArgs {
    /// The scheduler's address; a primary and its standbys separated by
    /// commas (tried in turn).
    #[arg(long, default_value = "127.0.0.1:7300")]
    scheduler: String,
    /// Where clients connect and backends push results.
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: String,
    /// Where backends read inputs (one-sided).
    #[arg(long, default_value = "127.0.0.1:7401")]
    data_listen: String,
    /// The host (name or IP) the scheduler and backends are told to dial for
    /// --listen and --data-listen, with their ports. Default: the bound
    /// address; bound to 0.0.0.0 or [::] (a pod), $POD_IP, else the first
    /// non-loopback address of this host's name.
    #[arg(long, value_name = "HOST")]
    advertise: Option<String>,
    /// Size of the input region (MiB).
    #[arg(long, default_value_t = 1024)]
    region_mib: u64,
    #[arg(long, default_value = "frontend")]
    name: String,
    /// tcp or rdma.
    #[arg(long, default_value = "tcp")]
    transport: String,
    #[command(flatten)]
    secret: SecretArgs,
    /// Serve the KServe v2 HTTP API (and /metrics) at ADDR (host:port).
    #[arg(long, value_name = "ADDR")]
    http_listen: Option<String>,
    /// Serve the applications (ensembles, `platform: "ensemble"`) of the
    /// model repository DIR over the scheduler's models (docs/applications.md).
    #[arg(long, value_name = "DIR")]
    apps: Option<std::path::PathBuf>,
    #[command(flatten)]
    replan: ReplanArgs,
    /// Serve the KServe v2 / Triton gRPC API at ADDR (host:port), with the
    /// HTTP API's limits (--http-threads, --http-max-body-bytes per message,
    /// --http-max-tensor-bytes).
    #[arg(long, value_name = "ADDR")]
    grpc_listen: Option<String>,
    #[command(flatten)]
    http: HttpArgs,
}

pub fn cmd_frontend(a: FrontendArgs) -> Result<()> {
    catch_signals();
    if a.region_mib == 0 || a.region_mib > 1 << 20 {
        bail!("--region-mib must be between 1 and 1048576");
    }
    let mut o = FrontendOpts::new(&a.scheduler);
    o.listen = a.listen;
    o.data_listen = a.data_listen;
    o.advertise = a.advertise;
    o.region_bytes = a.region_mib << 20;
    o.name = a.name;
    if let Some(d) = &a.apps {
        o.apps = fermata::triton_ensemble::load_all(d)?;
    }
    o.replan = a.replan.opts()?;
    if let Some(l) = &a.http_listen {
        o.http = Some(a.http.opts(l)?);
    }
    if let Some(l) = &a.grpc_listen {
        o.grpc = Some(a.http.grpc_opts(l)?);
    }
    let f = FrontendNode::start(a.secret.transport(&a.transport, "frontend")?, o)?;
    announce(format!("fermata frontend listening on {}", f.addr()));
    if let Some(h) = f.http_addr() {
        announce(format!("fermata frontend HTTP API listening on {h}"));
    }
    if let Some(g) = f.grpc_addr() {
        announce(format!("fermata frontend gRPC API listening on {g}"));
    }
    let mut rejoins = 0;
    while !signalled() && !f.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
        if f.rejoins() > rejoins {
            rejoins = f.rejoins();
            announce(format!(
                "fermata frontend back in service (rejoin {rejoins})"
            ));
        }
    }
    if signalled() {
        a.http.drain(&f);
    }
    let rep = f.stop();
    announce(serde_json::to_string(&rep)?);
    Ok(())
}

#[derive(Args, Clone)]
pub struct LoadArgs {
    /// Workload file (TOML); default: the embedded ResNet50 workload.
    #[arg(long)]
    workload: Option<PathBuf>,
    /// Aggregate rate (requests/s); default: the workload's.
    #[arg(long)]
    rate: Option<f64>,
    /// Measured seconds; default 10.
    #[arg(long, default_value_t = 10.0)]
    duration_s: f64,
    /// Warm-up seconds (not measured); default 2.
    #[arg(long, default_value_t = 2.0)]
    warmup_s: f64,
    /// constant, poisson or gamma:SHAPE; default: the workload's.
    #[arg(long)]
    arrival: Option<String>,
    #[arg(long)]
    seed: Option<u64>,
    /// Do not check outputs against the emulated GPU's.
    #[arg(long)]
    no_verify: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

impl LoadArgs {
    fn options(&self, w: &Workload, frontends: Vec<String>) -> Result<LoadgenOpts> {
        let mut o = LoadgenOpts::new(frontends, w);
        if let Some(r) = self.rate {
            if !(r > 0.0 && r.is_finite()) {
                bail!("--rate must be > 0, got {r}");
            }
            o.rate_rps = r;
        }
        if !(self.duration_s > 0.0 && self.duration_s <= 86_400.0) {
            bail!("--duration-s must be in (0, 86400]");
        }
        if !(0.0..=86_400.0).contains(&self.warmup_s) {
            bail!("--warmup-s must be in [0, 86400]");
        }
        o.duration = Dur::from_secs_f64(self.duration_s);
        o.warmup = Dur::from_secs_f64(self.warmup_s);
        if let Some(a) = &self.arrival {
            o.arrival = a
                .parse::<Arrival>()
                .map_err(anyhow::Error::msg)
                .context("--arrival")?;
        }
        if let Some(s) = self.seed {
            o.seed = s;
        }
        o.verify = !self.no_verify;
        Ok(o)
    }
}

#[derive(Args)]
pub struct LoadgenArgs {
    /// Frontend addresses, comma-separated.
    #[arg(long, default_value = "127.0.0.1:7400")]
    frontend: String,
    #[arg(long, default_value = "tcp")]
    transport: String,
    #[command(flatten)]
    secret: SecretArgs,
    #[command(flatten)]
    repo: RepoArgs,
    #[command(flatten)]
    load: LoadArgs,
}

fn print_load(
    w: &Workload,
    r: &loadgen::LoadReport,
    json: bool,
    extra: Option<serde_json::Value>,
) -> Result<()> {
    let mut v = r.json(w);
    if let (serde_json::Value::Object(m), Some(serde_json::Value::Object(x))) = (&mut v, extra) {
        m.extend(x);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let l = &r.latency_us;
    println!(
        "workload {} | offered {:.1} r/s over {:.1} s | goodput {:.1} r/s | bad {:.2}% (worst model {:.2}%)",
        w.name,
        r.sim.rate_rps,
        r.sim.window.as_secs_f64(),
        r.sim.goodput_rps(),
        100.0 * r.sim.bad_rate(),
        100.0 * r.sim.max_model_bad_rate()
    );
    println!(
        "latency p50 {:.2} ms, p99 {:.2} ms | failed {} | unanswered {} | duplicates {} | wrong outputs {}",
        l.value_at_quantile(0.5) as f64 / 1e3,
        l.value_at_quantile(0.99) as f64 / 1e3,
        r.failed,
        r.unanswered,
        r.duplicates,
        r.wrong_outputs
    );
    for (message, n) in &r.failed_reasons {
        println!("  failed {n}: {message}");
    }
    for l in &r.lost {
        let ex: Vec<String> = l
            .examples
            .iter()
            .map(|(req, m)| format!("#{req} ({m})"))
            .collect();
        println!(
            "frontend {} lost at {:.2} s ({}): {} requests never answered{}",
            l.addr,
            l.at_secs,
            l.reason,
            l.open,
            if ex.is_empty() {
                String::new()
            } else {
                format!(", e.g. {}", ex.join(", "))
            }
        );
    }
    print!("{}", fermata::bench::sim_table(&r.sim));
    Ok(())
}

pub fn cmd_loadgen(a: LoadgenArgs) -> Result<()> {
    let w = match a.repo.workload(&a.load.workload, a.load.rate)? {
        Some(w) => w,
        None => workload_of(&a.load.workload)?,
    };
    let fes: Vec<String> = a
        .frontend
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let n = fes.len();
    let o = a.load.options(&w, fes)?;
    let r = loadgen::run(a.secret.transport(&a.transport, "loadgen")?, &w, &o)?;
    print_load(&w, &r, a.load.json, None)?;
    if r.lost.len() >= n {
        bail!(
            "every frontend was lost during the run: {} requests sent, {} answered, {} in flight when lost, {} never sent",
            r.sent,
            r.answered,
            r.sent.saturating_sub(r.answered),
            r.never_sent
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct ServeArgs {
    /// in-process (default) or tcp (loopback sockets, still one process).
    #[arg(long, default_value = "inproc")]
    transport: String,
    /// With --transport tcp: the cluster secret its connections prove (default:
    /// a fresh one, made at start; give a file to let other processes join).
    #[command(flatten)]
    secret: SecretArgs,
    /// Backend nodes (the workload's GPUs are split among them).
    #[arg(long, default_value_t = 1)]
    backends: u32,
    #[arg(long, default_value_t = 1)]
    frontends: u32,
    /// ModelThreads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[command(flatten)]
    subclusters: SubclusterArgs,
    #[command(flatten)]
    control: ModelControlArgs,
    /// Log at level info (see --log-level).
    #[arg(long)]
    verbose: bool,
    /// Serve the KServe v2 HTTP API (and /metrics of every node) on this port of
    /// --http-host, from the first frontend. Without --rate, `serve` runs no load
    /// and serves HTTP until Ctrl-C or SIGTERM; with --rate it runs the load
    /// generator as usual while HTTP is served too.
    #[arg(long, value_name = "PORT")]
    http_port: Option<u16>,
    /// The address the HTTP API binds to.
    #[arg(long, default_value = "127.0.0.1")]
    http_host: String,
    /// Serve the KServe v2 / Triton gRPC API on this port of --http-host too
    /// (with --http-port; the HTTP API's limits apply).
    #[arg(long, value_name = "PORT", requires = "http_port")]
    grpc_port: Option<u16>,
    #[command(flatten)]
    http: HttpArgs,
    #[command(flatten)]
    replan: ReplanArgs,
    /// The RankThread spins this long before a timer instead of sleeping (us;
    /// small by default: everything shares this machine's cores).
    #[arg(long, default_value_t = 20)]
    rank_spin_us: u64,
    /// A ModelThread polls this long for more work before it parks (us).
    #[arg(long, default_value_t = 20)]
    model_spin_us: u64,
    /// Override every model's input size in bytes (emulated only).
    #[arg(long)]
    input_bytes: Option<u32>,
    /// Override the workload's scheduling policy, as `fermata scheduler
    /// --policy`: deferred, symphony, eager, timeout:FRAC, clockwork[:MS], shepherd[:K]
    /// or nexus.
    #[arg(long)]
    policy: Option<String>,
    /// What runs the batches: emulated (the workload's profiles, waits l(b)),
    /// onnx (ONNX Runtime on the CPU: serves every model of --models under its
    /// file stem, with its measured profile) or cuda (feature `cuda`).
    #[arg(long, default_value = "emulated")]
    executor: String,
    /// The model repository that onnx and cuda serve.
    #[arg(long, default_value = "models")]
    models: PathBuf,
    /// GPUs (default: the workload's; with onnx 1: each is one worker thread
    /// with one ONNX Runtime CPU session per model).
    #[arg(long)]
    gpus: Option<u32>,
    /// With --executor cuda: the CUDA device of each GPU, e.g. 0,2 (default: GPU
    /// g on device g); sets --gpus to their number.
    #[arg(long)]
    cuda_devices: Option<String>,
    /// Batches each GPU runs at once (1 to 64), as `fermata backend --lanes`:
    /// the scheduler sees each GPU as this many lanes, planned with the
    /// models' profiles, which must then be d(b, E).
    #[arg(long, default_value_t = 1)]
    lanes: u32,
    #[command(flatten)]
    load: LoadArgs,
    #[command(flatten)]
    latency: LatencyArgs,
    #[command(flatten)]
    slowdown: SlowdownArgs,
}

/// The offered rate of a model-repository workload when --rate is not given
/// (requests/s over all models).
pub const REPO_DEFAULT_RATE: f64 = 100.0;

/// The workload of `serve`: the workload file (emulated), or the model repository
/// with its profiles for the executor (onnx, cuda).
fn serve_workload(a: &ServeArgs) -> Result<Workload> {
    let mut w = serve_workload_of(a)?;
    if let Some(p) = &a.policy {
        w.policy = p.parse().map_err(anyhow::Error::msg).context("--policy")?;
    }
    Ok(w)
}

/// The workload `serve` runs before `--policy`.
fn serve_workload_of(a: &ServeArgs) -> Result<Workload> {
    let devices = cuda_devices_of(&a.cuda_devices)?;
    let gpus = match (&devices, a.gpus) {
        (Some(d), Some(g)) if d.len() != g as usize => {
            bail!("--cuda-devices lists {} devices but --gpus is {g}", d.len())
        }
        (Some(d), _) => Some(d.len() as u32),
        (None, g) => g,
    };
    if let Some(g) = gpus {
        if !(1..=4096).contains(&g) {
            bail!("--gpus must be between 1 and 4096, got {g}");
        }
    }
    if a.executor == "emulated" {
        let mut w = workload_of(&a.load.workload)?;
        set_input_bytes(&mut w, a.input_bytes)?;
        if let Some(g) = a.gpus {
            w.gpus = g;
        }
        return Ok(w);
    }
    if a.load.workload.is_some() {
        bail!(
            "--executor {} serves the models of the repository (--models {}); --workload is for \
             the emulated executor",
            a.executor,
            a.models.display()
        );
    }
    if a.input_bytes.is_some() {
        bail!("--input-bytes is for the emulated executor; real models take their own inputs");
    }
    // The executor first: an unknown kind, no ONNX Runtime or no GPU is the error
    // to report, before the repository's profiles.
    let _ = fermata::node::exec::executor_factory(&a.executor, &a.models)
        .with_context(|| format!("--executor {}", a.executor))?;
    repository_workload(
        &a.models,
        &a.executor,
        gpus.unwrap_or(1),
        a.load.rate,
        a.lanes,
    )
}

/// `--cuda-devices`, parsed when given.
pub(crate) fn cuda_devices_of(s: &Option<String>) -> Result<Option<Vec<u32>>> {
    s.as_deref()
        .map(fermata::node::exec::parse_cuda_devices)
        .transpose()
}

/// `serve --http-port` without load: the cluster serves HTTP until a signal.
fn serve_http_only(
    tr: Arc<dyn Transport>,
    w: &Workload,
    co: &ClusterOpts,
    http: &HttpArgs,
) -> Result<()> {
    catch_signals();
    let c = serve::Cluster::start(tr, w, co)?;
    let addr = c.frontends[0]
        .http_addr()
        .context("the first frontend has no HTTP server")?;
    let grpc = c.frontends[0]
        .grpc_addr()
        .map(|g| format!(" | gRPC API listening on {g}"))
        .unwrap_or_default();
    announce(format!(
        "fermata serve: {} ({} GPUs, {} executor) | HTTP API listening on http://{addr}{grpc} (Ctrl-C to stop)",
        w.name, w.gpus, co.executor
    ));
    while !signalled() {
        std::thread::sleep(Duration::from_millis(20));
    }
    http.drain(&c.frontends[0]);
    let rep = c.stop()?;
    announce(serde_json::to_string(&rep)?);
    Ok(())
}

impl ServeArgs {
    pub fn verbose(&self) -> bool {
        self.verbose
    }
}
impl SchedulerArgs {
    pub fn verbose(&self) -> bool {
        self.verbose
    }
}
impl BackendArgs {
    pub fn verbose(&self) -> bool {
        self.verbose
    }
}

pub fn cmd_serve(a: ServeArgs) -> Result<()> {
    let w = serve_workload(&a)?;
    let key = (a.transport != "inproc")
        .then(|| a.secret.key_or_new().map(|k| k.with_role("serve")))
        .transpose()?;
    let tr = transport::by_name_keyed(&a.transport, key)
        .with_context(|| format!("--transport {}", a.transport))?;
    let co = ClusterOpts {
        backends: a.backends,
        frontends: a.frontends,
        model_threads: a.threads,
        host: if a.transport == "tcp" {
            "127.0.0.1".into()
        } else {
            "fermata".into()
        },
        rank_spin_us: a.rank_spin_us,
        model_spin_us: a.model_spin_us,
        executor: a.executor.clone(),
        models_dir: a.models.clone(),
        // A real executor serves the repository: its ensembles too.
        apps: if a.executor == "emulated" {
            Vec::new()
        } else {
            fermata::triton_ensemble::load_all(&a.models)?
        },
        replan: a.replan.opts()?,
        cuda_devices: cuda_devices_of(&a.cuda_devices)?,
        lanes: a.lanes,
        epoch: a.subclusters.epoch_opts()?,
        latency: a.latency.config(),
        emulated_slowdown: a.slowdown.emulated_slowdown.clone(),
        control: a
            .control
            .opts((a.executor != "emulated").then_some(a.models.as_path()))?,
        http: match a.http_port {
            Some(p) => Some(a.http.opts(&format!("{}:{p}", a.http_host))?),
            None => None,
        },
        grpc: match a.grpc_port {
            Some(p) => Some(a.http.grpc_opts(&format!("{}:{p}", a.http_host))?),
            None => None,
        },
        ..ClusterOpts::default()
    };
    if co.http.is_some() && a.load.rate.is_none() {
        return serve_http_only(tr, &w, &co, &a.http);
    }
    let lo = a.load.options(&w, Vec::new())?;
    if !a.load.json {
        eprintln!(
            "fermata serve: {} ({} GPUs, {}, policy {}) over {} | {} backend(s), {} frontend(s) | {:.0} r/s for {:.1}+{:.1} s",
            w.name,
            w.gpus,
            a.executor,
            w.policy,
            tr.name(),
            a.backends,
            a.frontends,
            lo.rate_rps,
            lo.warmup.as_secs_f64(),
            lo.duration.as_secs_f64()
        );
    }
    let r = serve::serve(tr, &w, &co, &lo)?;
    let s = &r.cluster.scheduler;
    let extra = serde_json::json!({
        "startup_ms": r.startup.as_secs_f64() * 1e3,
        "policy": w.policy.to_string(),
        "d_ctrl_us": s.d_ctrl_us,
        "d_data_fixed_us": s.d_data_fixed_us,
        "d_data_us": s.d_data_us,
        "hold_fixed_us": s.hold_fixed_us,
        "hold_us": s.hold_us,
        "input_copies": r.cluster.input_copies(),
        "cluster": r.cluster,
    });
    if !a.load.json {
        println!(
            "started in {:.0} ms | d_ctrl {:.0} us, d_data {:.0} us per batch + {:.1} us per input, puller hold {:.0} us per batch + {:.1} us per input | plans {} | backend start delay p99 {:.0} us | plan lead p1 {:.0} us (pulled {:.0} us)",
            r.startup.as_secs_f64() * 1e3,
            s.d_ctrl_us,
            s.d_data_fixed_us,
            s.d_data_us,
            s.hold_fixed_us,
            s.hold_us,
            s.plans_sent,
            r.cluster.backends.iter().map(|b| b.start_delay_p99_us).fold(0.0, f64::max),
            r.cluster.backends.iter().map(|b| b.lead_arrived_p1_us).fold(f64::MAX, f64::min),
            r.cluster.backends.iter().map(|b| b.lead_pulled_p1_us).fold(f64::MAX, f64::min),
        );
    }
    if !a.load.json {
        for (i, b) in r.cluster.backends.iter().enumerate() {
            println!(
                "backend {i} pulls: per batch p50 {:.0} us, p99 {:.0} us | predicted p50 {:.0} us (fit {:.0} us + {:.0} us/MiB) | overran {:.2}% of {} | inputs late {} | pulled during the batch before {} (late {}) | inputs skipped (already too late) {} | buffers allocated {}",
                b.pull_batch_p50_us,
                b.pull_batch_p99_us,
                b.pull_predicted_p50_us,
                b.pull_fixed_us,
                b.pull_per_mib_us,
                b.pull_overrun_share * 100.0,
                b.pulls_predicted,
                b.pulls_late,
                b.pulls_overlapped,
                b.pulls_overlapped_late,
                b.inputs_skipped,
                b.pull_buffers_allocated,
            );
        }
        let scaled: Vec<String> = s
            .model_latency_scale
            .iter()
            .filter(|(_, &k)| k != 1.0)
            .map(|(m, k)| format!("{m} {k:.2}x"))
            .collect();
        println!(
            "models' latency scales: {} | batches measured {} (untrusted {}), scale changes {}",
            if scaled.is_empty() {
                "all 1 (planned with their profiles)".to_string()
            } else {
                scaled.join(", ")
            },
            s.latency.samples,
            s.latency.absurd,
            s.latency.changes
        );
        if let Some(c) = r.cluster.input_copies() {
            println!(
                "input copies from the request to the executor's buffer: {:.2} per input byte (store into the region {:.2}, pull {:.2}, executor gather {:.2}; {} bytes stored)",
                c.total, c.store, c.pull, c.gather, c.stored_bytes
            );
        }
    }
    print_load(&w, &r.load, a.load.json, Some(extra))
}
