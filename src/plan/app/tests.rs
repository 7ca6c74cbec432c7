//! The test vectors of PLANNERS.md, bad application files, and the property test
//! over random small instances.

use super::module::{self, Budget, Configs, Dummies};
use super::planners::{self, HarpagonOptions};
use super::{file, worst_case, Alloc, App, Config, Dispatch, Edge, Hardware, HwKind, Module};

// ------------------------------------------------ Nexus §4.1, Table 2

#[test]
fn nexus_table2_packs_three_sessions_on_two_gpus() {
    use super::nexus::{squishy_pack, Session};
    let prof = |l: [f64; 3]| vec![(4.0, l[0] / 1e3), (8.0, l[1] / 1e3), (16.0, l[2] / 1e3)];
    let sessions = vec![
        Session {
            profile: prof([50.0, 75.0, 100.0]),
            slo: 0.200,
            rate: 64.0,
        },
        Session {
            profile: prof([50.0, 90.0, 125.0]),
            slo: 0.250,
            rate: 32.0,
        },
        Session {
            profile: prof([60.0, 95.0, 125.0]),
            slo: 0.250,
            rate: 32.0,
        },
    ];
    let gpus = squishy_pack(&sessions).unwrap();
    assert_eq!(gpus.len(), 2, "{gpus:?}");
    let mut sets: Vec<Vec<usize>> = gpus
        .iter()
        .map(|g| {
            let mut s: Vec<usize> = g.sessions.iter().map(|x| x.0).collect();
            s.sort();
            s
        })
        .collect();
    sets.sort();
    assert_eq!(sets, vec![vec![0, 1], vec![2]]);
    // {A, B}: batches 8 and 4 in a duty cycle of 125 ms, 75 + 50 ms busy.
    let ab = gpus.iter().find(|g| g.sessions.len() == 2).unwrap();
    assert!(close(ab.duty, 0.125, 1e-12) && close(ab.occupancy, 1.0, 1e-9));
    // At high rates each session saturates GPUs at its largest batch with
    // 2 l(b) <= SLO: A at 16 (160 req/s), B and C at 16 (128 req/s).
    let high: Vec<Session> = sessions
        .iter()
        .zip([160.0, 128.0, 128.0])
        .map(|(s, r)| Session {
            rate: 2.0 * r,
            ..s.clone()
        })
        .collect();
    let g = squishy_pack(&high).unwrap();
    assert_eq!(g.len(), 6);
    assert!(g.iter().all(|g| g.saturated && g.sessions[0].1 == 16.0));
}

#[test]
fn prefix_batching_latency_is_prefix_of_the_sum_plus_suffixes() {
    use super::nexus::prefix_latency;
    // Prefix 10 ms + 1 ms/item; suffixes 2 ms + 0.5 ms/item and 3 ms + 0.25 ms/item.
    let lin = |a: f64, b: f64| vec![(1.0, (a + b) / 1e3), (64.0, (64.0 * a + b) / 1e3)];
    let p = lin(1.0, 10.0);
    let s1 = lin(0.5, 2.0);
    let s2 = lin(0.25, 3.0);
    let l = prefix_latency(&p, &[(&s1, 8.0), (&s2, 4.0)]);
    let want = (12.0 + 10.0) + (4.0 + 2.0) + (1.0 + 3.0);
    assert!(close(l * 1e3, want, 1e-9), "{l}");
}

const PREFIXED: &str = r#"
slo_ms = 400
ingress_rps = 40
[[hardware]]
name = "a100"
kind = "gpu"
price = 1.0
[[prefixes]]
name = "trunk"
[[prefixes.profiles]]
hardware = "a100"
alpha_ms = 0.15
beta_ms = 3.5
max_batch = 64
[[modules]]
name = "ssd"
[[modules.profiles]]
hardware = "a100"
alpha_ms = 1.4
beta_ms = 7.5
max_batch = 32
[[modules]]
name = "face"
prefix = "trunk"
[[modules.profiles]]
hardware = "a100"
alpha_ms = 0.2
beta_ms = 4.5
max_batch = 64
[[modules]]
name = "car"
prefix = "trunk"
[[modules.profiles]]
hardware = "a100"
alpha_ms = 0.5
beta_ms = 5.3
max_batch = 64
[[edges]]
from = "ssd"
to = "face"
fanout = 0.5
[[edges]]
from = "ssd"
to = "car"
fanout = 1.0
"#;

