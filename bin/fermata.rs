//! `fermata`: one binary, a subcommand per role.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use fermata::bench::{self, plot, SearchOptions};
use fermata::core::{Dur, Policy};
use fermata::harness::loadgen::{self, LoadgenOpts};
use fermata::harness::procs::{ProcCluster, ProcOpts};
use fermata::sim::{simulate, RunOptions};
use fermata::workload::{Arrival, Workload};
use std::path::PathBuf;

mod bench_http;
mod bench_serve;
mod bench_slowdown;
mod plan;
mod plan_app;
mod profile;
mod roles;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    /// mimalloc's option setter (libmimalloc, linked through the `mimalloc` crate).
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    /// Frees what the calling thread's heap holds unused and purges the
    /// program's arenas of ranges whose purge delay has passed.
    fn mi_collect(force: bool);
}

/// `mi_option_purge_delay` in mimalloc's option enum: 15 in v3, which
/// libmimalloc-sys 0.1.49 (pinned in Cargo.lock) builds, as in v2.
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// Keeps freed memory committed for a while before returning it to the OS.
/// mimalloc's default (10 ms) decommits the pages of a freed input buffer before
/// the next request reuses them, so every input of hundreds of KB (a 224x224 FP32
/// image is 588 KiB) was page-faulted in afresh at every copy: measured, a third of
/// the per-input pull time on a busy host. A server's working set comes back
/// within a second; an idle one still returns it: mimalloc purges only when
/// an allocation asks it to, so a thread does every second (memory that one
/// huge request or one hostile connection took goes back to the OS once freed,
/// even on a server that then goes quiet).
fn tune_allocator() {
    // SAFETY: a plain option setter, called before any other thread exists.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 1000) };
    let _ = std::thread::Builder::new()
        .name("mi-purge".into())
        .spawn(|| loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            // SAFETY: a collection of this (allocation-free) thread's heap and
            // of the program-wide arenas, which mimalloc makes thread-safe.
            unsafe { mi_collect(false) };
        });
}

