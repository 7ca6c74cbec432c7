#!/usr/bin/env python3
"""Checks a running Fermata HTTP frontend with a real KServe v2 client.

For every model in the repository (models/*.json) it makes a few seeded random
inputs, runs the model directly with ONNX Runtime in Python, sends the same
inputs to Fermata with Triton's `tritonclient.http` (once as JSON tensors, once
with the binary tensor extension), and compares the outputs.

    bash scripts/setup.sh                  # installs onnxruntime, tritonclient into .deps/py
    fermata serve --executor onnx --http-port 8000 &
    PYTHONPATH=.deps/py python3 scripts/check_http.py --url 127.0.0.1:8000

Exit status 0 when every output matches (relative 1e-5, absolute 1e-6), 1 when
one does not, 2 on a usage or connection problem. Prints one line per model
and request with the largest absolute difference.
"""

import argparse
import glob
import json
import os
import sys

import numpy as np

try:
    import onnxruntime as ort
    import tritonclient.http as httpclient
except ImportError as e:  # pragma: no cover - a setup problem, said plainly
    sys.exit(f"check_http: {e}; run scripts/setup.sh and set PYTHONPATH=.deps/py")

NP = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32,
      "UINT8": np.uint8, "INT8": np.int8, "BOOL": np.bool_, "FP16": np.float16}


def sample(meta, rng):
    """One request: a batch of 1 for every input, in the model's layout."""
    out = {}
    for t in meta["inputs"]:
        shape = [1] + t["shape"][1:]
        dt = t["datatype"]
        if dt.startswith("FP"):
            v = rng.uniform(-1.0, 1.0, size=shape).astype(NP[dt])
        elif dt == "BOOL":
            v = rng.integers(0, 2, size=shape).astype(np.bool_)
        else:
            v = rng.integers(0, 8, size=shape).astype(NP[dt])
        out[t["name"]] = v
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="127.0.0.1:8000", help="host:port of the HTTP frontend")
    ap.add_argument("--models", default="models", help="the model repository")
    ap.add_argument("--requests", type=int, default=3, help="requests per model and encoding")
    ap.add_argument("--retries", type=int, default=0,
                    help="send a request again this many times when it is dropped (429) or "
                         "late (504); counted apart from wrong outputs")
    ap.add_argument("--timeout-us", type=int, default=0,
                    help="the request's `timeout` parameter (us); 0: the model's default SLO")
    ap.add_argument("--rtol", type=float, default=1e-5,
                    help="relative tolerance (a GPU computing in TF32 or FP16 needs about 1e-2)")
    ap.add_argument("--atol", type=float, default=1e-6, help="absolute tolerance")
    a = ap.parse_args()

    metas = sorted(glob.glob(os.path.join(a.models, "*.json")))
    metas = [m for m in metas if not m.endswith(".ref.json") and ".profile-" not in m]
    if not metas:
        print(f"check_http: no model metadata in {a.models}", file=sys.stderr)
        return 2
    try:
        client = httpclient.InferenceServerClient(url=a.url)
        if not client.is_server_live():
            print(f"check_http: {a.url} is not live", file=sys.stderr)
            return 2
    except Exception as e:  # noqa: BLE001 - any connection problem
        print(f"check_http: cannot reach {a.url}: {e}", file=sys.stderr)
        return 2

    rng = np.random.default_rng(20261122)
    bad = 0
    deadline_misses = 0
    for path in metas:
        meta = json.load(open(path))
        name = meta["name"]
        try:
            sess = ort.InferenceSession(os.path.join(a.models, name + ".onnx"),
                                       providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - e.g. FP16 kernels the CPU provider lacks
            print(f"{name}: not checked: ONNX Runtime's CPU provider cannot run it ({e})")
            continue
        if not client.is_model_ready(name):
            print(f"{name}: not ready at {a.url}")
            bad += 1
            continue
        served = client.get_model_metadata(name)
        got_in = [(t["name"], t["datatype"]) for t in served["inputs"]]
        want_in = [(t["name"], t["datatype"]) for t in meta["inputs"]]
        if got_in != want_in:
            print(f"{name}: metadata inputs {got_in} != {want_in}")
            bad += 1
        for binary in (False, True):
            for i in range(a.requests):
                x = sample(meta, rng)
                ref = sess.run([t["name"] for t in meta["outputs"]], x)
                inputs = []
                for t in meta["inputs"]:
                    v = x[t["name"]]
                    inp = httpclient.InferInput(t["name"], list(v.shape), t["datatype"])
                    inp.set_data_from_numpy(v, binary_data=binary)
                    inputs.append(inp)
                outputs = [httpclient.InferRequestedOutput(t["name"], binary_data=binary)
                           for t in meta["outputs"]]
                params = {"timeout": a.timeout_us} if a.timeout_us else None
                res = None
                for attempt in range(a.retries + 1):
                    try:
                        res = client.infer(name, inputs, outputs=outputs, parameters=params)
                        break
                    except Exception as e:  # noqa: BLE001 - report and go on
                        status = getattr(e, "status", lambda: None)()
                        tag = f"{name} {'binary' if binary else 'json  '} #{i}"
                        if str(status) in ("429", "504") and attempt < a.retries:
                            print(f"{tag}: {status}, sending it again: {e}")
                            deadline_misses += 1
                            continue
                        print(f"{tag}: FAILED: {e}")
                        bad += 1
                        break
                if res is None:
                    continue
                worst = 0.0
                ok = True
                for t, r in zip(meta["outputs"], ref):
                    got = res.as_numpy(t["name"])
                    if got is None or got.shape != r.shape:
                        ok = False
                        print(f"{name}: output {t['name']} shape "
                              f"{None if got is None else got.shape} != {r.shape}")
                        continue
                    worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - r))))
                    ok &= bool(np.allclose(got.astype(np.float64), r.astype(np.float64),
                                           rtol=a.rtol, atol=a.atol))
                bad += 0 if ok else 1
                print(f"{name} {'binary' if binary else 'json  '} #{i}: "
                      f"{'ok ' if ok else 'MISMATCH'} max |diff| {worst:.3g}")
    print(f"{'all outputs match' if bad == 0 else f'{bad} problems'}"
          f" ({deadline_misses} requests dropped or late and sent again)")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
