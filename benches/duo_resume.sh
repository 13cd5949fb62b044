#!/usr/bin/env bash
# DuoAttention's gates survive a kill (docs/methods.md#duo-gates): runs docs/make_results_duo.rhai
# again into runs/duo_killed, kills it with SIGKILL after KILL_AFTER seconds (default 150), resumes
# it from its checkpoint, and compares the final gates with the uninterrupted run's (runs/duo,
# written by `headscope run docs/make_results_duo.rhai`): they must be identical.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
[ -f runs/duo/checkpoint.json ] || { echo "duo_resume: run docs/make_results_duo.rhai first (runs/duo/checkpoint.json is missing)" >&2; exit 2; }
dir=runs/duo_killed
rm -rf "$dir"
script=$(mktemp --suffix .rhai)
sed -e 's|"runs/duo"|"runs/duo_killed"|' -e 's|runs/duo_gates.json|runs/duo_killed_gates.json|' -e '/heatmap/d' docs/make_results_duo.rhai > "$script"
set +e
timeout -s KILL "${KILL_AFTER:-150}" target/release/headscope run "$script" > /dev/null 2>&1
rc=$?
set -e
step=$(python3 -c "import json; print(json.load(open('$dir/checkpoint.json'))['step'])")
echo "duo_resume: killed (exit $rc) with the checkpoint at step $step; resuming"
target/release/headscope run "$script" > "$dir.log" 2>&1
head -1 "$dir.log"
python3 - <<'PY'
import json
a = json.load(open("runs/duo/checkpoint.json"))
b = json.load(open("runs/duo_killed/checkpoint.json"))
assert a["step"] == b["step"], (a["step"], b["step"])
same = a["alpha"] == b["alpha"]
diff = max(abs(x - y) for x, y in zip(a["alpha"], b["alpha"]))
print(f"duo_resume: step {b['step']}: {len(b['alpha'])} gates, identical to the uninterrupted run: {same} (max difference {diff:g})")
raise SystemExit(0 if same else 1)
PY
