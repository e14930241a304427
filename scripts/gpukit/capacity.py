"""The capacity call's phase: under a DRAM cap (a memory cgroup on the GPU machine, v1 or v2; the kit first checks
it can make one there and records why not), tuned stock's longest context by `memascend bench --capacity seq`,
then one memascend run at twice it. Both bars of the issue in one call: memascend's longest context >= 2x tuned's,
and tuned's planned maximum within one grid step of the measured one and not OOM-killed at it. Whatever finished
is recorded (gpu_capacity.json): a search the call's time cut off keeps the probes that ended.

A dry run writes gpu_capacity.json too, marked synthetic: the plan's peaks stand in for the measured ones
(pure.rehearsal_run), so `record` and the results page run on the shape a GPU call writes."""

from __future__ import annotations

import glob
import json
import os
import sys

from gpukit.bench import SYNTHETIC_HARDWARE, plan_doc, sampled_run, ssd_rate_args
from gpukit.kit import Kit
from gpukit.pure import (CAPACITY_STEPS, DEFAULT_DISK_GBPS, REPO, SEQ_GRID_TOKENS, WEIGHTS, GiB, capacity_probe,
                         capacity_summary, estimate_run_s, grid_max_under, linear_bytes, memascend_probe_value,
                         parse_planned_max, rehearsal_run, run_timeout_s)

CAPACITY_FILE = "gpu_capacity.json"
CGROUP_PROBE = (
    "import json, subprocess\n"
    "from memascend_cli.run.cgroup import MemoryCap\n"
    "try:\n"
    "    with MemoryCap(256 << 20, label='kit-probe') as c:\n"
    "        subprocess.run(['true'], preexec_fn=c.join, check=True)\n"
    "        print(json.dumps({'ok': True, 'version': c.version, 'path': c.path, 'swap_limited': c.swap_limited}))\n"
    "except Exception as exc:\n"
    "    print(json.dumps({'ok': False, 'error': f'{type(exc).__name__}: {exc}'[:400]}))\n")
"""Makes the memory cgroup a capped bench run makes (run/cgroup.py MemoryCap: v2 where the unified hierarchy has
the memory controller, else v1), moves a child into it and removes it."""
MEMASCEND_RESERVE = 1.25
"""tuned's search leaves this many of memascend's probe estimates for it (the probe may still run to twice its
estimate, within what is left)."""
PLAN_SHORT_FACTOR = 1.5
"""A probe's steps are budgeted at the plan's s/step x this: the plan's GPU s/step has run 17-37% short
(docs/results/gpu.md)."""


def cap_bytes(text: str) -> int:
    """Bytes of a cap given in GiB ("8GiB"); ValueError otherwise. Pure."""
    if not text.endswith("GiB"):
        raise ValueError(f"--dram-cap {text}: give it in GiB, e.g. 8GiB")
    return int(float(text[:-3]) * GiB)


def cgroup_probe(kit: Kit) -> dict:
    py = kit.py if os.path.isfile(kit.py) else sys.executable
    if kit.dry_run:
        print(f"[capacity] $ {py} -c '<make a 256 MiB memory cgroup (run/cgroup.py MemoryCap), move `true` into it, "
              "remove it>'   (v1 or v2; recorded, the capacity phase stops here when it cannot)")
        return {"ok": True, "synthetic": True}
    rc, out, err = kit.capture([py, "-c", CGROUP_PROBE], timeout=60, env={"PYTHONPATH": REPO})
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"ok": False, "error": f"rc {rc}: {err.strip()[-400:]}"}


def _bench(kit: Kit, model: str, run: str, out: str, *extra: str) -> list[str]:
    return [kit.py, "-m", "memascend_cli", "bench", "--model", model, "--runs", run, "--dram-cap", kit.args.dram_cap,
            "--steps", str(CAPACITY_STEPS), "--accelerator", kit.args.accelerator, "--gradient-clipping", "0",
            "--settle-cap", str(kit.args.settle_cap_s), *extra, "--out", out, "--json"]


