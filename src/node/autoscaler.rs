//! `fermata autoscale`: the closed loop. Every interval it reads the scheduler's
//! advice (`GET /v1/autoscale` on the scheduler's metrics listener), lets the
//! [`Controller`] decide (provisioning delay, cool-downs, bounds) and carries the
//! decision out with command templates, so the same loop drives plain processes,
//! systemd units or `kubectl scale`.
//!
//! Templates run under `sh -c` with these placeholders replaced:
//! `{name}` (the backend's name: `--name-prefix` and a number for a launch, the
//! registered name for a stop), `{index}` (that number), `{count}` (backends in
//! service or starting after the step), `{node}` (the scheduler's node id, stops
//! only) and `{pid}` (stops only: the process this loop launched under that
//! name, empty if none). Without a stop template, a backend this loop launched
//! is sent SIGTERM (a `fermata backend` then drains and leaves without failing
//! a request).
//!
//! Each launch runs in a process group of its own (its id is `{pid}`), and the
//! loop signals the whole group, so a template that does not `exec` its backend
//! (commands joined by `;`, a pipeline) still has the backend signalled, not
//! only its shell; a Ctrl-C at the loop's terminal reaches only the loop.
//! With `stop_launched_on_exit`, a launch's shell also gets SIGTERM from the
//! kernel if the loop dies without stopping it (killed outright): a template
//! that `exec`s its backend then has it drain rather than run on unattended.

use crate::plan::autoscale::{Advice, Controller, ControllerConfig, Decision};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::HashMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The loop's settings.
#[derive(Debug, Clone)]
pub struct AutoscalerOpts {
    /// The scheduler's metrics listener (host:port).
    pub scheduler: String,
    pub launch: String,
    pub stop: Option<String>,
    pub name_prefix: String,
    pub interval: Duration,
    pub controller: ControllerConfig,
    /// Decide and print, run nothing.
    pub dry_run: bool,
    /// The launched backends end with the loop (see the module's doc).
    pub stop_launched_on_exit: bool,
}

/// One step's record (printed as a JSON line).
#[derive(Debug, Clone, Serialize)]
pub struct StepLog {
    pub t_s: f64,
    pub backends: u32,
    pub starting: u32,
    pub gpus: u32,
    pub bad_rate: f64,
    pub idle_fraction: f64,
    pub advice: String,
    pub decision: String,
    /// Backends launched or told to stop: (name, pid if known).
    pub acted: Vec<(String, Option<u32>)>,
}

/// What the loop needs of the scheduler's view.
pub struct View {
    pub advice: Advice,
    /// Backends in service, not draining.
    pub backends: Vec<u64>,
    pub gpus: u32,
    pub bad_rate: f64,
    pub idle_fraction: f64,
}

/// Reads what `/v1/autoscale` answered.
pub fn parse_view(body: &str) -> Result<View> {
    let v: serde_json::Value =
        serde_json::from_str(body).context("the scheduler's /v1/autoscale is not JSON")?;
    let cluster = v
        .get("cluster")
        .filter(|c| !c.is_null())
        .context("the scheduler has no signals yet")?;
    let advice: Advice = serde_json::from_value(cluster["advice"].clone()).context("advice")?;
    let signals = &cluster["signals"];
    let backends = v["backends"]
        .as_array()
        .context("backends")?
        .iter()
        .filter(|b| b["draining"] != serde_json::Value::Bool(true))
        .filter_map(|b| b["node"].as_u64())
        .collect();
    Ok(View {
        backends,
        // GPUs, not lanes: the advice counts devices (a scheduler whose
        // advice does not say falls back to the signals' slots).
        gpus: match advice.gpus_in_service {
            0 => signals["gpus"].as_u64().unwrap_or(0) as u32,
            n => n,
        },
        bad_rate: signals["bad_rate"].as_f64().unwrap_or(0.0),
        idle_fraction: signals["idle_fraction"].as_f64().unwrap_or(0.0),
        advice,
    })
}

