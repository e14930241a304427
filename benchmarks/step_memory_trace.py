"""Where a user script's host memory goes inside DeepSpeed (calibration: it finds what the plan misses, the user-script
validation of benchmarks/user_script_bench.py never reads it). Runs a training script in this process with a list of
DeepSpeed methods wrapped: at each call's entry and exit it records the process's RSS, its high-water mark during the
call (VmHWM, reset at entry through /proc/self/clear_refs and carried up to the enclosing call) and glibc's mallinfo2
(heap in use, heap kept free, mmapped), so a phase's peak is split down to the DeepSpeed call that makes it.

    python benchmarks/step_memory_trace.py --out OUT.json.gz -- benchmarks/ds_llama_script.py --model-dir DIR ...

A script run under `accelerate launch` is traced by launching this file with the script after `--`.

The traces under docs/bench/user-script/trace/ are named SCRIPT-CKPT-DTYPE-BUILD (ds-ckpt-bf16-zero: the DeepSpeed
script, checkpointed, bf16, built under zero.Init); conversion_heap_fit turns the 16-bit ones into the planner's
GRAD_CONVERSION_HEAP_FRACTION (memascend_cli/planner/heap.py; tests/unit/test_user_script_bench.py re-fits it).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import gzip
import importlib
import json
import runpy
import sys
import time

# DeepSpeed's calls from deepspeed.initialize to the end of the first optimizer step on the NVMe-offload path (stock),
# by module and qualified name (a module's own function without a class); a name a DeepSpeed version lacks is skipped
# and listed as missing.
TRACED = {
    "deepspeed": ["initialize"],
    "deepspeed.runtime.zero.partition_parameters": ["Init._convert_to_zero_parameters"],
    "deepspeed.runtime.engine": ["DeepSpeedEngine.forward", "DeepSpeedEngine.backward", "DeepSpeedEngine.step"],
    "deepspeed.runtime.zero.stage3": [
        "DeepSpeedZeroOptimizer_Stage3._DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads",
        "DeepSpeedZeroOptimizer_Stage3.partition_grads",
        "DeepSpeedZeroOptimizer_Stage3._swap_out_offload_fp32_gradients",
        "DeepSpeedZeroOptimizer_Stage3.independent_gradient_partition_epilogue",
        "DeepSpeedZeroOptimizer_Stage3._create_fp32_partitions",
        "DeepSpeedZeroOptimizer_Stage3.initialize_optimizer_states",
        "DeepSpeedZeroOptimizer_Stage3.step", "DeepSpeedZeroOptimizer_Stage3._pre_step",
        "DeepSpeedZeroOptimizer_Stage3._get_norm_groups",
        "DeepSpeedZeroOptimizer_Stage3._prepare_sub_group", "DeepSpeedZeroOptimizer_Stage3.unscale_and_clip_grads",
        "DeepSpeedZeroOptimizer_Stage3._optimizer_step", "DeepSpeedZeroOptimizer_Stage3._release_sub_group",
        "DeepSpeedZeroOptimizer_Stage3._reassign_or_swap_out_partitioned_parameters",
        "DeepSpeedZeroOptimizer_Stage3._post_step"],
    "deepspeed.ops.adam.cpu_adam": ["DeepSpeedCPUAdam.step"],
}


class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = Mallinfo2


def _status_kib() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0])
    return out


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS (Documentation/filesystems/proc.rst)


def _snapshot() -> dict:
    s, m = _status_kib(), _libc.mallinfo2()
    return {"rss_mib": round(s["VmRSS"] / 1024, 1), "anon_mib": round(s["RssAnon"] / 1024, 1),
            "heap_used_mib": round(m.uordblks / 2**20, 1), "heap_free_kept_mib": round(m.fordblks / 2**20, 1),
            "mmapped_mib": round(m.hblkhd / 2**20, 1)}


class Tracer:
    """Call records in order; each call's peak is the largest RSS from its entry to its exit."""

    def __init__(self):
        self.records: list[dict] = []
        self.stack: list[dict] = []
        self.t0 = time.monotonic()

    def enter(self, name: str) -> dict:
        hwm = _status_kib()["VmHWM"] / 1024
        for frame in self.stack:  # what happened since the last reset belongs to every open call
            frame["peak_mib"] = max(frame["peak_mib"], hwm)
        _reset_hwm()
        rec = {"call": name, "depth": len(self.stack), "t_s": round(time.monotonic() - self.t0, 3),
               "enter": _snapshot()}
        rec["peak_mib"] = rec["enter"]["rss_mib"]
        self.stack.append(rec)
        return rec

    def exit(self, rec: dict) -> None:
        hwm = _status_kib()["VmHWM"] / 1024
        for frame in self.stack:
            frame["peak_mib"] = max(frame["peak_mib"], hwm)
        self.stack.pop()
        rec["exit"] = _snapshot()
        rec["peak_mib"] = round(rec["peak_mib"], 1)
        rec["dur_s"] = round(time.monotonic() - self.t0 - rec["t_s"], 3)
        self.records.append(rec)

    def wrap(self, fn, name: str):
        @functools.wraps(fn)
        def traced(*args, **kwargs):
            rec = self.enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.exit(rec)
        return traced


