#!/usr/bin/env bash
# Set up (if needed) and run draftgate on the embedded model: `scripts/run.sh [draftgate args]`;
# with no command (or serve's options alone) it serves.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# draftgate's own -v/--verbose comes first; then no command, or options only (`scripts/run.sh -v --port
# 8001`), means serve with those options
global=()
while [ $# -gt 0 ] && [[ "$1" == "-v" || "$1" == "--verbose" ]]; do global+=("$1"); shift; done
if [ $# -eq 0 ] || [[ "$1" == -* && "$1" != "-h" && "$1" != "--help" ]]; then
  set -- serve "$@"
fi
exec .venv/bin/draftgate "${global[@]}" "$@"
