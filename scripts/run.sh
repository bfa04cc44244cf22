#!/usr/bin/env bash
# Set up (if needed) and run draftgate on the embedded model: `scripts/run.sh [draftgate args]`;
# with no command (or serve's options alone) it serves.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ $# -eq 0 ] || [[ "$1" == -* && "$1" != "-h" && "$1" != "--help" && "$1" != "-v" ]]; then
  set -- serve "$@"  # no command, or options only (`scripts/run.sh --port 8001`): they are serve's
fi
exec .venv/bin/draftgate "$@"
