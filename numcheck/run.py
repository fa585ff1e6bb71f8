"""The run stage: one case through kernel, FP64 reference and baseline, into records.

    case -> inputs (float64 on CPU from the seed, rounded by numcheck, moved) -> kernel on the
    device under the pinned numerics state; FP64 reference on the CPU; baseline on the device
    -> ErrorStats of kernel and baseline vs FP64 -> verdict -> one record per output

``verify`` runs an op's case set against one kernel and returns a ``Verification``. A kernel that
raises, or returns the wrong shape, dtype or device, fails that case by name; the other cases run.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import environment, formats, inputs, numerics
from .errors import UsageError
from .ops import Case, Kernel, OpSpec, as_kernel, get_op
from .policy import Verdict, judge
from .stats import ErrorStats, error_stats

N_WORST = 5  # worst elements listed in a failing record
_STAT_FIELDS = [f.name for f in dataclasses.fields(ErrorStats)]


@dataclass
class Verification:
    """Result of ``nc.verify``: ``passed``, ``records`` (one dict per case and output),
    ``failures`` (the records that failed or errored). Records with status "known" failed a
    rule where the kernel declares a documented weakness: reported, not counted as failures."""

    op: str
    kernel: str
    device: str
    cases: str
    records: list[dict]

    @property
    def executed(self) -> int:
        return len({r["case_id"] for r in self.records if r["status"] != "skipped"})

    @property
    def failures(self) -> list[dict]:
        return [r for r in self.records if r["status"] in ("failed", "error")
                or r.get("golden") in ("regressed", "missing")]

    @property
    def passed(self) -> bool:
        # DESIGN rule 11: a run in which nothing executed (everything skipped) fails.
        return self.executed > 0 and not self.failures

    def summary(self) -> str:
        from .report import verification_table
        return verification_table(self)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_dtype(name: str) -> torch.dtype:
    dt = formats.get(name).torch
    if dt is None:
        raise UsageError(f"format {name!r} has no torch dtype to run a kernel in")
    return dt


def _kernel_ref(kern: Kernel) -> str:
    fn = kern.fn
    mod = getattr(fn, "__module__", "")
    if mod.startswith("numcheck.ops"):
        return kern.name
    return f"{mod}:{getattr(fn, '__qualname__', kern.name)}"


def repro_command(op: str, kern: Kernel, case: Case, device: str) -> str:
    """One shell line that runs exactly this case again (grid or hypothesis-found)."""
    return (f"numcheck verify --op {op} --kernel {_kernel_ref(kern)} --device {device} "
            f"--adhoc '{case_to_json(case)}'")


def case_to_json(case: Case) -> str:
    return json.dumps({"dtype": case.dtype, "shape": list(case.shape), "dist": case.dist,
                       "seed": case.seed, "params": dict(case.params)}, separators=(",", ":"))


def case_from_json(op: str, text: str) -> Case:
    try:
        d = json.loads(text)
        params = tuple((k, tuple(v) if isinstance(v, list) else v)
                       for k, v in d.get("params", {}).items())
        return Case(op, d["dtype"], tuple(d["shape"]), d["dist"], int(d["seed"]), params)
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--adhoc {text!r}: expected JSON with dtype, shape, dist, seed and "
                         f"optional params ({type(e).__name__}: {e})") from e


def _base_record(spec: OpSpec, kern: Kernel, case: Case, device: str) -> dict[str, Any]:
    return {
        "op": spec.name, "kernel": kern.name, "case_id": case.id, "output": "out",
        "dtype": case.dtype, "shape": "x".join(map(str, case.shape)), "dist": case.dist,
        "seed": case.seed, "params": ",".join(f"{k}={v}" for k, v in case.params),
        "device": device, "device_class": environment.device_class(device),
        "status": "skipped", "reason": "",
    }


def input_digest(exact: dict[str, torch.Tensor], kwargs: dict[str, Any]) -> str:
    """16 hex digits over the case's exact inputs (names, dtypes, shapes, values) and kwargs:
    a golden row whose digest differs saw other inputs, which is not a regression."""
    h = hashlib.sha256()
    for name in sorted(exact):
        t = exact[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    for name in sorted(kwargs):
        v = kwargs[name]
        if isinstance(v, torch.Tensor):
            t = v.detach().to("cpu").contiguous()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.numpy().tobytes())
        else:
            h.update(f"{name}={v!r}".encode())
    return h.hexdigest()[:16]


def _stat_columns(prefix: str, s: ErrorStats | None) -> dict[str, Any]:
    if s is None:
        return {}
    return {f"{prefix}_{k}": v for k, v in s.as_dict().items()}


def _worst_elements(out: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None) -> str:
    """The N_WORST elements by error (normalized by scale when the op has one)."""
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to(torch.float64)
    err = (o - r).abs()
    err = torch.where(torch.isnan(o) != torch.isnan(r), math.inf, torch.nan_to_num(err, nan=0.0))
    key = err / scale.clamp(min=1e-300) if scale is not None else err
    flat = key.flatten()
    k = min(N_WORST, flat.numel())
    idx = torch.topk(torch.nan_to_num(flat, nan=math.inf), k).indices if k else []
    parts = []
    for i in idx:
        pos = tuple(int(p) for p in torch.unravel_index(i, o.shape)) if o.dim() else ()
        parts.append(f"{list(pos)}: out={o.flatten()[i].item():.6g} ref={r.flatten()[i].item():.6g}"
                     f" err={err.flatten()[i].item():.3g}")
    return "; ".join(parts)


def _bound_ratio(out: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None,
                 fmt: str) -> float | None:
    if scale is None:
        return None
    u = formats.get(fmt).unit_roundoff
    o = out.detach().to("cpu", torch.float64)
    fin = torch.isfinite(o) & torch.isfinite(ref)
    if not bool(fin.any()):
        return None
    err = (o - ref).abs()[fin]
    # An exact zero scale admits no error at all; 1e-300 keeps the ratio finite but huge.
    return float((err / (u * scale[fin]).clamp(min=1e-300)).max())


def _check_output(out: Any, like: torch.Tensor, device: str, allowed: tuple[torch.dtype, ...],
                  what: str) -> str | None:
    if not isinstance(out, torch.Tensor):
        return f"{what}: kernel returned {type(out).__name__}, expected a torch.Tensor"
    if tuple(out.shape) != tuple(like.shape):
        return f"{what}: kernel returned shape {tuple(out.shape)}, expected {tuple(like.shape)}"
    if out.device.type != torch.device(device).type:
        return f"{what}: kernel returned a tensor on {out.device}, expected {device}"
    if out.dtype not in allowed:
        return (f"{what}: kernel returned dtype {out.dtype}, expected "
                f"{' or '.join(map(str, allowed))}")
    return None


def run_case(spec: OpSpec, kern: Kernel, case: Case, device: str, *,
             save_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Run one case; returns one record for the output and one per gradient argument."""
    rec = _base_record(spec, kern, case, device)
    rec["repro"] = repro_command(spec.name, kern, case, device)
    reason = kern.skip_reason(case, device)
    if reason:
        rec["reason"] = reason
        return [rec]
    tensors, kwargs = spec.make_inputs(case)
    dev_in: dict[str, torch.Tensor] = {}
    exact: dict[str, torch.Tensor] = {}
    layout = case.param("layout", "contiguous")
    for name, (x64, dtype) in tensors.items():
        d, e = inputs.cast(x64, dtype, device)
        dev_in[name] = inputs.with_layout(d, layout) if d.dim() >= 2 else d
        exact[name] = e
    # Non-float tensors (masks, class targets) ride in kwargs unrounded: the reference gets them
    # on the CPU, kernel and baseline on the device.
    dkw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    rec["input_digest"] = input_digest(exact, kwargs)
    grads = () if kern.forward_only else tuple(
        a for a in spec.grad_args if a not in (spec.skip_grads(case) if spec.skip_grads else ()))
    allowed = spec_out_dtypes(spec, case)

    # FP64 reference on the CPU (the same on every device), with autograd for the grads.
    leaves = {n: e.clone().requires_grad_(n in grads) for n, e in exact.items()}
    try:
        ref = spec.reference(**leaves, **kwargs)
    except Exception as e:  # the op's own code failed: report it, keep the other cases
        rec.update(status="error", reason=f"reference raised {type(e).__name__}: {e}")
        return [rec]

    with numerics.pinned() as state:
        rec["numerics"] = state.describe()
        kin = {n: (t.detach().clone().requires_grad_(n in grads) if n in grads else t)
               for n, t in dev_in.items()}
        try:
            out = kern.fn(**kin, **dkw)
        except Exception as e:
            rec.update(status="error", reason=f"kernel {kern.name} raised {type(e).__name__}: "
                       f"{e}", traceback=traceback.format_exc(limit=-3))
            return [rec]
        bad = _check_output(out, ref, device, allowed, "out")
        if bad:
            rec.update(status="error", reason=bad)
            return [rec]
        bin_ = {n: (t.detach().clone().requires_grad_(True) if n in grads else t)
                for n, t in dev_in.items()}
        base = spec.baseline(**bin_, **dkw)

        # Backward: the same upstream gradient, rounded to the output dtype, for all three.
        kgrads = bgrads = rgrads = None
        if grads:
            g64 = inputs.draw("normal", tuple(ref.shape), seed=inputs.seed_for(case.id),
                              stream="grad_out")
            g_dev, g_exact = inputs.cast(g64, out.dtype, device)
            try:
                if kern.backward is not None:
                    kgrads = kern.backward(g_dev, **{n: t.detach() for n, t in kin.items()},
                                           **dkw)
                else:
                    kgrads = torch.autograd.grad(out, [kin[n] for n in grads], g_dev,
                                                 allow_unused=True)
            except Exception as e:
                rec.update(status="error", reason=f"kernel {kern.name} backward raised "
                           f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=-3))
                return [rec]
            bgrads = torch.autograd.grad(base, [bin_[n] for n in grads],
                                         g_dev.to(base.dtype), allow_unused=True)
            rgrads = torch.autograd.grad(ref, [leaves[n] for n in grads], g_exact,
                                         allow_unused=True)

    ref = ref.detach()
    out_fmt = formats.get(out.dtype).name
    records = []
    scale = spec.scale(**exact, **kwargs) if spec.scale is not None else None
    blocks = spec.blocks(case, ref.shape)
    ks = error_stats(out.detach(), ref, blocks=blocks)
    bs = error_stats(base.detach().to(out.dtype), ref, blocks=blocks)
    ratio = _bound_ratio(out, ref, scale, out_fmt)
    bratio = _bound_ratio(base.to(out.dtype), ref, scale, out_fmt)
    cond = 1.0
    if scale is not None:
        fin = torch.isfinite(ref) & torch.isfinite(scale)
        rn = float(ref[fin].norm())
        cond = float(scale[fin].norm()) / rn if rn > 0 else 1.0
    verdict = judge(spec.policy, ks, bs, what="out", compute=case.dtype, bound_ratio=ratio,
                    baseline_bound_ratio=bratio, cond=cond,
                    reduction_len=spec.reduction_len(case) if spec.reduction_len else 0)
    rec.update(_stat_columns("kernel", ks))
    rec.update(_stat_columns("baseline", bs))
    rec.update(_verdict_inputs(spec, case, out_fmt, grad=False))
    rec["bound_ratio"] = ratio if ratio is not None else math.nan
    rec["baseline_bound_ratio"] = bratio if bratio is not None else math.nan
    records.append(_finish(rec, verdict, out, ref, scale, kern, case, device))

    for i, name in enumerate(grads):
        grec = dict(_base_record(spec, kern, case, device), output=f"grad_{name}",
                    repro=rec["repro"], numerics=rec["numerics"],
                    input_digest=rec["input_digest"])
        kg, bg, rg = kgrads[i], bgrads[i], rgrads[i]
        if rg is None:
            continue
        rg = rg.detach()
        if kg is None:
            kg = torch.zeros_like(dev_in[name])
        bad = _check_output(kg, rg, device, (dev_in[name].dtype,), f"grad_{name}")
        if bad:
            grec.update(status="error", reason=bad)
            records.append(grec)
            continue
        bg = torch.zeros_like(rg, dtype=kg.dtype, device=kg.device) if bg is None else bg
        gblocks = spec.blocks(case, rg.shape)
        gks = error_stats(kg.detach(), rg, blocks=gblocks)
        gbs = error_stats(bg.detach().to(kg.dtype), rg, blocks=gblocks)
        gv = judge(spec.policy, gks, gbs, what=f"grad_{name}", compute=case.dtype, grad=True)
        grec.update(_stat_columns("kernel", gks))
        grec.update(_stat_columns("baseline", gbs))
        grec.update(_verdict_inputs(spec, case, gks.fmt, grad=True))
        grec["bound_ratio"] = grec["baseline_bound_ratio"] = math.nan
        records.append(_finish(grec, gv, kg, rg, None, kern, case, device))

    if save_dir is not None and any(r["status"] != "passed" for r in records):
        _save_inputs(Path(save_dir), spec, kern, case, exact, kwargs, records)
    return records


