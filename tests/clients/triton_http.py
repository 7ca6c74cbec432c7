#!/usr/bin/env python3
"""Triton's own HTTP client (tritonclient.http, sync and aio) against a running
`fermata serve --executor onnx` serving the shipped models: every call that
once failed, and the error cases with their status and message.

    PYTHONPATH=.deps/py python3 tests/clients/triton_http.py --url 127.0.0.1:8000

Run by `cargo test --test clients`. Prints one line per check; exits 1 on the
first failure (with what was seen), 0 when all pass.
"""

import asyncio
import gzip
import json
import os
import sys
import urllib.error
import urllib.request

import numpy as np
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (HTTP_TRANSIENT, Checks, MlpClient, again_async,  # noqa: E402
                     expect, refused, run, transient_status)

check = Checks()


transient = transient_status(*HTTP_TRANSIENT)


class Ctx(MlpClient):
    def __init__(self, url, models):
        super().__init__(url, models, httpclient.InferenceServerClient(url=url), transient, 16)

    def raw(self, method, path, body=None, headers=None):
        """(status, headers, body) of a plain HTTP request."""
        req = urllib.request.Request(f"http://{self.url}{path}", data=body,
                                     method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()


def mlp_input(x, binary=True):
    i = httpclient.InferInput("input", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=binary)
    return i


@check("versioned readiness and metadata")
def versions(c):
    expect(c.client.is_server_live(), "live")
    expect(c.client.is_server_ready(), "ready")
    expect(c.client.is_model_ready("mlp", "1"), "mlp version 1 ready")
    expect(not c.client.is_model_ready("mlp", "2"), "mlp has no version 2")
    m = c.client.get_model_metadata("mlp", "1")
    expect(m["versions"] == ["1"] and m["inputs"][0]["shape"] == [-1, 64], m)
    s, _, b = c.raw("GET", "/v2/models/mlp/versions/7")
    expect(s == 404 and b"no version `7`" in b, (s, b))


@check("model config in Triton's shape")
def config(c):
    cfg = c.client.get_model_config("mlp")
    expect(cfg["max_batch_size"] == 64, cfg)
    expect(cfg["input"][0]["name"] == "input" and cfg["input"][0]["dims"] == [64]
           and cfg["input"][0]["data_type"] == "TYPE_FP32", cfg["input"])
    expect(cfg["output"][0]["dims"] == [10], cfg["output"])
    expect("dynamic_batching" in cfg, cfg)
    # `serve --executor onnx` runs every model on the CPU (ONNX Runtime's
    # CPU provider): one instance per executor thread, none on a GPU.
    groups = cfg["instance_group"]
    expect([g["kind"] for g in groups] == ["KIND_CPU"] and groups[0]["count"] >= 1, groups)
    cfg1 = c.client.get_model_config("mlp", "1")
    expect(cfg1 == cfg, "the versioned route answers the same")


@check("a batch of 4 samples, binary and JSON, matches ONNX Runtime")
def batch(c):
    x = c.rng.uniform(-1, 1, size=(4, 64)).astype(np.float32)
    want = c.logits(x)
    for binary in (True, False):
        out = httpclient.InferRequestedOutput("logits", binary_data=binary)
        r = c.infer([mlp_input(x, binary)], outputs=[out])
        got = r.as_numpy("logits")
        expect(got.shape == (4, 10), got.shape)
        expect(np.allclose(got, want, rtol=1e-5, atol=1e-6),
               f"max diff {np.abs(got - want).max()}")
    refused(lambda: c.client.infer("mlp", [mlp_input(np.zeros((65, 64), np.float32))]),
            400, "over the model's max_batch_size 64")


@check("class_count: the top classes as Triton returns them")
def classes(c):
    x = c.rng.uniform(-1, 1, size=(2, 64)).astype(np.float32)
    want = c.logits(x)
    for binary in (True, False):
        out = httpclient.InferRequestedOutput("logits", binary_data=binary, class_count=3)
        got = c.infer([mlp_input(x)], outputs=[out]).as_numpy("logits")
        expect(got.shape == (2, 3), got.shape)
        for row, w in zip(got, want):
            # BYTES elements: bytes from binary data, str from JSON (as with Triton).
            row = [s.decode() if isinstance(s, bytes) else s for s in row]
            idx = [int(s.split(":")[1]) for s in row]
            vals = [float(s.split(":")[0]) for s in row]
            expect(idx == list(np.argsort(-w, kind="stable")[:3]), (row, w))
            expect(np.allclose(vals, w[idx], atol=1e-5), (vals, w[idx]))


@check("a raw binary body (Inference-Header-Content-Length: 0)")
def raw_body(c):
    x = c.rng.uniform(-1, 1, size=(3, 64)).astype(np.float32)
    s, h, b = c.raw("POST", "/v2/models/mlp/infer", x.tobytes(),
                    {"Inference-Header-Content-Length": "0",
                     "Content-Type": "application/octet-stream"})
    for _ in range(8):
        if s not in (429, 504):
            break
        s, h, b = c.raw("POST", "/v2/models/mlp/infer", x.tobytes(),
                        {"Inference-Header-Content-Length": "0"})
    expect(s == 200, (s, b[:200]))
    hl = int({k.lower(): v for k, v in h.items()}["inference-header-content-length"])
    head = json.loads(b[:hl])
    expect(head["outputs"][0]["shape"] == [3, 10], head)
    got = np.frombuffer(b[hl:], dtype=np.float32).reshape(3, 10)
    expect(np.allclose(got, c.logits(x), rtol=1e-5, atol=1e-6), "raw outputs")
    s, _, b = c.raw("POST", "/v2/models/mlp/infer", b"\0" * 10,
                    {"Inference-Header-Content-Length": "0"})
    expect(s == 400 and b"not a whole number of samples" in b, (s, b))


@check("compressed requests (gzip, deflate)")
def compression(c):
    x = c.rng.uniform(-1, 1, size=(1, 64)).astype(np.float32)
    for alg in ("gzip", "deflate"):
        r = c.infer([mlp_input(x)], request_compression_algorithm=alg)
        expect(np.allclose(r.as_numpy("logits"), c.logits(x), rtol=1e-5, atol=1e-6), alg)
    # A small body that inflates past the server's limit (--http-max-body-bytes).
    bomb = gzip.compress(b" " * (9 << 20))
    s, _, b = c.raw("POST", "/v2/models/mlp/infer", bomb, {"Content-Encoding": "gzip"})
    expect(s == 413 and b"decompresses to over the limit" in b, (s, b[:200]))
    s, _, b = c.raw("POST", "/v2/models/mlp/infer", b"{}", {"Content-Encoding": "br"})
    expect(s == 415 and b"unsupported Content-Encoding" in b, (s, b))


@check("HEAD on the health routes")
def head(c):
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/mlp/ready"):
        s, _, b = c.raw("HEAD", path)
        expect(s == 200 and b == b"", (path, s, b))


@check("Triton's parameters taken as Triton takes them, bad ones refused by name")
def parameters(c):
    # A stateless model without priority levels: Triton serves sequence ids,
    # priorities and custom parameters as if they were not there.
    x = c.rng.standard_normal((1, 64)).astype(np.float32)
    for kw in ({"sequence_id": 5, "sequence_start": True, "sequence_end": True},
               {"sequence_id": "session-a"}, {"priority": 2},
               {"parameters": {"knob": 1, "note": "x"}}):
        expect(c.ref.same(c.infer([mlp_input(x)], **kw).as_numpy("logits"), x), kw)
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                        "data": [0.0] * 64}]}
    for params, text in (({"priority": "high"}, "request.parameters.priority must be an unsigned integer"),
                         ({"sequence_id": -1}, "request.parameters.sequence_id must be"),
                         ({"sequence_start": 1}, "request.parameters.sequence_start must be true or false"),
                         ({"shared_memory_region": "r"}, "shared memory is not supported")):
        s, _, b = c.raw("POST", "/v2/models/mlp/infer",
                        json.dumps(dict(body, parameters=params)).encode(),
                        {"Content-Type": "application/json"})
        expect(s == 400 and text.encode() in b, (params, s, b[:300]))