def tuned_probes(out: str) -> list[dict]:
    """The probes a (possibly cut-off) `bench --capacity seq` left: OUT/tuned/seq-<value>/bench.json."""
    probes = []
    for path in glob.glob(os.path.join(out, "tuned", "seq-*", "bench.json")):
        try:
            with open(path) as f:
                runs = json.load(f).get("runs") or []
        except (OSError, json.JSONDecodeError):
            continue  # a probe cut off before its document
        if runs:
            probes.append(capacity_probe(int(path.split(os.sep)[-2].removeprefix("seq-")), runs[0]))
    return probes


def phase_capacity(kit: Kit) -> bool:
    model = kit.args.models.split(",")[0]
    cg = cgroup_probe(kit)
    if not cg.get("ok"):
        kit.log(f"capacity: no memory cgroup can be made here ({cg.get('error')}): no capped run; recorded")
        _write(kit, {"schema_version": 1, "model": model, "dram_cap": kit.args.dram_cap, "cgroup": cg})
        return False
    plan = CapacityPlan(kit, model)
    guess = memascend_probe_value(plan.tuned_max, True, plan.tuned_max)[0] or 2 * 65536
    out = os.path.join(kit.ssd, "capacity")
    tuned_probe_s = plan.probe_s("tuned", plan.tuned_max or 65536)
    rec = kit.run("capacity-tuned", _bench(kit, model, "tuned", out, "--capacity", "seq", "--probe-timeout",
                                           f"{run_timeout_s(tuned_probe_s, 1e9):.0f}"),
                  cap_s=max(tuned_probe_s, kit.remaining() - MEMASCEND_RESERVE * plan.probe_s("memascend", guess)),
                  cwd=REPO,
                  echo_lines=40, stdout_path=os.path.join(kit.work, "logs", "capacity-tuned.json"))
    if kit.dry_run:
        planned, probes, ended = plan.tuned_max, plan.synthetic_search(), True
    else:
        log = os.path.join(kit.work, "logs", "capacity-tuned.log")  # none when the search was skipped
        with open(log if os.path.exists(log) else os.devnull, errors="replace") as f:
            planned = parse_planned_max(f.read(), "tuned")[1]
        probes, ended = tuned_probes(out), rec.status in ("ok", "failed")
    best = max((q["value"] for q in probes if q["outcome"] == "fit"), default=None)
    value, basis = memascend_probe_value(best, ended, planned)
    probe = None
    if value:
        m_out = os.path.join(out, "memascend", f"seq-{value}")
        est = plan.probe_s("memascend", value)
        mrec, io = sampled_run(kit, "capacity-memascend", _bench(kit, model, "memascend", m_out, "--seq-len",
                                                                 str(value)),
                               m_out, CAPACITY_STEPS, cap_s=run_timeout_s(est, 1e9), min_s=min(est, 60.0))
        probe = plan.synthetic_probe("memascend", value) if kit.dry_run else _memascend_probe(m_out, value,
                                                                                            mrec.status, io)
    summary = capacity_summary(model=model, cap=kit.args.dram_cap, cgroup=cg, tuned_planned=planned,
                               tuned_probes=probes, tuned_stopped_by=STOPPED_BY[rec.status], memascend_value=value,
                               memascend_basis=basis, memascend_probe=probe)
    _write(kit, {**summary, "weights": WEIGHTS, "plan_line": plan.lines,
                 **({"synthetic": True} if kit.dry_run else {})})
    kit.log("capacity: " + json.dumps(summary["verdict"]))
    return bool(probes) and probe is not None


STOPPED_BY = {"ok": "its search ended", "failed": "its search ended (a probe failed other than by an OOM kill)",
              "timeout": "the call's time", "skipped": "not run (no time left)",
              "dry-run": "its search ended (synthetic)"}


