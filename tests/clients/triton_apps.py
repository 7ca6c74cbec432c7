#!/usr/bin/env python3
"""Triton's own clients (tritonclient.http and tritonclient.grpc) against an
application: the ensemble `detect_classify` of models/apps (the detector's
patches that pass its threshold, each classified by `mlp`), served by
`fermata serve --executor onnx --models models/apps`.

    PYTHONPATH=.deps/py python3 tests/clients/triton_apps.py \
        --http 127.0.0.1:8000 --grpc 127.0.0.1:8001 --models models/apps [--failing]

Checks, over HTTP and gRPC: metadata, configuration and statistics of the
application; fan-out 0, 1 and many (and a batch of two samples); outputs equal
to running the detector and then mlp on its items with ONNX Runtime; an
application request whose module request expires ends once, with its status.
With --failing (a repository with `detect_lookup`, tests/clients/apps_models.py),
an application request whose module request fails ends once, with 500 /
INTERNAL naming the step. With --short-timeouts N, only N requests per client
whose timeout (--timeout-us, 400) no module request can meet: each ends once,
expired. One line per check; exits 1 on the first failure.
"""

import argparse
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import numpy_helper
from tritonclient.utils import InferenceServerException

APP = "detect_classify"
SLOTS, FEATURES = 8, 64


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def expect(cond, what):
    if not cond:
        fail(what)


class Ref:
    """The two models run in sequence with ONNX Runtime."""

    def __init__(self, models):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        det = os.path.join(models, "detector", "1", "model.onnx")
        self.det = ort.InferenceSession(det, so, providers=["CPUExecutionProvider"])
        self.mlp = ort.InferenceSession(
            os.path.join(models, "mlp", "1", "model.onnx"), so, providers=["CPUExecutionProvider"])
        w = [i for i in onnx.load(det).graph.initializer if i.name == "w"][0]
        w = numpy_helper.to_array(w)[:, 0]
        self.unit = w / np.linalg.norm(w)

    def patches(self, signs, seed):
        """One sample whose patch j passes the threshold when signs[j] > 0."""
        rng = np.random.default_rng(seed)
        noise = rng.uniform(-0.05, 0.05, (SLOTS, FEATURES))
        x = np.outer(np.array(signs, dtype=np.float64) * 3.0, self.unit) + noise
        return x.astype(np.float32)

    def run(self, batch):
        items, scores, count = self.det.run(["items", "scores", "count"], {"patches": batch})
        rows = np.concatenate([items[b, : int(count[b, 0])] for b in range(len(batch))])
        logits = self.mlp.run(["logits"], {"input": rows})[0] if len(rows) else np.zeros((0, 10), np.float32)
        return logits, scores, count


def infer(kind, client, batch, timeout=None, model=APP):
    mod = httpclient if kind == "http" else grpcclient
    i = mod.InferInput("PATCHES", list(batch.shape), "FP32")
    i.set_data_from_numpy(batch)
    # `timeout` is the request's parameter (µs) in both clients.
    kw = {} if timeout is None else {"timeout": timeout}
    return client.infer(model, [i], **kw)


def expect_expired(kind, client, batch, timeout_us):
    """Sends `batch` with a timeout (µs) its detector step cannot meet: the
    application request must end expired (429 / 504, UNAVAILABLE / DEADLINE)
    naming that step. Returns the status and message."""
    try:
        infer(kind, client, batch, timeout=timeout_us)
    except InferenceServerException as e:
        st, msg = str(e.status()), e.message()
        ok = ("429" in st or "504" in st) if kind == "http" else ("UNAVAILABLE" in st or "DEADLINE" in st)
        expect(ok, f"{kind} expired: status {st}: {msg}")
        expect(f"application `{APP}`" in msg and "step `detector`" in msg, f"{kind} expired: {msg}")
        return st, msg
    fail(f"{kind}: a {timeout_us} µs timeout was answered")


def stats(kind, client, model=APP):
    s = client.get_inference_statistics(model, as_json=True) if kind == "grpc" else \
        client.get_inference_statistics(model)
    st = s["model_stats"][0]["inference_stats"]
    n = lambda k: int(st[k].get("count", 0))  # noqa: E731
    return n("success"), n("fail")


