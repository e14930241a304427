#!/usr/bin/env bash
# The GPU kit; details in scripts/gpu_check.py, the calls in scripts/gpukit/calls.py.
#   bash scripts/gpu_check.sh carry              here: build .gpu_carry/ (PyPI + apt), check its size (--limit-mib)
#   bash scripts/gpu_check.sh plan               here: the calls in order (command, what travels, timeout, time;
#                                                --total-s: the time you have on the GPU machine)
#   bash scripts/gpu_check.sh call N             on the GPU machine, .gpu_carry beside the tree: call N, setup
#                                                included, ends by itself within its budget (--budget-s), JSON + log
#                                                to $OUT
#   bash scripts/gpu_check.sh call N --dry-run   anywhere: check the inputs and print every command
# Call N on the GPU machine (in the repo root, OUT set to an output folder; `plan` prints each):
#   set -o pipefail; PYTHONUNBUFFERED=1 bash scripts/gpu_check.sh call N 2>&1 | tee $OUT/log
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  # carry and plan need a pip that reaches PyPI (the project venv when there is one); a call needs the python
  # with torch (the image's python3 there).
  if { [ "${1:-}" = carry ] || [ "${1:-}" = plan ]; } && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" scripts/gpu_check.py "$@"
