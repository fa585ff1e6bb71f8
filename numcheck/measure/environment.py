"""What machine numbers come from: device class, CPU ISA, library versions, dtype/SDPA support.

Goldens are keyed by ``device_class`` and carry ``provenance`` in their file metadata, because the
same kernel gives different bits on different hardware (tensor-core generations, AVX512-BF16 or
AMX paths on the CPU) and library builds (cuBLAS/cuDNN heuristics). ``numcheck doctor`` prints
all of it so that a bug report or a surprising golden diff starts from facts, not guesses.

This module only describes; it prints nothing and changes no global state beyond what probing a
device inevitably does (initializing CUDA). The probes (``dtype_support``, ``sdpa_backends``) run
tiny operations and never raise: a doctor that crashes on the machine it is meant to diagnose is
useless. ``device_class`` and ``provenance`` do raise ``UsageError`` for a device that is not
there, since a golden keyed by a made-up device class would be worse than an error.
"""
from __future__ import annotations

import ctypes
import datetime as _dt
import importlib.metadata
import importlib.util
import platform
import re
import shutil
import subprocess
import warnings

import torch

from numcheck.errors import UsageError

__all__ = ["ENVIRONMENT_FAILURES", "available_devices", "cpu_isa", "device_class", "dtype_support",
           "known_failure", "optional_libraries", "provenance", "sdpa_backends"]

# Low-precision dtypes numcheck works with, by torch attribute name (absent in older torch).
LOW_PRECISION_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                        "float8_e8m0fnu", "float4_e2m1fn_x2", "bfloat16", "float16")
# Element types _scaled_mm takes as operands; e8m0 is a scale format, not a GEMM operand.
_SCALED_MM_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
# Libraries numcheck uses when present (oracles, third-party checks, property tests, storage).
OPTIONAL_LIBRARIES = ("ml_dtypes", "torchao", "triton", "pyarrow", "hypothesis", "scipy")
# import name -> distribution name, where they differ.
_DIST_NAMES = {"ml_dtypes": "ml-dtypes"}
_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
_SDPA_BACKENDS = ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")

# Errors of the environment, not of the kernel under test: (pattern searched in the kernel's error
# message, finding id). Each id is explained by numcheck.verdicts.findings (`numcheck explain ID`), with
# the versions and machines it was seen on; docs/findings.md has the measurements.
ENVIRONMENT_FAILURES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"pack_vnni2 is only supported when avx512 is supported"),
     "torch-cpu-flash-bf16-avx2-vnni"),
    (re.compile(r"at::vec.{0,3} has not been declared"), "inductor-cache-across-cpu-capability"),
    # Triton's CPU interpreter (TRITON_INTERPRET=1) cannot run device code: libdevice functions
    # numcheck's support does not implement (its own message), inline PTX and extern calls
    (re.compile(r"\[triton-interp-libdevice\]"), "triton-interp-libdevice"),
    (re.compile(r"(inline_asm|extern_elementwise) not supported in interpreter mode"),
     "triton-interp-device-code"),
    # Triton asked for a GPU driver (a launcher's device query) where there is none
    (re.compile(r"0 active drivers \(\[\]\)"), "triton-no-driver"),
)


def known_failure(message: str) -> str | None:
    """The finding id of a documented environment failure whose error message ``message`` is
    (``ENVIRONMENT_FAILURES``: a torch build or machine limitation, not a wrong kernel), else
    None. A case failing this way is the environment's, reported under that id."""
    for pattern, finding in ENVIRONMENT_FAILURES:
        if pattern.search(message):
            return finding
    return None


def _resolve(device) -> torch.device:
    """None -> the device a run uses by default: the current CUDA device if any, else the CPU."""
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise UsageError(f"device={device!r} is not a torch device ({e}); use 'cpu' or 'cuda:N'")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device={device!r}, but torch.cuda.is_available() is False here "
                             f"(torch {torch.__version__}); use device='cpu'")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if not 0 <= index < torch.cuda.device_count():
            raise UsageError(f"device={device!r}: this machine has {torch.cuda.device_count()} "
                             "CUDA device(s)")
        dev = torch.device("cuda", index)
    return dev


