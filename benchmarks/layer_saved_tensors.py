"""The tensors one decoder layer saves for its backward (no recomputation), counted, against the planner.

Without activation checkpointing every layer's saved tensors live from its forward to its backward: the planner's
layer_saved_bytes (memascend_cli/planner/compute.py, LAYER_SAVED_TENSORS_PER_TOKEN) is the count this measures.
Each case builds transformers' LlamaDecoderLayer (SDPA attention, random weights) in the dtype, runs its forward under
torch.autograd.graph.saved_tensors_hooks and sums the bytes of the distinct storages autograd saves, the layer's
parameters left out (they live in the parameter pool) and its input counted (the layer's first RMSNorm keeps it, or
its fp32 upcast). Exact and fast (no RSS involved): a few seconds per case.

    python benchmarks/layer_saved_tensors.py --out docs/bench/micro/layer-saved-tensors.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

CASES = {"mha-82m": {"hidden_size": 768, "intermediate_size": 2048, "num_attention_heads": 12,
                     "num_key_value_heads": 12},
         "gqa-156m": {"hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 16,
                      "num_key_value_heads": 4}}
"""The decoder layers of benchmarks/user_script_bench.py's two models: multi-head and grouped-query attention."""


def saved_bytes(shape: dict, dtype: str, micro_batch: int, seq_len: int) -> int:
    """Bytes of the distinct storages one layer's forward saves for backward, its parameters left out."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    torch_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    cfg = LlamaConfig(vocab_size=1000, **shape)
    cfg._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(cfg, 0).to(torch_dtype)
    x = torch.randn(micro_batch, seq_len, shape["hidden_size"], dtype=torch_dtype, requires_grad=True)
    positions = torch.arange(seq_len).unsqueeze(0)
    cos, sin = LlamaRotaryEmbedding(cfg)(x, positions)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, attention_mask=None, position_ids=positions,
              position_embeddings=(cos.to(torch_dtype), sin.to(torch_dtype)))
    return sum(seen.values())


def planned_bytes(shape: dict, dtype: str, micro_batch: int, seq_len: int) -> int:
    """The planner's layer_saved_bytes for the same layer and tokens."""
    from memascend_cli.models import ModelSpec
    from memascend_cli.planner.compute import layer_saved_bytes
    from memascend_cli.planner.context import Context
    from memascend_cli.planner.job import JobSpec
    from memascend_cli.planner.spec import HardwareSpec

    model = ModelSpec(name="layer", model_type="llama", num_hidden_layers=1, vocab_size=1000, **shape)
    job = JobSpec(model=model, seq_len=seq_len, micro_batch=micro_batch, dtype=dtype, checkpointing="none")
    return layer_saved_bytes(Context(job, HardwareSpec(name="cpu", dram_gib=24), "memascend"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=512)
    args = ap.parse_args(argv)
    rows = []
    for name, shape in CASES.items():
        for dtype in ("fp32", "bf16"):
            measured = saved_bytes(shape, dtype, args.micro_batch, args.seq_len)
            planned = planned_bytes(shape, dtype, args.micro_batch, args.seq_len)
            rows.append({"case": name, **shape, "dtype": dtype, "micro_batch": args.micro_batch,
                         "seq_len": args.seq_len, "measured_bytes": measured, "planned_bytes": planned,
                         "error_percent": round(100 * (planned - measured) / measured, 2)})
            print(json.dumps(rows[-1]), flush=True)
    import torch
    import transformers

    doc = {"kind": "layer_saved_tensors", "title": "A decoder layer's tensors saved for backward (no recomputation)",
           "command": "python benchmarks/layer_saved_tensors.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
           "machine": {"cpus": os.cpu_count()}, "load_avg": [round(x, 2) for x in os.getloadavg()],
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__}, "cases": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
