"""`memascend train` over two "nodes" on this machine, through DeepSpeed's multi-node launcher (pdsh over ssh).

The hostfile lists 127.0.0.1 and localhost, one rank each, each with its own region file (`region=PATH`): DeepSpeed
treats them as two nodes (its runner ssh-checks the first, pdsh starts one launcher per host with --node_rank), so the
ranks start in ssh sessions with none of the test's environment (RUN/.deepspeed_env carries it). A private sshd runs
on a free port of 127.0.0.1 with throw-away keys; an `ssh` wrapper first in PATH points DeepSpeed's and pdsh's ssh at
it, so nothing of this machine's ssh setup is used or changed. Needs root (sshd), pdsh and openssh-server (both
installed by scripts/bootstrap.sh); skipped with the reason otherwise.

Checked: each node's rank swapped through its own region, the losses equal a
single-node run of the same two ranks, and a node whose region is missing stops the run before training with one
`error:` line naming that node. Slow: three 2-rank launches of 4 steps (4 min on the shared 2-core VM, noisy).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("deepspeed")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "presets", "train", "tiny-cpu.yaml")
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
COMMON = ("--steps", "4", "--set", "ranks=1", "--set", "export=false", "--set", "checkpoint_every=100")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ssh_env(tmp_path_factory):
    """Environment whose `ssh` reaches a private sshd on 127.0.0.1 (both hostfile names resolve there)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a private sshd")
    for tool in ("pdsh", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/bootstrap.sh installs pdsh and openssh-server)")
    if not os.access(SSHD, os.X_OK):
        pytest.skip("sshd is not installed (scripts/bootstrap.sh installs openssh-server)")
    d = tmp_path_factory.mktemp("ssh")
    for key in ("host_key", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    shutil.copy(d / "id.pub", d / "authorized_keys")
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n"
        f"PidFile {d}/sshd.pid\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nStrictModes no\nUsePAM no\n"
        # A node set up like this one (scripts/bootstrap.sh) has the venv first on PATH: Debian's ninja would take
        # the prebuilt DeepSpeed ops as stale and rebuild them (and the next local run would rebuild them back).
        f"SetEnv PATH={os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin\n")
    (d / "ssh_config").write_text(
        f"Host *\n  Port {port}\n  IdentityFile {d}/id\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
        f"  UserKnownHostsFile {d}/known_hosts\n  AddressFamily inet\n  LogLevel ERROR\n")
    bin_dir = d / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {d}/ssh_config \"$@\"\n")
    (bin_dir / "ssh").chmod(0o755)
    made_run_dir = not os.path.isdir("/run/sshd")
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
    sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.PIPE, text=True)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DS_ACCELERATOR": "cpu"}
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(REPO, ".torch_ext"))
    try:
        deadline = time.monotonic() + 20
        while subprocess.run(["ssh", "127.0.0.1", "true"], env=env, capture_output=True).returncode != 0:
            if sshd.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"the private sshd did not come up: {sshd.stderr.read() if sshd.poll() is not None else ''}")
            time.sleep(0.2)
        yield env
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)
        if made_run_dir:
            shutil.rmtree("/run/sshd", ignore_errors=True)


def _prepare(path: str, ranks: int = 1) -> str:
    subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", path, "--size", "256MiB", "--ranks",
                    str(ranks), "--no-probe", "--yes"], check=True, capture_output=True)
    return path


def _train(env, run: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memascend_cli", "train", TINY, "--output-dir", run, *COMMON, *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=900)


def _losses(run: str) -> dict[int, float]:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if r["event"] == "step"}


def test_two_nodes_each_with_its_own_region(ssh_env, tmp_path):
    from memascend_cli.ssd import region

    regions = [_prepare(str(tmp_path / f"node{i}.region")) for i in (0, 1)]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"127.0.0.1 slots=1 region={regions[0]}\nlocalhost slots=1 region={regions[1]}\n")
    run = str(tmp_path / "multi")
    p = _train(ssh_env, run, "--set", f"hostfile={hostfile}")
    assert p.returncode == 0, p.stderr[-4000:]
    with open(os.path.join(run, "nodes.json")) as f:
        assert [n["region"] for n in json.load(f)["nodes"]] == regions
    with open(os.path.join(run, ".deepspeed_env")) as f:
        assert "DS_ACCELERATOR=cpu\n" in f.read()
    # Each node's (only) rank swapped through sub-region 0 of its own region (prepared all zeros).
    for r in regions:
        sub = region.read_header(r).subregion(0)
        with open(r, "rb") as f:
            f.seek(sub.offset_bytes)
            assert any(f.read(8 << 20)), f"nothing was written to {r}"
    multi = _losses(run)
    assert sorted(multi) == [1, 2, 3, 4]

    # The same two ranks on one node, sub-regions 0 and 1 of one region: the same losses (same ranks, same data).
    single = str(tmp_path / "single")
    p = _train(ssh_env, single, "--set", "ranks=2", "--region", _prepare(str(tmp_path / "one.region"), ranks=2))
    assert p.returncode == 0, p.stderr[-4000:]
    assert _losses(single) == multi


def test_a_node_without_its_region_stops_the_run_before_training(ssh_env, tmp_path):
    hostfile = tmp_path / "hostfile"
    missing = str(tmp_path / "not-there.region")
    hostfile.write_text(f"127.0.0.1 slots=1 region={_prepare(str(tmp_path / 'node0.region'))}\n"
                        f"localhost slots=1 region={missing}\n")
    run = str(tmp_path / "run")
    p = _train(ssh_env, run, "--set", f"hostfile={hostfile}")
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert p.returncode == 1 and len(errors) == 1, p.stderr[-4000:]
    assert f"node {socket.gethostname()}: region {missing} does not exist there" in errors[0]
    metrics = os.path.join(run, "metrics.jsonl")
    assert not os.path.exists(metrics) or '"event": "step"' not in open(metrics).read()
