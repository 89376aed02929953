"""A shared-prefix load on a fixed schedule against an OpenAI-compatible URL, the same for
any router in front (text prompts on /v1/completions, streamed): request i is sent at
i / RATE seconds whatever the earlier ones do (open loop), its prompt one of PREFIXES long
shared prefixes (chosen by a seeded generator, uniform) followed by a short unique question.
Prints one JSON object: completed, failed, the prompt tokens the engines read from their
cache over all prompt tokens (from the usage they report), the share a router could reach
at best (every use of a prefix after its first cached: the trace's ideal), TTFT mean and p50.

Usage: python3 shared_prefix_load.py URL MODEL REQUESTS RATE PREFIXES PREFIX_WORDS SEED CALIBRATE_URL
(CALIBRATE_URL: a fresh engine of its own, asked each prefix twice for the tokens of it an
engine can cache, which the ideal counts.)
"""

import json
import random
import statistics
import sys
import threading
import time
import urllib.request


def prompt_texts(prefixes, words, requests, seed):
    rng = random.Random(seed)
    bank = [
        " ".join(f"topic{p} item{w % 97} fact{(w * 7 + p) % 89}" for w in range(words // 3))
        for p in range(prefixes)
    ]
    order = [rng.randrange(prefixes) for _ in range(requests)]
    texts = [f"{bank[k]}\nQuestion {i}: what follows from entry {rng.randrange(10**9)}?" for i, k in enumerate(order)]
    return order, texts


def one(url, model, text, out, i):
    body = json.dumps({
        "model": model,
        "prompt": text,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"content-type": "application/json"})
    start = time.monotonic()
    ttft = None
    usage = None
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                if ttft is None and any(c.get("text") for c in ev.get("choices", [])):
                    ttft = time.monotonic() - start
                if ev.get("usage"):
                    usage = ev["usage"]
        out[i] = (ttft, usage)
    except Exception as e:  # counted as failed
        out[i] = (None, {"error": str(e)})


def cacheable(url, model, prefixes, words, seed):
    """Per prefix, the tokens of it an engine finds cached on its second use."""
    order, texts = prompt_texts(prefixes, words, prefixes * 50, seed)
    first = {}
    for k, text in zip(order, texts):
        first.setdefault(k, text)
    out = {}
    for k, text in first.items():
        res = [None]
        one(url, model, text, res, 0)
        other = text.rsplit("Question ", 1)[0] + "Question 0: what follows from entry 1?"
        one(url, model, other, res, 0)
        out[k] = (res[0][1].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return out


def main():
    url, model = sys.argv[1], sys.argv[2]
    requests, rate = int(sys.argv[3]), float(sys.argv[4])
    prefixes, words, seed = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    per_prefix = cacheable(sys.argv[8], model, prefixes, words, seed)
    order, texts = prompt_texts(prefixes, words, requests, seed)
    out = [None] * requests
    threads = []
    t0 = time.monotonic()
    for i, text in enumerate(texts):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=one, args=(url, model, text, out, i))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    done = [(t, u) for t, u in out if t is not None and u and "prompt_tokens" in u]
    prompt = sum(u["prompt_tokens"] for _, u in done)
    cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for _, u in done)
    # The ideal: every use of a prefix after its first finds the prefix cached.
    seen, ideal = set(), 0
    for k, (t, u) in zip(order, out):
        if t is None or not u or "prompt_tokens" not in u:
            continue
        if k in seen:
            ideal += per_prefix.get(k, 0)
        seen.add(k)
    ttfts = [t * 1000 for t, _ in done]
    print(json.dumps({
        "completed": len(done),
        "failed": requests - len(done),
        "cache_read_share": cached / prompt if prompt else None,
        "ideal_share": ideal / prompt if prompt else None,
        "ttft_mean_ms": statistics.mean(ttfts) if ttfts else None,
        "ttft_p50_ms": statistics.median(ttfts) if ttfts else None,
    }))


if __name__ == "__main__":
    main()
