#!/usr/bin/env bash
# Build (or refresh) the project venv at ./.venv from uv.lock on a fresh machine.
# Megatron-Bridge 0.6.2 needs Python 3.12; transformer-engine-torch builds from source here,
# against the CUDA headers that pip's nvidia-* wheels put into the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet uv
PY312=""
for cand in "${UV_PYTHON:-}" /root/.pyenv/versions/3.12.*/bin/python3.12 "$(command -v python3.12 || true)"; do
  if [ -n "$cand" ] && [ -x "$cand" ]; then PY312="$cand"; break; fi
done
if [ -z "$PY312" ]; then echo "setup_env: no Python 3.12 found (pyenv or PATH); set UV_PYTHON" >&2; exit 2; fi
V="$PWD/.venv/lib/python3.12/site-packages/nvidia"
export CPATH="$V/nccl/include:$V/cu13/include:$V/cudnn/include:/usr/local/cuda/include${CPATH:+:$CPATH}"
export LIBRARY_PATH="$V/nccl/lib:$V/cu13/lib:$V/cudnn/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" MAX_JOBS="${MAX_JOBS:-2}" NVTE_FRAMEWORK=pytorch
export UV_PYTHON="$PY312"
if [ -f uv.lock ]; then uv sync --locked "$@"; else uv sync "$@"; fi

# Bytecode, once per lock file. This machine's image sets PYTHONDONTWRITEBYTECODE, so no process caches what it
# compiles: each one compiled Megatron, TE and the parts of torch / transformers it imports again (a Megatron-Bridge
# import took twice as long, and the suite starts dozens of processes). compileall writes Megatron's and TE's; one
# import writes the rest of what the checks import. An optimisation only: if it fails, it says so and goes on.
stamp=.venv/.bytecode-of-uv.lock
if [ ! -f "$stamp" ] || [ uv.lock -nt "$stamp" ]; then
  SP=.venv/lib/python3.12/site-packages
  .venv/bin/python -m compileall -q -j 0 "$SP/megatron" "$SP/transformer_engine" >/dev/null 2>&1 || true
  if env -u PYTHONDONTWRITEBYTECODE PYTHONWARNINGS=ignore .venv/bin/python -c "import torch, transformers, \
megatron.bridge.recipes, megatron.bridge.training.gpt_step, megatron.bridge.data.builders.gpt_sft, \
mbridge_seqpack.cli.main, mbridge_seqpack.minilaunch.step" >/dev/null 2>&1; then
    touch "$stamp"
  else
    echo "setup_env: writing the bytecode failed; each process compiles what it imports" >&2
  fi
fi
