//! `fermata`'s integral objective: the machines actually rented.
//!
//! The fractional cost counts a partial machine by its fraction; rented, it is
//! a whole machine unless partial machines of one hardware type are placed
//! together ([`super::integral_cost`]). A fractional optimum often leaves a
//! small partial machine on the dearest type (0.3 of an A100 for 0.3 of its
//! price) where whole machines of a cheaper type (two 1080Tis at 0.35) rent for
//! less, or leaves partial machines that do not fit together. Here each point
//! is split into its full machines' price and its partial machine per hardware
//! type, and the choice of one point per module is a MILP with an integer
//! machine count per hardware type holding the partial machines chosen
//! (`count >= Σ partial`, the packing's lower bound). The points are the
//! fractional frontier, the points on the frontier of their cost alone
//! (partial machines rounded up), and each point with its partial machine
//! rounded up to a full one (a lower worst case at the same rented price).

use super::module::{self, Point};
use super::planners::{choose_points_milp_with, Bins};
use super::{worst_case, Alloc, App, Dispatch};

/// A point's full machines' price and its partial machine per hardware type.
pub fn split(allocs: &[Alloc], prices: &[f64]) -> (f64, Vec<f64>) {
    let mut partial = vec![0.0; prices.len()];
    let mut full = 0.0;
    for a in allocs {
        full += a.full() as f64 * prices[a.config.hw];
        partial[a.config.hw] += a.partial();
    }
    (full, partial)
}

/// The price of a point's machines rented on their own (partial ones whole).
pub fn alone(allocs: &[Alloc], prices: &[f64]) -> f64 {
    allocs
        .iter()
        .map(|a| {
            (a.full() as f64 + if a.partial() > 0.0 { 1.0 } else { 0.0 }) * prices[a.config.hw]
        })
        .sum()
}

/// `q` with its partial machine (the last allocation's) rounded up to a full
/// one, the extra capacity as dummy requests; `None` when it has none.
pub fn rounded_up(q: &Point, rate: f64, prices: &[f64]) -> Option<Point> {
    let last = q.allocs.last()?;
    if last.partial() <= 0.0 {
        return None;
    }
    let mut allocs = q.allocs.clone();
    let a = allocs.last_mut()?;
    a.count = a.full() as f64 + 1.0;
    let capacity: f64 = allocs.iter().map(|a| a.count * a.config.throughput).sum();
    Some(Point {
        worst: worst_case(&allocs, Dispatch::ThroughputCost, prices),
        cost: super::alloc_cost(&allocs, prices),
        dummy: (capacity - rate).max(0.0),
        allocs,
    })
}

/// A module's points for the integral objective, from its candidates: the
/// fractional frontier, the frontier by [`alone`], and the rounded-up variants
/// of both.
pub fn points(cands: Vec<Point>, rate: f64, prices: &[f64]) -> Vec<Point> {
    let mut all = cands;
    let rounded: Vec<Point> = all
        .iter()
        .filter_map(|q| rounded_up(q, rate, prices))
        .collect();
    all.extend(rounded);
    // The frontier by rented price: pareto() keys on `cost`.
    let by_alone: Vec<Point> = all
        .iter()
        .map(|q| Point {
            cost: alone(&q.allocs, prices),
            ..q.clone()
        })
        .collect();
    let mut out: Vec<Point> = module::pareto(by_alone)
        .into_iter()
        .map(|q| Point {
            cost: super::alloc_cost(&q.allocs, prices),
            ..q
        })
        .collect();
    out.extend(module::pareto(all));
    out
}

