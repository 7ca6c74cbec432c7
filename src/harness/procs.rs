//! A cluster of real processes on this host: `fermata scheduler`, `fermata backend`
//! and `fermata frontend` started from the binary at hand, talking TCP over
//! loopback. The goodput benchmark (`--runtime tcp`) and the end-to-end tests use
//! it; the caller drives the frontends (for instance with
//! [`crate::harness::loadgen::run`]), so the load generator is a process of its own too.
//!
//! Each role prints one line when it is ready (with its address); the cluster waits
//! for those lines, so ports can be 0. Stopping sends SIGTERM, waits, then SIGKILL;
//! each role prints a JSON report as its last line, which [`ProcCluster::stop`]
//! returns.

use crate::transport::auth::ClusterKey;
use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Shape of a process cluster.
#[derive(Debug, Clone)]
pub struct ProcOpts {
    pub workload: PathBuf,
    /// Serve this model repository instead (`scheduler --models DIR`, the
    /// models' metadata and measured profiles); `workload` is then unused and
    /// the backends need `--executor onnx --models DIR` in `backend_args`.
    pub models: Option<PathBuf>,
    /// GPUs of each backend process.
    pub backend_gpus: Vec<u32>,
    pub frontends: u32,
    pub model_threads: usize,
    /// Override every model's input size (bytes).
    pub input_bytes: Option<u32>,
    pub rank_spin_us: u64,
    pub model_spin_us: u64,
    /// Extra arguments for the scheduler.
    pub scheduler_args: Vec<String>,
    /// Environment variables for backend processes: (backend index, name, value)
    /// — e.g. a `FERMATA_FAULT` for one of them.
    pub backend_env: Vec<(usize, String, String)>,
    /// Extra arguments for backend processes: (backend index, arguments).
    pub backend_args: Vec<(usize, Vec<String>)>,
    /// Also start a hot standby scheduler (`--standby-of` the first); the
    /// nodes get both addresses.
    pub standby: bool,
    /// The host frontends bind (`--listen`, `--data-listen`; port 0) and
    /// extra arguments for them (e.g. `--advertise`, or a `--listen` and
    /// `--data-listen` of their own).
    pub frontend_host: String,
    pub frontend_args: Vec<String>,
    pub verbose: bool,
}

impl ProcOpts {
    /// One backend with one GPU and one frontend serving `workload`, one
    /// ModelThread, no spinning, nothing extra; change what a run needs.
    pub fn new(workload: PathBuf) -> ProcOpts {
        ProcOpts {
            workload,
            models: None,
            backend_gpus: vec![1],
            frontends: 1,
            model_threads: 1,
            input_bytes: None,
            rank_spin_us: 0,
            model_spin_us: 0,
            scheduler_args: Vec::new(),
            backend_env: Vec::new(),
            backend_args: Vec::new(),
            standby: false,
            frontend_host: "127.0.0.1".into(),
            frontend_args: Vec::new(),
            verbose: false,
        }
    }
}

/// The lines `child` prints on its stdout (which must be piped), read on a
/// thread named after `name`; the channel ends when the stdout does.
pub fn stdout_lines(child: &mut Child, name: &str) -> std::io::Result<mpsc::Receiver<String>> {
    let out: ChildStdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other(format!("{name}: stdout is not piped")))?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("{name}-stdout"))
        .spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        })?;
    Ok(rx)
}

/// Restricts the process `cmd` starts to `cpus` (its affinity is set in the
/// child between fork and exec).
#[cfg(target_os = "linux")]
fn pin_child(cmd: &mut Command, cpus: &[usize]) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let set = crate::runtime::pin::cpu_set(cpus)?;
    // SAFETY: the closure runs in the forked child before exec and only makes
    // one system call (async-signal-safe) on a mask built before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn pin_child(_cmd: &mut Command, cpus: &[usize]) -> Result<()> {
    bail!(
        "cannot restrict a process to CPUs {}: CPU pinning is only supported on Linux",
        crate::runtime::pin::format_cpu_list(cpus)
    )
}

/// One role's process.
pub struct Proc {
    pub name: String,
    pub child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `exe args` with its stdout piped (read line by line) and its
    /// stderr inherited.
    pub fn spawn(exe: &Path, name: &str, args: &[String], verbose: bool) -> Result<Proc> {
        Proc::spawn_env(exe, name, args, &[], verbose)
    }

