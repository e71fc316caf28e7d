#!/usr/bin/env bash
# Issue 13's accelerator check: 1 vs 256 vmapped PPO CartPole members on one accelerator,
# aggregate env steps/s, appended to benchmarks/RESULTS.md with the machine and the date.
#
#   bash benchmarks/gpu_check.sh            # where a GPU is lent; ~2-4 minutes
#
# Needs a CUDA build of jax in .venv (pip install -U "jax[cuda12]"); refuses to run on CPU,
# so that a CPU figure is never recorded as a GPU one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
backend=$($PY -c "import jax; print(jax.default_backend())")
if [ "$backend" != "gpu" ] && [ "$backend" != "cuda" ]; then
  echo "gpu_check: jax's backend is '$backend', not a GPU; nothing recorded" >&2
  exit 1
fi
device=$($PY -c "import jax; print(jax.devices()[0].device_kind)")
out=$(mktemp)
$PY benchmarks/scaling.py --devices --shard 0 --members 1 256 --epochs 20 --repeats 3 | tee "$out"
{
  echo
  echo "## Issue 13: vmapped members on an accelerator (\`benchmarks/gpu_check.sh\`)"
  echo
  echo "$(date -u +%Y-%m-%d) on ${device} (jax $($PY -c 'import jax; print(jax.__version__)')),"
  echo "commit $(git rev-parse --short HEAD):"
  echo "\`.venv/bin/python benchmarks/scaling.py --devices --shard 0 --members 1 256 --epochs 20 --repeats 3\`"
  echo
  grep -E '^\||^fit' "$out"
} >> benchmarks/RESULTS.md
echo "gpu_check: results appended to benchmarks/RESULTS.md" >&2
