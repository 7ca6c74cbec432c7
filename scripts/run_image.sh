#!/usr/bin/env bash
# Runs the CPU image that scripts/build_image.sh made and checks it: it
# unpacks the OCI layout with umoci into a runtime bundle, starts
# `fermata serve --executor onnx` from it with runc (the OCI runtime, as
# podman and containerd use it; host network, the image's user and
# environment), waits for readiness, checks every shipped model over HTTP
# against ONNX Runtime (scripts/check_http.py with tritonclient), checks that
# the server runs as the image's non-root user, and stops it with SIGTERM.
#
#   bash scripts/run_image.sh [--image DIR] [--runner runc|chroot]
#
#   --image DIR    the OCI layout (default target/image/oci), tag fermata-cpu
#   --runner R     runc (default), or chroot: the unpacked root filesystem
#                  under unshare (new mount and PID namespaces) and chroot
#                  with the image's user, where no OCI runtime can run
#
# Prints the image's size, the time from start to ready and each check; exits
# 0 when every check passes. Needs root, umoci, runc and .deps/py (scripts/setup.sh
# installs them).
set -euo pipefail
cd "$(dirname "$0")/.."

image=target/image/oci
runner=runc
while [[ $# -gt 0 ]]; do
  case "$1" in
    --image) image="$2"; shift 2 ;;
    --runner) runner="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$runner" in runc|chroot) ;; *) echo "run_image.sh: --runner runc|chroot" >&2; exit 2 ;; esac
for tool in umoci python3 $([[ $runner == runc ]] && echo runc); do
  command -v "$tool" >/dev/null || {
    echo "run_image.sh: $tool is not installed: run bash scripts/setup.sh" >&2
    exit 1
  }
done
[[ -f "$image/index.json" ]] || {
  echo "run_image.sh: no OCI layout at $image: run bash scripts/build_image.sh" >&2
  exit 1
}

work=$(mktemp -d /tmp/fermata-image.XXXXXX)
id="fermata-check-$$"
pid=""
cleanup() {
  if [[ $runner == runc ]]; then
    runc kill "$id" KILL 2>/dev/null || true
    runc delete -f "$id" 2>/dev/null || true
  elif [[ -n "$pid" ]]; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

compressed=$(du -sb "$image/blobs" | cut -f1)
umoci unpack --image "$image:fermata-cpu" "$work/bundle" >/dev/null
unpacked=$(du -sb "$work/bundle/rootfs" | cut -f1)
echo "image: $((compressed / 1024 / 1024)) MiB of compressed layers, $((unpacked / 1024 / 1024)) MiB unpacked"

# The server as the image would run it with `serve --executor onnx
# --http-port 0`: the image's user, working directory and environment, the
# host's network (the check connects over loopback).
serve=(fermata serve --executor onnx --http-port 0)
python3 - "$work/bundle/config.json" "${serve[@]}" <<'EOF'
import json, sys
path, args = sys.argv[1], sys.argv[2:]
c = json.load(open(path))
c["process"]["terminal"] = False
c["process"]["args"] = args
c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] != "network"]
json.dump(c, open(path, "w"))
EOF
read -r user workdir env < <(python3 - "$work/bundle/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
p = c["process"]
print(f'{p["user"]["uid"]}:{p["user"]["gid"]}', p.get("cwd", "/"), ",".join(p["env"]))
EOF
)

log="$work/serve.log"
t0=$(date +%s.%N)
if [[ $runner == runc ]]; then
  runc run --bundle "$work/bundle" "$id" >"$log" 2>&1 &
  pid=$!
else
  IFS=, read -r -a envs <<<"$env"
  unshare --mount --pid --fork --mount-proc="$work/bundle/rootfs/proc" \
    chroot --userspec="$user" "$work/bundle/rootfs" \
    /usr/bin/env -i "${envs[@]}" sh -c "cd '$workdir' && exec ${serve[*]}" >"$log" 2>&1 &
  pid=$!
fi

addr=""
for _ in $(seq 600); do
  addr=$(grep -o 'http://[0-9.:]*' "$log" | head -n1 | sed 's|http://||') || true
  if [[ -n "$addr" ]] && python3 - "$addr" <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(f"http://{sys.argv[1]}/v2/health/ready", timeout=1)
except Exception:
    sys.exit(1)
EOF
  then break; fi
  addr=""
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
if [[ -z "$addr" ]]; then
  echo "run_image.sh: the server in the image did not become ready; its log:" >&2
  cat "$log" >&2
  exit 1
fi
t1=$(date +%s.%N)
echo "start to ready: $(python3 -c "print(f'{$t1 - $t0:.2f}')") s (runner $runner, HTTP at $addr)"

# The server's user, read from the kernel, not from the configuration.
if [[ $runner == runc ]]; then
  srv=$(runc state "$id" | python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])')
else
  srv=$(pgrep -f "fermata serve --executor onnx --http-port 0" | while read -r p; do
    [[ "$(readlink "/proc/$p/root")" == "$work/bundle/rootfs" ]] && echo "$p"; done | head -n1)
fi
[[ -n "$srv" ]] || { echo "run_image.sh: the server's process was not found" >&2; exit 1; }
uid=$(awk '/^Uid:/ {print $2}' "/proc/$srv/status")
if [[ "$uid" == 0 || "$uid" != "${user%%:*}" ]]; then
  echo "run_image.sh: the server runs as uid $uid, not the image's user ${user%%:*}" >&2
  exit 1
fi
echo "user: uid $uid (non-root)"

# Under the models' default SLOs (10 ms): on a loaded machine a request can be
# dropped or late several times running; those are sent again (up to 5 times)
# and counted apart from wrong outputs, which fail the check.
PYTHONPATH=.deps/py python3 scripts/check_http.py --url "$addr" --models models --requests 3 --retries 5

if [[ $runner == runc ]]; then runc kill "$id" TERM; else kill -TERM "$srv"; fi
for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$pid" 2>/dev/null; then
  echo "run_image.sh: the server did not stop within 10 s of SIGTERM" >&2
  exit 1
fi
echo "stopped on SIGTERM"
echo "ok"
