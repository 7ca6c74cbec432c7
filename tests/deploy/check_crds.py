"""Checks the custom resources of the deployment files, which
kubernetes-validate (built-in kinds only) leaves out:

* KServe's (ServingRuntime, InferenceService), strictly against the KServe
  Python SDK's own models of its CRDs (kserve.models, with the Kubernetes
  client's models for the embedded core types): every key known, every value
  of its declared type, every required field present;
* Prometheus Operator ServiceMonitors, against the CRD's schema as the
  @kubernetes-models npm package compiles it (tests/deploy/check_servicemonitor.js).

Other kinds are skipped. Each kind must occur at least once.

usage: check_crds.py NODE_MODULES FILE...   (one line per resource; exit 1 on
the first error, naming its path)
"""

import datetime
import json
import os
import re
import subprocess
import sys

import kserve.models
import kubernetes.client.models
import yaml

PRIMITIVE = {"str": str, "int": int, "bool": bool, "float": (int, float), "bytes": str}


def model_class(name):
    # The core types (V1ObjectMeta, V1Container, ...) from the Kubernetes
    # client, KServe's own from its SDK.
    for mod in (kubernetes.client.models, kserve.models):
        c = getattr(mod, name, None)
        if c is not None:
            return c
    raise SystemExit(f"no model class {name} in the kserve or kubernetes SDKs")


def required(cls):
    """The fields the model refuses as None (the SDK's own client-side check)."""
    out = []
    for attr in cls.openapi_types:
        prop = cls.__dict__.get(attr)
        if not isinstance(prop, property) or prop.fset is None:
            continue
        setter = prop.fset
        probe = cls.__new__(cls)
        probe.local_vars_configuration = type("C", (), {"client_side_validation": True})()
        try:
            setter(probe, None)
        except ValueError:
            out.append(attr)
    return out


def check(v, t, path):
    if t in PRIMITIVE:
        if t != "float" and isinstance(v, bool) != (t == "bool"):
            raise ValueError(f"{path}: {v!r} is not a {t}")
        if not isinstance(v, PRIMITIVE[t]):
            raise ValueError(f"{path}: {v!r} is not a {t}")
        return
    if t in ("object", "ResourceQuantity"):
        return
    if t == "datetime":
        if not isinstance(v, (str, datetime.datetime)):
            raise ValueError(f"{path}: {v!r} is not a date-time")
        return
    # kserve's models write list[X] and dict(str, X); the Kubernetes client's
    # List[X] and Dict[str, X].
    m = re.fullmatch(r"[lL]ist\[(.+)\]", t)
    if m:
        if not isinstance(v, list):
            raise ValueError(f"{path}: not a list of {m.group(1)}")
        for i, x in enumerate(v):
            check(x, m.group(1), f"{path}[{i}]")
        return
    m = re.fullmatch(r"dict\(str, (.+)\)", t) or re.fullmatch(r"Dict\[str, (.+)\]", t)
    if m:
        if not isinstance(v, dict):
            raise ValueError(f"{path}: not a map of {m.group(1)}")
        for k, x in v.items():
            check(x, m.group(1), f"{path}.{k}")
        return
    cls = model_class(t)
    if not isinstance(v, dict):
        raise ValueError(f"{path}: not an object ({t})")
    by_key = {k: a for a, k in cls.attribute_map.items()}
    for k, x in v.items():
        if k not in by_key:
            raise ValueError(f"{path}: unknown field `{k}` in {t} "
                             f"(it has: {', '.join(sorted(by_key))})")
        if x is not None:
            check(x, cls.openapi_types[by_key[k]], f"{path}.{k}")
    for a in required(cls):
        if v.get(cls.attribute_map[a]) is None:
            raise ValueError(f"{path}: {t} requires `{cls.attribute_map[a]}`")


KINDS = {("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
         ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "V1alpha1ClusterServingRuntime",
         ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService"}


def main():
    node_modules, files = sys.argv[1], sys.argv[2:]
    kserve_n, monitors = 0, []
    for f in files:
        for doc in yaml.safe_load_all(open(f, encoding="utf-8")):
            if not doc:
                continue
            key = (doc.get("apiVersion"), doc.get("kind"))
            if key == ("monitoring.coreos.com/v1", "ServiceMonitor"):
                monitors.append(doc)
                continue
            if key not in KINDS:
                continue
            try:
                check(doc, KINDS[key], key[1])
            except ValueError as e:
                raise SystemExit(f"{f}: {e}")
            print(f"ok {key[1]} {doc['metadata']['name']} ({os.path.basename(f)})")
            kserve_n += 1
    if kserve_n == 0 or not monitors:
        raise SystemExit(f"expected KServe resources and ServiceMonitors, got "
                         f"{kserve_n} and {len(monitors)}")
    js = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_servicemonitor.js")
    r = subprocess.run(["node", js], input=json.dumps(monitors), text=True,
                       capture_output=True, env=dict(os.environ, NODE_PATH=node_modules))
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        raise SystemExit(f"ServiceMonitor check failed: {r.stderr.strip()}")


if __name__ == "__main__":
    main()