#[test]
fn nexus_prefix_batching_merges_modules_that_share_a_prefix() {
    let app = file::parse(PREFIXED).unwrap();
    let merged = planners::nexus(&app).unwrap();
    merged.verify(&app).unwrap();
    let face = merged.modules.iter().find(|m| m.name == "face").unwrap();
    let car = merged.modules.iter().find(|m| m.name == "car").unwrap();
    assert_eq!(car.served_by.as_deref(), Some("face"));
    assert!(car.allocs.is_empty() && !face.allocs.is_empty());
    // The same application without the prefix declared costs more.
    let plain = file::parse(&PREFIXED.replace("prefix = \"trunk\"\n", "")).unwrap();
    let apart = planners::nexus(&plain).unwrap();
    assert!(apart.modules.iter().all(|m| m.served_by.is_none()));
    assert!(
        merged.cost < apart.cost * (1.0 - 1e-6),
        "merged {} apart {}",
        merged.cost,
        apart.cost
    );
    // fermata runs nexus where a prefix is declared: never above it.
    let fe = planners::fermata(&app).unwrap();
    fe.verify(&app).unwrap();
    assert!(fe.cost <= merged.cost * (1.0 + 1e-9));
    // A plan that claims a module is served by one without its prefix fails.
    let mut bad = merged.clone();
    let ssd = bad.modules.iter().position(|m| m.name == "ssd").unwrap();
    bad.modules[ssd].served_by = Some("face".into());
    bad.modules[ssd].allocs.clear();
    assert!(bad.verify(&app).is_err());
    // An undeclared prefix is refused.
    let e = file::parse(&PREFIXED.replace("name = \"trunk\"", "name = \"other\"")).unwrap_err();
    assert!(e.contains("prefix \"trunk\" is not declared"), "{e}");
}

