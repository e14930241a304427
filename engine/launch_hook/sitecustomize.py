"""The start-up hook of `memascend launch` (memascend_cli/run/anyprogram.py puts this folder first on PYTHONPATH).

Python's site module imports `sitecustomize` in every interpreter that starts (site.py, execsitecustomize). This one
hands over to memascend_engine.autoinstall, which installs the engine in the processes that use DeepSpeed, then runs
the sitecustomize it hides, if any, so the program's own start-up is unchanged. It never fails the program: a Python
that cannot import memascend_engine only leaves a record saying so (the keys memascend_cli/run/anyprogram.py reads;
that module cannot be imported there either).
"""

import json
import os
import sys


def _start() -> None:
    try:
        from memascend_engine import autoinstall
    except Exception as exc:  # noqa: BLE001 - another Python (a separate venv): say so, run the program as it is
        try:
            status_dir = json.loads(os.environ.get("MEMASCEND_LAUNCH", ""))["status_dir"]
            with open(os.path.join(status_dir, f"{os.getpid()}.json"), "w", encoding="utf-8") as f:
                json.dump({"pid": os.getpid(), "state": "no_engine", "python": sys.executable,
                           "error": f"{type(exc).__name__}: {exc}"}, f)
        except Exception:  # noqa: BLE001 - not started by memascend launch, or the folder is gone
            pass
        return
    autoinstall.start()


def _run_hidden() -> None:
    """Import the next `sitecustomize` on the path (the one this file shadows), as site.py would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop(__name__)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved
        sys.modules[__name__] = mine


_start()
_run_hidden()
