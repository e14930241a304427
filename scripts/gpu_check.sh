#!/usr/bin/env bash
# The GPU kit (issue 11); details in scripts/gpu_check.py.
#   bash scripts/gpu_check.sh carry            step 1, here: build .gpu_carry/ (PyPI + apt), check the 64 MiB limit
#   bash scripts/gpu_check.sh run              step 2, on the lent GPU machine, .gpu_carry carried: ~9 minutes,
#                                              JSON + plots + log to $OUT
#   bash scripts/gpu_check.sh run --dry-run    anywhere: check the inputs and print every command
# Device call (the command must start in the repo root):
#   run(command="bash scripts/gpu_check.sh run", carry=[".gpu_carry"], timeout_s=600)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  # carry needs a pip that reaches PyPI (the project venv when there is one); run needs the python with torch.
  if [ "${1:-}" = carry ] && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" scripts/gpu_check.py "$@"
