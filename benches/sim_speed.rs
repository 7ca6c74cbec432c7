//! Simulator speed: how many requests per wall-clock second the discrete-event
//! simulator pushes through the production scheduling core.
//!
//! `cargo bench --bench sim_speed` runs the full measurement (release-like `bench`
//! profile): ResNet50 on 8 GPUs (configs/workloads/resnet50_8gpu.toml), deferred
//! scheduling at 5400 r/s, Poisson arrivals, 5 s warm-up and a 60 s measured window,
//! 5 repetitions with the per-event invariant checks on and 5 with them off, then one
//! full goodput search with the default search options.
//!
//! Under `cargo test --all-targets` cargo runs this binary without `--bench`; it then
//! does a seconds-long smoke run (tiny window, one repetition) so the test suite stays
//! fast while the bench keeps compiling and running.

use fermata::bench::{goodput_search, SearchOptions};
use fermata::core::{Dur, Policy};
use fermata::sim::{simulate, RunOptions};
use fermata::workload::{Arrival, Workload};
use std::path::Path;
use std::time::Instant;

// The same allocator as the `fermata` binary, so the numbers match the CLI's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WORKLOAD: &str = "configs/workloads/resnet50_8gpu.toml";
const RATE_RPS: f64 = 5400.0;

struct Settings {
    reps: usize,
    warmup_s: f64,
    duration_s: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "median of no samples");
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn sim_speed(w: &Workload, s: &Settings, check: bool) -> f64 {
    let mut o = RunOptions::from_workload(w);
    o.policy = Policy::Deferred;
    o.rate_rps = RATE_RPS;
    o.arrival = Arrival::Poisson;
    o.warmup = Dur::from_secs_f64(s.warmup_s);
    o.duration = Dur::from_secs_f64(s.duration_s);
    o.check = check;
    let samples: Vec<f64> = (0..s.reps)
        .map(|_| {
            let r = simulate(w, &o);
            assert!(r.sim_requests > 0, "the run simulated no requests");
            r.sim_requests_per_sec()
        })
        .collect();
    median(samples)
}

fn main() {
    // `cargo bench` passes `--bench` to every bench binary, custom harness or not.
    let full = std::env::args().skip(1).any(|a| a == "--bench");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(WORKLOAD);
    let w = Workload::from_file(&path).unwrap_or_else(|e| panic!("{e:#}"));
    let s = if full {
        Settings {
            reps: 5,
            warmup_s: 5.0,
            duration_s: 60.0,
        }
    } else {
        Settings {
            reps: 1,
            warmup_s: 0.5,
            duration_s: 1.0,
        }
    };
    let mode = if full { "bench" } else { "smoke (no --bench)" };
    println!(
        "sim_speed [{mode}]: {} | deferred | {RATE_RPS} r/s poisson | warm-up {} s, window {} s | median of {}",
        w.name, s.warmup_s, s.duration_s, s.reps
    );
    let on = sim_speed(&w, &s, true);
    println!("sim_requests_per_sec (checks on): {on:.2e}");
    let off = sim_speed(&w, &s, false);
    println!("sim_requests_per_sec (checks off): {off:.2e}");

    // One full goodput search as the CLI runs it (`fermata bench goodput`): the
    // workload's own options, deferred policy, default search settings.
    let mut o = RunOptions::from_workload(&w);
    o.policy = Policy::Deferred;
    if !full {
        o.warmup = Dur::from_secs_f64(s.warmup_s);
        o.duration = Dur::from_secs_f64(s.duration_s);
    }
    let t = Instant::now();
    let g = goodput_search(&w, &o, &SearchOptions::default());
    let wall = t.elapsed().as_secs_f64();
    assert!(g.goodput_rps > 0.0, "goodput search found no passing rate");
    println!(
        "goodput_search_wall_s (deferred, {} trials, goodput {:.1} r/s): {wall:.3}",
        g.trials.len(),
        g.goodput_rps
    );
    println!(
        "goodput_search_sim_requests_per_sec: {:.2e}",
        g.sim_requests_per_sec()
    );
}
