//! `fermata plan partition` from the command line: a solved assignment that
//! covers every model and reads back as `--current`; a move bound kept;
//! infeasible and malformed inputs refused with a message that names what is
//! wrong (exit status 2, nothing on stdout).

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
        .join("configs/partition/example_models.toml")
        .display()
        .to_string()
}

/// `plan partition` of the example models over 3 sub-clusters (5 s, JSON)
/// with `extra`; its JSON answer (it must succeed).
fn partition_example(extra: &[&str]) -> serde_json::Value {
    let ex = example();
    let mut args = vec![
        "plan",
        "partition",
        "--models",
        &ex,
        "--subclusters",
        "3",
        "--time-limit-s",
        "5",
        "--json",
    ];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = fermata(&args);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn partition_solves_writes_and_rereads_an_assignment_within_a_move_bound() {
    let dir = std::env::temp_dir().join(format!("fermata-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("cur.toml").display().to_string();
    let v = partition_example(&["--solver", "both", "--out", &out]);
    let sols = v.as_array().unwrap();
    assert_eq!(sols.len(), 2);
    assert_eq!(sols[0]["solver"], "milp");
    assert_eq!(sols[1]["solver"], "random");
    assert_eq!(
        sols[0]["assignment"].as_object().unwrap().len(),
        8,
        "every model placed"
    );
    assert!(
        sols[0]["objective"].as_f64().unwrap() <= sols[1]["objective"].as_f64().unwrap() + 1e-9
    );
    // Everything in sub-cluster 0 now: at most two models may move.
    let text = std::fs::read_to_string(&out).unwrap();
    let all0: String = text
        .lines()
        .map(|l| match l.split_once(" = ") {
            Some((k, _)) if k != "subclusters" => format!("{k} = 0"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&out, all0).unwrap();
    let v = partition_example(&["--current", &out, "--max-moves", "2"]);
    assert_eq!(v[0]["moves"], 2, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn infeasible_and_malformed_inputs_are_refused_naming_the_problem() {
    let ex = example();
    let refused = |args: &[&str], want: &str| {
        let (code, stdout, stderr) = fermata(args);
        assert_ne!(code, 0, "{args:?} should fail");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(
            stderr.contains(want),
            "{args:?}: {stderr:?} should mention {want:?}"
        );
    };
    refused(
        &[
            "plan",
            "partition",
            "--models",
            &ex,
            "--subclusters",
            "2",
            "--rate-max-rps",
            "2000",
        ],
        "rate bound (R_max)",
    );
    refused(
        &[
            "plan",
            "partition",
            "--models",
            &ex,
            "--subclusters",
            "3",
            "--memory-max-mb",
            "700",
        ],
        "memory bound (S_max)",
    );
    refused(
        &["plan", "partition", "--models", &ex, "--subclusters", "0"],
        "at least 1",
    );
    refused(
        &[
            "plan",
            "partition",
            "--models",
            &ex,
            "--subclusters",
            "2",
            "--max-moves",
            "1",
        ],
        "--current",
    );
    refused(
        &[
            "plan",
            "partition",
            "--models",
            "/nonexistent.toml",
            "--subclusters",
            "2",
        ],
        "cannot read",
    );
    let dir = std::env::temp_dir().join(format!("fermata-plan-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[[models]]\nname = \"a\"\nrate_rps = -3\nmemory_mb = 1\n",
    )
    .unwrap();
    refused(
        &[
            "plan",
            "partition",
            "--models",
            bad.to_str().unwrap(),
            "--subclusters",
            "2",
        ],
        "rate_rps",
    );
    std::fs::write(&bad, "[[models]]\nname = \"a\"\nrate = 3\n").unwrap();
    refused(
        &[
            "plan",
            "partition",
            "--models",
            bad.to_str().unwrap(),
            "--subclusters",
            "2",
        ],
        "the models file",
    );
    let _ = std::fs::remove_dir_all(&dir);
}
