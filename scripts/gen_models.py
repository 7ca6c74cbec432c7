#!/usr/bin/env python3
"""Writes Fermata's shipped ONNX models and their reference data into models/.

    PYTHONPATH=.deps/py python3 scripts/gen_models.py [OUT_DIR]

(scripts/setup.sh installs the pinned onnx, onnxruntime and numpy into .deps/py.)

For each model STEM it writes:

* STEM.onnx      the model (opset 17, IR 8), batch dimension dynamic ("batch");
* STEM.json      its metadata in the format of src/repo.rs (ModelMeta);
* STEM.ref.json  reference data: a few fixed samples' inputs and the outputs
                 ONNX Runtime (Python, CPU provider) computes for them, run as one
                 batch, each tensor as a flat list with its shape.

Weights come from numpy's PCG64 with a fixed seed per model, so the output is the
same on every run. Latency profiles (STEM.profile-cpu.json) are measurements and
are not written here.
"""

import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
MAX_BATCH = 64

KSERVE = {TensorProto.FLOAT: "FP32", TensorProto.INT64: "INT64"}
NUMPY = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64}


def weights(rng, shape, fan_in):
    """He-style init, rounded to float32."""
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def bias(rng, n):
    return (rng.standard_normal(n) * 0.05).astype(np.float32)


def value_info(name, elem, shape):
    dims = ["batch"] + list(shape[1:])
    return helper.make_tensor_value_info(name, elem, dims)


def tensor_meta(name, elem, shape):
    return {"name": name, "datatype": KSERVE[elem], "shape": [-1] + list(shape[1:])}


def finish(name, nodes, inits, inputs, outputs, doc):
    graph = helper.make_graph(
        nodes,
        name,
        [value_info(n, e, s) for n, e, s in inputs],
        [value_info(n, e, s) for n, e, s in outputs],
        initializer=[numpy_helper.from_array(a, k) for k, a in inits.items()],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="fermata gen_models.py",
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def mlp():
    """FP32 [-1,64] -> [-1,10]: Gemm+Relu, Gemm+Relu, Gemm."""
    rng = np.random.default_rng(1001)
    dims = [64, 128, 128, 10]
    nodes, inits = [], {}
    x = "input"
    for i in range(3):
        w, b = f"fc{i}.weight", f"fc{i}.bias"
        inits[w] = weights(rng, (dims[i + 1], dims[i]), dims[i])
        inits[b] = bias(rng, dims[i + 1])
        y = "logits" if i == 2 else f"fc{i}"
        nodes.append(helper.make_node("Gemm", [x, w, b], [y], transB=1))
        if i < 2:
            nodes.append(helper.make_node("Relu", [y], [f"relu{i}"]))
            y = f"relu{i}"
        x = y
    doc = "3-layer perceptron 64-128-128-10 with ReLU (about 26k weights)"
    ins = [("input", TensorProto.FLOAT, [-1, 64])]
    outs = [("logits", TensorProto.FLOAT, [-1, 10])]
    return finish("mlp", nodes, inits, ins, outs, doc), ins, outs, doc, 20.0


def cnn():
    """FP32 [-1,3,32,32] -> [-1,10]: (conv3x3, relu, maxpool2) x2, flatten, Gemm."""
    rng = np.random.default_rng(2002)
    inits = {
        "conv0.weight": weights(rng, (16, 3, 3, 3), 27),
        "conv0.bias": bias(rng, 16),
        "conv1.weight": weights(rng, (32, 16, 3, 3), 144),
        "conv1.bias": bias(rng, 32),
        "fc.weight": weights(rng, (10, 32 * 8 * 8), 32 * 8 * 8),
        "fc.bias": bias(rng, 10),
    }
    nodes = []
    x = "image"
    for i in range(2):
        nodes += [
            helper.make_node(
                "Conv",
                [x, f"conv{i}.weight", f"conv{i}.bias"],
                [f"conv{i}"],
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
            ),
            helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"]),
            helper.make_node(
                "MaxPool", [f"relu{i}"], [f"pool{i}"], kernel_shape=[2, 2], strides=[2, 2]
            ),
        ]
        x = f"pool{i}"
    nodes += [
        helper.make_node("Flatten", [x], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], transB=1),
    ]
    doc = "small CNN for 3x32x32 images: 2x (conv3x3 + ReLU + maxpool2), then a linear layer to 10 classes"
    ins = [("image", TensorProto.FLOAT, [-1, 3, 32, 32])]
    outs = [("logits", TensorProto.FLOAT, [-1, 10])]
    return finish("cnn", nodes, inits, ins, outs, doc), ins, outs, doc, 50.0


VOCAB = 32


