"""scripts/gpu_check.py and scripts/gpukit/ (the GPU kit): its pure parts, the .deb unpacker, the tree size
without git, the calls, and the dry mode end to end on a carry folder made here (no network: wheel-named files
with a real manifest). tests/unit/test_gpu_check_device_view.py runs every call's dry mode as the GPU machine
receives the tree."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"
sys.path.insert(0, str(REPO / "scripts"))
from gpukit import calls, carry, kit, pure  # noqa: E402

GiB = 1 << 30


def test_time_model_and_timeouts():
    est = pure.estimate_run_s(1_000_000_000, 3, 2.0)
    assert est == pytest.approx(pure.RUN_OVERHEAD_S + 1e9 * (20 + 3 * 40) / 2e9)
    assert pure.estimate_run_s(1_000_000_000, 3, None) == pure.estimate_run_s(1_000_000_000, 3, pure.DEFAULT_DISK_GBPS)
    assert pure.estimate_run_s(10, 3, 2.0, calibration=2.0) == pytest.approx(2 * pure.estimate_run_s(10, 3, 2.0))
    assert pure.run_timeout_s(30, 1000) == 90  # at least a minute more than the estimate
    assert pure.run_timeout_s(200, 1000) == 400  # twice the estimate
    assert pure.run_timeout_s(200, 250) == 250  # never past what is left


def test_decide_model_skips_what_does_not_fit():
    ok = pure.decide_model("m", num_params=500_000_000, need_disk_bytes=20 * GiB, free_disk_bytes=40 * GiB, steps=3,
                         runs=3, disk_gbps=2.0, remaining_s=1000)
    assert ok.run and ok.reason == ""
    disk = pure.decide_model("m", num_params=500_000_000, need_disk_bytes=50 * GiB, free_disk_bytes=40 * GiB, steps=3,
                           runs=3, disk_gbps=2.0, remaining_s=1000)
    assert not disk.run and "50.0 GiB" in disk.reason and "40.0 GiB free" in disk.reason
    assert ok.runs_fit == 3
    slow = pure.decide_model("m", num_params=1_500_000_000, need_disk_bytes=1, free_disk_bytes=None, steps=3, runs=3,
                             disk_gbps=1.0, remaining_s=300)
    assert slow.run and slow.runs_fit == 1 and "only 1 of 3 runs fit" in slow.reason  # est 255 s: the first runs
    none = pure.decide_model("m", num_params=1_500_000_000, need_disk_bytes=1, free_disk_bytes=None, steps=3, runs=3,
                             disk_gbps=1.0, remaining_s=200)
    assert not none.run and none.runs_fit == 0 and "200 s left" in none.reason


def _plan_doc(stock_items, memascend_items):
    def items(d):
        return [{"key": k, "tier": "nvme", "bytes": b} for k, b in d.items()] + [{"key": "host/x", "tier": "host",
                                                                                  "bytes": 10**12}]
    return {"engines": {"stock": {"items": items(stock_items)}, "memascend": {"items": items(memascend_items)}}}


def test_disk_need_ignores_checkpoint_copies_and_sizes_the_region_like_the_bench():
    doc = _plan_doc({"nvme/params": 2 * GiB, "nvme/optimizer_states": 12 * GiB, "nvme/checkpoints": 12 * GiB},
                    {"nvme/params": 2 * GiB, "nvme/optimizer_states": 12 * GiB, "nvme/checkpoints": 12 * GiB})
    assert pure.disk_need_bytes(doc) == int(14 * GiB * 1.5) + 64 * 2**20 + 2 * GiB
    big_stock = _plan_doc({"nvme/params": 40 * GiB}, {"nvme/params": 1 * GiB})
    assert pure.disk_need_bytes(big_stock) == 42 * GiB


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
    w = pure.parse_wheel_name(name)
    assert w is not None and pure.wheel_fits_target(w) is fits
    assert pure.parse_wheel_name("README.md") is None
    assert pure.parse_wheel_name("py_cpuinfo-9.0.0-py3-none-any.whl")["name"] == "py_cpuinfo"


def _fake_carry(root: Path, *, deepspeed_version=pure.DEEPSPEED_VERSION, drop=()) -> Path:
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
    folder = _fake_carry(tmp_path / "ok")
    assert carry.check_manifest(json.loads((folder / "manifest.json").read_text()), str(folder)) == []
    bad = _fake_carry(tmp_path / "bad", deepspeed_version="0.18.0", drop=("pydantic_core", "libaio-dev"))
    manifest = json.loads((bad / "manifest.json").read_text())
    (bad / "wheels" / "hjson-3.1.0-py3-none-any.whl").write_bytes(b"placeholder hjson-3.1.0-py3-none-anX.whl")
    manifest["files"].append({"path": "wheels/gone-1.0-py3-none-any.whl", "bytes": 1, "sha256": "0"})
    problems = "\n".join(carry.check_manifest(manifest, str(bad)))
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
            for row in pure.summarize_bench_doc(doc)]
    assert rows[0]["accelerator"] == "cuda" and rows[0]["peak_gpu_bytes"] == 7 and rows[0]["pinned_bytes"] is None
    assert rows[2]["predicted_host_peak_bytes"] == 4 * GiB + 1
    vs = pure.versus_stock(rows)
    assert vs == {"m": {"tuned": {"peak_vs_stock_percent": -20.0, "step_time_vs_stock_percent": 10.0},
                        "memascend": {"peak_vs_stock_percent": -60.0, "step_time_vs_stock_percent": 5.0}}}


def test_dd_and_junit_parsing(tmp_path):
    assert pure.parse_dd_gbps("256+0 records in\n256+0 records out\n1073741824 bytes (1.1 GB, 1.0 GiB) copied, "
                            "0.5 s, 2.1 GB/s\n") == pytest.approx(2.1)
    assert pure.parse_dd_gbps("... copied, 3.1 s, 346 MB/s") == pytest.approx(0.346)
    assert pure.parse_dd_gbps("dd: failed to open") is None
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
                   '<testcase classname="a" name="ok"/><testcase classname="a" name="bad"><failure message="x"/>'
                   '</testcase><testcase classname="a" name="sk"><skipped message="needs a CUDA GPU"/></testcase>'
                   "</testsuite></testsuites>")
    j = pure.parse_junit(str(xml))
    assert j["tests"] == 3 and j["failed"] == ["a::bad"] and j["skipped_reasons"] == {"a::sk": "needs a CUDA GPU"}
    assert pure.parse_junit(str(tmp_path / "missing.xml")) is None


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
    kit.extract_deb(str(deb), str(tmp_path / "prefix"))
    so = tmp_path / "prefix" / "usr" / "lib" / "x86_64-linux-gnu" / "libaio.so"
    assert so.is_symlink() and so.read_bytes() == b"\x7fELF fake"
    not_a_deb = tmp_path / "x.deb"
    not_a_deb.write_bytes(b"not a deb")
    with pytest.raises(ValueError, match="not an ar archive"):
        kit.extract_deb(str(not_a_deb), str(tmp_path / "p2"))
    env = kit.aio_env(str(tmp_path / "prefix"))
    assert env["CPATH"].split(":")[0].endswith("prefix/usr/include")
    assert env["LDFLAGS"].startswith("-L") and env["LD_LIBRARY_PATH"].split(":")[0].endswith("x86_64-linux-gnu")


def _dry_run(tmp_path, folder, *extra):
    return subprocess.run([sys.executable, str(SCRIPT), "run", "--dry-run", "--carry", str(folder), "--work",
                           str(tmp_path / "work"), "--out", str(tmp_path / "out"), *extra],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO), check=False)


def test_dry_run_checks_the_inputs_and_prints_every_command(tmp_path):
    r = _dry_run(tmp_path, _fake_carry(tmp_path / "carry"), "--models", "qwen2.5-0.5b,llama-3.2-1b")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.stdout
    assert "inputs OK" in out and "DS_ACCELERATOR=cuda" in out
    for step in ("[venv]", "[pip-install]", "[aio-debs]", "[op-async-io]", "[op-cpu-adam]", "[native-build]",
                 "[probe]", "[cuda-constants]", "[pytest-gpu]", "[validate-bench]", "[sweep-memascend-8192]"):
        assert step in out, step
    assert f"deepspeed=={pure.DEEPSPEED_VERSION}" in out and "--no-index" in out and "-m gpu" in out
    assert "--model llama-3.2-1b --seq-len 2048" in out and "--runs memascend --accelerator cuda" in out
    assert not (tmp_path / "work" / "venv").exists(), "a dry run must not install anything"


def test_dry_run_refuses_an_incomplete_carry_folder_and_unknown_presets(tmp_path):
    r = _dry_run(tmp_path, _fake_carry(tmp_path / "carry", drop=("deepspeed",)), "--models", "no-such-model")
    assert r.returncode == 2
    assert "error: no wheel of deepspeed in the carry folder" in r.stderr
    assert "error: preset no-such-model not found" in r.stderr and "hint: bash scripts/gpu_check.sh carry" in r.stderr
    r = _dry_run(tmp_path, tmp_path / "nothing-here")
    assert r.returncode == 2 and "manifest.json is missing" in r.stderr


def test_tree_size_without_git_walks_the_files(tmp_path):
    """The GPU machine receives the tree without .git: the size check walks it, leaving out the kit's work
    folder and the carried folders (counted on their own)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_bytes(b"x" * 100)
    (tmp_path / "b.txt").write_bytes(b"y" * 10)
    (tmp_path / ".gpu_carry" / "wheels").mkdir(parents=True)
    (tmp_path / ".gpu_carry" / "wheels" / "w.whl").write_bytes(b"z" * 1000)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "big").write_bytes(b"w" * 5000)
    assert carry.tree_files(str(tmp_path), [str(tmp_path / ".gpu_carry"), str(tmp_path / "work")]) == [
        "b.txt", os.path.join("pkg", "a.py")]
    size = carry.travelling_bytes(str(tmp_path), [str(tmp_path / ".gpu_carry")])
    assert size["carried_bytes"] == {str(tmp_path / ".gpu_carry"): 1000}
    assert size["tree_bytes"] >= 110 and size["total_bytes"] == size["tree_bytes"] + 1000


