"""Start, stall, kill and restart real vLLM (CPU) engines and a kvroute gateway, on 127.0.0.1.

Used by test_real_vllm.py; also runnable on its own to start one engine by hand:

    target/vllm-venv/bin/python scripts/vllm/engine.py MODEL_DIR [--cpu 0] [--port 8000]

Every process is started in a session of its own (so its process group is its whole tree:
vLLM's API server spawns an EngineCore process, which spawns the model's worker process),
and is signalled only through the group recorded at start.
"""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))

# Two engines on a 2-core machine: each engine's model worker runs its OpenMP threads on a
# core of its own (VLLM_CPU_OMP_THREADS_BIND=<core>, one thread), the KV cache is a fixed
# 64 MiB (65,536 tokens of this model; VLLM_CPU_KVCACHE_SPACE only takes whole GiB), and
# --enforce-eager skips torch.compile/inductor (no C++ compile at start-up, no compiler
# needed). Nothing is downloaded and no usage statistics are sent.
KV_CACHE_BYTES = 64 * 1024 * 1024
BLOCK_SIZE = 32
MAX_MODEL_LEN = 4096
MODEL_NAME = "tiny-llama"


_taken = set()


def free_port():
    """A TCP port free on every interface (vLLM's PUB socket binds tcp://*:PORT), chosen
    below the kernel's ephemeral range: vLLM picks its own internal ports (API server <->
    engine core) from that range at start-up, and a port handed out from it could be taken
    by the other engine between this check and the engine's bind."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    hi = max(2000, min(low, 65536)) - 1
    lo = max(1024, hi - 20000)
    rng = random.Random()
    for _ in range(1000):
        port = rng.randint(lo, hi)
        if port in _taken:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("0.0.0.0", port))
        except OSError:
            continue
        _taken.add(port)
        return port
    raise RuntimeError("no free port found")


def http_get(url, timeout=2.0):
    """(status, body) or (None, error text)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception as e:  # connection refused, timeout, reset
        return None, str(e).encode()


