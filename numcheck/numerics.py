"""The numerics state a kernel runs under: pinned, recorded with every case, restored after it.

DESIGN rule 9: TF32, float32_matmul_precision, reduced-precision reductions, deterministic
algorithms and the thread count all change results. A case runs under a pinned state (the
values below), the state is stored in its record, and whatever the caller had is put back.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import torch

# Sums differ between 1 and 2 threads (PLATFORM.md); 2 is what CI's machines have.
PINNED_THREADS = 2


@dataclass(frozen=True)
class NumericsState:
    """Every global switch of torch that changes a kernel's arithmetic."""

    allow_tf32_matmul: bool
    allow_tf32_cudnn: bool
    float32_matmul_precision: str
    bf16_reduced_precision_reduction: bool
    fp16_reduced_precision_reduction: bool
    deterministic: bool
    num_threads: int

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())


# Pinned: full fp32 (no TF32), torch's default reduced-precision reductions (what users get),
# deterministic algorithms off (their default; kernels that need it opt in themselves).
PINNED = NumericsState(
    allow_tf32_matmul=False, allow_tf32_cudnn=False, float32_matmul_precision="highest",
    bf16_reduced_precision_reduction=True, fp16_reduced_precision_reduction=True,
    deterministic=False, num_threads=PINNED_THREADS)


def current() -> NumericsState:
    m = torch.backends.cuda.matmul
    return NumericsState(
        allow_tf32_matmul=bool(m.allow_tf32),
        allow_tf32_cudnn=bool(torch.backends.cudnn.allow_tf32),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        bf16_reduced_precision_reduction=bool(m.allow_bf16_reduced_precision_reduction),
        fp16_reduced_precision_reduction=bool(m.allow_fp16_reduced_precision_reduction),
        deterministic=torch.are_deterministic_algorithms_enabled(),
        num_threads=torch.get_num_threads())


def apply(state: NumericsState) -> None:
    # float32_matmul_precision first: it also sets allow_tf32, which the explicit flag then fixes.
    torch.set_float32_matmul_precision(state.float32_matmul_precision)
    m = torch.backends.cuda.matmul
    m.allow_tf32 = state.allow_tf32_matmul
    torch.backends.cudnn.allow_tf32 = state.allow_tf32_cudnn
    m.allow_bf16_reduced_precision_reduction = state.bf16_reduced_precision_reduction
    m.allow_fp16_reduced_precision_reduction = state.fp16_reduced_precision_reduction
    torch.use_deterministic_algorithms(state.deterministic)
    torch.set_num_threads(state.num_threads)


@contextlib.contextmanager
def pinned(state: NumericsState = PINNED):
    """Run the block under ``state``; yields the state as read back; restores the caller's."""
    saved = current()
    try:
        apply(state)
        yield current()
    finally:
        apply(saved)
