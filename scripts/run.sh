#!/usr/bin/env bash
# Set up (if needed) and run draftgate on the embedded model: `scripts/run.sh [draftgate args]`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ $# -eq 0 ]; then
  set -- serve
fi
exec .venv/bin/draftgate "$@"
