#!/usr/bin/env python3
"""Model control under load: `fermata serve --executor onnx
--model-control-mode explicit --load-model OTHER` over a repository of two
models, OTHER (default mlp) under a steady request rate while MODEL (default
resnet50) is loaded and unloaded CYCLES times over HTTP. Prints, per cycle,
the time from the load request to its answer (the model ready on every GPU)
and from the unload request to its answer (the model unloaded, its sessions
dropped), the server's resident memory before the first load, with MODEL
loaded and after each unload, and the other model's requests: sent, good,
and failed by status, and when they failed (during a load, during an
unload, or neither).

    python3 scripts/model_control_cycles.py target/release/fermata \\
        [--cycles 20] [--rate 100] [--model resnet50] [--other mlp] \\
        [--model-slo-ms MS]

--model-slo-ms serves MODEL under another SLO than its repository file's (a
copy of its .json with `slo_ms` changed): on a CPU whose l(1) for MODEL is
above the SLO written for a GPU (resnet50's 50 ms), `serve` refuses the
model, and the cycles measure loading and unloading, not the SLO.

Needs the python packages scripts/setup.sh installs (requests) on PYTHONPATH
(.deps/py) and ONNX Runtime for the onnx executor.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def repo_of(models, slo_ms=None):
    """A repository folder with each model's files linked from models/ or
    models/large/; `slo_ms` maps a model to the SLO its copied .json gets."""
    slo_ms = slo_ms or {}
    d = tempfile.mkdtemp(prefix="fermata-control-")
    for m in models:
        for src in (os.path.join(ROOT, "models"), os.path.join(ROOT, "models", "large")):
            if os.path.exists(os.path.join(src, f"{m}.onnx")):
                for f in os.listdir(src):
                    if not f.startswith(f"{m}.") or f.endswith(".ref.json"):
                        continue
                    if f == f"{m}.json" and m in slo_ms:
                        meta = json.load(open(os.path.join(src, f)))
                        meta["slo_ms"] = slo_ms[m]
                        with open(os.path.join(d, f), "w") as out:
                            json.dump(meta, out, indent=2)
                    else:
                        os.symlink(os.path.join(src, f), os.path.join(d, f))
                break
        else:
            sys.exit(f"no model {m} in models/ or models/large/")
    return d


def other_input(models_dir, name):
    meta = json.load(open(os.path.join(models_dir, f"{name}.json")))
    inputs = []
    for t in meta["inputs"]:
        shape = [1] + [d for d in t["shape"][1:]]
        n = 1
        for d in shape:
            n *= d
        data = [0] * n if t["datatype"].startswith(("INT", "UINT")) else [0.5] * n
        inputs.append({"name": t["name"], "shape": shape, "datatype": t["datatype"], "data": data})
    return {"inputs": inputs}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fermata")
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--other", default="mlp")
    ap.add_argument("--model-slo-ms", type=float, default=None)
    a = ap.parse_args()
    if a.model_slo_ms is not None and not 0 < a.model_slo_ms <= 60_000:
        sys.exit("--model-slo-ms must be in (0, 60000]")
    slo = {a.model: a.model_slo_ms} if a.model_slo_ms is not None else {}
    repo = repo_of([a.model, a.other], slo)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    srv = subprocess.Popen(
        [a.fermata, "serve", "--models", repo, "--executor", "onnx", "--http-port", str(port),
         "--model-control-mode", "explicit", "--load-model", a.other],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while True:
            try:
                if requests.get(f"{base}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline or srv.poll() is not None:
                sys.exit("the server did not become ready")
            time.sleep(0.1)
        body = other_input(repo, a.other)
        counts = {"sent": 0, "good": 0, "failed": {}}
        failures = []  # (send time, status)
        stop = threading.Event()

        def load_other():
            s = requests.Session()
            period = 1.0 / a.rate
            nxt = time.time()
            while not stop.is_set():
                nxt += period
                counts["sent"] += 1
                sent = time.time()
                try:
                    r = s.post(f"{base}/v2/models/{a.other}/infer", json=body, timeout=10)
                    k = r.status_code
                except requests.RequestException as e:
                    k = type(e).__name__
                if k == 200:
                    counts["good"] += 1
                else:
                    counts["failed"][k] = counts["failed"].get(k, 0) + 1
                    failures.append((sent, k))
                time.sleep(max(0.0, nxt - time.time()))

        t = threading.Thread(target=load_other)
        t.start()
        time.sleep(1.0)
        rss0 = rss_mib(srv.pid)
        loads, unloads, loaded_rss, after_rss = [], [], [], []
        spans = []  # (start, end, "load" | "unload")
        for i in range(a.cycles):
            t0 = time.time()
            r = requests.post(f"{base}/v2/repository/models/{a.model}/load", timeout=600)
            t1 = time.time()
            if r.status_code != 200:
                sys.exit(f"load {i}: {r.status_code} {r.text}")
            loaded_rss.append(rss_mib(srv.pid))
            r = requests.post(f"{base}/v2/repository/models/{a.model}/unload", timeout=600)
            t2 = time.time()
            if r.status_code != 200:
                sys.exit(f"unload {i}: {r.status_code} {r.text}")
            time.sleep(0.2)
            after_rss.append(rss_mib(srv.pid))
            spans += [(t0, t1, "load"), (t1, t2, "unload")]
            loads.append(1000 * (t1 - t0))
            unloads.append(1000 * (t2 - t1))
            print(f"cycle {i + 1:2d}: load to ready {loads[-1]:8.1f} ms, unload to unloaded "
                  f"{unloads[-1]:7.1f} ms, RSS loaded {loaded_rss[-1]:7.1f} MiB, "
                  f"after unload {after_rss[-1]:7.1f} MiB", flush=True)
        stop.set()
        t.join()
        print(f"load to ready: median {statistics.median(loads):.1f} ms, max {max(loads):.1f} ms")
        print(f"unload to unloaded: median {statistics.median(unloads):.1f} ms, "
              f"max {max(unloads):.1f} ms")
        print(f"RSS: {rss0:.1f} MiB before the first load, median {statistics.median(loaded_rss):.1f}"
              f" loaded, median {statistics.median(after_rss):.1f} after an unload, "
              f"{after_rss[-1]:.1f} after the last")
        print(f"{a.other} at {a.rate:g} r/s: {counts['sent']} sent, {counts['good']} good, "
              f"failed {counts['failed'] or 0}")
        when = {"load": 0, "unload": 0, "neither": 0}
        for ft, _ in failures:
            k = next((kind for (s0, s1, kind) in spans if s0 <= ft < s1), "neither")
            when[k] += 1
        print(f"{a.other}'s failures sent during a load {when['load']}, during an unload "
              f"{when['unload']}, neither {when['neither']}")
        return 0 if not counts["failed"] else 1
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()


if __name__ == "__main__":
    sys.exit(main())
