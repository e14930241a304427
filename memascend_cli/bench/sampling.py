"""Memory sampling of a run: the settle wait before it, the meminfo sampler and the process-tree sampler.

Memory is measured system-wide: MemTotal - MemAvailable sampled at >= 1 kHz in the parent, minus the settled idle
level taken right before the launch, plus the child's ru_maxrss from os.wait4 (the largest single process of the
tree), plus per-process RSS of the tree sampled with psutil.
"""

from __future__ import annotations

import os
import threading
import time
from array import array
from dataclasses import dataclass

from memascend_cli.units import MiB

SETTLE_WINDOW_S = 6.0
SETTLE_TOLERANCE_BYTES = 8 * MiB
SETTLE_CAP_S = 150.0
"""A heavy run's freed memory takes 45-85 s to show up as available again on this VM; cap the wait and report
when not flat."""
SAMPLE_INTERVAL_S = 0.0008
"""Target meminfo period: ~1.25 kHz asked so that scheduling jitter still leaves >= 1 kHz."""
TREE_SAMPLE_INTERVAL_S = 0.05
TIMELINE_BUCKET_S = 0.01
"""A run's timeline in memory (the plot) keeps the maximum of each 10 ms bucket of the raw 1 kHz series; the side
file keeps 1 s buckets (document.SIDE_FILE_BUCKET_S)."""


def flat_spread(samples: list[tuple[float, int]], window_s: float) -> int | None:
    """max - min of the samples in the last `window_s`, or None until the samples span the window."""
    if not samples or samples[-1][0] - samples[0][0] < window_s:
        return None
    t_end = samples[-1][0]
    vals = [v for t, v in samples if t >= t_end - window_s]
    return max(vals) - min(vals)


@dataclass
class SettleResult:
    idle_bytes: int
    """Median of MemTotal - MemAvailable over the last window: the level a run's peak is taken from."""
    waited_s: float
    flat: bool
    """False when the cap ran out before the level was flat (the idle level is then less certain)."""
    spread_bytes: int
    dropped_caches: bool


