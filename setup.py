"""Build glue for the native core (csrc/ -> memascend_engine._native); metadata lives in pyproject.toml.

Only pybind11 and a C++17 compiler are needed: no torch headers, no CUDA, no liburing/libaio
(io_uring is driven through raw syscalls, the CUDA runtime is dlopen'ed at run time).
Set MEMASCEND_SKIP_NATIVE=1 to install the pure-Python parts only (native.available() then says why).
"""

import os
from glob import glob

from setuptools import setup

ext_modules = []
cmdclass = {}
if os.environ.get("MEMASCEND_SKIP_NATIVE") != "1":
    from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext

    # Compile the csrc/*.cpp files in parallel (default: all cores; MEMASCEND_BUILD_JOBS overrides).
    ParallelCompile("MEMASCEND_BUILD_JOBS").install()

    ext_modules.append(
        Pybind11Extension(
            "memascend_engine._native",
            sources=sorted(glob("csrc/*.cpp")),
            include_dirs=["csrc"],
            cxx_std=17,
            # -O3 for the scan's vectorised reductions; baseline ISA only, the scan dispatches to
            # an AVX2 clone at load time so the wheel stays portable.
            # -fno-math-errno: sqrt in vector loops (moments.cpp's Adam); nothing here reads errno after math calls.
            extra_compile_args=["-O3", "-fno-math-errno", "-fvisibility=hidden", "-Wall", "-Wextra",
                                "-Wno-missing-field-initializers"],
            extra_link_args=["-pthread"],
            libraries=["dl"],
        )
    )
    cmdclass["build_ext"] = build_ext

setup(ext_modules=ext_modules, cmdclass=cmdclass)
