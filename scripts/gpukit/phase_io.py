"""What the SSD did in each phase of a bench run: the kit samples /proc/diskstats of the SSD's block device while the
run goes (kit.DiskSampler), the run's ranks mark each phase with CLOCK_MONOTONIC (engine/bench_job.py Events: the
events-rank0.jsonl beside its bench.json), and the two clocks are one. Per phase, over steps 2..N: the achieved read
and write rates and the requests in flight (Little's law over the kernel's per-request times: the parameter fetches'
queue depth in forward + backward, against the probe's best). Pure: parsing and arithmetic only
(tests/unit/test_gpu_kit_calls.py)."""

from __future__ import annotations

SECTOR_BYTES = 512
"""/proc/diskstats counts 512-byte sectors whatever the device's block size (Documentation/admin-guide/iostats.rst)."""
FIELDS = ("reads", "reads_merged", "sectors_read", "read_ms", "writes", "writes_merged", "sectors_written",
          "write_ms", "in_flight", "io_ms", "weighted_ms")
"""The first eleven fields after major, minor and name (iostats.rst fields 1-11)."""
PHASE_FORWARD_BACKWARD, PHASE_OPTIMIZER = "forward+backward", "optimizer"
"""The time model's phases (memascend_cli/planner/time.py)."""


def parse_diskstats(text: str, major: int, minor: int) -> dict | None:
    """The counters of device major:minor in /proc/diskstats' text, None when it is not listed. Pure."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 + len(FIELDS) and parts[0] == str(major) and parts[1] == str(minor):
            return {"name": parts[2], **{k: int(v) for k, v in zip(FIELDS, parts[3:3 + len(FIELDS)])}}
    return None


def phase_windows(events: list[dict], steps: int) -> dict[str, list[tuple[float, float]]]:
    """{phase: [(start, end) on CLOCK_MONOTONIC, one per step 2..`steps`]} from a rank's phase events (name, t_mono):
    forward + backward from stepN_forward to stepN_optimizer, the optimizer from there to the next forward (the last
    step: to finish). Steps without their marks are left out. Pure."""
    at = {e["name"]: e["t_mono"] for e in events if e.get("event") == "phase" and "t_mono" in e}
    out: dict[str, list[tuple[float, float]]] = {PHASE_FORWARD_BACKWARD: [], PHASE_OPTIMIZER: []}
    for n in range(2, steps + 1):
        fwd, opt = at.get(f"step{n}_forward"), at.get(f"step{n}_optimizer")
        end = at.get(f"step{n + 1}_forward", at.get("finish"))
        if None in (fwd, opt, end):
            continue
        out[PHASE_FORWARD_BACKWARD].append((fwd, opt))
        out[PHASE_OPTIMIZER].append((opt, end))
    return out


def _delta(samples: list[tuple[float, dict]], t0: float, t1: float) -> tuple[float, dict] | None:
    """(seconds, counter deltas) between the first sample at or after t0 and the last at or before t1."""
    inside = [(t, c) for t, c in samples if t0 <= t <= t1]
    if len(inside) < 2:
        return None
    (ta, a), (tb, b) = inside[0], inside[-1]
    return tb - ta, {k: b[k] - a[k] for k in FIELDS if k != "in_flight"}


def io_by_phase(samples: list[tuple[float, dict]], windows: dict[str, list[tuple[float, float]]]) -> dict:
    """Per phase, over all its windows together: seconds sampled, read and write GB/s achieved, the mean reads and
    writes in flight (read_ms / wall ms: each request's time in the kernel summed, Little's law) and the share of
    the time the device was busy (io_ms). A phase with no two samples inside any window is left out. Pure."""
    out = {}
    for phase, spans in windows.items():
        total_s, sums = 0.0, dict.fromkeys(FIELDS[:8] + FIELDS[9:], 0)
        for t0, t1 in spans:
            d = _delta(samples, t0, t1)
            if d is None:
                continue
            total_s += d[0]
            for k, v in d[1].items():
                sums[k] += v
        if total_s <= 0:
            continue
        ms = total_s * 1e3
        out[phase] = {"seconds": round(total_s, 3),
                      "read_gbps": round(sums["sectors_read"] * SECTOR_BYTES / total_s / 1e9, 3),
                      "write_gbps": round(sums["sectors_written"] * SECTOR_BYTES / total_s / 1e9, 3),
                      "reads_in_flight": round(sums["read_ms"] / ms, 2),
                      "writes_in_flight": round(sums["write_ms"] / ms, 2),
                      "mean_read_bytes": round(sums["sectors_read"] * SECTOR_BYTES / sums["reads"])
                      if sums["reads"] else None,
                      "busy_share": round(min(1.0, sums["io_ms"] / ms), 3)}
    return out