def group_pids(pgid):
    """Every process of the process group (from /proc)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()
            # state ppid pgrp ...; a zombie is gone already (only its parent has to reap it)
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return pids


def pss_mib(pids):
    """Proportional set size of the processes in MiB (shared pages split between them)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def rss_mib(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


class Proc:
    """A process started in its own session; signalled by its process group only."""

    def __init__(self, name, log_path):
        self.name = name
        self.log_path = log_path
        self.popen = None
        self.pgid = None

    def _spawn(self, argv, env):
        log = open(self.log_path, "ab")
        log.write(f"\n==== {time.strftime('%H:%M:%S')} start: {' '.join(argv)}\n".encode())
        log.flush()
        self.popen = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.pgid = self.popen.pid

    def alive(self):
        return self.popen is not None and self.popen.poll() is None

    def pids(self):
        return group_pids(self.pgid) if self.pgid else []

    def signal(self, sig):
        """Signals every process of the group; returns how many there were."""
        if not self.pgid:
            return 0
        pids = self.pids()
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass
        return len(pids)

    def kill(self, timeout=15.0):
        """SIGKILL to the whole group, then waits until none of it is left; returns the time
        the signal was sent."""
        if not self.pgid:
            return time.time()
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        sent = time.time()
        deadline = time.time() + timeout
        if self.popen is not None:
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        while self.pids() and time.time() < deadline:
            time.sleep(0.05)
        self.pgid = None
        return sent

    def stop(self, grace=5.0):
        """SIGTERM, then SIGKILL after `grace` seconds."""
        if not self.pgid:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        deadline = time.time() + grace
        while time.time() < deadline and self.pids():
            time.sleep(0.1)
        self.kill()

    def log_tail(self, n=40):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
            return "\n".join(lines[-n:])
        except OSError as e:
            return str(e)


class Engine(Proc):
    """One vLLM OpenAI API server with prefix caching and ZMQ KV events."""

    def __init__(self, name, model_dir, python, cpu, log_path, ports=None, extra_args=(), role=None,
                 priority=None, env=None):
        super().__init__(name, log_path)
        # More environment variables for it.
        self.extra_env = dict(env or {})
        # Which `priority` values it serves first, told to the gateway (`,priority=`).
        self.priority = priority
        self.model_dir = model_dir
        self.python = python
        self.cpu = cpu
        # More engine flags (a KV connector); the role the gateway gives it (`,role=`).
        self.extra_args = list(extra_args)
        self.role = role
        self.http_port, self.pub_port, self.replay_port = ports or (free_port(), free_port(), free_port())

    def new_ports(self):
        self.http_port, self.pub_port, self.replay_port = free_port(), free_port(), free_port()
        self.started_at = None
        self.startup_secs = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def pub(self):
        return f"tcp://127.0.0.1:{self.pub_port}"

    @property
    def replay(self):
        return f"tcp://127.0.0.1:{self.replay_port}"

    @property
    def gateway_name(self):
        """The name kvroute gives this worker (host:port of its URL)."""
        return f"127.0.0.1:{self.http_port}"

    def worker_flag(self):
        flag = f"{self.url}={self.pub}={self.replay}"
        if self.role:
            flag += f",role={self.role}"
        if self.priority:
            flag += f",priority={self.priority}"
        return flag

    def argv(self):
        kv_events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            # vLLM binds the PUB socket only for a wildcard (or ipc/inproc) endpoint and
            # connects otherwise; the replay ROUTER always binds.
            "endpoint": f"tcp://*:{self.pub_port}",
            "replay_endpoint": f"tcp://127.0.0.1:{self.replay_port}",
            "topic": "kv",
            "buffer_steps": 10000,
            "hwm": 100000,
        }
        return [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--host", "127.0.0.1", "--port", str(self.http_port),
            "--model", self.model_dir, "--served-model-name", MODEL_NAME,
            "--dtype", "bfloat16", "--seed", "0",
            "--block-size", str(BLOCK_SIZE), "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "32",
            "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--enforce-eager",
            "--kv-events-config", json.dumps(kv_events),
            "--uvicorn-log-level", "warning",
        ] + self.extra_args

    def env(self):
        env = dict(os.environ)
        env.update({
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CPU_OMP_THREADS_BIND": str(self.cpu),
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_LOOPBACK_IP": "127.0.0.1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONWARNINGS": "ignore",
        })
        env.update(self.extra_env)
        return env

    def start(self):
        self.started_at = time.time()
        self.startup_secs = None
        self._spawn(self.argv(), self.env())

    def ready(self):
        status, _ = http_get(self.url + "/health", timeout=1.0)
        return status == 200

    def wait_ready(self, timeout=240.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.alive():
                raise RuntimeError(f"engine {self.name} exited during start-up "
                                   f"(code {self.popen.returncode}); log tail:\n{self.log_tail()}")
            if self.ready():
                self.startup_secs = time.time() - self.started_at
                return self.startup_secs
            time.sleep(0.25)
        raise RuntimeError(f"engine {self.name} not ready after {timeout:.0f} s; log tail:\n{self.log_tail()}")

    def pause(self):
        return self.signal(signal.SIGSTOP)

    def resume(self):
        return self.signal(signal.SIGCONT)


class Gateway(Proc):
    """`kvroute serve` in front of the engines."""

    def __init__(self, binary, engines, tokenizer, log_path, port=None, policy="goodput", extra_args=()):
        super().__init__("gateway", log_path)
        self.binary = binary
        self.engines = engines
        self.tokenizer = tokenizer
        self.port = port or free_port()
        self.policy = policy
        self.extra_args = list(extra_args)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        argv = [self.binary, "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--policy", self.policy, "--tokenizer", self.tokenizer,
                "--block-size", str(BLOCK_SIZE)]
        for e in self.engines:
            argv += ["--worker", e.worker_flag()]
        argv += self.extra_args
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        env["NO_COLOR"] = "1"
        self._spawn(argv, env)

    def wait_ready(self, timeout=30.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.alive():
                raise RuntimeError(f"gateway exited (code {self.popen.returncode}):\n{self.log_tail()}")
            status, _ = http_get(self.url + "/health", timeout=1.0)
            if status == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(f"gateway not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def workers(self):
        """/debug/workers as {gateway worker name: entry}."""
        status, body = http_get(self.url + "/debug/workers", timeout=5.0)
        if status != 200:
            raise RuntimeError(f"/debug/workers: {status} {body[:200]!r}")
        out = {}
        for w in json.loads(body)["workers"]:
            out[w["worker"]["name"]] = w
        return out

    def metrics(self):
        """/metrics as {(name, frozenset(labels)): value}."""
        status, body = http_get(self.url + "/metrics", timeout=5.0)
        if status != 200:
            raise RuntimeError(f"/metrics: {status}")
        return parse_prometheus(body.decode())


def post_json(url, body, timeout=60.0):
    """POSTs `body` as JSON: (status, headers as a lower-cased dict, parsed answer or None)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, headers, raw = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, headers, raw = e.code, e.headers, e.read()
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    return status, {k.lower(): v for k, v in headers.items()}, answer


def parse_prometheus(text):
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        labels = {}
        if "{" in name_labels:
            name, _, rest = name_labels.partition("{")
            rest = rest.rstrip("}")
            for part in split_labels(rest):
                k, _, v = part.partition("=")
                labels[k] = v.strip('"')
        else:
            name = name_labels
        try:
            out[(name, frozenset(labels.items()))] = float(value)
        except ValueError:
            pass
    return out


def split_labels(s):
    parts, cur, quoted = [], "", False
    for ch in s:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return parts


def metric_sum(metrics, name, **match):
    """Sum of the series of `name` whose labels include `match`."""
    total = 0.0
    for (n, labels), v in metrics.items():
        if n != name:
            continue
        d = dict(labels)
        if all(d.get(k) == val for k, val in match.items()):
            total += v
    return total


def metric_series(metrics, name):
    return {labels: v for (n, labels), v in metrics.items() if n == name}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="start one vLLM CPU engine with KV events")
    ap.add_argument("model_dir")
    ap.add_argument("--cpu", default="0")
    ap.add_argument("--port", type=int)
    a = ap.parse_args()
    ports = (a.port, a.port + 1, a.port + 2) if a.port else None
    e = Engine("engine", os.path.abspath(a.model_dir), sys.executable, a.cpu, "/dev/stderr", ports)
    e.start()
    try:
        secs = e.wait_ready()
        print(f"ready in {secs:.1f} s: {e.url}  events {e.pub}  replay {e.replay}  "
              f"(kvroute --worker {e.worker_flag()})", flush=True)
        e.popen.wait()
    except KeyboardInterrupt:
        pass
    finally:
        e.stop()
