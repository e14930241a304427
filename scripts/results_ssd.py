"""The results' SSD sections (docs/results/time.md): several SSDs as one striped region (docs/bench/striped/: the
training job and the I/O path alone on 1, 2 and 3 throttled members) and the DRAM tier's SSD bytes per step against
its budget (docs/bench/dram-tier/). Stdlib only (scripts/results.py imports it)."""

from __future__ import annotations

import os
import statistics

from results_common import REPO, table


def _load(r: list[float]) -> str:
    return f"{r[0]:.1f}"


def section_striped(docs: list[tuple[str, dict]]) -> str:
    if not docs:
        return ""
    jobs = [(p, d) for p, d in docs if "median_tokens_per_s" in d]
    io = [(p, d) for p, d in docs if "median_write_gbps" in d]
    rows = []
    for path, d in jobs:
        clip = next((r["bench_args"][r["bench_args"].index("--gradient-clipping") + 1] for r in d["runs"]
                     if "--gradient-clipping" in r["bench_args"]), "none")
        rounds = len({r["round"] for r in d["runs"]})
        med, ratio = d["median_tokens_per_s"], d["ratio_to_one_member"]
        rows.append([f"`{os.path.basename(path)}`", d["date"][:16].replace("T", " "), clip, str(rounds),
                     f"{_load(d['loadavg_start'])} / {_load(d['loadavg_end'])}",
                     " / ".join(f"{med[n]:.2f}" for n in sorted(med)),
                     " / ".join(f"x{ratio[n]:.2f}" for n in sorted(ratio) if n != "1")])
    io_rows = []
    for path, d in io:
        for n in sorted({str(r["members"]) for r in d["runs"]}):
            w = statistics.median(r["write_gbps"] for r in d["runs"] if str(r["members"]) == n)
            rd = statistics.median(r["read_gbps"] for r in d["runs"] if str(r["members"]) == n)
            io_rows.append([f"`{os.path.basename(path)}`", n, f"{w:.3f}", f"{rd:.3f}"])
    first = (jobs or io)[0][1]
    m = first["machine"]
    return "\n".join([
        "## Several SSDs as one striped region", "",
        f"On {m['host']} ({m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB): `prepare-ssd` stripes one region over "
        "1, 2 or 3 members, loop devices over sparse files in /dev/shm, each limited to 400 MB/s by its own blkio "
        "limit (backing files on the disk would share the disk's one limit), the runs at nice -10. The training job "
        "is `memascend bench --model bench-llama-136m --seq-len 32 --steps 4 --dtype fp32 --runs memascend "
        "--ssd-bandwidth 400MB/s` on the striped region, the member counts interleaved round by round; tokens/s is "
        "each member count's median. Commands: " + ", ".join(f"`{d['command']}`" for _, d in jobs + io) + ".", "",
        table(["document", "date (UTC)", "clipping", "rounds", "load start / end", "tokens/s 1 / 2 / 3 members",
               "2 / 3 members vs 1"], rows), "",
        "The I/O path alone (the region store writing then reading 2 GiB in 8 MiB requests, medians in GB/s): every "
        "member's queue stays full and the bandwidth adds up, so what the training job misses of it lies outside the "
        "I/O path: the step's compute on two cores, which more members do not shorten.", "",
        table(["document", "members", "write GB/s", "read GB/s"], io_rows), ""]) + "\n"


def section_dram_tier(doc: dict | None, path: str) -> str:
    if doc is None:
        return ""
    rows = []
    for p in doc["points"]:
        t = p["engine_tier"] or {}
        rows.append([f"{p['budget_bytes'] / 2**20:.0f}", f"{p['measured_read_bytes_per_step'] / 2**20:.2f}",
                     f"{p['planned_read_bytes_per_step'] / 2**20:.2f}",
                     f"{p['measured_write_bytes_per_step'] / 2**20:.2f}",
                     f"{p['planned_write_bytes_per_step'] / 2**20:.2f}",
                     f"{t.get('params_held', 0)} / {t.get('chunks_held', 0)} / {t.get('grads_held', 0)}",
                     "yes" if p["losses"] == doc["points"][0]["losses"] else "no"])
    job = doc["job"]
    return "\n".join([
        "## The DRAM tier: SSD bytes per step against its budget", "",
        f"`{doc['command']}` on {doc['host']}, {doc['date']}: {job['model']}, {job['dtype']}, seq {job['seq_len']}, "
        f"micro-batch {job['micro_batch']}, clipping {job['clip']:g}; a step's bytes are the difference of a "
        f"{job['steps'][1]}-step and a {job['steps'][0]}-step run (setup and the first step cancel), read at the "
        "region store; planned by the same rule the engine applies (parameter partitions first, then whole optimizer "
        f"chunks, then gradients). Raw data: `{os.path.relpath(path, REPO)}`.", "",
        table(["budget MiB", "read MiB", "plan read MiB", "written MiB", "plan written MiB",
               "held: params / chunks / grads", "losses = budget 0"], rows), ""]) + "\n"
