#!/usr/bin/env bash
# Renders docs/notebook/heads.ipynb with the headscope kernel and screenshots it:
# nbconvert executes the notebook and writes HTML, headless Chromium takes the picture.
# Needs: scripts/setup, a release build, and chromium (apt-get install chromium).
# Usage: docs/notebook/make_screenshot.sh   -> docs/img/notebook.png
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
target/release/headscope kernel install --prefix "$tmp/prefix" >/dev/null
export JUPYTER_PATH="$tmp/prefix/share/jupyter"
.venv/bin/jupyter-nbconvert --to notebook --execute --ExecutePreprocessor.kernel_name=headscope \
  --ExecutePreprocessor.timeout=600 docs/notebook/heads.ipynb --output-dir "$tmp" --output heads.ipynb
cp "$tmp/heads.ipynb" docs/notebook/heads.ipynb
.venv/bin/jupyter-nbconvert --to html --template lab "$tmp/heads.ipynb" --output-dir "$tmp" --output heads
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,920 \
  --screenshot="$root/docs/img/notebook.png" "file://$tmp/heads.html"
echo "wrote docs/img/notebook.png"
