#!/usr/bin/env python3
"""Writes Fermata's shipped ONNX models and their reference data into models/.

    PYTHONPATH=.deps/py python3 scripts/gen_models.py [OUT_DIR]
    PYTHONPATH=.deps/py python3 scripts/gen_models.py --large [OUT_DIR]
    PYTHONPATH=.deps/py python3 scripts/gen_models.py --apps [OUT_DIR]

With --large it writes the real-size models into models/large/ instead (not
committed; scripts/setup.sh runs it when they are missing): `resnet50` (the
standard ResNet-50 v1.5 architecture, random weights, FP32, about 100 MB) and
`resnet50_fp16` (the same graph and weights in FP16, input and output FP16), each
with its metadata STEM.json. They have no STEM.ref.json (their inputs are too
large for a readable file); scripts/check_http.py compares them with ONNX Runtime
run directly in Python instead.

With --apps it writes only the application repository models/apps/ (it is
also written with the shipped models): Triton model directories `detector` (a
detector-like model: 8 candidate patches of 64 features in, the patches whose
score passes 0.5 out, first and in input order, their scores and their count),
`mlp` (the shipped classifier) and the ensemble `detect_classify`, which fans
each detected patch out to `mlp` (docs/applications.md).

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

KSERVE = {TensorProto.FLOAT: "FP32", TensorProto.INT64: "INT64", TensorProto.FLOAT16: "FP16"}
NUMPY = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64, TensorProto.FLOAT16: np.float16}


def weights(rng, shape, fan_in):
    """He-style init, rounded to float32."""
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def bias(rng, n):
    return (rng.standard_normal(n) * 0.05).astype(np.float32)


def value_info(name, elem, shape):
    dims = ["batch"] + list(shape[1:])
    return helper.make_tensor_value_info(name, elem, dims)


def tensor_meta(name, elem, shape, value_range=None):
    t = {"name": name, "datatype": KSERVE[elem], "shape": [-1] + list(shape[1:])}
    if value_range is not None:
        t["range"] = list(value_range)
    return t


def finish(name, nodes, inits, inputs, outputs, doc, full_check=True):
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
    # The full check serializes the model, which protobuf refuses past 2 GB and
    # which is slow for ResNet-50's 97 MiB: large models get the structural check.
    onnx.checker.check_model(model, full_check=full_check)
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

# Integer inputs' value ranges (inclusive), written to the metadata: the
# frontend answers a value outside with 400 before it can fail a batch.
RANGES = {("ranker", "ids"): (0, VOCAB - 1)}


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


def resnet50(fp16=False):
    """ResNet-50 v1.5 (torchvision's architecture: bottleneck blocks [3, 4, 6, 3],
    stride in the 3x3 convolution) as deployed: batch norms folded into the
    convolutions' biases. Input `input` [-1,3,224,224], output `logits` [-1,1000].
    Random He-style weights (seeded); the last convolution of each block is scaled
    down so that activations stay in FP16's range through the 16 residual adds."""
    rng = np.random.default_rng(5005)
    elem = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    dt = np.float16 if fp16 else np.float32
    nodes, inits = [], {}
    counter = [0]

    def conv(x, cin, cout, k, stride, relu, scale=1.0):
        i = counter[0]
        counter[0] += 1
        w, b = f"conv{i}.weight", f"conv{i}.bias"
        inits[w] = (weights(rng, (cout, cin, k, k), cin * k * k) * scale).astype(dt)
        inits[b] = bias(rng, cout).astype(dt)
        y = f"conv{i}"
        nodes.append(
            helper.make_node(
                "Conv",
                [x, w, b],
                [y],
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[k // 2] * 4,
            )
        )
        if relu:
            nodes.append(helper.make_node("Relu", [y], [f"{y}.relu"]))
            y = f"{y}.relu"
        return y

    x = conv("input", 3, 64, 7, 2, True)
    nodes.append(
        helper.make_node("MaxPool", [x], ["pool0"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    )
    x, cin = "pool0", 64
    for stage, (width, blocks) in enumerate(zip([64, 128, 256, 512], [3, 4, 6, 3])):
        for blk in range(blocks):
            stride = 2 if (blk == 0 and stage > 0) else 1
            cout = width * 4
            y = conv(x, cin, width, 1, 1, True)
            y = conv(y, width, width, 3, stride, True)
            y = conv(y, width, cout, 1, 1, False, scale=0.2)
            short = conv(x, cin, cout, 1, stride, False) if blk == 0 else x
            name = f"block{stage}.{blk}"
            nodes.append(helper.make_node("Add", [y, short], [f"{name}.add"]))
            nodes.append(helper.make_node("Relu", [f"{name}.add"], [f"{name}.out"]))
            x, cin = f"{name}.out", cout
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
    ]
    inits["fc.weight"] = weights(rng, (1000, 2048), 2048).astype(dt)
    inits["fc.bias"] = bias(rng, 1000).astype(dt)
    nodes.append(helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], transB=1))
    name = "resnet50_fp16" if fp16 else "resnet50"
    doc = (
        "ResNet-50 v1.5 (torchvision architecture, batch norms folded), random weights, "
        + ("FP16" if fp16 else "FP32")
    )
    ins = [("input", elem, [-1, 3, 224, 224])]
    outs = [("logits", elem, [-1, 1000])]
    model = finish(name, nodes, inits, ins, outs, doc, full_check=False)
    return model, ins, outs, doc, 50.0