def available_devices() -> list[torch.device]:
    """The CPU, then every visible CUDA device: what doctor describes one by one."""
    devs = [torch.device("cpu")]
    if torch.cuda.is_available():
        devs += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return devs


def device_class(device=None) -> str:
    """The hardware key goldens are stored under: ``cpu`` or ``cuda-smXY`` (e.g. ``cuda-sm90``).

    Different GPU generations round differently (tensor-core accumulation, TF32, fp8 MMA), so a
    golden recorded on sm90 does not gate an sm80 run. On ROCm builds the key is ``rocm-<gfx
    arch>`` (torch reports a fake CUDA capability there); other device types give their type name.
    """
    dev = _resolve(device)
    if dev.type == "cpu":
        return "cpu"
    if dev.type == "cuda":
        if torch.version.hip:
            arch = getattr(torch.cuda.get_device_properties(dev), "gcnArchName", "unknown")
            return "rocm-" + arch.split(":")[0]
        major, minor = torch.cuda.get_device_capability(dev)
        return f"cuda-sm{major}{minor}"
    return dev.type


def _cpuinfo() -> tuple[set[str], str, str] | None:
    """(flags, model name, vendor id) of the first CPU from /proc/cpuinfo; None where it is
    unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    flags: set[str] = set()
    model = vendor = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features") and not flags:  # x86 / Arm spelling
            flags = set(value.split())
        elif key in ("model name", "Hardware", "Model") and not model:
            model = value.strip()
        elif key in ("vendor_id", "CPU implementer") and not vendor:
            vendor = value.strip()
    return flags, model, vendor


def cpu_isa() -> dict:
    """Vector ISA of this CPU: CPU kernels take different paths (and round differently) on each.

    Returns ``torch_capability`` (what torch's dispatcher picked: DEFAULT, AVX2, AVX512, ...),
    one boolean per flag in ``avx2 avx512f avx512_bf16 amx_tile amx_bf16`` (False where
    /proc/cpuinfo is unreadable: ``flags_source`` then says ``unavailable``), ``vendor`` (the CPU
    vendor id, ``GenuineIntel`` / ``AuthenticAMD`` on x86: MKL picks its kernels by vendor too;
    "" where unknown), and ``summary``, the most capable of AMX, AVX512-BF16, AVX512, AVX2, else
    torch's capability string.
    """
    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # old torch without the call
        capability = "unknown"
    info = _cpuinfo()
    flags = info[0] if info else set()
    out: dict = {"torch_capability": capability}
    out.update({flag: flag in flags for flag in _CPU_FLAGS})
    out["flags_source"] = "/proc/cpuinfo" if info else "unavailable"
    out["vendor"] = info[2] if info else ""
    if out["amx_tile"] or out["amx_bf16"]:
        summary = "AMX"
    elif out["avx512_bf16"]:
        summary = "AVX512-BF16"
    elif out["avx512f"]:
        summary = "AVX512"
    elif out["avx2"]:
        summary = "AVX2"
    else:
        summary = capability
    out["summary"] = summary
    return out


def _dist_version(name: str) -> str | None:
    """Installed version from package metadata, without importing (torchao prints on import)."""
    try:
        return importlib.metadata.version(_DIST_NAMES.get(name, name))
    except importlib.metadata.PackageNotFoundError:
        return None


def optional_libraries() -> dict[str, dict]:
    """For each optional library: ``{"importable": bool, "version": str | None}``.

    Found with importlib.util.find_spec and importlib.metadata, so nothing is imported: torchao
    prints warnings on import and triton may initialize a GPU driver.
    """
    out = {}
    for name in OPTIONAL_LIBRARIES:
        try:
            importable = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            importable = False
        out[name] = {"importable": importable, "version": _dist_version(name)}
    return out


def _driver_version() -> str:
    """NVIDIA driver version from nvidia-smi (torch does not expose it); 'n/a' if not there."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "n/a"
    try:
        res = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "n/a"
    lines = res.stdout.split()
    return lines[0] if res.returncode == 0 and lines else "n/a"


def _cudnn_version() -> str | None:
    """cuDNN version as major.minor.patch (the integer encoding changed at cuDNN 9)."""
    try:
        v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        return None
    if not v:
        return None
    if v >= 90000:
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"


def _cublas_version() -> str | None:
    """cuBLAS(Lt) version of the library this process loaded, else of the installed wheel.

    torch has no API for it. A CUDA build of torch links libcublasLt, so it is mapped into the
    process after ``import torch``; asking the mapped library is exact and costs microseconds.
    The wheel's metadata (nvidia-cublas[-cuXY]) is the fallback. None when neither works.
    """
    if not torch.version.cuda:
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            paths = {line.split()[-1] for line in fh if "libcublasLt.so" in line}
        for path in sorted(paths):
            lib = ctypes.CDLL(path)
            lib.cublasLtGetVersion.restype = ctypes.c_size_t
            v = int(lib.cublasLtGetVersion())
            if v:
                return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    except (OSError, AttributeError, ValueError, IndexError):
        pass
    for dist in ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12", "nvidia-cublas-cu11"):
        v = _dist_version(dist)
        if v:
            return v
    return None


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "cpu":
        info = _cpuinfo()
        return (info[1] if info else "") or platform.processor() or platform.machine() or "cpu"
    return dev.type


def provenance(device=None) -> dict[str, str]:
    """Where a result came from, as strings: stored in golden/results file metadata.

    Versions of numcheck, Python, torch, CUDA, cuDNN, cuBLAS (omitted where it cannot be read
    cheaply), the NVIDIA driver; the device's name, compute capability and ``device_class``; the
    CPU ISA summary; numpy/ml_dtypes/torchao versions ('n/a' if not installed); the UTC date.
    No hostname, user or path: goldens are committed to public repositories.
    ``device=None`` describes the default device (the current CUDA device if any, else the CPU).
    """
    from numcheck.version import __version__

    dev = _resolve(device)
    out = {
        "numcheck": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "n/a",
    }
    if torch.version.hip:
        out["hip"] = torch.version.hip
    out["cudnn"] = _cudnn_version() or "n/a"
    cublas = _cublas_version()
    if cublas:
        out["cublas"] = cublas
    out["driver"] = _driver_version() if torch.cuda.is_available() else "n/a"
    out["device"] = str(dev)
    out["device_name"] = _device_name(dev)
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        out["compute_capability"] = f"{major}.{minor}"
    else:
        out["compute_capability"] = "n/a"
    out["device_class"] = device_class(dev)
    isa = cpu_isa()
    out["cpu_isa"] = isa["summary"]
    out["torch_cpu_isa"] = isa["torch_capability"]  # the vector path ATen dispatches to
    for name in ("numpy", "ml_dtypes", "torchao"):
        out[name] = _dist_version(name) or "n/a"
    out["date"] = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    return out


def _error_name(e: BaseException) -> str:
    return f"error: {type(e).__name__}"


def _scaled_mm_support(dtype: torch.dtype, dev: torch.device) -> str | None:
    """Which tiny 16x16 tensor-wise _scaled_mm with a ``dtype`` operand gives the exact product.

    ``"scaled_mm"`` when dtype x dtype works; ``"scaled_mm (x float8_e4m3fn)"`` when only the
    pairing with e4m3fn does (cuBLASLt rejects e5m2 x e5m2); None when neither runs correctly.
    Values are small integers: every product and the fp32 sum over 16 terms are exact.
    """
    if not hasattr(torch, "_scaled_mm"):
        return None
    gen = torch.Generator().manual_seed(0)
    a32 = torch.randint(-3, 4, (16, 16), generator=gen).float()
    b32 = torch.randint(-3, 4, (16, 16), generator=gen).float()
    partners = [dtype]
    if dtype != torch.float8_e4m3fn:
        partners.append(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device=dev)
    want = (a32 @ b32).to(dev)
    for other in partners:
        try:
            a = a32.to(dev).to(dtype)
            b = b32.to(dev).to(other).t().contiguous().t()  # column-major, as cuBLASLt needs
            out = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)
            if isinstance(out, tuple):  # torch < 2.5 also returned amax
                out = out[0]
            if torch.equal(out.float(), want):
                return "scaled_mm" if other == dtype else "scaled_mm (x float8_e4m3fn)"
        except Exception:
            continue
    return None


