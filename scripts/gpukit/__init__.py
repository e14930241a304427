"""The GPU kit's modules (scripts/gpu_check.py is its entry point): pure (constants, time model, parsers,
verdicts), carry (the carry folder, the size of what travels), kit (state, running a step, the build
environment), phases (first-seconds probe, setup, storage probe, CUDA constants, GPU tests), bench (bench,
context sweep, plots), calls (the kit's calls, one command each on the GPU machine), cuda_constants (the
measurement run on the GPU machine)."""
