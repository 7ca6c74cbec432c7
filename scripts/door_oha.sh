#!/usr/bin/env bash
# The HTTP front door under overload, measured with an independent open-loop
# client: oha (crates.io), each request's latency counted from its scheduled
# send time (--latency-correction), every request's status and times written
# to SQLite and read back by scripts/door_oha.py.
#
#   bash scripts/door_oha.sh [--model cnn] [--rates 5000,7500,10000] \
#     [--duration-s 10] [--connections 512] [--out DIR]
#
# For each rate: a fresh `fermata serve --executor onnx --models models`, one
# model's KServe v2 JSON request (batch 1, random data), oha at that rate for
# the duration, then the server stopped. Prints per rate the good answers per
# second (200 within the model's SLO), the refusals (429/503) and their p50 and
# p99, and at each rate past the first its good answers as a multiple of the
# first rate's. The first rate is the sustained one (what the model serves
# within its SLO); pass the others as 1.5x and 2x of it.
# Installs oha 1.16.0 into .deps/oha when missing (cargo install, a few minutes).
# FERMATA_BIN names the fermata binary (default: target/release/fermata, built
# when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -d "${CARGO_HOME:-$HOME/.cargo}/bin" ]]; then
  export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi

model=cnn
rates=5000,7500,10000
duration=10
conns=512
out=out/door_oha
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --rates) rates="$2"; shift 2 ;;
    --duration-s) duration="$2"; shift 2 ;;
    --connections) conns="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "door_oha.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$model" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "door_oha.sh: bad --model $model" >&2; exit 2; }
[[ "$rates" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "door_oha.sh: --rates takes R1,R2,... (requests per second)" >&2; exit 2; }
[[ "$duration" =~ ^[0-9]+$ && "$duration" -ge 2 && "$duration" -le 3600 ]] || { echo "door_oha.sh: --duration-s takes whole seconds, 2 to 3600 (the first is warm-up)" >&2; exit 2; }
[[ "$conns" =~ ^[1-9][0-9]{0,4}$ ]] || { echo "door_oha.sh: --connections takes a count" >&2; exit 2; }
[[ -f "models/$model.json" ]] || { echo "door_oha.sh: no models/$model.json" >&2; exit 2; }

oha=.deps/oha/bin/oha
if [[ ! -x "$oha" ]]; then
  echo "installing oha into .deps/oha (cargo install, a few minutes)" >&2
  cargo install oha --version 1.16.0 --locked --root .deps/oha
fi
exe=${FERMATA_BIN:-target/release/fermata}
if [[ ! -x "$exe" ]]; then
  [[ -z ${FERMATA_BIN:-} ]] || { echo "door_oha.sh: FERMATA_BIN=$FERMATA_BIN is not an executable" >&2; exit 2; }
  cargo build --release
fi

mkdir -p "$out"
server=""
cleanup() {
  if [[ -n "$server" ]]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
}
trap cleanup EXIT

IFS=, read -ra rate_list <<< "$rates"
for rate in "${rate_list[@]}"; do
  log="$out/serve-$model-$rate.log"
  "$exe" serve --executor onnx --models models --http-port 0 > "$log" 2>&1 &
  server=$!
  addr=""
  for _ in $(seq 1 600); do
    addr=$(grep -o 'HTTP API listening on http://[^ ]*' "$log" | head -1 | sed 's|.*http://||') || true
    [[ -n "$addr" ]] && break
    kill -0 "$server" 2>/dev/null || { cat "$log" >&2; echo "door_oha.sh: the server exited" >&2; exit 1; }
    sleep 0.1
  done
  [[ -n "$addr" ]] || { echo "door_oha.sh: the server did not announce its address" >&2; exit 1; }
  python3 scripts/door_oha.py body --addr "$addr" --model "$model" --out "$out/body-$model.json"
  db="$out/$model-$rate.sqlite"
  rm -f "$db"
  "$oha" --no-tui --latency-correction -z "${duration}s" -q "$rate" -c "$conns" \
    -m POST -T application/json -D "$out/body-$model.json" --db-url "$db" \
    --output-format json "http://$addr/v2/models/$model/infer" > "$out/$model-$rate.json"
  kill "$server"; wait "$server" 2>/dev/null || true; server=""
done
python3 scripts/door_oha.py report --model "$model" --rates "$rates" --duration-s "$duration" --dir "$out"
