#!/usr/bin/env python3
"""Look at a running vLLM engine's KV events on the wire, frame by frame.

    target/vllm-venv/bin/python scripts/vllm/probe_events.py \
        --pub tcp://127.0.0.1:5557 --replay tcp://127.0.0.1:5558 [--http http://127.0.0.1:8000]

Subscribes to the PUB socket (all topics), optionally sends one chat request to --http so
that the engine stores blocks, prints every live multipart message (frame count, topic,
sequence number, decoded msgpack payload), then asks the replay ROUTER from a DEALER socket
for everything since sequence 0 and prints each reply's frames up to the end marker.
Exits non-zero if the live frames or the replay answer do not have the expected shape:
live `[topic, seq u64 BE, payload]`; replay `["", topic, seq, payload]` per batch, then
`["", "", 0xFF*8, ""]`.
"""
import argparse
import json
import sys
import time
import urllib.request

import msgpack
import zmq

END = b"\xff" * 8


def show_payload(payload):
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    ts, events = batch[0], batch[1]
    rest = batch[2:]
    kinds = []
    for ev in events:
        # msgspec tagged structs encode as maps with a "type" key? or arrays with the tag
        # first; print what is really there.
        if isinstance(ev, dict):
            kinds.append({k: (v if not isinstance(v, list) or len(v) < 6 else f"[{len(v)} items]")
                          for k, v in ev.items()})
        else:
            kinds.append([v if not isinstance(v, list) or len(v) < 6 else f"[{len(v)} items]" for v in ev])
    return f"ts={ts:.3f} rest={rest} events={json.dumps(kinds)[:600]}"


def chat(http, n_words=300):
    body = json.dumps({
        "model": "tiny",
        "messages": [{"role": "user", "content": " ".join(f"word{i}" for i in range(n_words))}],
        "max_tokens": 4,
    }).encode()
    req = urllib.request.Request(http + "/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.load(r)
    return out["usage"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pub", required=True)
    ap.add_argument("--replay", required=True)
    ap.add_argument("--http")
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    ok = True
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(a.pub)
    time.sleep(0.5)  # the slow-joiner: let the subscription reach the publisher
    if a.http:
        print("request usage:", chat(a.http))
    deadline = time.time() + a.seconds
    live = []
    while time.time() < deadline:
        if sub.poll(100):
            frames = sub.recv_multipart()
            live.append(frames)
            shape = [len(f) for f in frames]
            print(f"LIVE {len(frames)} frames, lengths {shape}: topic={frames[0]!r} "
                  f"seq={int.from_bytes(frames[1], 'big') if len(frames) > 1 else None} "
                  f"{show_payload(frames[2]) if len(frames) == 3 else ''}")
            if len(frames) != 3 or len(frames[1]) != 8:
                ok = False
    print(f"live messages: {len(live)}")

    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(a.replay)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    n = 0
    while True:
        if not dealer.poll(5000):
            print("REPLAY: no answer within 5 s")
            ok = False
            break
        frames = dealer.recv_multipart()
        shape = [len(f) for f in frames]
        if len(frames) == 4 and frames[2] == END:
            print(f"REPLAY END {len(frames)} frames, lengths {shape}: {frames!r}")
            ok &= frames == [b"", b"", END, b""]
            break
        n += 1
        print(f"REPLAY {len(frames)} frames, lengths {shape}: empty={frames[0]!r} topic={frames[1]!r} "
              f"seq={int.from_bytes(frames[2], 'big') if len(frames) > 2 else None}")
        if len(frames) != 4 or frames[0] != b"" or len(frames[2]) != 8:
            ok = False
    print(f"replayed batches: {n}")
    print("PROBE OK" if ok else "PROBE: unexpected frame shape")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
