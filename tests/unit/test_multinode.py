"""Multi-node layout: hostfiles with a region per node, the node preflight, network file systems refused, and what
`train --dry-run` writes for a multi-node run (nodes.json, .deepspeed_env). Real region files where a check reads
one; the DeepSpeed launch over two "nodes" is in tests/integration/test_train_multinode.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from memascend_cli.errors import BadInput
from memascend_cli.run.hostfile import HostEntry, active_nodes, node_regions, parse_hostfile
from memascend_cli.run.launch import build_launch
from memascend_cli.run.node_preflight import NodeFacts, assess_node, gather_node_facts
from memascend_cli.run.preflight import Facts, assess
from memascend_cli.run.recipe import recipe_from_dict
from memascend_cli.ssd.safety import TargetFacts, is_network_fs
from memascend_cli.ssd.safety import assess as assess_target

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "presets", "train", "tiny-cpu.yaml")


def test_hostfile_with_regions_is_read_as_deepspeed_reads_it():
    text = "# two nodes\nnode-a slots=2 region=/dev/nvme1n1\n\nnode-b slots=2\n10.0.0.3 slots=1 region=/r.bin\n"
    entries = parse_hostfile(text)
    assert entries == [HostEntry("node-a", 2, "/dev/nvme1n1"), HostEntry("node-b", 2), HostEntry("10.0.0.3", 1, "/r.bin")]
    assert active_nodes(entries, 2) == entries[:2] and active_nodes(entries, None) == entries
    assert node_regions(entries[:2], "/mnt/nvme/r.region") == ["/dev/nvme1n1", "/mnt/nvme/r.region"]
    # DeepSpeed itself ignores what follows `slots=N` (runner.py _parse_hostfile matches ^(\S+)\s+slots=(\d+)).
    runner = pytest.importorskip("deepspeed.launcher.runner")
    assert dict(runner._parse_hostfile(text.splitlines())) == {"node-a": 2, "node-b": 2, "10.0.0.3": 1}


@pytest.mark.parametrize("text, words", [
    ("node-a 2\n", "is not `HOST slots=N`"),
    ("node-a slots=2 regoin=/x\n", "unknown field 'regoin=/x'"),
    ("node-a slots=2\nnode-a slots=1\n", "listed twice"),
    ("node-a slots=0\n", "slots=0"),
    ("# nothing\n", "lists no host"),
])
def test_bad_hostfiles_are_one_line_errors(text, words):
    with pytest.raises(BadInput, match=words.replace("`", ".").replace("(", ".").replace(")", ".")):
        parse_hostfile(text)


def test_every_node_needs_a_region():
    with pytest.raises(BadInput, match="no region for node-b") as e:
        node_regions([HostEntry("node-a", 1, "/r"), HostEntry("node-b", 1)], None)
    assert "region=PATH" in e.value.hint
    with pytest.raises(BadInput, match="num_nodes is 3"):
        active_nodes([HostEntry("a", 1)], 3)


@pytest.mark.parametrize("fstype, network", [("nfs4", True), ("nfs", True), ("cifs", True), ("fuse.sshfs", True),
                                             ("fuse.glusterfs", True), ("lustre", True), ("ext4", False),
                                             ("xfs", False), ("fuse.faultfs", False), (None, False)])
def test_network_file_systems(fstype, network):
    assert is_network_fs(fstype) is network


def test_prepare_ssd_refuses_a_region_file_on_a_network_file_system():
    facts = TargetFacts(path="/shared/r.region", real_path="/shared/r.region", kind="file", exists=False,
                        requested_size_bytes=1 << 30, fstype="nfs4", o_direct_ok=True, free_bytes=1 << 40)
    v = assess_target(facts)
    assert not v.ok and any("nfs4, a network file system" in r for r in v.refusals)


def _facts(**kw) -> NodeFacts:
    base = {"host": "node-b", "region": "/dev/nvme1n1", "local_ranks": 2, "sub_regions": 2}
    return NodeFacts(**{**base, **kw})


@pytest.mark.parametrize("kw, words", [
    ({"exists": False}, "does not exist there"),
    ({"fstype": "nfs4"}, "nfs4, which is a network file system"),
    ({"fstype": "tmpfs"}, "tmpfs, which keeps data in RAM"),
    ({"header_error": "holds no memascend region (not prepared)"}, "holds no memascend region"),
    ({"sub_regions": 1}, "has 1 rank sub-region(s), the node runs 2"),
    ({"busy": "region /dev/nvme1n1: rank 0's sub-region is in use by pid 7"}, "in use by pid 7"),
])
def test_node_problems_name_the_node(kw, words):
    message, hint = assess_node(_facts(**kw))
    assert message.startswith("node node-b") and words in message and hint


def test_a_good_node_passes_and_real_regions_are_read(tmp_path):
    assert assess_node(_facts()) is None
    path = str(tmp_path / "node.region")
    subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", path, "--size", "64MiB", "--ranks", "1",
                    "--no-probe", "--yes"], check=True, capture_output=True)
    f = gather_node_facts(path, 1)
    assert (f.exists, f.sub_regions, f.header_error, f.busy) == (True, 1, None, None) and assess_node(f) is None
    message, _ = assess_node(gather_node_facts(path, 2))
    assert "has 1 rank sub-region(s), the node runs 2" in message
    missing, _ = assess_node(gather_node_facts(str(tmp_path / "nope.region"), 1))
    assert "does not exist there" in missing


def test_preflight_leaves_per_node_regions_to_the_nodes():
    facts = Facts(dram_available_bytes=1 << 40, host_peak_bytes=1 << 30, memlock_limit_bytes=None,
                  can_lock_unlimited=True, locked_bytes=0, stock_deepspeed=False, region_path=None,
                  node_regions=["/dev/nvme1n1", "/dev/nvme1n1"])
    (region,) = [c for c in assess(facts) if c.name == "region"]
    assert region.ok and "2 nodes" in region.message


def test_multi_node_launch_carries_the_environment_to_the_other_nodes():
    r = recipe_from_dict({"model": "tiny-llama", "dataset": "d.jsonl", "hostfile": "/h", "ranks": 1})
    spec = build_launch(r, "/runs/m", num_gpus=0, cpu_cores=4, engine="memascend", resume=False,
                        python_executable="/v/bin/python", extra_env={"TORCH_EXTENSIONS_DIR": "/ext"})
    assert spec.deepspeed_env == {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "4", "TORCH_EXTENSIONS_DIR": "/ext",
                                  "MKL_DYNAMIC": "FALSE", "MKL_CBWR": "AUTO",
                                  "THP_MEM_ALLOC_ENABLE": "1"}  # the engine's allocator policy, on every node
    single = build_launch(recipe_from_dict({"model": "tiny-llama", "dataset": "d.jsonl"}), "/runs/s", num_gpus=0,
                          cpu_cores=4, engine="memascend", resume=False, python_executable="/v/bin/python")
    assert single.deepspeed_env == {}


def test_train_dry_run_writes_each_nodes_region(tmp_path, cli):
    hosts = tmp_path / "hostfile"
    hosts.write_text("127.0.0.1 slots=1 region=/nvme/a.region\nlocalhost slots=1\n")
    run = tmp_path / "run"
    r = cli("train", TINY, "--output-dir", str(run), "--dry-run", "--set", f"hostfile={hosts}",
            "--set", "ranks=1", "--region", "/nvme/shared-name.region")
    assert r.exit_code == 0, r.stderr
    nodes = json.loads((run / "nodes.json").read_text())["nodes"]
    assert [(n["host"], n["region"]) for n in nodes] == [("127.0.0.1", "/nvme/a.region"),
                                                          ("localhost", "/nvme/shared-name.region")]
    doc = json.loads(r.stdout)
    assert doc["launch"]["cmd"][1:3] == ["--hostfile", str(hosts)] and doc["region"] is None
    assert not (run / "region.bin").exists()
    # Without a region for every node: one error line, exit 2.
    r = cli("train", TINY, "--output-dir", str(tmp_path / "run2"), "--dry-run", "--set", f"hostfile={hosts}")
    assert r.exit_code == 2 and r.stderr.startswith("error: a multi-node run needs a node-local region on every node")
