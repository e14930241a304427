"""Join `memascend bench` documents of single points (same job but one swept dimension) into one sweep document,
as `memascend bench --layers A,B,C` writes it (memascend_cli.bench.document.sweep_document), with the points'
memory timelines in the sweep's side file.

    python scripts/join_sweep.py --title "..." --out docs/bench/depth-sweep.json OUT1/bench.json OUT2/bench.json ...

For points measured by separate `bench` invocations (e.g. a sweep cut short and finished by a run of its last
point): each document keeps its own meta (command, date); the sweep's meta lists them all.
"""

from __future__ import annotations

import argparse
import sys

from memascend_cli.bench.document import read_document, sweep_document, write_document


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--title", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("documents", nargs="+")
    args = ap.parse_args(argv)
    docs = []
    for path in args.documents:
        docs.append(read_document(path))
    docs.sort(key=lambda d: (d["job"]["num_params"], d["job"]["seq_len"]))
    result = sweep_document(docs)
    metas = [d.get("meta") or {} for d in docs]
    result["meta"] = {"title": args.title, "date": min(m.get("date", "") for m in metas),
                      "host": metas[0].get("host"),
                      "command": " ; ".join(dict.fromkeys(m.get("command", "?") for m in metas))
                      + " ; python scripts/join_sweep.py"}
    write_document(result, args.out, compact=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
