"""Soak benchmark of the headscope Jupyter kernel (run by benches/soak.sh; not a test).

    python benches/soak_driver.py --minutes 30 --out DIR      (HEADSCOPE_BIN names the binary)

One kernel session, driven by the real Jupyter client (jupyter_client's KernelManager and
BlockingKernelClient, signed messages), for --minutes. It repeats one cycle of cells:

  load      let m = load_model("minilm")            (the same cell again every cycle)
  small     small += 1; small                        (20 per cycle: the latency figures)
  analyze   m.analyze(24 sentences) -> results/analysis.json
  sweep     m.ablation_sweep(4 sentences) -> results/sweep.csv
  prune     m.prune(8 sentences, 3 steps) -> results/prune.json
  write     write_text(results/small.txt)
  interrupt one long cell (a whole-corpus analysis that also writes a result, a 300-sentence
            sweep, a 500-step prune, an endless loop; batches of 128-300 tokens, as a cell's
            interrupt is answered at the next batch or pruning step; the first cycle runs each once, later
            cycles one at random), interrupted at a random moment 0.1-3 s in; the
            time from interrupt_request to its execute_reply is recorded, then the session
            must still answer (small's value, the model's layers)
  vars      :vars every 5th cycle: each name listed once
  replay    a signed `replays += 1` sent once on a socket of its own, then replayed by the
            attackers

and, on the side, a thread sends hostile traffic of the kinds tests/frontends/kernel_hostile.rs sends:
unsigned, wrong-key, tampered and garbage messages carrying `small += 1000000;
write_text(MARKER, ...)`, signed malformed requests, replays of signed requests, frame
headers declaring 1 TiB, heartbeat peers that flood 256 KiB pings without reading, malformed
heartbeat messages, an iopub subscriber that never reads.

A sampler reads the kernel's /proc entry every 5 s: resident memory, open file descriptors,
threads. At the end it checks: every small cell saw exactly the count it expected (so no
hostile code ran), `replays` equals the signed originals, the marker does not exist, every
result file parses whole and no temporary file is left, attackers got only status-"error"
replies; then writes DIR/soak.json and prints a summary. Exits non-zero when a check fails.
"""
import argparse
import collections
import csv
import glob
import hashlib
import hmac
import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid

import jupyter_client
import zmq
from jupyter_client.session import Session

ap = argparse.ArgumentParser()
ap.add_argument("--minutes", type=float, default=30.0)
ap.add_argument("--out", required=True)
ap.add_argument("--seed", type=int, default=31)
args = ap.parse_args()

HS = os.environ["HEADSCOPE_BIN"]
OUT = os.path.abspath(args.out)
RESULTS = os.path.join(OUT, "results")
os.makedirs(RESULTS, exist_ok=True)
MARKER = os.path.join(OUT, "pwned")
rng = random.Random(args.seed)
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg, flush=True)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the kernel, started as Jupyter starts it ------------------------------------------------
subprocess.run([HS, "kernel", "install", "--prefix", OUT], check=True, stdout=subprocess.DEVNULL)
os.environ["JUPYTER_PATH"] = os.path.join(OUT, "share", "jupyter")
os.environ["JUPYTER_RUNTIME_DIR"] = os.path.join(OUT, "runtime")
err_path = os.path.join(OUT, "kernel.stderr")
km = jupyter_client.KernelManager(kernel_name="headscope")
km.start_kernel(stderr=open(err_path, "w"))
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=60)
pid = km.provisioner.process.pid
info = km.get_connection_info()
KEY = info["key"] if isinstance(info["key"], bytes) else info["key"].encode()
ctx = zmq.Context()