#[derive(Parser)]
#[command(
    name = "fermata",
    version,
    about = "DNN inference serving with deferred batch scheduling"
)]
struct Cli {
    /// Log filter in env-filter syntax (e.g. `info`, `warn,fermata::node::scheduler=debug`).
    /// Default: $FERMATA_LOG, else `warn` (`info` with a role's --verbose;
    /// `sim cluster` leaves its simulated nodes' logs out). Logs go to stderr.
    #[arg(long, global = true, value_name = "FILTER")]
    log_level: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Sets up `tracing`: --log-level, else FERMATA_LOG, else `default` (warn,
/// or info if verbose).
fn init_logs(level: Option<&str>, default: &str) -> Result<()> {
    use tracing_subscriber::EnvFilter;
    let env = std::env::var("FERMATA_LOG")
        .ok()
        .filter(|s| !s.trim().is_empty());
    let (spec, from) = match (level, env) {
        (Some(l), _) => (l.to_string(), "--log-level"),
        (None, Some(e)) => (e, "FERMATA_LOG"),
        (None, None) => (default.to_string(), "default"),
    };
    let filter = EnvFilter::try_new(&spec)
        .map_err(|e| anyhow::anyhow!("bad log filter `{spec}` ({from}): {e}"))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    Ok(())
}

#[derive(Subcommand)]
enum Cmd {
    /// Simulate one run of a workload in virtual time (`sim cluster`: the
    /// deterministic cluster simulator with faults).
    #[command(args_conflicts_with_subcommands = true)]
    Sim(SimArgs),
    /// Benchmarks: goodput search, load sweep, case studies.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// All in one process: scheduler, emulated-GPU backends, frontends and a load
    /// generator on the embedded default workload; prints a goodput report.
    Serve(roles::ServeArgs),
    /// The scheduler process.
    Scheduler(roles::SchedulerArgs),
    /// Makes a new cluster secret file (for every role's --cluster-secret-file).
    Secret(roles::SecretCmdArgs),
    /// A backend process with emulated GPUs.
    Backend(roles::BackendArgs),
    /// A frontend process.
    Frontend(roles::FrontendArgs),
    /// Drives frontends with a workload's arrivals and reports what clients saw.
    Loadgen(roles::LoadgenArgs),
    /// Plans: `plan partition` assigns models to sub-clusters (the epoch
    /// partitioner's MILP); `plan app` plans a multi-model application.
    #[command(subcommand)]
    Plan(plan::PlanCmd),
    /// The closed autoscaling loop: reads the scheduler's advice and starts or
    /// drains backends with command templates (processes, systemd, kubectl).
    Autoscale(plan::AutoscaleArgs),
    /// Measures a model's batch latency l(b) on an executor, fits l(b) = alpha * b +
    /// beta and writes the profile file the scheduler loads.
    Profile(profile::ProfileArgs),
}

#[derive(Args, Clone)]
struct RunArgs {
    /// Workload file (TOML), e.g. configs/workloads/resnet50_8gpu.toml (required).
    #[arg(long)]
    workload: Option<PathBuf>,
    /// Override the arrival process: constant, poisson or gamma:SHAPE.
    #[arg(long)]
    arrival: Option<String>,
    /// Random seed (default: the workload's).
    #[arg(long)]
    seed: Option<u64>,
    /// Measured window in simulated seconds (default: the workload's, 20 s).
    #[arg(long)]
    duration_s: Option<f64>,
    /// Warm-up in simulated seconds (default: the workload's).
    #[arg(long)]
    warmup_s: Option<f64>,
    /// Override batch gathering for every policy: lazy, early (Nexus window),
    /// early:WINDOW or adaptive (default: each policy's own).
    #[arg(long)]
    gather: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct SimArgs {
    #[command(subcommand)]
    sub: Option<SimCmd>,
    #[command(flatten)]
    run: RunArgs,
    /// deferred, symphony, eager, timeout:FRAC, clockwork[:MS], shepherd[:K] or nexus.
    #[arg(long)]
    policy: Option<String>,
    /// Aggregate offered rate in requests/s (default: the workload's rate_rps).
    #[arg(long)]
    rate: Option<f64>,
}

#[derive(Subcommand)]
enum SimCmd {
    /// The deterministic cluster simulator: frontends, backends and the
    /// scheduler (the production protocol machines and core) over a simulated
    /// network with faults, checking the invariants after every event.
    Cluster(ClusterArgs),
}

#[derive(Args)]
struct ClusterArgs {
    /// Workload file (TOML): its models, profiles, SLOs and policy; default: the
    /// embedded ResNet50 workload. Its GPU count is not used (see --backends).
    #[arg(long)]
    workload: Option<PathBuf>,
    /// First seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Number of seeds to run (seed, seed+1, ...); stops at the first violation.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    #[arg(long, value_enum, default_value_t = fermata::sim::cluster::Faults::All)]
    faults: fermata::sim::cluster::Faults,
    #[arg(long, default_value_t = 2)]
    frontends: u32,
    #[arg(long, default_value_t = 2)]
    backends: u32,
    #[arg(long, default_value_t = 2)]
    gpus_per_backend: u32,
    /// Aggregate client rate (requests/s of simulated time).
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// Simulated time clients send for (ms); each run then drains for 4 s.
    #[arg(long, default_value_t = 2000)]
    duration_ms: i64,
    /// One-way network delay and uniform jitter on top (us).
    #[arg(long, default_value_t = 50)]
    delay_us: i64,
    #[arg(long, default_value_t = 100)]
    jitter_us: i64,
    /// Probability that a message is lost, breaking its connection (with
    /// partition faults).
    #[arg(long, default_value_t = 1e-5)]
    loss: f64,
    /// Mean time between stalls of a live process (0.5 to 8 ms each; 0: none),
    /// with any --faults.
    #[arg(long, default_value_t = 0.0)]
    stall_every_ms: f64,
    /// Plant a bug, to see the checks catch it.
    #[arg(long, value_enum)]
    plant: Option<fermata::sim::cluster::Planted>,
    /// A hot-standby scheduler follows the primary; nodes know both; with
    /// crash faults the serving scheduler crashes too (and comes back as the
    /// next standby).
    #[arg(long)]
    standby: bool,
    /// A rogue peer sends the frontends forged results (their latest task
    /// ids, guessed capabilities) every 5 ms: no request may end by one.
    #[arg(long)]
    rogue: bool,
    /// Backends are told to drain and leave now and then (and come back as
    /// new nodes): no request may fail for it, no plan follow `Drained`.
    #[arg(long)]
    drain: bool,
    /// Members come and go all the time: a frontend or backend crashes every
    /// 20 ms on average and comes back as a new node; the scheduler's GPU
    /// slots may never exceed the most GPUs owned at once.
    #[arg(long)]
    churn: bool,
    /// Sub-clusters of the scheduler (a dispatcher each); with more than one,
    /// models move between them live about every 100 ms: none may be lost or
    /// answered twice for it, and no plan may reach a backend without its model.
    #[arg(long, default_value_t = 1)]
    subclusters: u32,
    /// With --standby: the serving scheduler pauses once past its standby's
    /// takeover, then resumes (the standby's new term fences it); a frontend
    /// starts with its address first: no node may follow two primaries at
    /// once.
    #[arg(long, requires = "standby")]
    paused_primary: bool,
    /// A batch's input pull: what every batch pays (us) ...
    #[arg(long, default_value_t = 0.0)]
    pull_fixed_us: f64,
    /// ... what each input adds (us) ...
    #[arg(long, default_value_t = 2.0)]
    pull_per_input_us: f64,
    /// ... and what each MiB of input adds (us); each GPU pulls one batch at
    /// a time.
    #[arg(long, default_value_t = 0.0)]
    pull_per_mib_us: f64,
    /// A pull takes its cost times a uniform factor in [1, 1 + jitter].
    #[arg(long, default_value_t = 0.0)]
    pull_jitter: f64,
    /// Override every model's input size in bytes (what the pulls move).
    #[arg(long)]
    input_bytes: Option<u32>,
    /// Print one JSON object per seed.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Binary-search the goodput (every model <= 1% bad).
    Goodput(GoodputArgs),
    /// Goodput and GPU busy fraction against offered load (paper Fig. 2).
    Load(LoadArgs),
    /// Eager vs deferred as the batching effect grows (paper Fig. 6a).
    Fig6a(Fig6aArgs),
    /// Flat-top behaviour (Section 3.5): 1.5x and 0.3x the goodput rate.
    Flattop(FlattopArgs),
    /// The offline reference (up to 16 models on up to 16 GPUs): a beam search
    /// that sees every arrival before deciding, next to a policy on the same
    /// trace; with --find-max, both goodputs.
    Oracle(OracleArgs),
    /// Scheduler-only stress test: the real-time scheduler with in-process fake
    /// frontends and backends (paper Section 5.5).
    Scheduler(SchedulerArgs),
    /// Overload on the real-time scheduler: FACTOR x the (simulated) goodput rate
    /// for SECS seconds, then the load drops; goodput, memory and recovery.
    Overload(OverloadArgs),
    /// Goodput of a model repository served by a real executor (onnx, cuda) in
    /// an in-process cluster, next to the simulator's for the measured profiles.
    Serve(bench_serve::ServeGoodputArgs),
    /// A model slowed K x mid-run on emulated GPUs, served in process: bad %
    /// after the slowdown with the scheduler's latency scaling on and off.
    Slowdown(bench_slowdown::SlowdownArgs),
    /// The front door, open loop: a fresh `fermata serve --executor onnx` per
    /// model and rate, driven over HTTP (KServe v2); bad %, latency, client lag.
    Http(bench_http::BenchHttpArgs),
    /// Policies compared in the simulator over workloads and seeds: each policy's
    /// mean goodput and range, and the first policy against each other one.
    Compare(CompareArgs),
    /// A hot-standby scheduler taking over, with real processes on loopback:
    /// the primary is killed KILLS times under load; failover time p50/p99 and
    /// the requests lost.
    Failover(FailoverArgs),
    /// Attacks on the internal ports, repeated against real processes under
    /// load: an outsider's and a member's unfinished 64 MiB frames (bytes
    /// taken, resident memory while open and after close); a relay of the
    /// nodes' handshakes by a process without the secret (connections
    /// refused, inputs read, forged answers accepted); members' amplifying
    /// region reads (bytes sent, the frontend's resident memory).
    Attacks(AttacksArgs),
    /// What this machine's memory copies: the bandwidth of copying inputs of
    /// BYTES bytes on one thread (pools past the caches), of a first touch of
    /// fresh pages and of writing mapped ones, of the emulated GPU's checksum,
    /// and the rate that COPIES copies of each input allow.
    Copy(CopyArgs),
    /// Register/leave churn against a real scheduler on loopback: a member
    /// registers a backend of GPUS GPUs and leaves, again and again; the
    /// scheduler's resident memory and /metrics size after each checkpoint.
    Churn(ChurnArgs),
    /// The epoch partitioner's MILP against random search on seeded instances
    /// (paper Fig. 16): imbalance of load and memory, solve time, and a
    /// move-bounded re-partition after the rates drift.
    Partition(plan::BenchPartitionArgs),
    /// Flat-top with real processes on loopback: the load jumps to FACTOR x
    /// the start's capacity and `fermata autoscale` adds what the scheduler's
    /// advice says; bad rate per segment and time to recover.
    Autoscale(plan::BenchAutoscaleArgs),
    /// The autoscaling loop in the simulator (paper Fig. 15): 24 models, a rate
    /// trace that rises and falls, GPUs in use against the fewest needed.
    Fig15(plan::BenchFig15Args),
    /// Multi-model application planners on seeded workloads: cost normalised to
    /// `fermata`, agreement with `exact`, time per plan, Harpagon's ablations.
    Planners(plan_app::BenchPlannersArgs),
    /// Generated applications served in the simulator: the cheapest GPU set at
    /// which each setup (planner + runtime + deadline rule) keeps 99% of
    /// requests within the SLO, against harpagon + throughput-cost dispatch;
    /// each planner's predicted worst case against the simulated p99.
    Apps(plan_app::BenchAppsArgs),
    /// Concurrent lanes: on an emulated GPU whose profile gains from running
    /// 2-4 batches at once, the cost the planner predicts and the simulator
    /// measures with e = 1, 2, 3, 4 lanes and with e free.
    Lanes(plan_app::BenchLanesArgs),
    /// Re-planning on a fan-out change: the fan-out of one edge jumps mid-run;
    /// bad per epoch with the plan fixed and with the drift detector
    /// re-planning (`fermata`) and resizing the sub-clusters live.
    Adapt(plan_app::BenchAdaptArgs),
    /// Re-partitioning on a fan-out change with real processes on loopback:
    /// a scheduler with two sub-clusters, an emulated one-GPU backend in each;
    /// the fan-out detect -> classify jumps mid-run; bad per epoch-long
    /// window with the epoch loop moving models, and with moves off.
    #[command(name = "adapt-procs")]
    AdaptProcs(plan_app::BenchAdaptProcsArgs),
    /// Re-planning an application on its measured fan-out with real
    /// processes on loopback: the ONNX ensemble detect_classify over HTTP,
    /// whose inputs switch mid-run to ones the detector passes more items
    /// of; bad per epoch-long window with the frontend re-planning, and
    /// with the plan fixed.
    #[command(name = "adapt-apps")]
    AdaptApps(plan_app::BenchAdaptAppsArgs),
    /// Nexus's query-analysis case (its Figure 16): SSD then Inception on γ
    /// items each, on 8 GPUs; the highest rate at 99% good for the `fermata`
    /// split with deferred scheduling, an even split, and `nexus` with Nexus's
    /// runtime.
    #[command(name = "nexus-fig16")]
    NexusFig16(plan_app::BenchNexusFig16Args),
}

#[derive(Args)]
struct CopyArgs {
    /// Bytes of one input (602,112: a 3x224x224 FP32 image).
    #[arg(long, default_value_t = 602_112)]
    bytes: usize,
    /// Copies of each input's bytes on the server's path (in process with
    /// the emulated GPU: the store into the region and the pull).
    #[arg(long, default_value_t = 2)]
    copies: u32,
    /// Seconds of copying per repetition.
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
    /// Repetitions (the median is printed with the range).
    #[arg(long, default_value_t = 3)]
    reps: u32,
    /// MiB of fresh memory for the first-touch measurement.
    #[arg(long, default_value_t = 256)]
    touch_mib: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn cmd_copy(a: CopyArgs) -> Result<()> {
    if a.bytes == 0 || a.copies == 0 || a.reps == 0 || !(a.secs > 0.0 && a.secs <= 60.0) {
        bail!("--bytes, --copies and --reps must be positive and --secs in (0, 60]");
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let dur = std::time::Duration::from_secs_f64(a.secs);
    let mut copy = Vec::new();
    let mut touch = Vec::new();
    let mut check = Vec::new();
    for _ in 0..a.reps {
        copy.push(bench::copy::copy_bandwidth(a.bytes, dur));
        touch.push(bench::copy::first_touch_bandwidth(a.touch_mib << 20)?);
        check.push(bench::copy::checksum_bandwidth(a.bytes, dur));
    }
    let (ck, _, _) = med(check);
    let (bw, bw_lo, bw_hi) = med(copy);
    let (fresh, _, _) = med(touch.iter().map(|t| t.0).collect());
    let (mapped, _, _) = med(touch.iter().map(|t| t.1).collect());
    let bound = bw / (a.copies as f64 * a.bytes as f64);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "bytes": a.bytes,
                "copies": a.copies,
                "copy_bytes_per_s": bw,
                "copy_bytes_per_s_min": bw_lo,
                "copy_bytes_per_s_max": bw_hi,
                "first_touch_bytes_per_s": fresh,
                "mapped_write_bytes_per_s": mapped,
                "emulated_checksum_bytes_per_s": ck,
                "copy_bound_rps": bound,
            }))?
        );
        return Ok(());
    }
    println!(
        "copies of {}-byte inputs, one thread, pools past the caches: {:.2} GB/s (median of {}, {:.2}-{:.2})",
        a.bytes,
        bw / 1e9,
        a.reps,
        bw_lo / 1e9,
        bw_hi / 1e9
    );
    println!(
        "writing fresh pages (first touch): {:.0} MB/s; writing them again (mapped): {:.2} GB/s; an input stored into fresh pages takes {:.0} us, into mapped ones {:.0} us",
        fresh / 1e6,
        mapped / 1e9,
        a.bytes as f64 / fresh * 1e6,
        a.bytes as f64 / mapped * 1e6
    );
    println!(
        "the emulated GPU's checksum of each input: {:.2} GB/s ({:.0} us per input)",
        ck / 1e9,
        a.bytes as f64 / ck * 1e6
    );
    println!(
        "{} copies per input on one core's copies bound the rate at {:.1} r/s",
        a.copies, bound
    );
    Ok(())
}

