"""How much heap stock DeepSpeed's zero.Init and the weights pass after it leave free but kept by glibc, per model: the
data behind the planner's host/zero_init_heap item (memascend_cli/planner/heap.py zero_init_heap_bytes).

Each case builds the model under deepspeed.zero.Init with the bench's tuned-stock config (params and optimizer on
NVMe, every layer swapped out) in a fresh process, writes its weights once more a module at a time (as transformers
does after its zero.Init) and reads glibc's mallinfo2 before, between and after: free_kept_bytes (zero.Init) and
weights_pass_free_kept_bytes (the pass) are heap the process still holds (it counts in RSS) though no tensor uses it.

Usage (CPU; a few seconds to a minute per case):
    DS_ACCELERATOR=cpu python benchmarks/zero_init_heap.py --nvme-dir /var/tmp/zi \\
        --case bench-llama-136m:8 --case smollm2-360m --repeat 2 --out docs/bench/micro/zero-init-heap-weights-pass.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

from memascend_cli.units import GiB


def child(model: str, layers: int, dtype: str, nvme_dir: str) -> dict:
    from memascend_engine.procfs import malloc_state, single_rank_defaults, status_kib

    single_rank_defaults()
    from memascend_cli.bench.configs import build_ds_config
    from memascend_cli.models import load_model

    spec = load_model(model)
    if layers:
        spec = spec.scaled(layers)
    os.makedirs(nvme_dir, exist_ok=True)
    cfg = build_ds_config("tuned", spec, micro_batch=1, dtype=dtype, nvme_dir=nvme_dir, ranks=1)
    os.environ["DS_PIN_MEMORY_BACKEND"] = "native"  # as the bench runs stock and tuned
    import deepspeed
    import torch
    from memascend_engine.hf_models import causal_lm_factory

    deepspeed.init_distributed(dist_backend="gloo")
    make = causal_lm_factory(spec)
    before, anon_before = malloc_state(), status_kib("RssAnon") * 1024
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        built = make()
    after, anon_after = malloc_state(), status_kib("RssAnon") * 1024
    # transformers redoes the weight initialisation (or loads the checkpoint) one module's gathered parameters at a
    # time after its zero.Init (integrations/deepspeed.py initialize_weights_zero3, _load_state_dict_into_zero3_model);
    # the bench does the same (memascend_engine.hf_models.init_weights_under_zero3).
    from memascend_engine.hf_models import init_weights_under_zero3

    init_weights_under_zero3(built)
    loaded = malloc_state()
    return {"model": model, "layers": spec.num_hidden_layers, "dtype": dtype, "num_params": spec.num_params,
            "free_kept_bytes": after["free_kept_bytes"] - before["free_kept_bytes"],
            "rss_anon_added_bytes": anon_after - anon_before, "malloc_after": after,
            "weights_pass_free_kept_bytes": loaded["free_kept_bytes"] - after["free_kept_bytes"],
            "rss_anon_after_weights_pass_bytes": status_kib("RssAnon") * 1024 - anon_before,
            "deepspeed_version": deepspeed.__version__, "torch_version": torch.__version__}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", required=True, help="MODEL[:LAYERS[:DTYPE]] (dtype default fp32)")
    ap.add_argument("--nvme-dir", required=True)
    ap.add_argument("--repeat", type=int, default=1, help="fresh processes per case (the kept heap is bimodal)")
    ap.add_argument("--out", help="write the JSON document here (default: stdout)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        model, layers, dtype = args.case[0].split(":")
        print(json.dumps(child(model, int(layers), dtype, args.nvme_dir)))
        return 0

    from memascend_cli.models import load_model
    from memascend_cli.planner.heap import zero_init_heap_bytes

    cases = []
    for case in args.case:
        parts = case.split(":")
        model, layers, dtype = parts[0], int(parts[1]) if len(parts) > 1 else 0, parts[2] if len(parts) > 2 else "fp32"
        spec = load_model(model)
        if layers:
            spec = spec.scaled(layers)
        for rep in range(args.repeat):
            # One process per measurement: glibc's heap and mmap threshold start fresh.
            out = subprocess.run([sys.executable, __file__, "--child", "--case", f"{model}:{layers}:{dtype}",
                                  "--nvme-dir", args.nvme_dir], capture_output=True, text=True, check=True)
            rec = json.loads(out.stdout.strip().splitlines()[-1])
            rec["repeat"] = rep
            rec["predicted_bytes"] = zero_init_heap_bytes(spec)
            cases.append(rec)
            print(f"{model} L{rec['layers']} {dtype} #{rep}: kept {rec['free_kept_bytes'] / GiB:.3f} GiB, "
                  f"plan {rec['predicted_bytes'] / GiB:.3f} GiB; the weights pass kept "
                  f"{rec['weights_pass_free_kept_bytes'] / GiB:.3f} GiB more", file=sys.stderr)
    doc = {"kind": "zero_init_heap",
           "title": ("Heap left free but kept by glibc after stock DeepSpeed's zero.Init and after the weights pass "
                     "that follows it (tuned config)"),
           "command": "python benchmarks/zero_init_heap.py " + " ".join(f"--case {c}" for c in args.case)
                      + f" --repeat {args.repeat}",
           "date": datetime.date.today().isoformat(), "machine": platform.node(),
           "libc": " ".join(platform.libc_ver()), "cases": cases}
    text = json.dumps(doc, indent=1) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