def dtype_support(device) -> dict[str, str]:
    """What each low-precision dtype can do on ``device``; never raises.

    Values: ``cast+scaled_mm`` (fp32 -> dtype -> fp32 round-trips exact values and a tiny
    tensor-wise torch._scaled_mm gives the right product; ``cast+scaled_mm (x float8_e4m3fn)``
    where it does so only paired with an e4m3fn operand, as e5m2 on CUDA), ``cast``, ``cast (wrong values)``,
    ``storage only`` (tensors can be allocated but not converted: float4_e2m1fn_x2 today),
    ``absent`` (this torch has no such dtype), or ``error: <exception class>``.
    Suites use this to skip cases with a reason instead of failing on a missing kernel.
    """
    try:
        dev = _resolve(device)
    except Exception as e:
        return {name: _error_name(e) for name in LOW_PRECISION_DTYPES}
    # Powers of two in [0.5, 2]: exact in every format listed (e8m0 has no sign, e2m1 max is 6).
    probe = torch.tensor([0.5, 1.0, 2.0])
    out = {}
    for name in LOW_PRECISION_DTYPES:
        dtype = getattr(torch, name, None)
        if dtype is None:
            out[name] = "absent"
            continue
        try:
            back = probe.to(dev).to(dtype).to(torch.float32).cpu()
        except Exception:
            try:
                torch.empty(2, dtype=dtype, device=dev)
                torch.zeros(2, dtype=torch.uint8, device=dev).view(dtype)
                out[name] = "storage only"
            except Exception as e:
                out[name] = _error_name(e)
            continue
        if not torch.equal(back, probe):
            out[name] = "cast (wrong values)"
        else:
            mm = _scaled_mm_support(dtype, dev) if name in _SCALED_MM_DTYPES else None
            out[name] = f"cast+{mm}" if mm else "cast"
    return out