#[derive(Args)]
struct ChurnArgs {
    /// GPUs the member registers each cycle (at most 65536, what one
    /// registration carries).
    #[arg(long, default_value_t = 65_536)]
    gpus: u32,
    /// Cycle counts after which to measure (comma-separated, increasing).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    checkpoints: Vec<u32>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn cmd_churn(a: ChurnArgs) -> Result<()> {
    if a.gpus == 0 || a.gpus as usize > fermata::wire::MAX_ITEMS {
        anyhow::bail!("--gpus must be between 1 and {}", fermata::wire::MAX_ITEMS);
    }
    if a.checkpoints.is_empty() || a.checkpoints.windows(2).any(|w| w[0] >= w[1]) {
        anyhow::bail!("--checkpoints must be increasing cycle counts");
    }
    let r = with_scratch("churn", |exe, dir| {
        fermata::harness::churn::run(exe, dir, a.gpus, &a.checkpoints)
    })?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    println!(
        "{:>7} {:>9} {:>15} {:>11}",
        "cycles", "RSS (MB)", "/metrics (B)", "GPU series"
    );
    for x in std::iter::once(&r.before).chain(&r.rows) {
        println!(
            "{:>7} {:>9.1} {:>15} {:>11}",
            x.cycles, x.rss_mb, x.metrics_bytes, x.gpu_series
        );
    }
    let (rss, metrics) = r.growth();
    println!(
        "{} GPUs per cycle, {:.2} s per cycle; last over first checkpoint: RSS x{rss:.3}, /metrics x{metrics:.3}",
        r.gpus, r.cycle_s
    );
    Ok(())
}

#[derive(Args)]
struct AttacksArgs {
    /// Which attacks (comma-separated): `memory` (unfinished 64 MiB frames
    /// from an outsider and a member), `relay` (a process without the secret
    /// holds the scheduler's address while it is down and relays the nodes'
    /// handshakes to a frontend's control and region ports), `amplify`
    /// (three members send region reads asking for far more than they send).
    #[arg(long, value_delimiter = ',', default_value = "memory,relay,amplify")]
    scenarios: Vec<AttackScenario>,
    /// Print JSON (one object per scenario) instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AttackScenario {
    Memory,
    Relay,
    Amplify,
}

fn cmd_attacks(a: AttacksArgs) -> Result<()> {
    for s in &a.scenarios {
        match s {
            AttackScenario::Memory => attacks_memory(a.json)?,
            AttackScenario::Relay => attacks_relay(a.json)?,
            AttackScenario::Amplify => attacks_amplify(a.json)?,
        }
    }
    Ok(())
}

fn attacks_relay(json: bool) -> Result<()> {
    let r = with_scratch("attacks-relay", fermata::harness::attacks::relay::run)?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    println!("relay: a process without the secret on the scheduler's address while it is down, relaying to the frontend's control and region ports");
    println!(
        "  connections the nodes opened to it: {} ({} relayed to the control listener, {} to the region server)",
        r.connections, r.to_control, r.to_region
    );
    println!(
        "  refused by the member relayed to (closed, nothing sent back): {}; bytes members sent back: {}",
        r.refused, r.bytes_back
    );
    println!(
        "  attack bytes taken: {} region reads, {} forged results",
        r.reads_sent, r.forged_sent
    );
    println!("  clients' inputs read by the attacker: {}", r.inputs_read);
    println!(
        "  forged answers accepted by the frontend: {}",
        r.forged_accepted
    );
    println!(
        "  the real scheduler started again on its address: {}; nodes back in service: {}; served after: {} good",
        if r.scheduler_restarted { "yes" } else { "NO" },
        if r.nodes_back { "yes" } else { "NO" },
        r.good_after_restart
    );
    println!(
        "  load over the whole run (failing at once while no scheduler serves): {} sent, {} good, {} never answered",
        r.load_sent, r.load_good, r.load_unanswered
    );
    Ok(())
}

fn attacks_amplify(json: bool) -> Result<()> {
    let r = with_scratch("attacks-amplify", fermata::harness::attacks::amplify::run)?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let mb = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!(
        "amplify: {} members, {} connections to a frontend's region server, reads of capability 0 and huge lengths, never reading an answer",
        r.members, r.connections
    );
    println!(
        "  sent: {:.1} MB ({} reads) asking for {:.1} GB",
        mb(r.bytes_sent),
        r.reads_sent,
        r.bytes_asked as f64 / (1u64 << 30) as f64
    );
    println!(
        "  frontend RSS: {:.1} MB before, {:.1} MB at most while they sent (+{:.1} MB), {:.1} MB 2 s after they closed",
        r.rss_before_mb,
        r.rss_peak_mb,
        r.rss_peak_mb - r.rss_before_mb,
        r.rss_after_mb
    );
    println!(
        "  legitimate load meanwhile: {} sent, {} good, bad rate {:.2}%, {} never answered, {} wrong outputs",
        r.load_sent,
        r.load_good,
        r.load_bad_rate * 100.0,
        r.load_unanswered,
        r.load_wrong_outputs
    );
    Ok(())
}

fn attacks_memory(json: bool) -> Result<()> {
    let r = with_scratch("attacks", fermata::harness::attacks::run)?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    println!(
        "{:<9} {:<10} {:>5} {:>14} {:>7} {:>10} {:>9} {:>10} {:>12}",
        "attack",
        "target",
        "conns",
        "max sent (MB)",
        "closed",
        "RSS before",
        "RSS open",
        "RSS after",
        "back after"
    );
    for x in &r.rows {
        println!(
            "{:<9} {:<10} {:>5} {:>14.1} {:>7} {:>10.1} {:>9.1} {:>10.1} {:>12}",
            x.attack,
            x.target,
            x.connections,
            x.max_bytes_sent as f64 / (1 << 20) as f64,
            x.closed_by_target,
            x.rss_before_mb,
            x.rss_open_mb,
            x.rss_after_mb,
            x.returned_after_s
                .map_or("not in 5 s".to_string(), |t| format!("{t:.1} s"))
        );
    }
    println!("(RSS in MB; 'max sent' for a connection closed at once is what the kernels buffered before the reset)");
    println!(
        "legitimate load meanwhile: {} sent, {} good, bad rate {:.2}%, {} never answered",
        r.load_sent,
        r.load_good,
        r.load_bad_rate * 100.0,
        r.load_unanswered
    );
    Ok(())
}

#[derive(Args)]
struct FailoverArgs {
    /// How many times the primary is killed.
    #[arg(long, default_value_t = 20)]
    kills: u32,
    /// Requests per second during each kill.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Print JSON instead of a summary.
    #[arg(long)]
    json: bool,
}

fn cmd_failover(a: FailoverArgs) -> Result<()> {
    if !(a.rate > 0.0 && a.rate <= 10_000.0) {
        anyhow::bail!("--rate must be in (0, 10000]");
    }
    let r = with_scratch("failover", |exe, dir| {
        fermata::harness::failover::run(exe, dir, a.kills, a.rate)
    })?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "failover over {} kills: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (SIGKILL of the primary to both nodes back in service through the standby)",
            r.kills, r.p50_ms, r.p99_ms, r.max_ms
        );
        println!(
            "requests: {} sent, {} good, {} failed (sent while the frontend had no scheduler, or held past their deadline), {} never answered, {} duplicates; {} pending at a killed primary were held and submitted to the standby",
            r.sent, r.good, r.failed, r.unanswered, r.duplicates, r.retried
        );
    }
    Ok(())
}

