"""What the client scripts of tests/clients share: their checks' registry,
assertions, the reference model (mlp run by ONNX Runtime in Python), and the
main loop (wait until ready, run every check, one line each)."""

import argparse
import os
import sys
import time

import numpy as np
import onnxruntime as ort


class Checks:
    """Checks in the order they are declared."""

    def __init__(self):
        self.all = []

    def __call__(self, name):
        def wrap(f):
            self.all.append((name, f))
            return f
        return wrap


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


class Reference:
    """The shipped mlp, run directly by ONNX Runtime."""

    def __init__(self, models):
        self.mlp = ort.InferenceSession(os.path.join(models, "mlp.onnx"),
                                        providers=["CPUExecutionProvider"])

    def logits(self, x):
        return self.mlp.run(None, {"input": x})[0]

    def same(self, got, x):
        return np.allclose(got, self.logits(x), rtol=1e-5, atol=1e-6)


TRIES = 8


def again(f, transient):
    """f(), sent again while it fails with an error `transient(e)` says is a
    drop or a late answer (a deferred scheduler at light load on 2 shared
    cores runs near the deadline), at most TRIES times."""
    last = None
    for _ in range(TRIES):
        try:
            return f()
        except Exception as e:  # noqa: BLE001 - the clients raise their own types
            if not transient(e):
                raise
            last = e
    raise AssertionError(f"still dropped or late after {TRIES} tries: {last}")


def transient_status(*statuses):
    """A predicate for again(): a tritonclient error whose status is one of
    `statuses` (the protocol's codes for a drop and a late answer)."""
    from tritonclient.utils import InferenceServerException

    def transient(e):
        return isinstance(e, InferenceServerException) and str(e.status()) in statuses
    return transient


# A drop or a late answer, over HTTP and over gRPC.
HTTP_TRANSIENT = ("429", "504")
GRPC_TRANSIENT = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")


def post_again(url, **kw):
    """requests.post, sent again while answered 429 (dropped) or 504 (late),
    at most TRIES times."""
    import requests
    for _ in range(TRIES):
        r = requests.post(url, timeout=30, **kw)
        if r.status_code not in (429, 504):
            return r
    return r


def refused(f, status, text):
    """f() must raise the server's error (a tritonclient error) with this
    status and text."""
    from tritonclient.utils import InferenceServerException
    try:
        f()
    except InferenceServerException as e:
        expect(str(e.status()) == str(status) and text in e.message(),
               f"want {status} with {text!r}, got {e.status()}: {e.message()}")
        return
    raise AssertionError(f"want {status} with {text!r}, got an answer")


class MlpClient:
    """A tritonclient `client` of the shipped mlp, with ONNX Runtime's
    reference of it and a seeded RNG; infer() is sent again while `transient`
    says the answer was a drop or a late one."""

    def __init__(self, url, models, client, transient, seed):
        self.url = url
        self.client = client
        self.transient = transient
        self.ref = Reference(models)
        self.rng = np.random.default_rng(seed)

    def logits(self, x):
        return self.ref.logits(x)

    def infer(self, inputs, outputs=None, **kw):
        return again(lambda: self.client.infer("mlp", inputs, outputs=outputs, **kw),
                     self.transient)


async def again_async(f, transient):
    """again() for a coroutine function."""
    last = None
    for _ in range(TRIES):
        try:
            return await f()
        except Exception as e:  # noqa: BLE001 - the clients raise their own types
            if not transient(e):
                raise
            last = e
    raise AssertionError(f"still dropped or late after {TRIES} tries: {last}")


def run(doc, checks, make_ctx, ready, extra=()):
    """Parses --url, --models and the options named in `extra` (each
    required), makes the context (`make_ctx(url, models, *extra values)`),
    waits until `ready(ctx)` (20 s at most), then runs every check; the exit
    status."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--url", required=True)
    ap.add_argument("--models", default="models")
    for name in extra:
        ap.add_argument(f"--{name}", required=True)
    a = ap.parse_args()
    c = make_ctx(a.url, a.models, *[getattr(a, n) for n in extra])
    deadline = time.time() + 20
    while True:
        try:
            if ready(c):
                break
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if time.time() > deadline:
            print("not ready in 20 s", file=sys.stderr)
            return 1
        time.sleep(0.1)
    for name, f in checks.all:
        try:
            f(c)
        except Exception as e:  # noqa: BLE001 - report which check and why
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            return 1
        print(f"ok   {name}")
    print(f"{len(checks.all)} checks passed")
    return 0
