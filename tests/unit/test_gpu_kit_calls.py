"""The GPU kit's capacity and placement calls and the time model's measurements, without a GPU: the SSD per phase
(gpukit/phase_io.py, and a real /proc/diskstats sampler), the capacity search's findings, the time rates rehearsed on
the CPU, and the planner taking measured rates only for the GPU they were measured on. The calls' dry runs, their
synthetic outputs and the results page rendered from them: tests/unit/test_gpu_check_device_view.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from gpukit import phase_io, pure  # noqa: E402
from gpukit.kit import DiskSampler  # noqa: E402


def _line(major: int, minor: int, **counters) -> str:
    return f"{major:4d} {minor:7d} vdx " + " ".join(str(counters.get(k, 0)) for k in phase_io.FIELDS) + " 0 0 0 0"


def test_the_ssd_per_phase_from_diskstats_and_the_ranks_phase_marks():
    text = "\n".join([_line(8, 0, reads=5), _line(254, 0, reads=10, sectors_read=2048, read_ms=40)])
    assert phase_io.parse_diskstats(text, 254, 0)["sectors_read"] == 2048
    assert phase_io.parse_diskstats(text, 254, 0)["name"] == "vdx" and phase_io.parse_diskstats(text, 9, 9) is None
    # 10 samples a second; from t=10 s on the device reads 1 GB/s with 4 requests in flight (4 ms of request time
    # per ms) and writes 0.5 GB/s with 2 in flight.
    samples = []
    for i in range(0, 301):
        t = 10.0 + i / 10
        ms = i * 100
        samples.append((t, {"reads": i * 8, "reads_merged": 0, "sectors_read": i * 195312, "read_ms": 4 * ms,
                            "writes": i * 4, "writes_merged": 0, "sectors_written": i * 97656, "write_ms": 2 * ms,
                            "in_flight": 6, "io_ms": ms, "weighted_ms": 6 * ms}))
    events = [{"event": "phase", "name": n, "t_mono": t} for n, t in (
        ("step1_forward", 10.0), ("step1_optimizer", 14.0), ("step2_forward", 20.0), ("step2_optimizer", 25.0),
        ("step3_forward", 30.0), ("step3_optimizer", 34.0), ("finish", 38.0))] + [{"event": "step", "t_mono": 1.0}]
    windows = phase_io.phase_windows(events, 3)
    assert windows == {"forward+backward": [(20.0, 25.0), (30.0, 34.0)], "optimizer": [(25.0, 30.0), (34.0, 38.0)]}
    io = phase_io.io_by_phase(samples, windows)
    fb = io["forward+backward"]
    assert fb["seconds"] == pytest.approx(9.0, abs=0.01)
    assert fb["read_gbps"] == pytest.approx(1.0, rel=1e-3) and fb["write_gbps"] == pytest.approx(0.5, rel=1e-3)
    assert fb["reads_in_flight"] == 4.0 and fb["writes_in_flight"] == 2.0 and fb["busy_share"] == 1.0
    assert fb["mean_read_bytes"] == round(195312 * 512 / 8)
    # A run without the marks of step 2 (killed in it): no phase, nothing invented.
    assert phase_io.phase_windows(events[:3], 3) == {"forward+backward": [], "optimizer": []}
    assert phase_io.io_by_phase(samples[:2], windows) == {}


def test_the_disk_sampler_sees_a_write_on_this_machines_disk(tmp_path):
    with DiskSampler(str(tmp_path), interval_s=0.05) as s:
        with open(tmp_path / "f", "wb") as f:
            f.write(os.urandom(16 << 20))
            f.flush()
            os.fsync(f.fileno())
        import time
        time.sleep(0.2)
    if s.reason:
        pytest.skip(f"no block device under {tmp_path}: {s.reason}")
    assert len(s.samples) >= 2
    written = (s.samples[-1][1]["sectors_written"] - s.samples[0][1]["sectors_written"]) * phase_io.SECTOR_BYTES
    assert written >= 16 << 20  # other writers of the disk only add to it
    assert all(a[0] < b[0] for a, b in zip(s.samples, s.samples[1:]))


def _run(ok: bool, oom: bool = False, steps: int = 3) -> dict:
    return {"ok": ok, "oom_killed": oom, "losses": [1.0] * (steps if ok else 1), "cgroup": {"peak_bytes": 7 << 30},
            "peak_system_bytes": 7 << 30, "predicted": {"node_host_peak_bytes": 6 << 30}, "seconds_per_step": 4.0}


def test_the_capacity_calls_findings():
    from memascend_cli.bench import capacity

    g = capacity.grid("seq")
    assert g.step == pure.SEQ_GRID_TOKENS
    for run in (_run(True), _run(False, oom=True), {**_run(False), "timed_out": True}, _run(False)):
        assert pure.capacity_outcome(run) == capacity.outcome(run)  # the kit's stdlib copy says what bench says
    # What bench --capacity prints first for each engine (capacity_run.search_engine), however far the search got.
    log = (f"tuned: planned max {capacity.fmt_max(51200)} {g.unit} under 8.00 GiB (binds: DRAM); probes stop at "
           f"{capacity.fmt_max(None)}: grid end\nmemascend: planned max {capacity.fmt_max(None)} {g.unit} under ...")
    assert pure.parse_planned_max(log, "tuned") == (True, 51200)
    assert pure.parse_planned_max(log, "memascend") == (True, None)
    assert pure.parse_planned_max("", "tuned") == (False, None)
    probes = [pure.capacity_probe(51200, _run(True)), pure.capacity_probe(51456, _run(False, oom=True)),
              pure.capacity_probe(52224, _run(False, oom=True))]
    assert probes[1]["steps_done"] == 1 and probes[0]["cgroup_peak_bytes"] == 7 << 30
    assert pure.measured_max(probes) == (51200, True)
    assert pure.measured_max(probes[:1]) == (51200, False)  # cut off before a value above it was shown not to fit
    assert pure.measured_max(probes[1:]) == (None, False)
    assert pure.memascend_probe_value(51200, True, 50944) == (102400, "2 x tuned's measured maximum")
    value, why = pure.memascend_probe_value(51200, False, 50944)
    assert value == 2 * (51200 + 2 * pure.SEQ_GRID_TOKENS) and "did not end" in why
    assert pure.memascend_probe_value(None, False, None)[0] is None
    m_fit = pure.capacity_probe(102400, _run(True))
    s = pure.capacity_summary(model="smollm2-360m", cap="8GiB", cgroup={"ok": True, "version": 2}, tuned_planned=50944,
                              tuned_probes=probes, tuned_stopped_by="its search ended", memascend_value=102400,
                              memascend_basis="2 x", memascend_probe=m_fit)
    assert s["tuned"]["measured_max"] == 51200 and s["tuned"]["probes"][0]["value"] == 51200
    assert s["verdict"] == {"memascend_at_least_2x": True, "memascend_over_tuned": 2.0, "tuned_within_one_step": True,
                            "tuned_killed_at_planned": None}
    # The plan two grid steps over the measurement, tuned OOM-killed at its planned maximum, memascend killed too.
    bad = pure.capacity_summary(model="m", cap="8GiB", cgroup={}, tuned_planned=51456, tuned_probes=probes,
                                tuned_stopped_by="", memascend_value=102400, memascend_basis="",
                                memascend_probe=pure.capacity_probe(102400, _run(False, oom=True)))
    assert bad["verdict"]["tuned_killed_at_planned"] is True and bad["verdict"]["memascend_at_least_2x"] is False
    assert bad["verdict"]["tuned_within_one_step"] is True
    assert pure.capacity_summary(model="m", cap="8GiB", cgroup={}, tuned_planned=52224, tuned_probes=probes,
                                 tuned_stopped_by="", memascend_value=None, memascend_basis="",
                                 memascend_probe=None)["verdict"]["tuned_within_one_step"] is False
    # The dry run's line through two planned peaks: on the grid, within the cap.
    line = ((2048, 5 << 30), (65536, 9 << 30))
    top = pure.grid_max_under(line, 8 << 30)
    assert top % pure.SEQ_GRID_TOKENS == 0 and pure.linear_bytes(line, top) <= 8 << 30
    assert pure.linear_bytes(line, top + pure.SEQ_GRID_TOKENS) > 8 << 30
    assert pure.grid_max_under(((2048, 9 << 30), (65536, 10 << 30)), 8 << 30) is None


def test_the_time_rates_rehearse_on_the_cpu():
    """copy_rates and norm_rates as the constants phase runs them on the GPU, here on the CPU and small (cpu_adam_rate
    loads DeepSpeed's op: it runs on the GPU machine, where setup built it)."""
    torch = pytest.importorskip("torch")
    from gpukit import cuda_constants

    c = cuda_constants.copy_rates(torch, "cpu", copy_bytes=8 << 20, repeats=2)
    assert c["copy_bytes"] == 8 << 20
    assert all(c[f"{d}_{k}_gbps"] > 0 for d in ("h2d", "d2h") for k in ("pinned", "pageable"))
    n = cuda_constants.norm_rates(torch, "cpu", numel=1 << 20, repeats=2)
    assert n["norm_elems_per_s"] > 0 and n["norm_barrier_s"] >= 0 and n["norm_barrier"] == ".item() (no process group)"


def _constants(device: str) -> dict:
    return {"schema_version": 2, "device": device, "measured_at": "2026-12-06T00:00:00Z", "host_runtime_bytes": 3 << 30,
            "cuda_context_gpu_bytes": 600 << 20,
            "time_rates": {"h2d_pinned_gbps": 40.0, "d2h_pinned_gbps": 60.0, "cpu_adam_elems_per_s": 8e9,
                           "torch_threads": 16, "cpu_model": "Intel Xeon"}}


def test_measured_rates_are_taken_for_the_gpu_they_were_measured_on(tmp_path, monkeypatch):
    from memascend_cli.compute_probe import plan_device
    from memascend_cli.planner.breakdown import SsdTraffic
    from memascend_cli.planner import measured
    from memascend_cli.planner import time as tm
    from memascend_cli.planner.spec import HardwareSpec

    rates = measured.matching_rates(_constants("NVIDIA H100 80GB HBM3"), "nvidia h100 80gb hbm3")
    assert rates["pcie_bytes_per_s"] == pytest.approx(48e9)  # harmonic mean of 40 and 60 GB/s
    assert rates["cpu_adam_elems_per_s_per_core"] == 0.5e9 and "measured on NVIDIA H100 80GB HBM3" in rates["source"]
    assert measured.matching_rates(_constants("NVIDIA H100 80GB HBM3"), "NVIDIA H200") is None
    assert measured.matching_rates({**_constants("NVIDIA H200"), "time_rates": {"error": "x"}}, "NVIDIA H200") is None
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_constants("NVIDIA H100 80GB HBM3")))
    monkeypatch.setenv(measured.ENV, str(path))
    same = HardwareSpec(name="gpu", dram_gib=128, num_gpus=1, gpu_mem_gib=80, gpu_name="NVIDIA H100 80GB HBM3")
    other = HardwareSpec(name="gpu", dram_gib=128, num_gpus=1, gpu_mem_gib=80, gpu_name="NVIDIA A100-SXM4-80GB")
    d_same, d_other = plan_device(same, "bf16"), plan_device(other, "bf16")
    assert d_same.pcie_bytes_per_s == pytest.approx(48e9) and d_same.cpu_adam_elems_per_s_per_core == 0.5e9
    assert d_other.pcie_bytes_per_s == 1e9 * tm.PCIE_GBPS["A100"] and d_other.cpu_adam_elems_per_s_per_core is None
    # CPU Adam's time follows the measured rate: 1e9 elements on 8 cores at 0.5e9 a core.
    traffic = SsdTraffic(read_bytes={}, write_bytes={}, params_per_rank=10**9)
    t = tm.step_time("tuned", flops=0.0, traffic=traffic, device=d_same, read_bytes_per_s=1e9, write_bytes_per_s=1e9,
                     optimizer_elems=10**9, cpu_cores=8, tokens_per_step=1)
    assert t.seconds["CPU Adam"] == pytest.approx(0.25)
    t = tm.step_time("tuned", flops=0.0, traffic=traffic, device=d_other, read_bytes_per_s=1e9, write_bytes_per_s=1e9,
                     optimizer_elems=10**9, cpu_cores=8, tokens_per_step=1)
    assert t.seconds["CPU Adam"] == pytest.approx(1e9 / (tm.CPU_ADAM_ELEMS_PER_S_PER_CORE * 8))


