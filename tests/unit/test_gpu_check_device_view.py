"""Every GPU-kit call's dry mode, run in the tree as the GPU machine receives it: no .git, the files
`git ls-files -co --exclude-standard` lists plus the carry folder, copied to a temporary directory. Each call
must get through its input checks and its setup's install plan and print its exact commands, and what travels
must stay under the kit's default 64 MiB (pure.CARRY_LIMIT_BYTES).

The carry folder is the one `bash scripts/gpu_check.sh carry` built in the checkout (.gpu_carry, when complete);
building it needs PyPI and Debian's archive, so without it the test builds, offline, a stand-in with the kit's
file names and a real manifest, and counts the real folder's size as CARRY_BYTES_EXPECTED."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from gpukit import calls, carry, pure  # noqa: E402

MiB = 1 << 20
CARRY_BYTES_EXPECTED = 8 * MiB
"""The real carry folder's size, rounded up (7.16 MiB on 2026-11-25: DeepSpeed 0.19.8, pydantic, libaio...)."""
STAND_IN_WHEELS = (f"deepspeed-{pure.DEEPSPEED_VERSION}-py3-none-any.whl", "pydantic-2.14.4-py3-none-any.whl",
                   "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
                   "hjson-3.1.0-py3-none-any.whl", "setuptools-84.2.1-py3-none-any.whl",
                   "wheel-0.48.0-py3-none-any.whl", "pybind11-3.1.0-py3-none-any.whl")
STAND_IN_DEBS = ("libaio1_0.3.113-4_amd64.deb", "libaio-dev_0.3.113-4_amd64.deb")


def _cached_carry() -> Path | None:
    folder = REPO / ".gpu_carry"
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return folder if not carry.check_manifest(manifest, str(folder)) else None


def _stand_in_carry(root: Path) -> Path:
    files = []
    for sub, names in (("wheels", STAND_IN_WHEELS), ("debs", STAND_IN_DEBS)):
        (root / sub).mkdir(parents=True)
        for n in names:
            data = f"offline stand-in for {n}".encode()
            (root / sub / n).write_bytes(data)
            files.append({"path": f"{sub}/{n}", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    (root / "manifest.json").write_text(json.dumps({"schema_version": 1, "files": files}))
    return root


@pytest.fixture(scope="module")
def device_tree(tmp_path_factory):
    """(the exported tree, whether its carry folder is the real one)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the tree that goes to the GPU machine cannot be listed")
    root = tmp_path_factory.mktemp("device") / "repo"
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet in the index
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, root / rel, follow_symlinks=False)
    cached = _cached_carry()
    if cached:
        shutil.copytree(cached, root / ".gpu_carry")
    else:
        _stand_in_carry(root / ".gpu_carry")
    assert not (root / ".git").exists()
    return root, cached is not None


def test_tree_plus_carry_fit_the_default_limit(device_tree):
    root, real = device_tree
    size = carry.travelling_bytes(str(root), [str(root / ".gpu_carry")])  # no .git there: it walks the files
    carried = sum(size["carried_bytes"].values()) if real else CARRY_BYTES_EXPECTED
    assert size["tree_bytes"] + carried < pure.CARRY_LIMIT_BYTES, (size, carried)


@pytest.mark.parametrize("call", calls.CALLS, ids=lambda c: f"call{c.number}")
def test_every_call_dry_runs_where_the_gpu_machine_runs_it(device_tree, call):
    root, _ = device_tree
    # PYTHON: an interpreter with the project's requirements (the image's python3 holds them there).
    env = {**os.environ, "PYTHON": sys.executable}
    r = subprocess.run(["bash", "scripts/gpu_check.sh", "call", str(call.number), "--dry-run"], cwd=str(root),
                       env=env, capture_output=True, text=True, timeout=240, check=False)
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    assert "inputs OK" in out and call.command() in out
    assert f"gpu_check run --dry-run: repo {root}," in out  # the exported tree's own kit, not the checkout's
    assert "travels with the call: tree" in out
    # The setup's install plan: offline installs from the carried folder, libaio, the ops, the native core.
    assert f"--no-index --find-links {root}/.gpu_carry/wheels" in out and f"deepspeed=={pure.DEEPSPEED_VERSION}" in out
    for step in ("[venv]", "[aio-debs]", "[op-async-io]", "[op-cpu-adam]", "[native-build]", "[import-check]",
                 "[probe]"):
        assert step in out, step
    assert "CUDA_HOME" in out or "CUDA build: no nvcc found" in out
    expected = {1: ("[cuda-constants]", "--model qwen2.5-0.5b --seq-len 2048 --steps 3 --runs memascend",
                    "[bench-qwen2.5-0.5b-stock]", "[bench-qwen2.5-0.5b-tuned]"),
                2: ("[pytest-gpu]", "-m gpu"),
                3: ("[cuda-constants]", "--model llama-3.2-1b --seq-len 2048 --steps 2 --runs memascend",
                    "[validate-bench]"),
                4: ("[sweep-memascend-8192]", "[sweep-stock-131072]", "the plan's largest context"),
                5: ("--model llama-3.2-1b --seq-len 2048 --steps 3 --runs memascend", "--gradient-clipping 100",
                    "[bench-llama-3.2-1b-tuned]")}[call.number]
    for text in expected:
        assert text in out, text
    assert "SKIPPED" not in out
    assert not (root / ".gpu_work" / "venv").exists(), "a dry run installs nothing"
