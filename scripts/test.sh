#!/usr/bin/env bash
# THE test command: every unit, integration, property and simulation test, the bench
# smoke run, then the doc tests. Needs a Rust toolchain (see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -d "${CARGO_HOME:-$HOME/.cargo}/bin" ]]; then
  export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi

# --all-targets: lib, bin, tests/, benches/ (run once without --bench: a quick smoke
# run) and examples. The test profile is opt-level 1 with dependencies at opt-level 2.
cargo test --all-targets
# --all-targets leaves out doc tests; run them separately.
cargo test --doc
