"""The pure safety rules of prepare-ssd (memascend_cli/ssd/safety.py), on hand-written facts."""

from __future__ import annotations

import json

import pytest

from memascend_cli.ssd.safety import Signature, TargetFacts, assess, parse_blkid_export, parse_wipefs_json, refusal_message

GiB = 1024**3


def blank_device(**overrides) -> TargetFacts:
    facts = TargetFacts(
        path="/dev/nvme1n1", real_path="/dev/nvme1n1", kind="block", size_bytes=1000 * GiB,
        device_name="nvme1n1", device_type="disk", logical_block_bytes=4096, head_blank=True,
    )
    for k, v in overrides.items():
        setattr(facts, k, v)
    return facts


def new_file(**overrides) -> TargetFacts:
    facts = TargetFacts(
        path="/mnt/nvme/r.region", real_path="/mnt/nvme/r.region", kind="file", exists=False,
        requested_size_bytes=200 * GiB, fstype="ext4", o_direct_ok=True, free_bytes=500 * GiB,
    )
    for k, v in overrides.items():
        setattr(facts, k, v)
    return facts


EXT4 = Signature(type="ext4", offset_bytes=0x438, uuid="7b5e")


def test_blank_device_is_safe():
    v = assess(blank_device())
    assert v.ok and v.status == "safe" and not v.refusals and not v.warnings_needing_force


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"mounts": ["/dev/nvme1n1 on /data"]}, "it is mounted: /dev/nvme1n1 on /data"),
        ({"mounts": ["/dev/nvme1n1p2 on /home"], "partitions": ["nvme1n1p1", "nvme1n1p2"]}, "mounted: /dev/nvme1n1p2 on /home"),
        ({"holds_root_fs": True}, "it holds the root file system"),
        ({"swap": ["/dev/nvme1n1p3"]}, "it is active swap: /dev/nvme1n1p3"),
        ({"holders": ["vg0-data"]}, "it is in use by vg0-data"),
        ({"busy_reason": "an exclusive open failed with EBUSY"}, "it is in use: an exclusive open failed with EBUSY"),
        ({"read_only": True}, "it is read-only"),
        ({"open_error": "Permission denied"}, "it cannot be opened: Permission denied"),
    ],
)
@pytest.mark.parametrize("operation", ["prepare", "wipe"])
def test_hard_refusals_ignore_force(overrides, expected, operation):
    facts = blank_device(**overrides)
    if operation == "wipe":
        facts.region_state = "intact"
    v = assess(facts, operation=operation, force=True)
    assert not v.ok and v.status == "refused"
    assert any(expected in r for r in v.refusals), v.refusals


def test_busy_is_not_repeated_when_the_mount_explains_it():
    v = assess(blank_device(mounts=["/dev/nvme1n1 on /data"], busy_reason="EBUSY"))
    assert len(v.refusals) == 1


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"signatures": [EXT4], "head_blank": False}, "it holds a signature: ext4 at byte 0x438"),
        ({"signatures": [Signature(type="gpt", offset_bytes=0x200)], "partitions": ["nvme1n1p1"], "head_blank": False}, "it has partitions: nvme1n1p1"),
        ({"signatures": [Signature(type="linux_raid_member", offset_bytes=0x1000)], "head_blank": False}, "it is a RAID/LVM member: linux_raid_member"),
        ({"signatures": [Signature(type="LVM2_member", offset_bytes=0x218)], "head_blank": False}, "RAID/LVM member: LVM2_member"),
        ({"region_state": "intact", "region_label": "node0", "head_blank": False}, "already holds a memascend region (label node0)"),
        ({"region_state": "corrupt", "region_error": "checksum mismatch at header bytes 0..255", "head_blank": False}, "damaged memascend region header"),
        ({"head_blank": False}, "first MiB holds data that is not a recognised signature"),
        ({"head_blank": None, "signature_probe_error": "wipefs: not found"}, "signatures could not be checked"),
    ],
)
def test_destructive_cases_need_force(overrides, expected):
    facts = blank_device(**overrides)
    v = assess(facts)
    assert not v.ok and v.status == "force" and not v.refusals
    assert any(expected in w for w in v.warnings_needing_force), v.warnings_needing_force
    assert assess(facts, force=True).ok


def test_unprobed_but_blank_head_is_safe():
    # No wipefs/blkid on the machine, but the first MiB is zeros: nothing to destroy.
    assert assess(blank_device(signature_probe_error="neither tool installed", head_blank=True)).ok


def test_mounted_with_signature_lists_both_but_force_does_not_help():
    v = assess(blank_device(mounts=["/dev/loop3 on /mnt"], signatures=[EXT4], head_blank=False), force=True)
    assert not v.ok
    assert v.refusals == ["it is mounted: /dev/loop3 on /mnt"]
    assert v.warnings_needing_force == ["it holds a signature: ext4 at byte 0x438"]


def test_wipe_needs_our_region():
    v = assess(blank_device(), operation="wipe", force=True)
    assert not v.ok and "nothing to wipe" in v.refusals[0]
    assert assess(blank_device(region_state="intact", head_blank=False), operation="wipe").ok
    damaged = blank_device(region_state="corrupt", region_error="bad", head_blank=False)
    assert not assess(damaged, operation="wipe").ok
    assert assess(damaged, operation="wipe", force=True).ok


