//! A multi-host run in Linux network namespaces, with a backend host dying under
//! load.
//!
//! The test builds its own little network: a hub namespace holding a bridge, and
//! one namespace per host (scheduler, two backends, frontend, client), each joined
//! to the bridge by a veth pair and addressed in a private /24. Nothing touches the
//! host's own network (the bridge lives in the hub namespace) and everything is
//! removed when the test ends, panics included. Each role is the real `fermata`
//! binary started with `ip netns exec`, talking TCP across the bridge.
//!
//! The client's load generator runs at a rate one backend alone handles easily;
//! a few seconds into the measured window one backend host dies: its link to the
//! bridge goes down and its process is SIGKILLed. (The link goes first so that, as
//! when a machine loses power, no FIN reaches its peers: a bare SIGKILL on a shared
//! kernel closes its sockets cleanly and the scheduler would see the backend leave
//! at once, usually with nothing or one batch in flight. With the link down, the
//! scheduler has to notice the silence, within its node timeout of 1 s, and every
//! plan it sent the dead GPUs meanwhile must come back as a failure.) Then:
//! * every request ends exactly once and outputs are right (no unanswered, no
//!   duplicates, no wrong outputs);
//! * the dead backend's tasks end as explicit failures (`failed > 0`);
//! * everything else still meets its SLO (see `MAX_BAD_EXCLUDING_FAILED`) in one
//!   of up to three runs (on two starved cores one run can pass the bound);
//! * the scheduler reports exactly one backend lost.
//!
//! It needs root (to create namespaces); run by anyone else it says so and skips.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a role may take to print its ready line.
const READY: Duration = Duration::from_secs(20);
/// Load: one backend (2 emulated GPUs) alone sustains well over 1000 r/s of
/// ResNet50 at a 25 ms SLO; 400 r/s leaves it, and this 2-core machine shared by
/// five processes, a wide margin.
const RATE_RPS: f64 = 400.0;
const WARMUP_S: f64 = 1.0;
const DURATION_S: f64 = 6.0;
/// When the backend host dies, counted from the load generator's start: 2.5 s into
/// the measured window (its removal, up to 1 s later, is inside it too).
const KILL_AFTER: Duration = Duration::from_millis(3500);
/// The bad rate that excludes explicit failures: (late + dropped - failed) /
/// (offered - failed). Until the scheduler notices, the plans it gives the dead
/// GPUs fail (explicitly: excluded here); what it holds or gives the live GPUs, and
/// everything after the removal, runs on the surviving backend, which has ample
/// capacity, so it should meet its SLO: observed 1-2% on an idle 2-core machine (a
/// few late batches), 3-9% with a `yes` eating one of its cores. Broken behaviour
/// gives twice the bound or more: a scheduler that stalled while a backend was
/// silent (1 s = ~400 of ~2300 measured requests, ~17%), or lost tasks ending as
/// drops instead of explicit failures (~420 here, ~18%: the scheduler gives most of
/// the load to be1's GPUs, the first ones).
const MAX_BAD_EXCLUDING_FAILED: f64 = 0.08;

fn ip_cmd() -> &'static str {
    if Path::new("/usr/sbin/ip").exists() {
        "/usr/sbin/ip"
    } else {
        "ip"
    }
}

/// Runs a command to completion; Err carries its stderr.
fn run(prog: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {prog}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{prog} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) {
    if let Err(e) = run(ip_cmd(), args) {
        panic!("{e}");
    }
}

const PREFIX: &str = "fmtnt-";

/// Deletes namespaces left by earlier runs of this test that were killed before
/// they could clean up (their pid is gone).
fn remove_stale_namespaces() {
    let Ok(out) = Command::new(ip_cmd()).args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run(ip_cmd(), &["netns", "delete", name]);
        }
    }
}

/// The namespaces of one run; dropping it deletes them (and with them their veth
/// ends, and the bridge in the hub).
struct Net {
    hub: String,
    namespaces: Vec<String>,
}

/// One host: its namespace and address.
struct Host {
    ns: String,
    addr: String,
}

