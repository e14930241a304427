"""memascend_engine.cpuinfo_cache with the real py-cpuinfo and DeepSpeed's real op builders: one probe per process
tree, not five per process (each probe is a Python subprocess around a 1 s sleep)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

cpuinfo = pytest.importorskip("cpuinfo")

from memascend_engine import cpuinfo_cache  # noqa: E402

COUNTED_CHILD = """
import json, sys, cpuinfo
probes = []
real = cpuinfo.get_cpu_info
cpuinfo.get_cpu_info = lambda: probes.append(1) or real()
from memascend_engine import cpuinfo_cache
cpuinfo_cache.enable()
from deepspeed.ops.op_builder import CPUAdamBuilder
b = CPUAdamBuilder()
seen = {"arch": b.cpu_arch(), "simd": b.simd_width(), "vendor": cpuinfo.get_cpu_info().get("vendor_id_raw")}
print(json.dumps({**seen, "probes": len(probes)}))
"""


@pytest.fixture
def counted(monkeypatch):
    """The real probe behind a counter; the module's function and the environment are restored after the test."""
    monkeypatch.delenv(cpuinfo_cache.ENV, raising=False)
    real = cpuinfo.get_cpu_info
    probes = []
    monkeypatch.setattr(cpuinfo, "get_cpu_info", lambda: probes.append(1) or real())
    return probes


def test_the_first_answer_is_kept_for_the_process_and_its_environment(counted):
    cpuinfo_cache.enable()
    cpuinfo_cache.enable()  # idempotent: no second layer
    first = cpuinfo.get_cpu_info()
    assert first["arch"] and len(counted) == 1
    assert cpuinfo_cache.decode(os.environ[cpuinfo_cache.ENV]) == first
    assert cpuinfo.get_cpu_info() == first and len(counted) == 1
    # Shell-safe: DeepSpeed's multi-node runner writes `export NAME=VALUE` lines for MEMASCEND_* variables.
    assert re.fullmatch(r"[0-9A-Za-z_=:-]+", os.environ[cpuinfo_cache.ENV])


def test_another_machines_or_boots_answer_is_probed_again(counted, monkeypatch):
    other = cpuinfo_cache.encode({"arch": "ARM_8", "flags": ["sve"]}).split(":", 1)[1]
    monkeypatch.setenv(cpuinfo_cache.ENV, "00000000-0000-0000-0000-000000000000:" + other)
    cpuinfo_cache.enable()
    info = cpuinfo.get_cpu_info()
    assert len(counted) == 1 and info["arch"] != "ARM_8"
    assert cpuinfo_cache.decode(os.environ[cpuinfo_cache.ENV]) == info


def test_a_damaged_value_is_probed_again_and_replaced(counted, monkeypatch):
    monkeypatch.setenv(cpuinfo_cache.ENV, "{not ours")
    cpuinfo_cache.enable()
    info = cpuinfo.get_cpu_info()
    assert len(counted) == 1 and cpuinfo_cache.decode(os.environ[cpuinfo_cache.ENV]) == info


def _child(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", COUNTED_CHILD], env=env, capture_output=True, text=True, timeout=300,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_deepspeeds_builders_in_a_child_ask_no_probe_after_the_parents():
    pytest.importorskip("deepspeed")
    env = {k: v for k, v in os.environ.items() if k != cpuinfo_cache.ENV}
    alone = _child(env)
    # Without an inherited answer the child probes once (not once per builder question) ...
    assert alone["probes"] == 1
    env[cpuinfo_cache.ENV] = cpuinfo_cache.encode(cpuinfo.get_cpu_info())
    inherited = _child(env)
    # ... and with its parent's answer not at all, and DeepSpeed derives the same compiler flags from it.
    assert inherited["probes"] == 0
    assert (inherited["arch"], inherited["simd"], inherited["vendor"]) == (alone["arch"], alone["simd"],
                                                                           alone["vendor"])
