#!/usr/bin/env bash
# THE test command: doc tests, then every unit, integration, property and simulation
# test and the bench smoke run; ends with one summary line "N passed, M failed".
# Needs a Rust toolchain (see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -d "${CARGO_HOME:-$HOME/.cargo}/bin" ]]; then
  export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi

# Everything the tests need (idempotent: does nothing when all is in place).
bash scripts/setup.sh

log=$(mktemp)
artifacts=$(mktemp)
trap 'rm -f "$log" "$artifacts"' EXIT
# --all-targets leaves out doc tests; run them first.
cargo test --doc 2>&1 | tee "$log"
# --all-targets: lib, bin, tests/, benches/ (run once without --bench: a quick smoke
# run). The test profile is opt-level 1 with dependencies at opt-level 2.
# scripts/run_tests.py runs the executables one per core at once, each with one
# test thread, rather than one executable after another; those that judge
# real-time outcomes run first, alone (see its header).
cargo test --all-targets --no-run --message-format=json-render-diagnostics >"$artifacts"
rc=0
python3 scripts/run_tests.py "$artifacts" 2>&1 | tee -a "$log" || rc=$?
passed=$(grep -Eo '^test result: .* ([0-9]+) passed' "$log" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '^test result: .* ([0-9]+) failed' "$log" | grep -Eo '[0-9]+ failed' | awk '{s+=$1} END {print s+0}')
echo
echo "${passed} passed, ${failed} failed"
[[ "$rc" -eq 0 && "$failed" -eq 0 && "$passed" -gt 0 ]]
