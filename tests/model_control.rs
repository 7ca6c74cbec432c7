//! Model control with real processes (a scheduler under
//! `--model-control-mode explicit`, a backend, a frontend with its HTTP API):
//! a model loads while another's requests keep being served on the same GPU
//! (its load runs off the GPU's worker thread), a load cancelled by an unload
//! and asked again ends with the model ready and serving, the loads and
//! unloads done at a primary survive its standby's takeover, a load the
//! primary died before acting on is asked again of the standby, and under
//! `poll` the models follow the model repository's files.

use fermata::harness::procs::{ProcCluster, ProcOpts};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fermata"))
}

/// One HTTP/1.1 request to `addr` (`Connection: close`): the status and the
/// body (de-chunked).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(40))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").expect("a response head");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return (status, rest.to_string());
    }
    let (mut out, mut rest) = (String::new(), rest);
    while let Some((len, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    (status, out)
}

/// Each model's state in the frontend's repository index.
fn index(addr: &str) -> Vec<(String, String)> {
    let (st, body) = http(addr, "POST", "/v2/repository/index", "{}");
    assert_eq!(st, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut out: Vec<(String, String)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
            (s("name"), s("state"))
        })
        .collect();
    out.sort();
    out
}

/// A request for model `m` (profile-only: 8 bytes of UINT8).
fn infer(addr: &str, m: &str) -> (u16, String) {
    let body = r#"{"inputs":[{"name":"input","datatype":"UINT8","shape":[1,8],"data":[1,2,3,4,5,6,7,8]}]}"#;
    http(addr, "POST", &format!("/v2/models/{m}/infer"), body)
}

/// A workload of models `names` (profile-only: 8 input bytes, 200 ms SLO) on one
/// GPU, and a cluster serving it under explicit model control with `loaded`
/// loaded at start and `backend_env` in its backend's environment; with the
/// frontend's HTTP address.
fn start(
    dir: &Path,
    names: &[&str],
    loaded: &[&str],
    backend_env: &[(&str, &str)],
    standby: bool,
) -> (ProcCluster, String) {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("w.toml");
    let mut w = String::from("name = \"control\"\ngpus = 1\nrate_rps = 10\n");
    for n in names {
        w += &format!(
            "[[models]]\nname = \"{n}\"\nalpha_ms = 0.2\nbeta_ms = 1.0\nslo_ms = 200\ninput_bytes = 8\n"
        );
    }
    std::fs::write(&path, w).unwrap();
    let mut scheduler_args = vec!["--model-control-mode".to_string(), "explicit".into()];
    for m in loaded {
        scheduler_args.extend(["--load-model".to_string(), m.to_string()]);
    }
    let o = ProcOpts {
        standby,
        scheduler_args,
        backend_env: backend_env
            .iter()
            .map(|(k, v)| (0, k.to_string(), v.to_string()))
            .collect(),
        frontend_args: vec!["--http-listen".into(), "127.0.0.1:0".into()],
        ..ProcOpts::new(path)
    };
    let mut c = ProcCluster::start(&exe(), &o).unwrap();
    let addr = c.frontends[0]
        .wait_for("its HTTP address", Duration::from_secs(20), |l| {
            l.strip_prefix("fermata frontend HTTP API listening on")
                .map(|r| r.trim().to_string())
        })
        .unwrap();
    (c, addr)
}

/// Waits (at most 30 s) until model `m`'s state in the index is `state`.
fn until_state(addr: &str, m: &str, state: &str) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let got = index(addr);
        if got.iter().any(|(n, s)| n == m && s == state) {
            return;
        }
        assert!(Instant::now() < end, "{m} never {state}: index {got:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Requests for model `m`, one after another until `stop`: each one's send
/// time and status.
fn requests_until(
    addr: String,
    m: &'static str,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(Instant, u16)>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        while !stop.load(Ordering::Acquire) {
            let t = Instant::now();
            let (st, _) = infer(&addr, m);
            out.push((t, st));
            std::thread::sleep(Duration::from_millis(5));
        }
        out
    })
}

/// Models `a` (loaded, ready) and `b` (not loaded) on a backend whose every
/// load takes 1.5 s more (`slow-load`), in a folder named after `what`.
fn slow_loads(what: &str) -> (ProcCluster, String, PathBuf) {
    let dir = std::env::temp_dir().join(format!("fermata-{what}-{}", std::process::id()));
    let (c, addr) = start(
        &dir,
        &["a", "b"],
        &["a"],
        &[("FERMATA_FAULT", "slow-load:1500")],
        false,
    );
    until_state(&addr, "a", "READY");
    (c, addr, dir)
}

