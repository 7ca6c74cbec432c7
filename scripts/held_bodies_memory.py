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

usage: held_bodies_memory.py FERMATA_BIN BUDGET_BYTES|default [CLIENTS] [MIB] [STAGGER_MS] [MODEL]
e.g.   held_bodies_memory.py target/release/fermata 1073741824 100 60 100
       held_bodies_memory.py target/release/fermata default 100 60 100
(`default`: no `--http-max-buffered-bytes`, the server's default: a quarter
of MemTotal, at least 256 MiB. MODEL: mlp unless given; the door refuses a
request whose head waited past its model's SLO before it was read, so on a
loaded machine a model with a longer SLO, cnn's 50 ms, lets more in.)
"""
import os, re, socket, subprocess, sys, threading, time

binp = sys.argv[1]
default_budget = sys.argv[2] == "default"
if default_budget:
    total = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal:"))
    budget = max(total // 4, 256 << 20)
else:
    budget = int(sys.argv[2])
clients = int(sys.argv[3]) if len(sys.argv) > 3 else 100
mib = int(sys.argv[4]) if len(sys.argv) > 4 else 60
stagger = float(sys.argv[5]) / 1000 if len(sys.argv) > 5 else 0.0
model = sys.argv[6] if len(sys.argv) > 6 else "mlp"
body = mib << 20

budget_args = [] if default_budget else ["--http-max-buffered-bytes", str(budget)]
srv = subprocess.Popen(
    [binp, "serve", "--executor", "onnx", "--models", "models", "--http-port", "0",
     *budget_args, "--http-max-body-bytes", str(64 << 20),
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
        s.sendall(f"POST /v2/models/{model}/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n".encode()
                  + f"content-length: {body + 1}\r\n\r\n".encode())
        for _ in range(mib):
            s.sendall(chunk)
        with lock:
            socks.append(s)
            status["held"] = status.get("held", 0) + 1
    except OSError as e:
        # What the server answered before it closed (429 at the door, 503
        # past the budget), else the error's name.
        what = type(e).__name__
        try:
            s.settimeout(2)
            m = re.match(rb"HTTP/1.1 (\d+)", s.recv(64))
            if m:
                what = "HTTP " + m.group(1).decode()
        except OSError:
            pass
        with lock:
            status[what] = status.get(what, 0) + 1


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
print(f"model {model}; clients {clients} (started {stagger*1000:.0f} ms apart) x {mib} MiB body (all but its last byte sent, then held open); budget {budget / 2**20:.0f} MiB{' (the default)' if default_budget else ''}")
print(f"server RSS before {base['VmRSS'] / 2**20:.0f} MiB; during: peak sampled {peak / 2**20:.0f} MiB, "
      f"VmHWM {r['VmHWM'] / 2**20:.0f} MiB; growth {(r['VmHWM'] - base['VmRSS']) / 2**20:.0f} MiB; "
      f"budget held peak {held_peak / 2**20:.0f} MiB; bodies evicted {ev}; client outcomes {status}")
for s in socks:
    s.close()
srv.terminate()
srv.wait(timeout=30)
