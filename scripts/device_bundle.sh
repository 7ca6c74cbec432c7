#!/usr/bin/env bash
# Packs what a GPU host without a Rust toolchain or registry access needs to run
# the GPU and many-core checks (scripts/device_run.sh), in chunks small enough
# for a transfer limit:
#
#   bash scripts/device_bundle.sh [--out DIR] [--chunk-mib N] [--python X.Y]
#
# 1. builds the release binary with the `cuda` feature (unless $FERMATA_BIN names
#    one) and strips it;
# 2. downloads, for the GPU host's Python (--python, 3.12), the onnxruntime-gpu
#    wheel (the version scripts/setup.sh pins) and the wheels of tritonclient's
#    HTTP client that the checks use, into .deps/device/wheels (kept: a second run
#    downloads nothing). ONNX Runtime's Python package is unpacked from its wheel
#    (without the TensorRT provider, which the checks do not use): the fermata
#    binary loads its libonnxruntime.so and CUDA provider, Python imports it as
#    the reference. The CUDA 13 runtime, cuBLAS, cuFFT, cuRAND and cuDNN 9 are
#    not packed: the GPU host must have them (scripts/device_run.sh looks for
#    NVIDIA's wheels in its Python's site-packages, or FERMATA_CUDA_LIBS);
# 3. writes one zstd-compressed tar, split into chunks of at most --chunk-mib MiB
#    (56: a chunk and a checkout of about 5 MB fit a 64 MiB transfer), each in
#    a folder of its own (DIR/c01, DIR/c02, ...) with the whole stream's
#    SHA256SUMS beside it, so that each transfer can carry one folder.
#
# DIR defaults to .bundle (ignored by git). It prints the chunks and their sizes.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=.bundle CHUNK_MIB=56 PYV=3.12
while (($#)); do
  case $1 in
    --out) OUT=$2; shift ;;
    --chunk-mib) CHUNK_MIB=$2; shift ;;
    --python) PYV=$2; shift ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "device_bundle: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $CHUNK_MIB =~ ^[0-9]+$ && $CHUNK_MIB -ge 1 ]] || { echo "device_bundle: --chunk-mib must be a positive integer" >&2; exit 2; }
[[ $PYV =~ ^3\.[0-9]+$ ]] || { echo "device_bundle: --python must look like 3.12" >&2; exit 2; }

say() { printf '[device_bundle] %s\n' "$*"; }
die() { printf '[device_bundle] ERROR: %s\n' "$*" >&2; exit 1; }
for t in zstd tar sha256sum split strip python3; do
  command -v $t >/dev/null || die "$t is needed (apt-get install zstd binutils)"
done

# The version scripts/setup.sh --gpu installs, so both builds speak one C API.
ORT_PIN=$(sed -n 's/^GPU_PINS=("onnxruntime-gpu\[cuda,cudnn\]==\([0-9.]*\)")$/\1/p' scripts/setup.sh)
[[ -n $ORT_PIN ]] || die "cannot read the onnxruntime-gpu pin from scripts/setup.sh (GPU_PINS)"
# tritonclient's HTTP client and what it needs beyond a PyTorch image's packages.
PY_PINS=(tritonclient==2.73.0 geventhttpclient==2.6.1 gevent==26.9.0 greenlet==3.3.2
  zope.event==6.2 zope.interface==8.7 brotli==1.2.1 python-rapidjson==1.25)
# Python's zstd decoder, for a host without the zstd command.
ZSTD_PY_PIN=0.25.0

# 1. The binary.
if [[ -n ${FERMATA_BIN:-} ]]; then
  BIN=$FERMATA_BIN
else
  say "cargo build --release --features cuda"
  cargo build --release --features cuda --bin fermata
  BIN=target/release/fermata
fi
[[ -x $BIN ]] || die "no binary at $BIN"