    /// [`Proc::spawn`] with these environment variables set.
    pub fn spawn_env(
        exe: &Path,
        name: &str,
        args: &[String],
        env: &[(String, String)],
        verbose: bool,
    ) -> Result<Proc> {
        Proc::spawn_on(exe, name, args, env, None, verbose)
    }

    /// [`Proc::spawn_env`], the process restricted to the CPUs in `cpus` (when
    /// given) from its first instruction, so every thread it starts stays there.
    pub fn spawn_on(
        exe: &Path,
        name: &str,
        args: &[String],
        env: &[(String, String)],
        cpus: Option<&[usize]>,
        verbose: bool,
    ) -> Result<Proc> {
        let mut cmd = Command::new(exe);
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped());
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        if !verbose {
            cmd.stderr(Stdio::inherit());
        }
        if let Some(cpus) = cpus {
            pin_child(&mut cmd, cpus)?;
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {} {}", exe.display(), args.join(" ")))?;
        let lines = stdout_lines(&mut child, name)?;
        Ok(Proc {
            name: name.to_string(),
            child,
            lines,
        })
    }

    /// Waits for the line that starts with `prefix`; returns the rest.
    fn wait_line(&mut self, prefix: &str, timeout: Duration) -> Result<String> {
        self.wait_for(prefix, timeout, |l| {
            l.strip_prefix(prefix).map(|r| r.trim().to_string())
        })
    }

    /// Waits for the first line that `pick` maps to `Some`; returns that. `what`
    /// names the line in the error (no such line by `timeout`, or the process
    /// ended first).
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pick: impl FnMut(&str) -> Option<String>,
    ) -> Result<String> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Some(v) = pick(&l) {
                        return Ok(v);
                    }
                }
                Err(_) => {
                    let st = self.child.try_wait().ok().flatten();
                    bail!(
                        "{} did not print `{what}` within {timeout:?} (exit status: {st:?})",
                        self.name
                    );
                }
            }
        }
    }

    /// The address of a scheduler's metrics listener (the primary's or a
    /// standby's, started with `--metrics-listen`).
    pub fn scheduler_metrics_addr(&mut self) -> Result<String> {
        self.wait_for("metrics listener", Duration::from_secs(10), |l| {
            l.strip_prefix("fermata scheduler metrics listening on ")
                .map(|a| a.trim().to_string())
        })
    }

    /// Sends `sig` (SIGTERM, SIGKILL, SIGSTOP...).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }

    /// SIGTERM, then SIGKILL after `grace`; returns the last line printed (the
    /// role's JSON report) if any.
    pub fn stop(mut self, grace: Duration) -> Option<String> {
        self.signal(libc::SIGTERM);
        let end = Instant::now() + grace;
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let mut last = None;
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            last = Some(l);
        }
        last
    }
}

/// A process left running when its handle goes (a test that failed before it
/// stopped its cluster) is killed: it must not outlive the test and hold the
/// test's output open.
impl Drop for Proc {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A small workload for process tests and benches: one cheap model, `mlp`
/// (l(b) = 0.2 ms * b + 1 ms, SLO 30 ms, 256-byte inputs), on `gpus` GPUs at
/// 100 r/s.
pub fn small_workload(name: &str, gpus: u32) -> String {
    format!(
        r#"
name = "{name}"
gpus = {gpus}
rate_rps = 100
[[models]]
name = "mlp"
alpha_ms = 0.2
beta_ms = 1.0
slo_ms = 30
input_bytes = 256
"#
    )
}

/// A cluster secret file made for one process cluster, removed with it.
pub struct SecretFile {
    pub path: PathBuf,
    pub key: ClusterKey,
}

impl SecretFile {
    /// A fresh secret in a new file under the temporary directory.
    pub fn new() -> Result<SecretFile> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "fermata-secret-{}-{n}-{:016x}",
            std::process::id(),
            rand::RngCore::next_u64(&mut rand::rngs::OsRng)
        ));
        let key = ClusterKey::create_file(&path)?;
        Ok(SecretFile { path, key })
    }

    /// `--cluster-secret-file PATH` for a role's arguments.
    pub fn args(&self) -> [String; 2] {
        [
            "--cluster-secret-file".into(),
            self.path.to_string_lossy().into_owned(),
        ]
    }

    /// A TCP transport that proves this secret (a load generator's, a test's).
    pub fn transport(&self) -> Result<std::sync::Arc<dyn crate::transport::Transport>> {
        Ok(std::sync::Arc::new(crate::transport::tcp::Tcp::keyed(
            Some(self.key.clone()),
        )?))
    }
}

