#!/usr/bin/env python3
"""Checks that a change leaves headscope's published numbers as they were (docs/results.md,
the JSON and CSV under docs/img/), number by number, within a tolerance (default 1e-6,
absolute or relative, whichever is looser). Exits 1 on a difference.

  compare_numbers.py OLD NEW [TOL]
      two outputs of one script (text, or two JSON files, compared as trees): the text between
      numbers must be equal and each pair of numbers within TOL.
  compare_numbers.py --files REV DIR [TOL]
      every *.json and *.csv under DIR against the same file at git revision REV (what a
      docs/make_results*.rhai run rewrote against what is committed); files the run did not
      rewrite (equal to REV) are counted as unchanged.
  compare_numbers.py --results RESULTS_MD OUT... [--tol TOL]
      every line of RESULTS_MD's code blocks (the tables and listings pasted from the scripts'
      output) against the lines the scripts printed now (OUT: their captured stdout): each
      must be printed again with the same text and numbers within TOL. Lines of blocks whose
      script was not run show as missing, block by block, with the heading above them.

Lines that mention a duration (seconds, `ms`, `x s`) are not compared: timings differ."""
import json, os, re, subprocess, sys

NUM = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|NaN|nan|inf")
TIMING = re.compile(r"seconds|elapsed|\d s\b| s =|\d ?ms\b|\d+(?:\.\d+)? s[,)]|/s\b")


def timed(line):
    return bool(TIMING.search(line))


def untimed(text):
    return "\n".join(l for l in text.splitlines() if not timed(l))


class Tally:
    def __init__(self, tol):
        self.tol, self.n, self.bad, self.worst, self.where, self.notes = tol, 0, 0, 0.0, "", []
        self.retyped = 0
        self.info = []

    def number(self, x, y, where):
        """Compares two numbers (floats or their text); returns whether they agree."""
        self.n += 1
        if x == y:
            return True
        if isinstance(x, bool) or isinstance(y, bool):
            return self.fail(f"{where}: {x!r} vs {y!r}")
        if re.fullmatch(r"[-+]?\d+", str(x)) and re.fullmatch(r"[-+]?\d+", str(y)):
            # Counts are exact.
            return self.fail(f"{where}: {x} vs {y}")
        try:
            fx, fy = float(x), float(y)
        except (TypeError, ValueError):
            return self.fail(f"{where}: {x!r} vs {y!r}")
        if fx != fx and fy != fy:
            return True
        d = abs(fx - fy) / max(1.0, abs(fx))
        if d > self.worst:
            self.worst, self.where = d, where
        if not d <= self.tol:
            return self.fail(f"{where}: {x} vs {y}")
        return True

    def fail(self, note):
        self.bad += 1
        self.notes.append(note)
        return False

    def report(self, what):
        for n in self.info:
            print("  note:", n)
        for n in self.notes[:20]:
            print("  differs:", n)
        if len(self.notes) > 20:
            print(f"  ... and {len(self.notes) - 20} more")
        at = f" (at {self.where})" if self.where else ""
        retyped = f"; {self.retyped} echoed options typed now, text before, equal" if self.retyped else ""
        print(f"{what}: {self.n} numbers, {self.bad} beyond {self.tol:g}, largest difference {self.worst:.3g}{at}{retyped}")


def texts(a, b, tally, where=""):
    """Two texts: equal between numbers, numbers within the tolerance."""
    pa, na = NUM.split(a), NUM.findall(a)
    pb, nb = NUM.split(b), NUM.findall(b)
    if len(na) != len(nb):
        return tally.fail(f"{where}: {len(na)} numbers vs {len(nb)}")
    if pa != pb:
        return tally.fail(f"{where}: the text differs")
    ok = True
    for i, (x, y) in enumerate(zip(na, nb)):
        ok &= tally.number(x, y, f"{where} number {i + 1}")
    return ok


