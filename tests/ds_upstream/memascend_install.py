"""Install memascend's engine under DeepSpeed's own unit tests, the way a user's script does.

DeepSpeed's tests build models under ``deepspeed.zero.Init(config_dict_or_path=cfg)`` and engines with
``deepspeed.initialize(config=cfg)``, inside worker processes that their DistributedTest harness starts with
multiprocessing's forkserver. Every ported test module imports this module, so it runs in those workers too, where it
wraps both calls: the first config with NVMe offload calls ``memascend_engine.install(cfg, region=..., rank=LOCAL_RANK)``
before DeepSpeed sees the config (what the README asks of a user), later configs get the same rewrite
(``Installed.adopt``), and when the last engine built under it is destroyed the engine is uninstalled (the rank's
sub-region is released, so the next test in a reused worker starts from a fresh store).

The parent (tests/ds_upstream/conftest.py) writes a control file named by ``MEMASCEND_DS_HOOK``: ``{"test": nodeid,
"mode": ..., "region": ..., "options": {...}}``, read on every call (a reused worker serves several tests); ``mode`` "stock" leaves
DeepSpeed alone. Each install appends a line to ``<control>.installs`` so the parent can tell that the engine really
was installed (a test must not pass on stock DeepSpeed by accident).
"""

from __future__ import annotations

import json
import os

from memascend_engine import cpuinfo_cache

CONTROL_ENV = "MEMASCEND_DS_HOOK"

_state = {"installed": None, "engines": 0, "test": None}
cpuinfo_cache.enable()  # one CPU probe per worker, stock tests too (the engine does the same in its own processes)


def _control() -> dict | None:
    path = os.environ.get(CONTROL_ENV)
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _offloads_to_nvme(cfg) -> bool:
    if not isinstance(cfg, dict):
        return False
    zo = cfg.get("zero_optimization") or {}
    return any(str((zo.get(k) or {}).get("device")) in ("nvme", "OffloadDeviceEnum.nvme")
               for k in ("offload_param", "offload_optimizer"))


def _normalise(cfg: dict) -> None:
    """DeepSpeed's tests put OffloadDeviceEnum members into the dict; install() reads plain strings."""
    zo = cfg.get("zero_optimization") or {}
    for k in ("offload_param", "offload_optimizer"):
        section = zo.get(k)
        if isinstance(section, dict) and "device" in section:
            section["device"] = getattr(section["device"], "value", section["device"])


def _before(cfg) -> None:
    control = _control()
    if control is None or control.get("mode") == "stock" or not _offloads_to_nvme(cfg):
        return
    _normalise(cfg)
    inst = _state["installed"]
    if inst is not None and _state["test"] != control["test"]:
        # Left by a test that failed before destroying its engines (a reused worker): its engines are dead.
        inst.uninstall()
        inst = _state["installed"] = None
        _state["engines"] = 0
    if inst is not None:
        inst.adopt(cfg)
        return
    import memascend_engine

    opts = memascend_engine.EngineOptions(**control.get("options", {}))
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    _state["installed"] = memascend_engine.install(cfg, region=control["region"], options=opts, rank=rank)
    _state["test"] = control["test"]
    with open(os.environ[CONTROL_ENV] + ".installs", "a", encoding="utf-8") as f:
        f.write(json.dumps({"pid": os.getpid(), "rank": rank, "mode": control["mode"]}) + "\n")


def _engine_built(engine) -> None:
    if _state["installed"] is None:
        return
    _state["engines"] += 1
    destroy = engine.destroy

    def destroy_then_release(*args, **kwargs):
        try:
            return destroy(*args, **kwargs)
        finally:
            _state["engines"] -= 1
            if _state["engines"] == 0 and _state["installed"] is not None:
                _state["installed"].uninstall()
                _state["installed"] = None

    engine.destroy = destroy_then_release


def _wrap() -> None:
    import deepspeed
    from deepspeed.runtime.zero import partition_parameters

    if getattr(deepspeed, "_memascend_test_hook", False):
        return
    base_init = partition_parameters.Init

    class Init(base_init):
        def __init__(self, *args, config_dict_or_path=None, **kwargs):
            _before(config_dict_or_path)
            super().__init__(*args, config_dict_or_path=config_dict_or_path, **kwargs)

    original_initialize = deepspeed.initialize

    def initialize(*args, **kwargs):
        _before(kwargs.get("config"))
        out = original_initialize(*args, **kwargs)
        _engine_built(out[0])
        return out

    deepspeed.zero.Init = Init
    deepspeed.initialize = initialize
    deepspeed._memascend_test_hook = True


_wrap()
