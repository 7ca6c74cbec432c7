//! The ONNX Runtime executor on the shipped models (models/): Python reference
//! outputs reproduced, batching changes no request's output, clear errors for bad
//! metadata, missing files and models without metadata, and `fermata serve
//! --executor onnx` end to end.
//!
//! These need ONNX Runtime (`scripts/setup.sh` installs it into .deps/py). Without
//! it they fail with the setup hint; they do not skip.

use fermata::node::exec::{executor_factory, Executor};
use fermata::node::onnx::{OnnxExecutor, OnnxModel, OnnxOptions, Sharing};
use fermata::repo::BucketPolicy;
use fermata::repo::{load_meta, DType, ModelMeta};
use fermata::wire::{Dur, ModelId, ModelInfo, WireProfile};
use rand::SeedableRng;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::Command;

const MODELS: [&str; 3] = ["mlp", "cnn", "ranker"];

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
}

fn meta(name: &str) -> ModelMeta {
    load_meta(&models_dir().join(format!("{name}.onnx"))).unwrap()
}

fn open(name: &str) -> OnnxModel {
    let opts = OnnxOptions::cpu(&models_dir()).unwrap();
    OnnxModel::open(
        &models_dir().join(format!("{name}.onnx")),
        &meta(name),
        &opts,
    )
    .unwrap_or_else(|e| panic!("{e:#}"))
}

#[derive(Deserialize)]
struct RefTensor {
    name: String,
    datatype: String,
    shape: Vec<usize>,
    data: Vec<f64>,
}

#[derive(Deserialize)]
struct Reference {
    batch: usize,
    inputs: Vec<RefTensor>,
    outputs: Vec<RefTensor>,
}

fn reference(name: &str) -> Reference {
    let p = models_dir().join(format!("{name}.ref.json"));
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

/// Little-endian bytes of `v` as `dt`.
fn encode(dt: &str, v: &[f64]) -> Vec<u8> {
    let mut b = Vec::new();
    for &x in v {
        match dt {
            "FP32" => b.extend_from_slice(&(x as f32).to_le_bytes()),
            "INT64" => b.extend_from_slice(&(x as i64).to_le_bytes()),
            other => panic!("reference datatype {other} not handled here"),
        }
    }
    b
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn close(a: f32, b: f32, rel: f32) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-3)
}

/// Runs `refs` in batches of `b` and checks that request k's output is `alone[k]`
/// (within 1e-5 relative); `what` names the case in a failure.
fn check_batches(model: &mut OnnxModel, refs: &[&[u8]], alone: &[Vec<u8>], b: usize, what: &str) {
    let want_len = model.meta.output_bytes();
    let mut k = 0;
    for chunk in refs.chunks(b) {
        let outs = model.run(chunk).unwrap();
        assert_eq!(outs.len(), chunk.len(), "{what}: batch of {}", chunk.len());
        for o in outs {
            assert_eq!(o.len(), want_len);
            let (g, w) = (f32s(&o), f32s(&alone[k]));
            for (i, (&g, &w)) in g.iter().zip(&w).enumerate() {
                assert!(
                    close(g, w, 1e-5),
                    "{what}: request {k} in batches of {b}: [{i}] {g} vs {w} alone"
                );
            }
            k += 1;
        }
    }
}

