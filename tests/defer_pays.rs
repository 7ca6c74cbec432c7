//! "Defer only when it pays", in the simulator with the production core:
//! at light load a lone request starts at once (eager latency), under load batches
//! are still deferred to their frontrun moment, and the idle time still collects on
//! the highest-numbered GPUs (flat-top). The paper's pure rule stays available as
//! the `symphony` policy and still defers every batch that can grow.
//!
//! Under bursty arrivals (Gamma-distributed gaps of shape 0.05, about 20 requests
//! a clump) deferred counts the clumps it expects before its frontrun moment
//! rather than the requests, so it no longer holds batches for growth that
//! mostly does not come while the GPUs sit idle between bursts. Near capacity on
//! a small bursty multi-model workload it stays within half a point of eager's
//! bad rate (it was about 1.1 points above it at 5,000 r/s before it counted
//! clumps; closing the rest of the gap is still open).
//!
//! Where many models share the GPUs under Poisson arrivals, a batch that finds
//! every GPU busy at its frontrun moment loses its head; after such an expiry a
//! GPU that would idle takes a waiting batch at once, so near capacity deferred
//! is not behind eager there, while below capacity it keeps its large batches.
//!
//! One model on one GPU near capacity does not wait at all: eager's batches
//! there are already as large as the load needs, and a wait only idles the one
//! GPU; below capacity deferred keeps its large batches and its idle time.

use fermata::core::Policy;
use fermata::run::RunResult;
use fermata::sim::{simulate, RunOptions};
use fermata::workload::Workload;

/// One model on `gpus` GPUs, Poisson arrivals, no network delay.
fn workload(gpus: u32, alpha_ms: f64, beta_ms: f64, slo_ms: f64) -> Workload {
    let toml = format!(
        "name = \"defer_pays\"\ngpus = {gpus}\narrival = \"poisson\"\nwarmup_s = 1\n\
         duration_s = 5\n[[models]]\nname = \"m\"\nalpha_ms = {alpha_ms}\n\
         beta_ms = {beta_ms}\nslo_ms = {slo_ms}\n"
    );
    Workload::from_toml(&toml, None).expect("valid workload")
}

/// 5 ResNet50-like models on 8 GPUs, equal popularity, Gamma(0.05) arrivals,
/// SLO 50 ms (configs/workloads/resnet_x5_8gpu_bursty.toml, shorter).
fn bursty() -> Workload {
    let toml = "name = \"bursty_defer\"\ngpus = 8\narrival = \"gamma:0.05\"\n\
                popularity = \"equal\"\nwarmup_s = 2\nduration_s = 10\n\
                [[models]]\nname = \"resnet50\"\nalpha_ms = 1.053\nbeta_ms = 5.072\n\
                slo_ms = 50\ncopies = 5\n";
    Workload::from_toml(toml, None).expect("valid workload")
}

fn run(w: &Workload, policy: Policy, rate_rps: f64) -> RunResult {
    let mut o = RunOptions::from_workload(w);
    o.policy = policy;
    o.rate_rps = rate_rps;
    o.check = true;
    simulate(w, &o)
}

/// Median time from arrival to batch start, in milliseconds.
fn queuing_p50_ms(r: &RunResult) -> f64 {
    r.models[0].queuing_us.value_at_quantile(0.5) as f64 / 1000.0
}

/// ResNet50's Table 2 profile on 8 GPUs (goodput about 5,450 r/s).
fn resnet() -> Workload {
    workload(8, 1.053, 5.072, 25.0)
}

#[test]
fn a_lone_request_at_light_load_starts_at_once() {
    // A model whose batches barely amortise (4 us alone, 0.5 us per extra request;
    // the ONNX mlp's profile on a CPU) at 200 r/s with a 20 ms SLO: about 4 more
    // requests are expected before the frontrun moment, so the old "expected gain"
    // rule would wait, but the GPU time they would save is nothing.
    let w = workload(1, 0.0005, 0.0038, 20.0);
    let deferred = run(&w, Policy::Deferred, 200.0);
    let symphony = run(&w, Policy::Symphony, 200.0);
    assert_eq!(deferred.models[0].bad(), 0);
    assert!(
        queuing_p50_ms(&deferred) < 0.05,
        "deferred held a lone request {} ms at light load",
        queuing_p50_ms(&deferred)
    );
    // The paper's rule holds it until the frontrun moment, near its deadline.
    assert!(
        queuing_p50_ms(&symphony) > 5.0,
        "symphony's frontrun moved: {} ms",
        queuing_p50_ms(&symphony)
    );
    // ResNet50 at 20 r/s: lone requests, no batching to wait for.
    let w = resnet();
    let r = run(&w, Policy::Deferred, 20.0);
    assert!(queuing_p50_ms(&r) < 0.05, "{} ms", queuing_p50_ms(&r));
    assert_eq!(r.models[0].bad(), 0);
}