#[derive(Args)]
struct CompareArgs {
    /// Workload files, or directories whose *.toml files are taken.
    #[arg(long, num_args = 1.., default_value = "configs/workloads")]
    workloads: Vec<PathBuf>,
    /// Policies, comma-separated; the first is compared with each other one.
    #[arg(long, default_value = "deferred,eager")]
    policy: String,
    /// Seeds per workload: the workload's own seed and the next ones.
    #[arg(long, default_value_t = 3)]
    seeds: u32,
    /// Relative tolerance of each binary search.
    #[arg(long, default_value_t = 0.002)]
    tolerance: f64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct OverloadArgs {
    /// Workload file (TOML).
    #[arg(long, default_value = "configs/workloads/resnet50_8gpu.toml")]
    workload: PathBuf,
    /// Policy (default: the workload's).
    #[arg(long)]
    policy: Option<String>,
    /// Overload factor over the goodput rate.
    #[arg(long, default_value_t = 10.0)]
    factor: f64,
    /// Seconds of overload (measured).
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    /// Per-model queue bound during the test.
    #[arg(long, default_value_t = 4096)]
    queue_max: usize,
    #[command(flatten)]
    rt: RtArgs,
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone)]
struct RtArgs {
    /// Number of ModelThreads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Pin threads to these CPUs, e.g. 0,1 or 0-3: the RankThread to the first,
    /// ModelThreads to the next ones (round-robin).
    #[arg(long)]
    pin_cpus: Option<String>,
    /// How long the RankThread spins before a timer instead of parking (us).
    #[arg(long, default_value_t = 100.0)]
    rank_spin_us: f64,
    /// The load generator hands requests in at least this often (us).
    #[arg(long, default_value_t = 50.0)]
    gen_quantum_us: f64,
    /// Load generator threads: 1 shares a thread with the fake backends (the
    /// scheduler gets the cores on a small machine); more split the models
    /// among their own threads, so that the generator is not the limit.
    #[arg(long, default_value_t = 1)]
    gen_threads: usize,
    /// Sub-clusters: this many schedulers (a RankThread and --threads
    /// ModelThreads each), each with a block of the GPUs and a share of the
    /// models (balanced by rate), as `fermata scheduler --subclusters` runs them.
    #[arg(long, default_value_t = 1)]
    subclusters: usize,
    /// A ModelThread polls this long for more work before it parks (us).
    #[arg(long, default_value_t = 100.0)]
    model_spin_us: f64,
}

impl RtArgs {
    fn options(&self) -> Result<fermata::harness::fake::RtOptions> {
        let pin_cpus = match &self.pin_cpus {
            Some(s) => Some(fermata::runtime::pin::parse_cpu_list(s).context("--pin-cpus")?),
            None => None,
        };
        if self.threads == 0 || self.threads > 256 {
            bail!("--threads must be between 1 and 256, got {}", self.threads);
        }
        if self.gen_threads == 0 || self.gen_threads > 256 {
            bail!(
                "--gen-threads must be between 1 and 256, got {}",
                self.gen_threads
            );
        }
        if self.subclusters == 0 || self.subclusters > 64 {
            bail!(
                "--subclusters must be between 1 and 64, got {}",
                self.subclusters
            );
        }
        if !(self.rank_spin_us >= 0.0 && self.gen_quantum_us > 0.0) {
            bail!("--rank-spin-us must be >= 0 and --gen-quantum-us > 0");
        }
        Ok(fermata::harness::fake::RtOptions {
            model_threads: self.threads,
            pin_cpus,
            rank_spin: Dur::from_us_f64(self.rank_spin_us),
            gen_quantum: Dur::from_us_f64(self.gen_quantum_us),
            model_spin: Dur::from_us_f64(self.model_spin_us.max(0.0)),
            gen_threads: self.gen_threads,
            subclusters: self.subclusters,
            ..Default::default()
        })
    }
}

#[derive(Args)]
struct SchedulerArgs {
    /// Number of models (equally popular).
    #[arg(long, default_value_t = 64)]
    models: u32,
    /// Number of emulated GPUs.
    #[arg(long, default_value_t = 1024)]
    gpus: u32,
    /// Offered load in requests/s (Poisson); required unless --find-max.
    #[arg(long)]
    rate: Option<f64>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 5.0)]
    duration_s: f64,
    /// Warm-up seconds per run.
    #[arg(long, default_value_t = 1.0)]
    warmup_s: f64,
    /// Every model's latency profile, "gpu/Model" from the embedded profiles.
    #[arg(long, default_value = "a100/ResNet50V2")]
    profile: String,
    /// SLO override in ms (default: the profile's).
    #[arg(long)]
    slo_ms: Option<f64>,
    /// Control-message budget d_ctrl in us (plans leave this long before exec_at).
    #[arg(long, default_value_t = 200.0)]
    ctrl_us: f64,
    #[arg(long, default_value = "deferred")]
    policy: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Search the highest rate sustained with lag p99 < 2 ms and bad rate < 1%.
    #[arg(long)]
    find_max: bool,
    /// First rate of --find-max (doubled until it fails, then bisected).
    #[arg(long, default_value_t = 250_000.0)]
    start_rate: f64,
    /// Relative tolerance of --find-max.
    #[arg(long, default_value_t = 0.05)]
    tolerance: f64,
    /// Also measure the scheduler's CPU use with no load for this many seconds.
    #[arg(long)]
    idle_s: Option<f64>,
    #[command(flatten)]
    rt: RtArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct GoodputArgs {
    #[command(flatten)]
    run: RunArgs,
    /// A policy, a comma-separated list, or `all` (default: the workload's).
    #[arg(long)]
    policy: Option<String>,
    /// Write plots (SVG) into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Relative tolerance of the binary search.
    #[arg(long, default_value_t = 0.002)]
    tolerance: f64,
    /// Where each probed rate runs: `sim` (virtual time) or `realtime` (the
    /// real-time scheduler with fake frontends and backends; each probe takes
    /// warm-up + duration of wall time).
    #[arg(long, default_value = "sim")]
    runtime: String,
    #[command(flatten)]
    rt: RtArgs,
    /// `--runtime tcp`: backend processes (the GPUs are split among them).
    #[arg(long, default_value_t = 1)]
    backends: u32,
    /// `--runtime tcp`: frontend processes.
    #[arg(long, default_value_t = 1)]
    frontends: u32,
    /// `--runtime tcp`: override every model's input size (bytes); default: the
    /// workload's (224x224x3 = 150528 unless set).
    #[arg(long)]
    input_bytes: Option<u32>,
    /// `--runtime tcp`: seconds a fresh cluster runs unloaded before a probe's
    /// load starts, so clock offsets (a ping every 100 ms, best of the last 32)
    /// and the network budget are measured first.
    #[arg(long, default_value_t = 2.0)]
    settle_s: f64,
}

#[derive(Args)]
struct LoadArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Policies (comma-separated or `all`).
    #[arg(long, default_value = "deferred")]
    policy: String,
    /// Highest offered rate in r/s (default: 1.2 x the throughput upper bound).
    #[arg(long)]
    max_rate: Option<f64>,
    /// Number of load points.
    #[arg(long, default_value_t = 12)]
    points: u32,
    #[arg(long)]
    plots: Option<PathBuf>,
}

#[derive(Args)]
struct Fig6aArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args)]
struct FlattopArgs {
    #[command(flatten)]
    run: RunArgs,
    #[arg(long, default_value = "deferred")]
    policy: String,
}

#[derive(Args)]
struct OracleArgs {
    #[command(flatten)]
    run: RunArgs,
    /// The online policy to set beside it, on the same arrivals.
    #[arg(long, default_value = "deferred")]
    policy: String,
    /// Aggregate offered rate in requests/s (default: the workload's rate_rps).
    #[arg(long)]
    rate: Option<f64>,
    /// Search the highest rate at which each keeps the bad rate <= 1% instead.
    #[arg(long)]
    find_max: bool,
    /// States kept per request (wider: slower, and a schedule at least as good
    /// is no longer guaranteed, only likely).
    #[arg(long, default_value_t = 64)]
    beam: usize,
    /// Run only the search seeded with the policy's own schedule (any number
    /// of models and GPUs, in seconds; the beam searches are skipped).
    #[arg(long)]
    seeded_only: bool,
}

