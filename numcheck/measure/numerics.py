"""The numerics state a kernel runs under: pinned, recorded with every case, restored after it.

DESIGN rule 9: TF32 (and oneDNN's bf16 for fp32 matmul on CPUs), reduced-precision reductions,
deterministic algorithms and the thread count all change results. A case runs under a pinned
state, the state is stored in its record, and whatever the caller had is put back.

torch >= 2.9 has per-backend ``fp32_precision`` knobs ("ieee", "tf32", "bf16", "none" =
inherit) and refuses to read the legacy flags (``allow_tf32``, float32_matmul_precision) once
both APIs were used. numcheck therefore uses only the new knobs where they exist, and only the
legacy flags on older torch.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import torch

# Sums differ between 1 and 2 threads (PLATFORM.md); 2 is what CI's machines have.
PINNED_THREADS = 2
# The fp32 knobs numcheck pins (new API): every matmul/conv path that could swap in TF32/bf16.
_KNOBS = ("cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv",
          "mkldnn.rnn")


def _knob(path: str):
    obj = torch.backends
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if hasattr(obj, "fp32_precision") else None


_NEW_API = _knob("cuda.matmul") is not None


@dataclass(frozen=True)
class NumericsState:
    """Every global switch of torch that changes a kernel's arithmetic."""

    fp32_precision: tuple[tuple[str, str], ...]  # (knob, value); legacy torch: ("legacy", ...)
    bf16_reduced_precision_reduction: bool
    fp16_reduced_precision_reduction: bool
    deterministic: bool
    num_threads: int

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        knobs = " ".join(f"{k}={v}" for k, v in self.fp32_precision)
        return (f"{knobs} bf16_reduced_reduction={self.bf16_reduced_precision_reduction} "
                f"fp16_reduced_reduction={self.fp16_reduced_precision_reduction} "
                f"deterministic={self.deterministic} threads={self.num_threads}")


def _pinned_precision() -> tuple[tuple[str, str], ...]:
    if _NEW_API:
        return tuple((k, "ieee") for k in _KNOBS if _knob(k) is not None)
    return (("legacy.allow_tf32_matmul", "False"), ("legacy.allow_tf32_cudnn", "False"),
            ("legacy.float32_matmul_precision", "highest"))


# Pinned: full fp32 everywhere (no TF32, no bf16 passes for fp32), torch's default
# reduced-precision reductions (what users get), deterministic algorithms off (their default).
PINNED = NumericsState(_pinned_precision(), True, True, False, PINNED_THREADS)


def current() -> NumericsState:
    m = torch.backends.cuda.matmul
    if _NEW_API:
        prec = tuple((k, str(_knob(k).fp32_precision)) for k in _KNOBS if _knob(k) is not None)
    else:
        prec = (("legacy.allow_tf32_matmul", str(bool(m.allow_tf32))),
                ("legacy.allow_tf32_cudnn", str(bool(torch.backends.cudnn.allow_tf32))),
                ("legacy.float32_matmul_precision", torch.get_float32_matmul_precision()))
    return NumericsState(prec, bool(m.allow_bf16_reduced_precision_reduction),
                         bool(m.allow_fp16_reduced_precision_reduction),
                         torch.are_deterministic_algorithms_enabled(), torch.get_num_threads())


def apply(state: NumericsState) -> None:
    m = torch.backends.cuda.matmul
    for knob, value in state.fp32_precision:
        if knob == "legacy.allow_tf32_matmul":
            m.allow_tf32 = value == "True"
        elif knob == "legacy.allow_tf32_cudnn":
            torch.backends.cudnn.allow_tf32 = value == "True"
        elif knob == "legacy.float32_matmul_precision":
            torch.set_float32_matmul_precision(value)
        elif _knob(knob) is not None:
            _knob(knob).fp32_precision = value
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