def install(tracer: Tracer) -> list[str]:
    """Wraps every TRACED method that exists; returns the names that do not."""
    missing = []
    for module_name, names in TRACED.items():
        module = importlib.import_module(module_name)
        for qual in names:
            cls_name, attr = qual.split(".", 1) if "." in qual else (None, qual)
            cls = getattr(module, cls_name, None) if cls_name else module
            if cls is None or attr not in vars(cls):
                missing.append(f"{module_name}.{qual}")
                continue
            setattr(cls, attr, tracer.wrap(vars(cls)[attr], qual.split("__")[-1]))
    return missing


# The plan's items for the heap glibc keeps free when an optimizer step starts (memascend_cli/planner/heap.py): what a
# trace's free-kept heap there is compared with.
KEPT_HEAP_ITEMS = ("host/zero_init_heap", "host/optimizer_init_heap", "host/allocator_retention", "host/step_heap",
                   "host/activation_heap")


def trace_job(path: str) -> dict:
    """The job a trace ran, from its file name SCRIPT-CKPT-DTYPE-BUILD: script, checkpointing, dtype, zero_init (the
    fields of benchmarks/user_script_bench.py's Job). Pure."""
    name = path.rsplit("/", 1)[-1].split(".", 1)[0]
    script, ckpt, dtype, build = name.split("-")
    return {"script": script, "checkpointing": ckpt == "ckpt", "dtype": dtype, "zero_init": build == "zero"}


def step_entry_kept_heap_bytes(trace: dict) -> int:
    """glibc's free-kept heap (mallinfo2 fordblks) at the entries of DeepSpeedEngine.step, the most over the traced
    steps: the planner's retained items lie under the first step and every later backward alike. Pure."""
    kept = [r["enter"]["heap_free_kept_mib"] for r in trace["calls"] if r["call"] == "DeepSpeedEngine.step"]
    return int(max(kept) * 2**20)


def conversion_heap_fit(rows: list[tuple[int, int, int]]) -> float:
    """GRAD_CONVERSION_HEAP_FRACTION from (step_entry_kept_heap_bytes, the plan's KEPT_HEAP_ITEMS, fp32 bytes of the
    parameter partitions below the mmap threshold) of each 16-bit trace: a ratio of sums, two decimals. Pure."""
    return round(sum(kept - planned for kept, planned, _ in rows) / sum(base for _, _, base in rows), 2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT ARGS...")
    args = ap.parse_args(argv)
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    command = "python benchmarks/step_memory_trace.py " + " ".join(sys.argv[1:] if argv is None else argv)
    tracer = Tracer()
    missing = install(tracer)
    sys.argv = script
    error = None
    try:
        runpy.run_path(script[0], run_name="__main__")
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the trace up to a failure is still the record
        error = repr(e)
    # A trace is a call per line of thousands: OUT.json.gz writes it gzipped, as the repository keeps such records.
    with (gzip.open(args.out, "wt") if args.out.endswith(".gz") else open(args.out, "w")) as f:
        json.dump({"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "script": script, "missing": missing, "error": error, "status_kib_end": _status_kib(),
                   "calls": tracer.records}, f, separators=(",", ":"))
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