@check("duplicate outputs are refused by name")
def refusals(c):
    x = np.zeros((1, 64), np.float32)
    outs = [httpclient.InferRequestedOutput("logits"), httpclient.InferRequestedOutput("logits")]
    refused(lambda: c.client.infer("mlp", [mlp_input(x)], outputs=outs), 400,
            "output `logits` is requested twice")


@check("statistics in Triton's shape")
def stats(c):
    before = c.client.get_inference_statistics("mlp")["model_stats"][0]
    x = np.zeros((2, 64), np.float32)
    c.infer([mlp_input(x)])
    after = c.client.get_inference_statistics("mlp", "1")["model_stats"][0]
    expect(after["name"] == "mlp" and after["version"] == "1", after)
    expect(int(after["inference_count"]) >= int(before.get("inference_count", 0)) + 2,
           (before, after))
    succ = after["inference_stats"]["success"]
    expect(int(succ["count"]) >= 1 and int(succ["ns"]) > 0, succ)
    expect(int(after["execution_count"]) >= 1, after)
    every = c.client.get_inference_statistics()["model_stats"]
    expect({m["name"] for m in every} >= {"mlp", "cnn", "ranker"}, every)


@check("the aio client: readiness, config and a batch")
def aio(c):
    async def go():
        a = aioclient.InferenceServerClient(url=c.url)
        try:
            expect(await a.is_model_ready("mlp", "1"), "aio ready")
            cfg = await a.get_model_config("mlp")
            expect(cfg["max_batch_size"] == 64, cfg)
            x = c.rng.uniform(-1, 1, size=(2, 64)).astype(np.float32)
            i = aioclient.InferInput("input", [2, 64], "FP32")
            i.set_data_from_numpy(x)
            r = await again_async(lambda: a.infer("mlp", [i]), transient)
            expect(np.allclose(r.as_numpy("logits"), c.logits(x), rtol=1e-5, atol=1e-6), "aio")
        finally:
            await a.close()
    asyncio.run(go())


if __name__ == "__main__":
    sys.exit(run(__doc__, check, Ctx, lambda c: c.client.is_server_ready()))
