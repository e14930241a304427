"""`memascend train` on a region striped across two members, and a member that fails mid-run.

The members are files on faultfs (FUSE) or, for a device that goes away, a loop device over a file on faultfs whose
server is killed. Each case starts the real CLI, waits until checkpoint 2 is complete, then breaks member 2: the run must
end in exactly one `error:` line naming member 2 and its path, leave checkpoint 2 complete and verifiable, and
`--resume` on a healthy striped region must give the uninterrupted striped run's losses bit for bit.

Root (FUSE, loop devices) and slow: 6 launches of tiny-cpu (up to 6 steps). Helpers from test_train_faults.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.integration.test_prepare_ssd_loop import _loop_skip_reason
from tests.integration.test_striped_region import kill_faultfs_server, mount_faultfs
from tests.integration.test_train_cpu import REPO, TINY, losses, memascend
from tests.integration.test_train_faults import COMMON, _complete_checkpoints, _errors, _verify_checkpoint, run_until

pytestmark = [pytest.mark.slow, pytest.mark.root]
pytest.importorskip("deepspeed")
SSD = (*COMMON, "--placement", "ssd")  # every state on the region (a job this small would fit the DRAM tier)


def _prepare(*members: str) -> str:
    subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", *members, "--size", "256MiB", "--no-probe",
                    "--yes"], check=True, capture_output=True, cwd=REPO)
    return members[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run on a healthy two-member striped region."""
    if os.geteuid() != 0:
        pytest.skip("needs root (FUSE mounts, loop devices)")
    d = tmp_path_factory.mktemp("striped-ref")
    run = str(d / "run")
    memascend(TINY, "--output-dir", run, *SSD, "--region", _prepare(str(d / "a.bin"), str(d / "b.bin")))
    return losses(run)


@pytest.fixture
def fuse(tmp_path):
    yield from mount_faultfs(tmp_path)


def _stopped_naming_member_2(p, run: str, member: str, errno_text: str, reference: dict) -> None:
    errors = _errors(p.stderr)
    assert p.returncode == 1 and len(errors) == 1, p.stderr[-3000:]
    assert re.search(rf"failed: member 2 of 2 \({re.escape(member)}\): .*{errno_text}", errors[0]), errors
    assert "--resume" in p.stderr  # the hint
    assert _complete_checkpoints(run)[0] == "step-0000002"
    _verify_checkpoint(run, 2)
    for step, loss in losses(run).items():
        assert loss == pytest.approx(reference[step], rel=1e-6, abs=0)


def _resume_on_healthy_striped_region(tmp_path, run: str, reference: dict) -> None:
    healthy = _prepare(str(tmp_path / "healthy-a.bin"), str(tmp_path / "healthy-b.bin"))
    memascend(TINY, "--output-dir", run, *SSD, "--region", healthy, "--resume")
    assert losses(run) == reference


@pytest.mark.parametrize("action, errno_text", [("eio", r"errno 5 \(Input/output error\)"),
                                                pytest.param("enospc", r"errno 28 \(No space left on device\)",
                                                             marks=pytest.mark.long)])
def test_a_member_failing_mid_run_stops_with_its_name_and_resumes_exactly(reference, fuse, tmp_path, action,
                                                                           errno_text):
    members = [fuse.path("member0.bin"), fuse.path("member1.bin")]
    run = str(tmp_path / "run")
    p = run_until((TINY, "--output-dir", run, *SSD, "--region", _prepare(*members)), run,
                  {"event": "checkpoint", "step": 2},
                  lambda: fuse.set_rules([{"op": "write", "path": "member1.bin", "action": action, "count": -1}]))
    _stopped_naming_member_2(p, run, members[1], errno_text, reference)
    if action == "eio":
        _resume_on_healthy_striped_region(tmp_path, run, reference)


# Long (39 s): the member's EIO above stops the job with the member's name and resumes exactly; here the same errno
# comes from a loop device whose backing server is killed.
@pytest.mark.long
def test_a_member_device_removed_mid_run(reference, fuse, tmp_path):
    """Member 2 is a loop device over a faultfs file; the server is killed under it (the drive drops off the bus)."""
    reason = _loop_skip_reason()
    if reason:
        pytest.skip(reason)
    subprocess.run(["fallocate", "-l", "256MiB", str(tmp_path / "backing" / "member1.img")], check=True)
    loop = subprocess.run(["losetup", "-f", "--show", fuse.path("member1.img")], check=True, capture_output=True,
                          text=True).stdout.strip()

    try:
        run = str(tmp_path / "run")
        first = str(tmp_path / "member0.bin")
        subprocess.run([sys.executable, "-m", "memascend_cli", "prepare-ssd", first, loop, "--size", "256MiB",
                        "--no-probe", "--yes"], check=True, capture_output=True, cwd=REPO)
        p = run_until((TINY, "--output-dir", run, *SSD, "--region", first), run, {"event": "checkpoint", "step": 2},
                      lambda: kill_faultfs_server(fuse))
        _stopped_naming_member_2(p, run, loop, r"errno 5 \(Input/output error\)", reference)
        _resume_on_healthy_striped_region(tmp_path, run, reference)
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)
