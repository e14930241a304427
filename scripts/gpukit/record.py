"""`gpu_check.sh record DIR...`: the calls' output folders, copied back from the GPU machine, merged into one
compact document under docs/bench/gpu/, which scripts/results.py renders. Stdlib only.

Read from each folder when present: gpu_bench.json (the bench phase), cuda_constants.json (the constants phase),
pytest_gpu.xml (the tests phase), gpu_capacity.json (the capacity phase), gpu_placements.json (the placement sweep),
gpu_check.json (every call: its phases and the machine's facts). A dry run's synthetic outputs (the plan's numbers
standing in for the GPU's) are refused unless `allow_synthetic` (the tests' rehearsal of the results page)."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

KIND = "gpu_kit"
SCHEMA_VERSION = 1


def tests_summary(xml_path: str) -> dict:
    """pytest's junit XML as counts and one row per test: (node id, outcome, seconds, message)."""
    root = ET.parse(xml_path).getroot()
    cases = []
    for tc in root.iter("testcase"):
        detail = next((c for c in tc if c.tag in ("failure", "error", "skipped")), None)
        outcome = "passed" if detail is None else {"skipped": "skipped"}.get(detail.tag, "failed")
        message = "" if detail is None else detail.attrib.get("message", "")
        if detail is not None and "Skipped: " in (detail.text or ""):  # a collection skip names its reason here
            message = detail.text.split("Skipped: ", 1)[1].strip()
            message = message[:-2] if message[-2:] in ("')", '")') else message  # the tuple's closing quote
        cls, name = tc.attrib.get("classname", ""), tc.attrib.get("name", "")
        node = f"{cls.replace('.', '/')}.py::{name}" if cls else name
        cases.append({"test": node, "outcome": outcome, "seconds": round(float(tc.attrib.get("time", 0)), 1),
                      "message": message[:200]})
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "skipped")}
    return {**counts, "cases": cases}


def _read(folder: str, name: str):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    if name.endswith(".xml"):
        return tests_summary(path)
    with open(path) as f:
        return json.load(f)


OUTPUTS = {"bench": "gpu_bench.json", "cuda_constants": "cuda_constants.json", "tests": "pytest_gpu.xml",
           "capacity": "gpu_capacity.json", "placements": "gpu_placements.json"}
"""The phases' outputs a record keeps, by their key in the document."""


def merge(folders: list[str], run_args: str | None = None, allow_synthetic: bool = False) -> dict:
    """One document from the calls' output folders, in call order (a later call's phase output wins)."""
    doc: dict = {"kind": KIND, "schema_version": SCHEMA_VERSION, "calls": []}
    for folder in folders:
        check = _read(folder, "gpu_check.json") or {}
        call = {k: check.get(k) for k in ("call", "ok", "phases", "problems", "seconds", "budget_s", "run_args",
                                          "date", "synthetic")}
        if call["call"] is None and not call["run_args"]:
            call["run_args"] = run_args
        doc["calls"].append(call)
        doc["facts"] = check.get("facts") or doc.get("facts")
        for key, name in OUTPUTS.items():
            got = _read(folder, name)
            if got is None:
                continue
            if isinstance(got, dict) and got.get("synthetic") and not allow_synthetic:
                raise ValueError(f"{os.path.join(folder, name)} is a dry run's synthetic output, not a measurement")
            doc[key] = got
    if not any(k in doc for k in OUTPUTS):
        raise ValueError(f"none of {', '.join(folders)} holds a GPU kit output ({', '.join(OUTPUTS.values())})")
    constants = doc.get("cuda_constants") or {}
    doc["device"] = constants.get("device") or ((doc.get("facts") or {}).get("gpus") or [
        "synthetic" if any(c.get("synthetic") for c in doc["calls"]) else "?"])[0].split(",")[0]
    bench_dates = [run_doc["meta"]["date"] for by_run in ((doc.get("bench") or {}).get("documents") or {}).values()
                   for run_doc in by_run.values()]
    call_dates = [c["date"] for c in doc["calls"] if c.get("date")]
    doc["measured_at"] = constants.get("measured_at") or min(bench_dates + call_dates, default=None)
    return doc


def default_name(doc: dict) -> str:
    device = doc["device"].replace("NVIDIA ", "").replace(" ", "-").lower()
    models = "-".join(sorted((doc.get("bench") or {}).get("documents") or {})
                      + [k for k in ("capacity", "placements") if k in doc]) or "tests"
    return f"{device}-{models}-{(doc.get('measured_at') or '?')[:10]}.json"


def record(folders: list[str], out_dir: str, run_args: str | None = None) -> str:
    doc = merge(folders, run_args)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, default_name(doc))
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))  # one line: the repository counts tracked lines
        f.write("\n")
    return path
