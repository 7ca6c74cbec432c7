"""BYTES (string) inputs through the ecosystem's clients: tritonclient.http
(JSON and binary), tritonclient.grpc (typed bytes_contents and raw), a raw
HTTP body, and the error cases with their status and message. Against the
models tests/clients/strings_models.py writes (a word -> its index in WORDS).

usage: strings_clients.py --url HOST:PORT --grpc HOST:PORT
"""

import argparse
import sys

import numpy as np
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness import (GRPC_TRANSIENT, HTTP_TRANSIENT, Checks, again, expect, post_again,
                     transient_status)

WORDS = ["cat", "dog", "bird", "fish", "ünïcode"]
checks = Checks()


def label(w):
    return float(WORDS.index(w)) if w in WORDS else -1.0


# A drop or a late answer, over either protocol.
transient = transient_status(*HTTP_TRANSIENT, *GRPC_TRANSIENT)


def words(rows):
    return np.array([[w.encode() for w in r] for r in rows], dtype=np.object_)


class Ctx:
    def __init__(self, url, grpc):
        self.url, self.grpc = url, grpc
        self.http = httpclient.InferenceServerClient(url)
        self.g = grpcclient.InferenceServerClient(grpc)


def http_infer(c, model, inp, rows, binary):
    x = words(rows)
    i = httpclient.InferInput(inp, list(x.shape), "BYTES")
    i.set_data_from_numpy(x, binary_data=binary)
    return again(lambda: c.http.infer(model, [i]), transient)


@checks("metadata and config name BYTES / TYPE_STRING")
def metadata(c):
    m = c.http.get_model_metadata("tagger")
    expect(m["inputs"][0]["datatype"] == "BYTES", m)
    cfg = c.http.get_model_config("pair_tagger")
    expect(cfg["input"][0]["data_type"] == "TYPE_STRING", cfg)
    gm = c.g.get_model_metadata("tagger", as_json=True)
    expect(gm["inputs"][0]["datatype"] == "BYTES", gm)


@checks("tritonclient.http: a batch of words, as JSON and as binary")
def http_words(c):
    rows = [["cat"], ["zebra"], ["ünïcode"], ["fish"]]
    for binary in (False, True):
        r = http_infer(c, "tagger", "word", rows, binary)
        got = r.as_numpy("label")
        expect(got.shape == (4, 1), got.shape)
        expect(list(got.ravel()) == [label(w[0]) for w in rows], (binary, got))
    rows = [["dog", "bird"], ["", "cat"]]
    r = http_infer(c, "pair_tagger", "words", rows, True)
    expect(list(r.as_numpy("labels").ravel()) == [1.0, 2.0, -1.0, 0.0], r.as_numpy("labels"))


@checks("tritonclient.grpc: typed bytes_contents and raw contents")
def grpc_words(c):
    rows = [["bird"], ["dog"]]
    x = words(rows)
    for raw in (False, True):
        i = grpcclient.InferInput("word", list(x.shape), "BYTES")
        i.set_data_from_numpy(x)
        if not raw:
            # The typed field instead of raw_input_contents.
            i._raw_content = None
            i._input.contents.bytes_contents.extend(x.ravel().tolist())
        r = again(lambda: c.g.infer("tagger", [i]), transient)
        expect(list(r.as_numpy("label").ravel()) == [2.0, 1.0], (raw, r.as_numpy("label")))


@checks("a raw HTTP body is one word")
def raw_body(c):
    r = post_again(f"http://{c.url}/v2/models/tagger/infer", data="bird".encode(),
                   headers={"Inference-Header-Content-Length": "0"})
    expect(r.status_code == 200, r.text)
    n = int(r.headers["Inference-Header-Content-Length"])
    expect(np.frombuffer(r.content[n:], np.float32).tolist() == [2.0], r.content)
    r = requests.post(f"http://{c.url}/v2/models/pair_tagger/infer", data=b"cat",
                      headers={"Inference-Header-Content-Length": "0"}, timeout=30)
    expect(r.status_code == 400 and "holds 2 per sample" in r.json()["error"], r.text)


@checks("refused: a word too long, a number, a NUL byte, short binary data")
def errors(c):
    u = f"http://{c.url}/v2/models/tagger/infer"

    def body(data):
        return {"inputs": [{"name": "word", "shape": [1, 1], "datatype": "BYTES", "data": data}]}

    for data, msg in [(["x" * 253], "253 bytes, over the 252 a BYTES element may hold"),
                      ([7], "element 0 of `data` is 7, not a string (BYTES)"),
                      (["a\u0000b"], "NUL byte")]:
        r = requests.post(u, json=body(data), timeout=30)
        expect(r.status_code == 400 and msg in r.json()["error"], (data, r.text))
    head = b'{"inputs":[{"name":"word","shape":[1,1],"datatype":"BYTES","parameters":{"binary_data_size":6}}]}'
    r = requests.post(u, data=head + b"\x05\x00\x00\x00ab", timeout=30,
                      headers={"Inference-Header-Content-Length": str(len(head))})
    expect(r.status_code == 400 and "says 5 bytes, 2 are left" in r.json()["error"], r.text)
    x = words([["x" * 300]])
    i = httpclient.InferInput("word", [1, 1], "BYTES")
    i.set_data_from_numpy(x)
    try:
        c.http.infer("tagger", [i])
        raise AssertionError("a 300-byte word was accepted")
    except InferenceServerException as e:
        expect("over the 252" in str(e), e)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("--grpc", required=True)
    ap.add_argument("--models", default="models")
    a = ap.parse_args()
    import harness
    sys.argv = [sys.argv[0], "--url", a.url, "--models", a.models]
    return harness.run(__doc__, checks, lambda url, _m: Ctx(url, a.grpc),
                       lambda c: c.http.is_model_ready("tagger"))


if __name__ == "__main__":
    sys.exit(main())
