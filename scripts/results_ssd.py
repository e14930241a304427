"""The results' SSD sections (docs/results/time.md): all-SSD tokens/s against tuned stock in interleaved rounds at one
throttled SSD (docs/bench/ssd-bound-rounds/), several SSDs as one striped region (docs/bench/striped/: the training job
and the I/O path alone on 1, 2 and 3 throttled members) and the DRAM tier's SSD bytes per step against its budget
(docs/bench/dram-tier/). Torch-free (scripts/results.py imports it)."""

from __future__ import annotations

import os
import statistics

from results_common import REPO, table
from results_time import cores_taken

from memascend_cli.bench.document import ssd_share


def _load(r: list[float]) -> str:
    return f"{r[0]:.1f}"


ROUNDS_BARS = {"memascend": 1.6, "memascend-bf16_moments": 2.2}
"""The targets for all-SSD memascend's tokens/s over tuned stock's at one SSD at 400 MB/s: fp32 states, bf16
moments."""


def section_ssd_rounds(docs: list[tuple[str, dict]]) -> str:
    """One row per run of each rounds document (benchmarks/ssd_bound_rounds.py): median tokens/s, the median of the
    rounds' own ratios to tuned stock against its target, the median SSD share of the step and the bytes."""
    if not docs:
        return ""
    out = ["## All-SSD tokens/s against tuned stock, interleaved rounds", "",
           "Each round is one `memascend bench` sitting of tuned stock, memascend (fp32 Adam moments) and memascend "
           "with bf16 moments, the same command in every round (each round's document is also in the tables above); "
           "ratio to tuned is the median of the rounds' own ratios (the runs of a round minutes apart), each round's "
           "in parentheses. SSD share: the busier direction's bytes at the throttle over the measured s/step (1.00: "
           "the SSD never idles); cores taken: the CPU the rest of the machine (and the bench's samplers) took.", ""]
    for path, d in docs:
        rounds = [r for r in d["rounds"] if r.get("runs")]
        args = rounds[0]["bench_args"] if rounds else []
        rows = []
        for name, tps in d["median_tokens_per_s"].items():
            runs = [r["runs"][name] for r in rounds if r["runs"].get(name, {}).get("tokens_per_s")]
            bpp = runs[-1]["ssd_bytes_per_param"] or {}
            taken = [c for c in map(cores_taken, runs) if c is not None]
            ratio = d["median_ratio_to_tuned"].get(name)
            each = ", ".join(f"{x:.2f}" for x in d["round_ratios_to_tuned"].get(name, []))
            bar = ROUNDS_BARS.get(name)
            rows.append([name, str(len(runs)), f"{tps:.1f}", "-" if ratio is None else f"x{ratio:.2f} ({each})",
                         "-" if bar is None else f"x{bar:g}: {'met' if ratio >= bar else 'not met'}",
                         f"{d['median_ssd_share'].get(name, 0):.2f}",
                         f"{bpp.get('read', 0):.1f} / {bpp.get('write', 0):.1f}",
                         f"{min(taken):.2f}-{max(taken):.2f}" if taken else "-"])
        m = d["machine"]
        clip = args[args.index("--gradient-clipping") + 1] if "--gradient-clipping" in args else "DeepSpeed's 1.0"
        out += [f"`{os.path.basename(path)}` ({d['date'][:16].replace('T', ' ')} UTC, {m['host']}: {m['cpu']}, "
                f"{m['cores']} cores" + _commit(d.get("commit"))
                + f", nice {d['nice']}, load {_load(d['loadavg_start'])} at the start, "
                f"{_load(d['loadavg_end'])} at the end; gradient clipping {clip}"
                + (f"; {d['stopped']}" if d.get("stopped") else "") + f"): `{d['command']}`, each round `memascend "
                + " ".join(_without_out_and_title(args)) + " --title TITLE --out DIR`.", "",
                table(["run", "rounds", "median tokens/s", "ratio to tuned", "target", "SSD share", "SSD B/param read "
                       "/ write", "cores taken"], rows), ""]
        failed = [f"round {r['round']}: {name}" for r in rounds for name, run in r["runs"].items() if not run["ok"]]
        if failed:
            out += ["Failed (each in its round's document, with why; its round has no ratio): " + ", ".join(failed)
                    + ".", ""]
    return "\n".join(out) + "\n"


