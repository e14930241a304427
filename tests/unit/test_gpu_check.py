"""scripts/gpu_check.py (the GPU kit): its pure parts, the .deb unpacker, and the dry mode end to end on a
carry folder made here (no network: wheel-named files with a real manifest)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gc = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gc  # dataclasses resolve annotations through sys.modules
_spec.loader.exec_module(gc)
GiB = 1 << 30


def test_time_model_and_timeouts():
    est = gc.estimate_run_s(1_000_000_000, 3, 2.0)
    assert est == pytest.approx(gc.RUN_OVERHEAD_S + 1e9 * (20 + 3 * 40) / 2e9)
    assert gc.estimate_run_s(1_000_000_000, 3, None) == gc.estimate_run_s(1_000_000_000, 3, gc.DEFAULT_DISK_GBPS)
    assert gc.estimate_run_s(10, 3, 2.0, calibration=2.0) == pytest.approx(2 * gc.estimate_run_s(10, 3, 2.0))
    assert gc.run_timeout_s(30, 1000) == 90  # at least a minute more than the estimate
    assert gc.run_timeout_s(200, 1000) == 400  # twice the estimate
    assert gc.run_timeout_s(200, 250) == 250  # never past what is left


def test_decide_model_skips_what_does_not_fit():
    ok = gc.decide_model("m", num_params=500_000_000, need_disk_bytes=20 * GiB, free_disk_bytes=40 * GiB, steps=3,
                         runs=3, disk_gbps=2.0, remaining_s=1000)
    assert ok.run and ok.reason == ""
    disk = gc.decide_model("m", num_params=500_000_000, need_disk_bytes=50 * GiB, free_disk_bytes=40 * GiB, steps=3,
                           runs=3, disk_gbps=2.0, remaining_s=1000)
    assert not disk.run and "50.0 GiB" in disk.reason and "40.0 GiB free" in disk.reason
    slow = gc.decide_model("m", num_params=1_500_000_000, need_disk_bytes=1, free_disk_bytes=None, steps=3, runs=3,
                           disk_gbps=1.0, remaining_s=300)
    assert not slow.run and "300 s left" in slow.reason


def _plan_doc(stock_items, memascend_items):
    def items(d):
        return [{"key": k, "tier": "nvme", "bytes": b} for k, b in d.items()] + [{"key": "host/x", "tier": "host",
                                                                                  "bytes": 10**12}]
    return {"engines": {"stock": {"items": items(stock_items)}, "memascend": {"items": items(memascend_items)}}}


def test_disk_need_ignores_checkpoint_copies_and_sizes_the_region_like_the_bench():
    doc = _plan_doc({"nvme/params": 2 * GiB, "nvme/optimizer_states": 12 * GiB, "nvme/checkpoints": 12 * GiB},
                    {"nvme/params": 2 * GiB, "nvme/optimizer_states": 12 * GiB, "nvme/checkpoints": 12 * GiB})
    assert gc.disk_need_bytes(doc) == int(14 * GiB * 1.5) + 64 * 2**20 + 2 * GiB
    big_stock = _plan_doc({"nvme/params": 40 * GiB}, {"nvme/params": 1 * GiB})
    assert gc.disk_need_bytes(big_stock) == 42 * GiB


@pytest.mark.parametrize("name, fits", [
    ("deepspeed-0.19.8-py3-none-any.whl", True),
    ("pydantic_core-2.50.4-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", True),
    ("psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.manylinux_2_28_x86_64.whl", True),
    ("pydantic_core-2.50.4-cp311-cp311-manylinux2014_x86_64.whl", False),
    ("pydantic_core-2.50.4-cp312-cp312-manylinux2014_aarch64.whl", False),
    ("msgpack-1.2.4-cp312-cp312-macosx_11_0_arm64.whl", False),
    ("psutil-7.2.2-cp313-abi3-manylinux_2_28_x86_64.whl", False),
])
def test_wheel_tags_for_the_gpu_image(name, fits):
    w = gc.parse_wheel_name(name)
    assert w is not None and gc.wheel_fits_target(w) is fits
    assert gc.parse_wheel_name("README.md") is None
    assert gc.parse_wheel_name("py_cpuinfo-9.0.0-py3-none-any.whl")["name"] == "py_cpuinfo"


def _fake_carry(root: Path, *, deepspeed_version=gc.DEEPSPEED_VERSION, drop=()) -> Path:
    """A carry folder with the kit's file names and a real manifest (contents are placeholders: the dry mode
    checks names, sizes and hashes, not what pip would do with them)."""
    names = [f"deepspeed-{deepspeed_version}-py3-none-any.whl", "pydantic-2.14.3-py3-none-any.whl",
             "pydantic_core-2.50.4-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
             "hjson-3.1.0-py3-none-any.whl", "setuptools-84.2.1-py3-none-any.whl", "wheel-0.48.0-py3-none-any.whl",
             "pybind11-3.1.0-py3-none-any.whl"]
    files = []
    for sub, ns in (("wheels", names), ("debs", ["libaio1_0.3.113-4_amd64.deb", "libaio-dev_0.3.113-4_amd64.deb"])):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for n in ns:
            if any(n.startswith(d) for d in drop):
                continue
            data = f"placeholder {n}".encode()
            (root / sub / n).write_bytes(data)
            files.append({"path": f"{sub}/{n}", "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    (root / "manifest.json").write_text(json.dumps({"files": files}))
    return root


def test_check_manifest_finds_every_problem(tmp_path):
    carry = _fake_carry(tmp_path / "ok")
    assert gc.check_manifest(json.loads((carry / "manifest.json").read_text()), str(carry)) == []
    bad = _fake_carry(tmp_path / "bad", deepspeed_version="0.18.0", drop=("pydantic_core", "libaio-dev"))
    manifest = json.loads((bad / "manifest.json").read_text())
    (bad / "wheels" / "hjson-3.1.0-py3-none-any.whl").write_bytes(b"placeholder hjson-3.1.0-py3-none-anX.whl")
    manifest["files"].append({"path": "wheels/gone-1.0-py3-none-any.whl", "bytes": 1, "sha256": "0"})
    problems = "\n".join(gc.check_manifest(manifest, str(bad)))
    assert "DeepSpeed 0.18.0, the kit pins 0.19.8" in problems
    assert "no wheel of pydantic_core" in problems and "no .deb of libaio-dev" in problems
    assert "hjson-3.1.0-py3-none-any.whl does not match its sha256" in problems
    assert "gone-1.0-py3-none-any.whl is listed in the manifest but missing" in problems


def _bench_doc(model, run, peak, sps, ok=True):
    return {"job": {"model": model}, "runs": [{"name": run, "ok": ok, "error": None if ok else "boom",
                                               "env": {"DS_ACCELERATOR": "cuda"}, "peak_system_bytes": peak,
                                               "seconds_per_step": sps, "tokens_per_s": 2048 / sps,
                                               "predicted": {"node_host_peak_bytes": peak + 1}, "peak_gpu_bytes": 7}]}


def test_bench_rows_and_comparison_with_stock():
    rows = [row for doc in (_bench_doc("m", "stock", 10 * GiB, 2.0), _bench_doc("m", "tuned", 8 * GiB, 2.2),
                            _bench_doc("m", "memascend", 4 * GiB, 2.1), _bench_doc("n", "memascend", 1, 1.0))
            for row in gc.summarize_bench_doc(doc)]
    assert rows[0]["accelerator"] == "cuda" and rows[0]["peak_gpu_bytes"] == 7 and rows[0]["pinned_bytes"] is None
    assert rows[2]["predicted_host_peak_bytes"] == 4 * GiB + 1
    vs = gc.versus_stock(rows)
    assert vs == {"m": {"tuned": {"peak_vs_stock_percent": -20.0, "step_time_vs_stock_percent": 10.0},
                        "memascend": {"peak_vs_stock_percent": -60.0, "step_time_vs_stock_percent": 5.0}}}


def test_dd_and_junit_parsing(tmp_path):
    assert gc.parse_dd_gbps("256+0 records in\n256+0 records out\n1073741824 bytes (1.1 GB, 1.0 GiB) copied, "
                            "0.5 s, 2.1 GB/s\n") == pytest.approx(2.1)
    assert gc.parse_dd_gbps("... copied, 3.1 s, 346 MB/s") == pytest.approx(0.346)
    assert gc.parse_dd_gbps("dd: failed to open") is None
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
                   '<testcase classname="a" name="ok"/><testcase classname="a" name="bad"><failure message="x"/>'
                   '</testcase><testcase classname="a" name="sk"><skipped message="needs a CUDA GPU"/></testcase>'
                   "</testsuite></testsuites>")
    j = gc.parse_junit(str(xml))
    assert j["tests"] == 3 and j["failed"] == ["a::bad"] and j["skipped_reasons"] == {"a::sk": "needs a CUDA GPU"}
    assert gc.parse_junit(str(tmp_path / "missing.xml")) is None


def _ar(members: dict[str, bytes]) -> bytes:
    out = b"!<arch>\n"
    for name, data in members.items():
        header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        out += header + data + (b"\n" if len(data) % 2 else b"")
    return out


def test_extract_deb_unpacks_the_data_tarball_with_its_symlinks(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        lib = b"\x7fELF fake"
        ti = tarfile.TarInfo("./usr/lib/x86_64-linux-gnu/libaio.so.1.0.2")
        ti.size = len(lib)
        tar.addfile(ti, io.BytesIO(lib))
        link = tarfile.TarInfo("./usr/lib/x86_64-linux-gnu/libaio.so")
        link.type, link.linkname = tarfile.SYMTYPE, "libaio.so.1.0.2"
        tar.addfile(link)
    deb = tmp_path / "libaio.deb"
    deb.write_bytes(_ar({"debian-binary": b"2.0\n", "control.tar.xz": b"", "data.tar.xz": buf.getvalue()}))
    gc.extract_deb(str(deb), str(tmp_path / "prefix"))
    so = tmp_path / "prefix" / "usr" / "lib" / "x86_64-linux-gnu" / "libaio.so"
    assert so.is_symlink() and so.read_bytes() == b"\x7fELF fake"
    not_a_deb = tmp_path / "x.deb"
    not_a_deb.write_bytes(b"not a deb")
    with pytest.raises(ValueError, match="not an ar archive"):
        gc.extract_deb(str(not_a_deb), str(tmp_path / "p2"))
    env = gc.aio_env(str(tmp_path / "prefix"))
    assert env["CPATH"].split(":")[0].endswith("prefix/usr/include")
    assert env["LDFLAGS"].startswith("-L") and env["LD_LIBRARY_PATH"].split(":")[0].endswith("x86_64-linux-gnu")


def _dry_run(tmp_path, carry, *extra):
    return subprocess.run([sys.executable, str(SCRIPT), "run", "--dry-run", "--carry", str(carry), "--work",
                           str(tmp_path / "work"), "--out", str(tmp_path / "out"), *extra],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO), check=False)


def test_dry_run_checks_the_inputs_and_prints_every_command(tmp_path):
    carry = _fake_carry(tmp_path / "carry")
    r = _dry_run(tmp_path, carry, "--models", "qwen2.5-0.5b,llama-3.2-1b")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.stdout
    assert "inputs OK" in out and "DS_ACCELERATOR=cuda" in out
    for step in ("[venv]", "[pip-install]", "[aio-debs]", "[op-async-io]", "[op-cpu-adam]", "[native-build]",
                 "[probe]", "[pytest-gpu]", "[validate-bench]"):
        assert step in out, step
    assert f"deepspeed=={gc.DEEPSPEED_VERSION}" in out and "--no-index" in out and "-m gpu" in out
    assert "--model llama-3.2-1b --seq-len 2048" in out and "--runs memascend --accelerator cuda" in out
    assert not (tmp_path / "work" / "venv").exists(), "a dry run must not install anything"


def test_dry_run_refuses_an_incomplete_carry_folder_and_unknown_presets(tmp_path):
    carry = _fake_carry(tmp_path / "carry", drop=("deepspeed",))
    r = _dry_run(tmp_path, carry, "--models", "no-such-model")
    assert r.returncode == 2
    assert "error: no wheel of deepspeed in the carry folder" in r.stderr
    assert "error: preset no-such-model not found" in r.stderr and "hint: bash scripts/gpu_check.sh carry" in r.stderr
    r = _dry_run(tmp_path, tmp_path / "nothing-here")
    assert r.returncode == 2 and "manifest.json is missing" in r.stderr
