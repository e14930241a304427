"""DeepSpeed hostfiles with an optional memascend region per node. Pure.

DeepSpeed reads ``host slots=N`` per line (launcher/runner.py _parse_hostfile: the regex ``^(\\S+)\\s+slots=(\\d+)``,
so anything after it is ignored). memascend reads the same lines plus an optional ``region=PATH`` (the node-local
region of that node), so one file serves both:

    node-a slots=8 region=/dev/nvme1n1
    node-b slots=8 region=/mnt/nvme/memascend.region

The nodes DeepSpeed uses are the first ``num_nodes`` hosts in file order (runner.py apply_num_nodes_and_gpus), and
each node's launcher gets its index as ``--node_rank`` (exported to the ranks as CROSS_RANK).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memascend_cli.errors import BadInput

_LINE = re.compile(r"^(\S+)\s+slots=(\d+)(.*)$")
_HINT = "one host per line: `HOST slots=N` (optionally `region=PATH`), as DeepSpeed's hostfile"


@dataclass(frozen=True)
class HostEntry:
    host: str
    slots: int
    region: str | None = None
    """This node's region (None: the recipe's `region`, which must then exist on every node)."""

    def to_dict(self) -> dict:
        return {"host": self.host, "slots": self.slots, "region": self.region}


def parse_hostfile(text: str, source: str = "hostfile") -> list[HostEntry]:
    """The entries of a hostfile, in order; BadInput for lines DeepSpeed would reject or memascend cannot read."""
    out: list[HostEntry] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise BadInput(f"{source} line {n}: {line!r} is not `HOST slots=N`", _HINT)
        region = None
        for token in m.group(3).split():
            key, sep, value = token.partition("=")
            if key == "region" and sep and value:
                region = value
            else:
                raise BadInput(f"{source} line {n}: unknown field {token!r}", _HINT)
        host, slots = m.group(1), int(m.group(2))
        if slots < 1:
            raise BadInput(f"{source} line {n}: {host} has slots={slots}", "give every host at least one slot")
        if any(e.host == host for e in out):
            raise BadInput(f"{source} line {n}: host {host} is listed twice", "list every host once")
        out.append(HostEntry(host, slots, region))
    if not out:
        raise BadInput(f"{source} lists no host", _HINT)
    return out


def active_nodes(entries: list[HostEntry], num_nodes: int | None) -> list[HostEntry]:
    """The nodes DeepSpeed launches on (the first num_nodes, all when None), in node-rank order."""
    if num_nodes is not None and num_nodes > len(entries):
        raise BadInput(f"num_nodes is {num_nodes} but the hostfile lists {len(entries)} host(s)",
                       "lower num_nodes or add hosts to the hostfile")
    return entries[:num_nodes] if num_nodes is not None else list(entries)


def node_regions(nodes: list[HostEntry], recipe_region: str | None) -> list[str]:
    """Each node's region path: its own from the hostfile, else the recipe's (a path that must exist on every node)."""
    missing = [e.host for e in nodes if not (e.region or recipe_region)]
    if missing:
        raise BadInput(f"a multi-node run needs a node-local region on every node; no region for {', '.join(missing)}",
                       "set `region:` to a path that exists on every node (`memascend prepare-ssd` it on each), or "
                       "add `region=PATH` to each host's line in the hostfile")
    return [e.region or recipe_region for e in nodes]
