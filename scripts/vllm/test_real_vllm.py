#!/usr/bin/env python3
"""kvroute in front of two real vLLM 0.32 (CPU) engines: KV events, predictions, failures.

    target/vllm-venv/bin/python scripts/vllm/test_real_vllm.py --kvroute target/debug/kvroute

(scripts/vllm/run.sh installs the venv and the model first, then runs this.)

Two engines serve a tiny random Llama (make_model.py) with prefix caching, 32-token blocks and
KV events on ZMQ (PUB + replay ROUTER); `kvroute serve --policy predictive` with the model's
tokenizer sits in front. Every request goes through the official `openai` client, streaming,
with usage in the last chunk; the gateway's `x-kvroute-worker` and
`x-kvroute-predicted-cached-tokens` headers are compared with the engine's own
`usage.prompt_tokens_details.cached_tokens`. "Predicted right" means within one block (32
tokens) of the reported figure. Scenarios:

  b. a conversation begun on engine 1 before the gateway starts is known after catch-up, and
     the engine's capacity is learned from its `vllm:cache_config_info`;
  a. multi-turn conversations: no failure, no 499, every KV event applied, predictions right;
  f. the same block-aligned prompt sent again: predicted exactly as the engine counts it (a
     full hit stops at prompt length - 1, so one block less than the prompt);
  c. engine 1 stalled 7 s (SIGSTOP/SIGCONT of its whole process group): index kept, and
     follow-ups predicted right for it (whether the policy sends them there or not);
  d. engine 2 killed and started again on the same ports: known empty at once, then
     re-subscribed and predicted right (again whatever the policy chooses);
  e. the engine the gateway sends more to hangs (SIGSTOP) for 1 s while requests run (more
     are sent on its conversations while it is stopped), then is killed (SIGKILL): nothing
     that had not started streaming fails, nothing is counted 499. When only the setup did
     not hold (no request without a chunk in flight on it at the kill), the engine is started
     again and the scenario repeated, at most 3 attempts.

Each scenario prints its figures and PASS or FAIL; the last line is `N passed, M failed`, and
the exit code is non-zero when any failed. Every process started here is stopped at the end,
on failure, on a signal, and at the overall deadline.
"""
import argparse
import os
import random
import re
import signal
import sys
import threading
import time
import urllib.request
import traceback
from concurrent.futures import ThreadPoolExecutor

import httpx
from openai import OpenAI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import engine as eng  # noqa: E402

BLOCK = eng.BLOCK_SIZE
MODEL = eng.MODEL_NAME

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one "
    "had by word but not what all were we when your can said there use an each which she do how "
    "their if will up other about out many then them these so some her would make like him into "
    "time has look two more write go see number no way could people my than first water been call "
    "who oil its now find long down day did get come made may part over new sound take only little "
    "work know place year live me back give most very after thing our just name good sentence man "
    "think say great where help through much before line right too mean old any same tell boy follow "
    "came want show also around form three small set put end does another well large must big even "
    "such because turn here why ask went men read need land different home us move try kind hand "
    "picture again change off play spell air away animal house point page letter mother answer found "
    "study still learn should america world river mountain cloud stone paper glass light shadow"
).split()


def log(msg=""):
    print(msg, flush=True)


def text(rng, n_words):
    out = []
    for _ in range(n_words):
        w = rng.choice(WORDS)
        if rng.random() < 0.08:
            w += str(rng.randint(0, 999))
        out.append(w)
    return " ".join(out)


class Turn:
    def __init__(self, conv, n):
        self.conv = conv
        self.n = n
        self.worker = None
        self.predicted = None
        self.reported = None
        self.prompt_tokens = None
        self.completion_tokens = None
        self.chunks = 0
        self.ok = False
        self.stage = None  # where it failed: request (no answer), headers (no chunk), stream
        self.error = None
        self.secs = None
        self.t_start = None
        self.t_end = None

    @property
    def close(self):
        return (self.ok and self.predicted is not None and self.reported is not None
                and abs(self.predicted - self.reported) <= BLOCK)

    @property
    def good(self):
        return self.close and self.predicted > 0 and self.reported > 0

    def fig(self):
        tag = f"{self.conv.cid}.t{self.n}"
        if not self.ok:
            return f"{tag} FAILED at {self.stage}: {self.error}"
        return (f"{tag} {self.worker} pred {self.predicted} rep {self.reported} "
                f"(prompt {self.prompt_tokens})")


class Conv:
    def __init__(self, cid, rng, first_words):
        self.cid = cid
        self.rng = rng
        self.messages = [{"role": "user", "content": f"Conversation {cid}. " + text(rng, first_words)}]
        self.turns = []

    @property
    def last_worker(self):
        ok = [t for t in self.turns if t.ok]
        return ok[-1].worker if ok else None

    def add_user(self, n_words=None):
        n = n_words or self.rng.randint(30, 80)
        self.messages.append({"role": "user", "content": text(self.rng, n)})


_clients = {}
_clients_lock = threading.Lock()


def client_for(url, timeout=60.0):
    """One shared client per (url, timeout): building one loads TLS certificates, which takes
    long on a machine whose cores the engines keep busy. The clients never retry."""
    with _clients_lock:
        c = _clients.get((url, timeout))
        if c is None:
            c = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                       timeout=httpx.Timeout(timeout, connect=5.0))
            _clients[(url, timeout)] = c
        return c


