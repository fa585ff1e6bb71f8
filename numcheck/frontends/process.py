"""Process tuning for numcheck's pytest runs: glibc's allocator for numcheck's many short-lived
tensors, and OpenMP's wait policy in xdist workers (below). A pytest plugin that ``numcheck
run`` loads with ``-p`` (and numcheck's own tests through their conftest).

Why: numcheck's exact float64 arithmetic allocates a fresh temporary of 0.1-30 MiB per
elementwise op. glibc serves blocks above its mmap threshold (128 KiB at start) with mmap and
gives freed heap tops back to the kernel above its trim threshold, so op after op page-faults
its output in again. One 40-step tiny_lm NVFP4 run measured 983k minor faults, 4.7 s system
time and 49 s CPU by default; 66k faults, 0.5 s and 41 s with both thresholds raised. Raised,
freed memory stays in the process for reuse; the peak is still what the live tensors need.
Elsewhere than glibc (musl, macOS) nothing is changed.

Importing it in a pytest-xdist worker also sets OMP_WAIT_POLICY=PASSIVE (unless set, and only
before torch is imported: OpenMP reads it once). Kernels run on numcheck's pinned 2 intra-op
threads (numerics.PINNED_THREADS: sums depend on the count), so `-n 2` runs 4 threads on 2
cores, and OpenMP's default spin-wait at every barrier burns the time of the thread it waits
for. Measured, the quick main job on 2 cores: 319 s wall and 591 s CPU spinning, 251 s and
455 s passive, the same records (`-n 0`: 441 s).
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys

if os.environ.get("PYTEST_XDIST_WORKER") and "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# glibc's upper limit for M_MMAP_THRESHOLD on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): 32 MiB.
_MMAP_THRESHOLD = 32 << 20
# Keep up to 1 GiB of freed heap top instead of trimming it after every large free.
_TRIM_THRESHOLD = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (malloc.h)


def tune() -> bool:
    """Raise glibc's mmap and trim thresholds in this process; True where it was applied."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
                    and libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    except (OSError, AttributeError):
        return False


def pytest_configure(config) -> None:  # noqa: ARG001 - pytest hook signature
    tune()