def check_app(kind, client, ref):
    md = client.get_model_metadata(APP, as_json=True) if kind == "grpc" else client.get_model_metadata(APP)
    expect(md["platform"] == "ensemble", f"{kind} metadata platform: {md}")
    expect([t["name"] for t in md["outputs"]] == ["LOGITS", "SCORES", "COUNT"], f"{kind} outputs: {md}")
    cfg = client.get_model_config(APP, as_json=True)["config"] if kind == "grpc" else client.get_model_config(APP)
    steps = cfg["ensemble_scheduling"]["step"]
    expect(cfg["platform"] == "ensemble" and [s["model_name"] for s in steps] == ["detector", "mlp"],
           f"{kind} config: {cfg}")
    print(f"ok {kind}: metadata and config of {APP}", flush=True)
    good0, fail0 = stats(kind, client)
    cases = [
        ("fan-out 0", [[-1] * SLOTS]),
        ("fan-out 1", [[-1, -1, 1, -1, -1, -1, -1, -1]]),
        ("fan-out many", [[1] * SLOTS]),
        ("fan-out 3", [[1, -1, -1, 1, -1, -1, -1, 1]]),
        ("a batch of two samples (2 and 5 items)", [[1, 1] + [-1] * 6, [-1, 1, 1, 1, -1, 1, 1, -1]]),
    ]
    for n, (what, signs) in enumerate(cases):
        batch = np.stack([ref.patches(s, 100 * n + k) for k, s in enumerate(signs)])
        want_logits, want_scores, want_count = ref.run(batch)
        r = infer(kind, client, batch)
        logits, scores, count = r.as_numpy("LOGITS"), r.as_numpy("SCORES"), r.as_numpy("COUNT")
        items = sum(1 for s in signs for v in s if v > 0)
        expect(count is not None and count.reshape(-1).tolist() == want_count.reshape(-1).tolist(),
               f"{kind} {what}: COUNT {count} want {want_count}")
        expect(int(want_count.sum()) == items, f"{kind} {what}: the detector counts {want_count}, not {items}")
        expect(logits.shape == (items, 10), f"{kind} {what}: LOGITS shape {logits.shape}, want ({items}, 10)")
        expect(np.allclose(logits, want_logits, rtol=1e-4, atol=1e-5),
               f"{kind} {what}: LOGITS differ from ONNX Runtime's: {logits} against {want_logits}")
        expect(np.allclose(scores, want_scores, rtol=1e-5, atol=1e-6), f"{kind} {what}: SCORES differ")
        print(f"ok {kind}: {what}: {items} item(s), outputs equal ONNX Runtime's", flush=True)
    # A module request that cannot be on time (a timeout of 1 µs): the
    # application request ends once, with the status of the module request
    # that ended it.
    st, msg = expect_expired(kind, client, ref.patches([1] * SLOTS, 7)[None], 1)
    print(f"ok {kind}: an expired module request ends its application request: {st}: {msg}", flush=True)
    good1, fail1 = stats(kind, client)
    expect(good1 - good0 == len(cases) and fail1 - fail0 == 1,
           f"{kind}: statistics count each application request once: success {good0}->{good1}, "
           f"fail {fail0}->{fail1} after {len(cases)} good and 1 failed")
    print(f"ok {kind}: statistics count each application request once", flush=True)


def check_failing(kind, client, ref):
    """`detect_lookup`: the detector's count indexes a table of two rows, so
    a count of 2 or more fails the lookup's module request in ONNX Runtime."""
    app = "detect_lookup"
    s0 = stats(kind, client, app)
    r = infer(kind, client, ref.patches([1] + [-1] * 7, 1)[None], model=app)
    expect(r.as_numpy("ROW").shape == (1, 4), f"{kind}: detect_lookup with one item")
    try:
        infer(kind, client, ref.patches([1] * SLOTS, 2)[None], model=app)
        fail(f"{kind}: a failing module request was answered")
    except InferenceServerException as e:
        st, msg = str(e.status()), e.message()
        expect(("500" in st) if kind == "http" else ("INTERNAL" in st), f"{kind} failed: {st}: {msg}")
        expect(f"application `{app}`" in msg and "step `lookup`" in msg, f"{kind} failed: {msg}")
        print(f"ok {kind}: a failed module request fails its application request: {st}: {msg}", flush=True)
    s1 = stats(kind, client, app)
    expect(s1[0] - s0[0] == 1 and s1[1] - s0[1] == 1, f"{kind}: detect_lookup statistics {s0} -> {s1}")
    print(f"ok {kind}: the failed application request counted once", flush=True)


def check_short_timeouts(kind, client, ref, n, timeout_us):
    """`n` requests whose timeout (µs) no module request can meet, nor its
    last deadline: each application request ends once, expired, naming the
    detector step; the statistics count each once."""
    good0, fail0 = stats(kind, client)
    for k in range(n):
        expect_expired(kind, client, ref.patches([1] * SLOTS, 50 + k)[None], timeout_us)
    good1, fail1 = stats(kind, client)
    expect(good1 == good0 and fail1 - fail0 == n,
           f"{kind}: statistics {good0}/{fail0} -> {good1}/{fail1} after {n} expired requests")
    print(f"ok {kind}: {n} requests with a {timeout_us} µs timeout each ended once, expired", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--grpc", required=True)
    p.add_argument("--models", required=True)
    p.add_argument("--failing", action="store_true")
    p.add_argument("--short-timeouts", type=int, default=0,
                   help="only send this many requests whose timeout (--timeout-us) cannot be met")
    p.add_argument("--timeout-us", type=int, default=400)
    a = p.parse_args()
    ref = Ref(a.models)
    clients = [("http", httpclient.InferenceServerClient(url=a.http)),
               ("grpc", grpcclient.InferenceServerClient(url=a.grpc))]
    for kind, c in clients:
        if a.short_timeouts:
            check_short_timeouts(kind, c, ref, a.short_timeouts, a.timeout_us)
        elif a.failing:
            check_failing(kind, c, ref)
        else:
            check_app(kind, c, ref)
    print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
