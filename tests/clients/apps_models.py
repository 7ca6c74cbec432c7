#!/usr/bin/env python3
"""Adds to a copy of models/apps an application whose second step fails at
run time, for the test of a failed module request (tests/apps.rs):

* `lookup`: `idx` INT64 [-1, 1] -> `row` FP32 [-1, 4], a Gather from a table
  of two rows: ONNX Runtime fails the batch for an index of 2 or more;
* `detect_lookup`: the detector, then `lookup` of its COUNT (a whole edge).

`fermata profile` cannot measure `lookup` (its random inputs index past the
table), so its profile is the detector's measured one, renamed: a Gather of
one row takes no longer than the detector's matrix product and sort.

The SLOs are seconds: the test is about how a failure ends a request, and a
request that a loaded host delays past a tight deadline would end late
instead.

usage: apps_models.py DIR
"""

import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ENSEMBLE = """name: "detect_lookup"
platform: "ensemble"
max_batch_size: 4
input [ { name: "PATCHES" data_type: TYPE_FP32 dims: [ 8, 64 ] } ]
output [ { name: "ROW" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "detector" model_version: -1
    input_map { key: "patches" value: "PATCHES" }
    output_map { key: "count" value: "COUNT" } },
  { model_name: "lookup" model_version: -1
    input_map { key: "idx" value: "COUNT" }
    output_map { key: "row" value: "ROW" } } ] }
parameters { key: "slo_ms" value: { string_value: "2000" } }
"""

CONFIG = """name: "lookup"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "idx" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "row" data_type: TYPE_FP32 dims: [ 4 ] } ]
parameters { key: "slo_ms" value: { string_value: "1000" } }
"""


def lookup():
    table = np.arange(8, dtype=np.float32).reshape(2, 4)
    nodes = [
        helper.make_node("Gather", ["table", "idx"], ["rows"], axis=0),
        helper.make_node("Squeeze", ["rows", "axis1"], ["row"]),
    ]
    graph = helper.make_graph(
        nodes, "lookup",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch", 1])],
        [helper.make_tensor_value_info("row", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(table, "table"),
                     numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main():
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "lookup", "1"), exist_ok=True)
    onnx.save(lookup(), os.path.join(out, "lookup", "1", "model.onnx"))
    with open(os.path.join(out, "lookup", "config.pbtxt"), "w") as f:
        f.write(CONFIG)
    with open(os.path.join(out, "detector", "detector.profile-cpu.json")) as f:
        prof = json.load(f)
    prof["model"] = "lookup"
    prof["device"] = "the detector's profile: " + prof.get("device", "")
    with open(os.path.join(out, "lookup", "lookup.profile-cpu.json"), "w") as f:
        json.dump(prof, f, indent=2)
    os.makedirs(os.path.join(out, "detect_lookup"), exist_ok=True)
    with open(os.path.join(out, "detect_lookup", "config.pbtxt"), "w") as f:
        f.write(ENSEMBLE)


if __name__ == "__main__":
    main()