# 2. The wheels.
WH=.deps/device/wheels
mkdir -p "$WH"
cpv=cp${PYV/./}
pipdl() {
  PIP_ROOT_USER_ACTION=ignore python3 -m pip download --disable-pip-version-check --no-input -q \
    --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 -d "$WH" "$@"
}
ort_whl=$(compgen -G "$WH/onnxruntime_gpu-$ORT_PIN-$cpv-*.whl" | head -n 1 || true)
if [[ -z $ort_whl ]]; then
  say "downloading onnxruntime-gpu==$ORT_PIN for Python $PYV"
  pipdl "onnxruntime-gpu==$ORT_PIN" || die "pip download onnxruntime-gpu==$ORT_PIN failed"
  ort_whl=$(compgen -G "$WH/onnxruntime_gpu-$ORT_PIN-$cpv-*.whl" | head -n 1)
fi
if ! compgen -G "$WH/zstandard-$ZSTD_PY_PIN-$cpv-*.whl" >/dev/null; then
  say "downloading zstandard==$ZSTD_PY_PIN for Python $PYV"
  pipdl "zstandard==$ZSTD_PY_PIN" || die "pip download zstandard==$ZSTD_PY_PIN failed"
fi
for pin in "${PY_PINS[@]}"; do
  name=${pin%%==*} ver=${pin#*==}
  norm=$(tr '.-' '__' <<<"$name")
  if ! compgen -G "$WH/${norm}-${ver}-*.whl" >/dev/null && ! compgen -G "$WH/${name}-${ver}-*.whl" >/dev/null; then
    say "downloading $pin for Python $PYV"
    pipdl "$pin" || die "pip download $pin failed"
  fi
done

# 3. Stage and pack.
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/gpu" "$STAGE/wheels"
strip -o "$STAGE/bin/fermata" "$BIN"
for pin in "${PY_PINS[@]}"; do
  name=${pin%%==*} ver=${pin#*==}
  norm=$(tr '.-' '__' <<<"$name")
  cp $(compgen -G "$WH/${norm}-${ver}-*.whl" || compgen -G "$WH/${name}-${ver}-*.whl") "$STAGE/wheels/"
done
python3 - "$ort_whl" "$STAGE/gpu" <<'PY'
import os, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
n = 0
with zipfile.ZipFile(whl) as z:
    for i in z.infolist():
        name = i.filename
        if not name.startswith("onnxruntime/") or name.endswith("/"):
            continue
        if "providers_tensorrt" in name:
            continue
        dst = os.path.join(out, name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(z.read(i))
        if name.endswith(".so") or ".so." in name:
            os.chmod(dst, 0o755)
        n += 1
print(f"[device_bundle] onnxruntime package: {n} files")
PY
printf 'fermata %s\nonnxruntime-gpu %s (python %s)\nbuilt %s\n' \
  "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src bin Cargo.toml Cargo.lock || echo +dirty)" \
  "$ORT_PIN" "$PYV" "$(date -u +%FT%TZ)" >"$STAGE/VERSION"

rm -rf "$OUT"
mkdir -p "$OUT"
say "compressing (zstd -19 --long=27) into chunks of $CHUNK_MIB MiB"
tar -C "$STAGE" -cf - VERSION bin wheels gpu | zstd -q -19 --long=27 -T0 -c >"$OUT/bundle.tar.zst"
(cd "$OUT" && sha256sum bundle.tar.zst >SHA256SUMS)
split -b "${CHUNK_MIB}M" -d -a 2 --numeric-suffixes=1 "$OUT/bundle.tar.zst" "$OUT/part."
rm "$OUT/bundle.tar.zst"
for p in "$OUT"/part.*; do
  d="$OUT/c${p##*.}"
  mkdir -p "$d"
  mv "$p" "$d/"
  cp "$OUT/SHA256SUMS" "$d/"
done
rm "$OUT/SHA256SUMS"
# The zstandard wheel (uncompressed) beside the last chunk: a host without the zstd
# command decompresses with it.
zst_whl=$(compgen -G "$WH/zstandard-$ZSTD_PY_PIN-$cpv-*.whl" | head -n 1)
cp "$zst_whl" "$(ls -d "$OUT"/c* | tail -n 1)/"
say "chunks (carry one folder per transfer):"
du -sh "$OUT"/c* | sed 's/^/[device_bundle]   /'
