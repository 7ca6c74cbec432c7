#!/usr/bin/env bash
# The whole GPU verification in one command, on any Linux host with an NVIDIA GPU
# and a checkout whose .deps/gpu already holds the wheels (`bash scripts/setup.sh
# --gpu` on a machine with registry access; the GPU host itself needs none):
#
#   bash scripts/gpu_check.sh [--skip-http] [--skip-goodput] [--cpu] [--repeats N]
#                             [--lanes E] [--quick]
#
# 1. profiles every shipped model (models/) and resnet50 / resnet50_fp16
#    (models/large/, generated when missing) with `fermata profile --executor
#    cuda` (mixed batch sizes, the profile written as STEM.profile-cuda.json), next
#    to ONNX Runtime's own same-shape latency from Python (scripts/ort_latency.py);
# 2. resnet50's device memory with all its buckets (sharing on and off) and with
#    one session;
# 3. the HTTP check of every model served by the cuda executor against ONNX
#    Runtime on the CPU (scripts/check_http.py; needs tritonclient importable);
# 4. a goodput search of resnet50 and resnet50_fp16, each alone on one GPU with
#    the cuda executor (`fermata bench serve`), next to the simulator's for the
#    measured profile (inputs pulled straight into page-locked buffers, the
#    default), and resnet50's again with each batch gathered into the model's
#    pinned buffer instead (FERMATA_CUDA_STAGE=0);
#    then, with --lanes E (2; 1 skips it), resnet50's d(b, E) (`fermata profile
#    --lanes E`) and its goodput with E lanes on the one GPU, next to the
#    simulator's for that profile;
# 5. with --cpu: resnet50 on the CPU executor against ONNX Runtime's CPU provider
#    (one thread each), at batch 1 and 8.
#
# --quick (for a GPU host held for minutes): 20 repeats, ONNX Runtime's reference for the
# ResNet-50s only, the memory of all buckets against one session only, and
# goodput searches of 3 s probes to 5%.
#
# Prints one table at the end; everything it ran is logged under out/gpu_check/.
# The binary: $FERMATA_BIN, else target/release/fermata (built with --features
# cuda). Python: $PYTHON, else python3 (with numpy and onnx; onnxruntime-gpu comes
# from .deps/gpu).
set -uo pipefail
cd "$(dirname "$0")/.."

HTTP=1 GOODPUT=1 CPU=0 REPEATS=50 LANES=2 QUICK=0
while (($#)); do
  case $1 in
    --skip-http) HTTP=0 ;;
    --skip-goodput) GOODPUT=0 ;;
    --cpu) CPU=1 ;;
    --repeats)
      REPEATS=$2
      shift
      ;;
    --lanes)
      LANES=$2
      shift
      ;;
    --quick) QUICK=1 ;;
    -h | --help)
      awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
      exit 0
      ;;
    *)
      echo "gpu_check: unknown argument $1 (see --help)" >&2
      exit 2
      ;;
  esac
  shift
done

[[ $REPEATS =~ ^[0-9]+$ && $REPEATS -ge 1 ]] || { echo "gpu_check: --repeats must be a positive integer" >&2; exit 2; }
[[ $LANES =~ ^[0-9]+$ && $LANES -ge 1 ]] || { echo "gpu_check: --lanes must be a positive integer" >&2; exit 2; }
SEARCH=(--duration-s 4 --warmup-s 1)
MEMS=("all:auto" "weights:auto" "none:auto" "all:64")
if ((QUICK)); then
  ((REPEATS > 20)) && REPEATS=20
  SEARCH=(--duration-s 3 --warmup-s 1 --tolerance 0.05)
  MEMS=("all:auto" "all:64")
fi

BIN=${FERMATA_BIN:-target/release/fermata}
PY=${PYTHON:-python3}
GC_OUT=out/gpu_check
mkdir -p "$GC_OUT"
say() { printf '[gpu_check] %s\n' "$*"; }
die() {
  printf '[gpu_check] ERROR: %s\n' "$*" >&2
  exit 1
}

[[ -x $BIN ]] || die "no fermata binary at $BIN (cargo build --release --features cuda, or set FERMATA_BIN)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/[gpu_check] GPU: /'

# Python's onnxruntime-gpu (the reference) comes from .deps/gpu; its CUDA libraries
# from the NVIDIA wheels there (FERMATA_CUDA_LIBS adds directories). fermata
# itself finds them without LD_LIBRARY_PATH.
libdirs=$(
  {
    tr ':' '\n' <<<"${FERMATA_CUDA_LIBS:-}"
    find -L .deps/gpu/nvidia -maxdepth 3 -type d -name lib 2>/dev/null
  } | grep -v '^$' | paste -sd: -
)
PYGPU=(env "PYTHONPATH=.deps/gpu${PYTHONPATH:+:$PYTHONPATH}" "LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$PY")
"${PYGPU[@]}" -c 'import onnxruntime as o; assert "CUDAExecutionProvider" in o.get_available_providers(), o.get_available_providers()' ||
  die "Python cannot use onnxruntime-gpu from .deps/gpu (bash scripts/setup.sh --gpu)"