def _verdict_inputs(spec: OpSpec, case: Case, out_fmt: str, grad: bool) -> dict[str, Any]:
    """What the golden regression needs from the verdict: its unit roundoff (the coarser of
    the output's and the compute format's, as ``judge``) and which per-op rules bind."""
    u = max(formats.get(out_fmt).unit_roundoff, formats.get(case.dtype).unit_roundoff)
    return {"u": u, "gate_ulp": spec.policy.max_ulp is not None and not grad,
            "gate_bias": spec.policy.truncation_ulp is not None and not grad}


def spec_out_dtypes(spec: OpSpec, case: Case) -> tuple[torch.dtype, ...]:
    return tuple(spec.out_dtypes(case)) if spec.out_dtypes else (_torch_dtype(case.dtype),)


def _finish(rec: dict, verdict: Verdict, out: torch.Tensor, ref: torch.Tensor,
            scale: torch.Tensor | None, kern: Kernel, case: Case, device: str) -> dict:
    rec["status"] = "passed" if verdict.passed else "failed"
    rec["reason"] = " | ".join(verdict.failures)
    if not verdict.passed:
        rec["worst_elements"] = _worst_elements(out, ref, scale)
        known = kern.known_failure(case, device, rec["output"]) if kern.known_failure else None
        if known:
            rec["status"] = "known"
            rec["reason"] = f"known weakness ({known}): {rec['reason']}"
    return rec


