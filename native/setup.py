"""tracepipe-native: one C++ extension, `tracepipe_native` (chunk_builder.cpp, nesting.cpp, shape_keys.cpp and the vendored
simdjson 3.12.3 amalgamation, simdjson/, Apache-2.0). Built by `make install` where a C++
compiler is found; tracepipe works without it (pipeline/read/by_native.py)."""

import platform

from setuptools import Extension, setup


def _cpu_flags() -> list[str]:
    """On x86-64, simdjson's On-Demand API runs the kernel it is compiled for: AVX2 (its `haswell`
    kernel) where the building machine has it, else its portable one. The module refuses to load
    on a CPU without what it was built for (the Python builders are then used)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    if {"avx2", "bmi1", "bmi2", "pclmulqdq", "popcnt", "abm"} <= set(flags):
        return ["-mavx2", "-mbmi", "-mbmi2", "-mpclmul", "-mpopcnt", "-mlzcnt"]
    return []


setup(
    ext_modules=[
        Extension(
            "tracepipe_native",
            sources=["chunk_builder.cpp", "nesting.cpp", "shape_keys.cpp", "simdjson/simdjson.cpp"],
            include_dirs=["."],
            language="c++",
            extra_compile_args=["-std=c++17", "-O2", "-DNDEBUG", *_cpu_flags()],
        )
    ],
)
