"""The results' micro-benchmark page (docs/results/micro.md), the component measurements: the micro-benchmarks under
benchmarks/, the data path's memory, stock DeepSpeed's buffers and the checksums on the SSD data path. Imported by
scripts/results.py."""

from __future__ import annotations

import json
import os

from memascend_cli.units import GiB
from results_common import REPO, benchmark_script, load_one, table


def section_ds_buffers() -> str:
    path = os.path.join(REPO, "tests", "assets", "deepspeed_measured.json")
    with open(path) as f:
        doc = json.load(f)
    keys = ["P1_param_swap_pool", "P2_partitioned_swap_buffer", "P3_fp16_cpu_params", "P4_optimizer_swap_pool",
            "P5_grad_flat_buffer"]
    rows = []
    for name, case in sorted(doc["cases"].items()):
        rows.append([name, case["dtype"]] + [f"{case['measured_bytes'][k]:,}" for k in keys]
                    + [f"{case['vmlck_kib']['after_initialize']:,} kB"])
    return "\n".join([
        "## Planner: stock DeepSpeed's real buffers", "",
        "`benchmarks/measure_ds_buffers.py` runs stock DeepSpeed ZeRO-3 (params + optimizer on NVMe) and reads the "
        "buffers it allocated; the planner's baseline items equal them to the byte "
        "(`tests/unit/test_planner_vs_deepspeed.py`, re-measured live by `tests/integration/test_deepspeed_buffers.py`). "
        "Raw: `tests/assets/deepspeed_measured.json`.", "",
        table(["case", "dtype", "P1 param pool", "P2 swap buffer", "P3 params in DRAM", "P4 optimizer pool",
               "P5 grad buffer", "VmLck"], rows), ""]) + "\n"


def section_checksums(runs: list) -> str:
    if not runs:
        return ""
    out = ["## Checksums on the SSD data path", "", "`benchmarks/checksum_bench.py`; raw: " +
           ", ".join(f"`{p}`" for p, _ in runs) + ".", ""]
    rows = []
    for path, doc in runs:
        rows.append([f"`{os.path.basename(path)}` ({doc.get('measured_at', '?')})",
                     f"{doc['crc32c']['gbps']:.1f}", f"{doc['crc32c_portable']['gbps']:.1f}",
                     f"{doc['raw_io']['write_gbps']:.2f} / {doc['raw_io']['read_gbps']:.2f}",
                     f"{doc['store_verify_on']['write_gbps']:.2f} / {doc['store_verify_on']['read_gbps']:.2f}",
                     f"{doc['store_verify_off']['write_gbps']:.2f} / {doc['store_verify_off']['read_gbps']:.2f}"])
    out.append(table(["run", "CRC-32C SSE4.2 GB/s", "portable GB/s", "raw O_DIRECT w / r GB/s",
                      "store, verify on w / r", "store, verify off w / r"], rows))
    return "\n".join(out) + "\n"


