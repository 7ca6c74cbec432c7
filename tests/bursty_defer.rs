//! Deferred under bursty arrivals (issue 13): with requests arriving in clumps
//! (Gamma-distributed gaps of shape 0.05, about 20 requests a clump), deferred
//! counts the clumps it expects before its frontrun moment rather than the
//! requests, so it no longer holds batches for growth that mostly does not come
//! while the GPUs sit idle between bursts. Near capacity on a small bursty
//! multi-model workload it stays within half a point of eager's bad rate (it was
//! about 1.1 points above it at 5,000 r/s before it counted clumps; closing the
//! rest of the gap is still open, see issue 13).

use fermata::core::Policy;
use fermata::run::RunResult;
use fermata::sim::{simulate, RunOptions};
use fermata::workload::Workload;

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
