"""What an estimate is made of: its items, its totals and the SSD traffic of one step. Pure: stdlib only."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from memascend_cli.errors import BadInput
from memascend_cli.planner import zero


@dataclass
class Item:
    """One line of the breakdown, per rank."""

    key: str
    """Hierarchical id, e.g. 'host/param_swap_pool' (stable, used in --json)."""
    label: str
    tier: str
    """host, gpu or nvme."""
    bytes: int
    kind: str = "steady"
    """steady (held for the whole run), or the phase it exists in: init, backward, optimizer, or
    retained (freed after backward but kept by the allocator through the optimizer step), or node (once per node,
    not per rank: the launcher)."""
    pinned: str = ""
    """'' (pageable), 'torch-pow2', 'mlock', 'exact' or 'exact, cuda-registered' (memascend)."""
    locked_bytes: int = 0
    """Bytes counted against RLIMIT_MEMLOCK (mlock-based pinning)."""
    formula: str = ""
    source: str = ""


@dataclass
class Estimate:
    """The breakdown of one engine on one job and machine."""

    engine: str
    items: list[Item]
    ranks_per_node: int
    world_size: int
    compute_on_host: bool
    notes: list[str] = field(default_factory=list)
    config_errors: list[str] = field(default_factory=list)
    """Settings the engine would reject at start-up (e.g. buffer_size below the largest partition)."""
    traffic: SsdTraffic | None = None
    """SSD bytes moved per optimizer step (see ssd_traffic)."""
    sub_group_numels: tuple[int, ...] = ()
    """Partition elements of each optimizer sub-group, with the knobs the engine runs with (the time model's)."""
    pipelined_optimizer: bool = False
    """Stock's optimizer swaps overlap Adam (offload_optimizer pipeline_read / pipeline_write)."""
    budget: zero.BudgetPlan | None = None
    """memascend's host budget split (bounded engine only)."""
    budget_error: BadInput | None = None
    """Set when the job's host budget is below the minimum (also listed in config_errors)."""

    def _sum(self, tier: str, kind: str) -> int:
        return sum(i.bytes for i in self.items if i.tier == tier and i.kind == kind)

    def _max(self, tier: str, kind: str) -> int:
        return max((i.bytes for i in self.items if i.tier == tier and i.kind == kind), default=0)

    @property
    def host_steady_bytes(self) -> int:
        return self._sum("host", "steady")

    def phase_bytes(self) -> dict[str, int]:
        """Host bytes on top of the steady level in each phase; 'retained' memory (what the allocator
        kept after the first backward) adds to the optimizer step and to every later backward, with the blocks
        that backward maps afresh ('later_backward')."""
        retained = self._sum("host", "retained")
        return {
            "init": self._sum("host", "init"),
            "backward": self._sum("host", "backward"),
            "optimizer": self._sum("host", "optimizer") + retained,
            "later_backward": retained + self._sum("host", "later_backward") if retained else 0,
        }

    @property
    def host_transient_bytes(self) -> int:
        """The largest phase on top of the steady level."""
        return max(self.phase_bytes().values())

    @property
    def peak_phase(self) -> str:
        phases = self.phase_bytes()
        return max(phases, key=phases.get)

    @property
    def host_peak_bytes(self) -> int:
        """Peak host memory of one rank: steady + the largest phase."""
        return self.host_steady_bytes + self.host_transient_bytes

    @property
    def node_host_peak_bytes(self) -> int:
        """Peak host memory of one node (every rank peaks in the same step)."""
        return self.ranks_per_node * self.host_peak_bytes + self._sum("host", "node")

    @property
    def gpu_peak_bytes(self) -> int:
        return self._sum("gpu", "steady") + self._max("gpu", "transient")

    @property
    def nvme_bytes(self) -> int:
        """SSD space per rank."""
        return self._sum("nvme", "steady")

    @property
    def node_nvme_bytes(self) -> int:
        return self.ranks_per_node * self.nvme_bytes

    @property
    def locked_bytes(self) -> int:
        """mlocked bytes per rank (what RLIMIT_MEMLOCK limits)."""
        return sum(i.locked_bytes for i in self.items)

    @property
    def pinned_waste_bytes(self) -> int:
        return sum(i.bytes for i in self.items if i.key.endswith("pow2_waste"))

    def item(self, key: str) -> Item | None:
        return next((i for i in self.items if i.key == key), None)

    def to_dict(self) -> dict:
        return {
            "engine": self.engine,
            "ranks_per_node": self.ranks_per_node,
            "world_size": self.world_size,
            "compute_on_host": self.compute_on_host,
            "host_steady_bytes": self.host_steady_bytes,
            "host_peak_bytes": self.host_peak_bytes,
            "peak_phase": self.peak_phase,
            "phase_bytes": self.phase_bytes(),
            "node_host_peak_bytes": self.node_host_peak_bytes,
            "gpu_peak_bytes": self.gpu_peak_bytes,
            "nvme_bytes": self.nvme_bytes,
            "node_nvme_bytes": self.node_nvme_bytes,
            "locked_bytes": self.locked_bytes,
            "pinned_waste_bytes": self.pinned_waste_bytes,
            "items": [asdict(i) for i in self.items],
            "notes": list(self.notes),
            "config_errors": list(self.config_errors),
            "ssd_traffic": self.traffic.to_dict() if self.traffic else None,
            "host_budget": self.budget.to_dict() if self.budget else None,
        }


@dataclass
class SsdTraffic:
    """SSD bytes per rank per optimizer step, by what moves (steady state: after the first step)."""

    read_bytes: dict[str, int]
    write_bytes: dict[str, int]
    params_per_rank: int
    """Partition elements of the rank (the denominator of the per-parameter rates)."""
    formula: str = ""
    minimum_per_param: tuple[float, float] = (0.0, 0.0)
    """(read, write) bytes per parameter per step of the placement's roofline: parameters fetched once for forward and
    once for backward (but those memascend's pool still holds from forward), the gradient written and read once in the
    training dtype, fp32 master + Adam moments read and written once, parameters written back once (what an engine with
    no extra traffic moves)."""
    roofline_per_param: tuple[float, float] = (0.0, 0.0)
    """(read, write) bytes per parameter per step that no engine of this placement moves less of with the gradients
    kept in DRAM: the parameters fetched as planned, Adam's moments read and written once, the fp32 master written once
    (the parameters hold it, or its upper halves, or it is beside them) and read once unless taken from the parameters
    backward fetched; no gradient, no checkpoint (12 + 12 B for fp32 master and moments, plus the parameters' own reads)."""
    backward_param_read_bytes: int | None = None
    """Of read_bytes["params"], the bytes read in backward (the time model's overlap window); None: half."""
    dram_fetch_bytes: int = 0
    """Parameter bytes fetched per step from DRAM instead of the SSD (stock's max_in_cpu, a DRAM placement): no SSD
    time, but on a GPU the same host-to-device copies as a fetch from the SSD."""
    dram_state_elems: int = 0
    """Optimizer elements whose master and moments stay in DRAM and are stepped there after backward (ZeRO-Offload's
    CPU step; memascend's planned DRAM tier): their Adam is not hidden behind backward (planner.time.step_time)."""

    @property
    def read_total(self) -> int:
        return sum(self.read_bytes.values())

    @property
    def write_total(self) -> int:
        return sum(self.write_bytes.values())

    def per_param(self) -> tuple[float, float]:
        """(read, write) bytes per parameter per step."""
        n = max(1, self.params_per_rank)
        return self.read_total / n, self.write_total / n

    def to_dict(self) -> dict:
        r, w = self.per_param()
        return {"read_bytes": dict(self.read_bytes), "write_bytes": dict(self.write_bytes),
                "read_bytes_per_step": self.read_total, "write_bytes_per_step": self.write_total,
                "read_bytes_per_param": round(r, 3), "write_bytes_per_param": round(w, 3),
                "minimum_read_bytes_per_param": round(self.minimum_per_param[0], 3),
                "minimum_write_bytes_per_param": round(self.minimum_per_param[1], 3),
                "roofline_read_bytes_per_param": round(self.roofline_per_param[0], 3),
                "roofline_write_bytes_per_param": round(self.roofline_per_param[1], 3),
                "write_bytes_per_1000_steps": 1000 * self.write_total, "formula": self.formula,
                "dram_fetch_bytes": self.dram_fetch_bytes, "dram_state_elems": self.dram_state_elems}