def test_what_this_machine_can_still_measure():
    full = {"gvisor": False, "io_uring": True, "o_direct": True, "loop_devices": True}
    assert pure.what_can_run(full) == ([], list(pure.PHASES))
    lost, phases = pure.what_can_run({**full, "gvisor": True, "io_uring": False, "o_direct": False})
    assert phases == list(pure.PHASES)  # a loop device gives the SSD files an ext4 with O_DIRECT
    assert any("gVisor" in x for x in lost) and any("thread pool" in x for x in lost)
    assert any("ext4 loop device" in x for x in lost)
    lost, phases = pure.what_can_run({"gvisor": True, "io_uring": False, "o_direct": False, "loop_devices": False})
    assert phases == ["setup", "probe", "constants", "tests"]
    assert any("no SSD offload can run" in x and "CUDA runtime constants" in x for x in lost)


def test_cuda_build_paths():
    ldconfig = ("\tlibcudart.so.13 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.13\n"
                "\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1\n"
                "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n")
    assert pure.parse_ldconfig(ldconfig, "libcuda.so.1") == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert pure.parse_ldconfig(ldconfig, "libcuda.so") is None
    assert pure.cuda_home_of("/usr/local/cuda-13.0/bin/nvcc") == "/usr/local/cuda-13.0"
    assert pure.cuda_home_of("/opt/nvcc") is None and pure.cuda_home_of(None) is None
    env = kit.merge_env({"LIBRARY_PATH": "/aio/lib", "LDFLAGS": "-L/aio/lib", "X": "1"},
                        {"LIBRARY_PATH": "/link", "LDFLAGS": "-L/link", "CUDA_HOME": "/cuda"})
    assert env == {"LIBRARY_PATH": "/link:/aio/lib", "LDFLAGS": "-L/link -L/aio/lib", "X": "1", "CUDA_HOME": "/cuda"}