def _memascend_probe(out: str, value: int, status: str, io: dict) -> dict:
    try:
        with open(os.path.join(out, "bench.json")) as f:
            return {**capacity_probe(value, json.load(f)["runs"][0]), "phase_io": io}
    except (OSError, json.JSONDecodeError, KeyError, IndexError):
        return {"value": value, "outcome": "failed", "error": f"{status}: no bench.json"}


class CapacityPlan:
    """The plan of the capacity job on this machine (a dry run: on the lent one, SYNTHETIC_HARDWARE) at two contexts:
    per engine the node's host peak, a line through them. It gives the call's time budget (tuned's maximum under the
    cap as the line has it, each probe's seconds from the plan's s/step there) and, in a dry run, the synthetic
    probes (a probe fits where the line stays within the cap). bench --capacity starts from its own planned maximum."""

    SEQS = (2048, 65536)

    def __init__(self, kit: Kit, model: str):
        self.kit, self.model, self.cap = kit, model, cap_bytes(kit.args.dram_cap)
        self.args = list(SYNTHETIC_HARDWARE) if kit.dry_run else ssd_rate_args(kit.storage)
        docs = [self._plan(s) for s in self.SEQS]
        self.num_params = int(docs[0]["model"]["num_params"]) if docs[0] else int(5e8)
        peaks = {e: [((d or {}).get("engines", {}).get(e) or {}).get("node_host_peak_bytes") for d in docs]
                 for e in ("tuned", "memascend")}
        self.lines = {} if any(None in v for v in peaks.values()) else {
            e: [(s, int(b)) for s, b in zip(self.SEQS, v)] for e, v in peaks.items()}
        if not self.lines and kit.dry_run:
            raise RuntimeError(f"memascend plan of {model} has no host peak per engine: no synthetic capacity output")
        self.tuned_max = grid_max_under(self.lines["tuned"], self.cap) if self.lines else None

    def _plan(self, seq: int) -> dict | None:
        return plan_doc(self.kit, self.model, "--seq-len", str(seq), "--dram-cap", self.kit.args.dram_cap,
                        "--no-search", *self.args)

    def probe_s(self, engine: str, seq: int) -> float:
        """Seconds of one probe: start-up and the init's SSD writes (estimate_run_s of no step), then its steps at the
        plan's s/step there x PLAN_SHORT_FACTOR; without a planned s/step, the kit's I/O model grown with the
        context like the sweep's."""
        gbps = min([g for g in (self.kit.storage.get("read_gbps"), self.kit.storage.get("write_gbps")) if g]
                   or [DEFAULT_DISK_GBPS])
        doc = self._plan(seq) or {}
        s = (((doc.get("time") or {}).get("engines") or {}).get(engine) or {}).get("seconds_per_step")
        if s:
            return estimate_run_s(self.num_params, 0, gbps) + CAPACITY_STEPS * PLAN_SHORT_FACTOR * s
        return estimate_run_s(self.num_params, CAPACITY_STEPS, gbps) * max(1.0, seq / 2048) ** 0.5

    def synthetic_probe(self, engine: str, value: int) -> dict:
        peak = linear_bytes(self.lines[engine], value)
        return capacity_probe(value, rehearsal_run(fits=peak <= self.cap, peak_bytes=min(self.cap, peak),
                                                   planned_bytes=peak, steps=CAPACITY_STEPS, seconds_per_step=None))

    def synthetic_search(self) -> list[dict]:
        """tuned's search as the plan has it go: a fit at its maximum, no fit one grid step above."""
        p = self.tuned_max
        return [] if p is None else [self.synthetic_probe("tuned", v) for v in (p, p + SEQ_GRID_TOKENS)]


def _write(kit: Kit, doc: dict) -> None:
    with open(os.path.join(kit.out_dir, CAPACITY_FILE), "w") as f:
        json.dump({**doc, "storage": kit.storage, "facts": kit.facts}, f, indent=1)
