//! A Triton model repository served unchanged: the shipped models laid out as
//! Triton's documentation lays out an ONNX repository (`MODEL/config.pbtxt`,
//! `MODEL/1/model.onnx`), with configurations as Triton users write them
//! (platform, max_batch_size, inputs and outputs with `dims` after the batch,
//! dynamic_batching with preferred sizes and a queue timeout, instance_group,
//! a version policy), served by `fermata serve` and checked with Triton's own
//! clients over HTTP (every model against ONNX Runtime on the CPU) and gRPC;
//! then `fermata profile` on a Triton model directory, and a broken
//! configuration refused with its file, line and field.
//!
//! Needs python3 with the packages `scripts/setup.sh` installs into .deps/py.

use fermata::harness::procs::{self, Proc};
use fermata::repo::{DType, ModelMeta};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn triton_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "TYPE_FP32",
        DType::F16 => "TYPE_FP16",
        DType::I64 => "TYPE_INT64",
        DType::I32 => "TYPE_INT32",
        other => panic!("no shipped model has {other:?} tensors"),
    }
}

/// A model's `config.pbtxt`, as Triton's documentation writes one.
fn config_of(m: &ModelMeta) -> String {
    let tensors = |ts: &[fermata::repo::TensorMeta]| {
        ts.iter()
            .map(|t| {
                let dims: Vec<String> = t.sample_shape().iter().map(|d| d.to_string()).collect();
                format!(
                    "  {{\n    name: \"{}\"\n    data_type: {}\n    dims: [ {} ]\n  }}",
                    t.name,
                    triton_type(t.datatype),
                    dims.join(", ")
                )
            })
            .collect::<Vec<_>>()
            .join(",\n")
    };
    format!(
        "name: \"{name}\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: {mb}\n\
         version_policy: {{ latest {{ num_versions: 1 }} }}\n\
         input [\n{inputs}\n]\noutput [\n{outputs}\n]\n\
         instance_group [\n  {{\n    count: 1\n    kind: KIND_CPU\n  }}\n]\n\
         dynamic_batching {{\n  preferred_batch_size: [ 4, 8 ]\n  max_queue_delay_microseconds: 100\n\
         \x20 default_queue_policy {{ default_timeout_microseconds: {us} }}\n}}\n",
        name = m.name,
        mb = m.max_batch,
        inputs = tensors(&m.inputs),
        outputs = tensors(&m.outputs),
        // A generous deadline: what is checked here is the layout and the
        // answers, not latency (ranker's own 10 ms is tight on 2 shared cores).
        us = (m.slo_ms.max(200.0) * 1000.0) as u64,
    )
}

/// The shipped models as a Triton repository under a fresh directory.
fn triton_repo(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fermata-triton-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for name in ["mlp", "cnn", "ranker"] {
        let src = root().join("models");
        let meta = fermata::repo::load_meta(&src.join(format!("{name}.onnx"))).unwrap();
        let m = dir.join(name);
        std::fs::create_dir_all(m.join("1")).unwrap();
        // A version directory that the policy does not pick, and a non-numeric one.
        std::fs::create_dir_all(m.join("0")).unwrap();
        std::fs::create_dir_all(m.join("notes")).unwrap();
        std::fs::write(m.join("config.pbtxt"), config_of(&meta)).unwrap();
        std::fs::copy(src.join(format!("{name}.onnx")), m.join("1/model.onnx")).unwrap();
        std::fs::copy(src.join(format!("{name}.onnx")), m.join("0/model.onnx")).unwrap();
        let prof = format!("{name}.profile-cpu.json");
        std::fs::copy(src.join(&prof), m.join(&prof)).unwrap();
    }
    dir
}

fn python(script: &Path, args: &[&str]) -> String {
    let deps = root().join(".deps/py");
    assert!(
        deps.join("tritonclient").exists(),
        "tritonclient is not installed in {}: run scripts/setup.sh",
        deps.display()
    );
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .env("PYTHONPATH", &deps)
        .output()
        .expect("python3");
    let text = procs::output_text(&out);
    assert!(out.status.success(), "{} failed:\n{text}", script.display());
    text
}

#[test]
fn a_triton_repository_is_served_unchanged_over_http_and_grpc() {
    let repo = triton_repo("serve");
    let models = fermata::repo::load_repository(&repo, "onnx").unwrap();
    let names: Vec<&str> = models.iter().map(|m| m.meta.name.as_str()).collect();
    assert_eq!(names, ["cnn", "mlp", "ranker"]);
    for m in &models {
        assert!(m.file.ends_with("1/model.onnx"), "{}", m.file.display());
        assert_eq!(m.meta.batch_buckets, Some(vec![4, 8]));
    }
    let exe = Path::new(env!("CARGO_BIN_EXE_fermata"));
    let (p, http, grpc): (Proc, String, String) = procs::serve_apis(exe, &repo, &[]).unwrap();
    let flat = root().join("models");
    let flat = flat.to_str().unwrap();
    // Every model over HTTP (JSON and binary tensors) against ONNX Runtime on
    // the CPU, with the flat repository's copies of the models as reference.
    let text = python(
        &root().join("scripts/check_http.py"),
        &["--url", &http, "--models", flat, "--retries", "2"],
    );
    assert!(text.contains("all outputs match"), "{text}");
    // Triton's gRPC client: metadata, config, statistics, inference, errors.
    let text = python(
        &root().join("tests/clients/triton_grpc.py"),
        &["--url", &grpc, "--models", flat],
    );
    assert!(text.contains("checks passed"), "{text}");
    let last = p.stop(Duration::from_secs(20)).expect("a report");
    let rep: serde_json::Value =
        serde_json::from_str(&last).unwrap_or_else(|e| panic!("{e}: {last}"));
    let f = &rep["frontends"][0];
    assert!(f["requests"].as_u64().unwrap() > 0, "{f}");
    assert_eq!(f["failed"].as_u64(), Some(0), "{f}");
    let _ = std::fs::remove_dir_all(&repo);
}

#[test]
fn profile_writes_beside_the_config_and_bad_configs_name_file_line_and_field() {
    let repo = triton_repo("profile");
    let exe = env!("CARGO_BIN_EXE_fermata");
    let mlp = repo.join("mlp");
    std::fs::remove_file(mlp.join("mlp.profile-cpu.json")).unwrap();
    let out = Command::new(exe)
        .args(["profile", "--executor", "onnx"])
        .args(["--repeats", "2", "--warmup", "1", "--model"])
        .arg(&mlp)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", procs::output_text(&out));
    assert!(mlp.join("mlp.profile-cpu.json").is_file());
    fermata::repo::load_repository(&repo, "onnx").unwrap();

    // A field Triton knows but Fermata does not do, then a typo.
    let cfg = mlp.join("config.pbtxt");
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, good.clone() + "response_cache { enable: true }\n").unwrap();
    let e = format!(
        "{:#}",
        fermata::repo::load_repository(&repo, "onnx").unwrap_err()
    );
    assert!(
        e.contains("config.pbtxt") && e.contains("response_cache"),
        "{e}"
    );
    std::fs::write(&cfg, good.replace("max_batch_size", "max_batch_sise")).unwrap();
    let out = Command::new(exe)
        .args([
            "serve",
            "--executor",
            "onnx",
            "--http-port",
            "0",
            "--models",
        ])
        .arg(&repo)
        .output()
        .unwrap();
    let text = procs::output_text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("mlp/config.pbtxt")
            && text.contains("line 3")
            && text.contains("max_batch_sise"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&repo);
}
