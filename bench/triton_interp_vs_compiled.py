"""numcheck's built-in Triton kernels compiled on CUDA against the same kernels in Triton's CPU
interpreter (with numcheck's exact conversions), on the same inputs: how many outputs are
bitwise equal and the largest difference in ULPs of the output dtype. What the interpreter
cannot tell (docs/triton.md: FMA contraction, fast exp/sqrt) shows up here.

    python bench/triton_interp_vs_compiled.py        (needs a CUDA device; bench/gpu_run.sh)
"""
from __future__ import annotations

import sys

import torch

from numcheck import formats

from numcheck.kernels import triton_interp as _triton_interp
CASES = [  # (kernel, dtype, shape, kwargs)
    ("rms_norm", torch.bfloat16, (64, 1025), {}), ("rms_norm", torch.float32, (64, 4096), {}),
    ("softmax", torch.bfloat16, (64, 1025), {}), ("softmax", torch.float32, (64, 4096), {}),
    ("fp8_qdq", torch.bfloat16, (64, 4096), {"fmt": "e4m3"}),
    ("mx_qdq", torch.bfloat16, (64, 4096), {"elem": "e4m3"}),
    ("mx_qdq", torch.float32, (64, 4096), {"elem": "e5m2", "scale_mode": "rceil"}),
]


def _ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    f = formats.get({torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[a.dtype])
    a64, b64 = a.double(), b.double()
    ulp = torch.exp2(torch.floor(torch.log2(a64.abs().clamp_min(f.min_normal))) - f.mbits)
    return float(((a64 - b64).abs() / ulp).nan_to_num(0.0).max())


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to compare (the interpreted side runs in the test suite)")
        return 0
    cpu, gpu = _triton_interp.kernels_module("cpu"), _triton_interp.kernels_module("cuda")
    g = torch.Generator().manual_seed(0)
    print(f"{'kernel':10} {'dtype':9} {'shape':12} {'equal':>8} {'max ULP':>8}")
    for name, dtype, shape, kw in CASES:
        x = (torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g))).to(dtype)
        args = (x, torch.ones(shape[-1], dtype=dtype), 1e-6) if name == "rms_norm" else (x,)
        a = getattr(cpu, name)(*args, **kw)
        b = getattr(gpu, name)(*(t.cuda() if isinstance(t, torch.Tensor) else t for t in args),
                               **kw).cpu()
        same = (a.view(torch.int16 if a.element_size() == 2 else torch.int32) ==
                b.view(torch.int16 if b.element_size() == 2 else torch.int32)).double().mean()
        print(f"{name:10} {str(dtype)[6:]:9} {'x'.join(map(str, shape)):12} "
              f"{float(same):8.4f} {_ulps(a, b):8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
