//! Symphony Table 2: the analytic batch sizes and throughputs of staggered execution
//! versus execution without coordination, and simulations that reach them.
//!
//! Staggered: b = floor((SLO / (1 + 1/N) - beta) / alpha), i.e. (1 + 1/N) l(b) <= SLO.
//! No coordination: b = floor((SLO / 2 - beta) / alpha), i.e. 2 l(b) <= SLO.
//! Throughput of N GPUs at batch b: N * b / l(b).

use fermata::core::{Dur, LatencyProfile, Policy};
use fermata::sim::{simulate, RunOptions, RunResult};
use fermata::workload::{Arrival, Workload};
use std::path::PathBuf;

struct Row {
    name: &'static str,
    alpha_ms: f64,
    beta_ms: f64,
    slo_ms: f64,
    gpus: u32,
    no_coord_bs: u32,
    no_coord_tpt: f64,
    staggered_bs: u32,
    staggered_tpt: f64,
}

const TABLE2: [Row; 2] = [
    Row {
        name: "ResNet50",
        alpha_ms: 1.053,
        beta_ms: 5.072,
        slo_ms: 25.0,
        gpus: 8,
        no_coord_bs: 7,
        no_coord_tpt: 4501.0,
        staggered_bs: 16,
        staggered_tpt: 5839.0,
    },
    Row {
        name: "InceptionResNetV2",
        alpha_ms: 5.090,
        beta_ms: 18.368,
        slo_ms: 70.0,
        gpus: 8,
        no_coord_bs: 3,
        no_coord_tpt: 713.0,
        staggered_bs: 8,
        staggered_tpt: 1083.0,
    },
];

/// (staggered batch, its throughput, no-coordination batch, its throughput).
fn analytic(r: &Row) -> (u32, f64, u32, f64) {
    let prof = LatencyProfile::linear_ms(r.alpha_ms, r.beta_ms, 1024).expect("valid profile");
    let n = r.gpus as f64;
    let stag_budget = Dur::from_ms_f64(r.slo_ms / (1.0 + 1.0 / n));
    let nc_budget = Dur::from_ms_f64(r.slo_ms / 2.0);
    let bs = prof.max_batch_within(stag_budget, Dur::ZERO, 1024);
    let bn = prof.max_batch_within(nc_budget, Dur::ZERO, 1024);
    // The defining inequalities, and maximality.
    assert!(prof.latency(bs) <= stag_budget && prof.latency(bs + 1) > stag_budget);
    assert!(prof.latency(bn) <= nc_budget && prof.latency(bn + 1) > nc_budget);
    (
        bs,
        n * prof.throughput_rps(bs),
        bn,
        n * prof.throughput_rps(bn),
    )
}

#[test]
fn table2_analytic_batch_sizes_and_throughputs() {
    for r in &TABLE2 {
        let (bs, ts, bn, tn) = analytic(r);
        // The closed forms of the paper, computed independently of the profile code.
        let n = r.gpus as f64;
        let closed_s = ((r.slo_ms / (1.0 + 1.0 / n) - r.beta_ms) / r.alpha_ms).floor() as u32;
        let closed_n = ((r.slo_ms / 2.0 - r.beta_ms) / r.alpha_ms).floor() as u32;
        assert_eq!((bs, bn), (closed_s, closed_n), "{}", r.name);
        assert_eq!(bs, r.staggered_bs, "{} staggered batch", r.name);
        assert_eq!(bn, r.no_coord_bs, "{} no-coordination batch", r.name);
        assert!(
            (ts - r.staggered_tpt).abs() <= 1.0,
            "{} staggered throughput {ts}",
            r.name
        );
        assert!(
            (tn - r.no_coord_tpt).abs() <= 1.0,
            "{} no-coordination throughput {tn}",
            r.name
        );
        // Staggering runs about twice the batch and 30-50% more throughput.
        assert!(bs >= 2 * bn);
        assert!(
            ts / tn > 1.25 && ts / tn < 1.55,
            "{} ratio {}",
            r.name,
            ts / tn
        );
    }
}

fn workload(file: &str) -> Workload {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "configs", "workloads", file]
        .iter()
        .collect();
    Workload::from_file(&path).expect("shipped workload parses")
}

fn run(w: &Workload, policy: Policy, rate_rps: f64) -> RunResult {
    let mut o = RunOptions::from_workload(w);
    o.policy = policy;
    o.arrival = Arrival::Constant;
    o.rate_rps = rate_rps;
    o.warmup = Dur::from_secs_f64(2.0);
    o.duration = Dur::from_secs_f64(20.0);
    let r = simulate(w, &o);
    eprint!(
        "{} {policy} @ {rate_rps:.0} r/s\n{}",
        w.name,
        fermata::bench::sim_table(&r)
    );
    r
}

/// Deferred scheduling at 97% of the staggered bound, with constant gaps (the analysis'
/// assumption), meets the SLO and runs the staggered batch size.
fn check_deferred(file: &str, row: &Row) {
    let w = workload(file);
    assert_eq!(w.gpus, row.gpus);
    assert_eq!(w.models.len(), 1);
    let (bs, tpt, _, _) = analytic(row);
    let r = run(&w, Policy::Deferred, 0.97 * tpt);
    let m = &r.models[0];
    // 0.97 * bound over 20 s.
    let expect = 0.97 * tpt * 20.0;
    assert!(
        (m.offered as f64 - expect).abs() < 0.01 * expect,
        "offered {}",
        m.offered
    );
    assert!(m.bad_rate() <= 0.01, "bad rate {}", m.bad_rate());
    assert_eq!(m.batch_quantile(0.5), bs, "{:?}", m.batch_requests);
}

