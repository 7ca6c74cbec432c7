"""Parses a Fermata exposition with the Prometheus project's own Python parsers.

usage: parse_metrics.py TEXT_0.0.4_FILE OPENMETRICS_FILE

The 0.0.4 text goes through prometheus_client.parser, the OpenMetrics text
through prometheus_client.openmetrics.parser (strict: it refuses a missing
# EOF, a counter sample without _total, unsorted or missing histogram
buckets, unescaped text). Prints "<format> <family> <type>" per family;
exits non-zero on the first error.
"""

import sys

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text


def main():
    text = open(sys.argv[1], encoding="utf-8").read()
    om = open(sys.argv[2], encoding="utf-8").read()
    for name, parse in (("text", parse_text), ("openmetrics", parse_openmetrics)):
        src = text if name == "text" else om
        n = 0
        for fam in parse(src):
            print(name, fam.name, fam.type)
            n += 1
        if n == 0:
            raise SystemExit(f"{name}: no families")


if __name__ == "__main__":
    main()
