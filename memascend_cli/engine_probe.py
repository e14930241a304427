"""Whether the memascend engine (memascend_engine) can be imported, asked in a child interpreter.

The one home of the check `train` (refuses without the engine) and `bench` (warns that memascend runs will fail)
make before they launch anything. A child, so the CLI process never imports the engine package.
"""

from __future__ import annotations

import subprocess
import sys

_CODE = "import memascend_engine as m; m.install; m.EngineOptions"


def engine_available(timeout_s: float = 120) -> tuple[bool, str]:
    """(True, "") when memascend_engine imports with install() and EngineOptions, else (False, the child's last
    error line)."""
    try:
        p = subprocess.run([sys.executable, "-c", _CODE], check=False, capture_output=True, text=True,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"importing memascend_engine took over {timeout_s:.0f} s"
    if p.returncode == 0:
        return True, ""
    return False, (p.stderr.strip().splitlines() or ["unknown error"])[-1]