fn cfg(hw: usize, b: u32, d: f64) -> Config {
    Config::new(hw, b, 1, d)
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

fn cost(a: &[Alloc]) -> f64 {
    super::alloc_cost(a, &[1.0])
}

// ------------------------------------------------ Piccolo §II, M1

fn m1() -> Vec<Config> {
    module::sorted(
        &[cfg(0, 5, 0.1), cfg(0, 20, 0.25), cfg(0, 100, 1.0)],
        &[1.0],
    )
}

#[test]
fn piccolo_m1_round_robin_two_tuple_is_3_7() {
    let a = module::algorithm1(
        &m1(),
        &[1.0],
        285.0,
        2.0,
        Configs::Two,
        Dispatch::RoundRobin,
    )
    .unwrap();
    assert!(close(cost(&a), 3.7, 1e-9), "{a:?}");
}

#[test]
fn piccolo_m1_algorithm1_tc_is_3_1() {
    let a = module::algorithm1(
        &m1(),
        &[1.0],
        285.0,
        2.0,
        Configs::Any,
        Dispatch::ThroughputCost,
    )
    .unwrap();
    assert!(close(cost(&a), 3.1, 1e-9), "{a:?}");
    assert!(worst_case(&a, Dispatch::ThroughputCost, &[1.0]) <= 2.0 + 1e-9);
}

#[test]
fn piccolo_m1_dummy_of_15_gives_3_0() {
    let s = module::plan_module(
        &m1(),
        &[1.0],
        285.0,
        2.0,
        Configs::Any,
        Dispatch::ThroughputCost,
        Dummies::Piccolo,
    )
    .unwrap();
    assert!(close(s.cost, 3.0, 1e-9), "{s:?}");
    assert!(close(s.dummy, 15.0, 1e-9), "{s:?}");
}

/// Piccolo's dummy `b / (L - d) - u` past a full machine adds a machine and
/// leaves the same leftover; capped at `t - u` the leftover's machine runs full
/// and meets the budget with its configuration's batches.
#[test]
fn piccolo_dummy_is_at_most_a_full_machine() {
    // b 4, d 0.1, t 40; r 110: two full machines, leftover 30 at 0.1 + 4/30 s.
    // L = 0.1 + 4/60: b / (L - d) = 60 > t, so the uncapped dummy (30) leaves a
    // leftover of 20 again; the capped one (10) gives three full machines.
    let c = module::sorted(&[cfg(0, 4, 0.1)], &[1.0]);
    let l = 0.1 + 4.0 / 60.0;
    let s = module::plan_module(
        &c,
        &[1.0],
        110.0,
        l,
        Configs::Any,
        Dispatch::ThroughputCost,
        Dummies::Piccolo,
    )
    .expect("the capped dummy makes the leftover's machine full");
    assert!(close(s.cost, 3.0, 1e-9), "{s:?}");
    assert!(close(s.dummy, 10.0, 1e-9), "{s:?}");
    assert!(worst_case(&s.allocs, Dispatch::ThroughputCost, &[1.0]) <= l * (1.0 + 1e-9));
    // Without dummies there is no plan: the leftover misses the budget.
    assert!(module::plan_module(
        &c,
        &[1.0],
        110.0,
        l,
        Configs::Any,
        Dispatch::ThroughputCost,
        Dummies::None
    )
    .is_none());
}

/// The dummy puts the leftover on one more machine of its own configuration
/// (Theorem 2). Running Algorithm 1 again at the padded rate instead can pick a
/// configuration of higher `t/p` that meets the budget only at the padded rate
/// and then strand a residual again.
#[test]
fn harpagon_dummy_fills_its_own_configuration() {
    let p = [1.0, 0.35];
    // A100 b1 (t 183.8) and 1080Ti b1 (t 134.6, t/p 384.6 first).
    let cfgs = module::sorted(&[cfg(0, 1, 0.00544), cfg(1, 1, 0.00743)], &p);
    let r = 185.69;
    let l = 0.00544 + 1.0 / r;
    assert!(module::algorithm1(&cfgs, &p, r, l, Configs::Any, Dispatch::ThroughputCost).is_none());
    let s = module::plan_module(
        &cfgs,
        &p,
        r,
        l,
        Configs::Any,
        Dispatch::ThroughputCost,
        Dummies::Harpagon,
    )
    .expect("two full A100 machines meet the budget");
    assert!(close(s.cost, 2.0, 1e-9), "{s:?}");
    assert_eq!(s.allocs.len(), 1);
    assert_eq!(s.allocs[0].config.hw, 0);
    assert!(worst_case(&s.allocs, Dispatch::ThroughputCost, &p) <= l * (1.0 + 1e-9));
}

#[test]
fn failure_causes_tell_a_short_budget_from_a_residual() {
    let tc = Dispatch::ThroughputCost;
    // M1 at 285 req/s: six full b5 machines reach 0.1 + 5/300 s.
    assert_eq!(module::failure_cause(&m1(), 285.0, 0.15, tc), "residual");
    assert_eq!(module::failure_cause(&m1(), 285.0, 0.11, tc), "budget");
    // Per machine (round robin) a full b5 machine takes 2d = 0.2 s.
    assert_eq!(
        module::failure_cause(&m1(), 285.0, 0.15, Dispatch::RoundRobin),
        "budget"
    );
    assert_eq!(
        module::failure_cause(&m1(), 285.0, 0.2, Dispatch::RoundRobin),
        "residual"
    );
}

#[test]
fn piccolo_m1_latency_cost_efficiencies() {
    let (b5, b20, b100) = (cfg(0, 5, 0.1), cfg(0, 20, 0.25), cfg(0, 100, 1.0));
    let tc = Dispatch::ThroughputCost;
    assert!(close(
        planners::lc(&b5, &b20, 100.0, &[1.0], tc),
        2.50,
        1e-9
    ));
    assert!(close(
        planners::lc(&b5, &b100, 100.0, &[1.0], tc),
        0.54,
        0.005
    ));
}

// ------------------------------------------------ Piccolo/Harpagon TC example

#[test]
fn tc_example_worst_case_is_2_75() {
    let ab = Alloc {
        config: cfg(0, 6, 2.0),
        count: 2.0,
    };
    let c = Alloc {
        config: cfg(0, 2, 1.0),
        count: 1.0,
    };
    let w = worst_case(&[ab, c], Dispatch::ThroughputCost, &[1.0]);
    assert!(close(w, 2.75, 1e-12), "{w}");
}

// ------------------------------------------------ Harpagon §II, M1 and Table II, M3

fn h_m1() -> Vec<Config> {
    module::sorted(&[cfg(0, 2, 0.16), cfg(0, 4, 0.2), cfg(0, 8, 0.32)], &[1.0])
}

#[test]
fn harpagon_m1_round_robin_5_tc_4() {
    let rr = module::algorithm1(
        &h_m1(),
        &[1.0],
        100.0,
        0.4,
        Configs::Any,
        Dispatch::RoundRobin,
    )
    .unwrap();
    assert!(close(cost(&rr), 5.0, 1e-9), "{rr:?}");
    let tc = module::algorithm1(
        &h_m1(),
        &[1.0],
        100.0,
        0.4,
        Configs::Any,
        Dispatch::ThroughputCost,
    )
    .unwrap();
    assert!(close(cost(&tc), 4.0, 1e-9), "{tc:?}");
}

#[test]
fn harpagon_m1_latency_cost_efficiencies() {
    let (b2, b4, b8) = (cfg(0, 2, 0.16), cfg(0, 4, 0.2), cfg(0, 8, 0.32));
    let tc = Dispatch::ThroughputCost;
    assert!(close(planners::lc(&b2, &b4, 100.0, &[1.0], tc), 50.0, 1e-9));
    assert!(close(planners::lc(&b2, &b8, 100.0, &[1.0], tc), 18.2, 0.05));
}

fn h_m3() -> Vec<Config> {
    module::sorted(&[cfg(0, 2, 0.1), cfg(0, 8, 0.25), cfg(0, 32, 0.8)], &[1.0])
}

#[test]
fn harpagon_table2_m3() {
    let p = [1.0];
    let rr2 =
        module::algorithm1(&h_m3(), &p, 198.0, 1.0, Configs::Two, Dispatch::RoundRobin).unwrap();
    assert!(close(cost(&rr2), 6.3, 1e-9), "{rr2:?}");
    let tc2 = module::algorithm1(
        &h_m3(),
        &p,
        198.0,
        1.0,
        Configs::Two,
        Dispatch::ThroughputCost,
    )
    .unwrap();
    assert!(close(cost(&tc2), 5.9, 1e-9), "{tc2:?}");
    let tc = module::algorithm1(
        &h_m3(),
        &p,
        198.0,
        1.0,
        Configs::Any,
        Dispatch::ThroughputCost,
    )
    .unwrap();
    assert!(close(cost(&tc), 5.3, 1e-9), "{tc:?}");
    let d = module::plan_module(
        &h_m3(),
        &p,
        198.0,
        1.0,
        Configs::Any,
        Dispatch::ThroughputCost,
        Dummies::Harpagon,
    )
    .unwrap();
    assert!(
        close(d.cost, 5.0, 1e-9) && close(d.dummy, 2.0, 1e-9),
        "{d:?}"
    );
}

// ------------------------------------------------ Piccolo Table II (splitting M2 -> M3)

#[test]
fn piccolo_table2_rows_recompute_to_4_73_4_00_5_00() {
    let m2 = [cfg(0, 2, 0.125), cfg(0, 4, 0.16), cfg(0, 8, 0.267)];
    let m3 = [cfg(0, 2, 0.167), cfg(0, 4, 0.2), cfg(0, 8, 0.32)];
    // Per-machine worst case d + b/t at the table's (nominal) throughputs.
    let with_t = |c: &Config, t: f64| Config {
        throughput: t,
        ..*c
    };
    let m2: Vec<Config> = m2
        .iter()
        .zip([16.0, 25.0, 30.0])
        .map(|(c, t)| with_t(c, t))
        .collect();
    let m3: Vec<Config> = m3
        .iter()
        .zip([12.0, 20.0, 25.0])
        .map(|(c, t)| with_t(c, t))
        .collect();
    let best = |cs: &[Config], r: f64, l: f64| {
        cs.iter()
            .filter(|c| c.latency + f64::from(c.batch) / c.throughput <= l + 1e-9)
            .map(|c| r / c.throughput)
            .fold(f64::INFINITY, f64::min)
    };
    let rows = [(0.25, 0.65, 4.725), (0.40, 0.50, 4.0), (0.55, 0.35, 5.0)];
    for (l2, l3, want) in rows {
        let got = best(&m2, 50.0, l2) + best(&m3, 40.0, l3);
        assert!(close(got, want, 1e-3), "{l2}/{l3}: {got} != {want}");
    }
}

// ------------------------------------------------ Scrooge §3.3

fn scrooge_app() -> App {
    let e = |hw, b, c, l: f64, t| Config {
        hw,
        batch: b,
        concurrency: c,
        latency: l / 1e3,
        throughput: t,
    };
    App {
        name: "scrooge".into(),
        hardware: vec![
            Hardware {
                name: "X".into(),
                kind: HwKind::Gpu,
                price: 2.0,
                memory_mb: 0.0,
            },
            Hardware {
                name: "Y".into(),
                kind: HwKind::Gpu,
                price: 3.0,
                memory_mb: 0.0,
            },
        ],
        modules: vec![
            Module {
                name: "A".into(),
                configs: vec![
                    e(0, 2, 1, 40.0, 50.0),
                    e(0, 4, 2, 133.0, 60.0),
                    e(1, 2, 1, 25.0, 81.0),
                    e(1, 4, 2, 95.0, 84.0),
                ],
                prefix: None,
            },
            Module {
                name: "B".into(),
                configs: vec![
                    e(0, 2, 1, 20.0, 100.0),
                    e(0, 4, 2, 67.0, 120.0),
                    e(1, 2, 1, 13.0, 160.0),
                    e(1, 4, 2, 40.0, 200.0),
                ],
                prefix: None,
            },
        ],
        edges: vec![Edge {
            from: 0,
            to: 1,
            fanout: 4.0,
        }],
        slo: 0.3,
        rates: vec![80.0, 320.0],
    }
}

#[test]
fn scrooge_section_3_3_costs_7_5407_at_273_ms() {
    let app = scrooge_app();
    let p = planners::scrooge(&app).unwrap();
    p.verify(&app).unwrap();
    assert!(close(p.cost, 7.5407, 1e-4), "{}", p.cost);
    assert!(close(p.worst, 0.2730, 1e-4), "{}", p.worst);
    let a = &p.modules[0].allocs;
    assert_eq!(a.len(), 2, "{a:?}");
    assert!(a[0].config.hw == 0 && a[0].config.batch == 4 && close(a[0].count, 1.0, 1e-9));
    assert!(a[1].config.hw == 1 && a[1].config.batch == 2 && close(a[1].count, 20.0 / 81.0, 1e-9));
    // Both partial Y workers share one Y: X 2 + Y 3 + 3.
    assert!(close(p.integral_cost, 8.0, 1e-9), "{}", p.integral_cost);
}

/// Scrooge's refinement re-runs its choice for every partial worker at once; a
/// partial worker that no configuration serves within the SLO is a `residual`
/// failure.
#[test]
fn scrooge_refines_partial_workers_jointly_or_names_the_residual() {
    // A at 61 req/s: one full X<4,2> (60/s) and a partial worker at 1 req/s,
    // which no configuration serves within 300 ms (at least 13 ms + 2 s).
    let mut app = scrooge_app();
    app.rates = vec![61.0, 244.0];
    let e = planners::scrooge(&app).unwrap_err();
    assert!(e.starts_with("residual:"), "{e}");
    // At 70 req/s the partial worker (10/s) fits on a batch-2 configuration.
    app.rates = vec![70.0, 280.0];
    let p = planners::scrooge(&app).unwrap();
    p.verify(&app).unwrap();
    assert!(p.worst <= app.slo * (1.0 + 1e-9));
    let a = &p.modules[0].allocs;
    assert!(a.last().unwrap().config.batch == 2, "{a:?}");
}

// ------------------------------------------------ Nexus Fig. 4

fn nexus_fig4(gamma: f64, ingress: f64) -> App {
    // Saturated batches at budgets 40/50/60 ms give X 200/250/300 and Y 300/400/500 r/s.
    let x = vec![cfg(0, 4, 0.020), cfg(0, 6, 0.024), cfg(0, 9, 0.030)];
    let y = vec![cfg(0, 6, 0.020), cfg(0, 10, 0.025), cfg(0, 15, 0.030)];
    App {
        name: "fig4".into(),
        hardware: vec![Hardware {
            name: "gpu".into(),
            kind: HwKind::Gpu,
            price: 1.0,
            memory_mb: 0.0,
        }],
        modules: vec![
            Module {
                name: "X".into(),
                configs: x,
                prefix: None,
            },
            Module {
                name: "Y".into(),
                configs: y,
                prefix: None,
            },
        ],
        edges: vec![Edge {
            from: 0,
            to: 1,
            fanout: gamma,
        }],
        slo: 0.1,
        rates: vec![ingress, gamma * ingress],
    }
}

#[test]
fn nexus_fig4_best_split_depends_on_gamma() {
    // gamma, ingress (so every module divides into whole machines), X's and Y's batch.
    for (gamma, ingress, bx, by) in [
        (0.1, 60_000.0, 9, 6),
        (1.0, 6_000.0, 6, 10),
        (10.0, 3_000.0, 4, 15),
    ] {
        let app = nexus_fig4(gamma, ingress);
        let p = planners::nexus(&app).unwrap();
        p.verify(&app).unwrap();
        assert_eq!(
            p.modules[0].allocs[0].config.batch, bx,
            "gamma {gamma}: {p:?}"
        );
        assert_eq!(
            p.modules[1].allocs[0].config.batch, by,
            "gamma {gamma}: {p:?}"
        );
    }
}

// ------------------------------------------------ application files

const GOOD: &str = r#"
name = "traffic"
slo_ms = 400
ingress_rps = 100

[[hardware]]
name = "a100"
kind = "gpu"
price = 1.0

[[hardware]]
name = "cpu"
kind = "cpu"
price = 0.05

[[modules]]
name = "ssd"
[[modules.profiles]]
hardware = "a100"
alpha_ms = 2.0
beta_ms = 10.0
max_batch = 16

[[modules]]
name = "face"
[[modules.profiles]]
hardware = "a100"
entries = [{ batch = 1, latency_ms = 5 }, { batch = 8, latency_ms = 20 }, { batch = 8, concurrency = 2, latency_ms = 32 }]

[[modules]]
name = "car"
[[modules.profiles]]
hardware = "cpu"
alpha_ms = 0
beta_ms = 30

[[edges]]
from = "ssd"
to = "face"
fanout = 0.5

[[edges]]
from = "ssd"
to = "car"
fanout = 2.0
"#;

#[test]
fn a_good_file_reads_with_rates_from_fanouts() {
    let app = file::parse(GOOD).unwrap();
    assert_eq!(app.modules.len(), 3);
    assert_eq!(app.rates, vec![100.0, 50.0, 200.0]);
    assert_eq!(app.modules[0].configs.len(), 5); // batches 1..16
    assert_eq!(app.modules[2].configs.len(), 1); // CPU: batch 1
    assert!(close(app.slo, 0.4, 1e-12));
    for name in planners::PLANNERS {
        let mut stop = || false;
        let p = planners::run(&app, name, &mut stop).unwrap_or_else(|e| panic!("{name}: {e}"));
        p.verify(&app).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

fn err_of(text: &str) -> String {
    file::parse(text).expect_err("must be refused")
}

#[test]
fn bad_files_get_clear_errors() {
    let cyc = format!("{GOOD}\n[[edges]]\nfrom = \"face\"\nto = \"ssd\"\n");
    assert!(err_of(&cyc).contains("cycle"), "{}", err_of(&cyc));
    let unknown = format!("{GOOD}\n[[edges]]\nfrom = \"face\"\nto = \"nobody\"\n");
    assert!(err_of(&unknown).contains("unknown module \"nobody\""));
    let nohw = GOOD.replace("hardware = \"cpu\"", "hardware = \"tpu\"");
    assert!(err_of(&nohw).contains("\"tpu\""), "{}", err_of(&nohw));
    let noprof = format!("{GOOD}\n[[modules]]\nname = \"lonely\"\nrate_rps = 1\n");
    assert!(
        err_of(&noprof).contains("no profile"),
        "{}",
        err_of(&noprof)
    );
    let tight = GOOD.replace("slo_ms = 400", "slo_ms = 20");
    let e = err_of(&tight);
    assert!(
        e.contains("infeasible SLO") && e.contains("ssd -> car") && e.contains("ms"),
        "{e}"
    );
    let neg = GOOD.replace("ingress_rps = 100", "ingress_rps = -5");
    assert!(
        err_of(&neg).contains("ingress_rps is -5"),
        "{}",
        err_of(&neg)
    );
    let huge = GOOD.replace("ingress_rps = 100", "ingress_rps = 1e300");
    assert!(err_of(&huge).contains("ingress_rps"), "{}", err_of(&huge));
    let nan = GOOD.replace("slo_ms = 400", "slo_ms = nan");
    assert!(err_of(&nan).contains("slo_ms"), "{}", err_of(&nan));
    let batch = GOOD.replace("max_batch = 16", "batches = [1, 4294967295]");
    assert!(err_of(&batch).contains("batch"), "{}", err_of(&batch));
    let cpu_batch = GOOD.replace("beta_ms = 30", "beta_ms = 30\nbatches = [4]");
    assert!(err_of(&cpu_batch).contains("CPU module runs at batch 1"));
    let fan = GOOD.replace("fanout = 2.0", "fanout = -1");
    assert!(err_of(&fan).contains("fanout"));
    let many = GOOD.replace("beta_ms = 30", "beta_ms = 3000000");
    assert!(err_of(&many).contains("machines"), "{}", err_of(&many));
    assert!(err_of("slo_ms = [").contains("application file"));
    assert!(err_of("slo_ms = 100\nbogus = 1").contains("bogus"));
}

// ------------------------------------------------ property test

/// A random small instance: 1 to 4 modules in a chain, fork or fork-join, two
/// GPU types, 2 to 4 configurations each, small rates.
pub fn random_app(seed: u64) -> Option<App> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let hardware = vec![
        Hardware {
            name: "big".into(),
            kind: HwKind::Gpu,
            price: 1.0,
            memory_mb: 0.0,
        },
        Hardware {
            name: "small".into(),
            kind: HwKind::Gpu,
            price: rng.gen_range(0.2..0.6),
            memory_mb: 0.0,
        },
    ];
    let n = rng.gen_range(1..=4usize);
    let mut modules = Vec::new();
    for v in 0..n {
        let mut configs = Vec::new();
        for hw in 0..2 {
            let alpha = rng.gen_range(0.002..0.01) * if hw == 1 { 2.5 } else { 1.0 };
            let beta = rng.gen_range(0.005..0.02);
            let k = rng.gen_range(1..=2);
            for b in [1u32, 2, 4, 8, 16]
                .iter()
                .copied()
                .skip(rng.gen_range(0..2))
                .step_by(2)
                .take(k)
            {
                configs.push(Config::new(hw, b, 1, alpha * f64::from(b) + beta));
            }
        }
        modules.push(Module {
            name: format!("m{v}"),
            configs,
            prefix: None,
        });
    }
    let shape = rng.gen_range(0..3);
    let mut edges = Vec::new();
    for v in 1..n {
        let from = match shape {
            0 => v - 1,
            _ => 0,
        };
        edges.push(Edge {
            from,
            to: v,
            fanout: rng.gen_range(0.5..2.0),
        });
    }
    if shape == 2 && n == 4 {
        // fork-join: 0 -> {1, 2} -> 3
        edges.retain(|e| e.to != 3);
        edges.push(Edge {
            from: 1,
            to: 3,
            fanout: 1.0,
        });
        edges.push(Edge {
            from: 2,
            to: 3,
            fanout: 1.0,
        });
    }
    let ingress = rng.gen_range(20.0..150.0);
    let order = super::topo_order(n, &edges).ok()?;
    let mut rates = vec![0.0; n];
    for &v in &order {
        let parents: Vec<&Edge> = edges.iter().filter(|e| e.to == v).collect();
        rates[v] = if parents.is_empty() {
            ingress
        } else {
            parents.iter().map(|e| e.fanout * rates[e.from]).sum()
        };
    }
    let mut app = App {
        name: format!("random-{seed}"),
        hardware,
        modules,
        edges,
        slo: 1.0,
        rates,
    };
    // An SLO between 1.2x and 3x the smallest the longest path can reach.
    let lat: Vec<f64> = (0..n).map(|v| file::min_latency(&app, v)).collect();
    app.slo = app.longest_path(&lat).0 * rng.gen_range(1.2..3.0);
    Some(app)
}

#[test]
fn every_plan_is_feasible_and_fermata_equals_exact() {
    let mut compared = 0;
    for seed in 0..150u64 {
        let Some(app) = random_app(seed) else {
            continue;
        };
        let mut budget = 2_000_000u64;
        let mut stop = move || {
            budget = budget.saturating_sub(4096);
            budget == 0
        };
        let ex = planners::exact(&app, &mut stop).unwrap();
        let fo = planners::fermata_optimum(&app).unwrap();
        fo.verify(&app)
            .unwrap_or_else(|e| panic!("seed {seed} fermata optimum: {e}"));
        let fe = planners::fermata(&app).unwrap();
        fe.verify(&app)
            .unwrap_or_else(|e| panic!("seed {seed} fermata: {e}"));
        assert!(fe.cost <= fo.cost * (1.0 + 1e-12), "seed {seed}");
        if let Some(ex) = ex {
            ex.verify(&app)
                .unwrap_or_else(|e| panic!("seed {seed} exact: {e}"));
            assert!(
                (fo.cost - ex.cost).abs() <= 1e-9 * ex.cost.max(1.0),
                "seed {seed}: fermata {} exact {}",
                fo.cost,
                ex.cost
            );
            compared += 1;
        }
        for name in [
            "harpagon",
            "piccolo",
            "scrooge",
            "nexus",
            "inferline",
            "clipper",
        ] {
            let mut never = || false;
            if let Ok(p) = planners::run(&app, name, &mut never) {
                p.verify(&app)
                    .unwrap_or_else(|e| panic!("seed {seed} {name}: {e}"));
            }
        }
        // Ablations too.
        let mut o = HarpagonOptions::harpagon();
        o.dummies = Dummies::None;
        if let Ok(p) = planners::harpagon_with(&app, "nd", &o) {
            p.verify(&app)
                .unwrap_or_else(|e| panic!("seed {seed} no dummies: {e}"));
        }
    }
    assert!(
        compared >= 100,
        "exact finished on only {compared} instances"
    );
}

/// Where PLANNERS.md's uncut enumeration finishes within `budget` steps, the
/// pruned `exact` reaches its cost with a feasible plan; whether it finished.
pub(crate) fn exact_matches_the_simple_enumeration(app: &App, budget: u64, what: &str) -> bool {
    let mut n = budget;
    let mut stop = move || {
        n = n.saturating_sub(4096);
        n == 0
    };
    let Ok(Some(simple)) = planners::exact_simple(app, &mut stop) else {
        return false;
    };
    let mut never = || false;
    let ex = planners::exact(app, &mut never)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .expect("no limit");
    ex.verify(app)
        .unwrap_or_else(|e| panic!("{what} exact: {e}"));
    assert!(
        (ex.cost - simple.cost).abs() <= 1e-9 * simple.cost.max(1.0),
        "{what}: exact {} simple {}",
        ex.cost,
        simple.cost
    );
    true
}

#[test]
fn exact_equals_the_simple_enumeration() {
    // The cuts of `exact` keep the optimum of PLANNERS.md's brute force: where
    // the uncut enumeration finishes, both reach the same cost.
    let compared = (0..300u64)
        .filter(|&seed| {
            random_app(seed).is_some_and(|app| {
                exact_matches_the_simple_enumeration(&app, 2_000_000, &format!("seed {seed}"))
            })
        })
        .count();
    assert!(compared >= 200, "compared on only {compared} instances");
}

#[test]
fn fermata_with_a_tiny_node_bound_still_plans_feasibly() {
    use super::fermata::{fermata_with, FermataOptions};
    for seed in 0..60u64 {
        let Some(app) = random_app(seed) else {
            continue;
        };
        let o = FermataOptions {
            nodes: 3,
            grid: true,
            portfolio: false,
            ..FermataOptions::default()
        };
        let p = fermata_with(&app, &o).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        p.verify(&app)
            .unwrap_or_else(|e| panic!("seed {seed} bounded fermata: {e}"));
    }
}

#[test]
fn forest_dp_matches_the_milp() {
    // Chains and forks are forests: the DP answers; the MILP on the same points
    // must reach the same cost.
    let mut checked = 0;
    for seed in 0..80u64 {
        let Some(app) = random_app(seed) else {
            continue;
        };
        let pts = super::fermata::points(&app, &super::fermata::FermataOptions::default()).unwrap();
        let Some(dp) = super::choose::forest_dp(&app, &pts) else {
            continue;
        };
        let milp = planners::choose_points_milp(&app, &pts);
        let cost = |pick: &Option<Vec<usize>>| {
            pick.as_ref()
                .map(|k| (0..k.len()).map(|v| pts[v][k[v]].cost).sum::<f64>())
        };
        match (cost(&dp), cost(&milp)) {
            (Some(a), Some(b)) => assert!(close(a, b, 1e-7), "seed {seed}: dp {a} milp {b}"),
            (a, b) => assert_eq!(a.is_some(), b.is_some(), "seed {seed}"),
        }
        if let Some(k) = &dp {
            let lat: Vec<f64> = (0..k.len()).map(|v| pts[v][k[v]].worst).collect();
            assert!(app.longest_path(&lat).0 <= app.slo * (1.0 + 1e-9));
        }
        checked += 1;
    }
    assert!(checked >= 40, "{checked}");
}

#[test]
fn budget_search_matches_brute_force_per_module() {
    for seed in 0..60u64 {
        let Some(app) = random_app(seed) else {
            continue;
        };
        let p: Vec<f64> = app.hardware.iter().map(|h| h.price).collect();
        for v in 0..app.modules.len() {
            let cfgs = module::sorted(&app.modules[v].configs, &p);
            let mut never = || false;
            let mut b = Budget::new(u64::MAX, &mut never);
            let f = module::frontier(&cfgs, &p, app.rates[v], app.slo, true, &mut b);
            let g = module::frontier_brute(&cfgs, &p, app.rates[v], app.slo, &mut b);
            assert_eq!(f.len(), g.len(), "seed {seed} module {v}: {f:?} vs {g:?}");
            for (x, y) in f.iter().zip(&g) {
                assert!(
                    close(x.cost, y.cost, 1e-9) && close(x.worst, y.worst, 1e-9),
                    "seed {seed}: {x:?} {y:?}"
                );
            }
        }
    }
}

#[test]
fn a_remeasured_app_scales_rates_by_fanout_and_latencies_by_ratio() {
    let app = file::parse(GOOD).unwrap();
    let m = app.remeasured(&[0.5, 6.0], &[1.0, 1.0, 2.0]).unwrap();
    assert_eq!(m.rates, vec![100.0, 50.0, 600.0]);
    assert_eq!(m.edges[1].fanout, 6.0);
    for (a, b) in app.modules[2].configs.iter().zip(&m.modules[2].configs) {
        assert!(close(b.latency, 2.0 * a.latency, 1e-12));
        assert!(close(b.throughput, a.throughput / 2.0, 1e-12));
    }
    assert_eq!(app.modules[0].configs, m.modules[0].configs);
    // The planner plans the remeasured application, at a higher cost.
    let (p0, p1) = (
        super::fermata::fermata(&app).unwrap(),
        super::fermata::fermata(&m).unwrap(),
    );
    p1.verify(&m).unwrap();
    assert!(p1.cost > p0.cost, "{} <= {}", p1.cost, p0.cost);
    assert!(app.remeasured(&[0.5], &[1.0, 1.0, 1.0]).is_err());
    assert!(app.remeasured(&[0.5, f64::NAN], &[1.0, 1.0, 1.0]).is_err());
    assert!(app.remeasured(&[0.5, 1.0], &[1.0, 0.0, 1.0]).is_err());
}

#[test]
fn the_lists_below_reach_exact_on_random_applications() {
    // The lists `exact::lists_below` finds hold a choice as cheap as
    // `exact`'s: the parts of each step function it does not know are
    // bounded from below soundly, and it ends only where the cheapest choice
    // picks none of them.
    use super::exact::lists_below;
    use super::planners::choose_points;
    let mut compared = 0;
    for seed in 0..120u64 {
        let Some(app) = random_app(seed) else {
            continue;
        };
        let mut never = || false;
        let Ok(Some(ex)) = super::exact::exact(&app, &mut never) else {
            continue;
        };
        let lists = lists_below(&app, ex.cost * (1.0 + 1e-6), u64::MAX)
            .unwrap_or_else(|| panic!("seed {seed}: no lists below exact's cost"));
        assert!(lists.iter().all(|x| x.1), "seed {seed}: stopped");
        let pts: Vec<Vec<super::module::Point>> = lists.into_iter().map(|x| x.0).collect();
        let pick = choose_points(&app, &pts).unwrap_or_else(|| panic!("seed {seed}: no choice"));
        let c: f64 = pick.iter().enumerate().map(|(v, &k)| pts[v][k].cost).sum();
        assert!(
            (c - ex.cost).abs() <= 1e-9 * ex.cost.max(1.0),
            "seed {seed}: lists {c} against exact {}",
            ex.cost
        );
        compared += 1;
    }
    assert!(compared >= 60, "compared on only {compared} instances");
}
