"""Copy a finished `memascend bench --capacity` sitting into docs/bench/capacity/<name>/ for results.md.

    memascend bench --capacity seq --layers 8 --loss hf --dram-cap 8GiB --dtype fp32 --settle-cap 30 --out /work/cap/s8g
    python scripts/record_capacity.py /work/cap/s8g cap8gib-seq-fp32 && python scripts/results.py

Keeps capacity.json and, in one gzip file beside it (probes.json.gz: memascend_cli.bench.document
.write_recorded_probes), each probe's bench.json and memory timelines; leaves out the regions, swap files, logs and
plots. A sitting that did not finish has no capacity.json and is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from memascend_cli.bench.document import write_recorded_probes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEST = os.path.join(REPO, "docs", "bench", "capacity")


def record(src: str, name: str) -> str:
    doc_path = os.path.join(src, "capacity.json")
    with open(doc_path) as f:
        doc = json.load(f)
    dst = os.path.join(DEST, name)
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    with open(os.path.join(dst, "capacity.json"), "w") as f:
        f.write(json.dumps(doc, separators=(",", ":")) + "\n")
    write_recorded_probes(dst, [q["document"] for e in doc["engines"] for q in e["probes"]], src)
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