def _short(text: str, limit: int = 100) -> str:
    """First line of a message, cut to ``limit`` characters: reasons fit on one table row."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def sdpa_backends(device) -> dict[str, str]:
    """Which scaled_dot_product_attention backends run on ``device``, in which dtypes; never raises.

    For MATH, FLASH_ATTENTION, EFFICIENT_ATTENTION and CUDNN_ATTENTION a tiny (1, 2, 16, 16)
    attention runs under ``sdpa_kernel([backend])`` in fp32 and bf16 (and fp16 on CUDA). Values
    are the dtypes that ran (``"fp32, bf16"``) or ``unavailable: <reason>``, the reason being
    torch's own warning (why the backend was rejected) or the exception's first line. An SDPA
    kernel under test is only meaningful on a backend that actually runs here.
    """
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F
    except ImportError as e:
        return {name: f"unavailable: {_short(str(e))}" for name in _SDPA_BACKENDS}
    try:
        dev = _resolve(device)
    except Exception as e:
        return {name: f"unavailable: {_short(str(e))}" for name in _SDPA_BACKENDS}
    dtypes = [("fp32", torch.float32), ("bf16", torch.bfloat16)]
    if dev.type == "cuda":
        dtypes.append(("fp16", torch.float16))
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(3, 1, 2, 16, 16, generator=gen)
    out = {}
    for name in _SDPA_BACKENDS:
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            out[name] = "unavailable: not in this torch"
            continue
        ran, reason = [], ""
        for label, dtype in dtypes:
            try:
                q, k, v = base.to(dev, dtype).unbind(0)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        with sdpa_kernel([backend]):
                            F.scaled_dot_product_attention(q, k, v)
                    except Exception as e:
                        # On CUDA torch warns why each fused backend was rejected; that beats
                        # the generic "No viable backend" error. Without a warning the backend
                        # was never considered for this device type (EFFICIENT/CUDNN on CPU).
                        msgs = [str(w.message) for w in caught]
                        first = str(e).split(". ")[0]
                        reason = reason or _short(
                            msgs[-1] if msgs else
                            f"not offered on {dev.type} ({type(e).__name__}: {first})")
                        continue
                ran.append(label)
            except Exception as e:  # moving the inputs failed, etc.
                reason = reason or _short(f"{type(e).__name__}: {e}")
        out[name] = ", ".join(ran) if ran else f"unavailable: {reason}"
    return out
