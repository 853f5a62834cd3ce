#!/usr/bin/env bash
# GPU smoke test of the scale path (issue 6): on a machine with >= 1 NVIDIA GPU, install SGLang + areal into
# .venv-gpu/, start one real SGLang server and the Megatron trainer on a small model, run a few asynchronous RL
# steps, and report SGLang-vs-trainer logprob agreement and step times. Budget: 8 minutes in all (install
# included; a warm pip cache makes the install ~1 min).
#
#   bash benchmarks/gpu_smoke.sh [--out DIR] [--model HF_DIR] [--steps N] [--dtype float32|bfloat16]
#
# Writes DIR/gpu_smoke.json (default runs/gpu_smoke) and prints a table. Exit 0 only if every check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
BUDGET_S=${GPU_SMOKE_BUDGET_S:-480}
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}   # the version the protocol fixtures were recorded from

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "error: no NVIDIA GPU visible (nvidia-smi -L failed): this smoke test needs one" >&2
  exit 2
fi
python3 -m venv .venv-gpu
# SGLang brings its own CUDA torch; areal's pinned CPU torch (pyproject) must not replace it, so areal is
# installed without dependencies and its other dependencies are installed from pyproject, torch excluded.
.venv-gpu/bin/pip install -q "sglang[all]==${SGLANG_VERSION}"
.venv-gpu/bin/pip install -q --no-deps -e .
DEPS=$(.venv-gpu/bin/python - <<'EOF'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print(" ".join(d for d in deps if not d.replace(" ", "").startswith("torch")))
EOF
)
# shellcheck disable=SC2086
.venv-gpu/bin/pip install -q $DEPS
LEFT=$(( BUDGET_S - ($(date +%s) - T0) ))
echo "install took $(( $(date +%s) - T0 )) s; ${LEFT} s left for the smoke run"
if [ "$LEFT" -lt 60 ]; then
  echo "error: the install used the budget (${BUDGET_S} s); re-run with a warm pip cache" >&2
  exit 1
fi
exec timeout --kill-after=10 "$LEFT" .venv-gpu/bin/python benchmarks/gpu_smoke.py "$@"
