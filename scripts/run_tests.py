#!/usr/bin/env python3
"""Runs the test executables `cargo test --no-run --message-format=json` built,
JOBS at a time, each with one test thread; prints each one's whole output when
it ends, headed like cargo's, and exits non-zero if any failed.

Why not `cargo test`: it runs its test executables one after the other, each
with as many test threads as cores, so a file whose last test is long leaves
the other cores idle until it ends (Triton's L0 tests hold one for half a
minute). Here JOBS executables run at once, so the number of tests running at
once is the same as cargo's (one per core by default) and the cores stay busy.

Usage: run_tests.py CARGO_JSON [JOBS]  (JOBS: default the number of cores)

Those in ALONE run first, one after another, each with JOBS test threads, as
`cargo test` would run them: their tests judge real-time outcomes (goodput,
deadlines, heartbeats) and their authors kept them off each other's cores.

Executables that ran before start longest first (their times are kept in
target/test-times.json); the others start in the order of LONG below, then by
name.
"""
import json
import os
import subprocess
import sys
import threading
import time

# Executables known to take longest, started first when no earlier times are
# at hand (a fresh clone): starting them last would leave one core running them
# alone at the end.
LONG = ["fermata", "clients", "cluster_auth", "rejoin", "autoscale",
        "perf_analyzer"]

# Executables whose tests run real clusters and judge their timing (bad rates,
# deadlines met, a backend's heartbeats on time) on the assumption that nothing
# else holds the cores. Four hold a SERIAL lock for that; the other two failed
# beside other executables' tests on 2 cores (the ranker missed its 10 ms SLO
# three times; a backend's heartbeats came late and it was taken out).
ALONE = {
    "distributed", "http", "runtime", "hostile_peers",  # their SERIAL lock
    "deploy",  # the image test serves every shipped model under its own SLO
    "onnx_executor",  # a served model's backend keeps its heartbeats on time
}


def executables(path):
    """(name, kind, src_path, executable) of every test or bench executable."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                m = json.loads(line)
            except ValueError:
                continue
            if m.get("reason") != "compiler-artifact" or not m.get("executable"):
                continue
            t = m["target"]
            kind = t["kind"][0]
            # Test builds of the lib, bins and tests/; benches run once as a
            # smoke run (no --bench), as `cargo test --all-targets` runs them.
            if m["profile"]["test"] or kind == "bench":
                out.append((t["name"], kind, t["src_path"], m["executable"]))
    return out


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    jobs = int(sys.argv[2]) if len(sys.argv) == 3 else os.cpu_count() or 1
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    times_path = os.path.join(root, "target", "test-times.json")
    try:
        with open(times_path) as f:
            times = json.load(f)
    except (OSError, ValueError):
        times = {}
    todo = executables(sys.argv[1])
    if not todo:
        print("run_tests.py: no test executables in the build's output", file=sys.stderr)
        return 1

    def key(e):
        name, kind = e[0], e[1]
        t = times.get(f"{kind}:{name}")
        hint = LONG.index(name) if name in LONG else len(LONG)
        return (-(t or 0.0), hint, name, kind)

    todo.sort(key=key)
    env = dict(os.environ)
    env.setdefault("CARGO_MANIFEST_DIR", root)
    lock = threading.Lock()
    failed = []
    took = {}

    alone = [e for e in todo if e[1] == "test" and e[0] in ALONE]
    todo = [e for e in todo if e not in alone]

    def run(name, kind, src, exe, threads):
        # harness = false benches take no libtest flags.
        args = [exe] if kind == "bench" else [exe, f"--test-threads={threads}"]
        t0 = time.monotonic()
        p = subprocess.run(args, cwd=root, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
        dt = time.monotonic() - t0
        text = p.stdout.decode("utf-8", "replace")
        rel = os.path.relpath(src, root)
        with lock:
            took[f"{kind}:{name}"] = dt
            sys.stdout.write(f"     Running {rel} ({os.path.relpath(exe, root)}) "
                             f"[{dt:.1f} s]\n{text}")
            if p.returncode != 0:
                failed.append(f"{rel}: exit status {p.returncode}")
                if "test result:" not in text:
                    sys.stdout.write(f"error: {rel} ended with exit status "
                                     f"{p.returncode} and no test result\n")
            sys.stdout.flush()

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                e = todo.pop(0)
            run(*e, 1)

    t0 = time.monotonic()
    for e in alone:
        run(*e, max(1, jobs))
    threads = [threading.Thread(target=worker) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    times.update(took)
    try:
        with open(times_path, "w") as f:
            json.dump(times, f, indent=1, sort_keys=True)
    except OSError:
        pass
    print(f"ran {len(took)} test executables, {len(alone)} alone and the rest "
          f"{jobs} at a time, in {time.monotonic() - t0:.0f} s")
    if failed:
        print("failed: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
