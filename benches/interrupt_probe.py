"""Interrupt response of the headscope kernel's long computations (a benchmark, not a test).

    HEADSCOPE_BIN=target/release/headscope python benches/interrupt_probe.py [--rounds N] [--out F]

One kernel under jupyter_client; MiniLM loaded once; then, N times each, the soak's four long
cells (benches/soak_driver.py LONG: a whole-corpus analysis, a 300-sentence sweep, a 500-step
prune, an endless loop) are started and interrupted at a random moment 0.1-3 s in. Prints, per
kind, the response times (interrupt_request sent -> the cell's execute_reply) and how many came
within 1 s; writes them all to --out as JSON. Exits 1 when any reply is not `Interrupted` or a
cell finished before its interrupt (then the figure would mean nothing).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import jupyter_client

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=10)
ap.add_argument("--seed", type=int, default=7)
ap.add_argument("--out")
args = ap.parse_args()

tmp = tempfile.mkdtemp(prefix="headscope-interrupt-")
HS = os.environ.get("HEADSCOPE_BIN", "target/release/headscope")
subprocess.run([HS, "kernel", "install", "--prefix", tmp], check=True, stdout=subprocess.DEVNULL)
os.environ["JUPYTER_PATH"] = os.path.join(tmp, "share", "jupyter")
os.environ["JUPYTER_RUNTIME_DIR"] = os.path.join(tmp, "runtime")
km = jupyter_client.KernelManager(kernel_name="headscope")
km.start_kernel(stderr=open(os.path.join(tmp, "kernel.stderr"), "w"))
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=60)
rng = random.Random(args.seed)


def run(code):
    r = kc.execute_interactive(code, timeout=600, output_hook=lambda m: None)
    if r["content"]["status"] != "ok":
        sys.exit(f"setup cell failed: {r['content'].get('evalue')}")


R = lambda name: os.path.join(tmp, name)
run('let m = load_model("minilm"); let d = corpus(asset("pud_en.txt"));')
LONG = [
    ("analysis", f'let a2 = m.analyze(d, #{{stats: ["confidence", "positional"], batch_tokens: 256}}); a2.to_json("{R("a.json")}");'),
    ("sweep", f'let g2 = m.ablation_sweep(d.take(300), #{{batch_tokens: 128}}); g2.to_csv("{R("s.csv")}");'),
    ("prune", f'let p2 = m.prune(d.take(16), #{{steps: 500, batch_tokens: 300}}); p2.to_json("{R("p.json")}");'),
    ("loop", "let i = 0; loop { i += 1; }"),
]
rows, bad = [], []
for _ in range(args.rounds):
    for kind, code in LONG:
        after = rng.uniform(0.1, 3.0)
        msg_id = kc.execute(code)
        time.sleep(after)
        t0 = time.time()
        km.interrupt_kernel()
        while True:
            reply = kc.get_shell_msg(timeout=120)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        resp = time.time() - t0
        c = reply["content"]
        rows.append({"kind": kind, "after": round(after, 3), "response": round(resp, 3), "status": c["status"], "ename": c.get("ename")})
        if c.get("ename") != "Interrupted":
            bad.append(rows[-1])
        run("1")  # the session answers
kc.stop_channels()
km.shutdown_kernel(now=True)

print(f"{'kind':<9} {'n':>3} {'p50 s':>7} {'max s':>7} {'<= 1 s':>7}")
for kind, _ in LONG:
    r = sorted(x["response"] for x in rows if x["kind"] == kind)
    print(f"{kind:<9} {len(r):>3} {r[len(r) // 2]:>7.3f} {r[-1]:>7.3f} {sum(x <= 1.0 for x in r):>4}/{len(r)}")
if args.out:
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
if bad:
    print("not interrupted:", bad)
    sys.exit(1)