def do_turn(client, conv, max_tokens=16, extra_body=None, on_chunk=None, worker=None, stream=True):
    """One chat turn (streamed unless `stream` is false); appends the reply to the conversation
    when it succeeds. `worker` names the engine of a request sent straight to it."""
    t = Turn(conv, len(conv.turns) + 1)
    t.t_start = time.time()
    conv.turns.append(t)  # visible (worker, chunks) while it streams
    parts = []
    try:
        if stream:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=conv.messages, max_tokens=max_tokens, temperature=0.0,
                stream=True, stream_options={"include_usage": True}, extra_body=extra_body)
        else:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=conv.messages, max_tokens=max_tokens, temperature=0.0,
                extra_body=extra_body)
        t.worker = raw.headers.get("x-kvroute-worker") or worker
        p = raw.headers.get("x-kvroute-predicted-cached-tokens")
        t.predicted = int(p) if p is not None else None
        chunks = raw.parse()
        t.stage = "headers"
        if not stream:
            chunks = [chunks]  # the whole answer as one "chunk" with its usage
        for chunk in chunks:
            t.chunks += 1
            t.stage = "stream"
            if on_chunk is not None:
                on_chunk(t)
            for c in chunk.choices:
                piece = c.message if not stream else c.delta
                if piece is not None and piece.content:
                    parts.append(piece.content)
            if chunk.usage is not None:
                u = chunk.usage
                t.prompt_tokens = u.prompt_tokens
                t.completion_tokens = u.completion_tokens
                d = u.prompt_tokens_details
                t.reported = d.cached_tokens if d is not None and d.cached_tokens is not None else None
        if t.prompt_tokens is None:
            raise RuntimeError("no usage chunk")
        t.ok = True
        t.stage = None
    except Exception as e:  # the failure is the figure
        if t.stage is None:
            t.stage = "request"
        t.error = f"{type(e).__name__}: {str(e)[:160]}"
    t.t_end = time.time()
    t.secs = t.t_end - t.t_start
    if t.ok:
        conv.messages.append({"role": "assistant", "content": "".join(parts)})
    return t


class Result:
    def __init__(self, name, title):
        self.name = name
        self.title = title
        self.lines = []
        self.checks = []  # (ok, text)
        self.error = None

    def info(self, s):
        self.lines.append(s)
        log(f"   {s}")

    def check(self, ok, s):
        self.checks.append((bool(ok), s))
        log(f"   [{'ok' if ok else 'FAIL'}] {s}")

    @property
    def passed(self):
        return self.error is None and bool(self.checks) and all(ok for ok, _ in self.checks)


