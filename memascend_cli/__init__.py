"""memascend: plan, prepare and run host-memory-lean SSD-offloaded fine-tuning.

`memascend_cli` is the command line (one module per command in commands/) and everything torch-free: the planner
(planner/: zero.py decides every ZeRO setting, memory.py the itemised memory model), region format and setup, the
DeepSpeed config builder, the launcher, the benchmark's parent side. Its siblings in the repository: `engine/`
(installed as `memascend_engine`, everything that imports torch / DeepSpeed) and `presets/` (installed as
`memascend_presets`).
"""

__version__ = "0.1.0"
