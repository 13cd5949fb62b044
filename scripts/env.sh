# Sourced by scripts/run and scripts/test: build against the project venv's libtorch.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VIRTUAL_ENV="$root/.venv"
export LIBTORCH_USE_PYTORCH=1
export PATH="$root/.venv/bin:$PATH"
