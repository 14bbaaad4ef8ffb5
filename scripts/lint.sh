#!/usr/bin/env bash
# Lint and format check with ruff (Megatron-Bridge's line length, 119; settings in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
RUFF=.venv/bin/ruff
[ -x "$RUFF" ] || RUFF="uvx ruff"
$RUFF check .
$RUFF format --check .
