#!/usr/bin/env bash
# Runs the GPU and many-core checks on a host that has neither a Rust toolchain
# nor registry access, from the chunks that scripts/device_bundle.sh writes
# (binary, onnxruntime-gpu, tritonclient), carried one folder per transfer:
#
#   bash scripts/device_run.sh stash DIR...        keep DIR/part.* for later (one transfer each)
#   bash scripts/device_run.sh gpu [--timeout-s S] [ARGS]
#                                                  the GPU checks: scripts/gpu_check.sh ARGS
#                                                  (stopped after S s, the results still written)
#   bash scripts/device_run.sh cpu16 [--budget-s S] [--parts LIST] [--small]
#                                                  the figures that need many cores
#   bash scripts/device_run.sh sh 'COMMANDS'       COMMANDS in bash, set up as for `gpu`
#                                                  ($FERMATA_BIN, $PY, .deps/gpu, models/large),
#                                                  everything printed kept in sh.log
#
# `gpu` and `cpu16` reassemble the stashed chunks (checked against the bundle's
# SHA-256) under $FERMATA_DEVICE_DIR (/tmp/fermata-device) once, then run from
# there. The GPU host needs python3 with numpy and onnx, and NVIDIA's CUDA 13
# runtime, cuBLAS, cuFFT, cuRAND and cuDNN 9 libraries: from the pip wheels in its
# Python's site-packages (found by themselves) or in FERMATA_CUDA_LIBS.
#
# `cpu16` runs, as far as --budget-s (420) allows, each part given its share:
#  1. `fermata bench scheduler --find-max` with 64 models and 1,024 GPUs, then
#     4,096, on 1, 2, 4 and 8 sub-clusters, with load-generator threads to spare;
#  2. `fermata bench goodput --runtime tcp` 1 x 1 and 2 x 2 (frontends x
#     backends) next to the simulator;
#  3. `fermata bench http` for mlp and cnn, the servers on the first half of the
#     CPUs and the client on the other half, two repetitions each, then once at
#     1.5 x and 2 x the sustained rates (refusals at the door);
#  4. `fermata bench serve --transport tcp --input-bytes 602112`: the goodput
#     with 602,112-byte inputs against default inputs over loopback TCP, 1 GPU
#     (H100 ResNet-50 profile) and the embedded 8-GPU workload, and the 1-GPU
#     one with four pull connections and four TCP worker threads.
# --parts runs only those named (comma-separated: sched1k, sched4k, tcp, door,
# over, large; default all), the budget shared among them in the same proportions.
# --small runs each with small numbers (a rehearsal on a small machine).
#
# Results go to $OUT (else out/device): NAME.log (everything printed), NAME.json
# (the figures) and NAME.tar.gz (the raw outputs and the profiles written).
set -uo pipefail
cd "$(dirname "$0")/.."

STASH=${FERMATA_BUNDLE_DIR:-/tmp/fermata-bundle}
DEV=${FERMATA_DEVICE_DIR:-/tmp/fermata-device}
RES=${OUT:-out/device}
say() { printf '[device_run] %s\n' "$*"; }
die() {
  printf '[device_run] ERROR: %s\n' "$*" >&2
  exit 1
}
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

