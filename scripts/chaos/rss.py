#!/usr/bin/env python3
"""The RSS run of the chaos suite: `kvroute demo` (gateway, simulated workers, dashboard and
load generator in one process) at a steady load for SECS seconds, its resident memory sampled
every 5 s.

    # CI: 5 minutes, small bounds, judged on a budget
    python3 scripts/chaos/rss.py --secs 300 --small-bounds --max-rss-mib 320
    # the hour, judged on flatness
    python3 scripts/chaos/rss.py --kvroute target/release/kvroute --secs 3600 --small-bounds

The load generator's multi-turn conversations run at CONCURRENCY through the gateway.
`--small-bounds` shrinks the demo's bounded stores (tokenizer piece cache 4 MiB, replay
buffers 2 MiB per worker, 50 conversations kept) so that they are full early and what is left
to grow is what no bound holds. A run of at least 20 minutes is judged on flatness: after a
warm-up (the first fifth), the mean RSS of the last fifth is compared with the mean of the
fifth right after the warm-up, and the run fails when it grew by more than 10% and more than
16 MiB. That is judged on the RSS without the tokenizer library's pretoken tables (the
mappings advised for huge pages, read from /proc/PID/smaps): those double as new words come,
up to 64 MiB per tokenizing thread, so they are checked against that bound instead
(`--tokenizer-threads` x 64 MiB, plus 16 MiB for the tables all its threads share), in every
run. Any run fails when a sample exceeds
`--max-rss-mib`. Prints the series, the requests
served and the growth per request. Only 127.0.0.1 is used; the demo is stopped (SIGINT, then
SIGKILL) at the end, on failure and on a signal.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request


# Runs shorter than this are not judged on flatness, only on --max-rss-mib.
MIN_FLAT_SECS = 1200


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def huge_kib(pid):
    """Resident KiB of the mappings advised for huge pages (`hg` in smaps' VmFlags): in
    kvroute these are only the tokenizer library's per-thread pretoken tables (`fastokens`),
    which grow by doubling up to 64 MiB per tokenizing thread, and the tables its threads
    share."""
    total, rss = 0, 0
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmFlags:") and " hg" in line:
                    total += rss
    except OSError:
        return 0
    return total


def http(method, url, body=None, timeout=5.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


def requests_served(gw):
    text = http("GET", f"{gw}/metrics")
    return sum(float(m.group(1)) for m in
               re.finditer(r'^kvroute_requests_total\{[^}]*status="200"[^}]*\} (\S+)$', text, re.M))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvroute", default="target/debug/kvroute")
    ap.add_argument("--secs", type=float, default=300.0)
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--progress", action="store_true", help="print each sample as it is taken")
    ap.add_argument("--tokenizer-cache-mib", type=int, default=None,
                    help="the demo's tokenizer piece cache (default 64 MiB: it fills for ~12 min at this load)")
    ap.add_argument("--replay-buffer-mib", type=int, default=None,
                    help="each worker's KV event replay buffer (default 32 MiB: it fills for ~40 min at this load)")
    ap.add_argument("--max-conversations", type=int, default=None,
                    help="conversations the dashboard keeps (default 500: the store fills for ~15 min at this load)")
    ap.add_argument("--small-bounds", action="store_true",
                    help="--tokenizer-cache-mib 4 --replay-buffer-mib 2 --max-conversations 50")
    ap.add_argument("--tokenizer-threads", type=int, default=2,
                    help="threads that tokenize (the demo's default 2): each may hold a pretoken table of up to 64 MiB")
    ap.add_argument("--max-rss-mib", type=float, default=None,
                    help="fail when a sample exceeds this resident size (the budget a short run checks)")
    args = ap.parse_args()
    if args.small_bounds:  # each only where not given
        for name, small in (("tokenizer_cache_mib", 4), ("replay_buffer_mib", 2), ("max_conversations", 50)):
            if getattr(args, name) is None:
                setattr(args, name, small)
    port, ui = free_port(), free_port()
    gw, dash = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{ui}"
    cmd = [args.kvroute, "demo", "--port", str(port), "--ui-port", str(ui), "--worker-port", "0"]
    if args.tokenizer_cache_mib is not None:
        cmd += ["--tokenizer-cache-mib", str(args.tokenizer_cache_mib)]
    if args.max_conversations is not None:
        cmd += ["--max-conversations", str(args.max_conversations)]
    if args.replay_buffer_mib is not None:
        cmd += ["--replay-buffer-mib", str(args.replay_buffer_mib)]
    cmd += ["--tokenizer-threads", str(args.tokenizer_threads)]
    demo = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})

    def stop(*_):
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(timeout=20)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait()

    signal.signal(signal.SIGTERM, lambda *_: (stop(), sys.exit(1)))
    try:
        deadline = time.time() + 60
        while True:
            try:
                http("GET", f"{gw}/health")
                http("GET", f"{dash}/api/status")
                break
            except Exception:
                if time.time() > deadline or demo.poll() is not None:
                    print("rss: the demo did not come up within 60 s")
                    return 1
                time.sleep(0.2)
        http("POST", f"{dash}/api/concurrency", {"concurrency": args.concurrency})
        http("POST", f"{dash}/api/start", {})
        t0 = time.time()
        series = []  # (seconds, RSS KiB, requests served, KiB of the tokenizer's tables)
        while time.time() - t0 < args.secs:
            time.sleep(5.0)
            if demo.poll() is not None:
                print(f"rss: the demo exited ({demo.returncode}) {time.time() - t0:.0f} s into the run")
                return 1
            series.append((round(time.time() - t0), rss_kib(demo.pid), requests_served(gw),
                           huge_kib(demo.pid)))
            if args.progress:
                s, k, q, t = series[-1]
                print(f"rss: {s} s {k / 1024:.1f} MiB (tokenizer tables {t / 1024:.1f}) {int(q)} requests",
                      flush=True)
        http("POST", f"{dash}/api/stop", {})
    finally:
        stop()
    n = len(series)
    fifth = max(1, n // 5)
    warm = max(fifth, min(n - 2 * fifth, int(30 / 5)))
    early = series[warm:warm + fifth]
    late = series[-fifth:]
    mean = lambda rows, f=lambda r: r[1]: sum(f(r) for r in rows) / len(rows)  # noqa: E731
    e, l = mean(early), mean(late)
    # Without the tokenizer's tables: what must stay flat (the tables have a bound of their own).
    rest = lambda r: r[1] - r[3]  # noqa: E731
    e_rest, l_rest = mean(early, rest), mean(late, rest)
    turns = late[-1][2] - early[0][2]
    growth = (l - e) * 1024
    per_turn = growth / turns if turns > 0 else float("nan")
    print("rss: seconds, RSS MiB, requests served, tokenizer tables MiB: " +
          ", ".join(f"({s}, {k / 1024:.1f}, {int(q)}, {t / 1024:.0f})" for s, k, q, t in series))
    print(f"rss: {args.secs:.0f} s at concurrency {args.concurrency}: {int(series[-1][2])} requests; "
          f"RSS after warm-up {e / 1024:.1f} MiB (mean of {series[warm][0]}-{early[-1][0]} s), "
          f"at the end {l / 1024:.1f} MiB (mean of {late[0][0]}-{late[-1][0]} s): "
          f"{(l / e - 1) * 100:+.1f}%, {growth / 1024 / 1024:+.1f} MiB over {int(turns)} requests "
          f"({per_turn:+.0f} bytes per request)")
    print(f"rss: without the tokenizer's tables: {e_rest / 1024:.1f} MiB after warm-up, "
          f"{l_rest / 1024:.1f} MiB at the end ({(l_rest / e_rest - 1) * 100:+.1f}%); "
          f"the tables: {late[-1][3] / 1024:.0f} MiB at the end")
    peak = max(r[1] for r in series)
    tables_peak = max(r[3] for r in series)
    # 64 MiB per tokenizing thread, and 16 MiB for the tables all threads share (the model's
    # seed words, a shared cache: 8 MiB with the builtin tokenizer).
    tables_bound = (args.tokenizer_threads * 64 + 16) * 1024
    bounded = tables_peak <= tables_bound
    ok = bounded
    print(f"rss: {'PASS' if bounded else 'FAIL'}: the tokenizer's tables peaked at {tables_peak / 1024:.0f} MiB, "
          f"bound {tables_bound / 1024:.0f} MiB ({args.tokenizer_threads} threads x 64 MiB + 16 MiB shared)")
    if args.max_rss_mib is not None:
        within = peak <= args.max_rss_mib * 1024
        ok &= within
        print(f"rss: {'PASS' if within else 'FAIL'}: peak {peak / 1024:.1f} MiB "
              f"{'within' if within else 'over'} the budget of {args.max_rss_mib:.0f} MiB")
    if args.secs >= MIN_FLAT_SECS:
        flat = l_rest <= e_rest * 1.10 or (l_rest - e_rest) <= 16 * 1024
        ok &= flat
        print(f"rss: {'PASS' if flat else 'FAIL'}: memory besides the tokenizer's tables "
              f"{'flat' if flat else 'grows'} under steady load")
        whole = l <= e * 1.10 or (l - e) <= 16 * 1024
        print("rss: the whole RSS is flat too" if whole else
              "rss: the whole RSS still grows: the tokenizer's tables are below their bound")
    else:
        print(f"rss: flatness not judged: a run under {MIN_FLAT_SECS} s does not reach steady state "
              "(bounded caches, the tokenizer's per-thread caches among them, fill for ~10 min)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