/// One point per module, every path within the SLO, at the lowest price of
/// full machines plus whole machines per hardware type for the partial ones;
/// ties (to a millionth) go to the lower fractional cost.
pub fn choose(app: &App, pts: &[Vec<Point>]) -> Option<Vec<usize>> {
    let prices: Vec<f64> = app.hardware.iter().map(|h| h.price).collect();
    let splits: Vec<Vec<(f64, Vec<f64>)>> = pts
        .iter()
        .map(|p| p.iter().map(|q| split(&q.allocs, &prices)).collect())
        .collect();
    let cost: Vec<Vec<f64>> = pts
        .iter()
        .zip(&splits)
        .map(|(p, s)| {
            p.iter()
                .zip(s)
                .map(|(q, (full, _))| full + 1e-6 * q.cost)
                .collect()
        })
        .collect();
    let bins: Vec<Bins> = prices
        .iter()
        .enumerate()
        .map(|(h, &price)| Bins {
            price,
            partial: splits
                .iter()
                .map(|s| s.iter().map(|(_, p)| p[h]).collect())
                .collect(),
        })
        .collect();
    // The cheapest choice by fractional cost (the DP on forests) starts the
    // solver with an incumbent.
    let start = super::choose::forest_dp(app, pts).flatten();
    choose_points_milp_with(app, pts, &cost, &bins, start.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::app::{Config, Edge, Hardware, HwKind, Module};

    fn hw(name: &str, price: f64) -> Hardware {
        Hardware {
            name: name.into(),
            kind: HwKind::Gpu,
            price,
            memory_mb: 0.0,
        }
    }

    /// One module, 30 req/s: 0.3 of a fast dear machine (fractional 0.3) or
    /// 1.5 of a slow cheap one (fractional 0.525, rented 0.7).
    fn dear_partial_app() -> App {
        App {
            name: "dear".into(),
            hardware: vec![hw("fast", 1.0), hw("slow", 0.35)],
            modules: vec![Module {
                name: "m".into(),
                // 100 req/s and 20 req/s at batch 1.
                configs: vec![Config::new(0, 1, 1, 0.01), Config::new(1, 1, 1, 0.05)],
                prefix: None,
            }],
            edges: vec![],
            slo: 1.0,
            rates: vec![30.0],
        }
    }

    #[test]
    fn a_points_price_splits_into_full_machines_and_partial_ones() {
        let c0 = Config::new(0, 1, 1, 0.01);
        let c1 = Config::new(1, 1, 1, 0.05);
        let allocs = vec![
            Alloc {
                config: c0,
                count: 2.0,
            },
            Alloc {
                config: c1,
                count: 1.25,
            },
        ];
        let prices = [1.0, 0.4];
        let (full, partial) = split(&allocs, &prices);
        assert!((full - 2.4).abs() < 1e-12, "{full}");
        assert!((partial[0]).abs() < 1e-12 && (partial[1] - 0.25).abs() < 1e-9);
        assert!((alone(&allocs, &prices) - 2.8).abs() < 1e-12);
        let q = Point {
            worst: 0.0,
            cost: 0.0,
            allocs,
            dummy: 0.0,
        };
        let r = rounded_up(&q, 225.0, &prices).unwrap();
        assert!((r.allocs[1].count - 2.0).abs() < 1e-12);
        // 2 x 100 + 2 x 20 = 240 req/s of capacity for 225.
        assert!((r.dummy - 15.0).abs() < 1e-9, "{}", r.dummy);
        assert!(rounded_up(&r, 225.0, &prices).is_none());
    }

    #[test]
    fn the_integral_objective_rents_whole_cheap_machines_over_a_dear_partial() {
        use crate::plan::app::fermata::{fermata_with, FermataOptions, Objective};
        let app = dear_partial_app();
        let frac = fermata_with(&app, &FermataOptions::default()).unwrap();
        frac.verify(&app).unwrap();
        assert!((frac.cost - 0.3).abs() < 1e-9, "{}", frac.cost);
        assert!((frac.integral_cost - 1.0).abs() < 1e-9);
        let o = FermataOptions {
            objective: Objective::Integral,
            ..FermataOptions::default()
        };
        let int = fermata_with(&app, &o).unwrap();
        int.verify(&app).unwrap();
        assert!((int.integral_cost - 0.7).abs() < 1e-9, "{int:?}");
        assert!(int.cost > frac.cost);
    }

    fn point(c: Config, count: f64, prices: &[f64]) -> Point {
        let allocs = vec![Alloc { config: c, count }];
        Point {
            worst: worst_case(&allocs, Dispatch::ThroughputCost, prices),
            cost: super::super::alloc_cost(&allocs, prices),
            allocs,
            dummy: 0.0,
        }
    }

    #[test]
    fn partial_machines_that_fill_one_machine_together_are_kept() {
        // Two modules of 30 req/s: 0.3 of a fast machine each (rented alone
        // 1.0 apiece, together one machine: 1.0), or 1.5 slow machines each
        // (rented alone 0.7 apiece; together 2 full and the halves on one:
        // 1.05). Alone each would rent slow machines; together, fast.
        let mut app = dear_partial_app();
        app.modules.push(Module {
            name: "n".into(),
            ..app.modules[0].clone()
        });
        app.edges.push(Edge {
            from: 0,
            to: 1,
            fanout: 1.0,
        });
        app.rates = vec![30.0, 30.0];
        let prices = [1.0, 0.35];
        let (fast, slow) = (app.modules[0].configs[0], app.modules[0].configs[1]);
        let cands = vec![point(fast, 0.3, &prices), point(slow, 1.5, &prices)];
        let pts = vec![
            points(cands.clone(), 30.0, &prices),
            points(cands, 30.0, &prices),
        ];
        // The slow point survives: cheapest rented alone.
        assert!(pts[0].iter().any(|q| q.allocs[0].config.hw == 1));
        let pick = choose(&app, &pts).unwrap();
        for (v, &k) in pick.iter().enumerate() {
            let (full, partial) = split(&pts[v][k].allocs, &prices);
            assert!(
                full == 0.0 && (partial[0] - 0.3).abs() < 1e-9,
                "{:?}",
                pts[v][k].allocs
            );
        }
        // With one module the slow machines win.
        let one = App {
            edges: vec![],
            modules: vec![app.modules[0].clone()],
            rates: vec![30.0],
            ..app.clone()
        };
        let k = choose(&one, &pts[..1]).unwrap()[0];
        assert_eq!(pts[0][k].allocs[0].config.hw, 1, "{:?}", pts[0][k].allocs);
    }

    /// On random small applications `fermata-integral` plans feasibly, and
    /// rents for at most what `fermata`'s plan and every peer's feasible plan
    /// rent for.
    #[test]
    fn fermata_integral_rents_for_at_most_fermata_and_every_peer() {
        use crate::plan::app::planners;
        let mut better = 0;
        for seed in 0..60u64 {
            let Some(app) = crate::plan::app::tests::random_app(seed) else {
                continue;
            };
            let fi = planners::fermata_integral(&app).unwrap();
            fi.verify(&app)
                .unwrap_or_else(|e| panic!("seed {seed} fermata-integral: {e}"));
            assert_eq!(fi.planner, "fermata-integral");
            let fe = planners::fermata(&app).unwrap();
            assert!(
                fi.integral_cost <= fe.integral_cost * (1.0 + 1e-9),
                "seed {seed}"
            );
            if fi.integral_cost < fe.integral_cost * (1.0 - 1e-9) {
                better += 1;
            }
            for name in crate::plan::app::fermata::PORTFOLIO {
                let Ok(p) = planners::run(&app, name, &mut || false) else {
                    continue;
                };
                if p.verify(&app).is_ok() {
                    assert!(
                        fi.integral_cost <= p.integral_cost * (1.0 + 1e-9),
                        "seed {seed}: fermata-integral {} above {name} {}",
                        fi.integral_cost,
                        p.integral_cost
                    );
                }
            }
        }
        assert!(better > 0, "the integral objective never rented for less");
    }
}
