#!/usr/bin/env python3
"""Record a real vLLM engine's /metrics for the Grafana board's test, or check the board
against a live engine.

    target/vllm-venv/bin/python scripts/vllm/make_model.py target/vllm-model
    target/vllm-venv/bin/python scripts/vllm/record_metrics.py target/vllm-model \
        --out crates/cli/tests/fixtures/vllm-0.32.0-metrics.txt
    target/vllm-venv/bin/python scripts/vllm/record_metrics.py target/vllm-model --check

Starts one engine as the real-vLLM test does (engine.py: CPU, prefix caching, KV events on
127.0.0.1), sends a few chat requests (one streamed, a follow-up turn sharing a prefix) so that
the histograms and counters have samples, reads /metrics, and stops the engine (its process
group only). --out writes the text with a header saying where it came from; --check exits 1
when a `vllm:` name the board (deploy/kubernetes/base/monitoring/kvroute-dashboard.json)
queries is missing from the live text. Either way it prints the board's vLLM names it found.
"""
import argparse
import json
import os
import re
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import engine as eng  # noqa: E402

BOARD = os.path.join(ROOT, "deploy", "kubernetes", "base", "monitoring", "kvroute-dashboard.json")


def post_chat(url, messages, stream=False):
    body = {"model": eng.MODEL_NAME, "messages": messages, "max_tokens": 16,
            "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read().decode()
    if stream:
        chunks = [json.loads(line[6:]) for line in text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        return "".join(c["choices"][0]["delta"].get("content") or ""
                       for c in chunks if c.get("choices"))
    return json.loads(text)["choices"][0]["message"]["content"]


def board_vllm_names():
    with open(BOARD) as f:
        board = json.load(f)
    names = set()
    for p in board["panels"] + [q for p in board["panels"] for q in p.get("panels", [])]:
        for t in p.get("targets", []):
            names.update(re.findall(r"vllm:[A-Za-z0-9_:]+", t["expr"]))
    return sorted(names)


def sample_names(text):
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--out", help="write the /metrics text here")
    ap.add_argument("--check", action="store_true",
                    help="fail when the board queries a vllm: name the engine does not export")
    ap.add_argument("--cpu", default="0")
    ap.add_argument("--log", default=os.path.join(ROOT, "target", "vllm-record-metrics.log"))
    a = ap.parse_args()
    import vllm

    e = eng.Engine("engine", os.path.abspath(a.model_dir), sys.executable, a.cpu, a.log)
    e.start()
    try:
        secs = e.wait_ready()
        print(f"engine ready in {secs:.1f} s at {e.url}", flush=True)
        system = {"role": "system", "content": "You answer questions about caches. " * 20}
        turn1 = [system, {"role": "user", "content": "What is a prefix cache?"}]
        answer = post_chat(e.url, turn1)
        turn2 = turn1 + [{"role": "assistant", "content": answer},
                         {"role": "user", "content": "And why does routing matter?"}]
        post_chat(e.url, turn2, stream=True)
        post_chat(e.url, [system, {"role": "user", "content": "Name one eviction policy."}])
        time.sleep(1.0)  # the engine core's stats reach the API server's gauges once a step
        status, body = eng.http_get(e.url + "/metrics", timeout=10.0)
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        text = body.decode()
    finally:
        e.stop()

    names = sample_names(text)
    wanted = board_vllm_names()
    missing = [n for n in wanted if n not in names]
    print(f"{len(names)} sample names; the board queries {len(wanted)} vllm: names: "
          f"{', '.join(wanted)}")
    if a.out:
        header = (
            f"# Recorded from a real vLLM {vllm.__version__} CPU engine (scripts/vllm/engine.py "
            f"settings, the tiny model of scripts/vllm/make_model.py) after three chat requests,\n"
            f"# on {time.strftime('%Y-%m-%d')}, by scripts/vllm/record_metrics.py (re-record: see "
            f"crates/cli/tests/fixtures/README.md).\n"
        )
        with open(a.out, "w") as f:
            f.write(header + text)
        print(f"wrote {a.out} ({len(text)} bytes)")
    if missing:
        print(f"MISSING from the live engine: {', '.join(missing)}")
        return 1 if a.check else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