stash() {
  (($#)) || die "stash: name at least one chunk folder"
  mkdir -p "$STASH"
  local d
  for d in "$@"; do
    compgen -G "$d/part.*" >/dev/null || die "stash: no part.* in $d"
    cp "$d"/part.* "$d/SHA256SUMS" "$STASH/" || die "stash: cannot copy $d to $STASH"
    if compgen -G "$d/*.whl" >/dev/null; then
      cp "$d"/*.whl "$STASH/"
    fi
  done
  say "stashed in $STASH: $(cd "$STASH" && ls part.* | paste -sd' ' -) ($(du -sh "$STASH" | cut -f1))"
}

# Reassembles and unpacks the bundle into $DEV (once).
unpack() {
  if [[ -x $DEV/bin/fermata && -f $DEV/.complete ]]; then
    return 0
  fi
  [[ -f $STASH/SHA256SUMS ]] || die "no stashed bundle in $STASH (run: device_run.sh stash DIR for each chunk)"
  local want name got
  read -r want name <"$STASH/SHA256SUMS"
  got=$(cat "$STASH"/part.* | sha256sum | cut -d' ' -f1)
  [[ $got == "$want" ]] || die "the stashed chunks ($(cd "$STASH" && ls part.* | paste -sd' ' -)) do not make $name: a chunk is missing or damaged (sha256 $got, want $want)"
  rm -rf "$DEV" && mkdir -p "$DEV"
  if command -v zstd >/dev/null; then
    cat "$STASH"/part.* | zstd -dc --long=27 | tar -x -C "$DEV" || die "cannot unpack the bundle"
  else
    # No zstd command: Python's zstandard, from the wheel stashed beside the chunks.
    local py
    py=$(command -v /opt/torch/.venv/bin/python3 || command -v python3) || die "neither zstd nor python3 here"
    "$py" -m pip install -q --no-index --no-deps --no-compile --target "$DEV/.zstd" "$STASH"/zstandard-*.whl ||
      die "no zstd command, and the zstandard wheel does not install"
    cat "$STASH"/part.* | PYTHONPATH="$DEV/.zstd" "$py" -c 'import sys, zstandard
zstandard.ZstdDecompressor(max_window_size=1 << 27).copy_stream(sys.stdin.buffer, sys.stdout.buffer)' |
      tar -x -C "$DEV" || die "cannot unpack the bundle"
  fi
  touch "$DEV/.complete"
  say "unpacked: $(tr '\n' ';' <"$DEV/VERSION")"
}

# Python with numpy and onnx (the GPU host's PyTorch environment, else python3).
pick_python() {
  local p
  for p in "${PYTHON:-}" /opt/torch/.venv/bin/python3 python3; do
    [[ -n $p ]] || continue
    if command -v "$p" >/dev/null && "$p" -c 'import numpy, onnx' 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  die "no python3 with numpy and onnx (set PYTHON)"
}

# The NVIDIA wheels' site-packages/nvidia of $1 (python), if it has them.
nvidia_dir() {
  "$1" - <<'PY' 2>/dev/null
import os, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    p = os.path.join(d, "nvidia")
    if os.path.isdir(p):
        print(p)
        sys.exit(0)
PY
}

# The checkout's .deps/gpu and .deps/py for gpu_check.sh, from the bundle and
# the host's NVIDIA wheels. Sets PY.
prepare_gpu() {
  PY=$(pick_python)
  export PYTHON=$PY
  mkdir -p .deps
  # tritonclient's HTTP client (check_http.py) into $DEV/site.
  if [[ ! -f $DEV/site/.complete ]]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
      --target "$DEV/site" "$DEV"/wheels/*.whl || die "cannot install the bundle's wheels"
    touch "$DEV/site/.complete"
  fi
  if [[ -e .deps/py && ! -L .deps/py ]]; then
    die ".deps/py is a real directory here; this script links it to $DEV/site"
  fi
  ln -sfn "$DEV/site" .deps/py
  if [[ -e .deps/gpu && ! -L .deps/gpu ]]; then
    die ".deps/gpu is a real directory here; this script links it to $DEV/gpu"
  fi
  ln -sfn "$DEV/gpu" .deps/gpu
  local nv
  nv=$(nvidia_dir "$PY")
  if [[ -n $nv ]]; then
    ln -sfn "$nv" "$DEV/gpu/nvidia"
    say "CUDA libraries from $nv"
  elif [[ -z ${FERMATA_CUDA_LIBS:-} ]]; then
    die "no NVIDIA wheels in $PY's site-packages and FERMATA_CUDA_LIBS unset: the CUDA 13 runtime, cuBLAS, cuFFT, cuRAND and cuDNN 9 are needed"
  fi
  export FERMATA_BIN=$DEV/bin/fermata
}

# Writes $RES/$1.json from the outputs of gpu_check.sh.
gpu_json() {
  "$PY" - "$1" out/gpu_check <<'PY'
import glob, json, os, re, sys
dst, out = sys.argv[1], sys.argv[2]
res = {"profiles": {}, "memory": {}, "http": None, "goodput": {}}
for stem in ["mlp", "cnn", "ranker", "resnet50", "resnet50_fp16", "resnet50_lanes2"]:
    try:
        prof = json.load(open(f"{out}/{stem}.profile.json"))
    except (OSError, ValueError):
        continue
    ort = {}
    try:
        ort = {j["batch"]: j["median_ms"] for j in map(json.loads, open(f"{out}/{stem}.ort.jsonl"))}
    except (OSError, ValueError):
        pass
    same = prof.get("same_shape_median_ms") or [None] * len(prof["batch_sizes"])
    rows = []
    for b, m, s in zip(prof["batch_sizes"], prof["median_ms"], same):
        rows.append({"batch": b, "mixed_ms": m, "same_shape_ms": s, "ort_ms": ort.get(b),
                     "mixed_over_ort": (m / ort[b]) if b in ort and ort[b] else None})
    res["profiles"][stem] = rows
for f in sorted(glob.glob(f"{out}/mem_*.log")):
    line = [l.strip() for l in open(f) if "device memory" in l]
    res["memory"][os.path.basename(f)[4:-4]] = line[0] if line else None
for f in sorted(glob.glob(f"{out}/http_*.log")):
    lines = open(f).read().strip().splitlines()
    res.setdefault("http_logs", {})[os.path.basename(f)] = lines[-1] if lines else None
for stem in sorted(f[8:-4] for f in os.listdir(out) if f.startswith("goodput_") and f.endswith(".txt")):
    p = f"{out}/goodput_{stem}.txt"
    if not os.path.exists(p):
        continue
    t = open(p).read()
    g = {"text": t}
    m = re.search(r"live ([\d.]+) r/s, simulator ([\d.]+) r/s, live/simulator ([\d.]+)", t)
    if m:
        g.update(live_rps=float(m[1]), sim_rps=float(m[2]), ratio=float(m[3]))
    res["goodput"][stem] = g
json.dump(res, open(dst, "w"), indent=1)
PY
}

cmd_gpu() {
  local lim=0
  if [[ ${1:-} == --timeout-s ]]; then
    lim=$2
    shift 2
    [[ $lim =~ ^[0-9]+$ ]] || die "--timeout-s must be whole seconds"
  fi
  unpack
  prepare_gpu
  mkdir -p "$RES"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  say "scripts/gpu_check.sh $*$( ((lim > 0)) && echo " (stopped after $lim s)")"
  if ((lim > 0)); then
    timeout -k 5 "$lim" bash scripts/gpu_check.sh "$@" 2>&1 | tee "$RES/gpu.log"
  else
    bash scripts/gpu_check.sh "$@" 2>&1 | tee "$RES/gpu.log"
  fi
  local rc=${PIPESTATUS[0]}
  gpu_json "$RES/gpu.json" || say "could not write $RES/gpu.json"
  tar -czf "$RES/gpu.tar.gz" out/gpu_check models/*.profile-cuda.json models/large/*.profile-cuda.json 2>/dev/null
  say "gpu_check exit $rc; results in $RES (gpu.log, gpu.json, gpu.tar.gz)"
  return "$rc"
}

# A focused experiment: the bundle unpacked, the GPU libraries linked, the
# real-size models written, then the caller's commands.
cmd_sh() {
  (($# == 1)) || die "sh: give the commands as one argument"
  unpack
  prepare_gpu
  mkdir -p "$RES"
  if [[ ! -f models/large/resnet50.onnx || ! -f models/large/resnet50_fp16.onnx ]]; then
    PYTHONPATH=.deps/py${PYTHONPATH:+:$PYTHONPATH} "$PY" scripts/gen_models.py --large >/dev/null ||
      die "scripts/gen_models.py --large failed"
  fi
  local libs
  libs=$(
    {
      tr ':' '\n' <<<"${FERMATA_CUDA_LIBS:-}"
      find -L .deps/gpu/nvidia -maxdepth 3 -type d -name lib 2>/dev/null
    } | grep -v '^$' | paste -sd: -
  )
  PY=$PY LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" bash -c "$1" 2>&1 | tee "$RES/sh.log"
  return "${PIPESTATUS[0]}"
}

cmd_cpu16() {
  local budget=420 small=0 parts=sched1k,sched4k,tcp,door,over,large
  while (($#)); do
    case $1 in
      --budget-s)
        budget=$2
        shift
        ;;
      --parts)
        parts=$2
        shift
        ;;
      --small) small=1 ;;
      *) die "cpu16: unknown argument $1" ;;
    esac
    shift
  done
  [[ $budget =~ ^[0-9]+$ ]] || die "--budget-s must be whole seconds"
  # Each part's weight in the budget, in percent of the first five (a search at
  # 4,096 GPUs probes up to 16 M r/s and takes longest); `large` comes on top.
  local -A weight=([sched1k]=16 [sched4k]=28 [tcp]=28 [door]=20 [over]=8 [large]=24)
  local -A want=()
  local p total=0
  for p in ${parts//,/ }; do
    [[ -n ${weight[$p]:-} ]] || die "cpu16: unknown part $p (sched1k, sched4k, tcp, door, over, large)"
    [[ -n ${want[$p]:-} ]] || total=$((total + weight[$p]))
    want[$p]=1
  done
  ((total > 0)) || die "cpu16: --parts names no part"
  unpack
  # `bench http` serves with the onnx executor: ONNX Runtime's library from the
  # bundle (the GPU build runs on the CPU as well).
  if [[ -z ${ORT_DYLIB_PATH:-} ]]; then
    ORT_DYLIB_PATH=$(compgen -G "$DEV/gpu/onnxruntime/capi/libonnxruntime.so.*" | head -n 1)
    export ORT_DYLIB_PATH
  fi
  local BIN=$DEV/bin/fermata n
  n=$(nproc)
  rm -rf out/cpu16
  mkdir -p "$RES" out/cpu16
  local t0=$SECONDS log=$RES/cpu16.log
  : >"$log"
  left() { echo $((budget - (SECONDS - t0))); }
  run() { # run NAME SECONDS CMD...: the part's command under a time limit
    local name=$1 lim=$2
    shift 2
    if (($(left) < 15)); then
      say "skipped $name: the budget is spent" | tee -a "$log"
      return
    fi
    ((lim > $(left))) && lim=$(left)
    say "$name (at most ${lim} s): $*" | tee -a "$log"
    timeout -k 5 "$lim" "$@" >"out/cpu16/$name.out" 2>"out/cpu16/$name.err"
    local rc=$?
    cat "out/cpu16/$name.out" >>"$log"
    grep -v '^\s*$' "out/cpu16/$name.err" | tail -n 40 >>"$log"
    say "$name: exit $rc after $((SECONDS - t0)) s in all" | tee -a "$log"
  }
  say "cpu16 on $n CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), budget ${budget} s, parts $parts" | tee -a "$log"
  local half=$((n / 2))
  ((half >= 1)) || half=1
  local models=64 gpus=1024 dur=1 start=2000000 sdur=3 swarm=2 hdur=3 mlp_rates=16000,32000,64000,96000 cnn_rates=4000,8000,10000,12000
  # Past capacity (1.5 x and 2 x the sustained rates last measured on 16 cores):
  # the door's refusals and the good answers kept.
  local mlp_over=144000,192000 cnn_over=13500,18000
  if ((small)); then
    models=8 gpus=64 start=250000 sdur=1 swarm=1 hdur=1 mlp_rates=500,1000 cnn_rates=200,500 mlp_over=2000 cnn_over=1000
  fi
  # A run's share of the budget: its percent of all parts' (sched1k 4 x 4,
  # sched4k 4 x 7, tcp 2 x 14, door 2 x 10, over 2 x 4, large 3 x 8), scaled to
  # the parts run.
  share() { echo $((budget * $1 / total)); }
  # 1. The scheduler alone, 1 to 8 sub-clusters.
  # With the default profile (A100 ResNet50V2) 1,024 emulated GPUs serve about
  # 5 M r/s, so the scheduler's own limit shows only with 4 x the GPUs.
  local L gen g
  for g in "$gpus" $((gpus * 4)); do
    if ((g > gpus)); then [[ -n ${want[sched4k]:-} ]] || continue; else [[ -n ${want[sched1k]:-} ]] || continue; fi
    for L in 1 2 4 8; do
      # Generator threads beside the 2 L scheduler threads: 2 to 4.
      gen=$((n - 2 * L))
      ((gen > 4)) && gen=4
      ((gen < 2)) && gen=2
      local pct=4
      ((g > gpus)) && pct=7
      run "sched_G${g}_L$L" "$(share $pct)" "$BIN" bench scheduler --models "$models" --gpus "$g" --threads 1 \
        --subclusters "$L" --gen-threads "$gen" --find-max --start-rate "$start" --duration-s "$dur" --json
    done
  done
  # 2. Processes over loopback TCP against the simulator.
  [[ -n ${want[tcp]:-} ]] && run tcp_1x1 "$(share 14)" "$BIN" bench goodput --workload configs/workloads/resnet50_8gpu.toml --runtime tcp \
    --frontends 1 --backends 1 --settle-s 1 --duration-s "$sdur" --warmup-s "$swarm" --tolerance 0.05 --json
  [[ -n ${want[tcp]:-} ]] && run tcp_2x2 "$(share 14)" "$BIN" bench goodput --workload configs/workloads/resnet50_8gpu.toml --runtime tcp \
    --frontends 2 --backends 2 --settle-s 1 --duration-s "$sdur" --warmup-s "$swarm" --tolerance 0.05 --json
  # 3. The front door, server and client on disjoint CPUs.
  local srv="0-$((half - 1))" cli="$half-$((n - 1))"
  ((n >= 2)) || cli=0
  [[ -n ${want[door]:-} ]] && run http_mlp "$(share 10)" "$BIN" bench http --models models --model mlp --rates "$mlp_rates" \
    --duration-s "$hdur" --warmup-s 1 --reps 2 --server-cpus "$srv" --client-cpus "$cli" --json
  [[ -n ${want[door]:-} ]] && run http_cnn "$(share 10)" "$BIN" bench http --models models --model cnn --rates "$cnn_rates" \
    --duration-s "$hdur" --warmup-s 1 --reps 2 --server-cpus "$srv" --client-cpus "$cli" --json
  [[ -n ${want[over]:-} ]] && run http_mlp_over "$(share 4)" "$BIN" bench http --models models --model mlp --rates "$mlp_over" \
    --duration-s "$hdur" --warmup-s 1 --reps 1 --server-cpus "$srv" --client-cpus "$cli" --json
  [[ -n ${want[over]:-} ]] && run http_cnn_over "$(share 4)" "$BIN" bench http --models models --model cnn --rates "$cnn_over" \
    --duration-s "$hdur" --warmup-s 1 --reps 1 --server-cpus "$srv" --client-cpus "$cli" --json
  # 4. Large inputs over TCP: the goodput with 602,112-byte inputs against
  # default inputs, in one run each; the 1-GPU one again with four pull
  # connections and four TCP worker threads.
  local w
  for w in configs/workloads/resnet50_h100_1gpu.toml default; do
    [[ -n ${want[large]:-} ]] || continue
    run "large_tcp_$(basename "$w" .toml)" "$(share 8)" "$BIN" bench serve --workload "$w" --transport tcp \
      --input-bytes 602112 --duration-s "$sdur" --warmup-s 1 --tolerance 0.05 --json
  done
  [[ -n ${want[large]:-} ]] && run large_tcp_resnet50_h100_1gpu_x4 "$(share 8)" env FERMATA_TCP_PULL_STREAMS=4 FERMATA_TCP_THREADS=4 \
    "$BIN" bench serve --workload configs/workloads/resnet50_h100_1gpu.toml --transport tcp \
    --input-bytes 602112 --duration-s "$sdur" --warmup-s 1 --tolerance 0.05 --json
  python3 - "$RES/cpu16.json" out/cpu16 "$n" <<'PY' || say "could not write $RES/cpu16.json"
import glob, json, os, sys
dst, d, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
res = {"cpus": n}
for f in sorted(glob.glob(f"{d}/*.out")):
    name = os.path.basename(f)[:-4]
    try:
        res[name] = json.load(open(f))
    except ValueError:
        # --json output is one document; anything else is kept as text
        res[name] = {"text": open(f).read()[-4000:]}
json.dump(res, open(dst, "w"), indent=1)
PY
  tar -czf "$RES/cpu16.tar.gz" out/cpu16 2>/dev/null
  say "cpu16 done in $((SECONDS - t0)) s; results in $RES (cpu16.log, cpu16.json, cpu16.tar.gz)"
}

case ${1:-} in
  stash)
    shift
    stash "$@"
    ;;
  gpu)
    shift
    cmd_gpu "$@"
    ;;
  cpu16)
    shift
    cmd_cpu16 "$@"
    ;;
  sh)
    shift
    cmd_sh "$@"
    ;;
  -h | --help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
