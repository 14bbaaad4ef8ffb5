#!/usr/bin/env bash
# Test suite: build the environment if needed, then run pytest (GPU tests skip on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh >&2
exec .venv/bin/python -m pytest -q --durations=30 "$@"