def ranker():
    """Two inputs of two dtypes, two outputs: dense FP32 [-1,16] and ids INT64
    [-1,8] (embedding lookup in a 32x16 table, mean over the ids), concatenated,
    Gemm+Relu to 8 features (output `embedding`), then Gemm+Softmax to 4 classes
    (output `probs`)."""
    rng = np.random.default_rng(3003)
    inits = {
        "table": weights(rng, (VOCAB, 16), 16),
        "fc0.weight": weights(rng, (8, 32), 32),
        "fc0.bias": bias(rng, 8),
        "fc1.weight": weights(rng, (4, 8), 8),
        "fc1.bias": bias(rng, 4),
    }
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
        # Opset 17: ReduceMean takes `axes` as an attribute.
        helper.make_node("ReduceMean", ["emb"], ["emb_mean"], axes=[1], keepdims=0),
        helper.make_node("Concat", ["dense", "emb_mean"], ["joined"], axis=1),
        helper.make_node("Gemm", ["joined", "fc0.weight", "fc0.bias"], ["fc0"], transB=1),
        helper.make_node("Relu", ["fc0"], ["embedding"]),
        helper.make_node("Gemm", ["embedding", "fc1.weight", "fc1.bias"], ["fc1"], transB=1),
        helper.make_node("Softmax", ["fc1"], ["probs"], axis=1),
    ]
    doc = (
        f"two-input ranker: dense FP32 features and INT64 ids (each in 0..{VOCAB}) "
        "looked up in an embedding table; outputs class probabilities and the hidden features"
    )
    ins = [("dense", TensorProto.FLOAT, [-1, 16]), ("ids", TensorProto.INT64, [-1, 8])]
    outs = [("probs", TensorProto.FLOAT, [-1, 4]), ("embedding", TensorProto.FLOAT, [-1, 8])]
    return finish("ranker", nodes, inits, ins, outs, doc), ins, outs, doc, 10.0


def sample_inputs(rng, ins, n):
    """n fixed samples per input. Floats are multiples of 1/32 in [-2, 2] (exact in
    float32 and short in JSON); integers are in 0..8."""
    feeds = {}
    for name, elem, shape in ins:
        full = [n] + list(shape[1:])
        if elem == TensorProto.FLOAT:
            feeds[name] = (rng.integers(-64, 65, size=full) / 32.0).astype(np.float32)
        else:
            feeds[name] = rng.integers(0, 8, size=full).astype(NUMPY[elem])
    return feeds


def flat(a):
    if a.dtype == np.float32:
        return [float(v) for v in a.reshape(-1)]
    return [int(v) for v in a.reshape(-1)]


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_ref(path, ref):
    """One line per tensor, so the file stays small and diffs stay readable."""
    lines = ["{"]
    for k in ("model", "onnxruntime", "batch"):
        lines.append(f"  {json.dumps(k)}: {json.dumps(ref[k])},")
    for key in ("inputs", "outputs"):
        lines.append(f'  "{key}": [')
        body = [f"    {json.dumps(t, separators=(',', ':'))}" for t in ref[key]]
        lines.append(",\n".join(body))
        lines.append("  ]," if key == "inputs" else "  ]")
    lines.append("}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "models")
    os.makedirs(out, exist_ok=True)
    for make in (mlp, cnn, ranker):
        model, ins, outs, doc, slo_ms = make()
        name = model.graph.name
        path = os.path.join(out, f"{name}.onnx")
        onnx.save(model, path)
        meta = {
            "name": name,
            "inputs": [tensor_meta(*t) for t in ins],
            "outputs": [tensor_meta(*t) for t in outs],
            "slo_ms": slo_ms,
            "max_batch": MAX_BATCH,
            "description": doc,
        }
        write_json(os.path.join(out, f"{name}.json"), meta)
        # Reference outputs from ONNX Runtime (CPU, one thread), the samples run as
        # one batch.
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        n = 3
        feeds = sample_inputs(np.random.default_rng(4004), ins, n)
        res = sess.run([o[0] for o in outs], feeds)
        ref = {
            "model": name,
            "onnxruntime": ort.__version__,
            "batch": n,
            "inputs": [
                {"name": t[0], "datatype": KSERVE[t[1]], "shape": list(feeds[t[0]].shape), "data": flat(feeds[t[0]])}
                for t in ins
            ],
            "outputs": [
                {"name": t[0], "datatype": KSERVE[t[1]], "shape": list(r.shape), "data": flat(r)}
                for t, r in zip(outs, res)
            ],
        }
        write_ref(os.path.join(out, f"{name}.ref.json"), ref)
        print(f"wrote {path} ({os.path.getsize(path)} bytes), {name}.json, {name}.ref.json")


if __name__ == "__main__":
    main()
