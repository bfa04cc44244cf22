#!/usr/bin/env bash
# Set up (if needed), lint, type-check and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
.venv/bin/mypy
# two workers on the two cores (one torch thread each: tests/conftest.py); DRAFTGATE_TEST_WORKERS=0 runs
# in this process, the way to read a failing test's output in order
.venv/bin/python -m pytest -n "${DRAFTGATE_TEST_WORKERS:-2}" --dist worksteal "$@"
