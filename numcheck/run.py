"""The run stage: one case through kernel, FP64 reference and baseline, into judged records.

    case -> inputs (float64 on CPU from the seed, rounded by numcheck, moved) -> kernel on the
    device under the pinned numerics state; FP64 reference on the CPU; baseline on the device
    -> ErrorStats of kernel and baseline vs FP64 -> verdict -> one record per output

One pass: each record is judged once; the condition-aware bound (numcheck.verdicts.
conditioning) is measured only if the rules ask for it (a record that fails without it).
A kernel that raises, or returns the wrong shape, dtype or device, fails the case by name.
``run_case(..., memo=CaseMemo())`` lets the kernels that run one case in a row (the built-in
suites) share its kernel-independent work: inputs, reference, baseline and the baseline's stats.
``nc.verify`` (numcheck.verification) runs an op's case set through ``run_case``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from numcheck import formats
from numcheck.verdicts import conditioning
from numcheck.measure import environment
from numcheck.cases import inputs
from numcheck.measure import numerics
from numcheck.verdicts import policy
from numcheck.verdicts import judge as verdict
from numcheck.cases.grid import Case
from numcheck.catalog import kernels
from numcheck.errors import UsageError
from numcheck.kernels import triton_interp
from numcheck.verdicts.findings import cite
from numcheck.records import Record, Status
from numcheck.registry import Kernel, OpSpec
from numcheck.measure.stats import error_stats

N_WORST = 5  # worst elements listed in a failing record


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_dtype(name: str) -> torch.dtype:
    dt = formats.get(name).torch
    if dt is None:
        raise UsageError(f"format {name!r} has no torch dtype to run a kernel in")
    return dt


def _kernel_ref(kern: Kernel) -> str:
    """What ``--kernel`` takes: a built-in kernel's name (numcheck's own, in the catalog), else
    module:qualname (a fresh process imports the module, which registers what it registers)."""
    fn = kern.fn
    mod = getattr(fn, "__module__", "") or ""
    if mod.startswith("numcheck.") and kernels(kern.op).get(kern.name) is kern:
        return kern.name
    return f"{mod}:{getattr(fn, '__qualname__', kern.name)}"


def repro_command(op: str, kern: Kernel, case: Case, device: str) -> str:
    """One shell line that runs exactly this case again (grid or hypothesis-found), with the
    environment it ran in: ``TRITON_INTERPRET=1`` where Triton kernels ran interpreted (without
    it a Triton kernel on the CPU fails with "0 active drivers")."""
    env = "TRITON_INTERPRET=1 " if triton_interp.interpreting() else ""
    return (f"{env}numcheck verify --op {op} --kernel {_kernel_ref(kern)} --device {device} "
            f"--adhoc '{case_to_json(case)}'")


def case_to_json(case: Case) -> str:
    return json.dumps({"dtype": case.dtype, "shape": list(case.shape), "dist": case.dist,
                       "seed": case.seed, "params": dict(case.params)}, separators=(",", ":"))


def _base_record(spec: OpSpec, kern: Kernel, case: Case, device: str) -> Record:
    return Record(
        family="ops", op=spec.name, kernel=kern.name,
        case_id=case.id, dtype=case.dtype, shape="x".join(map(str, case.shape)), dist=case.dist,
        seed=case.seed, params=",".join(f"{k}={v}" for k, v in case.params), device=device,
        device_class=environment.device_class(device),
        repro=repro_command(spec.name, kern, case, device))


def _out_dtypes(spec: OpSpec, case: Case) -> tuple[torch.dtype, ...]:
    """Output dtypes a kernel may return for the case (default: its compute dtype)."""
    return tuple(spec.out_dtypes(case)) if spec.out_dtypes else (_torch_dtype(case.dtype),)


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


def ulp_histogram(out: torch.Tensor, ref: torch.Tensor, fmt: str) -> list[int]:
    """Elements per |error| in ULPs of fmt (Record.ulp_hist): bucket 0 exact, bucket k
    [2^(k-1), 2^k), over the elements where out and the rounded reference are both finite (the
    ones ErrorStats compares)."""
    o = out.detach().to("cpu", torch.float64)
    r = formats.round_to(ref.detach().to("cpu", torch.float64), fmt, saturate=False)
    both = torch.isfinite(o) & torch.isfinite(r)
    ulps = formats.ulp_distance(o[both], r[both], fmt)
    edges = torch.tensor([1 << k for k in range(63)])  # integer edges: exact at any distance
    return torch.bincount(torch.bucketize(ulps, edges, right=True), minlength=1).tolist()


def _bound_ratio(out: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor, fmt: str) -> float:
    """max |out - ref| / (u * scale) over the elements where both are finite (NaN: none)."""
    u = formats.get(fmt).unit_roundoff
    o = out.detach().to("cpu", torch.float64)
    fin = torch.isfinite(o) & torch.isfinite(ref)
    if not bool(fin.any()):
        return math.nan
    # An exact zero scale admits no error at all; 1e-300 keeps the ratio finite but huge.
    ratio = (o - ref).abs() / (u * scale).clamp(min=1e-300)
    # the ratios are >= 0 (or NaN): 0 where either is not finite leaves the maximum as it is,
    # and costs half of selecting the finite elements first
    return float(torch.where(fin, ratio, 0.0).max())


def _check_output(out: Any, like: torch.Tensor, device: str, allowed: tuple[torch.dtype, ...],
                  what: str) -> None:
    """A kernel's result must be a tensor of the reference's shape, on the device, in an
    allowed dtype; anything else fails the case by name (_KernelFailed)."""
    if not isinstance(out, torch.Tensor):
        bad = f"kernel returned {type(out).__name__}, expected a torch.Tensor"
    elif tuple(out.shape) != tuple(like.shape):
        bad = f"kernel returned shape {tuple(out.shape)}, expected {tuple(like.shape)}"
    elif out.device.type != torch.device(device).type:
        bad = f"kernel returned a tensor on {out.device}, expected {device}"
    elif out.dtype not in allowed:
        bad = f"kernel returned dtype {out.dtype}, expected {' or '.join(map(str, allowed))}"
    else:
        return
    raise _KernelFailed(f"{what}: {bad}")


@dataclass
class _Prepared:
    """A case's inputs: on the device (kernel, baseline), exact float64 (reference), kwargs."""

    dev_in: dict[str, torch.Tensor]
    exact: dict[str, torch.Tensor]
    kwargs: dict[str, Any]  # as the reference gets them (CPU)
    dkw: dict[str, Any]  # as the baseline gets them (on the device)
    kernel_kw: dict[str, Any]  # the part of dkw the kernel takes (its signature)
    backward_kw: dict[str, Any]  # the part of dkw a separate backward takes
    grads: tuple[str, ...]  # tensor args whose gradients are judged
    skip: str | None = None  # why the kernel cannot run this case (a parameter it lacks)
    # The op's conventions as the kernel follows them ((name, choice), ...): keywords of the
    # reference and the baseline, never of the kernel (OpSpec.conventions).
    conv: tuple[tuple[str, str], ...] = ()
    ref: torch.Tensor | None = None  # FP64 on the CPU, the same on every device
    g_exact: torch.Tensor | None = None  # the upstream gradient, float64 (backward cases)
    memo: dict = dataclasses.field(default_factory=dict)  # the case's shared work (CaseMemo)
    _spread: dict[str, torch.Tensor] | None = None

    @property
    def variant(self) -> tuple:
        """What the reference and the baseline depend on beyond the case: the judged
        gradients and the conventions (the key of their values in the case's memo)."""
        return self.grads, self.conv

    def spread(self, spec: OpSpec, case: Case) -> dict[str, torch.Tensor]:
        """The condition-aware bound's D per output (numcheck.verdicts.conditioning), computed once,
        when a verdict first needs it."""
        if self._spread is None:
            def evaluate(x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
                x = dict(x)
                g = x.pop(_GRAD_OUT, None)
                leaves = _leaves(x, self.grads)
                with torch.enable_grad():
                    ref = spec.reference(**leaves, **self.kwargs, **dict(self.conv))
                    outs = {"out": ref.detach()}
                    if g is not None:
                        gs = torch.autograd.grad(ref, [leaves[n] for n in self.grads], g,
                                                 allow_unused=True)
                        outs.update({f"grad_{n}": t.detach() for n, t in zip(self.grads, gs)
                                     if t is not None})
                return outs
            exact = dict(self.exact)
            if self.g_exact is not None:
                exact[_GRAD_OUT] = self.g_exact
            self._spread = conditioning.spread(evaluate, exact,
                                               conditioning.compute_unit(case.dtype),
                                               seed=inputs.seed_for(case.id))
        return self._spread


_GRAD_OUT = "\0grad_out"  # the upstream gradient among the perturbed inputs


@dataclass
class _Output:
    """One judged output (the result or a gradient): kernel, baseline and FP64 reference."""

    name: str  # "out" or "grad_<arg>"
    kernel: torch.Tensor
    baseline: torch.Tensor
    ref: torch.Tensor
    allowed: tuple[torch.dtype, ...]
    scale: torch.Tensor | None = None  # componentwise magnitude (rule 5), forward only
    key: tuple = ()  # the baseline's key in the case's memo (judged grads, output dtype)


class _KernelFailed(Exception):
    """The kernel raised or returned a wrong tensor: the case's record is an error."""

    def __init__(self, reason: str, tb: str = ""):
        super().__init__(reason)
        self.reason, self.tb = reason, tb


class CaseMemo:
    """A case's kernel-independent work, done once and shared by the kernels that run the case
    one after another (the built-in suites order their items case by case: numcheck.frontends.context).

    Held for one (op, case, device) at a time; another case empties it. What it holds is a
    function of the case and of the key it is stored under, never of the kernel: the rounded
    inputs and their digest, the FP64 reference and its gradients, the upstream gradient, the
    baseline and its statistics, keyed further by the gradients judged and the dtype of the
    kernel's output where those matter. Kernels and the baseline get fresh copies of the inputs
    (a kernel that writes into its inputs cannot change what the next one sees). A run without
    a memo (``verify``, the search) computes the same values through the same code.
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._values: dict = {}

    def of(self, spec: OpSpec, case: Case, device: str) -> dict:
        k = self._key
        if k is None or k[0] is not spec or k[1] != case or k[2] != device:
            self._key, self._values = (spec, case, device), {}
        return self._values

    def clear(self) -> None:
        self._key, self._values = None, {}


def _memo(memo: dict, key: tuple, make):
    if key not in memo:
        memo[key] = make()
    return memo[key]


def _case_inputs(spec: OpSpec, case: Case, device: str):
    """The case's inputs: {name: (on the device, exact float64)}, kwargs (CPU), kwargs on the
    device, and the input digest."""
    tensors, kwargs = spec.make_inputs(case)
    cast = {name: inputs.cast(x64, dtype, device) for name, (x64, dtype) in tensors.items()}
    # Non-float tensors (masks, class targets) ride in kwargs unrounded: the reference gets them
    # on the CPU, kernel and baseline on the device.
    dkw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    digest = inputs.input_digest({n: e for n, (_, e) in cast.items()}, kwargs)
    return cast, kwargs, dkw, digest


def _fresh(cast: dict, layout: str) -> dict[str, torch.Tensor]:
    """Copies of the device inputs in the case's memory layout."""
    return {n: inputs.with_layout(d.clone(), layout) if d.dim() >= 2 else d.clone()
            for n, (d, _) in cast.items()}


def _fresh_kw(dkw: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in dkw.items()}


def _prepare(spec: OpSpec, kern: Kernel, case: Case, device: str,
             memo: dict | None = None) -> _Prepared:
    memo = {} if memo is None else memo
    cast, kwargs, dkw, _ = _memo(memo, ("inputs",), lambda: _case_inputs(spec, case, device))
    dev_in = _fresh(cast, case.param("layout", "contiguous"))
    exact = {name: e for name, (_, e) in cast.items()}
    dkw = _fresh_kw(dkw)
    grads = () if kern.forward_only else spec.judged_grads(case)
    kernel_kw, skip = _taken(kern.fn, spec, dkw)
    backward_kw = _taken(kern.backward, spec, dkw)[0] if kern.backward is not None else {}
    return _Prepared(dev_in, exact, kwargs, dkw, kernel_kw, backward_kw, grads,
                     skip=f"kernel {skip}" if skip else None, conv=spec.conventions_of(kern),
                     memo=memo)


def _op_defaults(spec: OpSpec) -> dict[str, Any]:
    """The op's parameter defaults, from its reference's signature (the op's signature)."""
    try:
        params = inspect.signature(spec.reference).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not p.empty}


