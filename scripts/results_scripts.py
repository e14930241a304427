"""Sections of the ecosystem page (docs/results/ecosystem.md) for a user's own DeepSpeed script: the plan against
scripts that build their model outside zero.Init (docs/bench/user-script/), the script under the DRAM cap the plan
recommends, the host memory of DeepSpeed's just-in-time op build, and a script whose own ZeRO-3 CPU offload fits in
DRAM, stock against install() (docs/bench/placement/). Imported by scripts/results.py. Stdlib only."""

from __future__ import annotations

import os

from results_common import BENCH, benchmark_script, gib, load, load_one, table

USER_SCRIPT = os.path.join(BENCH, "user-script")
ROLES = {"fp32-eager-156m.json": "calibration of the DRAM cap's measured spread",
         "validation-eager.json.gz": "validation (not fitted on)",
         "matrix.json.gz": "validation (not fitted on): every script, dtype, build and checkpointing",
         "matrix-stock.json.gz": "validation (not fitted on): stock DeepSpeed on the same combinations"}


def section_eager_scripts() -> str:
    """Each harness document of docs/bench/user-script/ (benchmarks/user_script_bench.py renders its table), the
    capped runs and the op build."""
    docs = [(p, d) for p, d in load(os.path.join(USER_SCRIPT, "*.json")) if "sittings" in d]
    if not docs:
        return ""
    usb = benchmark_script("user_script_bench")
    out = ["## Plan accuracy on a user's scripts: dtypes, builds, checkpointing", "",
           "`memascend plan --model-init zero|eager|from-pretrained --full-logits`: under `zero.Init`, or the whole "
           "model built in fp32 (transformers' default) or loaded by `from_pretrained` before `deepspeed.initialize` "
           "partitions it; the script's own loss over the full logits. Scripts: `ds` DeepSpeed's API "
           "(benchmarks/ds_llama_script.py), `hf` the HF Trainer (tests/integration/hf_trainer_job.py; `zero`: "
           "`AutoModelForCausalLM.from_config` after `TrainingArguments`), `accelerate` the same under `accelerate "
           "launch`. memascend through `install()`; DeepSpeed's ops built beforehand.", ""]
    for path, doc in docs:
        name = os.path.basename(path)
        out += [f"### {doc['title']}: {ROLES.get(name, doc['use'])}", "",
                "; ".join(f"`{s['command']}` ({s['date']})" for s in doc["sittings"])
                + f" on {doc['host']} ({doc['machine']['cpus']} CPUs). Raw: `{path}`.", "",
                usb.table(doc, usb.todays_plans(doc)), ""]
    out += _capped(load_one(os.path.join(USER_SCRIPT, "capped-156m.json")))
    out += _op_build(load_one(os.path.join(USER_SCRIPT, "op-build-cpu-adam.json")))
    return "\n".join(out) + "\n"


def _capped(doc: dict | None) -> list[str]:
    if doc is None:
        return []
    rows = [[str(r["run"]), r["date"], gib(r["cap_bytes"]), gib(r["cgroup_max_usage_bytes"]), str(r["steps"]),
             str(r["exit_code"]), "yes" if r["valid"] else f"no: {r['why_not']}"] for r in doc["runs"]]
    return [f"### {doc['title']}", "",
            f"`{doc['command']}`; cap: {doc['cap']}. Valid runs that trained every step: "
            f"{doc['valid_runs_trained_all_steps']} of {doc['valid_runs']}.", "",
            table(["run", "date", "cap GiB", "cgroup max usage GiB", "steps", "exit", "valid"], rows), ""]


def _op_build(doc: dict | None) -> list[str]:
    if doc is None:
        return []
    top = doc["largest_process_sampled"]
    return [f"### {doc['title']}", "",
            f"`{doc['command']}` ({doc['date']}, {doc['host']}): the loading process peaked at "
            f"{gib(doc['loader_maxrss_bytes'])} GiB, its largest child (the compiler, `{top['name'].split()[0]}`) at "
            f"{gib(doc['largest_child_maxrss_bytes'])} GiB, the whole process tree at {gib(doc['max_tree_rss_bytes'])} "
            f"GiB; {doc['wall_s']:.0f} s. A script's first run builds the op inside the job's memory: a wait4 "
            "ru_maxrss then reports the compiler's.", ""]


def section_cpu_offload_install() -> str:
    """A user's ZeRO-3 CPU-offload script, stock against install(placement='auto'): every run, the medians, the
    ratios."""
    docs = load(os.path.join(BENCH, "placement", "*.json"))
    if not docs:
        return ""
    out = ["## A user's CPU offload that fits in DRAM: stock against install()", ""]
    for path, doc in docs:
        j, m = doc["job"], doc["machine"]
        rows = [[r["engine"], str(r["repeat"]), f"{r['s_per_step']:.2f}", gib(r["ru_maxrss_bytes"]),
                 gib(r["peak_system_bytes"]), gib(r["others_rss_change_at_peak_bytes"]),
                 "-" if r["region_bytes_read"] is None else str(r["region_bytes_read"])] for r in doc["runs"]]
        ratio = doc["install_over_stock"]
        out += [f"### {doc['title']}", "",
                f"`{doc['command']}` on {doc['host']} ({m['cpus']} CPUs, {m['cpu_model']}), {doc['date']}; load "
                f"average at the end {', '.join(f'{x:.1f}' for x in m['load_avg_at_end'])}. Job: a "
                f"{j['model']['num_hidden_layers']}-layer Llama (hidden {j['model']['hidden_size']}), {j['dtype']}, "
                f"seq {j['seq_len']}, micro-batch {j['micro_batch']}, {j['steps']} steps, offload {j['offload']}. "
                f"Raw: `{path}`.", "",
                table(["engine", "repeat", "s/step", "ru_maxrss GiB", "system peak GiB", "others' RSS change GiB",
                       "region bytes read"], rows), "",
                f"install / stock, medians: s/step x{ratio['s_per_step']:.3f}, ru_maxrss "
                f"x{ratio['ru_maxrss_bytes']:.3f}, "
                f"system peak x{ratio['peak_system_bytes']:.3f} (the system peak moves with other processes' RSS, "
                "the column beside it).", ""]
    return "\n".join(out) + "\n"
