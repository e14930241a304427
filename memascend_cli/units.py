"""Parsing and formatting of sizes and bandwidths.

Memory is reported in GiB (1024**3 bytes); bandwidth in GB/s (10**9 bytes per second), as disk
vendors and fio do. Parsed sizes must carry a unit: a bare "128" is ambiguous and rejected.
"""

from __future__ import annotations

import math
import re

from memascend_cli.errors import BadInput

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
    "k": KiB, "m": MiB, "g": GiB, "t": TiB,
}
MAX_BYTES = 2**63 - 1
"""Largest size or count accepted (8 EiB): anything larger is a typo, and int64 everywhere below."""
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]+)\s*$", re.IGNORECASE)


def parse_size(text: str, what: str = "size") -> int:
    """Parse "128GiB", "2TB", "24 G", "512MiB" into bytes; a bare number is an error."""
    m = _SIZE_RE.match(str(text))
    if not m:
        if re.match(r"^\s*-", str(text)):
            raise BadInput(f"{what} must not be negative: {text!r}", "give a positive size such as 128GiB")
        if re.match(r"^\s*[0-9.]+\s*$", str(text)):
            raise BadInput(f"{what} {text!r} has no unit", f"write it with a unit, e.g. {text.strip()}GiB or {text.strip()}GB")
        raise BadInput(f"cannot read {what} {text!r}", "use a number with a unit, e.g. 128GiB, 2TB, 512MiB")
    value, unit = float(m.group(1)), m.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise BadInput(f"unknown unit {m.group(2)!r} in {what} {text!r}", "units: B, KB, MB, GB, TB (decimal) or KiB, MiB, GiB, TiB")
    if value <= 0:
        raise BadInput(f"{what} must be positive: {text!r}", "give a positive size such as 128GiB")
    nbytes = value * _SIZE_UNITS[unit]
    if not nbytes <= MAX_BYTES:  # also inf (1e400GiB)
        raise BadInput(f"{what} {text!r} is too large", "give a size below 8 EiB, e.g. 128GiB or 2TB")
    return int(round(nbytes))


def parse_bandwidth_gbps(text: str, what: str = "bandwidth") -> float:
    """Parse "6.5", "6.5GB/s", "3500MB/s" into GB/s (a bare number means GB/s, the documented unit)."""
    s = str(text).strip().lower().replace(" ", "")
    scale = 1.0
    for suffix, factor in (("gb/s", 1.0), ("mb/s", 1e-3), ("gbps", 1.0), ("mbps", 1e-3)):
        if s.endswith(suffix):
            s, scale = s[: -len(suffix)], factor
            break
    try:
        value = float(s) * scale
    except ValueError:
        raise BadInput(f"cannot read {what} {text!r}", "give GB/s, e.g. 6.5 or 3500MB/s") from None
    if not math.isfinite(value) or value <= 0:
        raise BadInput(f"{what} must be positive: {text!r}", "give GB/s, e.g. 6.5")
    return value


def parse_count(text: str, what: str = "count") -> int:
    """Parse an element count such as "1e9", "100000", "5e8" (DeepSpeed writes counts in float form)."""
    try:
        value = float(str(text))
    except ValueError:
        raise BadInput(f"cannot read {what} {text!r}", "give a whole number such as 1e9 or 100000") from None
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise BadInput(f"{what} must be a non-negative whole number: {text!r}", "e.g. 1e9 or 100000")
    if value > MAX_BYTES:
        raise BadInput(f"{what} {text!r} is too large", "e.g. 1e9 or 100000")
    return int(value)


def fmt_bytes(nbytes: float) -> str:
    """Human size with binary units, e.g. '1.50 GiB', '512 KiB'."""
    n = float(nbytes)
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{int(n)} B"
