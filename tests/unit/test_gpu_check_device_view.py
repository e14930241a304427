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
import re
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
    out_dir = root / ".gpu_work" / f"out-{call.number}"
    r = subprocess.run(["bash", "scripts/gpu_check.sh", "call", str(call.number), "--dry-run", "--out", str(out_dir)],
                       cwd=str(root), env=env, capture_output=True, text=True, timeout=240, check=False)
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
    expected = {1: ("[capacity] $", "[capacity-tuned]", "--model smollm2-360m --runs tuned --dram-cap 8GiB --steps 3",
                    "--capacity seq --probe-timeout", "[capacity-memascend]", "--runs memascend --dram-cap 8GiB"),
                2: ("[cuda-constants]", "--model qwen2.5-0.5b --seq-len 2048 --steps 3 --runs memascend",
                    "--gradient-clipping 0", "[bench-qwen2.5-0.5b-tuned]"),
                3: ("[placement-llama-3.2-1b-gpu-tuned]", "--placement gpu --runs tuned",
                    "[placement-llama-3.2-1b-ssd-memascend]", "[placement-qwen2.5-1.5b-split-tuned]"),
                4: ("--model llama-3.2-1b --seq-len 2048 --steps 3 --runs memascend", "--gradient-clipping 0",
                    "[bench-llama-3.2-1b-tuned]"),
                5: ("[pytest-gpu]", "-m gpu"),
                6: ("[cuda-constants]", "--model llama-3.2-1b --seq-len 2048 --steps 2 --runs memascend",
                    "[validate-bench]"),
                7: ("[sweep-memascend-8192]", "[sweep-stock-131072]", "the plan's largest context")}[call.number]
    for text in expected:
        assert text in out, text
    assert "SKIPPED" not in out
    assert not (root / ".gpu_work" / "venv").exists(), "a dry run installs nothing"
    # Within the device's limits: the command's length, its timeout, and every step's timeout within the call's.
    assert len(call.command()) <= calls.COMMAND_LIMIT_CHARS and call.timeout_s <= calls.COMMAND_LIMIT_S
    step_timeouts = [int(t) for t in re.findall(r"\] \(timeout (\d+) s\)", out)]
    phases = call.args[call.args.index("--phases") + 1].split(",")
    if "sweep" not in phases:  # the context sweep's points are meant to run until the call's time ends
        assert step_timeouts and all(t <= call.budget_s for t in step_timeouts), step_timeouts
    # The synthetic outputs a dry run leaves (the plan standing in for the GPU) are the call's files, and the
    # results page renders them.
    assert json.loads((out_dir / "gpu_check.json").read_text())["synthetic"] is True
    new = [f for f in ("gpu_capacity.json", "gpu_placements.json") if f in call.outputs]
    for f in new:
        assert json.loads((out_dir / f).read_text())["synthetic"] is True, f
    if new:
        _renders(out_dir, new)


def _renders(out_dir: Path, files: list[str]) -> None:
    """record's document of a dry run's folder, refused as a measurement and rendered into the GPU page."""
    from gpukit import record

    import results_gpu

    with pytest.raises(ValueError, match="synthetic output, not a measurement"):
        record.merge([str(out_dir)])
    doc = record.merge([str(out_dir)], allow_synthetic=True)
    page = results_gpu.section_gpu([("docs/bench/gpu/rehearsal.json", doc)])
    if "gpu_capacity.json" in files:
        cap = doc["capacity"]
        assert cap["tuned"]["probes"] and cap["memascend"]["probe"]["outcome"] == "fit"
        assert f"| tuned | {cap['tuned']['planned_max']} | fit |" in page
        assert "memascend's longest context >= 2x tuned's: yes" in page
    if "gpu_placements.json" in files:
        rows = doc["placements"]["rows"]
        assert {(r["placement"], r["run"]) for r in rows} >= set(pure.PLACEMENT_SWEEP)
        for r in rows:
            got = "-" if r["seconds_per_step"] is None else f"{r['seconds_per_step']:.2f}"
            assert f"| {r['model']} | {r['placement']} | {r['run']}{'' if r['ok'] else ': failed'} | {got} |" in page