def test_the_gpu_page_renders_the_rates_and_the_ssd_per_phase():
    """The GPU page's sections of the time model's rates (as copy_rates / norm_rates measure them, rehearsed here on
    the CPU; CPU Adam's rate as the planner's constant would have it) and of the SSD per phase (phase_io's document of
    the test above)."""
    torch = pytest.importorskip("torch")
    import results_gpu_calls
    from gpukit import cuda_constants

    from memascend_cli.planner import time as tm

    rates = {"torch_threads": 16, "cpu_count": 16, "cpu_model": "Intel Xeon",
             **cuda_constants.copy_rates(torch, "cpu", copy_bytes=4 << 20, repeats=1),
             **cuda_constants.norm_rates(torch, "cpu", numel=1 << 18, repeats=1),
             "cpu_adam_elems_per_s": 16 * tm.CPU_ADAM_ELEMS_PER_S_PER_CORE}
    text = "\n".join(results_gpu_calls.section_time_rates({"device": "NVIDIA H100 80GB HBM3", "time_rates": rates}))
    assert f"host -> device {rates['h2d_pinned_gbps']:.1f} GB/s pinned" in text
    assert f"against the PCIe table's {tm.PCIE_GBPS['H100']:.0f} GB/s a direction" in text
    assert "CPU Adam 13.44e9 elements/s on 16 threads of Intel Xeon (0.84e9 a thread" in text
    assert results_gpu_calls.section_time_rates({"time_rates": {"error": "OSError: x"}})[0].endswith("(OSError: x).")
    assert results_gpu_calls.section_time_rates({}) == []
    io = {"device": "254:0", "phases": {"forward+backward": {"seconds": 9.0, "read_gbps": 1.0, "write_gbps": 0.5,
                                                             "reads_in_flight": 4.0, "writes_in_flight": 2.0,
                                                             "mean_read_bytes": 12_500_000, "busy_share": 1.0}}}
    text = "\n".join(results_gpu_calls.section_phase_io({"phase_io": {"qwen2.5-0.5b": {"tuned": io}}, "storage": {
        "region_probe": {"read_gbps": 3.0, "best_queue_depth": 32, "best_block_bytes": 4 << 20}}}))
    assert "| qwen2.5-0.5b tuned | forward+backward | 9.0 | 1.00 | 4.0 | 0.50 | 2.0 | 12207 | 100% |" in text
    assert "3.0 GB/s read at queue depth 32 of 4096 KiB" in text
    assert results_gpu_calls.section_phase_io({}) == []
