"""DeepSpeed's JIT-built ops (deepspeed_shm_comm, cpu_adam, pin_memory, async_io) loaded without torch's build lock.

OpBuilder.load() of an op that is not in DeepSpeed's wheel calls OpBuilder.jit_load(), which calls
torch.utils.cpp_extension.load(): that takes a FileBaton, ``<build dir>/lock``, even for an op built long ago (it runs
ninja under it to find nothing to do) and only then imports the library. A process killed in between (an OOM kill under
``--dram-cap``, a SIGKILL during start-up) leaves the lock, and every later load of that op on the machine sleeps on it
in FileBaton.wait(), which has no time limit and says nothing.

enable() wraps OpBuilder.jit_load: an op whose build folder holds its library and for which ninja's dry run finds
nothing to do (the check torch's load makes, with the build.ninja torch wrote) is imported as torch imports it and kept
where OpBuilder.load() looks first (OpBuilder._loaded_ops), so a built op never takes the lock; an op that needs a
build goes through DeepSpeed and torch as before. A lock in the folder is first waited on with a report (wait_for_lock):
removed when no live process holds it (memascend_cli/run/leftovers.py ext_lock_stale), named with its holder after
WAIT_NOTE_S, and the wait ends with that reason once the folder has not changed for WAIT_LIMIT_S.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time

from memascend_engine.ds_internals.patches import Patches
from memascend_engine.ds_internals.version import check_version

WAIT_NOTE_S = 3.0
"""A wait on an op build lock is reported (stderr and on_wait) after this many seconds."""
WAIT_LIMIT_S = 300.0
"""A wait on a lock held by a live process ends with an error once the op's build folder has not changed for this
long: a build writes an object file at least every compile (cpu_adam's largest took 44 s on the 2-core reference
machine), a load holds the lock for well under a second."""
POLL_S = 0.1
"""How often a wait looks again (FileBaton.wait's own period)."""

_patches = Patches()
_state: dict = {"on_wait": None}


def enable(on_wait=None) -> bool:
    """Wrap OpBuilder.jit_load (once per process); False, leaving DeepSpeed's own load in place, with a DeepSpeed
    outside the tested range (version.py). `on_wait(info)` is called when a wait on a lock is reported, with
    {"on": lock path, "holders": ["pid N (cmd)"], "waited_s": s}; stderr gets the same line."""
    try:
        check_version()
    except RuntimeError:
        return False
    from deepspeed.ops.op_builder.builder import OpBuilder

    _state["on_wait"] = on_wait
    if _patches.saved:
        return True
    jit_load = OpBuilder.jit_load

    def built_or_jit_load(self, verbose=True):
        module = load_built(self)
        return module if module is not None else jit_load(self, verbose)

    _patches.set(OpBuilder, "jit_load", built_or_jit_load)
    return True


def build_dir(name: str) -> str:
    """torch's build folder of the JIT op `name` (TORCH_EXTENSIONS_DIR or its default, as cpp_extension.load uses)."""
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory(name, verbose=False)


def load_built(builder):
    """The op's module imported from its build folder, kept in OpBuilder._loaded_ops; None where it needs a build (no
    library, ninja not found, or ninja's dry run finds work); RuntimeError where the dry run itself fails. Either way
    a lock in the folder is waited on first (wait_for_lock), so torch's own wait never meets a stale one."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    folder = build_dir(builder.name)
    wait_for_lock(os.path.join(folder, "lock"), op=builder.name)
    library = os.path.join(folder, f"{builder.name}.so")
    ninja = shutil.which("ninja")  # the one torch's build would run (PATH)
    if not (os.path.exists(library) and os.path.exists(os.path.join(folder, "build.ninja"))) or ninja is None:
        return None
    dry = subprocess.run([ninja, "-n", "-C", folder], capture_output=True, text=True, check=False)
    if dry.returncode != 0:
        # Not "work to do": ninja failed (killed, or out of memory under a cap). Handing the op to torch now would take
        # the lock in the state most likely to be killed holding it.
        raise RuntimeError(f"could not check whether DeepSpeed's {builder.name} op in {folder} is built: "
                           f"`ninja -n` ended with status {dry.returncode}: {(dry.stderr or dry.stdout).strip()[-300:]}")
    if "no work to do" not in dry.stdout:
        return None
    # As torch.utils.cpp_extension._import_module_from_library imports a Python extension module.
    spec = importlib.util.spec_from_file_location(builder.name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    OpBuilder._loaded_ops[builder.name] = module
    return module


def _folder_mtime(folder: str) -> float:
    """The newest modification time in an op's build folder (a build writes its objects there)."""
    try:
        with os.scandir(folder) as it:
            return max([os.stat(folder).st_mtime, *(e.stat(follow_symlinks=False).st_mtime for e in it)])
    except OSError:
        return 0.0


def wait_for_lock(lock: str, *, op: str, note_s: float = WAIT_NOTE_S, limit_s: float = WAIT_LIMIT_S) -> None:
    """Return once `lock` is gone: at once when there is none, after removing it when no live process holds it, else
    when its holder releases it. Says what it waits on after `note_s`; raises RuntimeError once the op's folder has not
    changed for `limit_s` while a live process holds the lock."""
    from memascend_cli.run import leftovers

    t0 = changed_at = time.monotonic()
    noted, last_mtime = False, _folder_mtime(os.path.dirname(lock))
    while os.path.lexists(lock):
        pids = leftovers.ext_lock_holders(lock)
        if leftovers.ext_lock_stale(lock, pids, now=time.time(), uid=os.getuid()):
            try:
                os.unlink(lock)
                print(f"note: removed the stale op build lock {lock} (no live process held it; a process killed "
                      f"while loading the {op} op left it)", file=sys.stderr, flush=True)
            except FileNotFoundError:
                pass
            continue
        now = time.monotonic()
        mtime = _folder_mtime(os.path.dirname(lock))
        if mtime != last_mtime:
            last_mtime, changed_at = mtime, now
        who = [leftovers.describe_pid(p) for p in pids] or ["no live process yet"]
        if not noted and now - t0 >= note_s:
            noted = True
            _report({"on": lock, "holders": who, "waited_s": round(now - t0, 1)},
                    f"waiting on {lock}, held by {', '.join(who)}, which is loading or building DeepSpeed's {op} op "
                    f"(gives up after {limit_s:.0f} s without a change in its folder)")
        if pids and now - changed_at >= limit_s:
            raise RuntimeError(f"gave up waiting on {lock} after {now - t0:.0f} s: held by {', '.join(who)}, and "
                               f"nothing in {os.path.dirname(lock)} changed for {limit_s:.0f} s")
        time.sleep(POLL_S)


def _report(info: dict, line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    if _state["on_wait"] is not None:
        _state["on_wait"](info)
