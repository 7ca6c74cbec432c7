//! The distributed runtime as real processes on loopback: `fermata scheduler`,
//! `fermata backend`, `fermata frontend` started from the built binary, driven by a
//! load generator in this (separate) process.

use fermata::core::Dur;
use fermata::harness::loadgen::{self, LoadgenOpts};
use fermata::harness::procs::{ProcCluster, ProcOpts};
use fermata::workload::Workload;
use std::path::PathBuf;
use std::process::Command;

const WORKLOAD: &str = r#"
name = "procs"
gpus = 4
rate_rps = 200
[[models]]
name = "cnn"
alpha_ms = 0.5
beta_ms = 2.0
slo_ms = 40
input_bytes = 150528
[[models]]
name = "mlp"
alpha_ms = 0.2
beta_ms = 1.0
slo_ms = 20
input_bytes = 512
"#;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fermata"))
}

/// WORKLOAD written to a fresh folder named after `tag`: the folder, the
/// file and the workload.
fn workload_file(tag: &str) -> (PathBuf, PathBuf, Workload) {
    let dir = std::env::temp_dir().join(format!("fermata-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.toml");
    std::fs::write(&path, WORKLOAD).unwrap();
    let w = Workload::from_file(&path).unwrap();
    (dir, path, w)
}

#[test]
fn processes_on_loopback_serve_every_request_once_with_the_right_bytes() {
    let (dir, path, w) = workload_file("procs");
    let c = ProcCluster::start(
        &exe(),
        &ProcOpts {
            backend_gpus: vec![2, 2],
            frontends: 2,
            rank_spin_us: 20,
            model_spin_us: 20,
            ..ProcOpts::new(path.clone())
        },
    )
    .unwrap();
    let mut lo = LoadgenOpts::new(c.frontend_addrs.clone(), &w);
    lo.rate_rps = 200.0;
    lo.warmup = Dur::from_secs_f64(0.3);
    lo.duration = Dur::from_secs_f64(2.0);
    let r = loadgen::run(c.secret.transport().unwrap(), &w, &lo);
    let reps = c.stop();
    let r = r.unwrap();
    assert_eq!(r.unanswered, 0);
    assert_eq!(r.duplicates, 0);
    assert_eq!(
        r.wrong_outputs, 0,
        "outputs are the emulated GPU's for each input"
    );
    assert!(r.sim.offered() > 300);
    assert!(r.sim.bad_rate() < 0.05, "bad rate {}", r.sim.bad_rate());
    // Every process printed its report; the frontends ended every request they took.
    let s = reps.scheduler.expect("scheduler report");
    assert_eq!(s["backends_registered"], 2);
    assert_eq!(s["frontends_registered"], 2);
    assert_eq!(s["plans_sent"], s["plans_done"]);
    assert!(s["d_ctrl_us"].as_f64().unwrap() > 0.0);
    let mut taken = 0;
    for f in reps.frontends {
        let f = f.expect("frontend report");
        let n = |k: &str| f[k].as_u64().unwrap();
        assert_eq!(
            n("good") + n("late") + n("dropped") + n("failed"),
            n("requests")
        );
        taken += n("requests");
    }
    assert_eq!(taken, r.sent);
    for b in reps.backends {
        let b = b.expect("backend report");
        assert!(b["plans_run"].as_u64().unwrap() > 0 || b["tasks_run"].as_u64() == Some(0));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A frontend bound to every interface (0.0.0.0, as in a pod) tells its peers
/// the host it advertises: the scheduler registers it and the backends read
/// its inputs and push results there; every request is served.
#[test]
fn a_frontend_bound_to_every_interface_advertises_its_host() {
    let (dir, path, w) = workload_file("adv");
    let c = ProcCluster::start(
        &exe(),
        &ProcOpts {
            frontend_host: "0.0.0.0".into(),
            frontend_args: vec!["--advertise".into(), "127.0.0.1".into()],
            ..ProcOpts::new(path.clone())
        },
    )
    .unwrap();
    assert!(
        c.frontend_addrs[0].starts_with("127.0.0.1:"),
        "the frontend announces what it advertises: {}",
        c.frontend_addrs[0]
    );
    let mut lo = LoadgenOpts::new(c.frontend_addrs.clone(), &w);
    lo.rate_rps = 100.0;
    lo.warmup = Dur::from_secs_f64(0.2);
    lo.duration = Dur::from_secs_f64(1.0);
    let r = loadgen::run(c.secret.transport().unwrap(), &w, &lo);
    // A host with a port is refused, naming the flag.
    let o = Command::new(exe())
        .args([
            "frontend",
            "--listen",
            "0.0.0.0:0",
            "--data-listen",
            "0.0.0.0:0",
        ])
        .args(["--advertise", "10.0.0.1:80", "--scheduler", "127.0.0.1:1"])
        .args(c.secret.args())
        .output()
        .unwrap();
    let reps = c.stop();
    let r = r.unwrap();
    assert_eq!(r.unanswered, 0);
    assert_eq!(r.wrong_outputs, 0);
    assert!(r.sim.offered() > 50);
    // The backends reached the frontend at the advertised host: they read
    // its inputs and pushed results there (every request ended once; the
    // bound on bad ones is the other process tests', these run side by side
    // on the same cores).
    let f = reps.frontends[0].as_ref().expect("frontend report");
    let n = |k: &str| f[k].as_u64().unwrap();
    assert_eq!(
        n("good") + n("late") + n("dropped") + n("failed"),
        n("requests"),
        "{f}"
    );
    assert!(
        r.sim.bad_rate() < 0.05,
        "bad rate {}: {f}",
        r.sim.bad_rate()
    );
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("--advertise takes a host"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_starts_fast_and_reports() {
    let out = Command::new(exe())
        .args([
            "serve",
            "--duration-s",
            "1",
            "--warmup-s",
            "0.2",
            "--rate",
            "500",
            "--policy",
            "eager",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["startup_ms"].as_f64().unwrap() < 2000.0);
    assert_eq!(v["policy"], "eager", "serve --policy is the scheduler's");
    assert!(v["goodput_rps"].as_f64().unwrap() > 0.0);
    assert_eq!(v["unanswered"], 0);
    assert_eq!(v["duplicates"], 0);
    assert!(v["latency_ms_p99"].as_f64().is_some());
}

#[test]
fn bad_arguments_and_unreachable_peers_fail_clearly() {
    let secret = fermata::harness::procs::SecretFile::new().unwrap();
    let run = |args: &[&str]| {
        let o = Command::new(exe())
            .args(args)
            .env("FERMATA_CLUSTER_SECRET_FILE", &secret.path)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    // No secret: every role that joins a cluster says how to get one.
    for role in ["scheduler", "backend", "frontend", "loadgen"] {
        let o = Command::new(exe())
            .arg(role)
            .env_remove("FERMATA_CLUSTER_SECRET_FILE")
            .output()
            .unwrap();
        assert!(!o.status.success(), "{role} without a secret should fail");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(
            e.contains("--cluster-secret-file") && e.contains("fermata secret"),
            "{role}: {e}"
        );
    }
    let e = run(&["backend", "--gpus", "0"]);
    assert!(e.contains("at least one GPU"), "{e}");
    // Port 1 on loopback: nothing listens there.
    let e = run(&["backend", "--scheduler", "127.0.0.1:1"]);
    assert!(
        e.contains("cannot reach the scheduler at 127.0.0.1:1"),
        "{e}"
    );
    let e = run(&[
        "frontend",
        "--scheduler",
        "127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--data-listen",
        "127.0.0.1:0",
    ]);
    assert!(e.contains("cannot reach the scheduler"), "{e}");
    let e = run(&["serve", "--policy", "sometimes", "--duration-s", "0.1"]);
    assert!(e.contains("--policy"), "{e}");
    let e = run(&["serve", "--transport", "carrier-pigeon"]);
    assert!(e.contains("unknown transport"), "{e}");
    let e = run(&["serve", "--transport", "rdma", "--duration-s", "0.1"]);
    assert!(e.contains("rdma") || e.contains("RDMA"), "{e}");
}

/// A load generator whose only frontend dies says so: it exits with an error
/// that counts what was sent, answered, in flight when the frontend was lost
/// and never sent, and its report has the same (never-sent requests are not
/// passed off as merely unanswered).
#[test]
fn a_loadgen_whose_only_frontend_dies_fails_and_accounts_for_every_request() {
    let (dir, path, _w) = workload_file("lg-dies");
    let mut c = ProcCluster::start(&exe(), &ProcOpts::new(path.clone())).unwrap();
    let mut args: Vec<String> = vec![
        "loadgen".into(),
        "--frontend".into(),
        c.frontend_addrs[0].clone(),
        "--workload".into(),
        path.to_string_lossy().into_owned(),
        "--rate".into(),
        "200".into(),
        "--warmup-s".into(),
        "0".into(),
        "--duration-s".into(),
        "4".into(),
        "--json".into(),
    ];
    args.extend(c.secret.args());
    let lg = std::process::Command::new(exe())
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let fe = c.frontends.remove(0);
    fe.signal(libc::SIGKILL);
    let out = lg.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("every frontend was lost"), "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let (sent, answered, never) = (
        v["sent"].as_u64().unwrap(),
        v["answered"].as_u64().unwrap(),
        v["never_sent"].as_u64().unwrap(),
    );
    assert!(sent > 0 && answered > 0 && answered <= sent, "{v}");
    assert!(
        never > 0,
        "the arrivals after the loss were never sent: {v}"
    );
    assert_eq!(v["frontends_lost"].as_array().unwrap().len(), 1, "{v}");
    drop(fe);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