/// GET http://ADDR/PATH with a timeout on `rt`; the body (at most 4 MiB).
pub fn http_get(
    rt: &tokio::runtime::Runtime,
    addr: &str,
    path: &str,
    timeout: Duration,
) -> Result<String> {
    use http_body_util::{BodyExt, Empty, Limited};
    use hyper::body::Bytes;
    rt.block_on(async {
        tokio::time::timeout(timeout, async {
            let s = tokio::net::TcpStream::connect(addr)
                .await
                .with_context(|| {
                    format!("cannot connect to the scheduler's metrics listener {addr}")
                })?;
            let (mut tx, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s)).await?;
            tokio::spawn(conn);
            let req = hyper::Request::get(path)
                .header("host", addr)
                .body(Empty::<Bytes>::new())?;
            let resp = tx.send_request(req).await?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), 4 << 20)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?
                .to_bytes();
            if !status.is_success() {
                bail!("GET {path} answered {status}");
            }
            Ok(String::from_utf8_lossy(&body).into_owned())
        })
        .await
        .with_context(|| format!("GET http://{addr}{path} took over {timeout:?}"))?
    })
}

/// Whether a backend's name may go into a shell command: 1 to 64 of
/// `A-Z a-z 0-9 . _ -`, not starting with `-`.
pub fn shell_safe(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Replaces the placeholders of a template.
pub fn fill(template: &str, vars: &[(&str, String)]) -> String {
    let mut s = template.to_string();
    for (k, v) in vars {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s
}

/// Sends `sig` to the process group of a launch (`leader`: its first process,
/// a child of ours not yet reaped, so the group id is not reused).
fn signal_group(leader: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the group of a child of ours that has not been reaped.
    unsafe {
        libc::kill(-(leader as libc::pid_t), sig);
    }
}

/// The loop: its controller, the processes it launched, its numbering.
pub struct Autoscaler {
    o: AutoscalerOpts,
    ctl: Controller,
    children: HashMap<String, Child>,
    /// Stop commands still running.
    stoppers: Vec<Child>,
    next_index: u64,
    t0: Instant,
    /// Where the advice is fetched (one for the loop's life).
    rt: tokio::runtime::Runtime,
}

impl Autoscaler {
    pub fn new(o: AutoscalerOpts) -> Result<Autoscaler> {
        if o.launch.trim().is_empty() {
            bail!("--launch needs a command");
        }
        let ctl = Controller::new(o.controller.clone()).map_err(anyhow::Error::msg)?;
        Ok(Autoscaler {
            o,
            ctl,
            children: HashMap::new(),
            stoppers: Vec::new(),
            next_index: 0,
            t0: Instant::now(),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the HTTP client's runtime")?,
        })
    }

    /// The processes this loop launched that still run: (name, pid).
    pub fn launched(&self) -> Vec<(String, u32)> {
        let mut v: Vec<(String, u32)> = self
            .children
            .iter()
            .map(|(n, c)| (n.clone(), c.id()))
            .collect();
        v.sort();
        v
    }

    /// SIGTERMs every backend this loop launched (each launch's process
    /// group) and waits up to `timeout` for them to end (a `fermata backend`
    /// drains first); SIGKILLs the groups of the rest.
    pub fn stop_launched(&mut self, timeout: Duration) {
        for c in self.children.values() {
            signal_group(c.id(), libc::SIGTERM);
        }
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            self.children
                .retain(|_, c| !matches!(c.try_wait(), Ok(Some(_))));
            if self.children.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for c in self.children.values_mut() {
            signal_group(c.id(), libc::SIGKILL);
            let _ = c.wait();
        }
        self.children.clear();
    }

    /// A stop template: run like any shell command.
    fn sh(cmd: &str) -> Result<Child> {
        Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .spawn()
            .with_context(|| format!("cannot run `{cmd}`"))
    }

    /// A launch template: in a process group of its own, and with
    /// `stop_launched_on_exit` told by the kernel (SIGTERM) when the loop dies.
    fn launch(&self, cmd: &str) -> Result<Child> {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new("sh");
        c.arg("-c").arg(cmd).process_group(0);
        if self.o.stop_launched_on_exit {
            // SAFETY: getpid before the fork; between fork and exec only
            // prctl(2), getppid(2) and _exit(2), all async-signal-safe, and
            // no allocation. The kernel signals when the thread that forked
            // ends: the loop runs on its process's main thread.
            let loop_pid = unsafe { libc::getpid() };
            unsafe {
                c.pre_exec(move || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // The loop died before the request took hold. Until
                    // exec this process has the loop's signal handlers, so
                    // it exits rather than raise SIGTERM.
                    if libc::getppid() != loop_pid {
                        libc::_exit(143);
                    }
                    Ok(())
                });
            }
        }
        c.spawn().with_context(|| format!("cannot run `{cmd}`"))
    }

    /// One step on `view` (fetched by the caller).
    pub fn step(&mut self, view: &View) -> StepLog {
        // Reap what ended.
        self.children
            .retain(|_, c| !matches!(c.try_wait(), Ok(Some(_))));
        self.stoppers
            .retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        let now = self.t0.elapsed().as_secs_f64();
        let decision = self.ctl.step(now, &view.advice, &view.backends);
        let starting = self.ctl.starting(view.backends.len() as u32);
        let mut acted = Vec::new();
        let what = match &decision {
            Decision::Launch(n) => {
                let mut what = format!("launch {n}");
                let count = view.backends.len() as u32 + starting;
                for _ in 0..*n {
                    let index = self.next_index;
                    self.next_index += 1;
                    let name = format!("{}{index}", self.o.name_prefix);
                    let cmd = fill(
                        &self.o.launch,
                        &[
                            ("name", name.clone()),
                            ("index", index.to_string()),
                            ("count", count.to_string()),
                        ],
                    );
                    if self.o.dry_run {
                        acted.push((name, None));
                        continue;
                    }
                    match self.launch(&cmd) {
                        Ok(c) => {
                            acted.push((name.clone(), Some(c.id())));
                            self.children.insert(name, c);
                        }
                        Err(e) => {
                            tracing::error!(error = %format!("{e:#}"), "autoscale: launch failed");
                            what.push_str(&format!(" (failed: {e:#})"));
                        }
                    }
                }
                what
            }
            Decision::Drain(list) => {
                let count =
                    (view.backends.len() as u32).saturating_sub(list.len() as u32) + starting;
                for (node, name) in list {
                    // The name is what the backend registered with: untrusted,
                    // and it goes into a shell command.
                    if !shell_safe(name) {
                        tracing::warn!(
                            backend = ?name,
                            node,
                            "autoscale: not stopping a backend whose name is not [A-Za-z0-9._-]{{1,64}} (it would go into a shell command)"
                        );
                        continue;
                    }
                    let pid = self.children.get(name).map(|c| c.id());
                    acted.push((name.clone(), pid));
                    if self.o.dry_run {
                        continue;
                    }
                    match &self.o.stop {
                        Some(t) => {
                            let cmd = fill(
                                t,
                                &[
                                    ("name", name.clone()),
                                    ("node", node.to_string()),
                                    ("pid", pid.map(|p| p.to_string()).unwrap_or_default()),
                                    ("count", count.to_string()),
                                    (
                                        "index",
                                        name.strip_prefix(&self.o.name_prefix)
                                            .unwrap_or("")
                                            .to_string(),
                                    ),
                                ],
                            );
                            match Self::sh(&cmd) {
                                Ok(c) => self.stoppers.push(c),
                                Err(e) => {
                                    tracing::error!(error = %format!("{e:#}"), "autoscale: stop failed")
                                }
                            }
                        }
                        None => match pid {
                            Some(p) => signal_group(p, libc::SIGTERM),
                            None => tracing::warn!(
                                backend = %name,
                                "autoscale: cannot stop a backend this loop did not launch without --stop"
                            ),
                        },
                    }
                }
                format!("drain {}", list.len())
            }
            Decision::Hold(why) => format!("hold: {why}"),
        };
        StepLog {
            t_s: now,
            backends: view.backends.len() as u32,
            starting: self.ctl.starting(view.backends.len() as u32),
            gpus: view.gpus,
            bad_rate: view.bad_rate,
            idle_fraction: view.idle_fraction,
            advice: format!("{}: {}", view.advice.action, view.advice.reason),
            decision: what,
            acted,
        }
    }

    /// Fetches the view and steps; an unreachable scheduler is a hold.
    pub fn tick(&mut self) -> Result<StepLog> {
        let body = http_get(
            &self.rt,
            &self.o.scheduler,
            "/v1/autoscale",
            Duration::from_secs(2),
        )?;
        let view = parse_view(&body)?;
        Ok(self.step(&view))
    }

    pub fn interval(&self) -> Duration {
        self.o.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::autoscale::ControllerConfig;

    #[test]
    fn templates_fill_their_placeholders() {
        assert_eq!(
            fill(
                "kubectl scale sts be --replicas={count} # {name} {x}",
                &[("count", "3".into()), ("name", "b1".into())]
            ),
            "kubectl scale sts be --replicas=3 # b1 {x}"
        );
    }

    #[test]
    fn only_plain_names_go_into_a_shell_command() {
        assert!(shell_safe("autoscaled-3"));
        assert!(shell_safe("fermata-backend-0.pod_a"));
        for bad in [
            "",
            "x; rm -rf /",
            "$(id)",
            "a b",
            "`id`",
            "-rf",
            "a\nb",
            &"a".repeat(65),
        ] {
            assert!(!shell_safe(bad), "{bad:?}");
        }
    }

    /// A backend that registered under a name with shell syntax is not handed
    /// to the stop command; a plain name is.
    #[test]
    fn a_hostile_backend_name_never_reaches_the_shell() {
        let dir = std::env::temp_dir().join(format!("fermata-autoscaler-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut a = Autoscaler::new(AutoscalerOpts {
            scheduler: "127.0.0.1:1".into(),
            launch: "true".into(),
            stop: Some(format!("touch {}/{{name}}", dir.display())),
            name_prefix: "b".into(),
            interval: Duration::from_secs(1),
            controller: ControllerConfig {
                min_backends: 1,
                down_cooldown_s: 0.0,
                ..Default::default()
            },
            dry_run: false,
            stop_launched_on_exit: false,
        })
        .unwrap();
        let hostile = format!("x;touch {}/pwned", dir.display());
        let view = |name: &str| View {
            advice: Advice {
                action: "release".into(),
                release_gpus: vec![1],
                release_backends: vec![(2, name.to_string())],
                ..Advice::default()
            },
            backends: vec![1, 2],
            gpus: 2,
            bad_rate: 0.0,
            idle_fraction: 0.9,
        };
        let log = a.step(&view(&hostile));
        assert!(log.acted.is_empty(), "{log:?}");
        std::thread::sleep(Duration::from_millis(300));
        assert!(!dir.join("pwned").exists());
        let mut a = Autoscaler::new(AutoscalerOpts {
            stop: Some(format!("touch {}/{{name}}", dir.display())),
            ..a.o.clone()
        })
        .unwrap();
        let log = a.step(&view("plain-2"));
        assert_eq!(log.acted.len(), 1, "{log:?}");
        for _ in 0..100 {
            if dir.join("plain-2").exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            dir.join("plain-2").exists(),
            "the stop command ran for a plain name"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A loop whose lower bound is one backend, launching `launch`.
    fn one_launch(launch: String, stop_launched_on_exit: bool) -> Autoscaler {
        let mut a = Autoscaler::new(AutoscalerOpts {
            scheduler: "127.0.0.1:1".into(),
            launch,
            stop: None,
            name_prefix: "b".into(),
            interval: Duration::from_secs(1),
            controller: ControllerConfig {
                min_backends: 1,
                ..Default::default()
            },
            dry_run: false,
            stop_launched_on_exit,
        })
        .unwrap();
        let log = a.step(&View {
            advice: Advice::default(),
            backends: vec![],
            gpus: 0,
            bad_rate: 0.0,
            idle_fraction: 0.0,
        });
        assert_eq!(log.acted.len(), 1, "{log:?}");
        a
    }

    /// The pid a launch wrote to `path`, waiting up to 5 s for it.
    fn pid_in(path: &std::path::Path) -> i32 {
        for _ in 0..250 {
            if let Some(p) = std::fs::read_to_string(path)
                .ok()
                .and_then(|t| t.trim().parse().ok())
            {
                return p;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the launch wrote no pid to {}", path.display());
    }

    /// Whether `pid` runs (exists and is not a zombie).
    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
            // The state follows the parenthesised command name.
            !st.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    /// Whether `pid` ends within `within`.
    fn ends(pid: i32, within: Duration) -> bool {
        let t0 = Instant::now();
        while alive(pid) {
            if t0.elapsed() > within {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// A template that does not `exec` its backend: stopping the launch
    /// signals the backend too, not only its shell.
    #[test]
    fn stopping_a_launch_reaches_what_its_shell_started() {
        let dir =
            std::env::temp_dir().join(format!("fermata-autoscaler-group-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("backend.pid");
        let mut a = one_launch(
            format!("sleep 300 & echo $! > {}; wait; true", pidfile.display()),
            false,
        );
        let backend = pid_in(&pidfile);
        assert!(alive(backend), "the launched process runs");
        a.stop_launched(Duration::from_secs(5));
        assert!(a.launched().is_empty());
        assert!(
            ends(backend, Duration::from_secs(5)),
            "the launch's backend {backend} outlived its stop"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// With `stop_launched_on_exit`, a launch is sent SIGTERM by the kernel
    /// when the thread that launched it ends without stopping it (the loop
    /// killed outright ends the same way).
    #[test]
    fn a_launch_ends_when_its_loop_dies_if_told_to() {
        let dir =
            std::env::temp_dir().join(format!("fermata-autoscaler-death-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |told: bool| {
            let pidfile = dir.join(format!("told-{told}.pid"));
            let launch = format!("echo $$ > {}; exec sleep 300", pidfile.display());
            // The loop lives and ends on a thread of its own, once its launch
            // runs; it never stops it.
            std::thread::spawn(move || {
                let a = one_launch(launch, told);
                let pid = pid_in(&pidfile);
                drop(a);
                pid
            })
            .join()
            .unwrap()
        };
        let told = run(true);
        assert!(
            ends(told, Duration::from_secs(5)),
            "the launch {told} outlived its loop"
        );
        let untold = run(false);
        assert!(
            !ends(untold, Duration::from_secs(1)),
            "without it, a launch outlives its loop"
        );
        // SAFETY: kill(2) on the group of a process this test launched.
        unsafe {
            libc::kill(-untold, libc::SIGKILL);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_view_is_read_from_the_schedulers_json() {
        let body = r#"{"window_s":10,"cluster":{"subcluster":null,
            "signals":{"window_s":9,"gpus":3,"idle_fraction":0.5,"tasks":100,"bad":0,"bad_rate":0.0},
            "advice":{"action":"release","add_gpus":0,"release_gpus":[2],"release_backends":[[3,"b2"]],"reason":"r"}},
            "subclusters":[],"backends":[{"node":1,"name":"b0","gpus":[0],"draining":false},
            {"node":3,"name":"b2","gpus":[2],"draining":true}],"thresholds":null}"#;
        let v = parse_view(body).unwrap();
        assert_eq!(v.backends, vec![1]);
        assert_eq!(v.advice.release_backends, vec![(3, "b2".to_string())]);
        assert_eq!(v.gpus, 3);
        assert!(parse_view(r#"{"cluster":null,"backends":[]}"#).is_err());
        assert!(parse_view("<html>").is_err());
    }
}