def test_cuda_env_links_libcuda_privately(tmp_path):
    env, notes = kit.cuda_env(str(tmp_path), dry_run=False)
    if "LIBRARY_PATH" not in env:
        assert any("no libcuda.so.1" in n for n in notes)
        pytest.skip("no NVIDIA driver (libcuda.so.1) on this machine: the link itself is not made")
    link = tmp_path / "cuda_link" / "libcuda.so"
    assert env["LIBRARY_PATH"] == str(link.parent) and os.readlink(link).endswith("libcuda.so.1")


def test_compiler_errors_are_picked_from_a_build_log():
    log = ("[1/3] c++ -c deepspeed_aio_common.cpp\nFAILED: async_io.so\n"
           "/usr/bin/ld: cannot find -lcuda: No such file or directory\ncollect2: error: ld returned 1 exit status\n"
           "ninja: build stopped: subcommand failed.\nRuntimeError: Error building extension 'async_io'\n")
    errs = pure.compiler_errors(log)
    assert errs[0] == "/usr/bin/ld: cannot find -lcuda: No such file or directory"
    assert "collect2: error: ld returned 1 exit status" in errs and errs[-1].startswith("RuntimeError")
    assert pure.compiler_errors("[1/1] ok\nAsyncIOBuilder loaded\n") == []


