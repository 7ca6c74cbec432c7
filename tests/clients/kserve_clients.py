#!/usr/bin/env python3
"""KServe's own Python clients (the `kserve` package's InferenceRESTClient and
InferenceGRPCClient, both asyncio) against `fermata serve --executor onnx`:
readiness, and a batch of 2 as JSON and binary tensors over REST and over
gRPC, checked against ONNX Runtime run in Python.

    PYTHONPATH=.deps/kserve:.deps/py python3 tests/clients/kserve_clients.py \\
        --url 127.0.0.1:8000 --grpc-url 127.0.0.1:8001

Run by `cargo test --test clients`.
"""

import argparse
import asyncio
import os
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Reference, again_async, expect  # noqa: E402


def request(x, binary):
    i = InferInput(name="input", shape=list(x.shape), datatype="FP32")
    i.set_data_from_numpy(x, binary_data=binary)
    return InferRequest(model_name="mlp", infer_inputs=[i], request_id="kserve-1")


def transient(e):
    """A drop or a late answer, which the checks send again."""
    return any(s in str(e) for s in ("429", "504", "dropped", "deadline exceeded"))


async def main(a):
    ref = Reference(a.models)
    rng = np.random.default_rng(18)
    base = f"http://{a.url}"
    rest = InferenceRESTClient(config=RESTConfig(protocol="v2", retries=0, timeout=20))
    try:
        expect(await rest.is_server_live(base), "REST: live")
        expect(await rest.is_server_ready(base), "REST: ready")
        expect(await rest.is_model_ready(base, "mlp"), "REST: mlp ready")
        for binary in (False, True):
            x = rng.uniform(-1, 1, size=(2, 64)).astype(np.float32)
            r = await again_async(lambda: rest.infer(base, request(x, binary), model_name="mlp"), transient)
            out = r.outputs[0]
            expect(out.name == "logits" and out.as_numpy().shape == (2, 10), out)
            expect(ref.same(out.as_numpy(), x), f"REST binary={binary}: values")
            print(f"ok   REST {'binary' if binary else 'JSON'} batch of 2")
    finally:
        await rest.close()
    grpc = InferenceGRPCClient(url=a.grpc_url, timeout=20)
    try:
        expect(await grpc.is_server_ready(), "gRPC: ready")
        expect(await grpc.is_model_ready("mlp"), "gRPC: mlp ready")
        x = rng.uniform(-1, 1, size=(2, 64)).astype(np.float32)
        r = await again_async(lambda: grpc.infer(request(x, False)), transient)
        expect(r.id == "kserve-1", r.id)
        expect(ref.same(r.outputs[0].as_numpy(), x), "gRPC: values")
        print("ok   gRPC batch of 2")
    finally:
        await grpc.close()
    print("3 checks passed")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("--grpc-url", required=True)
    ap.add_argument("--models", default="models")
    try:
        asyncio.run(main(ap.parse_args()))
    except Exception as e:  # noqa: BLE001 - report and fail
        print(f"FAIL {type(e).__name__}: {e}")
        sys.exit(1)