impl Drop for SecretFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A running process cluster.
pub struct ProcCluster {
    /// The secret every process of the cluster proves.
    pub secret: SecretFile,
    pub scheduler: Proc,
    pub scheduler_addr: String,
    /// The standby scheduler, when asked for ([`ProcOpts::standby`]).
    pub standby: Option<Proc>,
    pub standby_addr: Option<String>,
    /// The scheduler's arguments (listening on any port), to start another
    /// one ([`ProcCluster::spawn_standby`]).
    pub scheduler_args: Vec<String>,
    pub backends: Vec<Proc>,
    pub frontends: Vec<Proc>,
    pub frontend_addrs: Vec<String>,
}

/// Reports printed by the roles when they stopped (JSON, as printed).
#[derive(Debug, Default)]
pub struct ProcReports {
    pub scheduler: Option<serde_json::Value>,
    pub backends: Vec<Option<serde_json::Value>>,
    pub frontends: Vec<Option<serde_json::Value>>,
}

fn json(l: Option<String>) -> Option<serde_json::Value> {
    l.and_then(|l| serde_json::from_str(&l).ok())
}

impl ProcCluster {
    /// Starts scheduler, backends and frontends from `exe` (the `fermata` binary).
    pub fn start(exe: &Path, o: &ProcOpts) -> Result<ProcCluster> {
        let t = Duration::from_secs(20);
        let (flag, w) = match &o.models {
            Some(m) => ("--models", m.to_string_lossy().to_string()),
            None => ("--workload", o.workload.to_string_lossy().to_string()),
        };
        let mut sa = vec![
            "scheduler".to_string(),
            flag.into(),
            w,
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--threads".into(),
            o.model_threads.to_string(),
            "--rank-spin-us".into(),
            o.rank_spin_us.to_string(),
            "--model-spin-us".into(),
            o.model_spin_us.to_string(),
        ];
        if let Some(b) = o.input_bytes {
            sa.push("--input-bytes".into());
            sa.push(b.to_string());
        }
        if o.verbose {
            sa.push("--verbose".into());
        }
        sa.extend(o.scheduler_args.iter().cloned());
        let secret = SecretFile::new()?;
        sa.extend(secret.args());
        let mut scheduler = Proc::spawn(exe, "scheduler", &sa, o.verbose)?;
        let primary = scheduler.wait_line("fermata scheduler listening on", t)?;
        let mut c = ProcCluster {
            secret,
            scheduler,
            scheduler_addr: primary.clone(),
            standby: None,
            standby_addr: None,
            scheduler_args: sa,
            backends: Vec::new(),
            frontends: Vec::new(),
            frontend_addrs: Vec::new(),
        };
        // What the nodes are told: the primary, and the standby after it.
        let mut addr = primary.clone();
        if o.standby {
            let (p, a) = c.spawn_standby(exe, &primary, o.verbose)?;
            addr = format!("{primary},{a}");
            c.standby = Some(p);
            c.standby_addr = Some(a);
        }
        for (i, g) in o.backend_gpus.iter().enumerate() {
            let mut args = vec![
                "backend".to_string(),
                "--scheduler".into(),
                addr.clone(),
                "--gpus".into(),
                g.to_string(),
                "--name".into(),
                format!("backend{i}"),
            ];
            args.extend(c.secret.args());
            for (_, extra) in o.backend_args.iter().filter(|(b, _)| *b == i) {
                args.extend(extra.iter().cloned());
            }
            let env: Vec<(String, String)> = o
                .backend_env
                .iter()
                .filter(|(b, _, _)| *b == i)
                .map(|(_, k, v)| (k.clone(), v.clone()))
                .collect();
            let name = format!("backend{i}");
            c.backends
                .push(Proc::spawn_env(exe, &name, &args, &env, o.verbose)?);
        }
        for b in &mut c.backends {
            b.wait_line("fermata backend ready", t)?;
        }
        for i in 0..o.frontends {
            let mut args = vec![
                "frontend".to_string(),
                "--scheduler".into(),
                addr.clone(),
                "--name".into(),
                format!("frontend{i}"),
                "--region-mib".into(),
                "512".into(),
            ];
            // The frontend's own `--listen` and `--data-listen` when its
            // arguments name them.
            for flag in ["--listen", "--data-listen"] {
                if !o.frontend_args.iter().any(|a| a == flag) {
                    args.push(flag.into());
                    args.push(format!("{}:0", o.frontend_host));
                }
            }
            args.extend(o.frontend_args.iter().cloned());
            args.extend(c.secret.args());
            let mut f = Proc::spawn(exe, &format!("frontend{i}"), &args, o.verbose)?;
            let a = f.wait_line("fermata frontend listening on", t)?;
            c.frontend_addrs.push(a);
            c.frontends.push(f);
        }
        Ok(c)
    }

