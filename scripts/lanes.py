#!/usr/bin/env python3
"""Runs test binaries in parallel lanes (scripts/test; docs/testing.md, "Lanes").

  lanes.py [--lanes N] [--env K=V]... JOB...

A JOB is `all` (every test executable of the workspace, then its doc tests), or a test target's
name (`models`), optionally with libtest's arguments after `=` (`sessions=shards::`,
`models=--skip hf_families`). The executables are built first
(`cargo test --no-run`); then they run directly, not under `cargo test` (two of those at once
would wait on each other's lock on the build directory), spread over N lanes (default
HEADSCOPE_TEST_LANES, else 2) by their recorded running time, longest first onto the lane with
the least work. Each lane gives its processes cores / N libtorch threads
(OMP_NUM_THREADS, MKL_NUM_THREADS) and one test at a time (RUST_TEST_THREADS=1): libtorch's
OpenMP threads spin while they wait, so two processes with every core each slow each other
down, and one thread each does not. A binary's output is printed whole when it ends (lines of
two lanes are not interleaved); a line per binary says its lane, its result and its time.
Exits 1 when any binary failed; every binary runs whatever the others do."""
import json, os, subprocess, sys, threading, time

# Seconds each binary took in a lane of one libtorch thread beside another lane (2-core AMD EPYC,
# 2026-11-29; docs/testing.md, "Lanes"): only which lane runs what, in which order, depends on them.
RECORDED = {"readme": 749, "scripting": 468, "sessions": 222, "readers": 215, "analyses": 192, "models": 151,
            "frontends": 95, "pruning": 92, "attribution": 60, "doc": 13,
            # The second numeric pass's jobs (no vector instructions: slower kernels).
            "models hf_families": 31, "models --skip hf_families": 113, "sessions shards::": 112,
            "readme numbers_match": 1}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def executables():
    """(name, path, package directory) of every test executable, built now."""
    out = subprocess.run(["cargo", "test", "--release", "--locked", "--no-run", "--message-format=json-render-diagnostics"],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"lanes: cargo test --no-run failed (exit {out.returncode})")
    found = []
    for line in out.stdout.splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"].get("test"):
            continue
        t = m["target"]
        kind = t["kind"][0]
        name = t["name"] if kind == "test" else f"{t['name']} ({kind})"
        found.append((name, m["executable"], os.path.dirname(m["manifest_path"])))
    return found


def main():
    args = sys.argv[1:]
    lanes = int(os.environ.get("HEADSCOPE_TEST_LANES", "2"))
    extra = {}
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag == "--lanes":
            lanes = int(args.pop(0))
        elif flag == "--env":
            k, v = args.pop(0).split("=", 1)
            extra[k] = v
        else:
            sys.exit(f"lanes: unknown flag {flag}")
    lanes = max(1, lanes)
    built = executables()
    jobs = []  # (name, argv, cwd)
    for job in args:
        if job == "all":
            jobs += [(n, [p], d) for n, p, d in built]
            jobs.append(("doc", ["cargo", "test", "--release", "--locked", "--no-fail-fast", "--doc"], ROOT))
            continue
        name, _, filt = job.partition("=")
        match = [(n, p, d) for n, p, d in built if n == name]
        if not match:
            sys.exit(f"lanes: no test target named '{name}' (have: {', '.join(n for n, _, _ in built)})")
        n, p, d = match[0]
        jobs.append((f"{n} {filt}".strip(), [p] + filt.split(), d))
    cores = os.cpu_count() or 1
    threads = str(max(1, cores // lanes))
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    env.update(extra)
    env.setdefault("RUST_TEST_THREADS", "1")
    env.setdefault("CARGO", "cargo")
    weight = lambda j: RECORDED.get(j[0], RECORDED.get(j[0].split()[0], 30))
    queues = [[] for _ in range(lanes)]
    load = [0] * lanes
    for j in sorted(jobs, key=weight, reverse=True):
        k = load.index(min(load))
        queues[k].append(j)
        load[k] += weight(j)
    failed, verdicts, lock = [], [], threading.Lock()
    started = time.time()

    def lane(k):
        for name, argv, cwd in queues[k]:
            t0 = time.time()
            try:
                r = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, errors="replace")
                out, code = r.stdout, r.returncode
            except Exception as e:  # a binary that cannot be run is a failure, not a silence
                out, code = f"lanes: cannot run {argv[0]}: {e}\n", -1
            with lock:
                sys.stdout.write(out)
                verdict = "ok" if code == 0 else f"FAILED (exit {code})"
                print(f"lanes: lane {k + 1}/{lanes}: {name}: {verdict} in {time.time() - t0:.0f} s", flush=True)
                verdicts.append(name)
                if code != 0:
                    failed.append(name)

    print(f"lanes: {len(jobs)} binaries in {lanes} lanes of {threads} libtorch thread(s)"
          + (f" under {' '.join(f'{k}={v}' for k, v in extra.items())}" if extra else ""), flush=True)
    ts = [threading.Thread(target=lane, args=(k,)) for k in range(lanes)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    # Every job reports a verdict: a lane that stopped early fails the run.
    for name, _, _ in jobs:
        if name not in verdicts:
            failed.append(f"{name} (never ran)")
    print(f"lanes: done in {time.time() - started:.0f} s; " + (f"FAILED: {', '.join(failed)}" if failed else "every binary passed"))
    sys.exit(1 if failed else 0)


main()
