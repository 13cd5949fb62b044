"""Compare two runs of benches/gpu_parity.rhai (CPU against CUDA): every number of every JSON
file at the same place, every string equal. Prints one line per file with the largest absolute
difference, the largest relative to the file's largest value, and the strings that differ.

    python benches/gpu_parity.py CPU_DIR CUDA_DIR [--tol 1e-4]

Exit status 1 when a number differs by more than --tol relative to the file's scale
(max(1, largest |value|)), or a string differs in a file other than prune.json/extra.json
(a pruning run's gates are continuous; text outputs are reported, not asserted).
"""
import argparse
import csv
import json
import math
import os
import sys


def leaves(x, path=""):
    if isinstance(x, dict):
        for k in sorted(x):
            yield from leaves(x[k], f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, x


def load(path):
    if path.endswith(".csv"):
        with open(path) as f:
            return list(csv.reader(f))
    with open(path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    bad = 0
    for name in sorted(os.listdir(args.a)):
        pa, pb = os.path.join(args.a, name), os.path.join(args.b, name)
        if not os.path.exists(pb):
            print(f"{name}: missing in {args.b}")
            bad += 1
            continue
        la, lb = dict(leaves(load(pa))), dict(leaves(load(pb)))
        worst, scale, strings, nums, where = 0.0, 1.0, [], 0, ""
        for k, va in la.items():
            vb = lb.get(k)
            if isinstance(va, bool) or isinstance(vb, bool) or va is None or vb is None:
                if va != vb and not k.startswith(".options.device") and "device" not in k:
                    strings.append(k)
                continue
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
                if any(w in k for w in ("seconds", "elapsed", "time")) or (math.isnan(va) and math.isnan(vb)):
                    continue
                nums += 1
                scale = max(scale, abs(va))
                if abs(va - vb) > worst:
                    worst, where = abs(va - vb), k
            elif va != vb and "device" not in k and "seconds" not in k and "elapsed" not in k:
                try:
                    fa, fb = float(va), float(vb)
                    nums += 1
                    scale = max(scale, abs(fa))
                    if abs(fa - fb) > worst:
                        worst, where = abs(fa - fb), k
                except (TypeError, ValueError):
                    strings.append(k)
        missing = set(la) ^ set(lb)
        rel = worst / scale
        ok = rel <= args.tol and not missing and (not strings or name in ("prune.json", "extra.json"))
        bad += not ok
        print(f"{name}: {nums} numbers, max |diff| {worst:.3e} (relative {rel:.3e}{f' at {where}' if where else ''}){'' if not strings else f', {len(strings)} strings differ: {strings[:4]}'}{'' if not missing else f', {len(missing)} keys only in one'}  {'ok' if ok else 'DIFFERS'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
