#!/usr/bin/env python3
"""The server's CPU per request with large inputs, by client API.

Starts `fermata serve` (in process, one emulated GPU, the H100 ResNet-50
profile, inputs of --bytes) with its HTTP and gRPC APIs, and sends the same
inputs through each API with Triton's own client package (tritonclient) and a
raw binary HTTP body, --clients at a time in a closed loop. For each API it
prints the server process's CPU time (user + system, from /proc) per request
answered 200, and the requests per second (a request refused or dropped
is not counted, its CPU is).

    PYTHONPATH=.deps/py python3 scripts/large_input_cpu.py target/release/fermata

Compare builds in one sitting, alternating, several runs each: on a shared
machine the absolute CPU times move with the other load.
"""

import argparse
import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu_s(pid):
    """The process's user + system CPU seconds (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


def wait_ready(port, proc, timeout=30.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit(f"the server exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/v2/health/ready")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("the server did not get ready")


def raw_sender(port, data):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = data.tobytes()
    headers = {
        "Inference-Header-Content-Length": "0",
        "Content-Type": "application/octet-stream",
    }

    def send():
        c.request("POST", "/v2/models/resnet50/infer", body=body, headers=headers)
        r = c.getresponse()
        r.read()
        return r.status == 200

    return send


def http_sender(port, data):
    c = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    inp = httpclient.InferInput("input", list(data.shape), "UINT8")
    inp.set_data_from_numpy(data, binary_data=True)
    out = httpclient.InferRequestedOutput("output", binary_data=True)

    def send():
        c.infer("resnet50", [inp], outputs=[out])
        return True

    return send


def grpc_sender(port, data):
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    inp = grpcclient.InferInput("input", list(data.shape), "UINT8")
    inp.set_data_from_numpy(data)

    def send():
        c.infer("resnet50", [inp])
        return True

    return send


def run(make, n, clients):
    """n requests from `clients` threads, each with its own client: the
    requests answered 200 and the seconds taken."""
    counts = [0] * clients
    per = n // clients

    def loop(i):
        send = make()
        for _ in range(per):
            try:
                if send():
                    counts[i] += 1
            except Exception:  # a request refused or dropped: not counted
                pass

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts), time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--bytes", type=int, default=602112)
    ap.add_argument("--requests", type=int, default=1200)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--apis", default="raw,http,grpc")
    a = ap.parse_args()
    hp, gp = free_port(), free_port()
    proc = subprocess.Popen(
        [a.binary, "serve", "--workload", "configs/workloads/resnet50_h100_1gpu.toml",
         "--input-bytes", str(a.bytes), "--http-port", str(hp), "--grpc-port", str(gp)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(hp, proc)
        data = np.random.default_rng(1).integers(0, 255, size=(1, a.bytes), dtype=np.uint8)
        makers = {
            "raw": lambda: raw_sender(hp, data),
            "http": lambda: http_sender(hp, data),
            "grpc": lambda: grpc_sender(gp, data),
        }
        print(f"{a.bytes}-byte inputs, {a.clients} clients, {a.requests} requests per API")
        for api in a.apis.split(","):
            run(makers[api], a.warmup, a.clients)
            c0 = cpu_s(proc.pid)
            ok, secs = run(makers[api], a.requests, a.clients)
            c1 = cpu_s(proc.pid)
            if ok == 0:
                sys.exit(f"{api}: no request answered")
            print(f"{api:5} server CPU {1e3 * (c1 - c0) / ok:.3f} ms per request, "
                  f"{ok / secs:.1f} r/s ({ok} answered)")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