fn main() {
    tune_allocator();
    let cli = Cli::parse();
    let default_logs = match &cli.cmd {
        Cmd::Serve(a) if a.verbose() => "info",
        Cmd::Scheduler(a) if a.verbose() => "info",
        Cmd::Backend(a) if a.verbose() => "info",
        // The cluster simulator's nodes fail on purpose: its summary reports
        // the faults, and their logs (which would read as a real cluster
        // failing) show only when a filter asks for them.
        Cmd::Sim(SimArgs {
            sub: Some(SimCmd::Cluster(_)),
            ..
        }) => "warn,fermata::node=off",
        _ => "warn",
    };
    if let Err(e) = init_logs(cli.log_level.as_deref(), default_logs) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
    if matches!(
        cli.cmd,
        Cmd::Serve(_) | Cmd::Scheduler(_) | Cmd::Backend(_) | Cmd::Frontend(_) | Cmd::Bench(_)
    ) {
        // Servers (and the benchmarks' clients) hold a connection per client:
        // the soft open-file limit goes up to the hard one before any
        // listener or connection cap is set up.
        fermata::node::http::raise_open_file_limit();
    }
    let r = match cli.cmd {
        Cmd::Sim(a) => cmd_sim(a),
        Cmd::Serve(a) => roles::cmd_serve(a),
        Cmd::Secret(a) => roles::cmd_secret(a),
        Cmd::Scheduler(a) => roles::cmd_scheduler(a),
        Cmd::Backend(a) => roles::cmd_backend(a),
        Cmd::Frontend(a) => roles::cmd_frontend(a),
        Cmd::Loadgen(a) => roles::cmd_loadgen(a),
        Cmd::Profile(a) => profile::run(a),
        Cmd::Plan(a) => plan::cmd_plan(a),
        Cmd::Autoscale(a) => plan::cmd_autoscale(a),
        Cmd::Bench(BenchCmd::Goodput(a)) => cmd_goodput(a),
        Cmd::Bench(BenchCmd::Load(a)) => cmd_load(a),
        Cmd::Bench(BenchCmd::Fig6a(a)) => fermata::bench::cases::fig6a(a.seed, a.json),
        Cmd::Bench(BenchCmd::Flattop(a)) => cmd_flattop(a),
        Cmd::Bench(BenchCmd::Oracle(a)) => cmd_oracle(a),
        Cmd::Bench(BenchCmd::Scheduler(a)) => cmd_scheduler(a),
        Cmd::Bench(BenchCmd::Overload(a)) => cmd_overload(a),
        Cmd::Bench(BenchCmd::Serve(a)) => bench_serve::cmd_bench_serve(a),
        Cmd::Bench(BenchCmd::Slowdown(a)) => bench_slowdown::cmd_bench_slowdown(a),
        Cmd::Bench(BenchCmd::Http(a)) => bench_http::cmd_bench_http(a),
        Cmd::Bench(BenchCmd::Compare(a)) => cmd_compare(a),
        Cmd::Bench(BenchCmd::Failover(a)) => cmd_failover(a),
        Cmd::Bench(BenchCmd::Attacks(a)) => cmd_attacks(a),
        Cmd::Bench(BenchCmd::Churn(a)) => cmd_churn(a),
        Cmd::Bench(BenchCmd::Copy(a)) => cmd_copy(a),
        Cmd::Bench(BenchCmd::Partition(a)) => plan::cmd_bench_partition(a),
        Cmd::Bench(BenchCmd::Autoscale(a)) => plan::cmd_bench_autoscale(a),
        Cmd::Bench(BenchCmd::Fig15(a)) => plan::cmd_bench_fig15(a),
        Cmd::Bench(BenchCmd::Planners(a)) => plan_app::cmd_bench_planners(a),
        Cmd::Bench(BenchCmd::Apps(a)) => plan_app::cmd_bench_apps(a),
        Cmd::Bench(BenchCmd::Lanes(a)) => plan_app::cmd_bench_lanes(a),
        Cmd::Bench(BenchCmd::Adapt(a)) => plan_app::cmd_bench_adapt(a),
        Cmd::Bench(BenchCmd::AdaptProcs(a)) => plan_app::cmd_bench_adapt_procs(a),
        Cmd::Bench(BenchCmd::AdaptApps(a)) => plan_app::cmd_bench_adapt_apps(a),
        Cmd::Bench(BenchCmd::NexusFig16(a)) => plan_app::cmd_bench_nexus_fig16(a),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}

fn load(run: &RunArgs) -> Result<(Workload, RunOptions)> {
    let Some(path) = &run.workload else {
        bail!("--workload FILE is required (e.g. configs/workloads/resnet50_8gpu.toml)");
    };
    let mut w = Workload::from_file(path)?;
    if let Some(g) = &run.gather {
        w.gather = Some(g.parse().map_err(anyhow::Error::msg).context("--gather")?);
    }
    let mut o = RunOptions::from_workload(&w);
    if let Some(a) = &run.arrival {
        o.arrival = a
            .parse::<Arrival>()
            .map_err(anyhow::Error::msg)
            .context("--arrival")?;
    }
    if let Some(s) = run.seed {
        o.seed = s;
    }
    if let Some(d) = run.duration_s {
        if !(d > 0.0 && d <= 86_400.0) {
            bail!("--duration-s must be in (0, 86400], got {d}");
        }
        o.duration = Dur::from_secs_f64(d);
    }
    if let Some(d) = run.warmup_s {
        if !(0.0..=86_400.0).contains(&d) {
            bail!("--warmup-s must be in [0, 86400], got {d}");
        }
        o.warmup = Dur::from_secs_f64(d);
    }
    Ok((w, o))
}

fn parse_policies(s: &str) -> Result<Vec<Policy>> {
    if s == "all" {
        return Ok(Policy::all_baselines());
    }
    s.split(',')
        .map(|p| p.trim().parse::<Policy>().map_err(anyhow::Error::msg))
        .collect()
}

fn cmd_sim_cluster(a: ClusterArgs) -> Result<()> {
    use fermata::sim::cluster::{ClusterSim, ClusterSimOpts};
    let mut w = roles::workload_of(&a.workload)?;
    roles::set_input_bytes(&mut w, a.input_bytes)?;
    if a.frontends == 0 || a.backends == 0 || a.gpus_per_backend == 0 {
        bail!("--frontends, --backends and --gpus-per-backend must be at least 1");
    }
    if !(a.rate > 0.0 && a.rate.is_finite()) || a.duration_ms <= 0 {
        bail!("--rate and --duration-ms must be > 0");
    }
    if !(0.0..=1.0).contains(&a.loss) || a.delay_us < 0 || a.jitter_us < 0 {
        bail!("--loss must be in [0, 1]; --delay-us and --jitter-us >= 0");
    }
    if !(a.stall_every_ms >= 0.0 && a.stall_every_ms <= 1e9) {
        bail!("--stall-every-ms must be in [0, 1e9]");
    }
    for (v, name) in [
        (a.pull_fixed_us, "--pull-fixed-us"),
        (a.pull_per_input_us, "--pull-per-input-us"),
        (a.pull_per_mib_us, "--pull-per-mib-us"),
    ] {
        if !(0.0..=1e7).contains(&v) {
            bail!("{name} must be in [0, 1e7], got {v}");
        }
    }
    if !(0.0..=100.0).contains(&a.pull_jitter) {
        bail!("--pull-jitter must be in [0, 100], got {}", a.pull_jitter);
    }
    let pull = fermata::sim::cluster::SimPull {
        fixed: Dur::from_us_f64(a.pull_fixed_us),
        per_input: Dur::from_us_f64(a.pull_per_input_us),
        per_mib: Dur::from_us_f64(a.pull_per_mib_us),
        jitter: a.pull_jitter,
        ..Default::default()
    };
    let t0 = std::time::Instant::now();
    let (mut requests, mut events) = (0u64, 0u64);
    let (mut ended, mut faults) = (0u64, [0u64; 5]);
    let (mut sched_crashes, mut takeovers) = (0u64, 0u64);
    let (mut adopted, mut homes_changed, mut homes_stale) = (0u64, 0u64, 0u64);
    let (mut forged_sent, mut forged_refused) = (0u64, 0u64);
    let (mut good, mut retried) = (0u64, 0u64);
    let (mut drains, mut drained_left, mut failed) = (0u64, 0u64, 0u64);
    let (mut moves_started, mut moves_done, mut stale_unloaded) = (0u64, 0u64, 0u64);
    let mut rejoin_ms: Vec<f64> = Vec::new();
    let mut fencing = [0u64; 5];
    for seed in a.seed..a.seed.saturating_add(a.seeds.max(1)) {
        let o = ClusterSimOpts {
            seed,
            frontends: a.frontends,
            backends: a.backends,
            gpus_per_backend: a.gpus_per_backend,
            rate_rps: a.rate,
            duration: Dur::from_ms(a.duration_ms),
            faults: a.faults,
            delay: Dur::from_us(a.delay_us),
            jitter: Dur::from_us(a.jitter_us),
            loss: a.loss,
            stall_every: Dur::from_ms_f64(a.stall_every_ms),
            planted: a.plant,
            workload_path: a.workload.as_ref().map(|p| p.display().to_string()),
            standby: a.standby,
            rogue: a.rogue,
            drain: a.drain,
            subclusters: a.subclusters,
            pull,
            paused_primary: a.paused_primary,
            churn: a.churn,
        };
        let r = ClusterSim::new(&w, o).run();
        requests += r.requests;
        events += r.events;
        ended += r.good + r.late + r.dropped + r.failed;
        drains += r.drains;
        moves_started += r.moves_started;
        moves_done += r.moves_done;
        stale_unloaded += r.stale_unloaded;
        drained_left += r.drained_left;
        failed += r.failed;
        faults[0] += r.crashes;
        faults[1] += r.pauses;
        faults[2] += r.partitions;
        faults[3] += r.hangs;
        faults[4] += r.backends_overdue as u64;
        rejoin_ms.extend(&r.rejoin_ms);
        sched_crashes += r.scheduler_crashes;
        takeovers += r.takeovers;
        adopted += r.assignments_adopted;
        homes_changed += r.homes_changed_at_takeover;
        homes_stale += r.homes_stale_at_takeover;
        good += r.good;
        retried += r.retried;
        forged_sent += r.forged_sent;
        forged_refused += r.forged_refused;
        for (x, v) in fencing.iter_mut().zip([
            r.primary_pauses,
            r.fences_sent,
            r.step_downs,
            r.fenced_refusals,
            r.late_frontends,
        ]) {
            *x += v;
        }
        if a.json {
            println!("{}", serde_json::to_string(&r)?);
        } else if a.seeds <= 10 || r.violation.is_some() {
            println!(
                "seed {seed}: {} requests: {} good, {} late, {} dropped, {} failed; {} plans ({} too late); d_ctrl {:.0} us (max {:.0}, {} changes); faults: {} crashes, {} restarts, {} pauses, {} GPU hangs, {} stalls, {} partitions, {} broken connections; {} backends taken out by the plan watchdog; {} rejoins",
                r.requests, r.good, r.late, r.dropped, r.failed, r.plans, r.plans_too_late, r.d_ctrl_us, r.d_ctrl_us_max, r.budget_changes, r.crashes, r.restarts, r.pauses, r.hangs, r.stalls, r.partitions, r.broken_connections, r.backends_overdue, r.rejoins
            );
        }
        if let Some(v) = r.violation {
            eprintln!("VIOLATION at {}: {}", v.at, v.what);
            eprintln!("replay: {}", v.replay);
            std::process::exit(1);
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    rejoin_ms.sort_by(f64::total_cmp);
    let q = |p: f64| fermata::metrics::sorted_quantile(&rejoin_ms, p);
    eprintln!(
        "requests ended exactly once: {ended} of {requests} ({good} good; {retried} held over a lost scheduler and submitted to the next); every node up at the end back in service after {} crashes, {} pauses, {} partitions, {} GPU hangs ({} backends taken out by the plan watchdog); {} rejoins, time out of service p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        faults[0],
        faults[1],
        faults[2],
        faults[3],
        faults[4],
        rejoin_ms.len(),
        q(0.5),
        q(0.99),
        q(1.0)
    );
    if a.standby {
        eprintln!(
            "standby: {sched_crashes} crashes of the serving scheduler, {takeovers} takeovers, {adopted} of them from the primary's assignment ({homes_changed} models' sub-cluster changed from the start-up one; {homes_stale} differed from the crashed primary's)"
        );
    }
    if a.paused_primary {
        let [pauses, fences, downs, refused, late] = fencing;
        eprintln!(
            "paused primary: {pauses} pauses past the takeover, {fences} fences sent by the new primaries, {downs} schedulers stepped down, {refused} refused by nodes for an older term, {late} frontends started with the paused primary's address first; no node followed two primaries"
        );
    }
    if a.drain {
        eprintln!(
            "drain: {drains} backends told to drain, {drained_left} drained and left; {failed} requests failed in all"
        );
    }
    if a.subclusters > 1 {
        eprintln!(
            "sub-clusters: {} per scheduler; {moves_started} model moves started, {moves_done} finished; {stale_unloaded} models unloaded at rejoins (the backend joined another sub-cluster); {failed} requests failed in all",
            a.subclusters
        );
    }
    if a.rogue {
        eprintln!(
            "rogue: {forged_sent} forged results sent, {forged_refused} refused while their task was pending (the rest named ended tasks), none ended a request"
        );
    }
    eprintln!(
        "{} seeds, faults {:?}: no violation; {requests} simulated requests, {events} events in {wall:.2} s wall ({:.0} simulated requests per wall second)",
        a.seeds.max(1),
        a.faults,
        requests as f64 / wall.max(1e-9)
    );
    Ok(())
}

fn cmd_sim(a: SimArgs) -> Result<()> {
    if let Some(SimCmd::Cluster(c)) = a.sub {
        return cmd_sim_cluster(c);
    }
    let (w, mut o) = load(&a.run)?;
    if let Some(p) = &a.policy {
        o.policy = p.parse().map_err(anyhow::Error::msg).context("--policy")?;
    }
    if let Some(r) = a.rate {
        if !(r > 0.0 && r.is_finite()) {
            bail!("--rate must be > 0, got {r}");
        }
        o.rate_rps = r;
    }
    let r = simulate(&w, &o);
    if a.run.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&fermata::run::run_json(&w, &r))?
        );
    } else {
        println!(
            "workload {} | policy {} | {} GPUs | offered {:.1} r/s ({})",
            w.name, o.policy, w.gpus, o.rate_rps, o.arrival
        );
        print!("{}", bench::sim_table(&r));
    }
    Ok(())
}

