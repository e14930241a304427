"""Host memory of the training data path against dataset size (the target: 10x the tokens, the same peak).

For each size it
  1. writes a synthetic JSONL dataset (text records of ~100 tokens) on disk,
  2. tokenizes it into the memory-mapped cache exactly as `memascend train` does before the launch
     (engine/data_prepare.py build_cache, in a child process: its peak RSS is reported as `prepare`),
  3. in a fresh child process opens the cache as a rank does (TokenCache), then reads every micro-batch
     of one full epoch in the order the worker uses (micro_batch_rows) and turns each into torch tensors
     as the worker's _batch does, and reports VmRSS before the loop and VmHWM after it, from
     /proc/self/status: the data path's peak is HWM - RSS_before.

    python benchmarks/data_path_memory.py --tokens 2e6,2e7 --out docs/raw/data-path-memory.json

Everything runs in child processes started by this script, one at a time; nothing else is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(REPO, "presets", "train", "data", "tokenizer.json")
WORDS = ["apple", "river", "stone", "cloud", "green", "tiger", "piano", "orbit", "maple", "delta", "lemon", "quartz"]

PREPARE = r"""
import json, sys, time
from memascend_engine import data_prepare as P
tok = P.load_tokenizer(sys.argv[1])
spec = P.PrepSpec(paths=[sys.argv[2]], format="text", packing=True, seq_len=int(sys.argv[4]), validation_split=0.0, seed=0)
t = time.time()
folder, meta = P.build_cache(spec, tok, "none", None, cache_root=sys.argv[3])
print(json.dumps({"folder": folder, "seconds": time.time() - t, "tokens": meta["splits"]["train"]["tokens"],
                  "rows": meta["splits"]["train"]["rows"]}))
"""

READ = r"""
import json, sys, time
import torch
from memascend_engine import data as D
from memascend_engine.procfs import status_kib


def mapped_kib(folder):
    # Resident pages of this process's mappings of the cache files (/proc/self/smaps).
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:
                inside = len(head) >= 6 and head[5].startswith(folder)
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


folder = sys.argv[1]
cache = D.TokenCache(folder)
mb = int(sys.argv[2])
train = cache.train
rss0, anon0 = status_kib("VmRSS"), status_kib("RssAnon")
t = time.time()
steps = len(train) // mb
checksum = 0
mapped_max = 0
for k in range(steps):
    rows = D.micro_batch_rows(len(train), 0, k, micro_batch=mb, world_size=1, rank=0)
    batch = {name: torch.from_numpy(a) for name, a in train.batch(rows).items()}
    checksum += int(batch["input_ids"][:, 0].sum())
    if k % 100 == 0:
        mapped_max = max(mapped_max, mapped_kib(folder))
print(json.dumps({"rss_before_kib": rss0, "anon_before_kib": anon0, "hwm_after_kib": status_kib("VmHWM"),
                  "rss_after_kib": status_kib("VmRSS"), "anon_after_kib": status_kib("RssAnon"),
                  "cache_pages_mapped_max_kib": mapped_max, "cache_pages_mapped_end_kib": mapped_kib(folder),
                  "micro_batches": steps, "rows": len(train), "seconds": time.time() - t, "checksum": checksum}))
"""


def write_dataset(path: str, tokens: int, seed: int = 0) -> int:
    """JSONL text records of 60-140 words until about `tokens` tokens (~1 token per word with the tiny
    tokenizer, which has merges for these words); returns the number of records."""
    rng = random.Random(seed)
    n = 0
    words = 0
    with open(path, "w") as f:
        while words < tokens:
            k = rng.randint(60, 140)
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(k))}) + "\n")
            words += k
            n += 1
    return n


def child(code: str, *args: str) -> dict:
    """The JSON the child printed, plus its peak RSS (ru_maxrss from wait4) as maxrss_kib."""
    env = {**os.environ, "PYTHONPATH": REPO}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=out, stderr=err, text=True, env=env)
        _, status, rusage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise SystemExit(f"child failed:\n{err.read()[-3000:]}")
        result = json.loads(out.read().strip().splitlines()[-1])
    result["maxrss_kib"] = rusage.ru_maxrss
    return result


def measure(tokens: int, seq_len: int, micro_batch: int, workdir: str) -> dict:
    data = os.path.join(workdir, f"data-{tokens}.jsonl")
    t = time.time()
    records = write_dataset(data, tokens)
    gen_s = time.time() - t
    cache_root = os.path.join(workdir, "cache")
    prep = child(PREPARE, TOKENIZER, data, cache_root, str(seq_len))
    read = child(READ, prep["folder"], str(micro_batch))
    return {"target_tokens": tokens, "records": records, "dataset_file_bytes": os.path.getsize(data),
            "cache_bytes": sum(os.path.getsize(os.path.join(prep["folder"], n)) for n in os.listdir(prep["folder"])),
            "generate_seconds": round(gen_s, 2), "prepare": prep, "read": read,
            "data_path_peak_kib": read["hwm_after_kib"] - read["rss_before_kib"]}


def table(doc: dict) -> str:
    """The markdown table of docs/results.md (generated from the JSON, never typed)."""
    lines = ["| tokens | cache on disk | tokenize: peak RSS, time | micro-batches read | rank RSS before "
             "| rank VmHWM after the epoch | data path peak | anonymous memory growth | cache pages mapped (max) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["runs"]:
        rd = r["read"]
        pr = r["prepare"]
        lines.append(f"| {pr['tokens']:,} | {r['cache_bytes'] / 2**20:,.1f} MiB | "
                     f"{pr['maxrss_kib'] / 1024:,.0f} MiB, {pr['seconds']:,.0f} s | "
                     f"{rd['micro_batches']:,} | {rd['rss_before_kib'] / 1024:,.1f} MiB | "
                     f"{rd['hwm_after_kib'] / 1024:,.1f} MiB | {r['data_path_peak_kib'] / 1024:,.2f} MiB | "
                     f"{(rd['anon_after_kib'] - rd['anon_before_kib']) / 1024:,.2f} MiB | "
                     f"{rd['cache_pages_mapped_max_kib']:,} KiB |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="2e6,2e7", help="comma-separated dataset sizes in tokens")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--workdir", default="/var/tmp", help="a disk folder (not tmpfs) for the datasets and caches")
    ap.add_argument("--out", help="write the raw JSON here")
    ap.add_argument("--table", help="print the markdown table of an existing JSON file and exit")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)))
        return
    work = tempfile.mkdtemp(prefix="memascend-datapath-", dir=args.workdir)
    try:
        runs = [measure(int(float(t)), args.seq_len, args.micro_batch, work) for t in args.tokens.split(",")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {"what": "host memory of the data path vs dataset size (benchmarks/data_path_memory.py)",
           "date": time.strftime("%Y-%m-%d"), "seq_len": args.seq_len, "micro_batch": args.micro_batch,
           "tokenizer": os.path.relpath(TOKENIZER, REPO), "python": sys.version.split()[0], "runs": runs}
    text = json.dumps(doc, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(table(doc))


if __name__ == "__main__":
    main()