if [[ ! -f models/large/resnet50.onnx || ! -f models/large/resnet50_fp16.onnx ]]; then
  say "writing models/large (resnet50, resnet50_fp16)"
  PYTHONPATH=.deps/py${PYTHONPATH:+:$PYTHONPATH} "$PY" scripts/gen_models.py --large >"$GC_OUT/gen_models.log" 2>&1 ||
    die "scripts/gen_models.py --large failed (see $GC_OUT/gen_models.log)"
fi

# 1. Profiles next to ONNX Runtime's own same-shape latency.
MODELS=(models/mlp.onnx models/cnn.onnx models/ranker.onnx models/large/resnet50.onnx models/large/resnet50_fp16.onnx)
for m in "${MODELS[@]}"; do
  stem=$(basename "$m" .onnx)
  say "profile $stem (cuda, mixed and same-shape batch sizes)"
  "$BIN" profile --model "$m" --executor cuda --repeats "$REPEATS" --warmup 5 --json \
    >"$GC_OUT/$stem.profile.json" 2>"$GC_OUT/$stem.profile.log" ||
    { cat "$GC_OUT/$stem.profile.log"; die "fermata profile $stem failed"; }
  grep WARNING "$GC_OUT/$stem.profile.log" || true
  if ((QUICK)) && [[ $stem != resnet50* ]]; then
    continue
  fi
  say "ONNX Runtime (Python) $stem, same shape every run"
  "${PYGPU[@]}" scripts/ort_latency.py --model "$m" --provider cuda --batch-sizes 1,8,32,64 \
    --repeats "$REPEATS" >"$GC_OUT/$stem.ort.jsonl" 2>"$GC_OUT/$stem.ort.log" ||
    { cat "$GC_OUT/$stem.ort.log"; die "ort_latency $stem failed"; }
done

