"""DeepSpeed versions: reading a version string, and the installed version without importing DeepSpeed.

Torch-free (stdlib only), so `memascend plan` and the engine's version check share one parser.
"""

from __future__ import annotations

from memascend_cli.errors import BadInput

DEFAULT_DEEPSPEED_VERSION = "0.19.8"
"""The DeepSpeed the planner models when none is installed (the version memascend is tested with)."""


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.19.8', '0.19.8+abc', '0.20.0rc1' or '0.20.0.dev0' -> (MAJOR, MINOR, PATCH); a missing part is 0."""
    core = str(text).strip().split("+")[0]
    nums = []
    for part in core.split(".")[:3]:
        digits = ""
        for ch in part:  # '0rc1' -> '0', 'dev0' -> ''
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        nums.append(int(digits))
    if not nums:
        raise BadInput(f"cannot read DeepSpeed version {text!r}", "give it as MAJOR.MINOR.PATCH, e.g. 0.19.8")
    nums += [0] * (3 - len(nums))
    return (nums[0], nums[1], nums[2])


def installed_deepspeed_version() -> str:
    """The installed DeepSpeed's version without importing it (the import costs ~2 s), else
    DEFAULT_DEEPSPEED_VERSION."""
    from importlib import metadata

    try:
        return metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        return DEFAULT_DEEPSPEED_VERSION