def proc():
    status = open(f"/proc/{pid}/status").read()
    field = lambda name: int(next(l.split()[1] for l in status.splitlines() if l.startswith(name + ":")))
    return {"rss_mb": field("VmRSS") / 1024, "hwm_mb": field("VmHWM") / 1024, "threads": field("Threads"), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


t_start = time.time()
samples = []
stop = threading.Event()


def sampler():
    while not stop.is_set():
        try:
            samples.append({"t": time.time() - t_start, **proc()})
        except (OSError, StopIteration):
            pass
        stop.wait(5)


# ---- cells ------------------------------------------------------------------------------------
lat = collections.defaultdict(list)     # kind -> seconds
cells = collections.Counter()           # kind -> count
interrupts = []                         # {kind, after, response, status}


def cell(kind, code, timeout=600):
    t0 = time.time()
    outputs = []
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=outputs.append)
    took = time.time() - t0
    lat[kind].append(took)
    cells[kind] += 1
    content = reply["content"]
    if content["status"] != "ok":
        fail(f"{kind} cell failed: {content.get('ename')}: {content.get('evalue')}")
    text = "".join(m["content"]["data"].get("text/plain", "") for m in outputs if m["msg_type"] == "execute_result")
    return content, text


small = 0


def small_cell():
    global small
    small += 1
    _, text = cell("small", "small += 1; small")
    if text.strip() != str(small):
        fail(f"small cell saw {text.strip()!r}, expected {small}: another cell changed `small`")


def check_json(path, want):
    try:
        with open(path) as f:
            v = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: not a whole JSON file: {e}")
        return
    if want not in json.dumps(v):
        fail(f"{path}: no {want!r} in it")


def check_csv(path):
    try:
        rows = list(csv.reader(open(path)))
    except OSError as e:
        fail(f"{path}: {e}")
        return
    if len(rows) < 2 or len({len(r) for r in rows}) != 1:
        fail(f"{path}: a partial CSV ({len(rows)} rows, widths {sorted({len(r) for r in rows})})")


R = lambda name: os.path.join(RESULTS, name)
LONG = [
    ("analysis", f'let a2 = m.analyze(d, #{{stats: ["confidence", "positional"], batch_tokens: 256}}); a2.to_json("{R("long_analysis.json")}");'),
    ("sweep", f'let g2 = m.ablation_sweep(d.take(300), #{{batch_tokens: 128}}); g2.to_csv("{R("long_sweep.csv")}");'),
    ("prune", f'let p2 = m.prune(d.take(16), #{{steps: 500, batch_tokens: 300}}); p2.to_json("{R("long_prune.json")}");'),
    ("loop", "let i = 0; loop { i += 1; }"),
]


def long_cell_interrupted(kind, code):
    after = rng.uniform(0.1, 3.0)
    msg_id = kc.execute(code)
    time.sleep(after)
    t0 = time.time()
    km.interrupt_kernel()
    while True:
        reply = kc.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    response = time.time() - t0
    status = reply["content"]["status"]
    ename = reply["content"].get("ename")
    cells["interrupted_" + kind] += 1
    interrupts.append({"kind": kind, "after": round(after, 3), "response": round(response, 3), "status": status, "ename": ename})
    if status == "error" and ename != "Interrupted":
        fail(f"interrupted {kind} cell: {ename}: {reply['content'].get('evalue')}")
    # The session is still usable: state kept, the model answers.
    small_cell()
    _, text = cell("check", 'm.layers("enc")')
    if text.strip() != "6":
        fail(f"after an interrupted {kind} cell the model answered {text!r}")


# ---- the attackers ----------------------------------------------------------------------------
EVIL = f'small += 1000000; write_text("{MARKER}", "a hostile message ran");'
sent = collections.Counter()
attacker_replies = []
replayable = []                         # frames of signed originals
replays_sent = 0                        # signed originals (each runs once)


def j(v):
    return json.dumps(v).encode()


def sign(key, parts):
    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        h.update(p)
    return h.hexdigest().encode()


def header(msg_type):
    return {"msg_id": uuid.uuid4().hex, "session": "mallory", "username": "mallory", "date": "2026-01-01T00:00:00Z", "msg_type": msg_type, "version": "5.3"}


def message(h, content, key=None, sig=None):
    parts = [j(h), b"{}", b"{}", j(content) if not isinstance(content, bytes) else content]
    return [b"<IDS|MSG>", sig if sig is not None else (sign(key, parts) if key else b"")] + parts


def exec_content(code):
    return {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}


def tampered():
    m = message(header("execute_request"), exec_content("1"), key=KEY)
    m[-1] = j(exec_content(EVIL))
    return m