# 2. Device memory of resnet50.
for v in "${MEMS[@]}"; do
  sh=${v%%:*} bk=${v#*:}
  "$BIN" profile --model models/large/resnet50.onnx --executor cuda --memory-only \
    --sharing "$sh" --buckets "$bk" >"$GC_OUT/mem_${sh}_${bk}.log" 2>&1 ||
    { cat "$GC_OUT/mem_${sh}_${bk}.log"; die "memory check ($v) failed"; }
done

# 3. HTTP against ONNX Runtime on the CPU.
http_status=skipped
if ((HTTP)); then
  http_status=ok
  for repo in models models/large; do
    port=$((18000 + RANDOM % 2000))
    log="$GC_OUT/serve_$(basename "$repo").log"
    "$BIN" serve --executor cuda --models "$repo" --http-port "$port" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do
      grep -q "HTTP API listening" "$log" && break
      kill -0 $pid 2>/dev/null || break
      sleep 0.1
    done
    if ! grep -q "HTTP API listening" "$log"; then
      cat "$log"
      kill $pid 2>/dev/null
      die "fermata serve --executor cuda --models $repo did not start"
    fi
    # The GPU runs TF32/FP16 where the CPU runs FP32: compare within 1e-2 relative.
    if ! PYTHONPATH=.deps/py${PYTHONPATH:+:$PYTHONPATH} "$PY" scripts/check_http.py --url "127.0.0.1:$port" \
      --models "$repo" --requests 3 --retries 2 --rtol 1e-2 --atol 1e-2 >"$GC_OUT/http_$(basename "$repo").log" 2>&1; then
      http_status="FAILED ($repo)"
    fi
    tail -n 1 "$GC_OUT/http_$(basename "$repo").log" | sed "s|^|[gpu_check] HTTP $repo: |"
    kill -TERM $pid 2>/dev/null
    wait $pid 2>/dev/null
  done
fi

# 4. Goodput of resnet50 (FP32, then FP16) alone on one GPU.
if ((GOODPUT)); then
  for stem in resnet50 resnet50_fp16; do
    dir="$GC_OUT/$stem"
    rm -rf "$dir" && mkdir -p "$dir"
    for f in "$stem.onnx" "$stem.json" "$stem.profile-cuda.json"; do
      ln -s "$PWD/models/large/$f" "$dir/$f"
    done
    say "goodput: $stem on one GPU, cuda executor vs the simulator"
    "$BIN" bench serve --models "$dir" --executor cuda --gpus 1 "${SEARCH[@]}" \
      >"$GC_OUT/goodput_$stem.txt" 2>"$GC_OUT/goodput_$stem.log" ||
      { cat "$GC_OUT/goodput_$stem.log"; die "bench serve $stem failed"; }
    cat "$GC_OUT/goodput_$stem.txt"
  done
  # The same FP32 search with each batch gathered into the model's pinned
  # buffer (FERMATA_CUDA_STAGE=0) instead of pulled straight into a staged one.
  stem=resnet50
  say "goodput: $stem on one GPU, each batch gathered into the model's pinned buffer (FERMATA_CUDA_STAGE=0)"
  FERMATA_CUDA_STAGE=0 "$BIN" bench serve --models "$GC_OUT/$stem" --executor cuda --gpus 1 "${SEARCH[@]}" \
    >"$GC_OUT/goodput_${stem}_gathered.txt" 2>"$GC_OUT/goodput_${stem}_gathered.log" ||
    { cat "$GC_OUT/goodput_${stem}_gathered.log"; die "bench serve $stem (gathered) failed"; }
  cat "$GC_OUT/goodput_${stem}_gathered.txt"
  # E lanes: d(b, E) measured, then the goodput with it.
  if ((LANES > 1)); then
    stem=resnet50 name=resnet50_lanes$LANES
    dir="$GC_OUT/$name"
    rm -rf "$dir" && mkdir -p "$dir"
    for f in "$stem.onnx" "$stem.json"; do
      ln -s "$PWD/models/large/$f" "$dir/$f"
    done
    say "profile $stem with $LANES lanes: d(b, $LANES)"
    "$BIN" profile --model models/large/$stem.onnx --executor cuda --lanes "$LANES" --repeats "$REPEATS" --warmup 5 --json --dry-run \
      >"$dir/$stem.profile-cuda.json" 2>"$GC_OUT/$name.profile.log" ||
      { cat "$GC_OUT/$name.profile.log"; die "fermata profile --lanes $LANES failed"; }
    cp "$dir/$stem.profile-cuda.json" "$GC_OUT/$name.profile.json"
    say "goodput: $stem on one GPU with $LANES lanes vs the simulator"
    "$BIN" bench serve --models "$dir" --executor cuda --gpus 1 --lanes "$LANES" "${SEARCH[@]}" \
      >"$GC_OUT/goodput_$name.txt" 2>"$GC_OUT/goodput_$name.log" ||
      { cat "$GC_OUT/goodput_$name.log"; die "bench serve $name failed"; }
    cat "$GC_OUT/goodput_$name.txt"
  fi
fi

# 5. The CPU executor against ONNX Runtime's CPU provider.
if ((CPU)); then
  say "CPU: resnet50, fermata onnx executor vs ONNX Runtime CPU provider (1 thread each)"
  FERMATA_ORT_THREADS=1 "$BIN" profile --model models/large/resnet50.onnx --executor onnx \
    --batch-sizes 1,8 --repeats 5 --warmup 2 --json --dry-run >"$GC_OUT/resnet50.cpu.profile.json" 2>"$GC_OUT/resnet50.cpu.log" ||
    die "cpu profile failed"
  "${PYGPU[@]}" scripts/ort_latency.py --model models/large/resnet50.onnx --provider cpu --threads 1 \
    --batch-sizes 1,8 --repeats 5 --warmup 2 >"$GC_OUT/resnet50.cpu.ort.jsonl" || die "cpu ort_latency failed"
fi

"$PY" - "$GC_OUT" "$http_status" <<'EOF'
import json, os, re, sys
out, http = sys.argv[1], sys.argv[2]
print()
print(f"{'model':<15} {'batch':>5} {'fermata mixed ms':>17} {'ORT same-shape ms':>18} {'ratio':>7} {'fermata same ms':>16}")
for stem in ["mlp", "cnn", "ranker", "resnet50", "resnet50_fp16"] + (["resnet50.cpu"] if os.path.exists(f"{out}/resnet50.cpu.ort.jsonl") else []):
    try:
        prof = json.load(open(f"{out}/{stem}.profile.json"))
        ort = {j["batch"]: j["median_ms"] for j in map(json.loads, open(f"{out}/{stem}.ort.jsonl"))}
    except (OSError, ValueError):
        continue
    same = prof.get("same_shape_median_ms") or [float("nan")] * len(prof["batch_sizes"])
    for b, m, s in zip(prof["batch_sizes"], prof["median_ms"], same):
        if b in ort:
            print(f"{stem:<15} {b:>5} {m:>17.3f} {ort[b]:>18.3f} {m / ort[b]:>7.3f} {s:>16.3f}")
print()
for f in sorted(os.listdir(out)):
    if f.startswith("mem_"):
        line = [l for l in open(f"{out}/{f}") if "device memory" in l]
        print(f"memory {f[4:-4]:<10} {line[0].strip() if line else 'n/a'}")
print(f"\nHTTP check against ONNX Runtime on the CPU: {http}")
for stem in sorted(f[8:-4] for f in os.listdir(out) if f.startswith("goodput_") and f.endswith(".txt")):
    if os.path.exists(f"{out}/goodput_{stem}.txt"):
        print()
        print(open(f"{out}/goodput_{stem}.txt").read().rstrip())
EOF
