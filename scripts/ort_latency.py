#!/usr/bin/env python3
"""ONNX Runtime's own latency for a model, from Python: the reference that
`fermata profile` is compared with (scripts/gpu_check.sh).

    python3 scripts/ort_latency.py --model models/large/resnet50.onnx \
        --provider cuda --batch-sizes 1,8,32,64 [--repeats 30] [--warmup 5] [--threads 1]

One InferenceSession with default options (CUDAExecutionProvider, or the CPU
provider with --threads intra-op threads). For each batch size in turn: `warmup`
untimed runs, then `repeats` timed runs of that same shape (numpy inputs in host
memory, outputs back in host memory: what `session.run` does). Prints one JSON
object per batch size: {"batch", "median_ms", "p99_ms"}.
"""

import argparse
import json
import time

import numpy as np
import onnxruntime as ort

DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--provider", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--batch-sizes", default="1,8,32,64")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="CPU provider intra-op threads")
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args()
    so = ort.SessionOptions()
    if a.provider == "cuda":
        providers = [("CUDAExecutionProvider", {"device_id": a.device})]
    else:
        so.intra_op_num_threads = a.threads
        providers = ["CPUExecutionProvider"]
    sess = ort.InferenceSession(a.model, so, providers=providers)
    if a.provider == "cuda" and "CUDAExecutionProvider" not in sess.get_providers():
        raise SystemExit(f"ONNX Runtime fell back to {sess.get_providers()}: no CUDA provider")
    rng = np.random.default_rng(1)
    for b in [int(x) for x in a.batch_sizes.split(",")]:
        feeds = {}
        for i in sess.get_inputs():
            shape = [b] + [d for d in i.shape[1:]]
            dt = DTYPES[i.type]
            if np.issubdtype(dt, np.integer):
                feeds[i.name] = rng.integers(0, 8, size=shape).astype(dt)
            else:
                feeds[i.name] = rng.uniform(-1, 1, size=shape).astype(dt)
        for _ in range(a.warmup):
            sess.run(None, feeds)
        t = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            t.append((time.perf_counter() - t0) * 1e3)
        t.sort()
        p99 = t[min(len(t) - 1, int(np.ceil(0.99 * len(t))) - 1)]
        print(json.dumps({"batch": b, "median_ms": t[len(t) // 2] if len(t) % 2 else 0.5 * (t[len(t) // 2 - 1] + t[len(t) // 2]), "p99_ms": p99}), flush=True)


if __name__ == "__main__":
    main()
