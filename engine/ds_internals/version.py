"""The DeepSpeed versions this subpackage's patches and private-attribute reads were written against.

Every entry point of memascend_engine.ds_internals that touches DeepSpeed calls :func:`check_version` first, so the
engine path (install), stock runs that save or resume memascend checkpoints (optimizer_state) and the probes all
refuse an untested DeepSpeed with one message instead of failing somewhere inside it.
"""

from __future__ import annotations

from memascend_cli.versions import parse_version

TESTED_MIN = (0, 19, 5)
TESTED_BELOW = (0, 20, 0)


_checked: str | None = None


def check_version() -> str:
    """The installed DeepSpeed version; raises RuntimeError outside the tested range (checked once per process)."""
    global _checked
    if _checked is not None:
        return _checked
    import deepspeed

    version = deepspeed.__version__
    v = parse_version(version)
    if not (TESTED_MIN <= v < TESTED_BELOW):
        raise RuntimeError(
            f"memascend_engine patches DeepSpeed internals and is tested with DeepSpeed "
            f">={'.'.join(map(str, TESTED_MIN))},<{'.'.join(map(str, TESTED_BELOW))}; found {version}. "
            "Install a tested version: pip install 'deepspeed>=0.19.5,<0.20'")
    _checked = version
    return version
