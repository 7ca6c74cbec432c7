#!/usr/bin/env python3
"""Checks rendered Kubernetes manifests against the `fermata` binary they run:
every container of a Deployment (and the KServe ServingRuntime example) runs a
role of the binary whose flags that role accepts, each at most once.

    python3 tests/deploy/check_manifests.py FERMATA_BINARY FILE.yaml...

Run by `cargo test --test deploy`; one line per container; exit 1 on the first
flag a role does not take.
"""

import re
import subprocess
import sys

import yaml


def flags_of(exe, role, cache={}):
    if role not in cache:
        out = subprocess.run([exe, role, "--help"], capture_output=True, text=True, check=True)
        cache[role] = set(re.findall(r"(--[a-z0-9-]+)", out.stdout))
    return cache[role]


def main():
    exe, files = sys.argv[1], sys.argv[2:]
    checked = 0
    for path in files:
        for doc in yaml.safe_load_all(open(path)):
            if not doc:
                continue
            kind = doc.get("kind")
            if kind == "Deployment":
                pod = doc["spec"]["template"]["spec"]
                containers = pod.get("containers", [])
            elif kind == "ServingRuntime":
                containers = doc["spec"]["containers"]
            else:
                continue
            for c in containers:
                args = c.get("args", [])
                if not args:
                    continue
                role, rest = args[0], args[1:]
                known = flags_of(exe, role)
                seen = set()
                for a in rest:
                    if not a.startswith("--"):
                        continue
                    flag = a.split("=", 1)[0]
                    if flag not in known:
                        print(f"FAIL {path}: {doc['metadata']['name']}/{c['name']}: `fermata {role}` has no {flag}")
                        return 1
                    if flag in seen:
                        print(f"FAIL {path}: {doc['metadata']['name']}/{c['name']}: {flag} given twice")
                        return 1
                    seen.add(flag)
                print(f"ok   {doc['metadata']['name']}/{c['name']}: fermata {role} takes all {len(seen)} flags")
                checked += 1
    print(f"{checked} containers checked")
    return 0 if checked else 1


if __name__ == "__main__":
    sys.exit(main())