impl Net {
    /// A hub namespace with bridge `br0`, and a namespace per host name, linked to
    /// the bridge (`eth0` inside the host, `h-<name>` in the hub) and addressed
    /// `10.231.<pid % 200>.<i + 1>/24`.
    fn build(names: &[&str]) -> (Net, Vec<Host>) {
        let pid = std::process::id();
        let base = format!("{PREFIX}{pid}");
        let hub = format!("{base}-hub");
        let mut net = Net {
            hub: hub.clone(),
            namespaces: Vec::new(),
        };
        ip(&["netns", "add", &hub]);
        net.namespaces.push(hub.clone());
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        let subnet = format!("10.231.{}", pid % 200);
        let mut hosts = Vec::new();
        let mut netem = true;
        for (i, n) in names.iter().enumerate() {
            let ns = format!("{base}-{n}");
            ip(&["netns", "add", &ns]);
            net.namespaces.push(ns.clone());
            let hub_end = format!("h-{n}");
            ip(&[
                "-n", &hub, "link", "add", &hub_end, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ]);
            ip(&["-n", &hub, "link", "set", &hub_end, "master", "br0"]);
            ip(&["-n", &hub, "link", "set", &hub_end, "up"]);
            let addr = format!("{subnet}.{}", i + 1);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            // A little wire delay where netem exists (it often does not in
            // containers); the test does not depend on it.
            if netem {
                let r = run(
                    "tc",
                    &[
                        "-n", &ns, "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "100us",
                    ],
                );
                if let Err(e) = r {
                    eprintln!("netns test: no netem delay ({e}); going on without it");
                    netem = false;
                }
            }
            hosts.push(Host { ns, addr });
        }
        (net, hosts)
    }

    /// Takes host `name`'s link to the bridge down: its packets go nowhere.
    fn cut(&self, name: &str) {
        ip(&["-n", &self.hub, "link", "set", &format!("h-{name}"), "down"]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = run(ip_cmd(), &["netns", "delete", ns]) {
                eprintln!("netns test: cleanup: {e}");
            }
        }
    }
}

/// One `fermata` role in a namespace. Its stdout lines are read on a thread; its
/// stderr goes to the test's. Dropping it kills the process.
struct Role {
    name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Role {
    /// Starts `exe args` in namespace `ns`, with the test's cluster secret.
    fn spawn(exe: &Path, ns: &str, name: &str, args: &[&str]) -> Role {
        static SECRET: std::sync::OnceLock<fermata::harness::procs::SecretFile> =
            std::sync::OnceLock::new();
        let secret = SECRET.get_or_init(|| fermata::harness::procs::SecretFile::new().unwrap());
        let mut child = Command::new(ip_cmd())
            .args(["netns", "exec", ns])
            .arg(exe)
            .args(args)
            .env("FERMATA_CLUSTER_SECRET_FILE", &secret.path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let lines = fermata::harness::procs::stdout_lines(&mut child, name).expect("reader thread");
        Role {
            name: name.to_string(),
            child,
            lines,
        }
    }

    /// Waits for the line starting with `prefix`; returns the rest, trimmed.
    fn wait_line(&self, prefix: &str) -> String {
        let end = Instant::now() + READY;
        loop {
            match self
                .lines
                .recv_timeout(end.saturating_duration_since(Instant::now()))
            {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(prefix) {
                        return rest.trim().to_string();
                    }
                }
                Err(_) => panic!(
                    "{} did not print `{prefix}` within {READY:?} (it printed nothing more or exited)",
                    self.name
                ),
            }
        }
    }

    /// `ip netns exec` execs the command, so our child is fermata itself (and a
    /// signal to it reaches the role, not `ip`). Checked, since the test's kill
    /// depends on it.
    fn assert_is(&self, exe: &Path) {
        let pid = self.child.id();
        let got = std::fs::read_link(format!("/proc/{pid}/exe"))
            .unwrap_or_else(|e| panic!("{}: /proc/{pid}/exe: {e}", self.name));
        let want = exe.canonicalize().unwrap_or_else(|_| exe.to_path_buf());
        assert_eq!(
            got, want,
            "{}: pid {pid} is not the fermata binary (did `ip netns exec` fork?)",
            self.name
        );
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }

    /// Waits up to `t` for the process to exit; kills it after that. Returns its
    /// exit status and every stdout line not read yet.
    fn finish(&mut self, t: Duration) -> (std::process::ExitStatus, Vec<String>) {
        let end = Instant::now() + t;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() >= end {
                eprintln!(
                    "netns test: {} did not exit within {t:?}; killing it",
                    self.name
                );
                let _ = self.child.kill();
                break self.child.wait().expect("wait");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The reader thread ends at EOF, which follows the exit.
        let mut rest = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            rest.push(l);
        }
        (status, rest)
    }

    /// SIGTERM, then the role's JSON report (its last stdout line).
    fn stop(&mut self) -> serde_json::Value {
        self.signal(libc::SIGTERM);
        let (st, lines) = self.finish(Duration::from_secs(5));
        let last = lines.last().cloned().unwrap_or_default();
        serde_json::from_str(&last).unwrap_or_else(|e| {
            panic!(
                "{} (exit {st}): its last line is not a JSON report ({e}): {last:?}",
                self.name
            )
        })
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn u64_of(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("report field `{k}` missing or not a count: {v}"))
}

#[test]
fn backend_host_dies_under_load() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "SKIPPED netns::backend_host_dies_under_load: creating network namespaces needs root"
        );
        return;
    }
    // On two starved cores one run can pass the bound (the five roles and the
    // load generator share them); broken behaviour passes it in every run.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let bad = backend_host_dies_once();
        seen.push(format!("{:.2}%", 100.0 * bad));
        if bad < MAX_BAD_EXCLUDING_FAILED {
            return;
        }
    }
    panic!(
        "bad rate excluding failures >= {:.0}% in every run: {}",
        100.0 * MAX_BAD_EXCLUDING_FAILED,
        seen.join(", ")
    );
}

