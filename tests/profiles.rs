//! Profiles as the command line sees them: the scheduler refuses a real model that
//! has no measured profile and says how to make one; `fermata profile` rejects bad
//! arguments clearly.

use fermata::repo::{DType, ModelMeta, TensorMeta};
use std::path::{Path, PathBuf};
use std::process::Command;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fermata"))
}

fn fails(args: &[&str]) -> String {
    let o = Command::new(exe()).args(args).output().unwrap();
    assert!(!o.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn repo_without_profile(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fermata-prof-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let meta = ModelMeta {
        name: "tiny".into(),
        inputs: vec![TensorMeta {
            name: "x".into(),
            datatype: DType::F32,
            shape: vec![-1, 8],
            range: None,
        }],
        outputs: vec![TensorMeta {
            name: "y".into(),
            datatype: DType::F32,
            shape: vec![-1, 2],
            range: None,
        }],
        slo_ms: 20.0,
        max_batch: 8,
        description: String::new(),
        batch_buckets: None,
    };
    std::fs::write(dir.join("tiny.onnx"), b"placeholder").unwrap();
    std::fs::write(dir.join("tiny.json"), serde_json::to_string(&meta).unwrap()).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn scheduler_refuses_a_model_without_a_profile() {
    let dir = repo_without_profile("sched");
    let e = fails(&["scheduler", "--models", s(&dir), "--listen", "127.0.0.1:0"]);
    assert!(
        e.contains("model `tiny` has no onnx latency profile"),
        "{e}"
    );
    assert!(e.contains("tiny.profile-cpu.json"), "{e}");
    let want = format!(
        "fermata profile --model {} --executor onnx",
        s(&dir.join("tiny.onnx"))
    );
    assert!(e.contains(&want), "{e}");
    // The CUDA profile is asked for by name too.
    let e = fails(&[
        "scheduler",
        "--models",
        s(&dir),
        "--profiles",
        "cuda",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert!(e.contains("tiny.profile-cuda.json"), "{e}");
    // A broken profile is named, not ignored.
    std::fs::write(dir.join("tiny.profile-cpu.json"), "{\"model\": 1}").unwrap();
    let e = fails(&["scheduler", "--models", s(&dir), "--listen", "127.0.0.1:0"]);
    assert!(
        e.contains("tiny.profile-cpu.json: not a profile file"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn profile_rejects_bad_arguments() {
    let dir = repo_without_profile("cli");
    let model = dir.join("tiny.onnx");
    let e = fails(&["profile", "--model", s(&dir.join("nope.onnx"))]);
    assert!(e.contains("no metadata file"), "{e}");
    let e = fails(&["profile", "--model", s(&model), "--executor", "emulated"]);
    assert!(e.contains("only replays a profile"), "{e}");
    let e = fails(&["profile", "--model", s(&model), "--batch-sizes", "4..1"]);
    assert!(e.contains("4..1 is empty"), "{e}");
    let e = fails(&["profile", "--model", s(&model), "--batch-sizes", "1,64"]);
    assert!(e.contains("exceeds the model's max_batch 8"), "{e}");
    let e = fails(&["profile", "--model", s(&model), "--lanes", "0"]);
    assert!(e.contains("--lanes must be 1 to 64"), "{e}");
    let e = fails(&["profile", "--model", s(&model), "--executor", "tpu"]);
    assert!(e.contains("unknown executor \"tpu\""), "{e}");
    assert!(!dir.join("tiny.profile-cpu.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The profiler end to end on a shipped model with ONNX Runtime (CPU).
#[test]
fn profile_measures_a_real_model() {
    let dir = std::env::temp_dir().join(format!("fermata-prof-real-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("mlp.json");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/mlp.onnx");
    let o = Command::new(exe())
        .args([
            "profile",
            "--model",
            s(&model),
            "--batch-sizes",
            "1,4,16",
            "--repeats",
            "3",
            "--warmup",
            "1",
            "--out",
            s(&out),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("least squares: l(b) ="), "{stdout}");
    let p = fermata::repo::ProfileFile::load(&out).unwrap();
    assert_eq!(p.model, "mlp");
    assert_eq!(p.executor, "onnx");
    assert_eq!(p.batch_sizes, vec![1, 4, 16]);
    assert_eq!(p.max_batch, 16);
    assert_eq!(p.repeats, 3);
    assert!(p.median_ms.iter().all(|&m| m > 0.0), "{p:?}");
    for (b, m) in p.batch_sizes.iter().zip(&p.median_ms) {
        assert!(p.alpha_ms * *b as f64 + p.beta_ms >= m - 1e-9, "{p:?}");
    }
    // The scheduler takes it: a repository with this profile loads.
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    for f in ["mlp.onnx", "mlp.json"] {
        std::fs::copy(model.with_file_name(f), repo.join(f)).unwrap();
    }
    std::fs::copy(&out, repo.join("mlp.profile-cpu.json")).unwrap();
    let models = fermata::repo::load_repository(&repo, "onnx").unwrap();
    assert_eq!(models[0].spec().unwrap().profile.max_batch(), 16);
    // d(b, 2): two sessions on the one device, every batch on both at once.
    let out2 = dir.join("mlp-lanes2.json");
    let o = Command::new(exe())
        .args([
            "profile",
            "--model",
            s(&model),
            "--batch-sizes",
            "1,16",
            "--repeats",
            "3",
            "--warmup",
            "1",
            "--lanes",
            "2",
            "--out",
            s(&out2),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("2 lanes, every batch on all at once"), "{err}");
    let p2 = fermata::repo::ProfileFile::load(&out2).unwrap();
    assert_eq!(p2.lanes, 2);
    assert_eq!(p2.batch_sizes, vec![1, 16]);
    assert_eq!(p.lanes, 1);
    // A cluster plans each lane with the profile: serving with a number of
    // lanes the profiles were not measured with is refused, naming both.
    let serve = |lanes: &str| {
        Command::new(exe())
            .args([
                "serve",
                "--executor",
                "onnx",
                "--models",
                s(&repo),
                "--lanes",
                lanes,
            ])
            .args(["--rate", "20", "--warmup-s", "0", "--duration-s", "0.5"])
            .output()
            .unwrap()
    };
    let o = serve("2");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("mlp's onnx profile is d(b, 1)"), "{err}");
    assert!(err.contains("--lanes 2"), "{err}");
    std::fs::copy(&out2, repo.join("mlp.profile-cpu.json")).unwrap();
    let o = serve("1");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("mlp's onnx profile is d(b, 2)"), "{err}");
    let o = Command::new(exe())
        .args([
            "bench",
            "serve",
            "--models",
            s(&repo),
            "--duration-s",
            "0.5",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("d(b, 2)"), "{err}");
    let o = serve("2");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}
