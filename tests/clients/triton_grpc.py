#!/usr/bin/env python3
"""Triton's own gRPC client (tritonclient.grpc, sync, streaming and aio)
against `fermata serve --executor onnx --grpc-port P`: readiness, metadata,
config, statistics, inference with raw and typed contents, a batch,
class_count, compression, the stream, and the error cases with their codes.

    PYTHONPATH=.deps/py python3 tests/clients/triton_grpc.py --url 127.0.0.1:8001

Run by `cargo test --test clients`. One line per check; exits 1 on the first
failure, 0 when all pass.
"""

import asyncio
import os
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (GRPC_TRANSIENT, Checks, MlpClient, again_async,  # noqa: E402
                     expect, refused, run, transient_status)

check = Checks()


transient = transient_status(*GRPC_TRANSIENT)


class Ctx(MlpClient):
    def __init__(self, url, models):
        super().__init__(url, models, grpcclient.InferenceServerClient(url=url), transient, 17)


def mlp_input(x):
    i = grpcclient.InferInput("input", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


@check("health, metadata and versions")
def health(c):
    expect(c.client.is_server_live(), "live")
    expect(c.client.is_server_ready(), "ready")
    expect(c.client.is_model_ready("mlp", "1"), "mlp v1 ready")
    expect(not c.client.is_model_ready("mlp", "2"), "no version 2")
    m = c.client.get_model_metadata("mlp", as_json=True)
    expect(m["versions"] == ["1"] and m["inputs"][0]["shape"] == ["-1", "64"], m)
    s = c.client.get_server_metadata(as_json=True)
    expect(s["name"] == "fermata" and "statistics" in s["extensions"], s)
    idx = c.client.get_model_repository_index(as_json=True)
    expect({m["name"] for m in idx["models"]} >= {"mlp", "cnn", "ranker"}, idx)


@check("model config")
def config(c):
    cfg = c.client.get_model_config("mlp", as_json=True)["config"]
    expect(int(cfg["max_batch_size"]) == 64, cfg)
    expect(cfg["input"][0]["data_type"] == "TYPE_FP32" and cfg["input"][0]["dims"] == ["64"], cfg)
    expect("dynamic_batching" in cfg, cfg)
    # On the CPU (`serve --executor onnx`): no instance on a GPU.
    groups = cfg["instance_group"]
    expect([g["kind"] for g in groups] == ["KIND_CPU"] and int(groups[0]["count"]) >= 1, groups)


@check("a batch of 3 with raw contents matches ONNX Runtime")
def batch(c):
    x = c.rng.uniform(-1, 1, size=(3, 64)).astype(np.float32)
    got = c.infer([mlp_input(x)]).as_numpy("logits")
    expect(got.shape == (3, 10), got.shape)
    expect(np.allclose(got, c.logits(x), rtol=1e-5, atol=1e-6), "values")


@check("class_count")
def classes(c):
    x = c.rng.uniform(-1, 1, size=(2, 64)).astype(np.float32)
    out = grpcclient.InferRequestedOutput("logits", class_count=3)
    got = c.infer([mlp_input(x)], outputs=[out]).as_numpy("logits")
    want = c.logits(x)
    expect(got.shape == (2, 3), got.shape)
    for row, w in zip(got, want):
        idx = [int(s.decode().split(":")[1]) for s in row]
        expect(idx == list(np.argsort(-w, kind="stable")[:3]), (row, w))


@check("compressed messages (gzip, deflate)")
def compression(c):
    x = c.rng.uniform(-1, 1, size=(1, 64)).astype(np.float32)
    for alg in ("gzip", "deflate"):
        r = c.infer([mlp_input(x)], compression_algorithm=alg)
        expect(np.allclose(r.as_numpy("logits"), c.logits(x), rtol=1e-5, atol=1e-6), alg)


@check("the stream: every request answered once, errors as messages")
def stream(c):
    answers = queue.Queue()
    c.client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        xs = [c.rng.uniform(-1, 1, size=(1, 64)).astype(np.float32) for _ in range(5)]
        for k, x in enumerate(xs):
            c.client.async_stream_infer("mlp", [mlp_input(x)], request_id=str(k))
        bad = grpcclient.InferInput("input", [1, 63], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 63), np.float32))
        c.client.async_stream_infer("mlp", [bad], request_id="bad")
        got, errors = {}, []
        for _ in range(6):
            result, error = answers.get(timeout=10)
            if error is not None:
                errors.append(str(error))
            else:
                got[result.get_response().id] = result.as_numpy("logits")
    finally:
        c.client.stop_stream()
    expect(len(errors) == 1 and "shape [1, 63]" in errors[0], errors)
    # A dropped or late answer would be an error too: allow none here but
    # the shape error (light load).
    for k, x in enumerate(xs):
        expect(np.allclose(got[str(k)], c.logits(x), rtol=1e-5, atol=1e-6), k)


@check("errors: codes and messages")
def errors(c):
    x = np.zeros((1, 64), np.float32)
    refused(lambda: c.client.infer("nope", [mlp_input(x)]), "StatusCode.NOT_FOUND", "unknown model `nope`")
    refused(lambda: c.client.infer("mlp", [mlp_input(np.zeros((65, 64), np.float32))]),
            "StatusCode.INVALID_ARGUMENT", "over the model's max_batch_size 64")
    # Sequence ids and priorities on a stateless model without priority
    # levels: served as Triton serves them, without effect.
    y = c.rng.standard_normal((1, 64)).astype(np.float32)
    for kw in ({"sequence_id": 3, "sequence_start": True}, {"priority": 1}):
        expect(c.ref.same(c.infer([mlp_input(y)], **kw).as_numpy("logits"), y), kw)
    outs = [grpcclient.InferRequestedOutput("logits"), grpcclient.InferRequestedOutput("logits")]
    refused(lambda: c.client.infer("mlp", [mlp_input(x)], outputs=outs),
            "StatusCode.INVALID_ARGUMENT", "requested twice")
    refused(lambda: c.client.unregister_system_shared_memory(),
            "StatusCode.UNIMPLEMENTED", "SystemSharedMemoryUnregister is not supported by fermata")
    refused(lambda: c.client.load_model("mlp"),
            "StatusCode.INVALID_ARGUMENT", "--model-control-mode none")
    refused(lambda: c.client.get_log_settings(),
            "StatusCode.UNIMPLEMENTED", "LogSettings is not supported")


@check("statistics")
def stats(c):
    s = c.client.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    expect(s["name"] == "mlp" and int(s["inference_count"]) >= 10, s)
    expect(int(s["inference_stats"]["success"]["count"]) >= 5, s)


@check("the aio client")
def aio(c):
    async def go():
        a = aioclient.InferenceServerClient(url=c.url)
        try:
            expect(await a.is_model_ready("mlp"), "ready")
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