/// One run: the checks of exactly-once and of the nodes' reports; the bad rate
/// excluding failures.
fn backend_host_dies_once() -> f64 {
    let started = Instant::now();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_fermata"));
    remove_stale_namespaces();
    // Locals drop in reverse order: the roles (killed) before the network.
    let (net, hosts) = Net::build(&["sched", "be1", "be2", "fe", "client"]);
    let [sched_h, be1_h, be2_h, fe_h, client_h] = &hosts[..] else {
        unreachable!()
    };
    let setup = started.elapsed();

    let listen = format!("{}:7300", sched_h.addr);
    let mut sched = Role::spawn(
        &exe,
        &sched_h.ns,
        "scheduler",
        &[
            "scheduler",
            "--listen",
            &listen,
            "--node-timeout-ms",
            "1000",
            "--heartbeat-ms",
            "100",
        ],
    );
    let sched_addr = sched.wait_line("fermata scheduler listening on");
    assert_eq!(sched_addr, listen);
    let backend = |h: &Host, name: &str| {
        Role::spawn(
            &exe,
            &h.ns,
            name,
            &[
                "backend",
                "--scheduler",
                &sched_addr,
                "--gpus",
                "2",
                "--name",
                name,
            ],
        )
    };
    // One after the other, so that be1 registers first and gets the first GPU ids:
    // with load to spare the scheduler favours the first GPUs, and the backend
    // that dies should be one that is doing the work.
    let mut be1 = backend(be1_h, "be1");
    let be1_gpus = be1.wait_line("fermata backend ready: GPUs");
    let mut be2 = backend(be2_h, "be2");
    let be2_gpus = be2.wait_line("fermata backend ready: GPUs");
    println!("netns: be1 has GPUs {be1_gpus}, be2 has GPUs {be2_gpus}");
    be1.assert_is(&exe);
    let fe_listen = format!("{}:7400", fe_h.addr);
    let fe_data = format!("{}:7401", fe_h.addr);
    let mut fe = Role::spawn(
        &exe,
        &fe_h.ns,
        "frontend",
        &[
            "frontend",
            "--scheduler",
            &sched_addr,
            "--listen",
            &fe_listen,
            "--data-listen",
            &fe_data,
            "--region-mib",
            "256",
        ],
    );
    let fe_addr = fe.wait_line("fermata frontend listening on");
    let cluster_up = started.elapsed();

    let rate = RATE_RPS.to_string();
    let duration = DURATION_S.to_string();
    let warmup = WARMUP_S.to_string();
    let load_start = Instant::now();
    let mut lg = Role::spawn(
        &exe,
        &client_h.ns,
        "loadgen",
        &[
            "loadgen",
            "--frontend",
            &fe_addr,
            "--rate",
            &rate,
            "--duration-s",
            &duration,
            "--warmup-s",
            &warmup,
            "--json",
        ],
    );

    std::thread::sleep(KILL_AFTER.saturating_sub(load_start.elapsed()));
    assert!(
        matches!(lg.child.try_wait(), Ok(None)),
        "the load generator ended before the backend was killed"
    );
    assert!(
        matches!(be1.child.try_wait(), Ok(None)),
        "backend be1 exited by itself"
    );
    net.cut("be1");
    be1.signal(libc::SIGKILL);
    let (st, _) = be1.finish(Duration::from_secs(5));
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(libc::SIGKILL), "be1 ended with {st}");
    }
    let killed_at = load_start.elapsed();

    let (st, out) = lg.finish(Duration::from_secs(30));
    let load_done = load_start.elapsed();
    assert!(st.success(), "the load generator failed ({st})");
    let out = out.join("\n");
    let load: serde_json::Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("the load generator's output is not JSON ({e}): {out}"));

    // The surviving nodes leave on purpose (counted apart from the lost one),
    // then the scheduler stops.
    let fe_rep = fe.stop();
    let be2_rep = be2.stop();
    let sched_rep = sched.stop();

    let offered = u64_of(&load, "offered");
    let failed = u64_of(&load, "failed");
    let models = load["per_model"]
        .as_array()
        .unwrap_or_else(|| panic!("no per_model in {load}"));
    let late: u64 = models.iter().map(|m| u64_of(m, "late")).sum();
    let dropped: u64 = models.iter().map(|m| u64_of(m, "dropped")).sum();
    // `dropped` counts failed requests too.
    let bad_ex = (late + dropped).saturating_sub(failed) as f64 / (offered - failed).max(1) as f64;
    println!(
        "netns: setup {:.0} ms, cluster up at {:.2} s, be1 killed at {:.2} s into the load, load done at {:.2} s, total {:.2} s",
        setup.as_secs_f64() * 1e3,
        cluster_up.as_secs_f64(),
        killed_at.as_secs_f64(),
        load_done.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "netns: offered {offered}, good {}, late {late}, dropped {dropped} (failed {failed}), unanswered {}, duplicates {}, wrong {}, bad excluding failed {:.2}%, p50 {} ms, p99 {} ms",
        load["good"],
        load["unanswered"],
        load["duplicates"],
        load["wrong_outputs"],
        100.0 * bad_ex,
        load["latency_ms_p50"],
        load["latency_ms_p99"]
    );
    println!("netns: scheduler {sched_rep}");
    println!("netns: frontend {fe_rep}");
    println!("netns: be2 {be2_rep}");

    assert!(offered > 0, "nothing offered: {load}");
    assert_eq!(
        u64_of(&load, "unanswered"),
        0,
        "unanswered requests: {load}"
    );
    assert_eq!(u64_of(&load, "duplicates"), 0, "duplicate answers: {load}");
    assert_eq!(u64_of(&load, "wrong_outputs"), 0, "wrong outputs: {load}");
    assert!(
        failed > 0,
        "the dead backend's tasks should end as explicit failures: {load}"
    );
    if bad_ex >= MAX_BAD_EXCLUDING_FAILED {
        eprintln!(
            "netns: bad rate excluding failures {:.2}% >= {:.0}%: {load}",
            100.0 * bad_ex,
            100.0 * MAX_BAD_EXCLUDING_FAILED
        );
    }
    assert_eq!(
        u64_of(&sched_rep, "backends_lost"),
        1,
        "scheduler report: {sched_rep}"
    );
    assert_eq!(u64_of(&sched_rep, "backends_registered"), 2);
    assert_eq!(u64_of(&sched_rep, "backends_left"), 1);
    assert_eq!(u64_of(&sched_rep, "frontends_lost"), 0);
    assert_eq!(u64_of(&sched_rep, "frontends_left"), 1);
    bad_ex
}
