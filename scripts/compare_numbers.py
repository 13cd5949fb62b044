#!/usr/bin/env python3
"""Compares two outputs of the same script number by number: the text between numbers must be
equal, and each pair of numbers within a tolerance (default 1e-6, absolute or relative,
whichever is looser). Used to check that a refactor leaves docs/results.md's figures as they
were: `scripts/compare_numbers.py before.out after.out [tol]`. Exits 1 on a difference."""
import re, sys

NUM = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|NaN|nan|inf")

def split(text):
    parts = NUM.split(text)
    nums = NUM.findall(text)
    return parts, nums

TIMING = re.compile(r"seconds|elapsed|\d s\b| s =|ms\b")

def untimed(text):
    # Timings differ from run to run: lines mentioning seconds are not compared.
    return "\n".join(l for l in text.splitlines() if not TIMING.search(l))

def main():
    a, b = untimed(open(sys.argv[1]).read()), untimed(open(sys.argv[2]).read())
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-6
    pa, na = split(a)
    pb, nb = split(b)
    if len(na) != len(nb):
        print(f"different number counts: {len(na)} vs {len(nb)}")
    worst, bad, n = 0.0, 0, 0
    for x, y in zip(na, nb):
        if x == y:
            n += 1
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            bad += 1
            continue
        d = abs(fx - fy)
        rel = d / max(1.0, abs(fx))
        worst = max(worst, rel)
        n += 1
        if rel > tol:
            bad += 1
            if bad <= 10:
                print(f"differs: {x} vs {y}")
    diff_text = sum(1 for x, y in zip(pa, pb) if x != y)
    print(f"{n} numbers compared, {bad} beyond {tol}, largest difference {worst:.3g}; {diff_text} text pieces differ")
    sys.exit(1 if bad or diff_text or len(na) != len(nb) else 0)

main()
