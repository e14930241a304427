"""DeepSpeed's own NVMe-offload unit tests, run with memascend's engine installed.

unit/ holds DeepSpeed's test helpers pinned at deepspeedai/DeepSpeed edaa7221267243c7be7fb49c5d5f5c4fb97b4641 (two CPU
fixes in unit/common.py, marked there); test_ds_*.py are ports of its NVMe cases (each file names its source). The
harness hooks below are upstream's tests/conftest.py ones: a DistributedTest runs its body in worker processes.

Every test runs once per engine mode (fixture ``engine_mode``): ``streaming`` (memascend's default, the bounded
engine), ``swapper`` (EngineOptions(streaming=False): DeepSpeed's optimizer swapper on region keys). The worker
processes install the engine through memascend_install.py, which this conftest steers with a control file; after
each test the conftest checks that the engine really was installed (never a pass on stock DeepSpeed by accident).
Run by hand the way DeepSpeed's CI does (``cd tests && pytest unit/...``) with ``LOCAL_SIZE=2 -o addopts=""``: here
the conftest sets LOCAL_SIZE (the CPU accelerator's device count) and our pytest options need nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ENGINE_MODES = {
    "streaming": {},
    "swapper": {"streaming": False},
}
REGION_SIZE = "2GiB"
"""Two sub-regions of 1 GiB: the largest case (2 x 2048 x 2048 bf16 params, fp32 optimizer) uses ~150 MB a rank."""


LONG_CASES = {
    # fp16 and fp32 reads of the fragment API: 16 cases of 10-24 s; the default run keeps the bf16 ones (both API
    # types, frozen weights or not, both engine modes), and TestTensorFragmentSet / Update run every dtype.
    "TestTensorFragmentGet::test_zero_fragments": ("-dtype1-", "-dtype2-"),
    # 73-75 s each in either engine mode (parameters on NVMe, the optimizer not offloaded); nvme-cpu and nvme-nvme keep
    # the parameters on NVMe in the default run, in both modes.
    "TestNVMeCheckpointing::test_nvme_checkpointing": ("-nvme-none]",),
}
"""Cases left to `pytest -m long` (scripts/record_tests.py --long) for the default run's time."""


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.slow)
            test = item.nodeid.split("::", 1)[-1].split("[", 1)[0]
            if any(part in item.nodeid for part in LONG_CASES.get(test, ())):
                item.add_marker(pytest.mark.long)


# --- upstream's harness (tests/conftest.py at the pinned commit) -----------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    # We want to use our own launching function for distributed tests
    if getattr(item.cls, "is_dist_test", False):
        dist_test_class = item.cls()
        dist_test_class(item._request)
        item.runtest = lambda: True  # Dummy function so test is not run twice


def pytest_runtest_teardown(item, nextitem):
    # Upstream closes reused worker pools after the session's last test only; here also when the class changes:
    # a pool's workers hold their ranks' sub-regions of the region while they live.
    if getattr(item.cls, "reuse_dist_env", False) and (not nextitem or nextitem.cls is not item.cls):
        dist_test_class = item.cls()
        for num_procs, pool in list(dist_test_class._pool_cache.items()):
            dist_test_class._close_pool(pool, num_procs, force=True)
            del dist_test_class._pool_cache[num_procs]  # the cache is shared by every class


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef, request):
    if getattr(fixturedef.func, "is_dist_fixture", False):
        dist_fixture_class = fixturedef.func()
        dist_fixture_class(request)


# --- memascend ---------------------------------------------------------------------------------------------------------


def _require_deepspeed_nvme() -> None:
    pytest.importorskip("deepspeed")
    from memascend_engine import native

    ok, why = native.available()
    if not ok:
        pytest.skip(f"memascend's native extension is unavailable: {why}")
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if not AsyncIOBuilder().is_compatible():
        pytest.skip("DeepSpeed's async_io op needs libaio-dev")


@pytest.fixture(scope="session")
def ds_hook_control(tmp_path_factory):
    """The control file the workers read (its path reaches them through the environment, fixed when the
    forkserver starts) and the region file, made by `memascend prepare-ssd` with a sub-region per rank."""
    _require_deepspeed_nvme()
    from memascend_install import CONTROL_ENV

    d = tmp_path_factory.mktemp("ds_upstream")
    region = str(d / "memascend.region")
    proc = subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", region, "--size", REGION_SIZE,
                           "--ranks", "2", "--no-probe", "--yes"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot make a region in {d}: {proc.stderr.strip().splitlines()[-1:]}")
    control = str(d / "hook.json")
    previous = os.environ.get(CONTROL_ENV)
    os.environ[CONTROL_ENV] = control
    yield control, region
    if previous is None:
        os.environ.pop(CONTROL_ENV, None)
    else:
        os.environ[CONTROL_ENV] = previous


@pytest.fixture(params=list(ENGINE_MODES), autouse=True)
def engine_mode(request, ds_hook_control, monkeypatch):
    control, region = ds_hook_control
    monkeypatch.setenv("LOCAL_SIZE", "2")  # DeepSpeed's CPU accelerator reports LOCAL_SIZE devices
    with open(control, "w", encoding="utf-8") as f:
        json.dump({"test": request.node.nodeid, "mode": request.param, "region": region,
                   "options": ENGINE_MODES[request.param]}, f)
    installs = control + ".installs"
    if os.path.exists(installs):
        os.unlink(installs)
    yield request.param
    with open(control, "w", encoding="utf-8") as f:
        json.dump({"mode": "stock"}, f)
    if getattr(request.node, "_ds_outcome", None) != "passed":
        return  # skipped or failed: the report says why
    with open(installs, encoding="utf-8") if os.path.exists(installs) else open(os.devnull) as f:
        seen = [json.loads(line) for line in f if line.strip()]
    assert seen and all(s["mode"] == request.param for s in seen), \
        f"memascend's engine was not installed in the test's workers ({seen}); the test ran on stock DeepSpeed"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item._ds_outcome = report.outcome


@pytest.fixture
def tmpdir(tmp_path_factory):
    """A tmpdir that outlives its test: a reused worker pool keeps the FileStore its class's first test made in that
    test's tmpdir (unit/common.py _launch_with_file_store), and pytest's retention policy (pyproject: keep failed
    tests' directories only) would delete it at that test's teardown, hanging the next test's new_group."""
    from _pytest.compat import legacy_path

    return legacy_path(tmp_path_factory.mktemp("ds_test"))
