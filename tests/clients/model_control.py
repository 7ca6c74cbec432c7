#!/usr/bin/env python3
"""Triton's model control with its own clients (tritonclient.http and
tritonclient.grpc) against `fermata serve --executor onnx
--model-control-mode explicit --load-model cnn`: the repository index with
each model's state, load_model and unload_model over both protocols,
inference only while the model is loaded (equal to ONNX Runtime's), and an
unload under load: every request taken before it is answered, every one sent
after it is refused at once, none waits.

    PYTHONPATH=.deps/py python3 tests/clients/model_control.py --url HTTP_ADDR --grpc GRPC_ADDR

Run by `cargo test --test clients`. One line per check; exits 1 on the first
failure, 0 when all pass.
"""

import os
import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (GRPC_TRANSIENT, HTTP_TRANSIENT, Checks, Reference,  # noqa: E402
                     again, expect, run, transient_status)

check = Checks()


class Ctx:
    def __init__(self, http, models, grpc):
        self.url = http
        self.http = httpclient.InferenceServerClient(url=http, concurrency=8)
        self.grpc = grpcclient.InferenceServerClient(url=grpc)
        self.ref = Reference(models)
        self.rng = np.random.default_rng(5)

    def x(self, n=1):
        return self.rng.uniform(-1, 1, size=(n, 64)).astype(np.float32)

    def http_infer(self, x):
        i = httpclient.InferInput("input", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        r = again(lambda: self.http.infer("mlp", [i]), transient_status(*HTTP_TRANSIENT))
        return r.as_numpy("logits")

    def grpc_infer(self, x):
        i = grpcclient.InferInput("input", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        r = again(lambda: self.grpc.infer("mlp", [i]), transient_status(*GRPC_TRANSIENT))
        return r.as_numpy("logits")


def states(c):
    return {m["name"]: m["state"] for m in c.http.get_model_repository_index()}


def refused_with(f, text):
    try:
        f()
    except InferenceServerException as e:
        expect(text in e.message(), f"want {text!r}, got {e.status()}: {e.message()}")
        return
    raise AssertionError(f"want a refusal with {text!r}, got an answer")


@check("only --load-model models are loaded at start")
def start(c):
    s = states(c)
    expect(s["cnn"] == "READY" and s["mlp"] == "UNAVAILABLE", s)
    g = {m["name"]: m["state"] for m in c.grpc.get_model_repository_index(as_json=True)["models"]}
    expect(g == s, (g, s))
    expect(not c.http.is_model_ready("mlp") and not c.grpc.is_model_ready("mlp"), "mlp not ready")
    expect(c.http.is_model_ready("cnn"), "cnn ready")
    refused_with(lambda: c.http_infer(c.x()), "is not loaded")
    refused_with(lambda: c.grpc_infer(c.x()), "is not loaded")


@check("load and unload over HTTP")
def http_cycle(c):
    t = time.time()
    c.http.load_model("mlp")
    print(f"     HTTP load to ready {1000 * (time.time() - t):.0f} ms")
    expect(c.http.is_model_ready("mlp") and states(c)["mlp"] == "READY", states(c))
    x = c.x(3)
    expect(np.allclose(c.http_infer(x), c.ref.logits(x), rtol=1e-5, atol=1e-6), "outputs")
    c.http.load_model("mlp")  # loaded already: answered at once
    t = time.time()
    c.http.unload_model("mlp")
    print(f"     HTTP unload to unloaded {1000 * (time.time() - t):.0f} ms")
    expect(states(c)["mlp"] == "UNAVAILABLE", states(c))
    refused_with(lambda: c.http_infer(c.x()), "is not loaded")
    c.http.unload_model("mlp")  # not loaded: answered at once
    refused_with(lambda: c.http.load_model("nosuch"), "nosuch")


@check("load and unload over gRPC")
def grpc_cycle(c):
    c.grpc.load_model("mlp")
    expect(c.grpc.is_model_ready("mlp"), "ready")
    x = c.x(2)
    expect(np.allclose(c.grpc_infer(x), c.ref.logits(x), rtol=1e-5, atol=1e-6), "outputs")
    c.grpc.unload_model("mlp")
    expect(not c.grpc.is_model_ready("mlp"), "unloaded")
    refused_with(lambda: c.grpc_infer(c.x()), "is not loaded")


@check("an unload under load ends every request once, none waits")
def under_load(c):
    c.http.load_model("mlp")
    stop = threading.Event()
    counts = {"good": 0, "refused": 0, "other": []}
    lock = threading.Lock()

    def client():
        cl = httpclient.InferenceServerClient(url=c.url)
        while not stop.is_set():
            x = np.ones((1, 64), dtype=np.float32)
            i = httpclient.InferInput("input", [1, 64], "FP32")
            i.set_data_from_numpy(x)
            try:
                cl.infer("mlp", [i])
                k = "good"
            except InferenceServerException as e:
                # Refused at the door once the frontend knows, or dropped
                # by the scheduler if it came in the moment between.
                gone = ("is not loaded", "the model was removed")
                k = "refused" if any(g in e.message() for g in gone) else None
                if k is None:
                    with lock:
                        counts["other"].append(f"{e.status()}: {e.message()}")
                    continue
            with lock:
                counts[k] += 1

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    c.http.unload_model("mlp")
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(timeout=30)
        expect(not t.is_alive(), "a client still waits")
    print(f"     under load: {counts['good']} good, {counts['refused']} refused after the unload,"
          f" other {len(counts['other'])}")
    expect(counts["good"] > 0 and counts["refused"] > 0, counts)
    # A drop or a late answer at the unload's edge is an answer too; nothing else.
    expect(all(s.startswith(("429", "504")) for s in counts["other"]), counts["other"][:5])


if __name__ == "__main__":
    sys.exit(run(__doc__, check, Ctx, lambda c: c.http.is_server_ready(), extra=("grpc",)))