#[test]
fn deferred_reaches_staggered_batch_resnet50() {
    check_deferred("resnet50_8gpu.toml", &TABLE2[0]);
}

#[test]
fn deferred_reaches_staggered_batch_irv2() {
    check_deferred("irv2_8gpu.toml", &TABLE2[1]);
}

/// Nexus' rule 2 l(b) <= SLO caps its batches at the no-coordination size: at a
/// moderate rate it meets the SLO with batches of at most 7; above the
/// no-coordination bound (4501 r/s) it must drop, while deferred scheduling still
/// meets the SLO at that rate with the staggered batch.
#[test]
fn nexus_runs_no_coordination_batches_resnet50() {
    let w = workload("resnet50_8gpu.toml");
    let (bs, _, bn, tn) = analytic(&TABLE2[0]);
    assert_eq!(bn, 7);
    let r = run(&w, Policy::Nexus, 0.9 * tn);
    let m = &r.models[0];
    assert!(m.offered > 0);
    assert!(m.bad_rate() <= 0.01, "nexus bad rate {}", m.bad_rate());
    let p50 = m.batch_quantile(0.5);
    assert!(p50 >= 1 && p50 <= bn, "nexus p50 batch {p50}");
    assert!(
        m.batch_requests.len() <= bn as usize + 1,
        "nexus ran a batch above {bn}: {:?}",
        m.batch_requests
    );

    // Overload for Nexus, not for deferred scheduling.
    let over = 1.2 * tn;
    let r = run(&w, Policy::Nexus, over);
    let m = &r.models[0];
    assert!(m.batch_quantile(0.5) <= bn, "{:?}", m.batch_requests);
    assert!(m.batch_requests.len() <= bn as usize + 1);
    assert!(m.bad_rate() > 0.05, "nexus bad rate {}", m.bad_rate());
    let r = run(&w, Policy::Deferred, over);
    let m = &r.models[0];
    assert!(m.bad_rate() <= 0.01, "deferred bad rate {}", m.bad_rate());
    assert!(m.batch_quantile(0.5) > bn && m.batch_quantile(0.5) <= bs);
}

/// `fermata bench oracle` from the command line: on Table 2's ResNet50 near the
/// staggered bound, the offline reference (which sees every arrival first) drops
/// no more than deferred on the same arrivals, runs batches no larger than the
/// SLO allows (18) and keeps the GPUs busier; it takes a workload of several
/// models, and refuses one past its beam searches' limits with a message that
/// says why, unless asked for its seeded search alone.
#[test]
fn the_offline_reference_from_the_command_line() {
    let path = |f: &str| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("configs/workloads")
            .join(f)
            .display()
            .to_string()
    };
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fermata"))
            .args(["bench", "oracle"])
            .args(args)
            .output()
            .expect("runs")
    };
    // A run that succeeded, its JSON.
    let json = |out: &std::process::Output| -> serde_json::Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let w = path("resnet50_8gpu.toml");
    let out = run(&[
        "--workload",
        &w,
        "--rate",
        "5700",
        "--warmup-s",
        "1",
        "--duration-s",
        "3",
        "--beam",
        "16",
        "--json",
    ]);
    let v = json(&out);
    let (o, p) = (&v["oracle"], &v["policy"]);
    assert_eq!(o["policy"], "oracle");
    assert_eq!(p["policy"], "deferred");
    assert_eq!(o["offered"], p["offered"], "the same arrivals");
    let bad = |x: &serde_json::Value| x["bad_rate"].as_f64().expect("bad_rate");
    assert!(bad(p) > 0.0, "deferred drops some this close to the bound");
    assert!(bad(o) <= bad(p), "oracle {} deferred {}", bad(o), bad(p));
    let sizes = o["per_model"][0]["batch_size_requests"]
        .as_array()
        .expect("sizes");
    assert!(sizes.len() <= 19, "a batch above 18: {sizes:?}");
    let busy = |x: &serde_json::Value| x["gpu_busy_fraction"].as_f64().expect("busy");
    assert!(
        busy(o) > busy(p),
        "oracle busy {} deferred {}",
        busy(o),
        busy(p)
    );

    // Several models share the GPUs: five, bursty, on the same arrivals.
    let out = run(&[
        "--workload",
        &path("resnet_x5_8gpu_bursty.toml"),
        "--warmup-s",
        "1",
        "--duration-s",
        "2",
        "--beam",
        "8",
        "--json",
    ]);
    let v = json(&out);
    let (o, p) = (&v["oracle"], &v["policy"]);
    assert_eq!(o["offered"], p["offered"], "the same arrivals");
    assert_eq!(o["per_model"].as_array().expect("models").len(), 5);

    let out = run(&[
        "--workload",
        &path("a100_mixed_64gpu.toml"),
        "--duration-s",
        "1",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1 to 16 models") && err.contains("has 37"),
        "{err}"
    );
    // The seeded search alone takes it: every model no worse than deferred's
    // worst, on the same arrivals.
    let v = json(&run(&[
        "--workload",
        &path("a100_mixed_64gpu.toml"),
        "--warmup-s",
        "0.5",
        "--duration-s",
        "0.5",
        "--seeded-only",
        "--json",
    ]));
    let (o, p) = (&v["oracle"], &v["policy"]);
    assert_eq!(o["offered"], p["offered"], "the same arrivals");
    assert_eq!(o["per_model"].as_array().expect("models").len(), 37);
    let worst = |x: &serde_json::Value| x["max_model_bad_rate"].as_f64().expect("worst");
    assert!(
        worst(o) <= worst(p),
        "oracle {} deferred {}",
        worst(o),
        worst(p)
    );
    let search = o["search"].as_str().expect("search");
    assert!(search.ends_with("schedule improved"), "{search}");
}