def section_micro(runs: list) -> str:
    """The outputs of benchmarks/io_bench.py, scan_bench.py, zero_init_heap.py, layer_backward_memory.py,
    layer_saved_tensors.py."""
    import statistics

    out = []
    for path, doc in runs:
        if doc.get("kind") == "io_bench":
            res = doc["results"]
            tools = sorted({t for op in res.values() for t in op})
            rows = [[op] + [f"{statistics.median(res[op][t]):.2f}" if t in res[op] else "-" for t in tools]
                    for op in res]
            out += ["## Native core: O_DIRECT I/O engine vs fio vs DeepSpeed's aio op", "", f"`{doc['command']}` "
                    f"({doc['date']}); GB/s, median of the repeats; a virtio disk, not NVMe. Raw: `{path}`.", "",
                    table(["op"] + tools, rows), ""]
        elif doc.get("kind") == "scan_bench":
            rows = []
            for r in doc["results"]:
                s_, t_ = statistics.median(r["scan_s"]), statistics.median(r["torch_s"])
                rows.append([r["dtype"], f"{s_ * 1e3:.1f}", f"{t_ * 1e3:.1f}", f"{t_ / s_:.1f}x",
                             f"{r['scan_extra_mib']:.1f} / {r['torch_extra_mib']:.1f}", str(r["agree"])])
            out += ["## Native core: fused non-finite scan vs torch", "", f"`{doc['command']}` ({doc['date']}), "
                    f"{doc['numel']:,} elements, inf at {doc['special']}. Raw: `{path}`.", "",
                    table(["dtype", "scan ms", "isinf|isnan ms", "speed-up", "extra peak MiB scan / torch", "agree"],
                          rows), ""]
        elif doc.get("kind") == "zero_init_heap":
            groups: dict = {}
            for c in doc["cases"]:
                groups.setdefault((c["model"], c["layers"], c["dtype"]), []).append(c)
            rows = [[m, str(L), dt, " / ".join(f"{c['free_kept_bytes'] / GiB:.2f}" for c in cs),
                     f"{cs[0]['predicted_bytes'] / GiB:.2f}"] for (m, L, dt), cs in groups.items()]
            out += [f"## Stock zero.Init: heap kept by the allocator, {doc['date'][:10]}", "", f"{doc['title']}. `{doc['command']}` "
                    f"({doc['date']}, {doc['libc']}); one fresh process per measurement; the plan's "
                    "`host/zero_init_heap` item is the upper mode. Raw: `" + path + "`.", "",
                    table(["model", "layers", "dtype", "kept GiB (repeats)", "plan GiB"], rows), ""]
        elif doc.get("kind") == "layer_backward_memory":
            layer = doc["part"] == "layer"
            what = {"layer": "One recomputed decoder layer's backward", "loss-hf": "The LM head and transformers' loss",
                    "loss-chunked": "The LM head and memascend's chunked loss", "loss-trl": "TRL's fused LM head",
                    "head-hf": "The model's top (last layer's output, final RMSNorm), LM head and transformers' loss",
                    "head-chunked": "The model's top, LM head and memascend's chunked loss"}[doc["part"]]
            rows = [[r["model"], f"{r['tokens']:,}", f"{r['peak_rise_bytes'] / 2**20:.1f}",
                     f"{r['planned_bytes'] / 2**20:.1f}", f"{100 * r['plan_error']:+.1f}%"]
                    + ([f"{r['korthikanti_layer_activation_bytes'] / 2**20:.1f}"] if layer else []) for r in doc["rows"]]
            out += [f"## {what} on the CPU, {doc['dtype']}", "",
                    f"`{doc['meta']['command']}` ({doc['meta']['date']}); peak RSS rise of a fresh process over its "
                    "forward + backward (glibc's mmap threshold at 64 KiB), the least of the repeats, against the "
                    "plan's moment" + (" and Korthikanti et al.'s activations of one layer" if layer else "")
                    + ". Raw: `" + path + "`.", "", table(["model", "tokens", "measured MiB", "plan MiB", "plan error"]
                                                          + (["Korthikanti MiB"] if layer else []), rows), ""]
        elif doc.get("kind") == "layer_saved_tensors":
            rows = [[r["case"], r["dtype"], f"{r['micro_batch'] * r['seq_len']:,}",
                     f"{r['measured_bytes'] / 2**20:.2f}", f"{r['planned_bytes'] / 2**20:.2f}",
                     f"{r['error_percent']:+.2f}%"] for r in doc["cases"]]
            out += [f"## {doc['title']}", "", f"`{doc['command']}` ({doc['date']}, torch {doc['versions']['torch']}, "
                    f"transformers {doc['versions']['transformers']}); the distinct storages autograd saves in one "
                    "LlamaDecoderLayer's forward (SDPA), its parameters left out, against the plan's "
                    "layer_saved_bytes. Raw: `" + path + "`.", "",
                    table(["layer", "dtype", "tokens", "measured MiB", "plan MiB", "plan error"], rows), ""]
    return "\n".join(out) + ("\n" if out else "")


def section_data_path(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    rel = os.path.relpath(path, REPO)
    return "\n".join([
        "## Data path: host memory against dataset size", "",
        f"`python benchmarks/data_path_memory.py --tokens 2e6,2e7 --out {rel}`", "",
        "Each size: a synthetic JSONL text dataset is tokenized into the cache as `memascend train` does before the "
        "launch, then a fresh child process opens the cache as a rank does and reads every micro-batch of a full "
        "epoch in the worker's order, as torch tensors. \"data path peak\" is VmHWM after the epoch minus VmRSS "
        "before it (/proc/self/status); \"cache pages mapped\" is the largest resident size of the cache's mappings "
        f"in /proc/self/smaps. Raw data: `{rel}`.", "",
        benchmark_script("data_path_memory").table(doc), ""]) + "\n"