#[test]
fn under_load_batches_are_still_deferred() {
    // ResNet50 at 0.8 of its goodput: batching matters for capacity, so deferred
    // waits for the frontrun moment as the paper's rule does.
    let w = resnet();
    let rate = 0.8 * 5450.0;
    let deferred = run(&w, Policy::Deferred, rate);
    let symphony = run(&w, Policy::Symphony, rate);
    let eager = run(&w, Policy::Eager, rate);
    let (d, s) = (queuing_p50_ms(&deferred), queuing_p50_ms(&symphony));
    let (bd, bs, be) = (
        batch_p50(&deferred),
        batch_p50(&symphony),
        batch_p50(&eager),
    );
    eprintln!("queuing p50 deferred {d} symphony {s} ms; batch p50 {bd} {bs} {be}");
    assert!(
        (d - s).abs() < 0.2 * s,
        "deferred ({d} ms) and symphony ({s} ms) differ under load"
    );
    assert!(
        bd + 1 >= bs && bd > be,
        "batch p50: deferred {bd}, symphony {bs}, eager {be}"
    );
    assert!(deferred.bad_rate() < 0.01, "bad {}", deferred.bad_rate());
}

#[test]
fn idle_time_still_collects_on_the_highest_numbered_gpus() {
    // At 0.3 of the goodput the GPUs are about 70% idle, and the upper half of the
    // GPU ids is (nearly) all idle: eager starts at light load take the
    // lowest-numbered free GPU, deferred batches fill the lower GPUs first.
    let w = resnet();
    let r = run(&w, Policy::Deferred, 0.3 * 5450.0);
    let idle: Vec<f64> = r.gpu_busy.iter().map(|b| 1.0 - b).collect();
    let mean = idle.iter().sum::<f64>() / idle.len() as f64;
    assert!((0.62..=0.75).contains(&mean), "mean idle {mean}: {idle:?}");
    for (g, i) in idle.iter().enumerate().skip(4) {
        assert!(*i > 0.97, "GPU {g} is busy at 0.3 load: {idle:?}");
    }
    // At 0.05 of the goodput (eager starts), the same shape.
    let r = run(&w, Policy::Deferred, 0.05 * 5450.0);
    let idle: Vec<f64> = r.gpu_busy.iter().map(|b| 1.0 - b).collect();
    for (g, i) in idle.iter().enumerate().skip(3) {
        assert!(*i > 0.99, "GPU {g} is busy at 0.05 load: {idle:?}");
    }
}

#[test]
fn deferred_stays_close_to_eager_on_bursty_arrivals() {
    // Near both policies' goodput (eager's is about 5,370 r/s on the full workload;
    // deferred's was about 4,600 before it counted clumps).
    let w = bursty();
    for rate in [4800.0, 5200.0] {
        let deferred = run(&w, Policy::Deferred, rate);
        let eager = run(&w, Policy::Eager, rate);
        let (d, e) = (deferred.bad_rate(), eager.bad_rate());
        eprintln!("rate {rate}: bad deferred {d:.4}, eager {e:.4}");
        assert!(
            d <= e + 0.005,
            "rate {rate}: deferred's bad rate {d} more than 0.5 points above eager's {e}"
        );
    }
}

/// Twelve ResNet50 models on 16 GPUs, Zipf 0.7 popularity, Poisson, SLO 50 ms
/// (configs/workloads/resnet_x12_16gpu_zipf07_poisson.toml, shorter).
fn zipf() -> Workload {
    let mut w = Workload::from_file(std::path::Path::new(
        "configs/workloads/resnet_x12_16gpu_zipf07_poisson.toml",
    ))
    .expect("the shipped workload");
    w.warmup = fermata::core::Dur::from_ms(2_000);
    w.duration = fermata::core::Dur::from_ms(8_000);
    w
}