#[test]
fn reproduces_python_reference_outputs() {
    for name in MODELS {
        let m = meta(name);
        let r = reference(name);
        let mut model = open(name);
        // Each sample's bytes: every input's sample, in metadata order.
        let reqs: Vec<Vec<u8>> = (0..r.batch)
            .map(|k| {
                let mut b = Vec::new();
                for t in &m.inputs {
                    let rt = r.inputs.iter().find(|x| x.name == t.name).unwrap();
                    assert_eq!(rt.shape[0], r.batch);
                    let per = rt.data.len() / r.batch;
                    b.extend(encode(&rt.datatype, &rt.data[k * per..(k + 1) * per]));
                }
                assert_eq!(b.len(), m.input_bytes());
                b
            })
            .collect();
        let refs: Vec<&[u8]> = reqs.iter().map(|v| v.as_slice()).collect();
        // As one batch and one by one.
        let batched = model.run(&refs).unwrap();
        let single: Vec<Vec<u8>> = refs
            .iter()
            .map(|r| model.run(&[r]).unwrap().remove(0))
            .collect();
        for outs in [&batched, &single] {
            assert_eq!(outs.len(), r.batch);
            for (k, out) in outs.iter().enumerate() {
                assert_eq!(out.len(), m.output_bytes(), "{name}");
                let mut off = 0;
                for t in &m.outputs {
                    assert_eq!(t.datatype, DType::F32);
                    let got = f32s(&out[off..off + t.sample_bytes()]);
                    off += t.sample_bytes();
                    let rt = r.outputs.iter().find(|x| x.name == t.name).unwrap();
                    let per = rt.data.len() / r.batch;
                    let want = &rt.data[k * per..(k + 1) * per];
                    assert_eq!(got.len(), want.len());
                    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
                        assert!(
                            close(g, w as f32, 1e-4),
                            "{name} sample {k} output {} [{i}]: got {g}, Python onnxruntime {w}",
                            t.name
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn batching_does_not_change_a_request_output() {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
    for name in MODELS {
        let m = meta(name);
        let mut model = open(name);
        let reqs: Vec<Vec<u8>> = (0..m.max_batch).map(|_| m.sample_input(&mut rng)).collect();
        let refs: Vec<&[u8]> = reqs.iter().map(|v| v.as_slice()).collect();
        let alone: Vec<Vec<u8>> = refs
            .iter()
            .map(|r| model.run(&[r]).unwrap().remove(0))
            .collect();
        for b in [2usize, 7, 16, 33, m.max_batch as usize] {
            check_batches(&mut model, &refs, &alone, b, name);
        }
        // Over the max batch, or a request of the wrong size: clear errors.
        let too_many: Vec<&[u8]> = vec![refs[0]; m.max_batch as usize + 1];
        let e = format!("{:#}", model.run(&too_many).unwrap_err());
        assert!(e.contains("exceeds its max batch"), "{e}");
        let short = &refs[0][..refs[0].len() - 1];
        let e = format!("{:#}", model.run(&[refs[0], short]).unwrap_err());
        assert!(e.contains("request 1") && e.contains("input bytes"), "{e}");
    }
}

/// A staged batch (the requests pulled straight into the buffer the model
/// runs from, one row each) gives every request the output it gets alone; a
/// model whose requests are several tensors is not staged.
#[test]
fn a_staged_batch_gives_each_request_its_own_output() {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(9);
    for name in ["cnn", "mlp"] {
        let m = meta(name);
        let mut model = open(name);
        let (row, rows) = model.stage_layout().expect("one input tensor: staged");
        assert_eq!(row, m.input_bytes());
        assert!(rows >= m.max_batch as usize);
        let reqs: Vec<Vec<u8>> = (0..m.max_batch).map(|_| m.sample_input(&mut rng)).collect();
        let alone: Vec<Vec<u8>> = reqs
            .iter()
            .map(|r| model.run(&[r]).unwrap().remove(0))
            .collect();
        let mut words = vec![0u64; (rows * row).div_ceil(8)];
        // SAFETY: any u64 memory is valid as bytes.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 8)
        };
        for b in [1usize, 7, 33, m.max_batch as usize] {
            for (k, r) in reqs[..b].iter().enumerate() {
                buf[k * row..(k + 1) * row].copy_from_slice(r);
            }
            let outs = model.run_staged(buf, b).unwrap();
            assert_eq!(outs.len(), b);
            for (k, o) in outs.iter().enumerate() {
                let (g, w) = (f32s(o), f32s(&alone[k]));
                assert_eq!(g.len(), w.len());
                for (&g, &w) in g.iter().zip(&w) {
                    assert!(close(g, w, 1e-5), "{name}: row {k} of {b}: {g} vs {w}");
                }
            }
        }
        let e = format!(
            "{:#}",
            model.run_staged(buf, m.max_batch as usize + 1).unwrap_err()
        );
        assert!(e.contains("exceeds its max batch"), "{e}");
    }
    assert!(open("ranker").stage_layout().is_none(), "two input tensors");
}

/// Shape-stable execution on the CPU: each batch runs padded to its bucket in a
/// session of that shape (the padding rows hold earlier requests' bytes), and
/// every request still gets exactly the output it gets alone at its exact size.
#[test]
fn padded_buckets_give_each_request_its_own_output() {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(11);
    for name in MODELS {
        let m = meta(name);
        let file = models_dir().join(format!("{name}.onnx"));
        let mut exact = open(name);
        assert!(
            exact.buckets().is_empty(),
            "the CPU default is exact shapes"
        );
        for sharing in [Sharing::All, Sharing::None] {
            let mut opts = OnnxOptions::cpu(&models_dir()).unwrap();
            opts.buckets = BucketPolicy::List(vec![4, 16]);
            opts.sharing = sharing;
            let mut model = OnnxModel::open(&file, &m, &opts).unwrap_or_else(|e| panic!("{e:#}"));
            // max_batch is added as the last bucket.
            assert_eq!(model.buckets(), &[4, 16, m.max_batch]);
            for (n, shape) in [(1, 4), (4, 4), (5, 16), (16, 16), (17, 64), (64, 64)] {
                assert_eq!(model.shape_for(n), shape, "{name}: batch {n}");
            }
            if sharing == Sharing::None {
                assert_eq!(model.shared_weight_bytes(), 0);
            } else {
                assert!(
                    model.shared_weight_bytes() > 1024,
                    "{name}: weights not shared"
                );
            }
            let reqs: Vec<Vec<u8>> = (0..40).map(|_| m.sample_input(&mut rng)).collect();
            let refs: Vec<&[u8]> = reqs.iter().map(|v| v.as_slice()).collect();
            let alone: Vec<Vec<u8>> = refs
                .iter()
                .map(|r| exact.run(&[r]).unwrap().remove(0))
                .collect();
            for b in [1usize, 3, 5, 13, 17, 40] {
                check_batches(
                    &mut model,
                    &refs,
                    &alone,
                    b,
                    &format!("{name} ({sharing:?}), padded"),
                );
            }
        }
    }
}

/// The real-size model (scripts/setup.sh writes it): 160 shared weight tensors,
/// a padded batch in a bucket of 2, the same outputs as the exact session.
#[test]
fn resnet50_runs_padded_with_shared_weights() {
    let dir = models_dir().join("large");
    let file = dir.join("resnet50.onnx");
    if !file.is_file() {
        eprintln!("skipped: no {} (run scripts/setup.sh)", file.display());
        return;
    }
    let m = load_meta(&file).unwrap();
    let mut opts = OnnxOptions::cpu(&dir).unwrap();
    opts.buckets = BucketPolicy::List(vec![2]);
    let mut padded = OnnxModel::open(&file, &m, &opts).unwrap_or_else(|e| panic!("{e:#}"));
    // Every convolution and the classifier: about 97 MiB of weights, one copy.
    assert!(
        padded.shared_weight_bytes() > 90 << 20,
        "{}",
        padded.shared_weight_bytes()
    );
    opts.buckets = BucketPolicy::Exact;
    let mut exact = OnnxModel::open(&file, &m, &opts).unwrap();
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(3);
    let x = m.sample_input(&mut rng);
    let got = f32s(&padded.run(&[&x]).unwrap()[0]);
    let want = f32s(&exact.run(&[&x]).unwrap()[0]);
    assert_eq!(got.len(), 1000);
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!(close(g, w, 1e-4), "logit {i}: {g} padded vs {w} exact");
    }
}

fn info(id: u32, name: &str, meta: Option<&ModelMeta>) -> ModelInfo {
    ModelInfo {
        id: ModelId(id),
        name: name.into(),
        slo: Dur(20_000_000),
        profile: WireProfile::Linear {
            alpha_ns: 100_000,
            beta_ns: 500_000,
            max_batch: 64,
        },
        input_bytes: meta.map_or(256, |m| m.input_bytes() as u32),
        meta_json: meta.map_or(String::new(), |m| serde_json::to_string(m).unwrap()),
    }
}

fn load_err(exec: &mut OnnxExecutor, i: &ModelInfo) -> String {
    format!("{:#}", exec.load(i).unwrap_err())
}

#[test]
fn bad_models_give_clear_errors() {
    let opts = OnnxOptions::cpu(&models_dir()).unwrap();
    let mut exec = OnnxExecutor::new(opts).unwrap_or_else(|e| panic!("{e:#}"));
    // The good case, through the executor interface.
    let mlp = meta("mlp");
    exec.load(&info(0, "mlp", Some(&mlp))).unwrap();
    let x = vec![0u8; mlp.input_bytes()];
    assert_eq!(exec.run(ModelId(0), &[&x, &x]).unwrap().len(), 2);
    exec.unload(ModelId(0));
    assert!(format!("{:#}", exec.run(ModelId(0), &[&x]).unwrap_err()).contains("not loaded"));

    // No metadata: a profile-only (emulated) model.
    let e = load_err(&mut exec, &info(1, "mlp", None));
    assert!(e.contains("no metadata"), "{e}");

    // Input name mismatch: both directions are named.
    let mut m = mlp.clone();
    m.inputs[0].name = "pixels".into();
    let e = load_err(&mut exec, &info(2, "mlp", Some(&m)));
    assert!(e.contains("`input`") && e.contains("pixels"), "{e}");

    // Dtype mismatch names the tensor and both types.
    let mut m = mlp.clone();
    m.inputs[0].datatype = DType::F64;
    let e = load_err(&mut exec, &info(3, "mlp", Some(&m)));
    assert!(e.contains("input `input`") && e.contains("FP64"), "{e}");

    // Shape mismatch.
    let mut m = mlp.clone();
    m.inputs[0].shape = vec![-1, 32];
    let e = load_err(&mut exec, &info(4, "mlp", Some(&m)));
    assert!(e.contains("input `input`") && e.contains("shape"), "{e}");

    // An output the file does not have.
    let mut m = mlp.clone();
    m.outputs[0].name = "scores".into();
    let e = load_err(&mut exec, &info(5, "mlp", Some(&m)));
    assert!(e.contains("output `scores`") && e.contains("logits"), "{e}");

    // Output dtype mismatch.
    let mut m = mlp.clone();
    m.outputs[0].datatype = DType::I64;
    let e = load_err(&mut exec, &info(6, "mlp", Some(&m)));
    assert!(e.contains("output `logits`") && e.contains("INT64"), "{e}");

    // Missing file.
    let mut m = mlp.clone();
    m.name = "nosuch".into();
    let e = load_err(&mut exec, &info(7, "nosuch", Some(&m)));
    assert!(
        e.contains("no ONNX file") && e.contains("nosuch.onnx"),
        "{e}"
    );

    // A file that is not ONNX.
    let dir = std::env::temp_dir().join(format!("fermata-onnx-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("mlp.onnx"), b"not an onnx file").unwrap();
    let mut bad = OnnxExecutor::new(OnnxOptions::cpu(&dir).unwrap()).unwrap();
    let e = load_err(&mut bad, &info(8, "mlp", Some(&mlp)));
    assert!(e.contains("cannot open"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);

    // Unknown executor kinds are refused with the list.
    let e = format!(
        "{:#}",
        executor_factory("tpu", &models_dir()).err().unwrap()
    );
    assert!(e.contains("emulated, onnx, cuda"), "{e}");
}

fn fermata() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fermata"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

#[test]
fn missing_onnx_runtime_is_a_clear_error() {
    let secret = fermata::harness::procs::SecretFile::new().unwrap();
    let out = fermata()
        .args([
            "backend",
            "--executor",
            "onnx",
            "--scheduler",
            "127.0.0.1:1",
        ])
        .env("ORT_DYLIB_PATH", "/nonexistent/libonnxruntime.so")
        .env("FERMATA_CLUSTER_SECRET_FILE", &secret.path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ONNX Runtime not found")
            && err.contains("scripts/setup.sh")
            && err.contains("ORT_DYLIB_PATH"),
        "{err}"
    );
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_executor_needs_the_feature() {
    let e = format!(
        "{:#}",
        executor_factory("cuda", &models_dir()).err().unwrap()
    );
    assert!(
        e.contains("--features cuda") && e.contains("--executor onnx"),
        "{e}"
    );
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_executor_without_a_gpu_says_so() {
    // This machine has no GPU (CI neither): the factory refuses with the hint. On
    // a machine with one, it must load and run the mlp.
    match executor_factory("cuda", &models_dir()) {
        Err(e) => {
            let e = format!("{e:#}");
            assert!(
                e.contains("no CUDA device/driver found") && e.contains("--executor onnx"),
                "{e}"
            );
        }
        Ok(f) => {
            let mut exec = f(0).unwrap_or_else(|e| panic!("{e:#}"));
            let m = meta("mlp");
            exec.load(&info(0, "mlp", Some(&m))).unwrap();
            let x = vec![0u8; m.input_bytes()];
            assert_eq!(
                exec.run(ModelId(0), &[&x]).unwrap()[0].len(),
                m.output_bytes()
            );
        }
    }
}

#[test]
fn serve_onnx_end_to_end() {
    // In process, and over TCP (where the pull reads the channel's records
    // into the rows).
    for transport in ["inproc", "tcp"] {
        serve_onnx_over(transport);
    }
}

fn serve_onnx_over(transport: &str) {
    let out = fermata()
        .args([
            "serve",
            "--executor",
            "onnx",
            "--models",
            "models",
            "--transport",
            transport,
            "--rate",
            "60",
            "--warmup-s",
            "0.5",
            "--duration-s",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{transport}: {stderr}\n{stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["failed"], 0, "{stdout}");
    assert_eq!(v["wrong_outputs"], 0, "output lengths differ: {stdout}");
    assert_eq!(v["duplicates"], 0, "{stdout}");
    assert_eq!(v["unanswered"], 0, "{stdout}");
    assert!(v["sent"].as_u64().unwrap() > 30, "{stdout}");
    let per_model = v["per_model"].as_array().unwrap();
    let names: Vec<&str> = per_model
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cnn", "mlp", "ranker"]);
    for m in per_model {
        assert!(m["good"].as_u64().unwrap() > 0, "{m}");
    }
    let backends = v["cluster"]["backends"].as_array().unwrap();
    assert_eq!(backends[0]["plans_failed"], 0, "{stdout}");
    // Copies: the store into the frontend's region and the pull, which lands
    // cnn's and mlp's inputs in the buffers they run from; only ranker's (two
    // tensors, 128 of a request's bytes against cnn's 12,288) are gathered.
    let c = &v["input_copies"];
    let (pull, gather) = (c["pull"].as_f64().unwrap(), c["gather"].as_f64().unwrap());
    assert!(pull > 0.9 && pull <= 1.0, "{transport}: {c}");
    assert!(gather < 0.1, "{transport}: {c}");
}

/// A model file that cannot be loaded (here truncated) is final: `serve`
/// exits with the error naming the model instead of rejoining and retrying,
/// and `backend` would the same (the backend stops before it is in service).
#[test]
fn serve_exits_with_the_error_of_a_model_that_cannot_load() {
    let dir = std::env::temp_dir().join(format!("fermata-broken-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(models_dir()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("mlp.") {
            std::fs::copy(&p, dir.join(&name)).unwrap();
        }
    }
    let onnx = std::fs::read(models_dir().join("mlp.onnx")).unwrap();
    std::fs::write(dir.join("mlp.onnx"), &onnx[..onnx.len() / 2]).unwrap();
    let mut child = fermata()
        .args(["serve", "--executor", "onnx", "--models"])
        .arg(&dir)
        .args(["--rate", "10", "--warmup-s", "0", "--duration-s", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    // It ends on its own (a liveness bound, not a speed figure: the retries
    // it replaces went on for 600 s).
    let end = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > end {
            let _ = child.kill();
            panic!("serve did not exit on a model that cannot be loaded");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let stderr = reader.join().unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("cannot be loaded"), "{stderr}");
    assert_eq!(
        stderr.matches("rejoining").count(),
        0,
        "no rejoin after the failure: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
