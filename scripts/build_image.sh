#!/usr/bin/env bash
# Builds Fermata's CPU container image without a Docker daemon, from Debian's
# package registry: mmdebstrap makes the root filesystem (Debian bookworm,
# minbase, with what deploy/docker/Dockerfile's final stage installs) and adds
# the binary, ONNX Runtime's CPU library and the shipped models; umoci writes
# it as an OCI image layout (a directory any OCI tool reads: `skopeo copy
# oci:DIR:fermata-cpu docker-daemon:fermata:cpu`, `podman load`, a registry
# push). The same contents as the Dockerfile, which stays for docker users.
#
#   bash scripts/build_image.sh [--out DIR] [--binary PATH] [--mirror URL]
#
#   --out DIR      where the image layout goes (default target/image); the
#                  image is DIR/oci, tag fermata-cpu
#   --binary PATH  the fermata binary to ship (default target/release/fermata,
#                  built if missing); it is stripped into the image
#   --mirror URL   the Debian mirror (default http://deb.debian.org/debian)
#
# Needs root (mmdebstrap's root mode) and mmdebstrap, umoci
# (scripts/setup.sh installs them). scripts/run_image.sh runs the
# image and checks every shipped model over HTTP inside it.
set -euo pipefail
cd "$(dirname "$0")/.."

out=target/image
binary=target/release/fermata
mirror=http://deb.debian.org/debian
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --mirror) mirror="$2"; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

for tool in mmdebstrap umoci; do
  command -v "$tool" >/dev/null || {
    echo "build_image.sh: $tool is not installed: run bash scripts/setup.sh" >&2
    exit 1
  }
done
if [[ $(id -u) -ne 0 ]]; then
  echo "build_image.sh: needs root (mmdebstrap --mode=root)" >&2
  exit 1
fi

# The ONNX Runtime pinned by scripts/setup.sh (tests/deploy.rs checks the pin).
ORT_VERSION=1.31.1
ort_lib=".deps/py/onnxruntime/capi/libonnxruntime.so.$ORT_VERSION"
if [[ ! -f "$ort_lib" ]]; then
  echo "build_image.sh: $ort_lib is missing: run bash scripts/setup.sh" >&2
  exit 1
fi
if [[ ! -x "$binary" ]]; then
  if [[ "$binary" == target/release/fermata ]]; then
    cargo build --release --locked --bin fermata
  else
    echo "build_image.sh: no binary at $binary" >&2
    exit 1
  fi
fi

rm -rf "$out"
mkdir -p "$out/stage/bin" "$out/stage/lib" "$out/stage/models"
strip -o "$out/stage/bin/fermata" "$binary"
cp "$ort_lib" "$out/stage/lib/"
cp models/*.onnx models/*.json "$out/stage/models/"
stage="$(cd "$out/stage" && pwd)"

# As debian:bookworm-slim: no manuals, documentation or translations (the
# copyright files stay), no apt lists.
mmdebstrap --mode=root --variant=minbase --quiet \
  --include=ca-certificates,libgomp1 \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook='chroot "$1" useradd --uid 65532 --shell /usr/sbin/nologin --user-group --home-dir /opt/fermata --no-create-home fermata' \
  --customize-hook="mkdir -p \"\$1/opt/fermata\" && cp -r '$stage/bin' '$stage/lib' '$stage/models' \"\$1/opt/fermata/\"" \
  --customize-hook='chown -R 0:0 "$1/opt/fermata" && chmod -R a+rX "$1/opt/fermata"' \
  --customize-hook='rm -rf "$1/var/lib/apt/lists/"* "$1/var/cache/apt/"* "$1/var/log/"*.log' \
  bookworm "$out/rootfs.tar" "$mirror"

img="$out/oci:fermata-cpu"
umoci init --layout "$out/oci"
umoci new --image "$img"
umoci unpack --image "$img" "$out/bundle"
tar -C "$out/bundle/rootfs" -xf "$out/rootfs.tar"
umoci repack --image "$img" "$out/bundle"
umoci config --image "$img" \
  --config.user 65532:65532 \
  --config.workingdir /opt/fermata \
  --config.env PATH=/opt/fermata/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env ORT_DYLIB_PATH=/opt/fermata/lib/libonnxruntime.so.$ORT_VERSION \
  --config.entrypoint fermata --config.cmd --help \
  --config.exposedports 7300/tcp --config.exposedports 7400/tcp \
  --config.exposedports 7401/tcp --config.exposedports 8000/tcp \
  --config.exposedports 8001/tcp --config.exposedports 9090/tcp \
  --config.label org.opencontainers.image.title=fermata \
  --config.label "org.opencontainers.image.version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
umoci gc --layout "$out/oci"
rm -rf "$out/bundle" "$out/stage" "$out/rootfs.tar"

size=$(du -sb "$out/oci/blobs" | cut -f1)
echo "image: $out/oci (tag fermata-cpu), $((size / 1024 / 1024)) MiB of compressed layers"
