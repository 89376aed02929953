#!/usr/bin/env python3
"""Lists the sample names SGLang's metrics collectors export, read from its source (no SGLang
run: its engines need a GPU), for crates/cli/tests/fixtures/sglang-*-metric-names.txt:

    pip download --no-deps sglang==0.5.23 -d /tmp/sgl && unzip -q -o /tmp/sgl/sglang-*.whl \
        'sglang/srt/observability/*' -d /tmp/sgl
    python3 scripts/golden/sglang_metric_names.py 0.5.23 /tmp/sgl/sglang/srt/observability/*.py

Every `Gauge/Counter/Histogram/Summary(name="sglang:...")` call of prometheus_client, with the
sample names each kind exposes (a counter's `_total`, a histogram's `_bucket`, `_sum`,
`_count`); SGLang's own GaugeHistogram is left out.
"""
import ast
import sys


def names(paths):
    out = set()
    for path in paths:
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            kind = getattr(node.func, "id", getattr(node.func, "attr", ""))
            name = next((k.value.value for k in node.keywords
                         if k.arg == "name" and isinstance(k.value, ast.Constant)
                         and isinstance(k.value.value, str)), None)
            if not name or not name.startswith("sglang:"):
                continue
            if kind == "Gauge":
                out.add(name)
            elif kind == "Counter":
                out.add(name if name.endswith("_total") else name + "_total")
            elif kind in ("Histogram", "Summary"):
                out.update(name + s for s in ("_sum", "_count"))
                if kind == "Histogram":
                    out.add(name + "_bucket")
    return sorted(out)


if __name__ == "__main__":
    version, paths = sys.argv[1], sys.argv[2:]
    print(f"# Sample names of SGLang {version}'s Prometheus metrics, read from its source")
    print("# (sglang/srt/observability/*.py of the PyPI wheel), not from a running engine;")
    print("# made by scripts/golden/sglang_metric_names.py (see crates/cli/tests/fixtures/README.md).")
    print("\n".join(names(paths)))