/// Runs a benchmark of processes with this binary's path and a scratch folder
/// of its own (`fermata-NAME-PID` under the temporary directory, removed after).
fn with_scratch<T>(
    name: &str,
    f: impl FnOnce(&std::path::Path, &std::path::Path) -> Result<T>,
) -> Result<T> {
    let exe = std::env::current_exe().context("the fermata binary's path")?;
    let dir = std::env::temp_dir().join(format!("fermata-{name}-{}", std::process::id()));
    let r = f(&exe, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn write_plot(dir: &std::path::Path, name: &str, svg: String) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let p = dir.join(name);
    std::fs::write(&p, svg).with_context(|| format!("cannot write {}", p.display()))?;
    eprintln!("wrote {}", p.display());
    Ok(())
}

fn cmd_compare(a: CompareArgs) -> Result<()> {
    use fermata::bench::compare;
    let policies = parse_policies(&a.policy)?;
    if policies.len() < 2 {
        bail!("--policy needs at least two policies to compare, e.g. deferred,eager");
    }
    if !(1..=1000).contains(&a.seeds) {
        bail!("--seeds must be between 1 and 1000, got {}", a.seeds);
    }
    if !(a.tolerance > 0.0 && a.tolerance < 0.5) {
        bail!("--tolerance must be in (0, 0.5)");
    }
    let mut files = Vec::new();
    for p in &a.workloads {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "toml"))
                .collect();
            if found.is_empty() {
                bail!("{} holds no *.toml workload", p.display());
            }
            found.sort();
            files.extend(found);
        } else {
            files.push(p.clone());
        }
    }
    let workloads = files
        .iter()
        .map(|f| Workload::from_file(f))
        .collect::<Result<Vec<_>>>()?;
    let o = compare::CompareOptions {
        policies: policies.clone(),
        seeds: a.seeds,
        search: SearchOptions {
            rel_tolerance: a.tolerance,
            ..SearchOptions::default()
        },
    };
    let rows = compare::compare(&workloads, &o)?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&compare::json(&policies, &rows))?
        );
    } else {
        print!("{}", compare::table(&policies, &rows));
    }
    Ok(())
}

