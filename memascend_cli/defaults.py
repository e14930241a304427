"""The job defaults `memascend plan` and `memascend train` share (one home, so `plan && train` agree).

Plain constants: `plan` imports them without loading the recipe machinery.
"""

DEFAULT_SEQ_LEN = 2048
"""Tokens per sequence (LLaMA-Factory's cutoff_len default)."""
DEFAULT_MICRO_BATCH = 1
"""Sequences per rank per forward/backward."""
DEFAULT_GRAD_ACCUM = 1
"""Micro-batches per optimizer step."""
DEFAULT_PRECISION = "bf16"
"""Model/compute dtype."""
DEFAULT_GRADIENT_CHECKPOINTING = True
"""Recompute activations in backward (the memascend engine offloads the checkpoints to host memory);
LLaMA-Factory checkpoints by default too. The planner calls it `offload` (`full` on stock DeepSpeed)."""