def test_runtime_constants_from_the_samples():
    G = GiB

    def s(rss, used, free=None, reserved=None):
        d = {"rss_anon_bytes": rss, "system_used_bytes": used}
        if free is not None:
            d.update(gpu_free_bytes=free, torch_reserved_bytes=reserved)
        return d

    samples = {"start": s(10 << 20, 5 * G), "imports": s(600 << 20, 5 * G + (700 << 20)),
               "context": s(900 << 20, 6 * G, 79 * G, 2 << 20), "cublas": s(1000 << 20, 6 * G + (200 << 20),
                                                                              78 * G, 40 << 20),
               "nccl": s(1200 << 20, 6 * G + (500 << 20), 77 * G, 40 << 20)}
    c = pure.runtime_constants(samples, gpu_total_bytes=80 * G)
    assert c["host_runtime_bytes"] == c["host_runtime_before_step_bytes"] == G + (500 << 20) + (10 << 20)
    assert c["host_runtime_rss_anon_bytes"] == 1200 << 20 and c["host_imports_bytes"] == 700 << 20
    assert c["cuda_context_gpu_bytes"] == 3 * G - (40 << 20)
    assert c["cuda_context_gpu_bytes_bare"] == G - (2 << 20)
    # With the training step's sample, the runtime is measured after it (the kernels it loaded stay).
    samples["step"] = s(2100 << 20, 7 * G + (400 << 20), 76 * G, 60 << 20)
    c = pure.runtime_constants(samples, gpu_total_bytes=80 * G)
    assert c["host_runtime_bytes"] == 2 * G + (400 << 20) + (10 << 20)
    assert c["host_runtime_before_step_bytes"] == G + (500 << 20) + (10 << 20)
    assert c["host_runtime_rss_anon_bytes"] == 2100 << 20 and c["cuda_context_gpu_bytes_after_step"] == 4 * G - (60 << 20)


def test_gpu_peak_comparable_with_the_plan_and_sweep_stops():
    rows = pure.with_cuda_context([{"peak_gpu_reserved_bytes": 5 * GiB}, {"peak_gpu_reserved_bytes": None}], GiB)
    assert rows[0]["peak_gpu_with_context_bytes"] == 6 * GiB and rows[1]["peak_gpu_with_context_bytes"] is None
    assert pure.with_cuda_context([{"peak_gpu_reserved_bytes": 1}], None)[0]["peak_gpu_with_context_bytes"] is None
    points = [{"engine": "stock", "seq_len": 8192, "ok": True}, {"engine": "stock", "seq_len": 16384, "ok": False,
                                                                  "error": "OOM"},
              {"engine": "memascend", "seq_len": 16384, "ok": True}, {"engine": "memascend", "seq_len": 8192,
                                                                      "ok": True}]
    assert pure.sweep_stops(points) == {
        "stock": {"largest_ok_seq": 8192, "failed_seq": 16384, "reason": "OOM"},
        "memascend": {"largest_ok_seq": 16384, "failed_seq": None, "reason": None}}
    plan = {"engines": {"stock": {"search": {"max_seq_len": 5632}}, "tuned": {},
                        "memascend": {"search": {"max_seq_len": 14592}}}}
    assert pure.plan_max_seq(plan, "stock") == 5632 and pure.plan_max_seq(plan, "memascend") == 14592
    assert pure.plan_max_seq(plan, "tuned") is None


