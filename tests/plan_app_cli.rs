//! `fermata plan app` from the command line: a plan as a table and as JSON that
//! covers every module's rate within the SLO; `--compare` runs every planner;
//! a refused application file exits with status 2 and names the cause.

use std::path::PathBuf;
use std::process::Command;

fn fermata(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fermata"))
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn example() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("configs/planning/traffic.toml")
        .display()
        .to_string()
}

#[test]
fn plans_the_example_as_json_within_the_slo() {
    let (code, out, err) = fermata(&[
        "plan",
        "app",
        "--app",
        &example(),
        "--planner",
        "fermata",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let worst = v["worst"].as_f64().unwrap();
    assert!(worst > 0.0 && worst <= 0.4 + 1e-9, "{worst}");
    let mods = v["modules"].as_array().unwrap();
    assert_eq!(mods.len(), 3);
    for m in mods {
        let served: f64 = m["allocs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["count"].as_f64().unwrap() * a["config"]["throughput"].as_f64().unwrap())
            .sum();
        assert!(served >= m["rate"].as_f64().unwrap() * (1.0 - 1e-9), "{m}");
        assert!(m["worst"].as_f64().unwrap() <= m["budget"].as_f64().unwrap() * (1.0 + 1e-9));
    }
    let cost = v["cost"].as_f64().unwrap();
    assert!(cost > 0.0 && v["integral_cost"].as_f64().unwrap() >= cost - 1e-9);
    assert!(v["plan_ms"].as_f64().is_some());
}

#[test]
fn compare_runs_every_planner_and_the_table_names_them() {
    let (code, out, err) = fermata(&[
        "plan",
        "app",
        "--app",
        &example(),
        "--compare",
        "--exact-limit-s",
        "20",
    ]);
    assert_eq!(code, 0, "{err}");
    for p in [
        "fermata",
        "exact",
        "harpagon",
        "piccolo",
        "scrooge",
        "nexus",
        "inferline",
        "clipper",
    ] {
        assert!(out.lines().any(|l| l.starts_with(p)), "{p} missing:\n{out}");
    }
    assert!(
        out.contains("worst case") && out.contains("integral"),
        "{out}"
    );
}

#[test]
fn serve_answers_whole_machines_that_the_simulator_serves() {
    let (code, out, err) = fermata(&["plan", "app", "--app", &example(), "--serve", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = &v["served"];
    assert!(s["good"].as_f64().unwrap() >= s["target_good"].as_f64().unwrap());
    let lines = s["machines"].as_array().unwrap();
    assert!(!lines.is_empty());
    for m in ["ssd", "face", "car"] {
        let n: u64 = lines
            .iter()
            .filter(|l| l["module"] == m)
            .map(|l| l["machines"].as_u64().unwrap())
            .sum();
        assert!(n >= 1, "{m} without machines: {s}");
    }
    assert!(s["cost"].as_f64().unwrap() > 0.0);
    assert!(v["modules"].as_array().unwrap().len() == 3);
    // Seeded: the same answer again.
    let (_, again, _) = fermata(&["plan", "app", "--app", &example(), "--serve", "--json"]);
    let w: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(w["served"], v["served"]);
    let (code, _, err) = fermata(&["plan", "app", "--app", &example(), "--serve", "--compare"]);
    assert_eq!(code, 2);
    assert!(err.contains("--serve"), "{err}");
}

#[test]
fn a_cyclic_application_is_refused_with_status_2() {
    let dir = std::env::temp_dir().join(format!("fermata-plan-app-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text =
        std::fs::read_to_string(example()).unwrap() + "\n[[edges]]\nfrom = \"car\"\nto = \"ssd\"\n";
    let f = dir.join("cyclic.toml");
    std::fs::write(&f, text).unwrap();
    let (code, out, err) = fermata(&["plan", "app", "--app", f.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert!(err.contains("cycle"), "{err}");
    let (code, _, err) = fermata(&["plan", "app", "--app", &example(), "--planner", "nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown planner"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_planners_writes_the_cdf_and_states_the_cost_it_compares() {
    let dir = std::env::temp_dir().join(format!("fermata-bench-planners-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("cdf.svg");
    let (code, out, err) = fermata(&[
        "bench",
        "planners",
        "--workloads",
        "3",
        "--seed",
        "5",
        "--price-ratio",
        "0.2",
        "--exact-limit-s",
        "5",
        "--no-ablations",
        "--plot",
        svg.to_str().unwrap(),
        "--show-misses",
        "--show-slowest",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("costs: fractional"), "{out}");
    assert!(
        out.contains("workloads where fermata planned above another planner: 0"),
        "{out}"
    );
    // The two slowest of the seeds 5, 6 and 7, with their modules' rates.
    let slow = out
        .split("fermata's slowest workloads:")
        .nth(1)
        .unwrap_or_else(|| panic!("{out}"));
    let rows: Vec<&str> = slow.lines().filter(|l| l.starts_with("  seed ")).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows.iter().all(|r| ["5", "6", "7"]
            .iter()
            .any(|s| r.starts_with(&format!("  seed {s} ")))
            && r.contains(" ms, plan by ")
            && r.contains("/s")),
        "{out}"
    );
    assert!(
        out.contains("fermata at most every other planner's fractional cost on 100.0%"),
        "{out}"
    );
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.contains("<svg") && s.contains("nexus"), "{s}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_apps_serves_generated_applications_and_compares_to_harpagon() {
    let dir = std::env::temp_dir().join(format!("fermata-bench-apps-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("cdf.svg");
    let (code, out, err) = fermata(&[
        "bench",
        "apps",
        "--apps",
        "2",
        "--requests",
        "200",
        "--max-sims",
        "3",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    for setup in [
        "fermata+deferred",
        "fermata+static",
        "harpagon+tc",
        "nexus+nexus",
    ] {
        assert!(out.contains(setup), "{out}");
    }
    assert!(out.contains("p99<=predicted"), "{out}");
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.contains("<svg") && s.contains("harpagon+tc"), "{s}");
    let (code, _, err) = fermata(&["bench", "apps", "--apps", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--apps"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
