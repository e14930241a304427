"""The results' GPU page (docs/results/gpu.md): the GPU kit's documents (docs/bench/gpu/*.json, written by
`bash scripts/gpu_check.sh record`): the bench per preset and engine against today's plan, the CUDA constants
and `pytest -m gpu`. Stdlib only (scripts/results.py imports it)."""

from __future__ import annotations

import copy
import json
import os
import tempfile

from results_common import gib, pct, phase_seconds, table
from results_gpu_calls import section_capacity, section_phase_io, section_placements, section_time_rates

from memascend_cli.units import GiB

HEADER = ["run", "peak GiB", "plan GiB", "error", "GPU GiB", "plan GPU", "s/step", "plan s/step", "error",
          "tokens/s", "SSD B/param r / w", "loss 1 -> N"]


def usable(constants: dict | None) -> bool:
    """Whether the plan takes a call's CUDA constants (measured.py refuses those measured before a training step)."""
    from memascend_cli.planner import measured

    return bool(constants) and (constants.get("schema_version") or 1) >= measured.MIN_SCHEMA_VERSION


def ssd_rates(storage: dict) -> tuple[float | None, float | None, str]:
    """(read GB/s, write GB/s, source) the plan takes: memascend's region probe (engine-like queue depths) when the
    call ran it, else dd's (one 4 MiB request in flight)."""
    probe = storage.get("region_probe") or {}
    if probe.get("read_gbps") and probe.get("write_gbps"):
        return probe["read_gbps"], probe["write_gbps"], "prepare-ssd's probe"
    return storage.get("read_gbps"), storage.get("write_gbps"), "dd's probe (one 4 MiB request in flight)"


def _region_probe_text(storage: dict) -> str:
    p = storage.get("region_probe") or {}
    if not p.get("read_gbps"):
        return ""
    return (f", prepare-ssd probe {p['write_gbps']} GB/s write / {p['read_gbps']} GB/s read (queue depth "
            f"{p.get('best_queue_depth', '?')}, {p.get('backend', '?')})")


def _constants_text(constants: dict | None) -> str:
    if usable(constants):
        return "the CUDA constants that call measured"
    if constants:
        return ("the planner's typical CUDA runtime (the call's constants were measured before a training step, "
                "schema 1; these runs are the calibration of that typical value, RUNTIME_CUDA_BYTES in "
                "memascend_cli/planner/host.py, so their memory errors validate nothing)")
    return ("the planner's typical CUDA runtime (RUNTIME_CUDA_BYTES in memascend_cli/planner/host.py; no call "
            "measured it)")


def _replan(doc: dict, run: dict, constants: dict | None, storage: dict) -> dict:
    """Today's plan of a recorded GPU run: the CUDA constants that call measured and the SSD rates its probe
    measured (the bench's region carries no probe of its own)."""
    from memascend_cli.bench.configs import repredict
    from memascend_cli.planner import measured

    doc = copy.deepcopy(doc)
    read, write, _ = ssd_rates(storage)
    if read and write:
        doc["job"].setdefault("timing", {}).update(read_gbps=read, write_gbps=write)
    if not usable(constants):
        return repredict(doc, run)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(constants, f)
    before = os.environ.get(measured.ENV)
    os.environ[measured.ENV] = f.name
    try:
        return repredict(doc, run)
    finally:
        os.unlink(f.name)
        if before is None:
            os.environ.pop(measured.ENV)
        else:
            os.environ[measured.ENV] = before


