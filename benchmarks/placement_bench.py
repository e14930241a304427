"""Respect what fits: a plain DeepSpeed script with its own ZeRO-3 CPU-offload config (benchmarks/ds_llama_script.py
--offload cpu, fp32), run stock and through `memascend_engine.install(config, region=R)` with placement auto on a
machine whose DRAM holds it, in turn, in one sitting. The target: install()'s step time within 10% of stock's and its peak
no higher.

Each run is measured as benchmarks/user_script_bench.py measures a user script (settle, drop caches, sample
MemTotal - MemAvailable at >= 1 kHz; ru_maxrss of the script). s/step: the median of the script's own step times
after the first step.

    python benchmarks/placement_bench.py --out docs/bench/placement/cpu-offload-install.json --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import user_script_bench as usb

MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 768,
         "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 12,
         "vocab_size": 32000, "max_position_embeddings": 2048, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
"""134M parameters: a ~100-150M Llama, its fp32 CPU-offload states (about 20 B per parameter) a few GiB."""
ENGINES = ("stock", "install")


def command(engine: str, *, model_dir: str, nvme: str, out: str, region: str, seq_len: int, micro_batch: int,
            steps: int, python: str = sys.executable) -> list[str]:
    """The script for one run: the same arguments, and `--region` (install() with placement auto) for install.
    Pure."""
    cmd = [python, usb.DS_SCRIPT, "--model-dir", model_dir, "--nvme-path", nvme, "--out", out, "--offload", "cpu",
           "--dtype", "fp32", "--seq-len", str(seq_len), "--micro-batch", str(micro_batch), "--steps", str(steps)]
    return cmd + (["--region", region, "--placement", "auto"] if engine == "install" else [])


def run(engine: str, work: str, region: str, args) -> dict:
    nvme, out, log = (os.path.join(work, n) for n in ("nvme", f"{engine}.json", f"{engine}.log"))
    shutil.rmtree(nvme, ignore_errors=True)
    os.makedirs(nvme)
    cmd = command(engine, model_dir=os.path.join(work, "model"), nvme=nvme, out=out, region=region,
                  seq_len=args.seq_len, micro_batch=args.micro_batch, steps=args.steps)
    m = usb.measure(cmd, usb.script_env(os.environ), log)
    r = {}
    if os.path.exists(out):
        with open(out) as f:
            r = json.load(f)
        os.remove(out)
    stats = r.get("stats") or {}
    steps = r.get("step_s") or []
    res = {"engine": engine, "ok": len(r.get("losses") or []) == args.steps, "step_s": steps,
           "s_per_step": statistics.median(steps[1:]) if len(steps) > 1 else None, "losses": r.get("losses"),
           "offload": r.get("offload"), "placement": stats.get("placement"),
           "region_bytes_read": stats.get("bytes_read"), "region_bytes_written": stats.get("bytes_written"),
           "vm_hwm_kib": (r.get("status_kib") or {}).get("VmHWM"),
           **{k: m[k] for k in ("exit_code", "wall_s", "peak_system_bytes", "ru_maxrss_bytes",
                                "others_rss_change_at_peak_bytes")}}
    if not res["ok"]:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - 1500))
            res["error"] = f.read().decode(errors="replace")
    return res


def summary(runs: list[dict]) -> dict:
    """Medians per engine and install()'s over stock's. Pure."""
    med = {}
    for e in ENGINES:
        ok = [r for r in runs if r["engine"] == e and r["ok"]]
        med[e] = {k: statistics.median(r[k] for r in ok) if ok and all(r[k] is not None for r in ok) else None
                  for k in ("s_per_step", "ru_maxrss_bytes", "peak_system_bytes")}
    ratio = {k: round(med["install"][k] / med["stock"][k], 3) if med["install"][k] and med["stock"][k] else None
             for k in med["stock"]}
    return {"median": med, "install_over_stock": ratio,
            "bar": {"step_time_within_10_percent": ratio["s_per_step"] is not None and ratio["s_per_step"] <= 1.10,
                    "peak_no_higher_ru_maxrss": ratio["ru_maxrss_bytes"] is not None and ratio["ru_maxrss_bytes"] <= 1.0,
                    "peak_no_higher_system": ratio["peak_system_bytes"] is not None
                    and ratio["peak_system_bytes"] <= 1.0}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=3, help="runs per engine, stock and install() in turn")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args(argv)
    from memascend_cli.bench.runner import create_region
    from memascend_cli.hardware import local_cpu_model

    work = tempfile.mkdtemp(prefix="placement-bench-", dir="/var/tmp")
    os.makedirs(os.path.join(work, "model"))
    with open(os.path.join(work, "model", "config.json"), "w") as f:
        json.dump(MODEL, f)
    region = os.path.join(work, "region.bin")
    create_region(region, 4 << 30, ranks=1)  # unused while the offload stays in DRAM; there for a move
    runs = []
    for i in range(max(1, args.repeat)):
        for engine in ENGINES:
            runs.append(dict(run(engine, work, region, args), repeat=i))
            r = runs[-1]
            print(f"{engine} ({i + 1}/{args.repeat}): ok={r['ok']} {r['s_per_step']} s/step, ru_maxrss "
                  f"{usb._gib(r['ru_maxrss_bytes'])} GiB, system peak {usb._gib(r['peak_system_bytes'])} GiB",
                  flush=True)
    doc = {"title": "A user's ZeRO-3 CPU-offload script: stock against install(placement='auto')",
           "command": "python benchmarks/placement_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
           "machine": {"cpus": os.cpu_count(), "cpu_model": local_cpu_model(),
                       "dram_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / usb.GiB, 1),
                       "load_avg_at_end": os.getloadavg()},
           "job": {"model": MODEL, "seq_len": args.seq_len, "micro_batch": args.micro_batch, "steps": args.steps,
                   "dtype": "fp32", "offload": "cpu (params and optimizer)", "zero_init": True},
           "runs": runs, **summary(runs)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: doc[k] for k in ("median", "install_over_stock", "bar")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