KINDS = {
    "unsigned": lambda: message(header("execute_request"), exec_content(EVIL)),
    "wrong_key": lambda: message(header("execute_request"), exec_content(EVIL), key=b"not the key"),
    "tampered": tampered,
    "bad_hex": lambda: message(header("execute_request"), exec_content(EVIL), sig=b"zz" * 32),
    "garbage": lambda: [rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(1, 8))],
    "no_delimiter": lambda: [j(header("execute_request")), b"{}", b"{}", j(exec_content(EVIL))],
    "signed_code_is_object": lambda: message(header("execute_request"), {**exec_content(""), "code": {"evil": EVIL}}, key=KEY),
    "signed_bad_json": lambda: message(header("execute_request"), b"{not json", key=KEY),
    "signed_unknown_type": lambda: message(header("mallory_request"), {"code": EVIL}, key=KEY),
}


def zmtp_peer(port, socket_type, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(15)
    s.connect((info["ip"], info[port]))
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" * 32
    props = bytes([11]) + b"Socket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    ready = bytes([5]) + b"READY" + props
    s.sendall(greeting + bytes([0x04, len(ready)]) + ready)
    return s


def huge_frame():
    port, stype = rng.choice([("shell_port", b"DEALER"), ("control_port", b"DEALER"), ("stdin_port", b"DEALER"), ("hb_port", b"REQ"), ("iopub_port", b"SUB")])
    s = zmtp_peer(port, stype)
    s.sendall(bytes([0x03]) + struct.pack(">Q", 1 << 40))
    try:
        while s.recv(65536):
            pass
    except OSError:
        pass
    s.close()


def hb_flood():
    s = zmtp_peer("hb_port", b"REQ", rcvbuf=4096)
    ping = bytes([0x01, 0, 0x02]) + struct.pack(">Q", 256 << 10) + b"p" * (256 << 10)
    n = 0
    try:
        while n < 10_000:
            s.sendall(ping)
            n += 1
    except OSError:
        pass
    s.close()
    return n


def attacker():
    socks = {}
    for chan in ["shell_port", "control_port", "stdin_port"]:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://{info['ip']}:{info[chan]}")
        socks[chan] = s
    hb = ctx.socket(zmq.DEALER)
    hb.setsockopt(zmq.LINGER, 0)
    hb.connect(f"tcp://{info['ip']}:{info['hb_port']}")
    lazy = ctx.socket(zmq.SUB)
    lazy.setsockopt(zmq.LINGER, 0)
    lazy.setsockopt(zmq.RCVHWM, 1)
    lazy.setsockopt(zmq.RCVBUF, 4096)
    lazy.setsockopt(zmq.SUBSCRIBE, b"")
    lazy.connect(f"tcp://{info['ip']}:{info['iopub_port']}")
    sent["iopub_subscriber_that_never_reads"] += 1
    names = sorted(KINDS)
    last_huge = last_flood = time.time()
    while not stop.is_set():
        for _ in range(10):
            kind = rng.choice(names)
            chan = rng.choice(list(socks))
            socks[chan].send_multipart(KINDS[kind]())
            sent[kind] += 1
        for frames in list(replayable):
            socks["shell_port"].send_multipart(frames)
            sent["replayed_signed"] += 1
        hb.send(b"no envelope")
        sent["heartbeat_malformed"] += 1
        for s in socks.values():
            while s.poll(0):
                attacker_replies.append(s.recv_multipart())
        while hb.poll(0):
            hb.recv_multipart()
        if time.time() - last_huge > 10:
            huge_frame()
            sent["frame_header_declaring_1_TiB"] += 1
            last_huge = time.time()
        if time.time() - last_flood > 30:
            sent["heartbeat_flood_pings"] += hb_flood()
            sent["heartbeat_flood_peers"] += 1
            last_flood = time.time()
        stop.wait(0.5)
    for s in [*socks.values(), hb, lazy]:
        s.close()


def signed_original():
    """A signed `replays += 1`, sent once on a socket of its own; its frames go to the attackers."""
    global replays_sent
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://{info['ip']}:{info['shell_port']}")
    frames = message(header("execute_request"), exec_content("replays += 1;"), key=KEY)
    s.send_multipart(frames)
    replays_sent += 1
    if not s.poll(60_000):
        fail("no reply to the signed original")
    else:
        r = s.recv_multipart()
        if json.loads(r[-1]).get("status") != "ok":
            fail(f"the signed original failed: {r[-1][:200]!r}")
    s.close()
    replayable.append(frames)
    del replayable[:-5]


# ---- the run ----------------------------------------------------------------------------------
threading.Thread(target=sampler, daemon=True).start()
cell("setup", 'let small = 0; let replays = 0; let d = corpus(asset("pud_en.txt")); let data = d.take(24);')
samples.append({"t": time.time() - t_start, "label": "start", **proc()})
threading.Thread(target=attacker, daemon=True).start()
deadline = t_start + args.minutes * 60
cycle = 0
marks = {}
cycle_end = []                          # the kernel's figures at the end of every cycle
while time.time() < deadline:
    cycle += 1
    _, text = cell("load", 'let m = load_model("minilm", #{device: "cpu"}); m.layers("enc")', timeout=300)
    if text.strip() != "6":
        fail(f"load cell answered {text!r}")
    for _ in range(10):
        small_cell()
    cell("analyze", f'let a = m.analyze(data, #{{stats: ["confidence", "positional"]}}); a.to_json("{R("analysis.json")}");')
    check_json(R("analysis.json"), "confidence")
    cell("sweep", f'let g = m.ablation_sweep(d.take(4)); g.to_csv("{R("sweep.csv")}");')
    check_csv(R("sweep.csv"))
    cell("prune", f'let p = m.prune(d.take(8), #{{steps: 3, batch_tokens: 300}}); p.to_json("{R("prune.json")}");')
    check_json(R("prune.json"), "steps")
    for _ in range(10):
        small_cell()
    cell("write", f'write_text("{R("small.txt")}", small.to_string());')
    if open(R("small.txt")).read() != str(small):
        fail("small.txt is not the count")
    for kind, code in (rng.sample(LONG, len(LONG)) if cycle == 1 else [rng.choice(LONG)]):
        long_cell_interrupted(kind, code)
    signed_original()
    if cycle % 5 == 1:
        _, text = cell("vars", ":vars")
        rows = [l.split("┆")[0].strip("│ ") for l in text.splitlines() if "┆" in l]
        dup = [n for n, c in collections.Counter(rows).items() if c > 1]
        if dup:
            fail(f":vars lists {dup} more than once")
    now = time.time() - t_start
    cycle_end.append({"cycle": cycle, "t": now, **proc()})
    if cycle == 1:
        marks["after_first_cycle"] = {"t": now, **proc()}
    if "after_10_min" not in marks and now >= 600:
        marks["after_10_min"] = {"t": now, **proc()}
    log(f"cycle {cycle}: {sum(cells.values())} cells, rss {proc()['rss_mb']:.0f} MB, fds {proc()['fds']}, threads {proc()['threads']}")
marks["end"] = {"t": time.time() - t_start, **proc()}

# ---- the verdict --------------------------------------------------------------------------------
stop.set()
time.sleep(1)
_, text = cell("check", "replays")
if text.strip() != str(replays_sent):
    fail(f"replays = {text.strip()}, but {replays_sent} signed originals were sent: a replay ran")
_, text = cell("check", "small")
if text.strip() != str(small):
    fail(f"small = {text.strip()}, expected {small}: a hostile message ran")
if os.path.exists(MARKER):
    fail("the marker exists: a hostile message ran")
bad = [r for r in attacker_replies if json.loads(r[-1]).get("status") != "error"]
if bad:
    fail(f"attackers got {len(bad)} non-error replies, e.g. {bad[0][-1][:200]!r}")
for path in glob.glob(os.path.join(RESULTS, "*")):
    if path.endswith(".json"):
        check_json(path, "{")
    elif path.endswith(".csv"):
        check_csv(path)
leftover = glob.glob(os.path.join(RESULTS, ".*"))
if leftover:
    fail(f"temporary files left: {leftover}")
for i in interrupts:
    if i["response"] > 1.0:
        fail(f"an interrupt took {i['response']:.2f} s to answer ({i['kind']} cell)")
if km.is_alive() is False:
    fail("the kernel died")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


after = [s for s in samples if "label" not in s and s["t"] >= marks["after_first_cycle"]["t"]]
summary = {
    "minutes": round((time.time() - t_start) / 60, 1),
    "cycles": cycle,
    "cells": sum(cells.values()),
    "cells_by_kind": dict(cells),
    "latency_s": {k: {"n": len(v), "p50": round(pct(v, 50), 4), "p99": round(pct(v, 99), 4), "max": round(max(v), 4)} for k, v in sorted(lat.items())},
    "memory_mb": {"start": round(samples[0]["rss_mb"] if samples else 0, 1),
                  **{k: round(v["rss_mb"], 1) for k, v in marks.items()},
                  "after_first_cycle_min": round(min(s["rss_mb"] for s in after), 1) if after else None,
                  "after_first_cycle_max": round(max(s["rss_mb"] for s in after), 1) if after else None,
                  "cycle_end_min_after_first": round(min(c["rss_mb"] for c in cycle_end[1:]), 1) if cycle_end[1:] else None,
                  "cycle_end_max_after_first": round(max(c["rss_mb"] for c in cycle_end[1:]), 1) if cycle_end[1:] else None,
                  "peak_hwm": round(marks["end"]["hwm_mb"], 1)},
    "fds": {k: v["fds"] for k, v in marks.items()} | {"min_after_first_cycle": min((s["fds"] for s in after), default=None), "max_after_first_cycle": max((s["fds"] for s in after), default=None)},
    "threads": {k: v["threads"] for k, v in marks.items()} | {"min_after_first_cycle": min((s["threads"] for s in after), default=None), "max_after_first_cycle": max((s["threads"] for s in after), default=None)},
    "interrupts": {"n": len(interrupts), "max_response_s": max((i["response"] for i in interrupts), default=None),
                   "p50_response_s": pct([i["response"] for i in interrupts], 50),
                   "by_status": dict(collections.Counter(f"{i['status']}/{i['ename']}" for i in interrupts)), "all": interrupts},
    "hostile_sent": dict(sent),
    "hostile_total": sum(v for k, v in sent.items()),
    "attacker_replies": len(attacker_replies),
    "replays": {"signed_originals": replays_sent, "replayed_copies": sent["replayed_signed"]},
    "result_files": sorted(os.path.basename(p) for p in glob.glob(os.path.join(RESULTS, "*"))),
    "cycle_end": cycle_end,
    "samples": samples,
    "failures": failures,
}
with open(os.path.join(OUT, "soak.json"), "w") as f:
    json.dump(summary, f, indent=1)
kc.stop_channels()
km.shutdown_kernel(now=False)

s = summary
print(f"soak: {s['minutes']} min, {s['cycles']} cycles, {s['cells']} cells {s['cells_by_kind']}")
for k, v in s["latency_s"].items():
    print(f"  latency {k:22} n={v['n']:5}  p50 {1e3 * v['p50']:9.1f} ms  p99 {1e3 * v['p99']:9.1f} ms  max {1e3 * v['max']:9.1f} ms")
m = s["memory_mb"]
print(f"  RSS MB: start {m['start']}, after first cycle {m.get('after_first_cycle')}, after 10 min {m.get('after_10_min')}, end {m.get('end')}; "
      f"after the first cycle: at cycle ends {m['cycle_end_min_after_first']}-{m['cycle_end_max_after_first']}, "
      f"any sample {m['after_first_cycle_min']}-{m['after_first_cycle_max']}; peak {m['peak_hwm']}")
print(f"  fds {s['fds']}; threads {s['threads']}")
print(f"  interrupts: {s['interrupts']['n']}, answered in p50 {s['interrupts']['p50_response_s']:.3f} s, max {s['interrupts']['max_response_s']:.3f} s; {s['interrupts']['by_status']}")
print(f"  hostile: {s['hostile_total']} sent {s['hostile_sent']}; {s['attacker_replies']} attacker replies, all status error: {not bad}")
print(f"  replays: {replays_sent} signed originals ran once each, {sent['replayed_signed']} replayed copies ran none")
print(f"  result files: {s['result_files']}, all whole; no temporary file left: {not leftover}")
print("FAILURES:\n  " + "\n  ".join(failures) if failures else "all checks passed")
sys.exit(1 if failures else 0)
