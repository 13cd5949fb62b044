#!/usr/bin/env bash
# Before/after a change, in one run: the headscope side of benches/analysis.sh
# (benches/analysis.rhai), benches/patching.sh (the bench script it writes under
# target/patching-smollm2-hf; run patching.sh once first) and benches/generate.sh
# (benches/generate.rhai), each by two headscope binaries alternately (before, after, before,
# after, ...), on the same scripts and data, from this checkout. Prints every run's figures and
# the ratio of the medians, and whether the checks (numbers each bench prints) agree.
#
#   benches/before_after.sh BEFORE_BINARY [AFTER_BINARY] [ROUNDS]
#
# BEFORE_BINARY: e.g. a worktree of the old commit built with `cargo build --release`.
# AFTER_BINARY defaults to target/release/headscope; ROUNDS to 2 (analysis runs 3 rounds).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$root"
before=${1:?usage: benches/before_after.sh BEFORE_BINARY [AFTER_BINARY] [ROUNDS]}
after=${2:-target/release/headscope}
rounds=${3:-2}
[ -f target/patching-smollm2-hf/bench.rhai ] || { echo "before_after: run benches/patching.sh once first (it writes target/patching-smollm2-hf)" >&2; exit 2; }
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
prompt="Once upon a time, in a small village at the edge of a large forest, there lived an old"
for round in $(seq 1 $((rounds + 1))); do
  for who in before after; do
    bin=$before; [ $who = after ] && bin=$after
    "$bin" run benches/analysis.rhai 100 >> "$out/analysis_$who"
    if [ "$round" -le "$rounds" ]; then
      "$bin" run target/patching-smollm2-hf/bench.rhai >> "$out/patching_$who"
      "$bin" run benches/generate.rhai "$prompt" >> "$out/generate_$who"
    fi
  done
done
OUT="$out" .venv/bin/python - <<'PY'
import json, os, statistics as st
d = os.environ["OUT"]
def lines(name, who):
    return [json.loads(l) for l in open(f"{d}/{name}_{who}") if l.startswith("{")]
figs, checks = {}, {}
for who in ["before", "after"]:
    for r in lines("analysis", who):
        figs.setdefault((f"{r['bench']} ({r['sentences']} sentences)"), {}).setdefault(who, []).append(r["seconds"])
        checks.setdefault(who, []).append(json.dumps(r["check"], sort_keys=True))
    for r in lines("patching", who):
        for k, label in [("all_pos_s", "patching, all positions"), ("by_pos_s", "patching, per position"), ("attribution_s", "attribution patching")]:
            figs.setdefault(label, {}).setdefault(who, []).append(r[k])
        checks.setdefault(who, []).append(f"{r['clean']} {r['corrupted']}")
    for r in lines("generate", who):
        figs.setdefault(f"generate {r['mode']} {r['new_tokens']}", {}).setdefault(who, []).append(r["seconds"])
        checks.setdefault(who, []).append(r["text"])
print(f"{'figure (seconds)':<32} {'before':<24} {'after':<24} after/before (medians)")
for name, v in figs.items():
    b, a = v.get("before", []), v.get("after", [])
    if b and a:
        print(f"{name:<32} {' '.join(f'{x:.2f}' for x in b):<24} {' '.join(f'{x:.2f}' for x in a):<24} {st.median(a) / st.median(b):.3f}")
print("checks (analysis numbers, patching logit diffs, generated texts) equal before/after:",
      sorted(set(checks["before"])) == sorted(set(checks["after"])))
PY
