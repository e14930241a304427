"""Sections of the results pages (docs/results/) for recorded runs of tests and recipes (not benchmarks): the parity
tests repeated, the long tests and the long training soak (reliability), LLaMA-Factory's own examples (ecosystem).
Imported by scripts/results.py."""

from __future__ import annotations

import os

from results_common import REPO, load_one, table


def section_parity_repeat(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    rows = [[str(r["run"]), str(r["exit_code"]), str(r["passed"]), str(len(r["failed"])), str(r["skipped"]),
             f"{r['seconds']:.0f}", "yes" if r["terminate_called"] else "no"] for r in doc["runs"]]
    failing = sorted({t for r in doc["runs"] for t in r["failed"]})
    return "\n".join([
        "## Parity tests, repeated", "",
        f"`{doc['command']}` on {doc['host']}, {doc['date']}: `{doc['tests']}` run {len(doc['runs'])} times in a row "
        "(bit-for-bit loss parity of the engine against stock DeepSpeed; every stock child exits without interpreter "
        "teardown, memascend_engine/hard_exit.py). Raw data: " + f"`{os.path.relpath(path, REPO)}`.", "",
        table(["run", "exit", "passed", "failed", "skipped", "seconds", "abort at exit"], rows), "",
        ("Failing tests: " + ", ".join(f"`{t}`" for t in failing)) if failing else "No run failed.", ""]) + "\n"


def section_long_tests(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    (run,) = doc["runs"]
    failed = set(run["failed"])
    rows = [[f"`{name.split('.')[-1]}`", "failed" if name in failed else "passed", f"{seconds:.0f}"]
            for name, seconds in sorted(run["test_seconds"].items(), key=lambda kv: -kv[1])]
    return "\n".join([
        "## Long tests (outside the default run)", "",
        f"`{doc['command']}` on {doc['host']}, {doc['date']}: the tests marked `long` (pyproject.toml), which the "
        "README's test command leaves out for time; each has a shorter form in the default run. "
        f"Exit {run['exit_code']}: {run['passed']} passed, {len(failed)} failed, {run['skipped']} skipped in "
        f"{run['seconds']:.0f} s. Raw data: `{os.path.relpath(path, REPO)}`.", "",
        table(["test", "result", "seconds"], rows), ""]) + "\n"


def section_ci(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    rows = []
    for r in doc["runs"]:
        tests_at = next((p["at_s"] for p in r["phases"] if p["what"].startswith("running the tests")), None)
        c = r["counts"]
        rows.append([r["date"][:16].replace("T", " "), r["commit"][:8], str(r["exit_code"]), f"{r['seconds'] / 60:.1f}",
                     "" if tests_at is None else f"{tests_at / 60:.1f}",
                     "" if r["tests_s"] is None else f"{r['tests_s'] / 60:.1f}",
                     f"{c.get('passed', 0)} / {c.get('failed', 0)} / {c.get('skipped', 0)}",
                     f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f}"])
    last = doc["runs"][-1]
    m = last["machine"]
    slow = [f"- `{t['test']}` ({t['when']}): {t['seconds']:.0f} s" for t in last["slowest"]]
    return "\n".join([
        "## The test command from a fresh clone", "",
        f"`{doc['command']}`: {doc['what']}, on {m['host']} ({m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB). "
        "Setup is the venv, torch, DeepSpeed and its CPU ops built from nothing (pip's cache warm: "
        f"{'yes' if last['pip_cache_warm'] else 'no'}); the load average is the one-minute figure before and after "
        f"the run (other work on the machine). Raw data: `{os.path.relpath(path, REPO)}`.", "",
        table(["date (UTC)", "commit", "exit", "minutes", "setup", "tests", "passed / failed / skipped", "load"],
              rows), "",
        "The slowest tests of the last run:", "", *slow, ""]) + "\n"


def section_hub(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    rows = []
    for group in ("plan", "train", "refusals"):
        for r in doc[group]:
            closed = "no connection to" in (r["error"] or "")
            env = ", ".join(f"{k}={('(closed port)' if closed else '(local hub)') if k == 'HF_ENDPOINT' else v}"
                            for k, v in r["env"].items())
            said = r["error"] or "; ".join(r.get("would_download") or []) or (
                f"trained steps {', '.join(map(str, r['steps']))}" if r.get("steps") else "planned")
            rows.append([f"`{r['command']}`", env, str(r["exit"]), f"{r['seconds']:.1f}",
                         "yes" if r["traceback"] else "no", said.removeprefix("error: ")])
    return "\n".join([
        "## Models and datasets from the Hugging Face hub", "",
        f"`{doc['command']}` on {doc['host']}, {doc['date']}, at commit `{doc['memascend_commit'][:12]}`: no route "
        "to the hub here, so the runs use caches laid out as huggingface_hub and datasets leave them, a local server "
        "that answers as the hub does (the endpoint marked local hub), or a closed port (no network). Raw data: "
        f"`{os.path.relpath(path, REPO)}`.", "",
        table(["command", "environment", "exit", "seconds", "traceback", "what it said or did"], rows), ""]) + "\n"


def section_llamafactory_examples(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""

    def outcome(step: dict) -> str:
        if step["traceback"]:
            return "**traceback**"
        return "ok" if step["exit"] in (0, 1) else f"refused (exit {step['exit']})"

    rows, said, passed = [], [], 0
    for r in doc["examples"]:
        plan, dry = r["plan"], r["dry_run"]
        passed += outcome(plan) == outcome(dry) == "ok"
        rows.append([f"`{r['example']}`", outcome(plan), outcome(dry)])
        error = (dry["error"] or plan["error"] or "").removeprefix("error: ")
        if error:  # under the table: a reason reads as a sentence, not as a cell hundreds of columns wide
            said.append(f"- `{r['example']}`: {error}")
        said += [f"- `{r['example']}`: {line}" for line in dry.get("downloads", [])]  # a hub dataset not cached
    return "\n".join([
        "## LLaMA-Factory's own examples", "",
        f"`{doc['command']}` on {doc['host']}, {doc['date']}, LLaMA-Factory at commit "
        f"`{doc['llamafactory_commit'][:12]}`: every full-parameter SFT / pre-training example (examples/v1 is the "
        "other trainer's format) with only `model_name_or_path` changed to a local tiny Llama, run from a folder "
        "holding LLaMA-Factory's `data/`. `plan` exits 0 or 1 (fits or not) and `train --dry-run` 0 when it would "
        f"train; a refusal is one `error:` line with a hint. {passed} of {len(rows)} pass both; the rest are refused "
        f"with the reason shown. Raw data: `{os.path.relpath(path, REPO)}`.", "",
        table(["example", "plan", "train --dry-run"], rows), "",
        *(["What memascend says:", "", *said, ""] if said else [])]) + "\n"


def section_soak(path: str) -> str:
    doc = load_one(path)
    if doc is None:
        return ""
    # Older documents kept the first and the last sample; newer ones the floor of the first and last third.
    floor = "fds_floor_first_last_third" in doc
    fds = doc.get("fds_floor_first_last_third") or doc.get("fds_first_last") or [[None], [None]]
    shm = doc["shm_bytes_before_first_last_after"]
    rss = doc["rss_gib_first_last"] or [None, None]
    mib = lambda b: "?" if b is None else f"{b / 2**20:.1f} MiB"  # noqa: E731
    rows = [["steps (checkpoint every, kept)", f"{doc['steps']} ({doc['checkpoint_every']}, {doc['keep']})"],
            ["exit status", str(doc["exit"])],
            [f"host RSS per rank, slope after step {doc['warmup_steps']}",
             f"{doc['rss_slope_mib_per_100_steps']:+.3f} MiB per 100 steps"],
            ["host RSS per rank after warm-up / at the end", f"{rss[0]:.3f} / {rss[1]:.3f} GiB"],
            ["checkpoints: most seen at once / at the end", f"{doc['max_checkpoints_seen']} / {doc['checkpoints_at_end']}"],
            ["open descriptors per rank: " + ("fewest in first / last third" if floor else "first checkpoint / end"),
             f"{fds[0]} / {fds[1]}"],
            ["/dev/shm used: before / first checkpoint / end / after", " / ".join(mib(b) for b in shm)],
            ["job's DeepSpeed /dev/shm segments: most during / after", " / ".join(map(str, doc["job_segments_max_during_at_end"]))]]
    return "\n".join([
        "## Long run: memascend train stays flat", "",
        f"`{doc['command']}` on {doc['host']}, {doc['date']}: the tiny-cpu recipe through the real CLI (memascend "
        "engine, region file in the run directory); host memory per rank from metrics.jsonl every step (slope: least "
        "squares after warm-up; the target is below 1 MiB per 100 steps), descriptors, /dev/shm and checkpoints sampled "
        f"every second. Raw data: `{os.path.relpath(path, REPO)}`." + (f" Note: {doc['note']}." if doc.get("note") else ""),
        "",
        table(["", "value"], rows), ""]) + "\n"
