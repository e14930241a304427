#!/usr/bin/env bash
# The GPU kit; details in scripts/gpu_check.py, the calls in scripts/gpukit/calls.py.
#   bash scripts/gpu_check.sh carry              here: build .gpu_carry/ (PyPI + apt), check the 64 MiB limit
#   bash scripts/gpu_check.sh plan               here: the device calls in order (command, carry, timeout, time)
#   bash scripts/gpu_check.sh call N             on the lent GPU machine, .gpu_carry carried: call N, setup
#                                                included, ends by itself within 9 minutes, JSON + log to $OUT
#   bash scripts/gpu_check.sh call N --dry-run   anywhere: check the inputs and print every command
# Device call N (the command must start in the repo root; `plan` prints each):
#   run(command="set -o pipefail; PYTHONUNBUFFERED=1 bash scripts/gpu_check.sh call N 2>&1 | tee $OUT/log",
#       carry=[".gpu_carry"], timeout_s=590)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  # carry and plan need a pip that reaches PyPI (the project venv when there is one); a call needs the python
  # with torch (the image's python3 there).
  if { [ "${1:-}" = carry ] || [ "${1:-}" = plan ]; } && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" scripts/gpu_check.py "$@"