fn cmd_goodput(a: GoodputArgs) -> Result<()> {
    let (w, o) = load(&a.run)?;
    let policies = match &a.policy {
        Some(p) => parse_policies(p)?,
        None => vec![o.policy],
    };
    if !(a.tolerance > 0.0 && a.tolerance < 0.5) {
        bail!("--tolerance must be in (0, 0.5)");
    }
    let so = SearchOptions {
        rel_tolerance: a.tolerance,
        ..SearchOptions::default()
    };
    let mut results = Vec::new();
    let mut tcp_extra: Vec<serde_json::Value> = Vec::new();
    for p in &policies {
        let mut oo = o.clone();
        oo.policy = *p;
        let g = match a.runtime.as_str() {
            "sim" => bench::goodput_search(&w, &oo, &so),
            "realtime" => {
                let rt = a.rt.options()?;
                let json = a.run.json;
                bench::goodput_search_with(&w, &oo, &so, |o| {
                    let r = fermata::harness::fake::run_realtime(&w, o, &rt)?;
                    if !json {
                        eprintln!(
                            "  probe {:>9.1} r/s: worst model bad {:.3}%, lag p99 {:.0} us, dispatch error p99 {:.0} us",
                            o.rate_rps,
                            100.0 * r.sim.max_model_bad_rate(),
                            r.lag_ns.value_at_quantile(0.99) as f64 / 1e3,
                            r.scheduler.dispatch_error_ns().value_at_quantile(0.99) as f64 / 1e3,
                        );
                    }
                    if r.duplicates > 0 || r.unended > 0 || r.backend.overlaps > 0 {
                        bail!(
                            "accounting error at {:.0} r/s: {} duplicated, {} unended, {} GPU overlaps",
                            o.rate_rps, r.duplicates, r.unended, r.backend.overlaps
                        );
                    }
                    Ok(r.sim)
                })?
            }
            "tcp" => {
                let exe = std::env::current_exe().context("locating the fermata binary")?;
                if a.backends == 0 || a.backends > w.gpus {
                    bail!(
                        "--backends must be between 1 and the workload's {} GPUs",
                        w.gpus
                    );
                }
                let po = ProcOpts {
                    workload: a
                        .run
                        .workload
                        .clone()
                        .context("--workload FILE is required")?,
                    backend_gpus: (0..a.backends)
                        .map(|b| w.gpus / a.backends + u32::from(b < w.gpus % a.backends))
                        .collect(),
                    frontends: a.frontends,
                    model_threads: a.rt.threads,
                    input_bytes: a.input_bytes,
                    rank_spin_us: a.rt.rank_spin_us as u64,
                    model_spin_us: a.rt.model_spin_us as u64,
                    scheduler_args: vec!["--policy".into(), p.name()],
                    backend_env: vec![],
                    standby: false,
                    verbose: false,
                    ..ProcOpts::new(PathBuf::new())
                };
                let json = a.run.json;
                let extras = std::cell::RefCell::new(Vec::new());
                let g = bench::goodput_search_with(&w, &oo, &so, |o| {
                    let c = ProcCluster::start(&exe, &po)?;
                    std::thread::sleep(std::time::Duration::from_secs_f64(
                        a.settle_s.clamp(0.0, 60.0),
                    ));
                    let mut lo = LoadgenOpts::new(c.frontend_addrs.clone(), &w);
                    lo.rate_rps = o.rate_rps;
                    lo.arrival = o.arrival;
                    lo.seed = o.seed;
                    lo.warmup = o.warmup;
                    lo.duration = o.duration;
                    let tr = c.secret.transport()?;
                    // CPU the whole run uses: the cluster's processes and this one
                    // (the load generator).
                    let cpu0 = c.cpu_seconds() + fermata::harness::procs::self_cpu_seconds();
                    let t0 = std::time::Instant::now();
                    let r = loadgen::run(tr, &w, &lo);
                    let cpu = c.cpu_seconds() + fermata::harness::procs::self_cpu_seconds() - cpu0;
                    let cores_used = cpu / t0.elapsed().as_secs_f64();
                    let reps = c.stop();
                    let r = r?;
                    let cpu_us_per_request = 1e6 * cpu / r.sent.max(1) as f64;
                    let sj = reps.scheduler.clone().unwrap_or_default();
                    let num = |k: &str| sj.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
                    let l = &r.latency_us;
                    let extra = serde_json::json!({
                        "runtime": "tcp",
                        "processes": { "scheduler": 1, "backends": a.backends, "frontends": a.frontends, "loadgen": 1 },
                        "d_ctrl_us": num("d_ctrl_us"),
                        "d_data_us": num("d_data_us"),
                        "ctrl_delay_us": num("ctrl_delay_us"),
                        "pull_us": num("pull_us"),
                        "latency_ms_p50": l.value_at_quantile(0.5) as f64 / 1e3,
                        "latency_ms_p99": l.value_at_quantile(0.99) as f64 / 1e3,
                        "failed": r.failed,
                        "unanswered": r.unanswered,
                        "wrong_outputs": r.wrong_outputs,
                        "input_bytes": w.models.iter().map(|m| a.input_bytes.unwrap_or(m.input_bytes)).max(),
                        "cpu_cores_used": cores_used,
                        "cpu_us_per_request": cpu_us_per_request,
                        "cpu_cores_available": std::thread::available_parallelism().map_or(0, |n| n.get()),
                    });
                    if !json {
                        eprintln!(
                            "  probe {:>9.1} r/s: worst model bad {:.3}%, latency p50 {:.2} ms p99 {:.2} ms, d_ctrl {:.0} us, d_data {:.1} us, failed {}, CPU {:.2} cores ({:.0} us/request)",
                            o.rate_rps,
                            100.0 * r.sim.max_model_bad_rate(),
                            l.value_at_quantile(0.5) as f64 / 1e3,
                            l.value_at_quantile(0.99) as f64 / 1e3,
                            num("d_ctrl_us"),
                            num("d_data_us"),
                            r.failed,
                            cores_used,
                            cpu_us_per_request
                        );
                    }
                    if r.duplicates > 0 || r.wrong_outputs > 0 {
                        bail!(
                            "accounting error at {:.0} r/s: {} duplicate answers, {} wrong outputs",
                            o.rate_rps,
                            r.duplicates,
                            r.wrong_outputs
                        );
                    }
                    extras.borrow_mut().push((o.rate_rps, extra));
                    Ok(r.sim)
                })?;
                let rate = g.at_goodput.as_ref().map(|r| r.rate_rps);
                if let Some(x) = extras
                    .borrow()
                    .iter()
                    .find(|(r, _)| Some(*r) == rate)
                    .map(|(_, x)| x.clone())
                {
                    tcp_extra.push(x);
                } else {
                    tcp_extra.push(serde_json::Value::Null);
                }
                g
            }
            other => bail!("unknown --runtime {other:?}: use sim, realtime or tcp"),
        };
        if !a.run.json {
            println!(
                "{:<14} goodput {:>9.1} r/s  ({} trials, {:.2}s, {:.2} M sim req/s)",
                p.name(),
                g.goodput_rps,
                g.trials.len(),
                g.wall_secs,
                g.sim_requests_per_sec() / 1e6
            );
            if let Some(r) = &g.at_goodput {
                print!("{}", bench::sim_table(r));
            }
        }
        results.push(g);
    }
    if a.run.json {
        let mut v: Vec<_> = results.iter().map(|g| bench::goodput_json(&w, g)).collect();
        for (j, x) in v.iter_mut().zip(&tcp_extra) {
            if let (serde_json::Value::Object(m), serde_json::Value::Object(x)) = (j, x) {
                m.extend(x.clone());
            }
        }
        if v.len() == 1 {
            println!("{}", serde_json::to_string_pretty(&v[0])?);
        } else {
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
    }
    if let Some(dir) = &a.plots {
        let names: Vec<String> = results.iter().map(|g| g.policy.name()).collect();
        let vals = vec![results.iter().map(|g| g.goodput_rps).collect::<Vec<_>>()];
        write_plot(
            dir,
            &format!("{}_goodput.svg", w.name),
            plot::bar_chart_svg(
                &format!("Goodput per policy: {} ({})", w.name, o.arrival),
                "goodput (r/s)",
                &names,
                &["goodput".to_string()],
                &vals,
            ),
        )?;
        let panels: Vec<(String, Vec<(String, f64)>)> = results
            .iter()
            .filter_map(|g| {
                g.at_goodput
                    .as_ref()
                    .map(|r| (g.policy.name(), bench::batch_bins(r)))
            })
            .collect();
        write_plot(
            dir,
            &format!("{}_batch_sizes.svg", w.name),
            plot::histograms_svg(
                &format!("Batch-size distribution at goodput: {}", w.name),
                "batch size (fraction of requests)",
                &panels,
            ),
        )?;
    }
    Ok(())
}

fn cmd_load(a: LoadArgs) -> Result<()> {
    let (w, o) = load(&a.run)?;
    let policies = parse_policies(&a.policy)?;
    let max_rate = a
        .max_rate
        .unwrap_or_else(|| bench::throughput_upper_bound(&w) * 1.2);
    if a.points == 0 || a.points > 1000 {
        bail!("--points must be in 1..=1000");
    }
    let mut good_series = Vec::new();
    let mut busy_series = Vec::new();
    let mut out = Vec::new();
    for p in &policies {
        let mut gs = plot::Series {
            name: p.name(),
            points: vec![],
        };
        let mut bs = plot::Series {
            name: p.name(),
            points: vec![],
        };
        for i in 1..=a.points {
            let rate = max_rate * i as f64 / a.points as f64;
            let mut oo = o.clone();
            oo.policy = *p;
            oo.rate_rps = rate;
            let r = simulate(&w, &oo);
            gs.points.push((rate, r.goodput_rps()));
            bs.points.push((rate, r.gpu_busy_fraction()));
            out.push(serde_json::json!({
                "policy": p.name(), "offered_rps": rate, "goodput_rps": r.goodput_rps(),
                "bad_rate": r.bad_rate(), "gpu_busy_fraction": r.gpu_busy_fraction(),
                "gpu_busy_per_gpu": r.gpu_busy,
            }));
            if !a.run.json {
                println!(
                    "{:<12} offered {:>9.1} goodput {:>9.1} bad {:>6.2}% busy {:>5.1}%",
                    p.name(),
                    rate,
                    r.goodput_rps(),
                    100.0 * r.bad_rate(),
                    100.0 * r.gpu_busy_fraction()
                );
            }
        }
        good_series.push(gs);
        busy_series.push(bs);
    }
    if a.run.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    if let Some(dir) = &a.plots {
        write_plot(
            dir,
            &format!("{}_load_goodput.svg", w.name),
            plot::line_chart_svg(
                &format!("Goodput vs offered load: {}", w.name),
                "offered load (r/s)",
                "goodput (r/s)",
                &good_series,
            ),
        )?;
        write_plot(
            dir,
            &format!("{}_load_busy.svg", w.name),
            plot::line_chart_svg(
                &format!("GPU busy fraction vs offered load: {}", w.name),
                "offered load (r/s)",
                "GPU busy fraction",
                &busy_series,
            ),
        )?;
    }
    Ok(())
}

fn cmd_flattop(a: FlattopArgs) -> Result<()> {
    let (w, mut o) = load(&a.run)?;
    o.policy = a.policy.parse().map_err(anyhow::Error::msg)?;
    let f = bench::cases::flattop(&w, &o);
    if a.run.json {
        println!("{}", serde_json::to_string_pretty(&f)?);
    } else {
        let num = |k: &str| f[k].as_f64().unwrap_or(f64::NAN);
        println!("workload {} | policy {}", w.name, o.policy);
        println!("peak goodput p            {:>10.1} r/s", num("goodput_rps"));
        println!(
            "at 1.5 p: goodput         {:>10.1} r/s ({:.3} of peak)",
            num("overload_goodput_rps"),
            num("overload_goodput_over_peak")
        );
        println!(
            "at 0.3 p: mean GPU idle   {:>10.3} (expected 0.7, error {:.3})",
            num("underload_mean_idle_fraction"),
            num("idle_fraction_error")
        );
        println!(
            "at 0.3 p: idle share on the upper half of GPU ids {:.3}",
            num("idle_share_on_upper_half_gpus")
        );
        println!("idle per GPU: {}", f["underload_idle_per_gpu"]);
    }
    Ok(())
}

fn cmd_oracle(a: OracleArgs) -> Result<()> {
    use fermata::bench::oracle;
    let (w, mut o) = load(&a.run)?;
    o.policy = a.policy.parse().map_err(anyhow::Error::msg)?;
    if let Some(r) = a.rate {
        if !(r > 0.0 && r.is_finite()) {
            bail!("--rate must be a positive number, got {r}");
        }
        o.rate_rps = r;
    }
    // The workload and the beam, before any long run.
    oracle::check(&w, a.beam, a.seeded_only)?;
    let row = |who: &str, r: &fermata::sim::RunResult, extra: &str| {
        println!(
            "{who:<10} {:>9.1} r/s  bad {:>7.3}%  batch p50 {:>3} p99 {:>3}  GPU busy {:>5.1}%{extra}",
            r.rate_rps,
            100.0 * r.bad_rate(),
            fermata::sim::quantile_of_counts(&r.batch_requests(), 0.5),
            fermata::sim::quantile_of_counts(&r.batch_requests(), 0.99),
            100.0 * r.gpu_busy_fraction(),
        )
    };
    if a.find_max {
        let so = SearchOptions::default();
        let g = bench::goodput_search_with(&w, &o, &so, |oo| {
            Ok(oracle::oracle_with(&w, oo, a.beam, a.seeded_only)?.result)
        })?;
        let p = bench::goodput_search(&w, &o, &so);
        if a.run.json {
            println!(
                "{}",
                serde_json::json!({
                    "workload": w.name, "beam": a.beam, "seed": o.seed,
                    "seeded_only": a.seeded_only,
                    "oracle_goodput_rps": g.goodput_rps,
                    "policy": o.policy.name(), "policy_goodput_rps": p.goodput_rps,
                    "policy_over_oracle": p.goodput_rps / g.goodput_rps.max(1e-9),
                })
            );
        } else {
            println!(
                "workload {} | seed {} | beam {} | goodput: every model <= 1% bad",
                w.name, o.seed, a.beam
            );
            println!("oracle     {:>9.1} r/s", g.goodput_rps);
            println!(
                "{:<10} {:>9.1} r/s ({:.4} of the oracle's)",
                o.policy.name(),
                p.goodput_rps,
                p.goodput_rps / g.goodput_rps.max(1e-9)
            );
        }
        return Ok(());
    }
    let run = oracle::oracle_with(&w, &o, a.beam, a.seeded_only)?;
    let p = simulate(&w, &o);
    if a.run.json {
        let mut v = fermata::run::run_json(&w, &run.result);
        v["policy"] = "oracle".into();
        v["beam"] = a.beam.into();
        v["drop_price"] = run.price.into();
        v["search"] = run.search.name().into();
        println!(
            "{}",
            serde_json::json!({"oracle": v, "policy": fermata::run::run_json(&w, &p)})
        );
    } else {
        println!(
            "workload {} | {} GPUs | offered {:.1} r/s ({}) | seed {} | beam {}",
            w.name, w.gpus, o.rate_rps, o.arrival, o.seed, a.beam
        );
        row(
            "oracle",
            &run.result,
            &if matches!(run.search, oracle::Search::Seeded(_)) {
                format!("  (search: {})", run.search.name())
            } else {
                format!(
                    "  (search: {}; a drop priced at {:.1}x its model's least GPU time per request)",
                    run.search.name(),
                    run.price
                )
            },
        );
        row(&o.policy.name(), &p, "");
    }
    Ok(())
}

fn cmd_scheduler(a: SchedulerArgs) -> Result<()> {
    use fermata::bench::scheduler as sb;
    let o = sb::StressOptions {
        models: a.models,
        gpus: a.gpus,
        profile: a.profile.clone(),
        slo_ms: a.slo_ms,
        ctrl_us: a.ctrl_us,
        policy: a.policy.clone(),
        arrival: "poisson".into(),
        seed: a.seed,
        warmup_s: a.warmup_s,
        duration_s: a.duration_s,
        rt: a.rt.options()?,
    };
    if !(a.duration_s > 0.0 && a.warmup_s >= 0.0) {
        bail!("--duration-s must be > 0 and --warmup-s >= 0");
    }
    let json = a.json;
    let log = |s: &str| {
        if !json {
            println!("{s}");
        } else {
            eprintln!("{s}");
        }
    };
    let mut out = serde_json::Map::new();
    if a.find_max {
        if !(a.tolerance > 0.0 && a.tolerance < 0.5) {
            bail!("--tolerance must be in (0, 0.5)");
        }
        let f = sb::find_max(&o, a.start_rate, a.tolerance, log)?;
        if !json {
            println!(
                "max sustained: {:.0} requests/s ({} models, {} GPUs, {} ModelThread(s))",
                f.max_sustained_rps, a.models, a.gpus, a.rt.threads
            );
        }
        let half = f.at_half.as_ref().map(|h| h.1.clone());
        if let Some(serde_json::Value::Object(m)) = &half {
            out.extend(m.clone());
        }
        out.insert(
            "max_sustained_rps".into(),
            serde_json::json!(f.max_sustained_rps),
        );
        out.insert(
            "probes".into(),
            serde_json::Value::Array(f.probes.into_iter().map(|p| p.2).collect()),
        );
    } else {
        let Some(rate) = a.rate else {
            bail!("give --rate R (requests/s) or --find-max");
        };
        let r = sb::stress_run(&o, rate)?;
        log(&sb::run_line(rate, &r));
        if let serde_json::Value::Object(m) = sb::run_json(&o, rate, &r) {
            out.extend(m);
        }
    }
    if let Some(s) = a.idle_s {
        let c = sb::idle_cores(&o, s)?;
        log(&format!(
            "idle: the scheduler used {:.2}% of a core with no load",
            100.0 * c
        ));
        out.insert("idle_core_fraction".into(), serde_json::json!(c));
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::Value::Object(out))?
        );
    }
    Ok(())
}

