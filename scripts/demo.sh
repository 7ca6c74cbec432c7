#!/usr/bin/env bash
# All-in-one demo on the embedded default workload (Symphony Table 2, row 1:
# ResNet50 on 8 GPUs): first a live cluster in one process (`fermata serve`:
# scheduler, 8 emulated GPUs, a frontend and a load generator over the in-process
# transport) with its goodput report; the shipped ONNX models and an application
# (an ensemble: a detector whose items fan out to a classifier) over HTTP and
# gRPC, checked with tritonclient; then the simulator: one run of deferred
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

section "setup (scripts/setup.sh; does nothing when all is in place)"
bash scripts/setup.sh

section "build (release)"
cargo build --release

section "fermata serve: a live cluster in one process, 4000 r/s for 10 s"
"$FERMATA" serve --rate 4000 --duration-s 10 --warmup-s 2

section "fermata serve --executor onnx: the shipped ONNX models, checked over HTTP with tritonclient"
log=$(mktemp)
"$FERMATA" serve --executor onnx --http-port 0 >"$log" 2>&1 &
serve_pid=$!
addr=""
for _ in $(seq 100); do
  addr=$(grep -o 'http://[0-9.:]*' "$log" | head -n1 | sed 's|http://||') && [[ -n "$addr" ]] && break
  sleep 0.1
done
[[ -n "$addr" ]] || { cat "$log"; kill "$serve_pid"; exit 1; }
PYTHONPATH=.deps/py python3 scripts/check_http.py --url "$addr" --requests 3 --retries 2
kill -TERM "$serve_pid"; wait "$serve_pid" || true
rm -f "$log"

section "an application over HTTP: detect_classify (detector -> fan-out -> mlp), checked against ONNX Runtime"
log=$(mktemp)
"$FERMATA" serve --executor onnx --models models/apps --http-port 0 --grpc-port 0 >"$log" 2>&1 &
serve_pid=$!
line=""
for _ in $(seq 100); do
  line=$(grep 'gRPC API listening on' "$log" | head -n1) && [[ -n "$line" ]] && break
  sleep 0.1
done
[[ -n "$line" ]] || { cat "$log"; kill "$serve_pid"; exit 1; }
http=$(grep -o 'http://[0-9.:]*' <<<"$line" | sed 's|http://||')
grpc=$(sed 's/.*gRPC API listening on \([0-9.:]*\).*/\1/' <<<"$line")
PYTHONPATH=.deps/py python3 tests/clients/triton_apps.py --http "$http" --grpc "$grpc" --models models/apps
kill -TERM "$serve_pid"; wait "$serve_pid" || true
rm -f "$log"

section "fermata sim: ResNet50, 8 GPUs, deferred, the workload's rate"
"$FERMATA" sim --workload configs/workloads/resnet50_8gpu.toml

section "fermata bench goodput: ResNet50, 8 GPUs, every policy"
"$FERMATA" bench goodput --workload configs/workloads/resnet50_8gpu.toml --policy all --plots "$PLOTS"

section "fermata bench goodput: InceptionResNetV2, 8 GPUs, every policy"
"$FERMATA" bench goodput --workload configs/workloads/irv2_8gpu.toml --policy all --plots "$PLOTS"

section "done"
echo "Plots (SVG) are in $(pwd)/$PLOTS:"
ls -1 "$PLOTS"/*.svg | sed 's/^/  /'
