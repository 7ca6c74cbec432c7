//! Bad workload files fail with a message that names the problem, through
//! `Workload::from_toml` and `Workload::from_file`; the shipped workloads parse.

use fermata::workload::{Arrival, Popularity, Workload};
use std::path::{Path, PathBuf};

/// A valid model table to build variants from.
const MODEL: &str = r#"
[[models]]
name = "m"
alpha_ms = 1.0
beta_ms = 5.0
slo_ms = 20
"#;

/// The full anyhow chain of the error from parsing `text`.
fn err(text: &str) -> String {
    match Workload::from_toml(text, None) {
        Ok(w) => panic!("accepted a bad workload: {w:?}\n---\n{text}"),
        Err(e) => format!("{e:#}"),
    }
}

fn assert_mentions(msg: &str, needles: &[&str]) {
    for n in needles {
        assert!(msg.contains(n), "error `{msg}` does not mention `{n}`");
    }
}

/// A temp file unique to this process and test.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str, text: &str) -> TempFile {
        let p = std::env::temp_dir().join(format!(
            "fermata_workload_errors_{}_{tag}.toml",
            std::process::id()
        ));
        std::fs::write(&p, text).expect("write temp file");
        TempFile(p)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn baseline_is_valid() {
    // The variants below differ from this in one place only.
    let w = Workload::from_toml(&format!("gpus = 2\n{MODEL}"), None).expect("valid");
    assert_eq!(w.gpus, 2);
    assert_eq!(w.models.len(), 1);
    assert_eq!(w.models[0].spec.name, "m");
    assert_eq!(w.arrival, Arrival::Poisson);
    assert_eq!(w.popularity, Popularity::Equal);
    // And a profile from the embedded paper table resolves.
    let w = Workload::from_toml("gpus = 1\n[[models]]\nprofile = \"a100/ResNet50\"\n", None)
        .expect("known profile");
    assert_eq!(w.models[0].spec.name, "ResNet50");
}

#[test]
fn unknown_model() {
    let m = err("gpus = 1\n[[models]]\nprofile = \"a100/NoSuchNet\"\n");
    assert_mentions(&m, &["unknown model", "NoSuchNet"]);
    // The known models of that GPU are listed.
    assert_mentions(&m, &["ResNet50"]);
    let m = err("gpus = 1\n[[models]]\nprofile = \"h900/ResNet50\"\n");
    assert_mentions(&m, &["unknown model", "h900"]);
    let m = err("gpus = 1\n[[models]]\nprofile = \"ResNet50\"\n");
    assert_mentions(&m, &["GPU/MODEL", "ResNet50"]);
}

#[test]
fn slo_below_single_request_latency() {
    let m = err("gpus = 1\n[[models]]\nname = \"m\"\nalpha_ms = 1\nbeta_ms = 10\nslo_ms = 5\n");
    assert_mentions(&m, &["SLO", "l(1)"]);
    // Network delays count too: l(1) = 6 fits 7 ms, but not with 2 ms of network.
    let ok = "gpus = 1\n[[models]]\nname = \"m\"\nalpha_ms = 1\nbeta_ms = 5\nslo_ms = 7\n";
    Workload::from_toml(ok, None).expect("6 ms fits a 7 ms SLO");
    let m = err(&format!("{ok}[network]\nctrl_us = 1000\nresp_us = 1000\n"));
    assert_mentions(&m, &["SLO", "l(1)", "network"]);
}

#[test]
fn gpu_count() {
    assert_mentions(&err(&format!("gpus = 0\n{MODEL}")), &["gpus", "0"]);
    assert_mentions(&err(&format!("gpus = -3\n{MODEL}")), &["gpus", "-3"]);
    assert_mentions(&err(MODEL), &["missing", "gpus"]);
    assert_mentions(&err(&format!("gpus = \"four\"\n{MODEL}")), &["gpus"]);
}

#[test]
fn malformed_toml() {
    let m = err(&format!("gpus = 2\nrate_rps = = 5\n{MODEL}"));
    assert_mentions(&m, &["malformed TOML", "line 2"]);
    let m = err("gpus = 2\n[[models]\nname = \"m\"\n");
    assert_mentions(&m, &["malformed TOML", "line"]);
}

#[test]
fn unknown_field_is_named() {
    let m = err("gpus = 1\n[[models]]\nname = \"m\"\nalpha_ms = 1\nbeta_ms = 5\nslo_msec = 20\n");
    assert_mentions(&m, &["slo_msec"]);
    let m = err(&format!("gpus = 1\ngpu_count = 3\n{MODEL}"));
    assert_mentions(&m, &["gpu_count"]);
    let m = err(&format!("gpus = 1\n{MODEL}[network]\nctrl_ms = 1\n"));
    assert_mentions(&m, &["ctrl_ms"]);
}

#[test]
fn missing_models() {
    let m = err("gpus = 4\n");
    assert_mentions(&m, &["models"]);
    let m = err("gpus = 4\nmodels = []\n");
    assert_mentions(&m, &["models"]);
    // A model without a latency profile.
    let m = err("gpus = 1\n[[models]]\nname = \"m\"\nslo_ms = 20\n");
    assert_mentions(&m, &["alpha_ms"]);
}