def test_the_calls_fit_a_gpu_machine_with_a_10_minute_command_limit():
    assert [c.number for c in calls.CALLS] == list(range(1, len(calls.CALLS) + 1))
    for c in calls.CALLS:
        cmd = c.command()
        assert len(cmd) <= calls.COMMAND_LIMIT_CHARS and cmd.startswith("set -o pipefail;")
        assert cmd.endswith("| tee $OUT/log") and f"gpu_check.sh call {c.number}" in cmd
        assert c.budget_s <= 540 and c.timeout_s <= calls.COMMAND_LIMIT_S  # ends by itself within 9 minutes
        assert len(c.outputs) <= 8  # a runner that copies back a few files gets them all
    # Call 1 at its whole budget, then call 2 on the same machine stopping itself at what is left, fit the default
    # time on the GPU machine (15 minutes), with room for call 2's setup and a phase.
    budget = calls.second_budget_s()
    assert calls.second_call().number == 2 and budget >= calls.SETUP_S + calls.MIN_WORK_S
    assert calls.DEFAULT_START_S + calls.CALLS[0].timeout_s + calls.WARM_MARGIN_S + budget <= calls.DEFAULT_TOTAL_S
    assert calls.warm_pair_s(second_budget=budget) <= calls.DEFAULT_TOTAL_S
    text = calls.plan_text()
    for c in calls.CALLS:
        assert c.command() in text and f"call {c.number}: {c.title}" in text
    assert "call 1, then call 2 at once on the same machine" in text
    assert calls.second_call().command(budget) in text and f"--budget-s {budget} " in text
    r = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "plan"], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0 and r.stdout.strip() == text.strip()
    # Less time on the GPU machine, or slower starts: the plan says the pair does not fit one machine.
    r = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "plan", "--total-s", "600", "--start-s",
                        "120"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and r.stdout.strip() == calls.plan_text(600, 120).strip()
    assert "run each on a fresh machine" in r.stdout


def test_the_plan_takes_the_measured_cuda_runtime_when_given(tmp_path, monkeypatch):
    from memascend_cli.errors import BadInput
    from memascend_cli.models import load_preset
    from memascend_cli.planner import measured
    from memascend_cli.planner.host import RUNTIME_CUDA_BYTES
    from memascend_cli.planner.memory import JobSpec, estimate
    from memascend_cli.planner.spec import HardwareSpec

    gpu = HardwareSpec(name="gpu", dram_gib=128, num_gpus=1, gpu_mem_gib=80, nvme_free_gib=2000)
    cpu = HardwareSpec(name="cpu", dram_gib=24)
    job = JobSpec(model=load_preset("qwen2.5-0.5b"))
    monkeypatch.delenv(measured.ENV, raising=False)
    typical = estimate(job, gpu, "memascend").item("host/runtime")
    assert os.path.isfile(measured.PACKAGED) or typical.bytes == RUNTIME_CUDA_BYTES
    doc = {"schema_version": 2, "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130",
           "measured_at": "2026-11-25T06:00:00Z",
           "host_runtime_bytes": 1_234_567_890, "cuda_context_gpu_bytes": 700_000_000}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    monkeypatch.setenv(measured.ENV, str(tmp_path / "c.json"))
    item = estimate(job, gpu, "memascend").item("host/runtime")
    assert item.bytes == 1_234_567_890 and "measured on NVIDIA H100 80GB HBM3" in item.source
    assert str(tmp_path / "c.json") in item.source
    assert estimate(job, cpu, "memascend").item("host/runtime").bytes != 1_234_567_890  # CPU keeps its constant
    (tmp_path / "bad.json").write_text(json.dumps({"schema_version": 2, "host_runtime_bytes": 1}))
    monkeypatch.setenv(measured.ENV, str(tmp_path / "bad.json"))
    with pytest.raises(BadInput, match="has no cuda_context_gpu_bytes"):
        estimate(job, gpu, "memascend")
    (tmp_path / "old.json").write_text(json.dumps({**doc, "schema_version": 1}))  # runtime before a training step
    monkeypatch.setenv(measured.ENV, str(tmp_path / "old.json"))
    with pytest.raises(BadInput, match="before the first training step"):
        estimate(job, gpu, "memascend")


