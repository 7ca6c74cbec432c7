#!/usr/bin/env bash
# Installs or checks everything Fermata needs to build, test and run its demo.
# Idempotent: safe to run any number of times; does nothing when all is in place.
#
# Today the crate needs only a Rust toolchain (cargo, rustc >= the rust-version in
# Cargo.toml) plus rustfmt and clippy for CI. System packages that later features
# need (e.g. RDMA or ONNX Runtime libraries) go into APT_PACKAGES below; apt is only
# touched when one of them is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian/Ubuntu packages the build needs (none yet).
APT_PACKAGES=()

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# rustup installs into ~/.cargo/bin, which a non-login shell may not have on PATH.
if [[ -d "${CARGO_HOME:-$HOME/.cargo}/bin" ]]; then
  export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi

# --- system packages (skipped when nothing is missing) ---------------------------
missing=()
for p in "${APT_PACKAGES[@]+"${APT_PACKAGES[@]}"}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  command -v apt-get >/dev/null || die "missing system packages: ${missing[*]} (no apt-get here; install them by hand)"
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "missing system packages: ${missing[*]}; run as root or install sudo"
    sudo=(sudo)
  fi
  say "installing system packages: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  say "system packages: nothing to install"
fi

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
say "ok"