    /// Starts a scheduler that is a hot standby of the one at `primary`; the
    /// process and its address (once it listens).
    pub fn spawn_standby(
        &self,
        exe: &Path,
        primary: &str,
        verbose: bool,
    ) -> Result<(Proc, String)> {
        self.spawn_standby_at(exe, primary, "127.0.0.1:0", verbose)
    }

    /// [`ProcCluster::spawn_standby`] listening at `listen` (a killed
    /// scheduler's address, which the nodes know).
    pub fn spawn_standby_at(
        &self,
        exe: &Path,
        primary: &str,
        listen: &str,
        verbose: bool,
    ) -> Result<(Proc, String)> {
        let mut args = self.scheduler_args.clone();
        if let Some(i) = args.iter().position(|a| a == "--listen") {
            args[i + 1] = listen.to_string();
        }
        args.extend(["--standby-of".to_string(), primary.to_string()]);
        let mut p = Proc::spawn(exe, "standby", &args, verbose)?;
        let line = p.wait_line("fermata scheduler listening on", Duration::from_secs(20))?;
        let a = line
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        Ok((p, a))
    }

    /// Starts one more frontend, given `schedulers` (addresses separated by
    /// commas, tried in that order), with the cluster's secret; its client
    /// address once it listens (also added to [`ProcCluster::frontend_addrs`]).
    pub fn spawn_frontend(
        &mut self,
        exe: &Path,
        schedulers: &str,
        verbose: bool,
    ) -> Result<String> {
        let i = self.frontends.len();
        let mut args: Vec<String> = [
            "frontend",
            "--scheduler",
            schedulers,
            "--name",
            &format!("frontend{i}"),
            "--region-mib",
            "512",
            "--listen",
            "127.0.0.1:0",
            "--data-listen",
            "127.0.0.1:0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(self.secret.args());
        let mut f = Proc::spawn(exe, &format!("frontend{i}"), &args, verbose)?;
        let a = f.wait_line("fermata frontend listening on", Duration::from_secs(20))?;
        self.frontend_addrs.push(a.clone());
        self.frontends.push(f);
        Ok(a)
    }

    /// The address of the scheduler's metrics listener (started with
    /// `--metrics-listen` in [`ProcOpts::scheduler_args`]).
    pub fn scheduler_metrics_addr(&mut self) -> Result<String> {
        self.scheduler.scheduler_metrics_addr()
    }

    /// Waits up to `timeout` for the standby to print that it took over;
    /// returns that line.
    pub fn standby_took_over(&mut self, timeout: Duration) -> Result<String> {
        let sb = self
            .standby
            .as_mut()
            .context("the cluster has no standby")?;
        sb.wait_for("took over", timeout, |l| {
            l.starts_with("fermata scheduler took over")
                .then(|| l.to_string())
        })
    }

    /// `fermata autoscale` against this cluster's scheduler (its metrics
    /// listener at `metrics`), launching one-GPU `fermata backend`s with the
    /// cluster's secret (their output discarded) and draining them when it
    /// stops; `args` add its bounds, cool-downs and interval.
    pub fn spawn_autoscale(&self, exe: &Path, metrics: &str, args: &[String]) -> Result<Proc> {
        let launch = format!(
            "exec {} backend --scheduler {} --gpus 1 --name {{name}} {} > /dev/null",
            exe.display(),
            self.scheduler_addr,
            self.secret.args().join(" ")
        );
        let mut all: Vec<String> = [
            "autoscale",
            "--scheduler",
            metrics,
            "--launch",
            &launch,
            "--stop-launched-on-exit",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        all.extend(args.iter().cloned());
        Proc::spawn(exe, "autoscale", &all, false)
    }

    /// Starts the load generator on a thread: `w`'s models at `rate` requests
    /// per second for `secs` seconds, no warm-up, over the cluster's secret.
    pub fn load_in_background(
        &self,
        w: &crate::workload::Workload,
        rate: f64,
        secs: f64,
    ) -> Result<std::thread::JoinHandle<Result<super::loadgen::LoadReport>>> {
        let (tr, w) = (self.secret.transport()?, w.clone());
        let mut lo = super::loadgen::LoadgenOpts::new(self.frontend_addrs.clone(), &w);
        lo.rate_rps = rate;
        lo.warmup = crate::core::Dur::ZERO;
        lo.duration = crate::core::Dur::from_secs_f64(secs);
        Ok(std::thread::spawn(move || super::loadgen::run(tr, &w, &lo)))
    }

    /// CPU time (user + system, seconds) the cluster's processes have used so far
    /// (Linux: /proc/PID/stat; NaN where it cannot be read).
    pub fn cpu_seconds(&self) -> f64 {
        std::iter::once(&self.scheduler)
            .chain(&self.backends)
            .chain(&self.frontends)
            .map(|p| proc_cpu_seconds(p.child.id()))
            .sum()
    }

    /// Stops every process (frontends, backends, then the scheduler) and collects
    /// their reports.
    pub fn stop(self) -> ProcReports {
        let g = Duration::from_secs(5);
        let frontends = self
            .frontends
            .into_iter()
            .map(|p| json(p.stop(g)))
            .collect();
        let backends = self.backends.into_iter().map(|p| json(p.stop(g))).collect();
        if let Some(p) = self.standby {
            let _ = p.stop(g);
        }
        let scheduler = json(self.scheduler.stop(g));
        ProcReports {
            scheduler,
            backends,
            frontends,
        }
    }
}

/// CPU time (user + system, seconds) process `pid` has used (Linux); NaN when
/// /proc cannot be read.
pub fn proc_cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // The command name (field 2) may hold spaces: fields count from after its ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; after ')' the state
    // (field 3) is index 0, so they are indices 11 and 12.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    match (ticks(11), ticks(12)) {
        (Some(u), Some(s)) if hz > 0.0 => (u + s) / hz,
        _ => f64::NAN,
    }
}

