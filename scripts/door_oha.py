#!/usr/bin/env python3
"""Helpers of scripts/door_oha.sh.

  door_oha.py body --addr HOST:PORT --model M --out FILE
      waits (up to 60 s) until the server says the model is ready, then writes
      one KServe v2 JSON request for it (batch 1, random data) to FILE.
  door_oha.py report --model M --rates R1,R2,... --duration-s D --dir DIR
      reads oha's per-request records (DIR/M-R.sqlite) and summaries
      (DIR/M-R.json) and prints the door's figures.

A request's latency is counted from its scheduled send time (oha's
start_latency_correction) to its answer's end. The first second of each run is
left out as warm-up.
"""

import argparse
import json
import random
import sqlite3
import struct
import sys
import time
import urllib.error
import urllib.request

WARMUP_S = 1.0
# Elements per datatype that the request's `data` carries as numbers.
FLOATS = {"FP32", "FP64", "FP16"}


def f32_number(x):
    """`x` (a float32 value) as the JSON number of fewest digits that reads back as it."""
    want = struct.pack("<f", x)
    for digits in range(1, 10):
        v = float(f"{x:.{digits}g}")
        if struct.pack("<f", v) == want:
            return v
    return x


def model_spec(model):
    with open(f"models/{model}.json") as f:
        return json.load(f)


def wait_ready(addr, model, timeout_s=60.0):
    url = f"http://{addr}/v2/models/{model}/ready"
    end = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
                last = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except OSError as e:
            last = str(e)
        time.sleep(0.1)
    sys.exit(f"door_oha.py: model {model} at {addr} not ready in {timeout_s:.0f} s ({last})")


def cmd_body(a):
    spec = model_spec(a.model)
    wait_ready(a.addr, a.model)
    rng = random.Random(1)
    inputs = []
    for t in spec["inputs"]:
        shape = [1] + [d for d in t["shape"][1:]]
        if any(d < 0 for d in shape):
            sys.exit(f"door_oha.py: input {t['name']} has a free dimension past the batch")
        n = 1
        for d in shape:
            n *= d
        if t["datatype"] in FLOATS:
            # As `fermata bench http` sends them: k / 2^23 - 1 for a random
            # 24-bit k, written in the fewest digits that give that float back.
            data = [f32_number(rng.getrandbits(24) / float(1 << 23) - 1.0) for _ in range(n)]
        else:
            data = [rng.randrange(0, 100) for _ in range(n)]
        inputs.append({"name": t["name"], "shape": shape, "datatype": t["datatype"], "data": data})
    with open(a.out, "w") as f:
        json.dump({"inputs": inputs}, f)


def quantile(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def one_rate(a, rate, slo_s):
    base = f"{a.dir}/{a.model}-{rate}"
    db = sqlite3.connect(f"{base}.sqlite")
    cols = [r[1] for r in db.execute("PRAGMA table_info(oha)")]
    start = "start_latency_correction" if "start_latency_correction" in cols else "start"
    rows = db.execute(
        f"SELECT COALESCE({start}, start), end, status, start FROM oha"
    ).fetchall()
    with open(f"{base}.json") as f:
        summary = json.load(f)
    errors = sum(summary.get("errorDistribution", {}).values())
    window = a.duration_s - WARMUP_S
    rows = [r for r in rows if r[0] >= WARMUP_S]
    good = sum(1 for s, e, st, _ in rows if st == 200 and e - s <= slo_s)
    ok_late = sum(1 for s, e, st, _ in rows if st == 200 and e - s > slo_s)
    good_sent = sum(1 for _, e, st, sent in rows if st == 200 and e - sent <= slo_s)
    refused = [e - s for s, e, st, _ in rows if st in (429, 503)]
    # From the moment the client sent it: the client's own lag left out.
    refused_sent = [e - sent for _, e, st, sent in rows if st in (429, 503)]
    lag = [sent - s for s, _, _, sent in rows]
    other = {}
    for _, _, st, _ in rows:
        if st not in (200, 429, 503):
            other[st] = other.get(st, 0) + 1
    return {
        "rate": rate,
        "good_per_s": good / window,
        "late_200": ok_late,
        "good_from_send_per_s": good_sent / window,
        "refused": len(refused),
        "refusal_p50_ms": 1e3 * quantile(refused, 0.5),
        "refusal_p99_ms": 1e3 * quantile(refused, 0.99),
        "refusal_p99_from_send_ms": 1e3 * quantile(refused_sent, 0.99),
        "client_lag_p99_ms": 1e3 * quantile(lag, 0.99),
        "other_status": other,
        "client_errors": errors,
        "answered": len(rows),
    }


def cmd_report(a):
    slo_s = model_spec(a.model)["slo_ms"] / 1e3
    rates = [int(r) for r in a.rates.split(",")]
    res = [one_rate(a, r, slo_s) for r in rates]
    top = res[0]["good_per_s"]
    for r in res:
        print(
            f"{a.model} at {r['rate']} r/s: good {r['good_per_s']:.0f}/s (200 within {slo_s * 1e3:.0f} ms; "
            f"{r['late_200']} late; {r['good_from_send_per_s']:.0f}/s within it from the actual send), refused {r['refused']} (p50 {r['refusal_p50_ms']:.1f} ms, "
            f"p99 {r['refusal_p99_ms']:.1f} ms; p99 from the actual send {r['refusal_p99_from_send_ms']:.1f} ms), "
            f"client lag p99 {r['client_lag_p99_ms']:.1f} ms, other statuses {r['other_status'] or 'none'}, "
            f"client errors {r['client_errors']} (the whole run, warm-up included)"
        )
    for r in res[1:]:
        print(
            f"  at {r['rate'] / rates[0]:.2f}x of {rates[0]} r/s: good answers {r['good_per_s'] / top:.2f} "
            f"of the first rate's ({top:.0f}/s), refusal p99 {r['refusal_p99_ms']:.1f} ms"
        )
    print(json.dumps(res))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("body")
    b.add_argument("--addr", required=True)
    b.add_argument("--model", required=True)
    b.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("--model", required=True)
    r.add_argument("--rates", required=True)
    r.add_argument("--duration-s", type=float, required=True)
    r.add_argument("--dir", required=True)
    a = p.parse_args()
    if a.cmd == "body":
        cmd_body(a)
    else:
        if a.duration_s <= WARMUP_S:
            sys.exit(f"door_oha.py: --duration-s must exceed the {WARMUP_S:.0f} s warm-up")
        cmd_report(a)


if __name__ == "__main__":
    main()
