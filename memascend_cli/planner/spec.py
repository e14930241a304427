"""Plain data the planner consumes: the machine. Pure: no probing here (see memascend_cli.hardware)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from memascend_cli.units import GiB


@dataclass(kw_only=True)
class HardwareSpec:
    """One node of the machine the job runs on (all nodes are assumed alike)."""

    name: str
    """'local' for the probed machine, else the profile name (presets/hardware/<name>.yaml)."""
    dram_gib: float
    """Total system memory per node (MemTotal)."""
    dram_available_gib: float | None = None
    """MemAvailable at probe time; None for profiles. Informational: plans use dram_gib - os_reserve_gib."""
    os_reserve_gib: float | None = None
    """DRAM kept free for the OS, page cache and other processes; None = max(1 GiB, 5% of dram_gib)."""
    swap_gib: float = 0.0
    """Swap space; never counted as usable (pinned/locked pages cannot be swapped)."""
    num_gpus: int = 0
    """GPUs per node; 0 = CPU-only job (DeepSpeed on the CPU accelerator, gloo)."""
    gpu_name: str | None = None
    """GPU model, e.g. 'NVIDIA H100 80GB HBM3'."""
    gpu_mem_gib: float = 0.0
    """Memory per GPU."""
    num_nodes: int = 1
    """Machines in the job."""
    cpu_cores: int = 1
    """Logical CPUs per node."""
    memlock_limit_gib: float | None = None
    """RLIMIT_MEMLOCK soft limit per process; None = unlimited."""
    can_lock_unlimited: bool = True
    """True when running as root / with CAP_IPC_LOCK, so the memlock limit does not bind."""
    nvme_path: str | None = None
    """Where swap data goes (a directory, region file or device), if known."""
    nvme_free_gib: float | None = None
    """Free space for swap data per node; None = unknown (not checked)."""
    nvme_read_gbps: float | None = None
    """Sequential read bandwidth of the swap target (GB/s); None = unknown."""
    nvme_write_gbps: float | None = None
    """Sequential write bandwidth of the swap target (GB/s); None = unknown."""
    source: str = "probe"
    """Where these numbers come from (probe, profile file, overrides)."""

    @property
    def usable_dram_gib(self) -> float:
        """DRAM a job may use per node."""
        reserve = self.os_reserve_gib if self.os_reserve_gib is not None else max(1.0, 0.05 * self.dram_gib)
        return max(0.0, self.dram_gib - reserve)

    def under_dram_cap(self, cap_bytes: int) -> HardwareSpec:
        """This node as a job in a memory cgroup of `cap_bytes` sees it: the cap is its DRAM, all of it the job's.
        Nothing is set aside for the library pages the job maps (the cgroup is charged for them): the plan's runtime
        item already holds them, as it tracks the runs' ru_maxrss, file pages included (a rank's RssAnon 0.27 GiB +
        RssFile 0.09 once torch and DeepSpeed are loaded, against host/runtime 0.37). Under a cap, memascend's runs
        fit up to a plan of cap + 0.04 GiB and were OOM-killed from cap + 0.05 (docs/bench/capacity/).

        The one place a DRAM cap becomes the machine a plan sees (plan, train, bench and the preflight call it). A cap
        not below what the node has for a job changes nothing but the source, which says so: the node's own DRAM
        binds first."""
        slack = self.slack_cap_note(cap_bytes)
        if slack:
            return replace(self, source=f"{self.source}; {slack}")
        return replace(self, dram_gib=cap_bytes / GiB, dram_available_gib=None, os_reserve_gib=0.0,
                       source=f"{self.source} under --dram-cap {cap_bytes / GiB:.2f} GiB")

    def slack_cap_note(self, cap_bytes: int) -> str | None:
        """Why a DRAM cap of `cap_bytes` changes nothing on this node (it is not below what the node has for a job),
        else None."""
        if cap_bytes / GiB < self.usable_dram_gib:
            return None
        return (f"--dram-cap {cap_bytes / GiB:.2f} GiB is not below the {self.usable_dram_gib:.1f} GiB this node has "
                "for a job")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["usable_dram_gib"] = round(self.usable_dram_gib, 3)
        return d
