"""The engine in a program that never calls `install()`: what `memascend launch`'s start-up hook runs in every Python
process of the program (engine/launch_hook/sitecustomize.py; the CLI side is memascend_cli/run/anyprogram.py).

`start()` waits for `import deepspeed` (a finder on sys.meta_path; nothing is imported before the program does) and
then wraps `deepspeed.initialize` and `deepspeed.zero.Init`: the first of them that the program calls installs the
engine with the config it passes (a path, or `args.deepspeed_config`, is read and passed on as the dict install()
rewrote), then runs the call. zero.Init comes first under the HF Trainer (from_pretrained with ZeRO-3), and the
parameters it partitions already go through the engine's swapper. A program that calls install() itself is left
alone. Each process that imports DeepSpeed leaves a record (anyprogram.write_record): imported, installed, engaged
once deepspeed.initialize returned (with the job DeepSpeed sized, for the CLI's plan line, and at exit the region
traffic and the peak RSS; the engine's steps are logged by engine/launch_steps.py), or failed: install() raised, or
the program raised inside zero.Init or deepspeed.initialize before that (so a program that dies building its model
is a failure, never "engaged").

Stdlib only until the program imports DeepSpeed.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import inspect
import os
import sys

from memascend_cli.run import anyprogram, lifeline
from memascend_engine import cpuinfo_cache

_settings: dict = {}
_record: dict = {}
_ours: list = []
"""The Installed handle this hook made (empty until then)."""
_watched: list = []
"""The DeepSpeed engines whose steps are logged (launch_steps.StepWatch), one per deepspeed.initialize."""


def start(env=os.environ) -> bool:
    """In a process started by `memascend launch`: watch the CLI's lifeline and install the engine once DeepSpeed is
    imported. False (nothing done) elsewhere."""
    cfg = anyprogram.parse_env(env)
    if cfg is None:
        return False
    _settings.update(cfg)
    lifeline.watch(env)
    if "deepspeed" in sys.modules:
        _on_import(sys.modules["deepspeed"])
    else:
        sys.meta_path.insert(0, _DeepSpeedImport())
    return True


class _DeepSpeedImport:
    """A meta path finder that lets the real finder load `deepspeed` and wraps the program's entry points right after
    the package has run (and before the importer sees it). It stays until the import happens: transformers and
    accelerate ask importlib.util.find_spec("deepspeed") first, which returns a spec without importing."""

    def __init__(self):
        self.busy = False

    def find_spec(self, name, path=None, target=None):
        if name != "deepspeed" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(name)  # the finders after this one
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_wrap(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _on_import(module)

        spec.loader.exec_module = exec_then_wrap  # this spec's own loader instance
        return spec


def _write(**fields) -> None:
    _record.update(fields)
    try:
        anyprogram.write_record(_settings["status_dir"], _record)
    except OSError:  # the CLI's temporary run folder is gone: it no longer reads records
        pass


def _on_import(ds) -> None:
    rank = os.environ.get("RANK")
    _record.update(pid=os.getpid(), rank=int(rank) if rank and rank.isdigit() else None, argv=sys.argv[:3])
    _write(state=anyprogram.IMPORTED)
    cpuinfo_cache.enable()
    from memascend_engine.ds_internals import jit_ops

    jit_ops.enable()  # DeepSpeed's built ops load without torch's build lock: a killed rank leaves none behind
    _wrap_initialize(ds)
    _wrap_zero_init(ds.zero.Init)
    atexit.register(_at_exit)


def _active():
    from memascend_engine import runtime

    return runtime.active()


def _installed() -> bool:
    """True once the engine is installed in this process; an installation the program made itself is recorded."""
    handle = _active()
    if handle is None:
        return False
    if handle not in _ours and not _record.get("by_program"):
        _write(**_describe(handle), by_program=True, state=anyprogram.INSTALLED)
    return True


def _describe(handle) -> dict:
    from memascend_engine import trainer_config

    return dict(region=handle.region, nvme=bool(handle.param_nvme or handle.opt_nvme),
                zero_stage=trainer_config.zero_stage(handle.ds_config),
                offload=trainer_config.offload_devices(handle.ds_config),
                placement=handle.choice.to_dict() if handle.choice is not None else None)


def _as_dict(config):
    """A config dict for a path or base64 string, read as deepspeed.initialize reads it (load_ds_config); dicts as
    they are."""
    if config is None or isinstance(config, dict):
        return config
    from deepspeed.runtime.tensor_parallel.init_utils import load_ds_config

    return load_ds_config(config)


def _engage(config: dict) -> None:
    """install() with this config (rewritten in place), once per process; records the outcome."""
    import memascend_engine

    region = _settings.get("region")
    try:
        handle = memascend_engine.install(config, region=region, model_spec=_settings.get("model"),
                                          options=memascend_engine.EngineOptions(direct_nvme=bool(region)),
                                          placement=_settings.get("placement") or "auto")
    except Exception as exc:
        _write(state=anyprogram.FAILED, error=f"{type(exc).__name__}: {exc}".splitlines()[0])
        raise
    _ours.append(handle)
    _write(**_describe(handle), state=anyprogram.INSTALLED)


def _failed_before_use(during: str, exc: BaseException) -> None:
    """Record an exception the program raised inside `during` while the engine was not yet in use (once: the
    innermost of nested calls, or install() itself, records it first)."""
    if _record.get("state") in (anyprogram.IMPORTED, anyprogram.INSTALLED):
        _write(state=anyprogram.FAILED, during=during, error=f"{type(exc).__name__}: {exc}".splitlines()[0])


def _wrap_initialize(ds) -> None:
    original = ds.initialize
    signature = inspect.signature(original)

    @functools.wraps(original)
    def initialize(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:  # arguments DeepSpeed refuses: its own call below says so
            bound = None
        model = bound.arguments.get("model") if bound is not None else None
        partitioned = any(hasattr(p, "ds_id") for p in model.parameters()) if hasattr(model, "parameters") else False
        try:
            result = original(*args, **kwargs) if bound is None or _installed() else _initialize(bound, args, kwargs)
        except Exception as exc:
            _failed_before_use("deepspeed.initialize", exc)
            raise
        if _record.get("state") != anyprogram.ENGAGED and _active() is not None:
            # The program's DeepSpeed engine exists, on the engine; a placement chosen at initialize is final now.
            _write(state=anyprogram.ENGAGED, **(_describe(_active()) if _active() in _ours else {}))
        _watch(result, partitioned)
        return result

    def _initialize(bound, args, kwargs):
        a = bound.arguments
        config = a.get("config") if a.get("config") is not None else a.get("config_params")
        cli_args = a.get("args")
        if config is None and getattr(cli_args, "deepspeed_config", None) is not None:
            # deepspeed.initialize refuses a config given both ways (deepspeed/__init__.py, "Not sure how to
            # proceed"): the program's argparse namespace is copied with the path taken out.
            import copy

            config, cli_args = cli_args.deepspeed_config, copy.copy(cli_args)
            cli_args.deepspeed_config = None
            a["args"] = cli_args
        config = _as_dict(config)
        if config is None:
            return original(*args, **kwargs)  # DeepSpeed's own error for a call without a config
        a.pop("config_params", None)
        a["config"] = config
        _engage(config)
        # The module attribute is now install()'s hook around this function: it rewrites the config DeepSpeed gets.
        return ds.initialize(*bound.args, **bound.kwargs)

    ds.initialize = initialize


def _watch(result, partitioned: bool) -> None:
    """Record the job of the engine deepspeed.initialize returned and log its steps; once per engine (the call
    nests when this hook installs the engine), only where the engine is installed, never failing the program."""
    engine = result[0] if isinstance(result, tuple) and result else None
    if engine is None or any(w.engine is engine for w in _watched) or not hasattr(engine, "global_steps"):
        return
    handle = _active()
    if handle is None:
        return
    try:
        from memascend_engine import launch_steps

        job = launch_steps.job_fields(engine, partitioned, handle.ds_config)
        config = launch_steps.model_config(engine.module)
        if config is not None:
            anyprogram.write_model_config(_settings["status_dir"], os.getpid(), config)
        _write(job=dict(job, model_config=config is not None))

        def region_bytes():
            snap = handle.store.snapshot() if handle.store is not None else None
            return (snap["bytes_read"], snap["bytes_written"]) if snap else None

        _watched.append(launch_steps.watch(engine, _settings["status_dir"], region_bytes))
    except Exception as exc:  # noqa: BLE001 - progress is a courtesy: the program runs on without it
        _write(progress_error=f"{type(exc).__name__}: {exc}".splitlines()[0])


def _wrap_zero_init(init_class) -> None:
    original = init_class.__init__
    original_exit = init_class.__exit__
    signature = inspect.signature(original)

    def call(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except Exception as exc:
            _failed_before_use("deepspeed.zero.Init", exc)
            raise

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if _installed():
            return call(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        a = bound.arguments
        key = "config_dict_or_path" if a.get("config_dict_or_path") is not None else "config"
        if a.get("enabled", True) is False or a.get(key) is None:
            return call(self, *args, **kwargs)
        a[key] = _as_dict(a[key])
        _engage(a[key])
        return call(*bound.args, **bound.kwargs)

    @functools.wraps(original_exit)
    def __exit__(self, exc_type, exc_value, traceback):
        # An exception in the `with deepspeed.zero.Init(...)` block: the model failed to build.
        if isinstance(exc_value, Exception):
            _failed_before_use("deepspeed.zero.Init", exc_value)
        return original_exit(self, exc_type, exc_value, traceback)

    init_class.__init__ = __init__
    init_class.__exit__ = __exit__


def _at_exit() -> None:
    if "memascend_engine.runtime" not in sys.modules or _record.get("pid") != os.getpid():
        return  # never installed (a launcher process), or a fork of the process that installed (the record is not its)
    handle = _active()
    if handle is None:
        return
    from memascend_engine import procfs

    stats = handle.stats()
    fields = dict(bytes_read=stats["bytes_read"], bytes_written=stats["bytes_written"],
                  swap_files=stats["swap_files_created"], vm_hwm_bytes=procfs.status_kib("VmHWM") * 1024)
    if handle not in _ours:  # the program called install() itself
        fields.update(_describe(handle), by_program=True)
        if _record.get("state") == anyprogram.IMPORTED:
            fields["state"] = anyprogram.INSTALLED
    _write(**fields)
    if handle in _ours:
        # Releases the region's lock and owner record (else the next job reads a stale owner) and removes the key
        # folder install() made; the program's DeepSpeed engine does no more I/O at exit.
        handle.uninstall()