class Run:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        os.makedirs(args.logs, exist_ok=True)
        for f in ("engine1.log", "engine2.log", "gateway.log"):
            try:
                os.remove(os.path.join(args.logs, f))
            except FileNotFoundError:
                pass
        py = args.python
        self.e1 = eng.Engine("engine1", args.model, py, "0", os.path.join(args.logs, "engine1.log"))
        self.e2 = eng.Engine("engine2", args.model, py, "1", os.path.join(args.logs, "engine2.log"))
        self.gw = None
        self.results = []
        self.convs = []
        self.lock = threading.Lock()

    # ---- plumbing -------------------------------------------------------------------------

    def procs(self):
        return [p for p in (self.gw, self.e1, self.e2) if p is not None]

    def cleanup(self):
        for p in self.procs():
            try:
                p.stop(grace=3.0)
            except Exception as e:
                log(f"cleanup of {p.name}: {e}")

    def names(self):
        return {self.e1.gateway_name: "e1", self.e2.gateway_name: "e2"}

    def w(self, name):
        return self.names().get(name, name)

    def new_conv(self, prefix, first_words=None):
        with self.lock:
            cid = f"{prefix}{len([c for c in self.convs if c.cid.startswith(prefix)])}"
            c = Conv(cid, random.Random(self.rng.random()), first_words or self.rng.randint(330, 600))
            self.convs.append(c)
        return c

    def gw_client(self, timeout=60.0):
        return client_for(self.gw.url, timeout)

    def worker_view(self, engine):
        """A compact view of the gateway's /debug/workers entry for an engine."""
        w = self.gw.workers().get(engine.gateway_name)
        if w is None:
            return {"missing": True}
        inner = w.get("worker", {})
        view = {
            "health": inner.get("health"),
            "index_blocks": w.get("index_blocks"),
            "next_seq": inner.get("next_seq"),
            "event_batches": inner.get("event_batches"),
            "gaps": inner.get("gaps"),
            "replayed": inner.get("replayed"),
            "restarts": inner.get("restarts"),
            "degraded": inner.get("degraded"),
            "kv_blocks": (w.get("capacity") or {}).get("kv_blocks"),
        }
        for k in ("cache_state", "resubscribes"):  # newer gateways
            for src in (w, inner):
                if k in src:
                    view[k] = src[k]
        return view

    def wait_health(self, engine, want, timeout):
        deadline = time.time() + timeout
        seen = None
        while time.time() < deadline:
            try:
                seen = self.worker_view(engine).get("health")
            except Exception as e:
                seen = f"error {e}"
            if seen == want:
                return True, seen
            time.sleep(0.2)
        return False, seen

    def settle(self, timeout=5.0):
        """Waits until the gateway has no request in flight (its own accounting)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = self.gw.metrics()
            if eng.metric_sum(m, "kvroute_inflight_requests") == 0:
                return m
            time.sleep(0.1)
        return self.gw.metrics()

    def memory(self, e):
        pids = e.pids()
        return f"{len(pids)} processes, PSS {eng.pss_mib(pids):.0f} MiB (RSS {eng.rss_mib(pids):.0f} MiB)"

    # ---- start-up ---------------------------------------------------------------------------

    def start_engines(self):
        log("== start-up")
        t0 = time.time()
        for attempt in (1, 2):
            self.e1.start()
            self.e2.start()
            try:
                s1 = self.e1.wait_ready()
                s2 = self.e2.wait_ready()
                break
            except RuntimeError as err:
                if attempt == 2 or "Address already in use" not in str(err):
                    raise
                log("   a port was taken meanwhile (Address already in use): new ports, once more")
                for e in (self.e1, self.e2):
                    e.stop()
                    e.new_ports()
                t0 = time.time()
        log(f"   two engines started side by side in {time.time() - t0:.1f} s "
            f"(engine1 {s1:.1f} s, engine2 {s2:.1f} s; each pinned to one core)")
        for e in (self.e1, self.e2):
            log(f"   {e.name}: {e.url} events {e.pub} replay {e.replay}; {self.memory(e)}")
        # One 1,000-token prompt with 16 output tokens, straight to engine 2 (a prefix no
        # scenario uses).
        c2 = client_for(self.e2.url)
        rng = random.Random(99)
        probe = Conv("probe", rng, 400)
        t = do_turn(c2, probe, max_tokens=16, extra_body={"min_tokens": 16})
        if not t.ok:
            raise RuntimeError(f"engine2 did not answer: {t.error}")
        words = max(1, round(400 * 1000 / t.prompt_tokens))
        probe2 = Conv("probe", rng, words)
        cold = do_turn(c2, probe2, max_tokens=16, extra_body={"min_tokens": 16})
        probe2.messages.pop()
        warm = do_turn(c2, probe2, max_tokens=16, extra_body={"min_tokens": 16})
        if not (cold.ok and warm.ok):
            raise RuntimeError(f"engine2 did not answer: {cold.error or warm.error}")
        log(f"   {cold.prompt_tokens}-token prompt + {cold.completion_tokens} output tokens on engine2: "
            f"{cold.secs * 1000:.0f} ms uncached, {warm.secs * 1000:.0f} ms again "
            f"({warm.reported} cached: the hit stops at prompt length - 1, rounded down to a block)")

    def start_gateway(self):
        self.gw = eng.Gateway(self.args.kvroute, [self.e1, self.e2], self.args.model,
                              os.path.join(self.args.logs, "gateway.log"))
        t0 = time.time()
        self.gw.start()
        self.gw.wait_ready()
        log(f"   gateway {self.gw.url} ready in {time.time() - t0:.2f} s "
            f"(--policy predictive --tokenizer {self.args.model} --block-size {BLOCK})")

    # ---- scenarios --------------------------------------------------------------------------

    def scenario_b_prepare(self):
        """A conversation begun directly on engine 1, before the gateway exists."""
        self.conv_b = self.new_conv("b", 500)
        t = do_turn(client_for(self.e1.url), self.conv_b, worker=self.e1.gateway_name)
        if not t.ok:
            raise RuntimeError(f"engine1 did not answer: {t.error}")
        self.conv_b_t1 = t

    def scenario_b(self, r):
        t1 = self.conv_b_t1
        r.info(f"turn 1 sent straight to engine1 before the gateway started: prompt {t1.prompt_tokens} "
               f"tokens, {t1.completion_tokens} generated")
        deadline = time.time() + 10.0
        view = self.worker_view(self.e1)
        while time.time() < deadline and not view.get("index_blocks"):
            time.sleep(0.2)
            view = self.worker_view(self.e1)
        r.info(f"gateway's view of engine1 after catch-up: {view}")
        self.conv_b.add_user()
        t = do_turn(self.gw_client(), self.conv_b)
        r.info(f"turn 2 through the gateway: {self.fig(t)}")
        r.check(t.ok, "turn 2 succeeded")
        r.check(view.get("index_blocks", 0) > 0, f"engine1's blocks known after catch-up (index_blocks {view.get('index_blocks')})")
        # The gateway was given no kv_blocks: it learns them from vllm:cache_config_info.
        engine_blocks = None
        with urllib.request.urlopen(f"{self.e1.url}/metrics", timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                m = re.match(r'vllm:cache_config_info\{.*num_gpu_blocks="(\d+)"', line)
                if m:
                    engine_blocks = int(m.group(1))
        # Learned by the health checks (every 2 s): wait for a round to have read it.
        deadline = time.time() + 15.0
        while time.time() < deadline and view.get("kv_blocks") is None:
            time.sleep(0.2)
            view = self.worker_view(self.e1)
        r.info(f"engine1 publishes num_gpu_blocks {engine_blocks}; the gateway's capacity: {view.get('kv_blocks')} blocks")
        r.check(engine_blocks is not None and view.get("kv_blocks") == engine_blocks,
                f"capacity learned from vllm:cache_config_info ({view.get('kv_blocks')} == {engine_blocks})")
        r.check(t.ok and t.worker == self.e1.gateway_name, f"routed to engine1, which holds the prefix (went to {self.w(t.worker)})")
        r.check(t.good, f"predicted {t.predicted} > 0 and within {BLOCK} of reported {t.reported}")

    def scenario_a(self, r, n_convs=12, n_turns=5, parallel=2):
        m0 = self.settle()
        r.info(f"gateway's view at the start: engine1 {self.worker_view(self.e1)}; "
               f"engine2 {self.worker_view(self.e2)}")
        convs = [self.new_conv("a") for _ in range(n_convs)]

        def run_conv(c):
            client = self.gw_client()
            for k in range(n_turns):
                if k > 0:
                    c.add_user()
                t = do_turn(client, c)
                if not t.ok:
                    return

        t0 = time.time()
        with ThreadPoolExecutor(parallel) as ex:
            list(ex.map(run_conv, convs))
        secs = time.time() - t0
        m1 = self.settle()
        turns = [t for c in convs for t in c.turns]
        failed = [t for t in turns if not t.ok]
        firsts = [c.turns[0] for c in convs if c.turns and c.turns[0].ok]
        follow = [t for c in convs for t in c.turns[1:]]
        good = [t for t in follow if t.good]
        per_worker = {}
        for t in turns:
            per_worker[self.w(t.worker)] = per_worker.get(self.w(t.worker), 0) + 1
        moved = sum(1 for c in convs for a, b in zip(c.turns, c.turns[1:]) if a.ok and b.ok and a.worker != b.worker)
        r.info(f"{n_convs} conversations x {n_turns} turns, streamed, max_tokens 16, {parallel} at once: "
               f"{len(turns)} requests in {secs:.1f} s, {len(failed)} failed; per worker {per_worker}; "
               f"first prompts {min(t.prompt_tokens for t in firsts) if firsts else '-'}-"
               f"{max(t.prompt_tokens for t in firsts) if firsts else '-'} tokens; "
               f"{moved} follow-ups changed worker")
        for c in convs:
            r.info("  " + " | ".join(self.fig(t) for t in c.turns))
        status = {}
        for (n, labels), v in m1.items():
            if n == "kvroute_requests_total":
                st = dict(labels).get("status")
                status[st] = status.get(st, 0) + v - m0.get((n, labels), 0)
        status = {k: int(v) for k, v in status.items() if v}
        ev = self.event_delta(m0, m1)
        r.info(f"kvroute_requests_total by status in this scenario: {status}")
        r.info(f"kvroute_kv_events_total in this scenario: {ev}")
        self.check_failures(r, failed)
        r.check(status.get("499", 0) == 0, f"no status 499 for streams read to [DONE] ({status.get('499', 0)})")
        not_applied = {k: v for k, v in ev.items() if k[2] != "applied"}
        applied = sum(v for k, v in ev.items() if k[2] == "applied")
        r.check(applied > 0 and not not_applied,
                f"every KV event applied ({applied} applied; not applied: {not_applied or 'none'})")
        misses = [t for t in follow if not t.good]
        moved_away = [t for t in misses if t.close and t.predicted == 0 and t.reported == 0]
        r.info(f"follow-ups not predicted right with both > 0: {len(misses)} ({len(moved_away)} sent "
               f"to a worker without their prefix, predicted 0 == reported 0; "
               f"{len(misses) - len(moved_away)} mispredicted or failed: "
               f"{[self.fig(t) for t in misses if t not in moved_away][:4]})")
        pct = 100.0 * len(good) / len(follow) if follow else 0.0
        r.check(follow and pct >= 95.0,
                f"follow-ups predicted right (within {BLOCK}) with both > 0: {len(good)}/{len(follow)} ({pct:.1f}%, need >= 95%)")

    def fig(self, t):
        s = t.fig()
        for name, sh in self.names().items():
            s = s.replace(name, sh)
        return s

    def check_failures(self, r, failed):
        r.check(not failed, f"no failed request ({len(failed)}: {[self.fig(t) for t in failed][:4]})")

    def event_delta(self, m0, m1):
        out = {}
        for (n, labels), v in m1.items():
            if n == "kvroute_kv_events_total":
                d = dict(labels)
                k = (self.w(d.get("worker")), d.get("type"), d.get("result"))
                dv = v - m0.get((n, labels), 0)
                if dv:
                    out[k] = out.get(k, 0) + int(dv)
        return out

    def convs_on(self, engine, want=3, prefix="x", fresh=False, first_words=350):
        """`want` conversations whose last turn went to `engine`: ones the gateway sent there
        (unless `fresh`), else new ones begun straight on the engine, bypassing the gateway
        (which learns of them from the engine's live KV events: waited for here)."""
        on = [] if fresh else [c for c in self.convs if c.last_worker == engine.gateway_name
                               and not c.cid.startswith(("probe", "e"))][:want]
        if len(on) >= want:
            return on
        before = self.worker_view(engine).get("index_blocks") or 0
        direct = client_for(engine.url)
        blocks = 0
        for _ in range(want - len(on)):
            c = self.new_conv(prefix, first_words)
            t = do_turn(direct, c, worker=engine.gateway_name)
            if not t.ok:
                raise RuntimeError(f"{engine.name} did not answer: {t.error}")
            blocks += t.prompt_tokens // BLOCK
            on.append(c)
        deadline = time.time() + 5.0
        now = before
        while time.time() < deadline:
            now = self.worker_view(engine).get("index_blocks") or 0
            if now >= before + blocks:
                break
            time.sleep(0.05)
        log(f"   ({want - len([c for c in on if c.cid.startswith(prefix)]) if not fresh else 0} of {want} "
            f"conversations on {engine.name} from earlier turns; began {len([c for c in on if c.cid.startswith(prefix)])} "
            f"straight on it; gateway's index for it {before} -> {now} blocks, {blocks} new prompt blocks)")
        return on

    def explain_raw(self, messages):
        import json
        body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 16}).encode()
        req = urllib.request.Request(self.gw.url + "/debug/explain", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=5.0) as resp:
            return json.load(resp)

    def scenario_f(self, r):
        """The same request sent again ("regenerate"), its prompt a whole number of blocks."""
        c = next((c for c in self.convs if c.cid.startswith("a") and c.turns and c.turns[-1].ok), None)
        if c is None:
            c = self.new_conv("f", 400)
            do_turn(self.gw_client(), c)
        # A next user message that makes the prompt a multiple of the block size, found with
        # the gateway's own count (/debug/explain's prompt_tokens).
        c.add_user(40)
        base = c.messages[-1]["content"]
        n = None
        for k in range(200):
            c.messages[-1]["content"] = base + " " + text(random.Random(k), 1 + k % 40)
            n = self.explain_raw(c.messages)["prompt_tokens"]
            if n % BLOCK == 0:
                break
        if n % BLOCK:
            raise RuntimeError("no block-aligned prompt found")
        client = self.gw_client()
        first = do_turn(client, c)
        c.messages.pop()  # the reply: send exactly the same request again
        # Wait until the gateway's match of the prompt on the worker that served it covers at
        # least every block but the last (a gateway may cap it there already) and has not
        # changed for 0.3 s: the first answer's KV events are in.
        deadline = time.time() + 5.0
        matched, since = None, time.time()
        while time.time() < deadline:
            ex = self.explain_raw(c.messages)
            ids = {w["worker"]["id"]: name for name, w in self.gw.workers().items()}
            m = max((w.get("matched_blocks", 0) for w in ex["workers"]
                     if ids.get(w["worker"]) == first.worker), default=0)
            if m != matched:
                matched, since = m, time.time()
            if matched >= (n - 1) // BLOCK and time.time() - since >= 0.3:
                break
            time.sleep(0.05)
        msgs = [dict(m) for m in c.messages]
        again = do_turn(client, c)
        r.info(f"a {n}-token prompt ({n // BLOCK} blocks) of conversation {c.cid}: first {self.fig(first)}; "
               f"the gateway then matched {matched} blocks of it; sent again: {self.fig(again)}")
        r.check(first.ok and again.ok, "both requests succeeded")
        predicted, reported = again.predicted, again.reported
        if again.ok and again.worker != first.worker:
            # The policy weighs load and speed too and sent it elsewhere: the same request
            # goes straight to the engine that holds it, judged against the gateway's match
            # there just before (capped like a hit, as the router caps it).
            engine = next(e for e in (self.e1, self.e2) if e.gateway_name == first.worker)
            predicted = min((matched or 0) * BLOCK, (n - 1) // BLOCK * BLOCK)
            probe = Conv(c.cid + "-direct", random.Random(0), 1)
            probe.messages = msgs
            d = do_turn(client_for(engine.url), probe, worker=engine.gateway_name)
            reported = d.reported if d.ok else None
            r.info(f"the policy chose {self.w(again.worker)}; sent straight to {engine.name}: "
                   f"predicted there {predicted}, reported by it {reported}")
        r.check(again.ok and reported == n - BLOCK,
                f"the engine reports one block less than the prompt for a fully cached block-aligned "
                f"prompt (its hit stops at prompt length - 1): {reported} == {n - BLOCK}")
        r.check(again.ok and predicted == reported,
                f"the gateway predicts exactly that on the engine that holds it: predicted {predicted}, "
                f"reported {reported}")

    def turn_on(self, engine, conv, words=None):
        """The conversation's next request through the gateway, judged for `engine`.

        Returns (turn, predicted, reported): what the gateway predicts for `engine` and what
        `engine` reports. When the gateway sends the request there, they are its header and
        the usage; when it sends it elsewhere (its policy weighs load and speed too), the
        prediction is /debug/explain's match on `engine` just before (capped like a hit:
        prompt length - 1, in whole blocks) and the same request then goes straight to
        `engine` for its count. Either way the figures say whether the gateway's index of
        `engine` is right, whatever the policy chose."""
        conv.add_user(words)
        msgs = [dict(m) for m in conv.messages]
        ex = self.explain_raw(msgs)
        ids = {w["worker"]["id"]: name for name, w in self.gw.workers().items()}
        m = max((w.get("matched_blocks", 0) for w in ex["workers"]
                 if ids.get(w["worker"]) == engine.gateway_name), default=0)
        n = ex.get("prompt_tokens", 0)
        explained = min(m * BLOCK, max(n - 1, 0) // BLOCK * BLOCK)
        t = do_turn(self.gw_client(), conv)
        t.why = self.explain_text(ex)
        if t.ok and t.worker == engine.gateway_name:
            return t, t.predicted, t.reported
        probe = Conv(conv.cid + "-direct", random.Random(0), 1)
        probe.messages = msgs
        d = do_turn(client_for(engine.url), probe, worker=engine.gateway_name)
        return t, explained, d.reported if d.ok else None

    def explain_text(self, ex):
        ids = {}
        try:
            for name, w in self.gw.workers().items():
                ids[w["worker"]["id"]] = self.w(name)
        except Exception:
            pass
        parts = []
        for w in ex.get("workers", []):
            parts.append(f"{ids.get(w.get('worker'), w.get('worker'))} matched {w.get('matched_blocks')} "
                         f"cost {w.get('cost', 0):.3f}{'' if w.get('eligible', True) else ' not eligible'}"
                         f"{' busy' if w.get('busy') else ''}")
        return f"explain -> {ids.get(ex.get('winner'), ex.get('winner'))} ({', '.join(parts)})"

    def judged(self, r, label, engine, rows):
        for t, p, rep in rows:
            where = "there" if t.worker == engine.gateway_name else f"to {self.w(t.worker)}, then straight to {engine.name}"
            r.info(f"  {label}: {self.fig(t)}; sent {where}: predicted for {engine.name} {p}, "
                   f"reported by it {rep}; {t.why}")

    def scenario_c(self, r, stall=7.0):
        convs = self.convs_on(self.e1, want=3, prefix="c")
        before = self.worker_view(self.e1)
        r.info(f"engine1 before the stall: {before}; {len(convs)} conversations live on it")
        n = self.e1.pause()
        t0 = time.time()
        seen = []
        while time.time() - t0 < stall:
            h = self.worker_view(self.e1)
            step = (round(time.time() - t0, 1), h.get("health"), h.get("index_blocks"), h.get("cache_state"))
            if not seen or seen[-1][1:] != step[1:]:
                seen.append(step)
            time.sleep(0.5)
        self.e1.resume()
        r.info(f"SIGSTOP to engine1's {n} processes for {time.time() - t0:.1f} s, then SIGCONT; "
               f"gateway's view during the stall (s, health, index_blocks, cache_state): {seen}")
        up, h = self.wait_health(self.e1, "up", 20.0)
        after = self.worker_view(self.e1)
        r.info(f"engine1 after SIGCONT ({'up' if up else 'not up: ' + str(h)}): {after}")
        rows = [self.turn_on(self.e1, c) for c in convs]
        self.judged(r, "follow-up", self.e1, rows)
        r.check(up, "engine1 healthy again in the gateway's view within 20 s")
        b, a = before.get("index_blocks") or 0, after.get("index_blocks") or 0
        r.check(b > 0 and a >= b, f"index for engine1 not emptied by the stall (index_blocks {b} before, {a} after)")
        self.check_failures(r, [t for t, _, _ in rows if not t.ok])
        right = [1 for t, p, rep in rows if p is not None and rep is not None and p > 0 and rep > 0
                 and abs(p - rep) <= BLOCK]
        r.check(rows and len(right) == len(rows),
                f"follow-ups after the stall predicted right for engine1 and > 0: {len(right)}/{len(rows)}")
        r.info(f"the gateway sent {sum(1 for t, _, _ in rows if t.worker == self.e1.gateway_name)} of "
               f"{len(rows)} follow-ups to engine1 (its policy's choice, not judged here)")

    def scenario_d(self, r):
        convs = self.convs_on(self.e2, want=3, prefix="d")
        before = self.worker_view(self.e2)
        m0 = self.gw.metrics()
        r.info(f"engine2 before the restart: {before}; {len(convs)} conversations live on it")
        t0 = time.time()
        self.e2.kill()
        down, h = self.wait_health(self.e2, "down", 15.0)
        r.info(f"engine2 killed (SIGKILL to its process group); gateway saw it "
               f"{'down' if down else 'still ' + str(h)} after {time.time() - t0:.1f} s")
        self.e2.start()
        secs = self.e2.wait_ready()
        up, h = self.wait_health(self.e2, "up", 30.0)
        mid = self.worker_view(self.e2)
        r.info(f"engine2 started again on the same ports in {secs:.1f} s; gateway's view: {mid}")
        r.check(up, f"engine2 healthy again in the gateway's view ({h})")
        # Follow-ups of its conversations: its cache is empty now, and the gateway must know.
        # Their new messages are long (~300 tokens), so that a stale index would be off by
        # several blocks on the next turn.
        first = [self.turn_on(self.e2, c, words=200) for c in convs]
        self.judged(r, "after the restart", self.e2, first)
        self.check_failures(r, [t for t, _, _ in first if not t.ok])
        r.check(first and all(p is not None and rep is not None and p == 0 and rep == 0 for _, p, rep in first),
                f"first follow-ups: predicted 0 == reported 0 for the restarted engine2: "
                f"{[(p, rep) for _, p, rep in first]}")
        # Their next turns, and those of two conversations begun straight on engine2 after the
        # restart: engine2 now holds their previous prompt, and the gateway must have it from
        # engine2's events since the restart (a new subscription).
        fresh = self.convs_on(self.e2, 2, "dn", fresh=True, first_words=400)
        second = [self.turn_on(self.e2, c) for c in convs + fresh]
        self.judged(r, "next turn", self.e2, second)
        after = self.worker_view(self.e2)
        m1 = self.gw.metrics()
        ev = {k: v for k, v in self.event_delta(m0, m1).items() if k[0] == "e2"}
        r.info(f"engine2 at the end: {after}; its KV events since the restart: {ev}")
        self.check_failures(r, [t for t, _, _ in second if not t.ok])
        right = [1 for t, p, rep in second if p is not None and rep is not None and p > 0 and rep > 0
                 and abs(p - rep) <= BLOCK]
        r.check(second and len(right) == len(second),
                f"next turns predicted right for engine2 and > 0: {len(right)}/{len(second)}")
        r.check(sum(v for k, v in ev.items() if k[2] == "applied") > 0,
                "KV events of the restarted engine2 applied")
        r.info(f"the gateway sent {sum(1 for t, _, _ in first + second if t.worker == self.e2.gateway_name)} "
               f"of {len(first) + len(second)} of these to engine2 (its policy's choice, not judged here)")

    def scenario_e(self, r, attempts=3, **kw):
        """Runs the scenario; when only its setup check failed (no request without a chunk
        was in flight on the victim at the kill: a matter of timing, not of the gateway), the
        killed engine is started again, the gateway waits for it, and the scenario is run
        again, at most `attempts` times in all. Every check of the last attempt counts."""
        for k in range(1, attempts + 1):
            r.info(f"-- attempt {k} of at most {attempts}")
            victim, checks = self.scenario_e_attempt(r, **kw)
            setup_ok = checks[0][0]
            others_ok = all(ok for ok, _ in checks[1:])
            if setup_ok or not others_ok or k == attempts:
                for ok, s in checks:
                    r.check(ok, s)
                return
            for ok, s in checks:
                r.info(f"attempt {k}: {'ok' if ok else 'not held'}: {s}")
            r.info(f"attempt {k}: only the setup did not hold (every check of the gateway passed); "
                   f"{victim.name} is started again and the scenario repeated")
            t0 = time.time()
            victim.start()
            secs = victim.wait_ready()
            up, h = self.wait_health(victim, "up", 30.0)
            r.info(f"{victim.name} started again on the same ports in {secs:.1f} s; healthy in the "
                   f"gateway's view {'after' if up else 'not within'} {time.time() - t0:.1f} s ({h})")
            if not up:
                r.check(False, f"{victim.name} healthy again in the gateway's view before attempt "
                               f"{k + 1} ({h})")
                return

    def scenario_e_attempt(self, r, drivers=6, surge=4, before_kill=1.5, hang=1.0, after_kill=4.0):
        """One run of scenario e; returns (victim, checks), the setup check first."""
        m0 = self.gw.metrics()
        # Short requests from `drivers` clients: a third are new questions on conversations
        # begun on engine1 (their cached ~700-token prefix draws them there), a third on
        # conversations begun on engine2, a third new conversations.
        anchors = self.convs_on(self.e1, 2, "ea", fresh=True, first_words=400)
        anchors2 = self.convs_on(self.e2, 2, "eb", fresh=True, first_words=400)
        stop = threading.Event()
        stop_surge = threading.Event()
        started = []  # conversations of the requests, registered before they are sent
        surged = set()  # ids of the conversations the surge clients sent

        def question(a, tag):
            c = Conv(f"{a.cid}q{tag}", random.Random(self.rng.random()), 1)
            c.messages = [dict(m) for m in a.messages[:2]]
            c.add_user()
            return c

        def driver(k):
            client = self.gw_client(30.0)
            n = 0
            while not stop.is_set():
                n += 1
                if k % 3 < 2:
                    home = anchors if k % 3 == 0 else anchors2
                    c = question(home[(k // 3 + n) % len(home)], f"{k}.{n}")
                else:
                    c = self.new_conv("es", self.rng.randint(300, 600))
                with self.lock:
                    started.append(c)
                do_turn(client, c)

        def surger(k, home):
            # While the victim is stopped: new questions on its own conversations (their cached
            # prefix draws them to it), one after another, so that some are headed for the
            # victim when it is killed; none can have a chunk from a stopped engine.
            client = self.gw_client(30.0)
            n = 0
            while not stop_surge.is_set():
                n += 1
                c = question(home[(k + n) % len(home)], f"s{k}.{n}")
                with self.lock:
                    started.append(c)
                    surged.add(id(c))
                do_turn(client, c)

        ds = [threading.Thread(target=driver, args=(k,), daemon=True) for k in range(drivers)]
        t0 = time.time()
        for d in ds:
            d.start()
        time.sleep(before_kill)
        # The victim is the engine the gateway has sent more of these requests to so far (its
        # policy decides; the scenario needs requests in flight on the engine that dies).
        with self.lock:
            so_far = [c.turns[-1] for c in started if c.turns and c.turns[-1].worker]
        n1 = sum(1 for t in so_far if t.worker == self.e1.gateway_name)
        n2 = sum(1 for t in so_far if t.worker == self.e2.gateway_name)
        victim, survivor = (self.e1, self.e2) if n1 >= n2 else (self.e2, self.e1)
        home = anchors if victim is self.e1 else anchors2
        ss = self.w(survivor.gateway_name)
        # The engine dies the way a stuck one does: it stops answering (SIGSTOP) for `hang`
        # seconds while requests keep coming, so that some are in flight on it in every state
        # (accepted and not answered, answered and streaming), then SIGKILL to its group.
        # It stops while a request to it has its answer's headers but no chunk yet, if one
        # shows up within 3 s (a gateway that holds the headers until the first chunk never
        # shows that state). While it is stopped, `surge` more clients send questions on its
        # conversations: the drivers' requests may all be streaming on it when it stops.
        deadline = time.time() + 3.0
        caught = False
        while time.time() < deadline and not caught:
            with self.lock:
                caught = any(c.turns and c.turns[-1].t_end is None and c.turns[-1].chunks == 0
                             and c.turns[-1].worker == victim.gateway_name for c in started)
            if not caught:
                time.sleep(0.0005)
        victim.pause()
        ss_threads = [threading.Thread(target=surger, args=(k, home), daemon=True) for k in range(surge)]
        for s in ss_threads:
            s.start()
        time.sleep(hang)
        stop_surge.set()
        try:
            booked = int(eng.metric_sum(self.gw.metrics(), "kvroute_worker_inflight_requests",
                                        worker=victim.gateway_name))
        except Exception as e:
            booked = f"unknown ({e})"
        # The requests in flight and their state (worker, chunks read) at the kill, taken just
        # before it while the victim is still stopped; read later, those not streaming would
        # have been retried elsewhere meanwhile, and show that worker and its chunks.
        with self.lock:
            pending = [c.turns[-1] for c in started if c.turns and c.turns[-1].t_end is None]
            state = {id(t): (t.worker, t.chunks) for t in pending}
        # SIGKILL straight to the stopped group (Engine.kill sends SIGCONT first, and the
        # victim would run again for as long as it takes to list the group's processes: long
        # enough, with these clients busy, to answer or finish the requests stuck on it).
        try:
            os.killpg(victim.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        kill_at = time.time()  # when SIGKILL was sent
        victim.kill()  # waits until none of its processes is left
        on1 = [t for t in pending if state[id(t)][0] in (None, victim.gateway_name) and not state[id(t)][1]]
        inflight = {}
        for t in pending:
            w, n = state[id(t)]
            k = (self.w(w) or "no answer yet", "streaming" if n else "no chunk yet")
            inflight[k] = inflight.get(k, 0) + 1
        r.info(f"{drivers} clients sending short streamed requests (~500-1,000-token prompts; a third "
               f"of them new questions on conversations begun on engine1, a third on engine2); after "
               f"{before_kill:.1f} s ({n1} sent to engine1, {n2} to engine2 so far) {victim.name} "
               f"is stopped (SIGSTOP; "
               f"{'while' if caught else 'no moment seen when'} a request to it had headers and no "
               f"chunk) for {hang:.1f} s, during which {surge} more clients send questions on its "
               f"conversations, then killed (SIGKILL to its process group). In flight at "
               f"the kill: {inflight} ({sum(1 for t in pending if id(t.conv) in surged)} of them "
               f"from the {surge} surge clients); the gateway booked {booked} in flight on {victim.name}")
        time.sleep(after_kill)
        stop.set()
        for d in ds + ss_threads:
            d.join(timeout=60.0)
        m1 = self.settle()
        every = [c.turns[-1] for c in started if c.turns]

        def bucket(ts):
            out = {}
            for t in ts:
                k = "ok" if t.ok else f"failed at {t.stage}"
                out[k] = out.get(k, 0) + 1
            return out

        before = [t for t in every if t.t_start < kill_at]
        after = [t for t in every if t.t_start >= kill_at]
        at_kill = [t for t in every if t.t_start < kill_at and t in pending]
        r.info(f"requests started before the kill: {len(before)} {bucket(before)}, per worker "
               f"{self.per_worker(before)}; of them in flight at the kill: {len(at_kill)} "
               f"{bucket(at_kill)}, now per worker {self.per_worker(at_kill)}")
        r.info(f"requests started after the kill: {len(after)} {bucket(after)}, per worker "
               f"{self.per_worker(after)}")
        retries = eng.metric_sum(m1, "kvroute_retries_total") - eng.metric_sum(m0, "kvroute_retries_total")
        errs = {}
        status = {}
        for (n, labels), v in m1.items():
            d = dict(labels)
            dv = int(v - m0.get((n, labels), 0))
            if not dv:
                continue
            if n == "kvroute_upstream_errors_total":
                errs[(self.w(d.get("worker")), d.get("kind"))] = dv
            if n == "kvroute_requests_total":
                status[d.get("status")] = status.get(d.get("status"), 0) + dv
        r.info(f"gateway: retries {retries:.0f}, upstream errors {errs}, requests by status {status}")
        for t in every:
            if not t.ok:
                r.info(f"  {self.fig(t)} (sent {t.t_start - kill_at:+.3f} s from the kill, "
                       f"{t.chunks} chunks read)")
        unstarted = [t for t in every if not t.ok and t.chunks == 0]
        r.info(f"in flight on {survivor.name} at the kill: {sum(v for k, v in inflight.items() if k[0] == ss)}")
        broken = sum(1 for t in every if not t.ok)
        checks = [
            (bool(on1), f"requests in flight on {victim.name} at the kill that had not started streaming "
                        f"({len(on1)} without a chunk, headed for or at {victim.name}): the setup holds"),
            (not unstarted, f"no request that had not started streaming failed ({len(unstarted)} did: "
                            f"{[self.fig(t) for t in unstarted][:3]})"),
            (bool(after) and all(t.ok and t.worker == survivor.gateway_name for t in after[-drivers:]),
             f"requests after the kill are served by {survivor.name}"),
            (status.get("499", 0) == 0,
             f"no status 499: every stream was read to its end ([DONE] or the gateway's error "
             f"event; {broken} broke, counted {sum(v for k, v in errs.items() if k[1] == 'stream_broken'):.0f} "
             f"x stream_broken), got {status.get('499', 0)}"),
        ]
        return victim, checks

    def per_worker(self, ts):
        out = {}
        for t in ts:
            out[self.w(t.worker)] = out.get(self.w(t.worker), 0) + 1
        return out

    # ---- driver -----------------------------------------------------------------------------

    def run_scenario(self, name, title, fn):
        r = Result(name, title)
        log(f"\n== {name}. {title}")
        t0 = time.time()
        try:
            fn(r)
        except Exception as e:
            r.error = f"{type(e).__name__}: {e}"
            log(f"   ERROR {r.error}")
            traceback.print_exc()
        log(f"{'PASS' if r.passed else 'FAIL'} {name}: {title} ({time.time() - t0:.1f} s)")
        self.results.append(r)
        return r

    def main(self):
        t0 = time.time()
        self.start_engines()
        self.scenario_b_prepare()
        self.start_gateway()
        log(f"   scenarios start {time.time() - t0:.1f} s after launch")
        ts = time.time()
        self.run_scenario("b", "conversation begun on engine1 before the gateway: known after catch-up",
                          self.scenario_b)
        self.run_scenario("a", "multi-turn conversations through the gateway", self.scenario_a)
        log(f"   engine memory: engine1 {self.memory(self.e1)}; engine2 {self.memory(self.e2)}")
        self.run_scenario("f", "the same block-aligned prompt sent again: predicted as the engine counts it",
                          self.scenario_f)
        self.run_scenario("c", "engine1 stalled 7 s (SIGSTOP/SIGCONT): index kept, predictions right",
                          self.scenario_c)
        self.run_scenario("d", "engine2 restarted on the same ports: re-subscribed, predictions right",
                          self.scenario_d)
        self.run_scenario("e", "an engine hangs and is killed mid-run: requests not yet streaming are retried",
                          self.scenario_e)
        log(f"\n== summary (scenarios {time.time() - ts:.0f} s, whole run {time.time() - t0:.0f} s)")
        for r in self.results:
            log(f"{'PASS' if r.passed else 'FAIL'} {r.name}: {r.title}")
            if not r.passed:
                for ok, s in r.checks:
                    if not ok:
                        log(f"       failed: {s}")
                if r.error:
                    log(f"       error: {r.error}")
        bad = [r for r in self.results if not r.passed]
        if bad and self.gw is not None:
            lines = [l for l in self.gw.log_tail(400).splitlines() if " WARN" in l or " ERROR" in l]
            if lines:
                log(f"   gateway warnings/errors (last {min(len(lines), 15)} of {len(lines)}):")
                for l in lines[-15:]:
                    log(f"     {l[:300]}")
        log(f"   logs: {self.args.logs}")
        return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvroute", required=True, help="the kvroute binary")
    ap.add_argument("--model", default=os.path.join(ROOT, "target", "vllm-model"))
    ap.add_argument("--python", default=sys.executable, help="the venv's python (runs vLLM)")
    ap.add_argument("--logs", default=os.path.join(ROOT, "target", "vllm-test-logs"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--deadline", type=float, default=480.0, help="seconds before everything is stopped")
    args = ap.parse_args()
    args.kvroute = os.path.abspath(args.kvroute)
    args.model = os.path.abspath(args.model)
    if not os.access(args.kvroute, os.X_OK):
        sys.exit(f"not an executable: {args.kvroute}")

    run = Run(args)
    done = threading.Event()

    def on_signal(sig, _frame):
        raise SystemExit(128 + sig)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    def watchdog():
        if not done.wait(args.deadline):
            log(f"\nDEADLINE: {args.deadline:.0f} s passed; stopping every process started here")
            run.cleanup()
            log("0 passed, 1 failed")
            os._exit(2)

    threading.Thread(target=watchdog, daemon=True).start()
    bad = None
    try:
        bad = run.main()
    except SystemExit:
        raise
    except Exception as e:
        log(f"\nERROR: {type(e).__name__}: {e}")
        traceback.print_exc()
    finally:
        run.cleanup()
        done.set()
    if bad is None:
        passed = sum(1 for r in run.results if r.passed)
        log(f"{passed} passed, {len(run.results) - passed + 1} failed")
        sys.exit(1)
    passed = len(run.results) - len(bad)
    log(f"{passed} passed, {len(bad)} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
