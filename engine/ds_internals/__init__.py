"""Every access to DeepSpeed internals (private attributes, monkey-patches, internal module imports) lives in this
subpackage, written against DeepSpeed 0.19.5 .. 0.19.x (version.py) and checked against the installed version on
every path that reaches it: install() (the memascend engine), memascend's run checkpoints on stock runs and on resume
(optimizer_state), DeepSpeed's checkpoint API (checkpoint_api) and the probes.

Plug-in points, each reversible by :meth:`patches.Patches.restore`:

* ``AsyncIOBuilder`` module globals of the three swapper modules -> Direct NVMe handles (aio.py);
* ``partition_parameters.AsyncPartitionedParameterSwapper`` -> size-class pools instead of
  ``buffer_count x buffer_size`` (swapper.py);
* ``stage3.DeepSpeedZeroOptimizer_Stage3`` -> fused overflow scan, malloc_trim after backward, Adam states created in
  place (stage3.py), the bounded engine (bounded_stage3.py) and DeepSpeed's checkpoint API on region state
  (checkpoint_api.py, checkpoint_files.py);
* ``DeepSpeedEngine.save_checkpoint / load_checkpoint`` -> the same, told where this rank's files go;
* the accelerator's ``pin_memory / pin_empty / pin_empty_like / is_pinned / unpin_memory`` -> the exact-size
  allocator (pinning.py).

context.py holds what the patched classes share with the installed engine, allocator.py the glibc heap policy,
optimizer_state.py the reads and writes of optimizer state, probes.py the parity script's probes. DeepSpeed is imported
only inside functions, so importing any of these modules stays cheap.

Not named ``deepspeed``: DeepSpeed's launcher runs scripts by path (``deepspeed engine/parity.py``), which puts
engine/ first on sys.path, where a ``deepspeed`` folder would shadow DeepSpeed itself.
"""