DET_SLOTS = 8
DET_FEATURES = 64
DET_THRESHOLD = 0.5


def detector():
    """FP32 [-1,8,64] -> items [-1,8,64], scores [-1,8], count INT64 [-1,1].

    Each of the 8 candidate patches gets the score sigmoid(patch . w); the
    patches whose score passes 0.5 come first, in input order, then zero rows:
    `count` says how many there are (the fixed-slot layout of detectors'
    outputs, e.g. TensorRT's EfficientNMS). A patch a*w/|w| scores sigmoid(a|w|),
    so a test picks how many pass by the sign of a."""
    rng = np.random.default_rng(1004)
    k, f = DET_SLOTS, DET_FEATURES
    inits = {
        "w": (rng.standard_normal((f, 1)) / np.sqrt(f)).astype(np.float32),
        "slot_key": (-np.arange(k, dtype=np.float32) / (2.0 * k)).reshape(1, k),
        "sixteen": np.array([16.0], dtype=np.float32),
        "threshold": np.array([DET_THRESHOLD], dtype=np.float32),
        "k": np.array([k], dtype=np.int64),
        "axis1": np.array([1], dtype=np.int64),
        "axis2": np.array([2], dtype=np.int64),
    }
    n = helper.make_node
    nodes = [
        n("MatMul", ["patches", "w"], ["logit3"]),
        n("Squeeze", ["logit3", "axis2"], ["logit"]),
        n("Sigmoid", ["logit"], ["score"]),
        n("Greater", ["score", "threshold"], ["pass"]),
        n("Cast", ["pass"], ["passf"], to=TensorProto.FLOAT),
        n("ReduceSum", ["passf", "axis1"], ["countf"], keepdims=1),
        n("Cast", ["countf"], ["count"], to=TensorProto.INT64),
        # Passing patches first, each group in input order: a key of 16 for a
        # pass, less a little per slot.
        n("Mul", ["passf", "sixteen"], ["pass16"]),
        n("Add", ["pass16", "slot_key"], ["key"]),
        n("TopK", ["key", "k"], ["key_sorted", "order"], axis=1, largest=1, sorted=1),
        n("GatherElements", ["passf", "order"], ["kept"], axis=1),
        n("GatherElements", ["score", "order"], ["score_sorted"], axis=1),
        n("Mul", ["score_sorted", "kept"], ["scores"]),
        n("Unsqueeze", ["order", "axis2"], ["order3"]),
        n("Shape", ["patches"], ["pshape"]),
        n("Expand", ["order3", "pshape"], ["order_rows"]),
        n("GatherElements", ["patches", "order_rows"], ["rows"], axis=1),
        n("Unsqueeze", ["kept", "axis2"], ["kept3"]),
        n("Mul", ["rows", "kept3"], ["items"]),
    ]
    doc = "detector-like: 8 patches scored, those over 0.5 first, with their count"
    ins = [("patches", TensorProto.FLOAT, [-1, k, f])]
    outs = [
        ("items", TensorProto.FLOAT, [-1, k, f]),
        ("scores", TensorProto.FLOAT, [-1, k]),
        ("count", TensorProto.INT64, [-1, 1]),
    ]
    return finish("detector", nodes, inits, ins, outs, doc), ins, outs, doc


PBTXT_TYPE = {TensorProto.FLOAT: "TYPE_FP32", TensorProto.INT64: "TYPE_INT64"}


def pbtxt_tensors(ts):
    return ",\n".join(
        f'  {{ name: "{n}" data_type: {PBTXT_TYPE[e]} dims: [ {", ".join(str(d) for d in s[1:])} ] }}'
        for n, e, s in ts
    )