def bench_rows(kit: dict, phase_ratios: dict[str, list[float]] | None = None) -> tuple[list[list[str]], list[str]]:
    """The table rows and the lines under it; `phase_ratios` collects measured / planned seconds per phase."""
    bench = kit.get("bench") or {}
    storage = bench.get("storage") or {}
    rows, lines = [], []
    for model, by_run in (bench.get("documents") or {}).items():
        peaks, steps_s = {}, {}
        for name, doc in by_run.items():
            for r in doc["runs"]:
                p = _replan(doc, r, kit.get("cuda_constants"), storage)
                if not r["ok"]:
                    rows.append(_failed_row(model, name, r, p))
                    lines.append(_failed_line(model, name, r, p))
                    continue
                t = p.get("time") or {}
                plan_s, sps = t.get("seconds_per_step"), r["seconds_per_step"]
                bpp = r.get("ssd_bytes_per_param") or {}
                losses = r.get("losses") or []
                peaks[name] = r["peak_system_bytes"]
                steps_s[name] = sps
                got, planned = phase_seconds(r, doc["job"]["steps"]), t.get("phase_seconds") or {}
                if got and planned and phase_ratios is not None:
                    for k in got:
                        if planned.get(k):
                            phase_ratios.setdefault(k, []).append(got[k] / planned[k])
                if got and planned:
                    lines.append(f"- {model} {name}, seconds measured / planned: " + ", ".join(
                        f"{k.replace('+', ' + ')} {got[k]:.2f} / {planned[k]:.2f}" for k in got if k in planned)
                        + ".")
                rows.append([f"{model} {name}", gib(r["peak_system_bytes"]), gib(p["host_peak_bytes_per_rank"]),
                             pct(100.0 * (p["host_peak_bytes_per_rank"] / r["peak_system_bytes"] - 1)),
                             gib(r.get("peak_gpu_bytes")), gib(p.get("gpu_peak_bytes")), f"{sps:.2f}",
                             "-" if not plan_s else f"{plan_s:.2f}",
                             "-" if not plan_s else pct(100.0 * (plan_s / sps - 1)), f"{r['tokens_per_s']:.0f}",
                             f"{bpp.get('read', 0):.1f} / {bpp.get('write', 0):.1f}",
                             f"{losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "-"])
        vs = [f"{pct(100.0 * (peaks['memascend'] / peaks[ref] - 1))} vs {ref}" for ref in ("stock", "tuned")
              if ref in peaks and "memascend" in peaks]
        if vs:
            lines.append(f"- {model}: memascend's peak system memory {', '.join(vs)}.")
        times = [f"x{steps_s['memascend'] / steps_s[ref]:.2f} {ref}'s" for ref in ("stock", "tuned")
                 if ref in steps_s and "memascend" in steps_s]
        if times:
            lines.append(f"- {model}: memascend's s/step {', '.join(times)} "
                         f"(one sitting; each the mean of {next(iter(by_run.values()))['job']['steps'] - 1} step(s)).")
        for name, doc in by_run.items():
            for r in doc["runs"]:
                ov = ((r.get("engine_stats") or [{}])[0] or {}).get("overlap")
                if not ov:
                    continue
                norms = ", ".join(f"{g:.2f}" for g in r.get("grad_norms") or [])
                clip = (r.get("config") or {}).get("gradient_clipping", "DeepSpeed's default 1.0")
                lines.append(f"- {model} {name}, the optimizer overlapped with backward: "
                             f"{ov.get('steps_committed', 0)} step(s) committed, {ov.get('steps_redone', 0)} redone, "
                             f"{ov.get('steps_rolled_back', 0)} rolled back, {ov.get('steps_not_speculated', 0)} not "
                             f"speculated; gradient norms {norms or '?'} against clipping at {clip} (a clipped step "
                             "is redone and the next one is not speculated).")
    for d in bench.get("decisions") or []:
        if d.get("reason"):
            lines.append(f"- {d.get('model', '?')}: {d['reason']} (the kit's time budget), so the last engine of "
                         "the call's list did not run.")
    return rows, lines


def _failed_step(r: dict) -> int:
    """The step a failed run died in: the one after its last recorded loss."""
    return len(r.get("losses") or []) + 1


def _failed_row(model: str, name: str, r: dict, p: dict) -> list[str]:
    """A run that failed: its peak until then next to the plan's."""
    peak = r.get("peak_system_bytes")
    return ([f"{model} {name}: failed at step {_failed_step(r)}", gib(peak),
             gib(p["host_peak_bytes_per_rank"]),
             pct(100.0 * (p["host_peak_bytes_per_rank"] / peak - 1)) if peak else "-"]
            + ["-"] * (len(HEADER) - 4))


def _failed_line(model: str, name: str, r: dict, p: dict) -> str:
    planned = p.get("config_errors") or []
    return (f"- {model} {name} failed at step {_failed_step(r)}: `{r.get('error') or '?'}`. "
            + (f"Today's plan of its config predicts it: {planned[0]}." if planned else
               "Today's plan of its config does not predict it."))


def _call_words(c: dict) -> str:
    """A recorded call: its number on its day and the options that say what ran."""
    run = f"`run {c['run_args']}`" if c.get("run_args") else None
    if c.get("call") is None:
        return run or "`run (options not recorded)`"
    return f"call {c['call']}" + (f" ({run})" if run else "")


def section_gpu(docs: list) -> str:
    out = ["## Runs of the GPU kit", ""]
    if not docs:
        out.append("No GPU measurement recorded yet. The kit (`scripts/gpu_check.sh`) runs the GPU tests and the GPU "
                   "bench as device calls; `bash scripts/gpu_check.sh record DIR...` stores their outputs in "
                   "`docs/bench/gpu/`.")
        return "\n".join(out) + "\n"
    phase_ratios: dict[str, list[float]] = {}
    summary_at = len(out)
    for path, kit in docs:
        facts = kit.get("facts") or {}
        torch = facts.get("torch") or {}
        bench = kit.get("bench") or {}
        storage = next((d["storage"] for d in (bench, kit.get("capacity"), kit.get("placements"))
                        if d and d.get("storage")), {})
        # A call's number is the kit's numbering on its day (gpukit/calls.py has reordered them since): its
        # options say what ran.
        calls = "; ".join(_call_words(c) for c in kit["calls"])
        out += [f"### {kit['device']}, {kit.get('measured_at', '?')}", "",
                f"Device calls of `scripts/gpu_check.sh` ({calls}); "
                f"one {kit['device']}, {facts.get('cpu_count', '?')} cores, "
                f"{(facts.get('mem_total_kib') or 0) * 1024 / GiB:.0f} GiB DRAM, kernel {facts.get('kernel', '?')}, "
                f"torch {torch.get('torch', '?')} (CUDA {torch.get('cuda', '?')}); the work disk is "
                f"{storage.get('fstype', '?')} ({storage.get('kind', '?')}), O_DIRECT "
                f"{'ok' if storage.get('o_direct_ok') else 'refused'}, native I/O "
                f"{(storage.get('native_io_backend') or {}).get('backend', '?')}, dd probe "
                f"{storage.get('write_gbps', '?')} GB/s write / {storage.get('read_gbps', '?')} GB/s read"
                + _region_probe_text(storage) + ". "
                f"Raw: `{path}`.", ""]
        if bench.get("documents"):
            rows, lines = bench_rows(kit, phase_ratios)
            first = next(iter(next(iter(bench["documents"].values())).values()))
            j = first["job"]
            out += [f"`memascend bench` per engine, random weights, {j['dtype']}, seq {j['seq_len']}, micro-batch "
                    f"{j['micro_batch']}, {j['steps']} steps, loss {j.get('loss', 'hf')}. Peak = system memory above "
                    "idle; GPU = torch's peak allocated. Plan = today's planner on each run's config with "
                    + _constants_text(kit.get("cuda_constants"))
                    + f" and the SSD rates of {ssd_rates(storage)[2]} (the time model's compute is the "
                    f"device table's {(j.get('timing') or {}).get('device_source', '?')}). s/step averages the steps "
                    "after the first.", "", table(HEADER, rows), ""] + lines + [""]
        out += section_phase_io(bench)
        c = kit.get("cuda_constants")
        if c:
            out += [f"CUDA constants (`scripts/gpukit/cuda_constants.py`): host runtime "
                    f"{gib(c['host_runtime_bytes'])} GiB (of it CUDA {gib(c.get('host_cuda_bytes'))} GiB), CUDA "
                    f"context on the GPU {gib(c['cuda_context_gpu_bytes'])} GiB with NCCL "
                    f"({gib(c.get('cuda_context_gpu_bytes_bare'))} GiB bare).", ""]
            out += section_time_rates(c)
        if kit.get("capacity"):
            out += section_capacity(kit["capacity"])
        if kit.get("placements"):
            out += section_placements(kit["placements"])
        t = kit.get("tests")
        if t:
            skipped = sorted({c["message"] for c in t["cases"] if c["outcome"] == "skipped"})
            failed = [c["test"] for c in t["cases"] if c["outcome"] == "failed"]
            out += [f"`pytest -m gpu`: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped"
                    + (f" ({'; '.join(skipped)})" if skipped else "") + "."
                    + (f" Failed: {', '.join(failed)}." if failed else ""), ""]
    if phase_ratios:
        spans = [f"{k.replace('+', ' + ')} x{min(v):.2f}-{max(v):.2f}" for k, v in phase_ratios.items()]
        out[summary_at:summary_at] = [
            f"Measured over planned seconds per phase, every GPU run below ({len(next(iter(phase_ratios.values())))} "
            f"runs): {', '.join(spans)}. Where forward + backward runs long, the parameter fetches reach less than "
            "the bandwidth the plan takes (a likely cause, not measured yet: they keep fewer requests in flight than "
            "the probe's best queue depth).", ""]
    return "\n".join(out) + "\n"
