//! `scripts/setup.sh --gpu` with a stand-in for pip (FERMATA_GPU_PIP): what it
//! asks pip for, where it installs, that a second run is a no-op, and that a
//! missing NVIDIA library is named with its wheel. The real wheels (about 2 GB)
//! are never downloaded here.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fake `pip` that records its arguments and lays out what the wheels would
/// (every library but the ones named in FAKE_PIP_SKIP).
const FAKE_PIP: &str = r#"#!/usr/bin/env bash
set -e
echo "$*" >> "$FAKE_PIP_LOG"
target=""
while (($#)); do
  if [[ $1 == --target ]]; then target=$2; shift; fi
  shift
done
[[ -n $target ]] || { echo "no --target" >&2; exit 3; }
mkdir -p "$target/onnxruntime/capi" "$target/nvidia/cu13/lib" "$target/nvidia/cudnn/lib"
touch "$target/onnxruntime/capi/libonnxruntime.so.1.31.1" "$target/onnxruntime/capi/libonnxruntime_providers_cuda.so"
for so in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libcurand.so.10 libcufft.so.12; do
  [[ " ${FAKE_PIP_SKIP:-} " == *" $so "* ]] || touch "$target/nvidia/cu13/lib/$so"
done
[[ " ${FAKE_PIP_SKIP:-} " == *" libcudnn.so.9 "* ]] || touch "$target/nvidia/cudnn/lib/libcudnn.so.9"
"#;

fn run_setup(dir: &Path, skip: &str, args: &[&str]) -> (bool, i32, String) {
    let out = Command::new("bash")
        .arg(root().join("scripts/setup.sh"))
        .args(args)
        .env("FERMATA_GPU_DEPS", dir.join("gpu"))
        .env(
            "FERMATA_GPU_PIP",
            format!("bash {}", dir.join("pip.sh").display()),
        )
        .env("FAKE_PIP_LOG", dir.join("pip.log"))
        .env("FAKE_PIP_SKIP", skip)
        .output()
        .expect("bash runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), out.status.code().unwrap_or(-1), text)
}

#[test]
fn setup_gpu_installs_checks_and_names_what_is_missing() {
    if !root().join(".deps/py/.fermata-pins").exists() {
        eprintln!("skipped: run scripts/setup.sh first (this test reuses its CPU install)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("fermata-setup-gpu-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("pip.sh"), FAKE_PIP).unwrap();

    // First run: pip is asked for the onnxruntime-gpu wheel with its CUDA and
    // cuDNN extras, into the GPU directory.
    let (ok, _, text) = run_setup(&dir, "", &["--gpu"]);
    assert!(ok, "{text}");
    let log = std::fs::read_to_string(dir.join("pip.log")).unwrap();
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(log.contains("install"), "{log}");
    assert!(log.contains("onnxruntime-gpu[cuda,cudnn]==1.31.1"), "{log}");
    assert!(
        log.contains(&format!("--target {}", dir.join("gpu").display())),
        "{log}"
    );
    assert!(dir.join("gpu/.fermata-pins").is_file());
    assert!(text.contains("the cuda executor finds them"), "{text}");

    // Second run: nothing to do, pip is not called again.
    let (ok, _, text) = run_setup(&dir, "", &["--gpu"]);
    assert!(ok, "{text}");
    assert!(text.contains("gpu: already in"), "{text}");
    let log = std::fs::read_to_string(dir.join("pip.log")).unwrap();
    assert_eq!(log.lines().count(), 1, "pip ran again: {log}");

    // A wheel set without cuDNN and cuRAND: the install is refused, naming both
    // libraries and their wheels.
    std::fs::remove_dir_all(dir.join("gpu")).unwrap();
    let (ok, _, text) = run_setup(&dir, "libcudnn.so.9 libcurand.so.10", &["--gpu"]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("libcudnn.so.9 (wheel nvidia-cudnn-cu13)"),
        "{text}"
    );
    assert!(
        text.contains("libcurand.so.10 (wheel nvidia-curand)"),
        "{text}"
    );
    assert!(!dir.join("gpu/.fermata-pins").exists());

    // A typo is a usage error, not a silent CPU-only setup.
    let (ok, code, text) = run_setup(&dir, "", &["--gpus"]);
    assert!(!ok && code == 2, "{text}");
    assert!(text.contains("unknown argument --gpus"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