def trees(a, b, tally, path="$"):
    """Two JSON values: the same keys and shapes, strings equal, numbers within the tolerance."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            tally.fail(f"{path}: keys {sorted(set(a) ^ set(b))} on one side only")
        for k in a:
            if k in b:
                trees(a[k], b[k], tally, f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            tally.fail(f"{path}: {len(a)} entries vs {len(b)}")
        # An echoed option is a [key, value] pair: name the path by its key.
        for i, (x, y) in enumerate(zip(a, b)):
            named = isinstance(x, list) and len(x) == 2 and isinstance(x[0], str)
            trees(x, y, tally, f"{path}.{x[0]}" if named else f"{path}[{i}]")
    elif type(a) is not type(b) and (isinstance(a, str) or isinstance(b, str)):
        # An option echoed as text by an older version ("64", "nsubj,dobj", "false") and as a
        # typed value by a newer one: the same option if the texts agree.
        if echo_text(a) != echo_text(b):
            tally.fail(f"{path}: {str(a)[:60]!r} vs {str(b)[:60]!r}")
        else:
            tally.retyped += 1
    elif isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        if (type(a) is not type(b) or a != b) and not (timed(path) or path.endswith(".seconds")):
            tally.fail(f"{path}: {str(a)[:60]!r} vs {str(b)[:60]!r}")
    elif a is None or b is None:
        if a is not b:
            tally.fail(f"{path}: {a} vs {b}")
    elif not (path.endswith("seconds") or "seconds" in path.split(".")[-1]):
        tally.number(a, b, path)


def echo_text(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return ",".join(echo_text(x) for x in v)
    if isinstance(v, (int, float)):
        return repr(float(v))
    try:
        return repr(float(v))
    except ValueError:
        return str(v).lower() if str(v) in ("True", "False") else str(v)


def compare_pair(old_text, new_text, name, tol):
    tally = Tally(tol)
    if name.endswith(".json"):
        trees(json.loads(old_text), json.loads(new_text), tally)
    elif name.endswith(".csv") and (old_text.splitlines()[:1] != new_text.splitlines()[:1]
                                    or any(timed(c) for c in old_text.splitlines()[:1][0].split(",")) if old_text else False):
        csv_columns(old_text, new_text, tally)
    else:
        a, b = untimed(old_text).splitlines(), untimed(new_text).splitlines()
        if len(a) != len(b):
            tally.fail(f"{len(a)} lines vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            texts(x, y, tally, f"line {i + 1}")
    tally.report(name)
    return tally.bad == 0


def csv_columns(old_text, new_text, tally):
    """Two CSV files whose header rows differ (a column added or dropped since the old one was
    written), or that hold a timing column (`seconds`): the rows must match in number and in
    every column both have, by name, but timings; the other columns are listed in the report, not
    compared."""
    import csv, io
    a, b = list(csv.DictReader(io.StringIO(old_text))), list(csv.DictReader(io.StringIO(new_text)))
    ca = next(csv.reader(io.StringIO(old_text)), [])
    cb = next(csv.reader(io.StringIO(new_text)), [])
    common = [c for c in ca if c in cb and not timed(c)]
    if not common:
        tally.fail("no column in common")
        return
    tally.info.append(f"columns only in the old file: {[c for c in ca if c not in cb]}, only in the new: "
                       f"{[c for c in cb if c not in ca]}; timings not compared: {[c for c in ca if c in cb and timed(c)]}; "
                       f"compared: {common}")
    if len(a) != len(b):
        tally.fail(f"{len(a)} rows vs {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        for c in common:
            texts(x[c], y[c], tally, f"row {i + 1} column {c}")


def files_mode(rev, folder, tol):
    if subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=top(folder),
                      capture_output=True).returncode != 0:
        sys.exit(f"compare_numbers: '{rev}' is not a revision of {top(folder)}")
    ok, same = True, 0
    for root, _, names in os.walk(folder):
        for n in sorted(names):
            if not n.endswith((".json", ".csv")):
                continue
            path = os.path.join(root, n)
            git = subprocess.run(["git", "show", f"{rev}:{os.path.relpath(path, top(folder))}"], capture_output=True,
                                 cwd=top(folder), text=True)
            if git.returncode != 0:
                print(f"{path}: not at {rev} (new file), not compared")
                continue
            new = open(path).read()
            if new == git.stdout:
                same += 1
                continue
            ok &= compare_pair(git.stdout, new, path, tol)
    print(f"{same} files byte-identical to {rev} (not rewritten by the run, or rewritten identically: "
          "which, the run's own log says)")
    return ok


def top(folder):
    return subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          cwd=folder).stdout.strip()


def results_mode(md, outs, tol):
    """Each code-block line of the results document (those with a number), found again, in
    order, in the output that prints most of its block."""
    printed = []
    for o in outs:
        lines = [l.rstrip() for l in open(o).read().splitlines() if l.strip() and not timed(l)]
        printed.append((o, lines))
    tally = Tally(tol)
    heading, in_block, blocks = "", False, []
    for i, l in enumerate(open(md).read().splitlines(), 1):
        if l.startswith("```"):
            in_block = not in_block
            if in_block:
                blocks.append((heading, i, []))
            continue
        if in_block:
            blocks[-1][2].append((i, l.rstrip()))
        elif l.startswith("#"):
            heading = l.lstrip("# ").strip()
    full, differ, absent, shape_only = 0, 0, [], []
    for head, start, lines in blocks:
        lines = [(i, l) for i, l in lines if NUM.search(l) and not timed(l)]
        if not lines:
            continue
        shape = lambda l: NUM.sub("#", l)
        # The output that prints this block: the most of its lines verbatim, else by shape.
        def score(p):
            have, shapes = set(p[1]), {shape(x) for x in p[1]}
            return (sum(l in have for _, l in lines), sum(shape(l) in shapes for _, l in lines))
        name, out = max(printed, key=score)
        verbatim, shaped = score((name, out))
        if shaped * 3 < len(lines):
            absent.append(f"{md}:{start} ({head}): {len(lines)} lines, no output prints lines of their shape")
            continue
        if verbatim * 3 < len(lines):
            # Lines of this block's shape are printed but few verbatim: its script was not run
            # (another table has the same shape) or its numbers moved. Either way not shown
            # equal: a failure, named.
            shape_only.append(f"{md}:{start} ({head}): {verbatim} of {len(lines)} lines verbatim, "
                              f"{shaped} of their shape in {os.path.basename(name)}")
            tally.bad += 1
            continue
        ok, at = True, -1
        for i, l in lines:
            # The next line of this shape after the last match: the block's rows in order.
            later = [k for k in range(at + 1, len(out)) if shape(out[k]) == shape(l)]
            if not later:
                ok = tally.fail(f"{md}:{i} ({head}) not printed in order by {os.path.basename(name)}: {l.strip()[:100]}")
                continue
            k = next((k for k in later if out[k] == l), later[0])
            ok &= texts(l, out[k], tally, f"{md}:{i}")
            at = k
        full += ok
        differ += not ok
    for m in absent:
        print("  not printed:", m)
    for m in shape_only:
        print("  FAILS (shape only):", m)
    print(f"{md}: {full} code blocks printed again in order within {tol:g}, {differ} with differences, "
          f"{len(shape_only)} printed by shape only (fail), {len(absent)} not printed (their scripts not run)")
    tally.report(md)
    return tally.bad == 0


def main():
    args = sys.argv[1:]
    if args[:1] == ["--files"]:
        ok = files_mode(args[1], args[2], float(args[3]) if len(args) > 3 else 1e-6)
    elif args[:1] == ["--results"]:
        tol = 1e-6
        if "--tol" in args:
            k = args.index("--tol")
            tol = float(args[k + 1])
            del args[k:k + 2]
        ok = results_mode(args[1], args[2:], tol)
    else:
        tol = float(args[2]) if len(args) > 2 else 1e-6
        ok = compare_pair(open(args[0]).read(), open(args[1]).read(), args[1], tol)
    sys.exit(0 if ok else 1)


main()