def _commit(c: dict | None) -> str:
    """', commit abc1234' (and how many tracked files differed from it, if any) for a rounds document that says. Pure."""
    if not c:
        return ""
    changed = len(c.get("changed", []))
    return f", commit {c['head']}" + (f" with {changed} tracked files changed" if changed else "")


def _without_out_and_title(args: list[str]) -> list[str]:
    """A round's bench arguments less --out and --title (the round's own), for the command line shown. Pure."""
    return [x for i, x in enumerate(args) if x not in ("--out", "--title") and args[i - 1:i] not in (["--out"],
                                                                                                   ["--title"])]


def striped_ssd_share(run: dict) -> float | None:
    """A striped run's SSD share of its step: its busier direction's bytes at the members' summed limits (the
    throttle on each member device; the swap disk's own limit is not the region's) over the measured s/step. Pure."""
    members = {os.path.basename(dev) for dev in run.get("devices") or []}
    limits = [t for t in run.get("ssd_throttle") or [] if t["device"] in members]
    if not limits:
        return None
    return ssd_share(run, sum(t["read_bytes_per_s"] for t in limits), sum(t["write_bytes_per_s"] for t in limits))


def _per_count(d: dict, value) -> str:
    """' / '-joined medians of value(run) per member count of a striped document (- where none). Pure."""
    out = []
    for n in sorted({r["members"] for r in d["runs"]}):
        xs = [x for x in (value(r) for r in d["runs"] if r["members"] == n) if x is not None]
        out.append(f"{statistics.median(xs):.2f}" if xs else "-")
    return " / ".join(out)


def section_striped(docs: list[tuple[str, dict]]) -> str:
    if not docs:
        return ""
    jobs = [(p, d) for p, d in docs if "median_tokens_per_s" in d]
    io = [(p, d) for p, d in docs if "median_write_gbps" in d]
    rows = []
    for path, d in jobs:
        args = next((r["bench_args"] for r in d["runs"] if r.get("bench_args")), [])
        clip = args[args.index("--gradient-clipping") + 1] if "--gradient-clipping" in args else "none"
        limit = args[args.index("--ssd-bandwidth") + 1] if "--ssd-bandwidth" in args else "none"
        rounds = len({r["round"] for r in d["runs"]})
        med, ratio = d["median_tokens_per_s"], d["ratio_to_one_member"]
        share = _per_count(d, striped_ssd_share)
        rest = _per_count(d, lambda r: None if striped_ssd_share(r) is None
                          else r["seconds_per_step"] * (1.0 - striped_ssd_share(r)))
        rows.append([f"`{os.path.basename(path)}`", d["date"][:16].replace("T", " "), limit, clip, str(rounds),
                     f"{_load(d['loadavg_start'])} / {_load(d['loadavg_end'])}",
                     " / ".join(f"{med[n]:.2f}" for n in sorted(med)),
                     " / ".join(f"x{ratio[n]:.2f}" for n in sorted(ratio) if n != "1"), share, rest])
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
        "1, 2 or 3 members, loop devices over sparse files in /dev/shm, each limited to the table's limit per member "
        "by its own blkio limit (backing files on the disk would share the disk's one limit), the runs at nice -10. "
        "The training job is `memascend bench --model bench-llama-136m --seq-len 32 --steps 4 --dtype fp32 --runs "
        "memascend --ssd-bandwidth LIMIT` on the striped region, the member counts interleaved round by round; "
        "tokens/s is each member count's median. SSD share: the busier direction's bytes at the members' summed "
        "limits over the measured s/step; the rest of the step (s/step x (1 - share)) is time the SSD idles, which "
        "more members do not shorten. Commands: " + ", ".join(f"`{d['command']}`" for _, d in jobs + io) + ".", "",
        table(["document", "date (UTC)", "limit per member", "clipping", "rounds", "load start / end",
               "tokens/s 1 / 2 / 3 members", "2 / 3 members vs 1", "SSD share 1 / 2 / 3", "rest of the step s"],
              rows), "",
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
