"""Every node checks its own region before training starts (what `train`'s launch node cannot do for the others).

Called on every rank right after deepspeed.init_distributed, before the engine opens the region: this node's region
is its entry in RUN/nodes.json (multi-node runs; index CROSS_RANK, the node rank DeepSpeed's launcher exports), else
the recipe's. The node's first local rank runs memascend_cli.run.node_preflight on it; the verdicts of all ranks are
gathered, so every rank stops at once with the first failing node's one-line reason instead of waiting in
DeepSpeed's first collective for a node that never comes.
"""

from __future__ import annotations

import json
import os

from memascend_cli.run import rundir
from memascend_cli.errors import MemascendError


def node_region(run_dir: str, recipe_region: str | None) -> str | None:
    """This node's region path."""
    path = rundir.path(run_dir, rundir.NODES_JSON)
    if not os.path.exists(path):
        return recipe_region
    with open(path, encoding="utf-8") as f:
        nodes = json.load(f)["nodes"]
    return nodes[int(os.environ.get("CROSS_RANK", "0"))]["region"]


def check_nodes(run_dir: str, recipe_region: str | None, *, local_rank: int) -> str | None:
    """Run the node preflight (collective); returns this node's region or raises MemascendError."""
    import torch.distributed as dist

    from memascend_cli.run.node_preflight import assess_node, gather_node_facts

    region = node_region(run_dir, recipe_region)
    problem = None
    if region and local_rank == 0:
        problem = assess_node(gather_node_facts(region, int(os.environ.get("LOCAL_SIZE", "1"))))
    problems = [problem]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
    first = next((p for p in problems if p), None)
    if first is not None:
        raise MemascendError(*first)
    return region
