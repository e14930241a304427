"""Copy a finished `memascend bench --capacity` sitting into docs/bench/capacity/<name>/ for results.md.

    memascend bench --capacity seq --layers 8 --loss hf --dram-cap 8GiB --dtype fp32 --settle-cap 30 --out /work/cap/s8g
    python scripts/record_capacity.py /work/cap/s8g cap8gib-seq-fp32 && python scripts/results.py

Keeps capacity.json and each probe's bench.json (written compact) with its memory timeline side file; leaves out the
regions, swap files, logs and plots. A sitting that did not finish has no capacity.json and is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEST = os.path.join(REPO, "docs", "bench", "capacity")


def record(src: str, name: str) -> str:
    doc_path = os.path.join(src, "capacity.json")
    with open(doc_path) as f:
        doc = json.load(f)
    dst = os.path.join(DEST, name)
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    shutil.copy(doc_path, dst)
    for engine in doc["engines"]:
        for probe in engine["probes"]:
            rel = os.path.dirname(probe["document"])
            os.makedirs(os.path.join(dst, rel), exist_ok=True)
            with open(os.path.join(src, probe["document"])) as f:
                bench = json.load(f)
            with open(os.path.join(dst, probe["document"]), "w") as f:
                f.write(json.dumps(bench, separators=(",", ":")) + "\n")
            timeline = os.path.join(src, rel, "bench.timeline.json.gz")
            if os.path.exists(timeline):
                shutil.copy(timeline, os.path.join(dst, rel))
    return dst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="the sitting's --out directory")
    ap.add_argument("name", help="folder under docs/bench/capacity/, e.g. cap8gib-seq-fp32")
    args = ap.parse_args(argv)
    if not os.path.exists(os.path.join(args.src, "capacity.json")):
        print(f"error: {os.path.join(args.src, 'capacity.json')} does not exist\n"
              "hint: wait for the sitting to finish (it writes capacity.json last)", file=sys.stderr)
        return 2
    print("recorded", os.path.relpath(record(args.src, args.name), REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
