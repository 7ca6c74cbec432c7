#!/usr/bin/env python3
"""Clients each hold a large HTTP body open against `fermata serve`: the
server's resident memory against its buffered-bytes budget
(`--http-max-buffered-bytes`).

Starts `FERMATA_BIN serve --executor onnx --models models --http-port 0` with
the budget, then CLIENTS clients (started STAGGER_MS apart), each sending an
mlp inference whose Content-Length is MIB MiB + 1 and all but its last byte,
then holding the connection open. Prints the server's resident memory before
and during (peak sampled, VmHWM), the budget's peak (from
`fermata_http_buffered_bytes`), the bodies evicted and the clients' outcomes.
Run from the repository root.

usage: held_bodies_memory.py FERMATA_BIN BUDGET_BYTES [CLIENTS] [MIB] [STAGGER_MS]
e.g.   held_bodies_memory.py target/release/fermata 1073741824 100 60 100
"""
import os, re, socket, subprocess, sys, threading, time

binp, budget = sys.argv[1], int(sys.argv[2])
clients = int(sys.argv[3]) if len(sys.argv) > 3 else 100
mib = int(sys.argv[4]) if len(sys.argv) > 4 else 60
stagger = float(sys.argv[5]) / 1000 if len(sys.argv) > 5 else 0.0
body = mib << 20

srv = subprocess.Popen(
    [binp, "serve", "--executor", "onnx", "--models", "models", "--http-port", "0",
     "--http-max-buffered-bytes", str(budget), "--http-max-body-bytes", str(64 << 20),
     "--http-body-timeout-ms", "120000"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
port = None
t0 = time.time()
for line in srv.stdout:
    m = re.search(r"127\.0\.0\.1:(\d+)", line)
    if m and "http" in line.lower():
        port = int(m.group(1))
        break
    if time.time() - t0 > 60:
        break
if port is None:
    print("no port"); srv.kill(); sys.exit(1)
threading.Thread(target=lambda: [None for _ in srv.stdout], daemon=True).start()


def rss(pid):
    d = {}
    for l in open(f"/proc/{pid}/status"):
        k, v = l.split(":", 1)
        if k in ("VmRSS", "VmHWM"):
            d[k] = int(v.split()[0]) * 1024
    return d


def metric(name):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    data = b""
    while True:
        c = s.recv(1 << 16)
        if not c:
            break
        data += c
    for l in data.decode(errors="replace").splitlines():
        if l.startswith(name + " ") or l.startswith(name + "{"):
            return float(l.split()[-1])
    return None


time.sleep(2)
base = rss(srv.pid)
status = {}
socks = []
lock = threading.Lock()
chunk = b" " * (1 << 20)


def client(i):
    try:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  + f"content-length: {body + 1}\r\n\r\n".encode())
        for _ in range(mib):
            s.sendall(chunk)
        with lock:
            socks.append(s)
            status["held"] = status.get("held", 0) + 1
    except OSError as e:
        with lock:
            status[type(e).__name__] = status.get(type(e).__name__, 0) + 1


ths = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
t1 = time.time()


def start_all():
    for t in ths:
        t.start()
        time.sleep(stagger)


starter = threading.Thread(target=start_all)
starter.start()
peak = 0
held_peak = 0
while starter.is_alive() or any(t.is_alive() for t in ths) or time.time() - t1 < 10:
    r = rss(srv.pid)
    peak = max(peak, r["VmRSS"])
    h = metric("fermata_http_buffered_bytes") or 0
    held_peak = max(held_peak, h)
    time.sleep(0.5)
    if time.time() - t1 > 120:
        break
r = rss(srv.pid)
ev = metric("fermata_http_bodies_evicted_total")
print(f"clients {clients} (started {stagger*1000:.0f} ms apart) x {mib} MiB body (all but its last byte sent, then held open); budget {budget / 2**20:.0f} MiB")
print(f"server RSS before {base['VmRSS'] / 2**20:.0f} MiB; during: peak sampled {peak / 2**20:.0f} MiB, "
      f"VmHWM {r['VmHWM'] / 2**20:.0f} MiB; growth {(r['VmHWM'] - base['VmRSS']) / 2**20:.0f} MiB; "
      f"budget held peak {held_peak / 2**20:.0f} MiB; bodies evicted {ev}; client outcomes {status}")
for s in socks:
    s.close()
srv.terminate()
srv.wait(timeout=30)