def test_new_file_on_ext4_is_safe():
    assert assess(new_file()).ok


@pytest.mark.parametrize("fstype", ["tmpfs", "ramfs"])
def test_ram_filesystems_refused(fstype):
    v = assess(new_file(fstype=fstype, o_direct_ok=False), force=True)
    assert not v.ok and f"it is on {fstype}, which keeps file data in RAM" in v.refusals[0]


def test_filesystem_without_o_direct_refused():
    v = assess(new_file(fstype="overlay", o_direct_ok=False, o_direct_reason="overlay refuses O_DIRECT: Invalid argument"), force=True)
    assert not v.ok
    assert v.refusals == ["its file system (overlay) does not support O_DIRECT: overlay refuses O_DIRECT: Invalid argument"]


def test_not_enough_space_refused():
    v = assess(new_file(free_bytes=100 * GiB), force=True)
    assert not v.ok and "100.00 GiB free, 200.00 GiB needed" in v.refusals[0]


def test_growing_an_existing_region_file_needs_only_the_difference():
    facts = new_file(exists=True, size_bytes=150 * GiB, free_bytes=60 * GiB, region_state="intact")
    assert assess(facts, force=True).ok


def test_existing_unknown_file_is_never_overwritten():
    v = assess(new_file(exists=True, size_bytes=10, region_state="none"), force=True)
    assert not v.ok and "not a memascend region" in v.refusals[0]


def test_existing_region_file_needs_force():
    facts = new_file(exists=True, size_bytes=200 * GiB, region_state="intact")
    assert assess(facts).status == "force"
    assert assess(facts, force=True).ok


def test_missing_directory_and_directory_target():
    assert "directory does not exist" in assess(new_file(parent_exists=False)).refusals[0]
    v = assess(TargetFacts(path="/mnt/nvme", real_path="/mnt/nvme", kind="dir"))
    assert "/mnt/nvme is a directory; give a file path inside it, e.g. /mnt/nvme/memascend.region" == v.refusals[0]


def test_wipe_file_rules():
    assert not assess(new_file(), operation="wipe").ok  # does not exist
    assert assess(new_file(exists=True, region_state="intact"), operation="wipe").ok
    assert not assess(new_file(exists=True, region_state="none"), operation="wipe", force=True).ok


def test_unknown_operation():
    with pytest.raises(ValueError):
        assess(blank_device(), operation="format")


def test_refusal_message_mentions_force_only_when_it_helps():
    facts = blank_device(signatures=[EXT4], head_blank=False)
    msg, hint = refusal_message(facts, assess(facts))
    assert msg == "refusing to prepare /dev/nvme1n1 without --force: it holds a signature: ext4 at byte 0x438"
    assert "--force" in hint
    facts = blank_device(mounts=["/dev/nvme1n1 on /data"], signatures=[EXT4], head_blank=False)
    msg, hint = refusal_message(facts, assess(facts, force=True))
    assert msg == "refusing to prepare /dev/nvme1n1: it is mounted: /dev/nvme1n1 on /data"
    assert "nothing overrides this" in hint


def test_verdict_to_dict_is_json_ready():
    d = assess(blank_device(signatures=[EXT4], head_blank=False)).to_dict()
    assert d["status"] == "force" and d["ok"] is False
    json.dumps(d)
    json.dumps(blank_device().to_dict())


# ---------------------------------------------------------------------------------------------
# Tool output parsers (util-linux 2.38 output shapes)

WIPEFS_EXT4 = """{
   "signatures": [
      {
         "device": "loop0",
         "offset": "0x438",
         "type": "ext4",
         "uuid": "7b5efa02-d3ef-4940-a72e-15a69840e31b",
         "label": null
      }
   ]
}"""

WIPEFS_GPT = """{
   "signatures": [
      {"device": "loop1", "offset": "0x200", "type": "gpt", "uuid": null, "label": null},
      {"device": "loop1", "offset": "0x3fffe00", "type": "gpt", "uuid": null, "label": null},
      {"device": "loop1", "offset": "0x1fe", "type": "PMBR", "uuid": null, "label": null}
   ]
}"""


def test_parse_wipefs():
    assert parse_wipefs_json(WIPEFS_EXT4) == [Signature(type="ext4", offset_bytes=0x438, uuid="7b5efa02-d3ef-4940-a72e-15a69840e31b")]
    sigs = parse_wipefs_json(WIPEFS_GPT)
    assert [s.type for s in sigs] == ["gpt", "gpt", "PMBR"] and sigs[1].offset_bytes == 0x3FFFE00
    assert parse_wipefs_json("") == []


def test_parse_blkid_export():
    text = "DEVNAME=/dev/loop0\nUUID=7b5e\nVERSION=1.0\nBLOCK_SIZE=4096\nTYPE=ext4\nUSAGE=filesystem\nSBMAGIC=S\xef\nSBMAGIC_OFFSET=1080\n"
    assert parse_blkid_export(text) == [Signature(type="ext4", offset_bytes=1080, uuid="7b5e")]
    assert parse_blkid_export("DEVNAME=/dev/loop1\nPTTYPE=gpt\nPTMAGIC_OFFSET=512\n")[0].type == "gpt"
    assert parse_blkid_export("") == []


def test_signature_describe():
    assert Signature(type="xfs", offset_bytes=0, label="data").describe() == "xfs (label data) at byte 0x0"