def _save_inputs(root: Path, spec, kern, case, exact, kwargs, records) -> None:
    """Failing inputs for offline debugging: exact float64 values, kwargs, case and records."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{spec.name}-{kern.name}-{case.id}.pt"
    torch.save({"case": dataclasses.asdict(case), "inputs": exact, "kwargs": kwargs,
                "records": records}, path)
    for r in records:
        r["saved_inputs"] = str(path)


def verify(op: str, fn, *, kernel_name: str | None = None, cases: str = "quick",
           device: str | None = None, golden_dir=None, refresh: bool = False,
           case_ids: list[str] | None = None, save_failures: str | Path | None = None,
           adhoc: list[Case] | None = None, suite: str = "verify") -> Verification:
    """Run op's ``cases`` set ("quick" | "full") against ``fn`` and judge every case.

    fn: a callable with the op's signature (or a registered Kernel). device: default CUDA when
    present. case_ids: only these cases of the set; adhoc: exactly these cases instead (a
    repro line's --adhoc). save_failures: a folder for failing cases' inputs.
    golden_dir: compare every case with the goldens there (``<golden_dir>/<device_class>/
    <suite>.parquet``): a regression fails the case; refresh=True rewrites the rows of the
    cases that ran instead (atomically, only when they changed).
    """
    if refresh and golden_dir is None:
        raise UsageError("verify(refresh=True) needs golden_dir=: the folder to write to")
    spec = get_op(op)
    kern = as_kernel(op, fn, kernel_name)
    device = device or default_device()
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device={device!r}: no CUDA device here; use device='cpu'")
    grid = list(adhoc) if adhoc else spec.grid(cases)
    if case_ids:
        wanted = set(case_ids)
        grid = [c for c in grid if c.id in wanted]
        unknown = wanted - {c.id for c in grid}
        if unknown:
            raise UsageError(f"unknown case id(s) for {op} in {cases!r}: {sorted(unknown)}")
    records: list[dict] = []
    for case in grid:
        records.extend(run_case(spec, kern, case, device, save_dir=save_failures))
    if golden_dir is not None:
        from .session import GoldenSession
        for r in records:
            r["suite"] = suite
        gs = GoldenSession(golden_dir, "refresh" if refresh else "check", case_set=cases)
        gs.judge(records)
        if refresh:  # what ran is the golden now: its old verdicts no longer fail the run
            gs.finish(records, environment.provenance(device))
            for r in records:
                if r.get("golden") in ("regressed", "missing", "new", "inputs_changed"):
                    r["golden"] = "refreshed"
    return Verification(op, kern.name, device, cases, records)