def test_a_failed_setup_stops_the_kit_and_still_writes_its_json_and_log(tmp_path):
    """Not a dry run: the stand-in wheels and .deb files are placeholders, so setup breaks (pip refuses the wheels
    where the venv has no pip-installed DeepSpeed to fall back on, else the libaio unpack crashes); nothing after it
    runs, and the summary and the log are in the output folder all the same."""
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(SCRIPT), "run", "--phases", "setup,probe,constants,bench", "--carry",
                        str(_fake_carry(tmp_path / "carry")), "--work", str(tmp_path / "work"), "--out", str(out),
                        "--models", "qwen2.5-0.5b", "--budget-s", "200"],
                       capture_output=True, text=True, timeout=300, cwd=str(REPO), check=False)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["phases"] == {"setup": False} and not summary["ok"] and "host" in summary["facts"]
    failed_step = summary["steps"][-1]["status"] == "failed"
    assert failed_step or "not an ar archive" in summary["crashes"]["setup"], json.dumps(summary)[-2000:]
    log = (out / "gpu_check.log").read_text()
    assert "setup NOT ok" in log and "probe" not in summary["phases"]


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.gpu.test_a" name="test_ok" time="1.25"/>
<testcase classname="tests.gpu.test_a" name="test_bad" time="0.5"><failure message="assert 1 == 2">tb</failure></testcase>
<testcase classname="" name="tests.integration.test_b" time="0"><skipped message="collection skipped">('/r/tests/b.py', 10, "Skipped: could not import 'trl'")</skipped></testcase>
</testsuite></testsuites>"""


def test_record_merges_the_calls_outputs_into_one_compact_document(tmp_path):
    from gpukit import record

    one, two = tmp_path / "1", tmp_path / "2"
    one.mkdir(), two.mkdir()
    (one / "gpu_check.json").write_text(json.dumps({"call": 1, "ok": True, "facts": {"gpus": ["NVIDIA H100, 80 GiB"]}}))
    (one / "cuda_constants.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3",
                                                         "measured_at": "2026-11-26T01:00:00Z"}))
    (two / "gpu_check.json").write_text(json.dumps({"call": 2, "ok": False, "problems": ["tests failed"]}))
    (two / "pytest_gpu.xml").write_text(JUNIT)
    path = record.record([str(one), str(two)], str(tmp_path / "out"))
    assert os.path.basename(path) == "h100-80gb-hbm3-tests-2026-11-26.json"
    text = Path(path).read_text()
    assert text.count("\n") == 1  # one line
    doc = json.loads(text)
    assert [c["call"] for c in doc["calls"]] == [1, 2] and doc["calls"][1]["problems"] == ["tests failed"]
    assert (doc["tests"]["passed"], doc["tests"]["failed"], doc["tests"]["skipped"]) == (1, 1, 1)
    by_test = {c["test"]: c for c in doc["tests"]["cases"]}
    assert by_test["tests/gpu/test_a.py::test_bad"]["message"] == "assert 1 == 2"
    assert by_test["tests.integration.test_b"]["message"] == "could not import 'trl'"
    with pytest.raises(ValueError, match="holds a GPU kit output"):
        record.merge([str(tmp_path / "out")])


def test_a_hand_chosen_run_is_recorded_by_its_options(tmp_path):
    """A `run` (not a numbered call) keeps its options: those it wrote, else the ones given to `record`."""
    import argparse

    import gpu_check
    from gpukit import record

    args = argparse.Namespace(phases="setup,bench", models="llama-3.2-1b", runs="tuned,memascend", seq_len=2048,
                              steps=2, budget_s=530.0)
    written = gpu_check.run_args(args)
    assert written == ("--phases setup,bench --models llama-3.2-1b --runs tuned,memascend --seq-len 2048 --steps 2 "
                       "--budget-s 530")
    assert gpu_check.run_args(argparse.Namespace(**vars(args), gradient_clipping=10.0)).endswith(
        " --gradient-clipping 10")
    new, old = tmp_path / "new", tmp_path / "old"
    new.mkdir(), old.mkdir()
    (new / "gpu_check.json").write_text(json.dumps({"call": None, "run_args": written, "facts": {}}))
    (old / "gpu_check.json").write_text(json.dumps({"call": None, "facts": {}}))
    for folder in (new, old):
        (folder / "cuda_constants.json").write_text(json.dumps({"device": "NVIDIA H100", "measured_at": "2026-11-26"}))
    assert record.merge([str(new)], "--phases other")["calls"][0]["run_args"] == written
    assert record.merge([str(old)], "--phases bench")["calls"][0]["run_args"] == "--phases bench"
    assert record.merge([str(old)])["calls"][0]["run_args"] is None
