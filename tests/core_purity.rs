//! The scheduling core is a pure state machine: time comes in as an argument. This
//! test fails if any source file under src/core gets threads, sockets, async, the OS
//! clock, the file system or processes. It also checks that the RDMA transport's
//! unchecked code stays in one file.

use std::path::{Path, PathBuf};

/// What src/core must never contain.
const FORBIDDEN: [&str; 11] = [
    "std::thread",
    "std::net",
    "tokio",
    "async fn",
    ".await",
    "Instant::now",
    "SystemTime",
    "std::time::Instant",
    "std::sync::mpsc",
    "std::fs",
    "std::process",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
            out.push(path);
        }
    }
}

/// (forbidden string, 1-based line) for every occurrence in `text`.
fn violations(text: &str) -> Vec<(&'static str, usize)> {
    let mut v = Vec::new();
    for (i, line) in text.lines().enumerate() {
        for f in FORBIDDEN {
            if line.contains(f) {
                v.push((f, i + 1));
            }
        }
    }
    v
}

#[test]
fn the_scanner_catches_each_forbidden_string() {
    for f in FORBIDDEN {
        let text = format!("fn ok() {{}}\nlet x = {f}::y;\n");
        assert_eq!(violations(&text), vec![(f, 2)], "{f}");
    }
    assert!(violations("use super::time::{Dur, Time};\nfn f(now: Time) {}\n").is_empty());
}

#[test]
fn core_has_no_threads_sockets_async_or_clock() {
    let core: PathBuf = [env!("CARGO_MANIFEST_DIR"), "src", "core"].iter().collect();
    let mut files = Vec::new();
    rust_files(&core, &mut files);
    files.sort();
    // The scan really covers the core.
    for must in ["mod.rs", "dispatcher.rs", "model.rs", "nexus.rs"] {
        assert!(
            files
                .iter()
                .any(|p| p.file_name().is_some_and(|n| n == must)),
            "src/core/{must} not found among {files:?}"
        );
    }
    let mut bad = Vec::new();
    for p in &files {
        let text =
            std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        assert!(!text.is_empty(), "{} is empty", p.display());
        for (f, line) in violations(&text) {
            bad.push(format!("{}:{line}: `{f}`", p.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "src/core must stay a pure state machine (time is an argument):\n{}",
        bad.join("\n")
    );
}

/// The .rs files under `dir` (relative to the crate root) with their text; each
/// of `must` is among them.
fn sources(dir: &[&str], must: &[&str]) -> Vec<(PathBuf, String)> {
    let mut root: PathBuf = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    root.extend(dir);
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    for m in must {
        assert!(
            files.iter().any(|p| p.file_name().is_some_and(|n| n == *m)),
            "{m} not found under {}",
            root.display()
        );
    }
    files
        .into_iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
            (p, text)
        })
        .collect()
}

/// Every violation in the .rs files under `dir` (relative to the crate root).
fn scan(dir: &[&str], must: &[&str]) -> Vec<String> {
    let mut bad = Vec::new();
    for (p, text) in sources(dir, must) {
        for (f, line) in violations(&text) {
            bad.push(format!("{}:{line}: `{f}`", p.display()));
        }
    }
    bad
}

#[test]
fn the_application_state_machine_has_no_threads_sockets_or_clock() {
    let bad = scan(&["src", "app"], &["mod.rs", "run.rs"]);
    assert!(
        bad.is_empty(),
        "src/app must stay sans-IO (time is an argument):\n{}",
        bad.join("\n")
    );
}

#[test]
fn node_protocol_machines_have_no_threads_sockets_or_clock() {
    let bad = scan(
        &["src", "node", "proto"],
        &[
            "sched.rs",
            "ledger.rs",
            "plans.rs",
            "check.rs",
            "backend.rs",
            "latency_scale.rs",
        ],
    );
    assert!(
        bad.is_empty(),
        "src/node/proto must stay sans-IO (time is an argument):\n{}",
        bad.join("\n")
    );
}

/// Production code, and the harness (load generator, fakes) that shares the
/// run types with it, never import the simulator, the benches or the fuzz
/// drivers: the workload, arrivals and run-result types live in their own
/// modules (`workload.rs`, `arrivals.rs`, `run.rs`).
#[test]
fn production_modules_never_import_the_simulator_or_the_benches() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for d in [
        "app",
        "core",
        "node",
        "runtime",
        "transport",
        "wire",
        "plan",
        "harness",
    ] {
        rust_files(&root.join("src").join(d), &mut files);
    }
    for f in [
        "metrics.rs",
        "repo.rs",
        "workload.rs",
        "profiler.rs",
        "arrivals.rs",
        "run.rs",
    ] {
        files.push(root.join("src").join(f));
    }
    assert!(files.len() > 30, "{files:?}");
    let mut bad = Vec::new();
    for p in &files {
        let rel = p.strip_prefix(&root).unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(p).unwrap();
        for (i, line) in text.lines().enumerate() {
            for f in [
                "crate::sim",
                "crate::bench",
                "crate::fuzzing",
                "fermata::sim",
                "fermata::bench",
                "fermata::fuzzing",
            ] {
                if line.contains(f) {
                    bad.push(format!("{rel}:{}: `{f}`", i + 1));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "production code must not depend on the simulator, the benches or the fuzz drivers:\n{}",
        bad.join("\n")
    );
}

/// The one word the scan below looks for, spelt so that this file does not
/// hold it.
fn the_word() -> String {
    ["un", "safe"].concat()
}

/// All the FFI of the RDMA transport is in `src/transport/rdma/verbs.rs`: no
/// other file of that module may say the word (code, `impl`s or comments). A
/// source scan, so it runs in builds without the `rdma` feature too.
#[test]
fn only_verbs_holds_unchecked_code_in_the_rdma_transport() {
    let word = the_word();
    let files: Vec<(String, String)> = sources(&["src", "transport", "rdma"], &["verbs.rs"])
        .into_iter()
        .map(|(p, text)| {
            let name = p.file_name().expect("a file name").to_string_lossy();
            (name.into_owned(), text)
        })
        .collect();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert!(files.len() >= 8, "found only {names:?}");
    let verbs = files
        .iter()
        .find(|(n, _)| n == "verbs.rs")
        .expect("verbs.rs");
    assert!(
        verbs.1.contains(&word),
        "the scan must see verbs.rs's blocks"
    );
    let offenders: Vec<&str> = files
        .iter()
        .filter(|(n, text)| n != "verbs.rs" && text.to_lowercase().contains(&word))
        .map(|(n, _)| n.as_str())
        .collect();
    assert!(
        offenders.is_empty(),
        "only src/transport/rdma/verbs.rs may hold `{word}` code; found in {offenders:?}"
    );
}