def _taken(fn, spec: OpSpec, kw: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The keyword arguments ``fn`` accepts (DESIGN, "Public contract"): a parameter it does
    not take is left out when the case gives it the op's default, and makes the case skip
    (the reason, second) when the case needs another value. Callables without a readable
    signature, or with ``**kwargs``, get everything."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return dict(kw), None
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return dict(kw), None
    defaults = _op_defaults(spec)
    out, missing = {}, []
    for k, v in kw.items():
        if k in params:
            out[k] = v
        elif not (k in defaults and not isinstance(v, torch.Tensor) and v == defaults[k]):
            missing.append(f"{k}={v!r}" if not isinstance(v, torch.Tensor) else k)
    name = getattr(fn, "__name__", "kernel")
    return out, (f"{name} does not take {', '.join(missing)} (not the op's default)"
                 if missing else None)


def _leaves(tensors: dict[str, torch.Tensor], grads: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {n: (t.detach().clone().requires_grad_(True) if n in grads else t)
            for n, t in tensors.items()}


def _reference(spec: OpSpec, p: _Prepared) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The FP64 reference, with leaves for the judged gradients (its graph)."""
    ref_in = _leaves(p.exact, p.grads)
    return ref_in, spec.reference(**ref_in, **p.kwargs, **dict(p.conv))


def _reference_grads(spec: OpSpec, p: _Prepared, g_exact: torch.Tensor) -> tuple:
    """The reference's gradients for the upstream gradient ``g_exact``. The first call uses the
    graph of ``p.ref``; a later one (another output dtype, so another upstream gradient)
    rebuilds it: the values are the same."""
    key = ("ref_graph", p.variant)
    if p.memo.get(key) is None:  # the graph was used up by an earlier backward
        p.memo[key] = _reference(spec, p)
    ref_in, ref = p.memo[key]
    p.memo[key] = None
    return torch.autograd.grad(ref, [ref_in[n] for n in p.grads], g_exact, allow_unused=True)


def _baseline(spec: OpSpec, p: _Prepared, case: Case, g_dev: torch.Tensor | None):
    """The baseline's output and its gradients for the upstream gradient g_dev (none when no
    gradient is judged), from fresh copies of the inputs."""
    bin_ = _leaves(_fresh(p.memo[("inputs",)][0], case.param("layout", "contiguous")), p.grads)
    base = spec.baseline(**bin_, **_fresh_kw(p.dkw), **dict(p.conv))
    if not p.grads:
        return base, ()
    bg = torch.autograd.grad(base, [bin_[n] for n in p.grads], g_dev.to(base.dtype),
                             allow_unused=True)
    return base, bg


def _upstream(case: Case, shape: tuple[int, ...], dtype: torch.dtype, device: str):
    """The upstream gradient (device tensor in the output's dtype, exact float64 copy)."""
    g64 = inputs.draw("normal", shape, seed=inputs.seed_for(case.id), stream="grad_out")
    return inputs.cast(g64, dtype, device)


@contextlib.contextmanager
def _interpreter_quiet():
    """Triton's CPU interpreter computes with numpy, which warns on every overflow and NaN a
    kernel makes on purpose (masked lanes, -inf logits): RuntimeWarnings raised from triton's
    own modules are dropped while a kernel runs (numcheck measures what the kernel returned);
    a kernel's own warnings pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.")
        yield


def _execute(spec: OpSpec, kern: Kernel, case: Case, device: str,
             p: _Prepared) -> tuple[torch.Tensor, tuple]:
    """The kernel, forward and backward (the upstream gradient rounded to the output dtype, as
    the baseline and the reference get it): its output and gradients. Raises _KernelFailed."""
    ref = p.ref
    kin = _leaves(p.dev_in, p.grads)
    try:
        with _interpreter_quiet():
            out = kern.fn(**kin, **p.kernel_kw)
    except Exception as e:
        raise _KernelFailed(f"kernel {kern.name} raised {type(e).__name__}: {e}",
                            traceback.format_exc(limit=-3)) from e
    _check_output(out, ref, device, _out_dtypes(spec, case), "out")
    if not p.grads:
        return out, ()
    g_dev, _ = _memo(p.memo, ("grad_out", out.dtype),
                     lambda: _upstream(case, tuple(ref.shape), out.dtype, device))
    g_dev = g_dev.clone()  # the kernel's copy
    try:
        with _interpreter_quiet():
            if kern.backward is not None:
                kg = kern.backward(g_dev, **{n: t.detach() for n, t in kin.items()},
                                   **p.backward_kw)
            else:
                kg = torch.autograd.grad(out, [kin[n] for n in p.grads], g_dev,
                                         allow_unused=True)
    except Exception as e:
        raise _KernelFailed(f"kernel {kern.name} backward raised {type(e).__name__}: {e}",
                            traceback.format_exc(limit=-3)) from e
    if not isinstance(kg, (tuple, list)) or len(kg) != len(p.grads):
        n = len(kg) if isinstance(kg, (tuple, list)) else type(kg).__name__
        raise _KernelFailed(f"kernel {kern.name} backward returned {n} gradient(s), expected "
                            f"{len(p.grads)} ({', '.join(p.grads)})")
    return out, tuple(kg)


def _yardsticks(spec: OpSpec, case: Case, p: _Prepared, out: torch.Tensor,
                kg: tuple) -> list[_Output]:
    """The kernel's output and gradients beside the baseline's and the FP64 reference's (for
    p's judged gradients and conventions: another convention is another call). The baseline,
    the reference's gradients and the upstream gradient come from the case's memo when an
    earlier kernel with the same judged gradients and output dtype computed them."""
    ref, allowed = p.ref, _out_dtypes(spec, case)
    scale = _memo(p.memo, ("scale",),
                  lambda: spec.scale(**p.exact, **p.kwargs) if spec.scale is not None else None)
    if not p.grads:
        key = ("baseline", p.variant, None)
        base, _ = _memo(p.memo, key, lambda: _baseline(spec, p, case, None))
        return [_Output("out", out, base, ref, allowed, scale, key)]
    g_exact = p.g_exact = p.memo[("grad_out", out.dtype)][1]
    key = ("baseline", p.variant, out.dtype)
    base, bg = _memo(p.memo, key,
                     lambda: _baseline(spec, p, case, p.memo[("grad_out", out.dtype)][0]))
    rg = _memo(p.memo, ("ref_grads", p.variant, out.dtype),
               lambda: _reference_grads(spec, p, g_exact))
    outs = [_Output("out", out, base, ref, allowed, scale, key)]
    for name, k, b, r in zip(p.grads, kg, bg, rg):
        if r is None:  # the reference does not depend on it: nothing to judge
            continue
        k = torch.zeros_like(p.dev_in[name]) if k is None else k
        b = torch.zeros_like(r, dtype=k.dtype, device=k.device) if b is None else b
        outs.append(_Output(f"grad_{name}", k, b, r, (p.dev_in[name].dtype,), key=key))
    return outs


def _cond_ratio(spec: OpSpec, case: Case, o: _Output, p: _Prepared, fmt: str,
                blocks) -> float | None:
    """The output's error over its condition-aware bound (numcheck.verdicts.conditioning); None when
    the reference gives no such output (an unused gradient)."""
    d = p.spread(spec, case).get(o.name)
    if d is None:
        return None
    u_c = conditioning.compute_unit(case.dtype)
    if o.name == "out" and spec.cond_scale is not None:
        d = d + u_c * spec.cond_scale(**p.exact, **p.kwargs)
    c = spec.policy.cond_c + (float(spec.sum_len(case)) if spec.sum_len else 0.0)
    worst = conditioning.ratio(o.kernel, o.ref, d, fmt, c, blocks, u_c)
    if o.scale is not None and spec.policy.bound_c is not None:
        # the componentwise rule judges elements: it is excused element by element
        worst = max(worst, conditioning.ratio(o.kernel, o.ref, d, fmt, c, blocks, u_c,
                                              elementwise=True))
    return worst


def _measure(spec: OpSpec, kern: Kernel, case: Case, device: str, o: _Output,
             base: Record, p: _Prepared) -> Record:
    """ErrorStats of kernel and baseline against the reference, and the verdict's inputs."""
    if o.name != "out":  # the output was checked where it was produced
        _check_output(o.kernel, o.ref, device, o.allowed, o.name)
    ref = o.ref.detach()
    out = o.kernel.detach()
    blocks = spec.blocks_for(case, ref.shape)
    ks = error_stats(out, ref, blocks=blocks)
    # the baseline's side: the same for every kernel whose output has this dtype
    bout, bs, bbound = _memo(p.memo, (o.key, o.name, out.dtype),
                             lambda: _baseline_measure(o, ref, out.dtype, blocks))
    grad = o.name != "out"
    rec = base.replace(output=o.name, kernel_stats=ks, baseline_stats=bs,
                       bound_ratio=math.nan, baseline_bound_ratio=math.nan,
                       known=kern.known(case, device, o.name) or "")
    # the unit roundoff of the verdict: the coarser of the output's and the compute format's
    rec.u = max(formats.get(ks.fmt).unit_roundoff, formats.get(case.dtype).unit_roundoff)
    rec.gate_ulp = spec.policy.max_ulp is not None and not grad
    rec.gate_bias = policy.rounded_once(spec.policy, ks, conditioning.compute_unit(case.dtype),
                                        grad)
    if o.scale is not None:
        rec.bound_ratio = _bound_ratio(out, ref, o.scale, ks.fmt)
        rec.baseline_bound_ratio = bbound
        rec.cond = _memo(p.memo, ("cond", p.conv, o.name), lambda: _cond(ref, o.scale))
        rec.reduction_len = float(spec.reduction_len(case)) if spec.reduction_len else 0.0
    # Judged once. Is a failure a stable formulation the baseline or componentwise rule cannot
    # tell? The rules ask for the condition-aware bound where the record fails without it: the
    # FP64 reference on perturbed inputs costs DRAWS more references (policy.judge).
    verdict.judge(rec, policy.RecordPolicy.of(
        spec.policy, lambda: _cond_ratio(spec, case, o, p, ks.fmt, blocks)))
    if rec.status == Status.FAILED and not rec.known:
        _borrow_backend_finding(rec, spec, kern, case, device, p)
    if rec.status != Status.PASSED:
        rec.worst_elements = _worst_elements(out, ref, o.scale)
        rec.ulp_hist = ulp_histogram(out, ref, ks.fmt)
    return rec


def _borrow_backend_finding(rec: Record, spec: OpSpec, kern: Kernel, case: Case, device: str,
                            p: _Prepared) -> None:
    """DESIGN rule 15: a failure where a torch backend the kernel's call reached has a
    documented weakness on this case (a built-in kernel of the op that ``reaches`` that ATen op
    declares it) is that weakness, known, whoever wrapped the call. The ATen ops are recorded by
    running the kernel once more (only for such failures) under a dispatch mode."""
    owners = [k for k in kernels(spec.name).values()
              if k.reaches and k.name != kern.name and k.known_failure is not None]
    if not owners:
        return
    reached = _memo(p.memo, ("reached", kern.name), lambda: _reached_ops(kern, p))
    for owner in owners:
        hit = sorted(set(owner.reaches) & reached)
        found = owner.known(case, device, rec.output) if hit else None
        if not found:
            continue
        # the weakness, not a fault of the wrapper's own: no worse than the owner's error there
        theirs = _memo(p.memo, ("owner", owner.name), lambda: _owner_records(spec, owner, case,
                                                                            device, p))
        o = theirs.get(rec.output)
        if o is None or o.known != found or not _no_worse(rec.kernel_stats, o.kernel_stats):
            continue
        rec.known, rec.status = found, Status.KNOWN
        rec.reason = (f"known weakness {cite(found)} of {hit[0]}, which the kernel's call "
                      f"reached (declared on the {owner.name} kernel, whose error here is "
                      f"{o.kernel_stats.rel_l2:.3e}): {rec.reason}")
        return


# A wrapper's failure is the backend's documented weakness when its error is within the
# baseline rule's factor (DESIGN rule 4: k = 2) of the backend kernel's own on the case.
_BORROW_K = 2.0


def _no_worse(mine, theirs) -> bool:
    return (mine.rel_l2 <= _BORROW_K * theirs.rel_l2
            and mine.min_block_sqnr_db >= theirs.min_block_sqnr_db - 20 * math.log10(_BORROW_K))


def _owner_records(spec: OpSpec, owner: Kernel, case: Case, device: str,
                   p: _Prepared) -> dict[str, Record]:
    """The owner kernel's judged records on the case ({} where it cannot run it)."""
    try:
        q = _prepare(spec, owner, case, device, p.memo)
        if q.skip or owner.skip_reason(case, device):
            return {}
        q.ref = p.ref
        base = _base_record(spec, owner, case, device)
        with numerics.pinned():
            outs = _yardsticks(spec, case, q, *_execute(spec, owner, case, device, q))
        return {r.output: r for r in _judged(spec, owner, case, device, q, outs, base)}
    except Exception:  # noqa: BLE001 - no yardstick: nothing is borrowed
        return {}


def _reached_ops(kern: Kernel, p: _Prepared) -> frozenset[str]:
    """The ATen ops a call of the kernel, forward and backward, dispatches: each schema name,
    alone and with the format of its first tensor argument ("aten::_log_softmax:bf16"); what
    was seen until an error, if the kernel cannot run under a dispatch mode (compiled code)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class _Reached(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func._schema.name)
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None and first.is_floating_point():  # "aten::gelu:bf16" too
                with contextlib.suppress(UsageError):  # a dtype numcheck has no format for
                    seen.add(f"{func._schema.name}:{formats.get(first.dtype).name}")
            return func(*args, **(kwargs or {}))

    kin = _leaves(p.dev_in, p.grads)
    try:
        with _Reached(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the kernel's warnings were seen in its real run
            out = kern.fn(**kin, **p.kernel_kw)
            g = torch.ones_like(out)  # any upstream gradient reaches the same ops
            if p.grads and kern.backward is not None:
                kern.backward(g, **{n: t.detach() for n, t in kin.items()}, **p.backward_kw)
            elif p.grads and out.requires_grad:
                torch.autograd.grad(out, [kin[n] for n in p.grads], g, allow_unused=True)
    except Exception:  # noqa: BLE001 - what ran until then is what it reached
        pass
    return frozenset(seen)


def _cond(ref: torch.Tensor, scale: torch.Tensor) -> float:
    """||scale|| / ||ref|| over the elements where both are finite (Record.cond): the same for
    every kernel of the case."""
    fin = torch.isfinite(ref) & torch.isfinite(scale)
    rn = float(ref[fin].norm())
    return float(scale[fin].norm()) / rn if rn > 0 else 1.0


def _baseline_measure(o: _Output, ref: torch.Tensor, dtype: torch.dtype, blocks):
    """The baseline in the kernel output's dtype, its ErrorStats and componentwise bound ratio."""
    bout = o.baseline.detach().to(dtype)
    bs = error_stats(bout, ref, blocks=blocks)
    bbound = _bound_ratio(bout, ref, o.scale, bs.fmt) if o.scale is not None else math.nan
    return bout, bs, bbound


def _reference_forward(spec: OpSpec, p: _Prepared) -> torch.Tensor:
    p.memo[("ref_graph", p.variant)] = _reference(spec, p)
    return p.memo[("ref_graph", p.variant)][1]


def run_case(spec: OpSpec, kern: Kernel, case: Case, device: str, *,
             save_dir: str | Path | None = None, memo: CaseMemo | None = None) -> list[Record]:
    """Run one case; returns one judged record for the output and one per gradient.

    memo: a CaseMemo to share the case's kernel-independent work (inputs, reference, baseline
    and its statistics) with the next kernels that run the same case (numcheck.frontends.context)."""
    base = _base_record(spec, kern, case, device)
    reason = kern.skip_reason(case, device)
    if reason:
        return [base.replace(status=Status.SKIPPED, reason=reason)]
    p = _prepare(spec, kern, case, device, memo.of(spec, case, device) if memo else None)
    if p.skip:  # a parameter the case needs and the kernel does not take
        return [base.replace(status=Status.SKIPPED, reason=p.skip)]
    base.input_digest = p.memo[("inputs",)][3]
    try:
        p.ref = _memo(p.memo, ("ref", p.variant), lambda: _reference_forward(spec, p))
    except Exception as e:  # the op's own code failed: report it, keep the other cases
        return [base.replace(status=Status.ERROR,
                             reason=f"reference raised {type(e).__name__}: {e}")]
    with numerics.pinned() as state:
        base.numerics = state.describe()
        try:
            result = _execute(spec, kern, case, device, p)
        except _KernelFailed as e:
            known = environment.known_failure(e.reason)
            if known:  # the torch build or the machine, not the kernel: docs/findings.md
                return [base.replace(status=Status.KNOWN, known=known, traceback=e.tb,
                                     reason=f"known environment failure {cite(known)}: {e.reason}")]
            return [base.replace(status=Status.ERROR, reason=e.reason, traceback=e.tb)]
        outputs = _yardsticks(spec, case, p, *result)
    records = _judged(spec, kern, case, device, p, outputs, base)
    if spec.conventions and any(r.status == Status.FAILED for r in records):
        records = _convention_followed(spec, kern, case, device, p, result, base, records)
    if save_dir is not None and any(r.status != Status.PASSED for r in records):
        _save_inputs(Path(save_dir), spec, kern, case, p.exact, p.kwargs, records)
    return records


def _judged(spec: OpSpec, kern: Kernel, case: Case, device: str, p: _Prepared,
            outputs: list[_Output], base: Record) -> list[Record]:
    records = []
    for o in outputs:
        try:
            records.append(_measure(spec, kern, case, device, o, base, p))
        except _KernelFailed as e:  # a gradient of the wrong shape, dtype or device
            records.append(base.replace(output=o.name, status=Status.ERROR, reason=e.reason))
    return records


def _convention_followed(spec: OpSpec, kern: Kernel, case: Case, device: str, p: _Prepared,
                         result: tuple[torch.Tensor, tuple], base: Record,
                         records: list[Record]) -> list[Record]:
    """DESIGN rule 3: where the case reaches a convention (a fully masked row), a failing
    kernel may follow another choice of it than the one it is held to. The same results are
    judged under each other choice; the one under which fewest records fail (fewer than now)
    and no output errs more is the one the kernel follows: its records are reported, failing,
    with the convention's name and the remedy, not as an error statistic."""
    mine = dict(p.conv)
    fits = []  # (records failing, choice, what it means, the records under it)
    for conv in (c for c in spec.conventions if c.applies(case)):
        for choice, meaning in conv.choices:
            if choice == mine[conv.name]:
                continue
            alt = dataclasses.replace(p, conv=tuple(sorted({**mine, conv.name: choice}.items())),
                                      ref=None, g_exact=None, _spread=None)
            alt.ref = _memo(p.memo, ("ref", alt.variant), lambda: _reference_forward(spec, alt))
            with numerics.pinned():  # the baseline under the state the first one ran in
                outputs = _yardsticks(spec, case, alt, *result)
            theirs = _judged(spec, kern, case, device, alt, outputs, base)
            if all(_no_larger(a, b) for a, b in zip(theirs, records)):
                fits.append((_failing(theirs), conv, choice, meaning, theirs))
    fits = [f for f in fits if f[0] < _failing(records)]
    if not fits:
        return records
    least = min(f[0] for f in fits)
    (_, conv, choice, meaning, theirs), *same = [f for f in fits if f[0] == least]
    held = "it declares" if conv.name in dict(kern.conventions) else "the op's default"
    also = "".join(f" (or {f[2]!r}: the same on what this case judges)" for f in same)
    told = (f"convention {conv.name}: the kernel follows {choice!r} ({meaning}){also}, not "
            f"{mine[conv.name]!r} ({held}); if that is meant, declare it: "
            f"nc.kernel({spec.name!r}, conventions={{{conv.name!r}: {choice!r}}})")
    for r in theirs:
        if r.status in (Status.PASSED, Status.FAILED, Status.KNOWN):
            under = (f"under {choice!r} every rule passes" if r.status == Status.PASSED
                     else f"under {choice!r}: {r.reason}")
            r.status, r.known, r.reason = Status.FAILED, "", f"{told}; {under}"
    return theirs


def _failing(records: list[Record]) -> int:
    return sum(r.status == Status.FAILED for r in records)


def _no_larger(a: Record, b: Record) -> bool:
    """a (under another convention) passes, or errs no more than b."""
    if a.status == Status.PASSED:
        return True
    if a.kernel_stats is None or b.kernel_stats is None:
        return False
    mine, theirs = a.kernel_stats.rel_l2, b.kernel_stats.rel_l2
    return a.output == b.output and (math.isnan(theirs) or mine <= theirs)


def _save_inputs(root: Path, spec, kern, case, exact, kwargs, records) -> None:
    """Failing inputs for offline debugging: exact float64 values, kwargs, case and records."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{spec.name}-{kern.name}-{case.id}.pt"
    for r in records:
        r.saved_inputs = str(path)
    torch.save({"case": dataclasses.asdict(case), "inputs": exact, "kwargs": kwargs,
                "records": [r.as_row() for r in records]}, path)
