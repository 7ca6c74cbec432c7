//! Executor overhead: what the backend's ONNX executor costs on top of ONNX
//! Runtime itself, for each shipped model (models/) and batch sizes 1, 8 and 32.
//!
//! ```text
//! cargo bench --bench executor_overhead                 # full run, about half a minute
//! cargo bench --bench executor_overhead -- --secs 2     # longer per point
//! ```
//!
//! Under `cargo test --all-targets` cargo runs this binary without `--bench`; it then
//! does a tiny run (a smoke test that it still builds and works).
//!
//! # What is compared (same session, same thread, same inputs)
//! * **executor**: [`OnnxModel::run`] with one `&[u8]` per request, as the backend
//!   calls it: the gather copy into the reused input buffers, the tensor views,
//!   the session run, and the split of each output into per-request byte vectors;
//! * **bare**: `Session::run` on input tensors built once before timing (no copy
//!   in, outputs dropped).
//!
//! The two are timed alternately (one executor batch, one bare batch, ...) after a
//! warm-up, so drifts in clock speed or machine load hit both alike; the table
//! shows the medians and their ratio (the target is at most 1.10). ONNX Runtime
//! runs with `FERMATA_ORT_THREADS` intra-op threads (default 1), as in the backend.
//! It needs ONNX Runtime (`scripts/setup.sh`).

use fermata::node::onnx::{OnnxModel, OnnxOptions};
use fermata::repo::{load_meta, DType, ModelMeta};
use ort::session::SessionInputValue;
use ort::value::{DynValue, Tensor};
use rand::SeedableRng;
use std::path::Path;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MODELS: [&str; 3] = ["mlp", "cnn", "ranker"];
const BATCHES: [usize; 3] = [1, 8, 32];

/// Prebuilt input tensors for a batch of `reqs`, in the session's input order.
fn bare_inputs(model: &mut OnnxModel, meta: &ModelMeta, reqs: &[&[u8]]) -> Vec<DynValue> {
    let names: Vec<String> = model
        .session_mut()
        .inputs()
        .iter()
        .map(|o| o.name().to_string())
        .collect();
    let mut out = Vec::new();
    for name in names {
        let mut off = 0;
        let t = loop {
            let t = &meta.inputs[off];
            if t.name == name {
                break t;
            }
            off += 1;
        };
        let start: usize = meta.inputs[..off].iter().map(|t| t.sample_bytes()).sum();
        let bytes: Vec<u8> = reqs
            .iter()
            .flat_map(|r| r[start..start + t.sample_bytes()].iter().copied())
            .collect();
        let mut shape = vec![reqs.len() as i64];
        shape.extend_from_slice(t.sample_shape());
        let v: DynValue = match t.datatype {
            DType::F32 => Tensor::from_array((
                shape,
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect::<Vec<f32>>(),
            ))
            .unwrap()
            .into_dyn(),
            DType::I64 => Tensor::from_array((
                shape,
                bytes
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect::<Vec<i64>>(),
            ))
            .unwrap()
            .into_dyn(),
            other => panic!("the benchmark builds FP32 and INT64 inputs only, not {other:?}"),
        };
        out.push(v);
    }
    out
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--bench");
    let secs: f64 = args
        .iter()
        .position(|a| a == "--secs")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.parse().expect("--secs takes seconds"))
        .unwrap_or(if full { 1.0 } else { 0.02 });
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let opts = OnnxOptions::cpu(&dir).unwrap_or_else(|e| panic!("{e:#}"));
    println!(
        "executor overhead: OnnxModel::run (gather + run + split) / bare Session::run, {} intra-op thread(s), {secs} s per point",
        opts.intra_threads
    );
    println!(
        "{:<8} {:>5} {:>8} {:>14} {:>14} {:>8}",
        "model", "batch", "repeats", "executor us", "bare us", "ratio"
    );
    let mut worst: f64 = 0.0;
    for name in MODELS {
        let file = dir.join(format!("{name}.onnx"));
        let meta = load_meta(&file).unwrap();
        let mut model = OnnxModel::open(&file, &meta, &opts).unwrap_or_else(|e| panic!("{e:#}"));
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(11);
        let reqs: Vec<Vec<u8>> = (0..32).map(|_| meta.sample_input(&mut rng)).collect();
        let refs: Vec<&[u8]> = reqs.iter().map(|v| v.as_slice()).collect();
        for b in BATCHES {
            let batch = &refs[..b];
            let tensors = bare_inputs(&mut model, &meta, batch);
            let views: Vec<SessionInputValue<'_>> = tensors.iter().map(|t| t.into()).collect();
            // Warm-up, and a first estimate of the time per pair.
            let t0 = Instant::now();
            let mut warm = 0u32;
            while warm < 20 || t0.elapsed() < Duration::from_secs_f64(secs / 10.0) {
                std::hint::black_box(model.run(batch).unwrap());
                drop(std::hint::black_box(
                    model.session_mut().run(&views[..]).unwrap(),
                ));
                warm += 1;
            }
            let per = t0.elapsed().as_secs_f64() / warm as f64;
            let repeats = ((secs / per) as usize).clamp(if full { 200 } else { 5 }, 200_000);
            let (mut ex, mut bare) = (Vec::with_capacity(repeats), Vec::with_capacity(repeats));
            for _ in 0..repeats {
                let t = Instant::now();
                std::hint::black_box(model.run(batch).unwrap());
                ex.push(t.elapsed().as_secs_f64() * 1e6);
                let t = Instant::now();
                drop(std::hint::black_box(
                    model.session_mut().run(&views[..]).unwrap(),
                ));
                bare.push(t.elapsed().as_secs_f64() * 1e6);
            }
            let (me, mb) = (median(&mut ex), median(&mut bare));
            worst = worst.max(me / mb);
            println!(
                "{name:<8} {b:>5} {repeats:>8} {me:>14.2} {mb:>14.2} {:>8.3}",
                me / mb
            );
        }
    }
    println!("worst ratio {worst:.3} (target <= 1.10)");
}