fn cmd_overload(a: OverloadArgs) -> Result<()> {
    use fermata::harness::fake::run_realtime;
    if !(a.factor >= 1.0 && a.factor <= 100.0 && a.secs > 0.0) {
        bail!("--factor must be in [1, 100] and --secs > 0");
    }
    let w = Workload::from_file(&a.workload)?;
    let mut o = RunOptions::from_workload(&w);
    if let Some(p) = &a.policy {
        o.policy = p
            .parse::<Policy>()
            .map_err(|e| anyhow::anyhow!("--policy: {e}"))?;
    }
    // The peak: the simulator's goodput for the same workload and policy.
    let peak = bench::goodput_search(&w, &o, &SearchOptions::default()).goodput_rps;
    let mut rt = a.rt.options()?;
    rt.queue_max = a.queue_max;
    // Run 1: the overload itself is the measured window.
    let mut o1 = o.clone();
    o1.rate_rps = peak;
    o1.warmup = Dur::from_secs_f64(2.0);
    o1.duration = Dur::from_secs_f64(a.secs);
    let mut rt1 = rt.clone();
    rt1.rate_steps = vec![(Dur::ZERO, 1.0), (Dur::from_secs_f64(1.0), a.factor)];
    let rss0 = fermata::runtime::cpu::max_rss_bytes();
    let r1 = run_realtime(&w, &o1, &rt1)?;
    let rss1 = fermata::runtime::cpu::max_rss_bytes();
    let ratio = r1.sim.goodput_rps() / peak.max(1e-9);
    // Run 2: the same overload, then half the peak rate, measured after it.
    let mut o2 = o.clone();
    o2.rate_rps = peak;
    o2.warmup = Dur::from_secs_f64(a.secs + 1.0);
    o2.duration = Dur::from_secs_f64(5.0);
    let mut rt2 = rt.clone();
    rt2.rate_steps = vec![(Dur::ZERO, a.factor), (Dur::from_secs_f64(a.secs), 0.5)];
    let r2 = run_realtime(&w, &o2, &rt2)?;
    let ok_once = |r: &fermata::harness::fake::RtRun| {
        r.duplicates == 0 && r.unended == 0 && r.backend.overlaps == 0
    };
    let v = serde_json::json!({
        "workload": w.name,
        "policy": o.policy.name(),
        "peak_goodput_rps_sim": peak,
        "overload_factor": a.factor,
        "overload_offered_rps": peak * a.factor,
        "overload_goodput_rps": r1.sim.goodput_rps(),
        "overload_goodput_over_peak": ratio,
        "overload_refused": r1.refused,
        "overload_requests": r1.generated,
        "exactly_once": ok_once(&r1) && ok_once(&r2),
        "max_rss_mib_before": rss0 as f64 / 1048576.0,
        "max_rss_mib_after": rss1 as f64 / 1048576.0,
        "recovery_rate_rps": peak * 0.5,
        "recovery_bad_rate": r2.sim.bad_rate(),
        "recovery_goodput_rps": r2.sim.goodput_rps(),
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "peak (simulated goodput) {:.0} r/s; {}x overload for {} s: goodput {:.0} r/s = {:.3} x peak, {} of {} requests refused at the door",
            peak, a.factor, a.secs, r1.sim.goodput_rps(), ratio, r1.refused, r1.generated
        );
        println!(
            "every request ended exactly once: {}; peak RSS {:.0} MiB (before the run {:.0} MiB)",
            ok_once(&r1) && ok_once(&r2),
            rss1 as f64 / 1048576.0,
            rss0 as f64 / 1048576.0
        );
        println!(
            "recovery at 0.5 x peak after the overload: bad rate {:.3}%, goodput {:.0} r/s",
            100.0 * r2.sim.bad_rate(),
            r2.sim.goodput_rps()
        );
    }
    Ok(())
}
