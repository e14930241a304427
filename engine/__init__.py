"""The MemAscend offload engine. **The folder `engine/` is installed and imported as `memascend_engine`**
(pyproject.toml `[tool.setuptools.package-dir]`: a bare `engine` package would collide in site-packages), so
`memascend_engine.ds_internals.stage3` is the file `engine/ds_internals/stage3.py`. Imports torch lazily.

One call, made after ``deepspeed.init_distributed`` and before ``deepspeed.zero.Init`` /
``deepspeed.initialize``, plugs the MemAscend techniques into an unmodified DeepSpeed::

    import memascend_engine
    handle = memascend_engine.install(ds_config, region="/dev/nvme1n1p3", model_spec="qwen2.5-7b")
    with deepspeed.zero.Init(config_dict_or_path=ds_config):
        model = build()
    handle.enable_offloaded_checkpointing(model)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    ...
    print(handle.stats())

Every technique can be switched off on its own through :class:`EngineOptions` (for ablations).

Layout: runtime.py (install, the Installed handle); options.py (EngineOptions); ds_internals/ (**every** access to
DeepSpeed internals: patches, private attributes, internal imports, each version-checked); bounded.py, direct_nvme.py,
pinned.py, native.py (the techniques, DeepSpeed-free); activation_checkpointing.py; run_checkpoint.py and
checkpoint_integrity.py (memascend's resumable checkpoints); train_worker.py, bench_job.py, tokenize_job.py,
parity.py (child processes of the CLI).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memascend_engine.options import EngineOptions

if TYPE_CHECKING:  # pragma: no cover
    from memascend_engine.runtime import Installed


def install(ds_config: dict, *, region: str | None, model_spec=None, options: EngineOptions | None = None,
            rank: int | None = None, placement: str = "auto") -> Installed:
    """Plug the engine into DeepSpeed; see :func:`memascend_engine.runtime.install`."""
    from memascend_engine.runtime import install as _install

    return _install(ds_config, region=region, model_spec=model_spec, options=options, rank=rank, placement=placement)


__all__ = ["EngineOptions", "install"]
