"""`memascend prepare-ssd` on region files (no root needed): exit codes, stdout/stderr split, text.

Runs through `memascend_cli.app.main`, the console-script entry point, so expected errors show
as the user sees them (`error:` / `hint:` on stderr, exit 1 or 2). tmp_path must be on a file
system that enforces O_DIRECT (ext4 on CI), not tmpfs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from memascend_cli.ssd import region
from memascend_cli.app import app, main

MiB = 1024**2


class _Entry:
    """Lets CliRunner drive `main()` (which maps MemascendError to exit codes) like a click command."""

    name = "memascend"

    def main(self, args=(), prog_name=None, **_):
        main(list(args))


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(_Entry(), list(args), input=input)


@pytest.fixture
def region_path(tmp_path):
    fstype = _fstype(str(tmp_path))
    if fstype in ("tmpfs", "ramfs", "overlay"):
        pytest.skip(f"tmp_path is on {fstype}, where O_DIRECT is refused or unenforced; set --basetemp to an ext4/xfs directory")
    return str(tmp_path / "memascend.region")


def _fstype(path: str) -> str:
    from memascend_cli.ssd.blockdev import mount_for_path, read_mountinfo

    m = mount_for_path(os.path.realpath(path), read_mountinfo())
    return m.fstype if m else "unknown"


def test_create_info_wipe_round_trip(region_path):
    r = run("prepare-ssd", region_path, "--size", "64MiB", "--yes", "--probe-mib", "16", "--label", "ci", "--ranks", "2")
    assert r.exit_code == 0, r.stderr
    assert "memascend region on" in r.stdout and "probe samples" in r.stdout
    assert "ready:" in r.stderr
    assert os.path.getsize(region_path) == 64 * MiB

    r = run("prepare-ssd", "--info", region_path)
    assert r.exit_code == 0, r.stderr
    assert "ci" in r.stdout and "rank 1" in r.stdout and "GB/s" in r.stdout

    r = run("prepare-ssd", "--info", region_path, "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    h = d["header"]
    assert h["label"] == "ci" and h["capacity_bytes"] == 64 * MiB and h["alignment_bytes"] == 4096
    assert [x["rank"] for x in h["ranks"]] == [0, 1]
    p = h["probe"]
    assert p["read_gbps"] > 0 and p["write_gbps"] > 0 and p["probe_bytes"] == 16 * MiB
    assert p["backend"] and p["best_queue_depth"] in (8, 32) and len(p["samples"]) == 6
    # The probe touched the data area only: the header still decodes and the reserved area is zero.
    with open(region_path, "rb") as f:
        head = f.read(h["data_start_bytes"])
    assert region.decode(head[: region.HEADER_BYTES]).uuid == h["uuid"]
    assert not any(head[region.HEADER_BYTES :])

    r = run("prepare-ssd", "--wipe", region_path)
    assert r.exit_code == 2 and "needs confirmation and stdin is not a terminal" in r.stderr
    assert os.path.exists(region_path)
    r = run("prepare-ssd", "--wipe", region_path, "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["actions"][0]["op"] == "unlink"
    assert not os.path.exists(region_path)


def test_create_json_no_probe(region_path):
    r = run("prepare-ssd", region_path, "--size", "8MiB", "--no-probe", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["header"]["probe"] is None and d["kind"] == "file"
    assert [a["op"] for a in d["actions"]] == ["create", "fallocate", "write-header"]
    assert region.read_header(region_path).probe is None


def test_dry_run_touches_nothing_and_lists_byte_ranges(region_path):
    r = run("prepare-ssd", region_path, "--size", "64MiB", "--ranks", "2", "--probe-mib", "16", "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    assert not os.path.exists(region_path)
    d = json.loads(r.stdout)
    assert d["dry_run"] is True
    header_writes = [a for a in d["actions"] if a["op"] == "write-header"]
    assert header_writes and all((a["start_byte"], a["end_byte"]) == (0, 4095) for a in header_writes)
    probe = next(a for a in d["actions"] if a["op"] == "probe")
    assert probe["start_byte"] == d["header"]["data_start_bytes"] and probe["bytes"] == 16 * MiB
    parts = {row["part"]: row for row in d["layout"]}
    assert parts["header"]["end_byte"] == 4095
    assert parts["rank 0"]["end_byte"] + 1 == parts["rank 1"]["start_byte"]

    r = run("prepare-ssd", region_path, "--size", "64MiB", "--dry-run")
    assert r.exit_code == 0 and "nothing was touched" in r.stdout and "rank 0" in r.stdout
    assert not os.path.exists(region_path)


def test_reinit_needs_force_and_confirmation(region_path):
    assert run("prepare-ssd", region_path, "--size", "8MiB", "--no-probe").exit_code == 0
    old_uuid = region.read_header(region_path).uuid

    r = run("prepare-ssd", region_path, "--no-probe", "--yes")
    assert r.exit_code == 1
    assert "error: refusing to prepare" in r.stderr and "already holds a memascend region" in r.stderr
    assert "hint:" in r.stderr and "--force" in r.stderr

    r = run("prepare-ssd", region_path, "--no-probe", "--force")
    assert r.exit_code == 2 and "add --yes" in r.stderr

    r = run("prepare-ssd", region_path, "--no-probe", "--force", "--yes", "--size", "16MiB", "--json")
    assert r.exit_code == 0, r.stderr
    new = region.read_header(region_path)
    assert new.uuid != old_uuid and new.capacity_bytes == 16 * MiB == os.path.getsize(region_path)


def test_corrupted_header_is_named(region_path):
    assert run("prepare-ssd", region_path, "--size", "8MiB", "--no-probe").exit_code == 0
    with open(region_path, "r+b") as f:
        f.seek(700)
        b = f.read(1)
        f.seek(700)
        f.write(bytes([b[0] ^ 0x40]))
    r = run("prepare-ssd", "--info", region_path)
    assert r.exit_code == 1
    assert f"error: {region_path}: checksum mismatch at header bytes 512..767" in r.stderr
    assert "hint:" in r.stderr
    # Wiping a damaged header is allowed, but only with --force.
    assert run("prepare-ssd", "--wipe", region_path, "--yes").exit_code == 1
    assert run("prepare-ssd", "--wipe", region_path, "--yes", "--force").exit_code == 0


def test_tmpfs_is_refused():
    if not os.path.isdir("/dev/shm") or _fstype("/dev/shm") != "tmpfs":
        pytest.skip("/dev/shm is not a tmpfs on this machine")
    path = f"/dev/shm/memascend-test-{os.getpid()}.region"
    r = run("prepare-ssd", path, "--size", "64MiB", "--yes", "--force")
    assert r.exit_code == 1
    assert "it is on tmpfs, which keeps file data in RAM" in r.stderr
    assert "ext4/xfs" in r.stderr
    assert not os.path.exists(path)


def test_missing_size(region_path):
    r = run("prepare-ssd", region_path, "--yes")
    assert r.exit_code == 2
    assert f"error: creating the region file {region_path} needs --size" in r.stderr


@pytest.mark.parametrize("size, message", [("64", "--size '64' has no unit"), ("-5GiB", "must not be negative"), ("64XB", "unknown unit")])
def test_bad_size(region_path, size, message):
    r = run("prepare-ssd", region_path, "--size", size, "--yes")
    assert r.exit_code == 2 and message in r.stderr
    assert not os.path.exists(region_path)


def test_too_small_for_ranks(region_path):
    r = run("prepare-ssd", region_path, "--size", "1MiB", "--no-probe")
    assert r.exit_code == 2 and "too small" in r.stderr
    assert not os.path.exists(region_path)


def test_unknown_existing_file_refused_even_with_force(region_path):
    with open(region_path, "wb") as f:
        f.write(b"precious data" * 1000)
    r = run("prepare-ssd", region_path, "--size", "8MiB", "--yes", "--force")
    assert r.exit_code == 1 and "is not a memascend region" in r.stderr
    with open(region_path, "rb") as f:
        assert f.read(13) == b"precious data"


def test_directory_target(tmp_path):
    r = run("prepare-ssd", str(tmp_path), "--size", "8MiB")
    assert r.exit_code == 1 and "is a directory" in r.stderr


def test_info_without_region(region_path):
    with open(region_path, "wb") as f:
        f.truncate(MiB)
    r = run("prepare-ssd", "--info", region_path)
    assert r.exit_code == 1 and "holds no memascend region" in r.stderr
    r = run("prepare-ssd", "--info", region_path + ".missing")
    assert r.exit_code == 2 and "does not exist" in r.stderr


def test_wipe_refuses_foreign_file(region_path):
    with open(region_path, "wb") as f:
        f.write(b"x" * 8192)
    r = run("prepare-ssd", "--wipe", region_path, "--yes", "--force")
    assert r.exit_code == 1 and "nothing to wipe" in r.stderr
    assert os.path.exists(region_path)


def test_modes_conflict(region_path):
    r = run("prepare-ssd", "--info", "--wipe", region_path)
    assert r.exit_code == 2 and "--info and --wipe cannot be combined" in r.stderr
    r = run("prepare-ssd", "--info")
    assert r.exit_code == 2 and "--info needs a TARGET" in r.stderr
    r = run("prepare-ssd", "--list", region_path)
    assert r.exit_code == 2


def test_list_json():
    r = run("prepare-ssd", "--list", "--json")
    assert r.exit_code == 0, r.stderr
    devices = json.loads(r.stdout)["devices"]
    for d in devices:
        assert d["status"] in ("safe", "force", "refused")
        assert {"path", "size_bytes", "model", "rotational", "transport", "mountpoints", "signatures", "safe"} <= set(d)
        if d["mountpoints"]:
            assert d["safe"] is False


def test_list_table_without_target():
    r = run("prepare-ssd")
    assert r.exit_code == 0, r.stderr
    assert "candidate devices" in r.stdout


def test_registered_in_app_help():
    from typer.testing import CliRunner as TyperRunner

    r = TyperRunner().invoke(app, ["prepare-ssd", "--help"])
    assert r.exit_code == 0
    for flag in ("--size", "--ranks", "--dry-run", "--yes", "--force", "--info", "--wipe", "--list", "--json", "--no-probe", "--probe-mib"):
        assert flag in r.stdout


def test_command_module_imports_no_torch():
    code = "import sys, memascend_cli.commands.prepare_ssd, memascend_cli.ssd.region, memascend_cli.ssd.probe, memascend_cli.ssd.safety; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


@pytest.fixture
def fake_terminal(monkeypatch):
    # CliRunner's stdin is a pipe; stand in for a terminal so the typed-name prompt runs.
    import memascend_cli.commands.prepare_ssd as cmd

    monkeypatch.setattr(cmd, "_stdin_is_tty", lambda: True)


def test_prompt_wrong_name_writes_nothing(region_path, fake_terminal):
    assert run("prepare-ssd", region_path, "--size", "8MiB", "--no-probe").exit_code == 0
    uuid = region.read_header(region_path).uuid
    r = run("prepare-ssd", region_path, "--force", "--no-probe", input="nope\n")
    assert r.exit_code == 2 and "confirmation did not match `memascend.region`; nothing was written" in r.stderr
    assert region.read_header(region_path).uuid == uuid


def test_prompt_typed_name_confirms(region_path, fake_terminal):
    assert run("prepare-ssd", region_path, "--size", "8MiB", "--no-probe").exit_code == 0
    r = run("prepare-ssd", "--wipe", region_path, input="memascend.region\n")
    assert r.exit_code == 0, r.stderr
    assert not os.path.exists(region_path)


def test_mistyped_device_is_not_a_new_file():
    r = run("prepare-ssd", "/dev/memascend-no-such-disk", "--size", "8MiB")
    assert r.exit_code == 2 and "/dev/memascend-no-such-disk does not exist" in r.stderr
    assert not os.path.exists("/dev/memascend-no-such-disk")
