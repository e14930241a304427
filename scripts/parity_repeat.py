"""Run the engine's parity tests N times in a row and record each run (bit-for-bit loss parity, not flaky).

    python scripts/parity_repeat.py --times 5 --out docs/raw/parity-repeat.json

The same as `python scripts/record_tests.py --times N --out OUT tests/engine/test_engine_deepspeed.py`, under the
name docs/raw/parity-repeat.json records; scripts/results.py renders it.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record_tests  # noqa: E402

if __name__ == "__main__":
    sys.exit(record_tests.main([*sys.argv[1:], "tests/engine/test_engine_deepspeed.py"]))