def triton_dir(out, model, ins, outs, max_batch, slo_ms):
    """OUT/NAME/config.pbtxt and OUT/NAME/1/model.onnx."""
    name = model.graph.name
    os.makedirs(os.path.join(out, name, "1"), exist_ok=True)
    onnx.save(model, os.path.join(out, name, "1", "model.onnx"))
    with open(os.path.join(out, name, "config.pbtxt"), "w") as f:
        f.write(
            f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n'
            f"input [\n{pbtxt_tensors(ins)}\n]\noutput [\n{pbtxt_tensors(outs)}\n]\n"
            f'parameters {{ key: "slo_ms" value: {{ string_value: "{slo_ms:g}" }} }}\n'
        )


ENSEMBLE = """# An application: the detector's patches that pass its threshold, each
# classified by mlp. ITEMS fans out: each of its first COUNT rows becomes
# one request to mlp (docs/applications.md, "Serving an application").
name: "detect_classify"
platform: "ensemble"
max_batch_size: 16
input [
  { name: "PATCHES" data_type: TYPE_FP32 dims: [ 8, 64 ] }
]
output [
  { name: "LOGITS" data_type: TYPE_FP32 dims: [ 10 ] },
  { name: "SCORES" data_type: TYPE_FP32 dims: [ 8 ] },
  { name: "COUNT" data_type: TYPE_INT64 dims: [ 1 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "detector"
      model_version: -1
      input_map { key: "patches" value: "PATCHES" }
      output_map { key: "items" value: "ITEMS" }
      output_map { key: "scores" value: "SCORES" }
      output_map { key: "count" value: "COUNT" }
    },
    {
      model_name: "mlp"
      model_version: -1
      input_map { key: "input" value: "ITEMS" }
      output_map { key: "logits" value: "LOGITS" }
    }
  ]
}
parameters { key: "fermata.fanout" value: { string_value: "ITEMS:COUNT" } }
parameters { key: "fermata.deadline" value: { string_value: "slack-forwarding" } }
parameters { key: "slo_ms" value: { string_value: "50" } }
"""


def write_apps(out):
    """models/apps: the detector, mlp and the ensemble detect_classify."""
    model, ins, outs, _ = detector()
    triton_dir(out, model, ins, outs, 16, 20.0)
    model, ins, outs, _, slo = mlp()
    triton_dir(out, model, ins, outs, MAX_BATCH, slo)
    os.makedirs(os.path.join(out, "detect_classify"), exist_ok=True)
    with open(os.path.join(out, "detect_classify", "config.pbtxt"), "w") as f:
        f.write(ENSEMBLE)
    print(f"wrote {out}/detector, {out}/mlp, {out}/detect_classify")


def save_model(out, model, ins, outs, doc, slo_ms):
    """Writes OUT/STEM.onnx and its metadata OUT/STEM.json; returns the .onnx path."""
    name = model.graph.name
    path = os.path.join(out, f"{name}.onnx")
    onnx.save(model, path)
    meta = {
        "name": name,
        "inputs": [tensor_meta(*t, RANGES.get((name, t[0]))) for t in ins],
        "outputs": [tensor_meta(*t) for t in outs],
        "slo_ms": slo_ms,
        "max_batch": MAX_BATCH,
        "description": doc,
    }
    write_json(os.path.join(out, f"{name}.json"), meta)
    return path


def write_large(out):
    """models/large: resnet50 and resnet50_fp16 with their metadata."""
    os.makedirs(out, exist_ok=True)
    for fp16 in (False, True):
        model = resnet50(fp16)
        path = save_model(out, *model)
        print(f"wrote {path} ({os.path.getsize(path)} bytes), {model[0].graph.name}.json")


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
    args = sys.argv[1:]
    if args and args[0] == "--large":
        out = args[1] if len(args) > 1 else os.path.join(os.path.dirname(__file__), "..", "models", "large")
        write_large(out)
        return
    if args and args[0] == "--apps":
        out = args[1] if len(args) > 1 else os.path.join(os.path.dirname(__file__), "..", "models", "apps")
        write_apps(out)
        return
    out = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "models")
    os.makedirs(out, exist_ok=True)
    for make in (mlp, cnn, ranker):
        model, ins, outs, doc, slo_ms = make()
        name = model.graph.name
        path = save_model(out, model, ins, outs, doc, slo_ms)
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
    write_apps(os.path.join(out, "apps"))


if __name__ == "__main__":
    main()