#[test]
fn many_models_near_capacity_keep_up_with_eager_spread_their_losses_and_keep_batching_below_it() {
    let w = zipf();
    let busy = |r: &RunResult| r.gpu_busy.iter().sum::<f64>() / r.gpu_busy.len() as f64;
    // Near both policies' goodput (about 12,200 r/s): the batches that miss
    // their frontrun moment would leave deferred about 0.4 points behind.
    let (deferred, eager) = (
        run(&w, Policy::Deferred, 12_100.0),
        run(&w, Policy::Eager, 12_100.0),
    );
    let (d, e) = (deferred.bad_rate(), eager.bad_rate());
    eprintln!(
        "12,100 r/s: bad deferred {d:.5}, eager {e:.5}; busy {:.4} {:.4}",
        busy(&deferred),
        busy(&eager)
    );
    assert!(
        d <= e + 0.001,
        "deferred's bad rate {d} against eager's {e}"
    );
    // A little past it, deferred ranks the models that near 1% lost ahead
    // (`LOSS_RANK_PER_PERCENT`), so its losses are spread over the models
    // rather than left on the middle of the Zipf, and its worst model is
    // below eager's (1.14% against 1.41%; ranked by latest start alone,
    // 1.64%).
    let (deferred, eager) = (
        run(&w, Policy::Deferred, 12_300.0),
        run(&w, Policy::Eager, 12_300.0),
    );
    let (dw, ew) = (deferred.max_model_bad_rate(), eager.max_model_bad_rate());
    eprintln!("12,300 r/s: worst model deferred {dw:.5}, eager {ew:.5}");
    assert!(dw < ew, "deferred's worst model {dw} against eager's {ew}");
    // At a quarter of it nothing expires: deferred batches and leaves GPUs
    // idle where eager runs lone requests on every GPU.
    let (deferred, eager) = (
        run(&w, Policy::Deferred, 3_000.0),
        run(&w, Policy::Eager, 3_000.0),
    );
    let (bd, be) = (busy(&deferred), busy(&eager));
    eprintln!("3,000 r/s: busy deferred {bd:.4}, eager {be:.4}");
    assert!(bd < 0.5 && be > 0.8, "busy deferred {bd}, eager {be}");
    assert_eq!(deferred.bad_rate(), 0.0);
}

/// ResNet-50 on one H100 (configs/workloads/resnet50_h100_1gpu.toml): one
/// model on one GPU, whose batches of 64 carry about 4,076 r/s.
fn lone_gpu() -> Workload {
    Workload::from_file(std::path::Path::new(
        "configs/workloads/resnet50_h100_1gpu.toml",
    ))
    .expect("the shipped workload")
}

/// Median batch size over a run's requests.
fn batch_p50(r: &RunResult) -> usize {
    let m = &r.models[0];
    let total: u64 = m.batch_requests.iter().sum();
    let mut seen = 0;
    m.batch_requests
        .iter()
        .position(|&n| {
            seen += n;
            2 * seen >= total
        })
        .unwrap_or(0)
}

#[test]
fn a_lone_gpu_past_capacity_does_not_wait_and_below_it_still_batches() {
    let w = lone_gpu();
    // Past capacity (both policies' goodput is about 4,100 r/s): a wait only
    // idles the one GPU (deferred idled it 0.2% of the time and dropped 1.10%
    // against eager's 1.06% when it waited there).
    let (deferred, eager) = (
        run(&w, Policy::Deferred, 4094.1),
        run(&w, Policy::Eager, 4094.1),
    );
    let (d, e) = (deferred.bad_rate(), eager.bad_rate());
    let (bd, be) = (deferred.gpu_busy[0], eager.gpu_busy[0]);
    eprintln!("4,094 r/s: bad deferred {d:.5}, eager {e:.5}; busy {bd:.5} {be:.5}");
    assert!(d <= e, "deferred's bad rate {d} against eager's {e}");
    assert!(bd >= be - 0.0005, "busy deferred {bd}, eager {be}");
    // At a fifth of it the GPU has time to spare: deferred keeps its large
    // batches and its idle time where eager runs batches of one or two.
    let (deferred, eager) = (
        run(&w, Policy::Deferred, 800.0),
        run(&w, Policy::Eager, 800.0),
    );
    let (pd, pe) = (batch_p50(&deferred), batch_p50(&eager));
    eprintln!(
        "800 r/s: batch p50 deferred {pd}, eager {pe}; busy {:.3} {:.3}",
        deferred.gpu_busy[0], eager.gpu_busy[0]
    );
    assert!(pd >= 20 && pe <= 3, "batch p50 deferred {pd}, eager {pe}");
    assert!(deferred.gpu_busy[0] < 0.3, "busy {}", deferred.gpu_busy[0]);
    assert_eq!(deferred.bad_rate(), 0.0);
}
