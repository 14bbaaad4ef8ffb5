#!/usr/bin/env bash
# Main job: build the environment if needed, then check the embedded default recipe
# (Llama-3-8B SFT, offline packed 8k, world size 8). Extra arguments go to `mbridge-seqpack check`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh >&2
exec .venv/bin/mbridge-seqpack check "$@"
