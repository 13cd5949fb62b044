#!/usr/bin/env bash
# The suite's wall time as CI sees it: a fresh clone of this repository at REV runs `.ci/run`
# (scripts/test: set-up from nothing, a cargo build from scratch, the tests), every output line
# stamped with the seconds since the start; the phases and the test-result lines are summed at
# the end.   benches/ci_timed.sh REV [DIR]    (DIR: where to clone, default /tmp/ci-REV)
set -euo pipefail
rev=${1:?usage: benches/ci_timed.sh REV [DIR]}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir=${2:-/tmp/ci-$rev}
rm -rf "$dir"
git clone -q "$root" "$dir"
git -C "$dir" checkout -q "$rev"
log="$dir.log"
start=$(date +%s)
( cd "$dir" && .ci/run 2>&1; echo "EXIT $?" ) | while IFS= read -r l; do printf '%6d %s\n' $(( $(date +%s) - start )) "$l"; done > "$log"
echo "$rev: $(grep -cE 'Running |Doc-tests' "$log") test executables"
grep -E "setup: done|Finished .release|EXIT" "$log"
grep -E "test result" "$log" | awk '{p += $5; f += $7} END {print p " passed, " f " failed"}'