/// Every load on the backend takes 1.5 s more (`slow-load`). While `b`
/// loads, `a`'s requests to the same GPU are served: the load runs on the
/// GPU's loader, not on the worker that runs `a`'s batches (on the worker,
/// `a`'s batches would wait the 1.5 s: its requests refused or late, and the
/// backend taken out by the scheduler's plan watchdog).
#[test]
fn a_model_loading_does_not_stop_another_models_batches_on_its_gpu() {
    let (c, addr, dir) = slow_loads("loadoff");
    let stop = Arc::new(AtomicBool::new(false));
    let reqs = requests_until(addr.clone(), "a", stop.clone());
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let (st, body) = http(&addr, "POST", "/v2/repository/models/b/load", "{}");
    let t1 = Instant::now();
    assert_eq!(st, 200, "load: {body}");
    stop.store(true, Ordering::Release);
    let got = reqs.join().unwrap();
    let during: Vec<u16> = got
        .iter()
        .filter(|(t, _)| *t >= t0 && *t < t1)
        .map(|&(_, s)| s)
        .collect();
    let good = during.iter().filter(|&&s| s == 200).count();
    assert!(
        during.len() >= 10,
        "only {} requests of a during the load",
        during.len()
    );
    assert!(
        good * 10 >= during.len() * 9,
        "a while b loaded: {good} of {} answered 200 (statuses {during:?})",
        during.len()
    );
    assert!(
        t1 - t0 >= Duration::from_millis(1500),
        "the load took {:?}: the fault did not slow it",
        t1 - t0
    );
    let (st, body) = infer(&addr, "b");
    assert_eq!(st, 200, "b once loaded: {body}");
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A load unloaded while it runs (the backend's loader still opening the
/// model), then asked again: the first load's result is not taken for the
/// second (the model is ready only once the second finished), and the model
/// serves.
#[test]
fn a_load_cancelled_while_it_runs_and_asked_again_ends_ready() {
    let (c, addr, dir) = slow_loads("loadcancel");
    let first = {
        let addr = addr.clone();
        std::thread::spawn(move || http(&addr, "POST", "/v2/repository/models/b/load", "{}"))
    };
    until_state(&addr, "b", "LOADING");
    let (st, body) = http(&addr, "POST", "/v2/repository/models/b/unload", "{}");
    assert_eq!(st, 200, "unload while loading: {body}");
    until_state(&addr, "b", "UNAVAILABLE");
    let (st, body) = first.join().unwrap();
    assert_ne!(st, 200, "the cancelled load: {body}");
    let t0 = Instant::now();
    let (st, body) = http(&addr, "POST", "/v2/repository/models/b/load", "{}");
    assert_eq!(st, 200, "the second load: {body}");
    // The loader finished the first load (then dropped) before it began the
    // second: ready no sooner than the second's own 1.5 s.
    assert!(
        t0.elapsed() >= Duration::from_millis(1500),
        "b ready after {:?}: the first load was taken for the second",
        t0.elapsed()
    );
    let (st, body) = infer(&addr, "b");
    assert_eq!(st, 200, "b after the second load: {body}");
    let (st, body) = infer(&addr, "a");
    assert_eq!(st, 200, "a: {body}");
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Under explicit model control, the loads and unloads done at the primary
/// survive a takeover: model `c` loaded there and `b` unloaded there, the
/// primary killed, the standby's repository index (through the frontend,
/// registered with it) shows `a` and `c` READY and `b` UNAVAILABLE, it
/// serves `c`, and `b` stays unloaded.
#[test]
fn a_standby_takes_over_the_models_loaded_and_unloaded_at_the_primary() {
    let dir = std::env::temp_dir().join(format!("fermata-control-{}", std::process::id()));
    let (mut c, addr) = start(&dir, &["a", "b", "c"], &["a", "b"], &[], true);
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    let until = |what: &str, want: &[(String, String)]| {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let got = index(&addr);
            if got == want {
                return;
            }
            assert!(Instant::now() < end, "{what}: index {got:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    until(
        "at start",
        &pairs(&[("a", "READY"), ("b", "READY"), ("c", "UNAVAILABLE")]),
    );
    let (st, body) = http(&addr, "POST", "/v2/repository/models/c/load", "{}");
    assert_eq!(st, 200, "load: {body}");
    let (st, body) = http(&addr, "POST", "/v2/repository/models/b/unload", "{}");
    assert_eq!(st, 200, "unload: {body}");
    let after = pairs(&[("a", "READY"), ("b", "UNAVAILABLE"), ("c", "READY")]);
    assert_eq!(index(&addr), after);
    // (The standby heard the states with the frontend; a moment for the
    // bytes to arrive before the primary dies.)
    std::thread::sleep(Duration::from_millis(300));
    c.scheduler.signal(libc::SIGKILL);
    let _ = c.scheduler.child.wait();
    c.standby_took_over(Duration::from_secs(10)).unwrap();
    c.frontends[0]
        .wait_for("rejoin", Duration::from_secs(10), |l| {
            l.starts_with("fermata frontend back in service")
                .then(|| l.to_string())
        })
        .unwrap();
    until("after the takeover", &after);
    // The standby serves c (it refuses the tasks of a model it has not
    // loaded) and b stays unloaded.
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (st, body) = infer(&addr, "c");
        if st == 200 {
            break;
        }
        assert!(Instant::now() < end, "c after the takeover: {st} {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (st, body) = infer(&addr, "b");
    assert!(
        st != 200 && body.contains("is not loaded (UNAVAILABLE)"),
        "b after the takeover: {st} {body}"
    );
    assert_eq!(index(&addr), after, "as the standby has them");
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A load relayed to a primary that is stopped (SIGSTOP: it reads
/// nothing) and then killed never reaches a scheduler: the frontend asks
/// the standby again once it joined it, so the client's load ends with the
/// model ready (without asking again, the client waits out the control
/// wait of 300 s), and the model serves.
#[test]
fn a_load_the_primary_never_took_is_asked_again_of_the_standby() {
    let dir = std::env::temp_dir().join(format!("fermata-control-lost-{}", std::process::id()));
    let (mut c, addr) = start(&dir, &["a", "b"], &["a"], &[], true);
    until_state(&addr, "a", "READY");
    until_state(&addr, "b", "UNAVAILABLE");
    c.scheduler.signal(libc::SIGSTOP);
    let load = {
        let addr = addr.clone();
        std::thread::spawn(move || http(&addr, "POST", "/v2/repository/models/b/load", "{}"))
    };
    // The frontend relays the load to the stopped primary.
    std::thread::sleep(Duration::from_millis(300));
    c.scheduler.signal(libc::SIGKILL);
    let _ = c.scheduler.child.wait();
    c.standby_took_over(Duration::from_secs(10)).unwrap();
    let (st, body) = load.join().unwrap();
    assert_eq!(st, 200, "the load asked of the dead primary: {body}");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (st, body) = infer(&addr, "b");
        if st == 200 {
            break;
        }
        assert!(Instant::now() < end, "b after the takeover: {st} {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request for repository model `m` of `dir` with zeros for every input
/// (its metadata's shapes at batch 1).
fn infer_zeros(addr: &str, dir: &Path, m: &str) -> (u16, String) {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{m}.json"))).unwrap())
            .unwrap();
    let inputs: Vec<serde_json::Value> = meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let mut shape: Vec<i64> = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_i64().unwrap())
                .collect();
            shape[0] = 1;
            let n: i64 = shape.iter().product();
            serde_json::json!({
                "name": t["name"], "datatype": t["datatype"], "shape": shape,
                "data": vec![0; n as usize],
            })
        })
        .collect();
    let body = serde_json::json!({ "inputs": inputs }).to_string();
    http(addr, "POST", &format!("/v2/models/{m}/infer"), &body)
}

/// Waits (at most 20 s) until a request for `m` is answered 200 (on a loaded
/// machine a single one may miss its SLO).
fn served(addr: &str, dir: &Path, m: &str) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (st, body) = infer_zeros(addr, dir, m);
        if st == 200 {
            return;
        }
        assert!(Instant::now() < end, "{m} not served: {st} {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `--model-control-mode poll` over a copy of the shipped `mlp` and `cnn`,
/// looked at every 0.2 s: both ready at start; clients' loads and unloads
/// refused; `cnn`'s model file removed, it becomes unavailable and its
/// requests are refused while `mlp` is served; put back, it is ready and
/// serves again; a model added after start is not served.
#[test]
fn poll_follows_the_model_repository() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models");
    let dir = std::env::temp_dir().join(format!("fermata-poll-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&root).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("mlp.") || name.starts_with("cnn.") {
            std::fs::copy(e.path(), dir.join(&name)).unwrap();
        }
    }
    let (p, addr, _) = fermata::harness::procs::serve_apis(
        &exe(),
        &dir,
        &[
            "--model-control-mode",
            "poll",
            "--repository-poll-secs",
            "0.2",
        ],
    )
    .unwrap();
    until_state(&addr, "cnn", "READY");
    until_state(&addr, "mlp", "READY");
    let (st, body) = http(&addr, "POST", "/v2/repository/models/cnn/unload", "{}");
    assert!(
        st != 200 && body.contains("polling is enabled"),
        "a client's unload: {st} {body}"
    );
    let aside = dir.join("cnn.onnx.aside");
    std::fs::rename(dir.join("cnn.onnx"), &aside).unwrap();
    until_state(&addr, "cnn", "UNAVAILABLE");
    let (st, body) = infer_zeros(&addr, &dir, "cnn");
    assert_ne!(st, 200, "cnn removed: {body}");
    served(&addr, &dir, "mlp");
    // A model that was not there at start.
    std::fs::copy(dir.join("mlp.onnx"), dir.join("extra.onnx")).unwrap();
    std::fs::rename(&aside, dir.join("cnn.onnx")).unwrap();
    until_state(&addr, "cnn", "READY");
    served(&addr, &dir, "cnn");
    assert!(
        index(&addr).iter().all(|(n, _)| n != "extra"),
        "{:?}",
        index(&addr)
    );
    p.stop(Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
}