/// CPU time (user + system, seconds) this process has used.
pub fn self_cpu_seconds() -> f64 {
    proc_cpu_seconds(std::process::id())
}

/// `fermata serve --executor onnx --models MODELS` (the binary `exe`) serving
/// HTTP and gRPC on ephemeral ports of loopback, with `extra` arguments: the
/// process and the two APIs' addresses (host:port), once it announced them.
pub fn serve_apis(exe: &Path, models: &Path, extra: &[&str]) -> Result<(Proc, String, String)> {
    let mut args: Vec<String> = ["serve", "--executor", "onnx", "--http-port", "0"]
        .iter()
        .chain(&["--grpc-port", "0", "--http-drain-ready-ms", "0", "--models"])
        .map(|s| s.to_string())
        .collect();
    args.push(models.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut p = Proc::spawn(exe, "serve", &args, false)?;
    let line = p.wait_for("the API addresses", Duration::from_secs(60), |l| {
        l.contains("gRPC API listening on").then(|| l.to_string())
    })?;
    let after = |key: &str| {
        line.split(key)
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .map(str::to_string)
            .with_context(|| format!("no `{key}` in {line:?}"))
    };
    let (http, grpc) = (after("http://")?, after("gRPC API listening on ")?);
    Ok((p, http, grpc))
}

/// A finished command's stdout then stderr, as text (for messages and
/// parsing a tool's report).
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_of_a_busy_process_grows() {
        let before = super::self_cpu_seconds();
        assert!(before >= 0.0, "{before}");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(150) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let spent = super::self_cpu_seconds() - before;
        // At least a clock tick (10 ms) of the 150 ms spun shows.
        assert!(spent >= 0.01, "{spent}");
        assert!(super::proc_cpu_seconds(u32::MAX).is_nan());
    }
}
