"""Host memory of DeepSpeed building an op just in time: what the first run of a user's script adds beside the script
while DeepSpeedCPUAdam (or another op) is constructed and its extension is not built yet (torch's cpp_extension runs
ninja, which runs one compiler per source file at once).

A fresh process loads the op into an empty TORCH_EXTENSIONS_DIR; recorded: its ru_maxrss and its children's (wait4:
the largest process of the tree, what a harness reading the script's ru_maxrss sees), the largest summed RSS of the
tree (what a cgroup cap charges), the wall time.

    python benchmarks/op_build_rss.py --out docs/bench/user-script/op-build-cpu-adam.json [--op CPUAdamBuilder]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOAD = ("import json, resource, sys; from deepspeed.ops import op_builder; "
        "getattr(op_builder, sys.argv[1])().load(); "
        "print(json.dumps({'self_maxrss_kib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
        "'children_maxrss_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--op", default="CPUAdamBuilder", help="a class of deepspeed.ops.op_builder")
    args = ap.parse_args(argv)
    sys.path.insert(0, REPO)
    from memascend_cli.bench.sampling import TreeSampler

    with tempfile.TemporaryDirectory(prefix="op-build-", dir="/var/tmp") as ext:
        env = dict(os.environ, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=ext)
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", LOAD, args.op], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        tree = TreeSampler(proc.pid)
        tree.start()
        out, _ = proc.communicate()
        tree.stop()
        wall_s = time.monotonic() - t0
    loaded = json.loads(out.strip().splitlines()[-1]) if proc.returncode == 0 else {}
    largest = max(tree.per_process_max_rss_bytes.values(), key=lambda x: x[1], default=("?", 0))
    doc = {"title": f"DeepSpeed {args.op} built just in time: host memory of the build",
           "command": "python benchmarks/op_build_rss.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
           "machine": {"cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg()},
           "exit_code": proc.returncode, "wall_s": round(wall_s, 1),
           "loader_maxrss_bytes": loaded.get("self_maxrss_kib", 0) * 1024,
           "largest_child_maxrss_bytes": loaded.get("children_maxrss_kib", 0) * 1024,
           "max_tree_rss_bytes": tree.max_tree_rss_bytes,
           "largest_process_sampled": {"name": largest[0], "rss_bytes": largest[1]}}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(doc))
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
