"""Host memory of one checkpointed decoder layer's recomputation + backward on the CPU, measured, against the planner.

Activation checkpointing runs each layer's forward again inside its backward (torch.utils.checkpoint), so the
highest moment of a CPU backward holds one layer's recomputed activations, the gradients flowing through them and a
weight gradient. This measures that moment per shape and token count; the planner's layer_backward_bytes
(memascend_cli/planner/compute.py) is the tensor count these measurements fit, printed beside them with Korthikanti
et al.'s count of one layer's activations (2205.05198, table 2), which the planner used before.

Each case runs in a fresh process: the layer (transformers' own decoder layer for the preset's model type, fp32,
random weights), its checkpointed input (a leaf that requires grad, as torch.utils.checkpoint hands it) and the
output gradient are built first; then /proc/self/clear_refs resets the peak RSS, the layer runs forward with grad and
backward, and the peak RSS rise is the moment's memory. glibc's mmap threshold is pinned at 64 KiB
(MALLOC_MMAP_THRESHOLD_) so freed tensors leave RSS at once and the peak is the live bytes', not the heap's.

Usage (CPU; seconds to a minute per case, ~15 minutes for the fp32 document):
    python benchmarks/layer_backward_memory.py --case bench-llama-136m:1024,4096,16384 --case smollm2-360m:1024,4096 \\
        --case llama-3.2-1b:1024,4096,8192 --case qwen2.5-1.5b:1024,4096,8192 \\
        --out docs/bench/micro/layer-backward-fp32.json
    python benchmarks/layer_backward_memory.py --dtype bf16 ... --out docs/bench/micro/layer-backward-bf16.json
    python benchmarks/layer_backward_memory.py --part head-hf --case bench-llama-136m:1024,4096,16384 \
        --case qwen2.5-0.5b:1024,2048 --case llama-3.2-1b:1024,4096 --out docs/bench/micro/head-backward-hf-fp32.json

--part loss-hf / loss-chunked measure the LM head and the loss alone (their input a leaf made before the peak is
reset); head-hf / head-chunked the model's top with them: the last layer's output made in the measured forward and
the model's own final RMSNorm, whose tensors live from the end of forward to the LM head's backward.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

MMAP_THRESHOLD_BYTES = 64 * 1024


def child(model: str, tokens: int, dtype: str, part: str = "layer") -> dict:
    import torch

    from memascend_cli.models import load_model
    from memascend_engine.hf_models import to_hf_config
    from memascend_engine.procfs import status_kib

    torch.manual_seed(0)
    spec = load_model(model)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    h = spec.hidden_size
    x = torch.randn(1, tokens, h, dtype=dt, requires_grad=True)
    if part == "layer":
        from transformers import AutoModelForCausalLM

        cfg = to_hf_config(spec)
        cfg._attn_implementation = "sdpa"  # transformers' default, as the bench and train build the model
        model_class = AutoModelForCausalLM._model_mapping[type(cfg)]
        module = __import__(model_class.__module__, fromlist=["_"])
        layer_cls = next(getattr(module, n) for n in dir(module) if n.endswith("DecoderLayer"))
        rotary_cls = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
        layer = layer_cls(cfg, layer_idx=0).to(dt)
        pos = torch.arange(tokens).unsqueeze(0)
        with torch.no_grad():
            cos_sin = rotary_cls(config=cfg)(x, pos)
        grad_out = torch.randn(1, tokens, h, dtype=dt)

        def run() -> None:
            out = layer(x, attention_mask=None, position_ids=pos, position_embeddings=cos_sin)
            out = out[0] if isinstance(out, tuple) else out
            out.backward(grad_out)
    else:
        # The LM head and the loss of the model's last hidden states: transformers' own (ForCausalLMLoss on the
        # full logits) or memascend's chunked one (memascend_engine/chunked_loss.py). head-*: the model's top as
        # well, the last layer's output made in forward and the model's own final RMSNorm before the LM head.
        layer = torch.nn.Linear(h, spec.vocab_size, bias=False).to(dt)
        labels = torch.randint(0, spec.vocab_size, (1, tokens))
        norm = _final_norm(spec, dt) if part.startswith("head-") else None

        def top(inp):
            return inp if norm is None else norm(inp * 1.0)

        if part == "loss-trl":
            from trl.trainer import utils as trl_utils

            flat = x.view(tokens, h)

            def run() -> None:
                # SFTTrainer's fused LM head (trl/trainer/utils.py add_fused_lm_head) on the hidden states
                log_probs = trl_utils._ChunkedLogProbFunction.apply(
                    flat, layer.weight, None, labels.view(-1), 1.0, trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0,
                    ("log_probs", "entropy", "is_top1"))[0]
                (-log_probs.sum() / tokens).backward()
        elif part.endswith("-hf"):
            from transformers.loss.loss_utils import ForCausalLMLoss

            def run() -> None:
                ForCausalLMLoss(layer(top(x)), labels, spec.vocab_size).backward()
        else:
            from memascend_cli.planner.compute import loss_chunk_tokens
            from memascend_engine.chunked_loss import fused_linear_cross_entropy

            chunk = loss_chunk_tokens(spec.vocab_size)

            def run() -> None:
                fused_linear_cross_entropy(top(x), layer.weight, labels, chunk).backward()
    layer_param_bytes = sum(p.numel() * p.element_size() for p in layer.parameters())

    run()  # warm-up: kernels, thread pools and the grads' first allocation
    layer.zero_grad(set_to_none=True)
    x.grad = None
    base_kib = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS (proc(5): clear_refs)
    run()
    peak_kib = status_kib("VmHWM")
    return {"model": model, "part": part, "tokens": tokens, "dtype": dtype, "hidden_size": h,
            "intermediate_size": spec.intermediate_size, "num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.num_key_value_heads, "vocab_size": spec.vocab_size,
            "param_bytes": layer_param_bytes,
            "peak_rise_bytes": (peak_kib - base_kib) * 1024, "threads": torch.get_num_threads()}


def _final_norm(spec, dt):
    """The preset's model type's own final RMSNorm (transformers), in dtype `dt`."""
    from transformers import AutoModelForCausalLM

    from memascend_engine.hf_models import to_hf_config

    cfg = to_hf_config(spec)
    module = __import__(AutoModelForCausalLM._model_mapping[type(cfg)].__module__, fromlist=["_"])
    norm_cls = next(getattr(module, n) for n in dir(module) if n.endswith("RMSNorm"))
    return norm_cls(spec.hidden_size, eps=cfg.rms_norm_eps).to(dt)


def planned(model: str, tokens: int, dtype: str, part: str) -> dict:
    """The planner's view of the same moment: layer_backward_bytes (with Korthikanti et al.'s count of one layer's
    activations beside it), or the loss backward's larger moment (loss_backward_bytes)."""
    from memascend_cli.models import load_model
    from memascend_cli.planner.compute import (activation_parts, layer_backward_bytes, loss_backward_bytes,
                                               model_top_bytes)
    from memascend_cli.planner.context import Context
    from memascend_cli.planner.job import JobSpec
    from memascend_cli.planner.spec import HardwareSpec

    spec = load_model(model)
    job = JobSpec(model=spec, seq_len=tokens, micro_batch=1, dtype=dtype, checkpointing="full",
                  chunked_loss=part.endswith("-chunked"), trainer="trl" if part == "loss-trl" else "deepspeed")
    hw = HardwareSpec(name="local", dram_gib=24.0, cpu_cores=2)
    c = Context(job, hw, "memascend")
    if part != "layer":
        top = model_top_bytes(c) if part.startswith("head-") else 0
        return {"planned_bytes": loss_backward_bytes(c) + top}
    _, again, _ = activation_parts(c)
    return {"planned_bytes": layer_backward_bytes(c), "korthikanti_layer_activation_bytes": again}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", default=[], help="MODEL:TOKENS[,TOKENS...]")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--part", default="layer",
                    choices=("layer", "loss-hf", "loss-chunked", "loss-trl", "head-hf", "head-chunked"),
                    help="one recomputed decoder layer; the LM head with transformers' loss, the chunked one or TRL's "
                         "fused LM head; the same with the model's top (the last layer's output and the final RMSNorm)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--child", nargs=4, metavar=("MODEL", "TOKENS", "DTYPE", "PART"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.child[2], a.child[3])))
        return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES)}
    rows = []
    for case in a.case:
        model, _, toks = case.partition(":")
        for tokens in (int(t) for t in toks.split(",")):
            runs = []
            for _ in range(a.repeat):
                res = subprocess.run([sys.executable, __file__, "--child", model, str(tokens), a.dtype, a.part],
                                     capture_output=True, text=True, env=env, check=True)
                runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
            row = {**runs[0], "peak_rise_bytes": min(r["peak_rise_bytes"] for r in runs),
                   "repeats": [r["peak_rise_bytes"] for r in runs], **planned(model, tokens, a.dtype, a.part)}
            row["plan_error"] = round(row["planned_bytes"] / row["peak_rise_bytes"] - 1, 4)
            rows.append(row)
            print(f"{model:18s} {tokens:6d} measured {row['peak_rise_bytes'] / 2**20:8.1f} MiB  planned "
                  f"{row['planned_bytes'] / 2**20:8.1f} MiB ({100 * row['plan_error']:+.1f}%)", flush=True)
    doc = {"schema_version": 1, "kind": "layer_backward_memory", "part": a.part, "dtype": a.dtype, "rows": rows,
           "meta": {"command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]),
                    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "host": platform.node(), "mmap_threshold_bytes": MMAP_THRESHOLD_BYTES}}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
