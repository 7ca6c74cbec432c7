#!/usr/bin/env bash
# All-in-one demo on the embedded default workload (Symphony Table 2, row 1:
# ResNet50 on 8 GPUs): first a live cluster in one process (`fermata serve`:
# scheduler, 8 emulated GPUs, a frontend and a load generator over the in-process
# transport) with its goodput report; then the simulator: one run of deferred
# scheduling and the goodput of every policy on ResNet50 and InceptionResNetV2
# over 8 GPUs, with SVG plots.
# Needs a Rust toolchain (see scripts/setup.sh). Takes a few minutes the first time
# (release build), seconds afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -d "${CARGO_HOME:-$HOME/.cargo}/bin" ]]; then
  export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi

PLOTS=out/plots
FERMATA=target/release/fermata

section() { printf '\n==== %s ====\n' "$*"; }

section "build (release)"
cargo build --release

section "fermata serve: a live cluster in one process, 4000 r/s for 10 s"
"$FERMATA" serve --rate 4000 --duration-s 10 --warmup-s 2

section "fermata sim: ResNet50, 8 GPUs, deferred, the workload's rate"
"$FERMATA" sim --workload configs/workloads/resnet50_8gpu.toml

section "fermata bench goodput: ResNet50, 8 GPUs, every policy"
"$FERMATA" bench goodput --workload configs/workloads/resnet50_8gpu.toml --policy all --plots "$PLOTS"

section "fermata bench goodput: InceptionResNetV2, 8 GPUs, every policy"
"$FERMATA" bench goodput --workload configs/workloads/irv2_8gpu.toml --policy all --plots "$PLOTS"

section "done"
echo "Plots (SVG) are in $(pwd)/$PLOTS:"
ls -1 "$PLOTS"/*.svg | sed 's/^/  /'