def settle(read_used_bytes, *, window_s: float = SETTLE_WINDOW_S, tolerance_bytes: int = SETTLE_TOLERANCE_BYTES,
           cap_s: float = SETTLE_CAP_S, interval_s: float = 0.25, clock=time.monotonic, sleep=time.sleep,
           on_tick=None, dropped_caches: bool = False) -> SettleResult:
    """Wait until used memory is flat within `tolerance_bytes` over `window_s`, at most `cap_s`."""
    t0 = clock()
    samples: list[tuple[float, int]] = []
    spread = None
    while True:
        now = clock()
        samples.append((now, int(read_used_bytes())))
        # Keep only what the window needs.
        while len(samples) > 2 and samples[1][0] <= now - window_s:
            samples.pop(0)
        spread = flat_spread(samples, window_s)
        if on_tick is not None:
            on_tick(now - t0, spread)
        if spread is not None and spread <= tolerance_bytes:
            break
        if now - t0 >= cap_s:
            break
        sleep(interval_s)
    vals = sorted(v for t, v in samples if t >= samples[-1][0] - window_s)
    flat = spread is not None and spread <= tolerance_bytes
    return SettleResult(idle_bytes=vals[len(vals) // 2], waited_s=clock() - t0, flat=flat,
                        spread_bytes=spread if spread is not None else (vals[-1] - vals[0]), dropped_caches=dropped_caches)


def drop_caches() -> bool:
    """sync, and as root drop the page cache so reclaimable cache does not drift during the run."""
    os.sync()
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


class MeminfoReader:
    """MemTotal - MemAvailable in bytes, read with os.pread on one open fd (no open/close per sample)."""

    def __init__(self, path: str = "/proc/meminfo"):
        self.fd = os.open(path, os.O_RDONLY)
        self.total_bytes = self._field(os.pread(self.fd, 8192, 0), b"MemTotal:")

    @staticmethod
    def _field(data: bytes, name: bytes) -> int:
        i = data.index(name) + len(name)
        return int(data[i:data.index(b"kB", i)]) * 1024

    def used_bytes(self) -> int:
        return self.total_bytes - self._field(os.pread(self.fd, 8192, 0), b"MemAvailable:")

    def close(self) -> None:
        os.close(self.fd)


class MemSampler(threading.Thread):
    """Samples MemTotal - MemAvailable at ~1.25 kHz into compact arrays (16 B per sample)."""

    def __init__(self, reader: MeminfoReader, interval_s: float = SAMPLE_INTERVAL_S):
        super().__init__(daemon=True, name="meminfo-sampler")
        self.reader, self.interval_s = reader, interval_s
        self.t_s = array("d")
        self.used_bytes = array("q")
        self._halt = threading.Event()

    def run(self) -> None:
        # As root, raise this thread's priority (per-thread nice on Linux) so the training job's
        # threads on a 2-core box do not starve the sampler; the child does not inherit it.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)
        except (OSError, AttributeError):
            pass
        nxt = time.monotonic()
        read, t_app, u_app, mono = self.reader.used_bytes, self.t_s.append, self.used_bytes.append, time.monotonic
        while not self._halt.is_set():
            t_app(mono())
            u_app(read())
            nxt += self.interval_s
            delay = nxt - mono()
            if delay > 0:
                time.sleep(delay)
            else:
                nxt = mono()  # fell behind: do not burst to catch up

    def stop(self) -> None:
        self._halt.set()
        self.join()


class TreeSampler(threading.Thread):
    """psutil RSS of the child's process tree (the sum, and each process's max), and of everyone else.

    wait4's ru_maxrss covers one process at a time; with a launcher and two ranks the node's real
    footprint is the sum. Other processes' RSS (sampled at 1 Hz) shows how much the other jobs on a
    shared machine moved the system-wide reading.
    """

    def __init__(self, pid: int, interval_s: float = TREE_SAMPLE_INTERVAL_S):
        super().__init__(daemon=True, name="tree-sampler")
        self.pid, self.interval_s = pid, interval_s
        self.max_tree_rss_bytes = 0
        self.per_process_max_rss_bytes: dict[int, tuple[str, int]] = {}
        self.others_rss_bytes: list[tuple[float, int]] = []
        """(monotonic time, summed RSS of every process outside the tree and this one)."""
        self._halt = threading.Event()

    def _tree(self, psutil):
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def run(self) -> None:
        import psutil

        me = os.getpid()
        last_others = 0.0
        while not self._halt.is_set():
            total = 0
            procs = self._tree(psutil)
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    name = " ".join(p.cmdline()[:3])[-80:]
                except psutil.Error:
                    continue
                total += rss
                prev = self.per_process_max_rss_bytes.get(p.pid, ("", 0))
                if rss > prev[1]:
                    self.per_process_max_rss_bytes[p.pid] = (name, rss)
            self.max_tree_rss_bytes = max(self.max_tree_rss_bytes, total)
            now = time.monotonic()
            if now - last_others >= 1.0:
                last_others = now
                self.others_rss_bytes.append((now, others_rss_bytes({p.pid for p in procs} | {me})))
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def others_rss_bytes(exclude: set[int]) -> int:
    """Summed RSS of every process not in `exclude` (shared pages count once per process: a rough gauge)."""
    import psutil

    total = 0
    for p in psutil.process_iter(["memory_info"]):
        if p.pid not in exclude and p.info["memory_info"] is not None:
            total += p.info["memory_info"].rss
    return total


def nearest(series: list[tuple[float, int]], t: float) -> int | None:
    """Value of the (time, value) sample closest to t. Pure."""
    return min(series, key=lambda x: abs(x[0] - t))[1] if series else None


def bucket_max(t_s, values, t0: float, bucket_s: float = TIMELINE_BUCKET_S) -> list[tuple[float, int]]:
    """Downsample (t, v) to the maximum of each `bucket_s` bucket, times relative to t0. Pure."""
    out: list[tuple[float, int]] = []
    cur_b, cur_v = None, 0
    for t, v in zip(t_s, values):
        b = int((t - t0) / bucket_s + 1e-9)  # epsilon: 0.03 / 0.01 is 2.999... in floating point
        if b != cur_b:
            if cur_b is not None:
                out.append((round(cur_b * bucket_s, 4), cur_v))
            cur_b, cur_v = b, v
        elif v > cur_v:
            cur_v = v
    if cur_b is not None:
        out.append((round(cur_b * bucket_s, 4), cur_v))
    return out


def sampling_stats(t_s) -> dict:
    """Achieved rate and the largest gap of the meminfo series (a gap could hide a spike)."""
    n = len(t_s)
    if n < 2:
        return {"samples": n, "rate_hz": 0.0, "max_gap_ms": None}
    span = t_s[-1] - t_s[0]
    gaps = sorted(t_s[i + 1] - t_s[i] for i in range(n - 1))
    return {"samples": n, "rate_hz": round((n - 1) / span, 1) if span > 0 else 0.0,
            "max_gap_ms": round(gaps[-1] * 1e3, 3), "p999_gap_ms": round(gaps[int(0.999 * (len(gaps) - 1))] * 1e3, 3)}




def busy_cpu_seconds(proc_stat_text: str, clock_ticks_per_s: int = 100) -> float:
    """CPU seconds the whole machine spent busy so far (user + nice + system + irq + softirq + steal of the `cpu`
    line of /proc/stat; idle and iowait left out). Pure."""
    for line in proc_stat_text.splitlines():
        f = line.split()
        if f and f[0] == "cpu":
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[1:9])
            return (user + nice + system + irq + softirq + steal) / clock_ticks_per_s
    return 0.0


def read_busy_cpu_seconds() -> float | None:
    """busy_cpu_seconds of this machine now, None where /proc/stat cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return busy_cpu_seconds(f.read(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return None
