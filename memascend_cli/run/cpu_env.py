"""The environment that decides a CPU rank's math kernels, in one place: what `train`/`launch` and every `bench` run
(stock, tuned and memascend alike) give their ranks, and which variables a run's record keeps. Pure, stdlib only."""

from __future__ import annotations

KERNEL_ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "ONEDNN_", "DNNL_", "ATEN_")
"""Variables that choose torch's CPU kernels or their thread counts (OpenMP, MKL, oneDNN, ATen's ISA dispatch)."""


def cpu_rank_env(cpu_cores: int, ranks: int) -> dict[str, str]:
    """The threads and MKL code branch of each of `ranks` CPU ranks sharing `cpu_cores` logical CPUs. Pure."""
    return {
        # Each CPU rank gets its share of the cores; oversubscribed ranks run several times slower.
        "OMP_NUM_THREADS": str(max(1, cpu_cores // max(1, ranks))),
        # MKL's sgemm sums in a thread-count-dependent order, and with MKL_DYNAMIC (its default) it may run fewer
        # threads than asked: fp32 losses then differ by an ulp between identical runs, and resume is no longer
        # bit-exact. Intel oneMKL developer guide, "Obtaining Numerically Reproducible Results": fix the thread count
        # and the code branch.
        "MKL_DYNAMIC": "FALSE",
        "MKL_CBWR": "AUTO",
    }


def kernel_env(env) -> dict[str, str]:
    """The variables of `env` (a mapping: os.environ, a child's environment) that choose CPU kernels, sorted. Pure."""
    return {k: env[k] for k in sorted(env) if k.startswith(KERNEL_ENV_PREFIXES)}
