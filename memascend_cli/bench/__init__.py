"""`memascend bench`: the same job on stock, tuned and memascend DeepSpeed, measured side by side.

    runs.py      which runs (the engine names, the ablation's techniques); the only module the child imports
    configs.py   each run's DeepSpeed config and environment, and the planner's prediction of it
    sampling.py  the settle wait, the >= 1 kHz meminfo sampler and the process-tree sampler
    runner.py    launching one run's child (memascend_engine.bench_job) and sampling it; a point's runs
    outcome.py   what the child left, read into its result: events, memory samples, the verdict
    sweep.py     the machine the runs are planned on, the time model's inputs, the sweep over its points
    document.py  the JSON summary, its timeline side file, the table, the plot and the SSD roofline lines

Torch-free: the training job runs in the child process; the parent only samples /proc and waits. This package
file imports nothing, so `memascend_engine.bench_job` can import runs.py without the rest.
"""
