"""Writes two small models with a BYTES (string) input into a folder, for the
tests of BYTES inputs (tests/clients.rs):

* `tagger`: `word` BYTES [-1, 1] -> `label` FP32 [-1, 1]
* `pair_tagger`: `words` BYTES [-1, 2] -> `labels` FP32 [-1, 2]

Each maps a word to its index in WORDS (ONNX-ML LabelEncoder; -1 for any other
word), as FP32. Metadata files (STEM.json) beside them; the profiles are made
by `fermata profile`.

usage: strings_models.py DIR
"""

import json
import os
import sys

import onnx
from onnx import TensorProto, helper

WORDS = ["cat", "dog", "bird", "fish", "ünïcode"]


def make(name, inp, out, width):
    enc = helper.make_node(
        "LabelEncoder", [inp], ["ids"], domain="ai.onnx.ml",
        keys_strings=WORDS, values_int64s=list(range(len(WORDS))), default_int64=-1)
    cast = helper.make_node("Cast", ["ids"], [out], to=TensorProto.FLOAT)
    graph = helper.make_graph(
        [enc, cast], name,
        [helper.make_tensor_value_info(inp, TensorProto.STRING, ["batch", width])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", width])])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, inp, o, width in [("tagger", "word", "label", 1),
                                ("pair_tagger", "words", "labels", 2)]:
        onnx.save(make(name, inp, o, width), os.path.join(out, f"{name}.onnx"))
        meta = {
            "name": name,
            "inputs": [{"name": inp, "datatype": "BYTES", "shape": [-1, width]}],
            "outputs": [{"name": o, "datatype": "FP32", "shape": [-1, width]}],
            "slo_ms": 20.0,
            "max_batch": 16,
            "description": f"word -> its index in {WORDS} (-1 otherwise), {width} per sample",
        }
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(meta, f, indent=2)


if __name__ == "__main__":
    main()