#[test]
fn bad_arrival() {
    let m = err(&format!("gpus = 1\narrival = \"bursty\"\n{MODEL}"));
    assert_mentions(&m, &["arrival", "bursty"]);
    let m = err(&format!("gpus = 1\narrival = \"gamma:-1\"\n{MODEL}"));
    assert_mentions(&m, &["arrival", "gamma", "-1"]);
    let w = Workload::from_toml(&format!("gpus = 1\narrival = \"gamma:0.5\"\n{MODEL}"), None)
        .expect("gamma:0.5 is valid");
    assert_eq!(w.arrival, Arrival::Gamma(0.5));
}

#[test]
fn bad_popularity() {
    let m = err(&format!("gpus = 1\npopularity = \"zipf:abc\"\n{MODEL}"));
    assert_mentions(&m, &["popularity", "abc"]);
    let m = err(&format!("gpus = 1\npopularity = \"pareto\"\n{MODEL}"));
    assert_mentions(&m, &["popularity", "pareto"]);
}

#[test]
fn decreasing_latency_table() {
    let m = err("gpus = 1\n[[models]]\nname = \"m\"\nlatency_ms = [5.0, 4.0, 6.0]\nslo_ms = 20\n");
    assert_mentions(&m, &["non-decreasing", "l(2)"]);
    let m = err("gpus = 1\n[[models]]\nname = \"m\"\nlatency_ms = []\nslo_ms = 20\n");
    assert_mentions(&m, &["latency_ms", "empty"]);
    let w = Workload::from_toml(
        "gpus = 1\n[[models]]\nname = \"m\"\nlatency_ms = [5.0, 5.0, 6.0]\nslo_ms = 20\n",
        None,
    )
    .expect("a non-decreasing table is valid");
    assert_eq!(w.models[0].spec.profile.max_batch(), 3);
}

#[test]
fn other_bad_values_are_named() {
    let m = err(&format!("gpus = 1\npolicy = \"fastest\"\n{MODEL}"));
    assert_mentions(&m, &["policy", "fastest"]);
    let m = err(&format!("gpus = 1\ngather = \"early:0\"\n{MODEL}"));
    assert_mentions(&m, &["gather"]);
    let m = err(&format!("gpus = 1\nrate_rps = -5\n{MODEL}"));
    assert_mentions(&m, &["rate_rps", "-5"]);
    let m = err(&format!("gpus = 1\n{MODEL}weight = 0\n"));
    assert_mentions(&m, &["weight"]);
    let m = err(&format!("gpus = 1\n{MODEL}max_batch = 0\n"));
    assert_mentions(&m, &["max_batch"]);
}

#[test]
fn from_file_names_the_path() {
    // A file that does not exist.
    let missing = std::env::temp_dir().join(format!(
        "fermata_no_such_workload_{}.toml",
        std::process::id()
    ));
    let e = Workload::from_file(&missing).expect_err("missing file");
    let m = format!("{e:#}");
    assert_mentions(&m, &["cannot read", &missing.display().to_string()]);

    // A file with a bad value: the path and the problem are both named.
    let f = TempFile::new("zero_gpus", &format!("gpus = 0\n{MODEL}"));
    let m = format!("{:#}", Workload::from_file(&f.0).expect_err("zero gpus"));
    assert_mentions(&m, &[&f.0.display().to_string(), "gpus"]);

    let f = TempFile::new(
        "unknown_model",
        "gpus = 1\n[[models]]\nprofile = \"a100/NoSuchNet\"\n",
    );
    let m = format!(
        "{:#}",
        Workload::from_file(&f.0).expect_err("unknown model")
    );
    assert_mentions(
        &m,
        &[&f.0.display().to_string(), "unknown model", "NoSuchNet"],
    );

    let f = TempFile::new("malformed", "gpus = [\n");
    let m = format!("{:#}", Workload::from_file(&f.0).expect_err("malformed"));
    assert_mentions(&m, &[&f.0.display().to_string(), "malformed TOML", "line"]);

    // A profiles_file that does not exist is named, relative to the workload's folder.
    let f = TempFile::new(
        "profiles",
        "gpus = 1\nprofiles_file = \"fermata_no_such_profiles.csv\"\n[[models]]\nprofile = \"a100/ResNet50\"\n",
    );
    let m = format!("{:#}", Workload::from_file(&f.0).expect_err("no profiles"));
    assert_mentions(&m, &["profiles_file", "fermata_no_such_profiles.csv"]);

    // And a good file parses.
    let f = TempFile::new("good", &format!("gpus = 3\n{MODEL}"));
    assert_eq!(Workload::from_file(&f.0).expect("valid").gpus, 3);
}

#[test]
fn shipped_workloads_parse() {
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "configs", "workloads"]
        .iter()
        .collect();
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("configs/workloads exists") {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let w = Workload::from_file(&path)
            .unwrap_or_else(|e| panic!("{} does not parse: {e:#}", path.display()));
        assert!(w.gpus >= 1, "{}", path.display());
        assert!(!w.models.is_empty(), "{}", path.display());
        let share: f64 = w.models.iter().map(|m| m.share).sum();
        assert!((share - 1.0).abs() < 1e-9, "{}", path.display());
        n += 1;
    }
    assert!(n >= 2, "found only {n} workload files in {}", dir.display());
    assert!(Path::new(&dir).join("resnet50_8gpu.toml").exists());
}
