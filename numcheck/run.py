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
import json
import math
import os
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from numcheck import formats
from numcheck.verdicts import conditioning, conventions
from numcheck.measure import environment
from numcheck.cases import inputs
from numcheck.measure import elements, numerics, paired
from numcheck.verdicts import policy
from numcheck.verdicts import judge as verdict
from numcheck.cases.grid import Case
from numcheck.catalog import kernels
from numcheck.errors import UsageError
from numcheck.kernels import calls, triton_interp
from numcheck.verdicts.findings import cite
from numcheck.records import Record, Status
from numcheck.registry import Kernel, OpSpec
from numcheck.measure.stats import error_stats

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

    def bound_spread(self, spec: OpSpec, case: Case, name: str) -> torch.Tensor | None:
        """D of the output ``name`` with what the op's intermediate roundings add (cond_scale,
        the result only); None where the reference gives no such output."""
        d = self.spread(spec, case).get(name)
        if d is not None and name == "out" and spec.cond_scale is not None:
            d = d + conditioning.compute_unit(case.dtype) * spec.cond_scale(**self.exact,
                                                                            **self.kwargs)
        return d


@dataclass
class _Pooled:
    """Several draws of a case judged as one (DESIGN rule 13): their outputs stacked along a
    new first dim, so that each statistic is over all their elements."""

    draws: list[_Prepared]
    memo: dict  # the pooled statistics' share of the case's memo

    @property
    def conv(self) -> tuple[tuple[str, str], ...]:
        return self.draws[0].conv

    def bound_spread(self, spec: OpSpec, case: Case, name: str) -> torch.Tensor | None:
        parts = [p.bound_spread(spec, case, name) for p in self.draws]
        return None if any(d is None for d in parts) else torch.stack(parts)


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
    kernel_kw, skip = calls.taken(kern.fn, spec.reference, dkw)
    backward_kw = (calls.taken(kern.backward, spec.reference, dkw)[0]
                   if kern.backward is not None else {})
    return _Prepared(dev_in, exact, kwargs, dkw, kernel_kw, backward_kw, grads,
                     skip=f"kernel {skip}" if skip else None, conv=spec.conventions_of(kern),
                     memo=memo)


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
    kernel makes on purpose (masked lanes, -inf logits, an fp16 sum past 65504): while a
    kernel runs, RuntimeWarnings raised from triton's own modules are dropped, and under
    TRITON_INTERPRET numpy's floating-point warnings are off (its reductions warn from numpy's
    own module, which the filter does not name); numcheck measures what the kernel returned.
    A kernel's own warnings pass."""
    import numpy

    quiet = numpy.errstate(all="ignore") if os.environ.get("TRITON_INTERPRET") == "1" \
        else contextlib.nullcontext()
    with warnings.catch_warnings(), quiet:
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


def _cond_ratio(spec: OpSpec, case: Case, o: _Output, p: "_Prepared | _Pooled", fmt: str,
                blocks) -> float | None:
    """The output's error over its condition-aware bound (numcheck.verdicts.conditioning); None when
    the reference gives no such output (an unused gradient)."""
    d = p.bound_spread(spec, case, o.name)
    if d is None:
        return None
    u_c = conditioning.compute_unit(case.dtype)
    c = spec.policy.cond_c + (float(spec.sum_len(case)) if spec.sum_len else 0.0)
    worst = conditioning.ratio(o.kernel, o.ref, d, fmt, c, blocks, u_c)
    if o.scale is not None and spec.policy.bound_c is not None:
        # the componentwise rule judges elements: it is excused element by element
        worst = max(worst, conditioning.ratio(o.kernel, o.ref, d, fmt, c, blocks, u_c,
                                              elementwise=True))
    return worst


def _measure(spec: OpSpec, kern: Kernel, case: Case, device: str, o: _Output,
             base: Record, p: "_Prepared | _Pooled") -> Record:
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
        rec.bound_ratio = elements.bound_ratio(out, ref, o.scale, ks.fmt)
        rec.baseline_bound_ratio = bbound
        rec.cond = _memo(p.memo, ("cond", p.conv, o.name),
                         lambda: elements.condition(ref, o.scale))
        rec.reduction_len = float(spec.reduction_len(case)) if spec.reduction_len else 0.0
    # Judged once. Is a failure a stable formulation the baseline or componentwise rule cannot
    # tell? The rules ask for the condition-aware bound where the record fails without it: the
    # FP64 reference on perturbed inputs costs DRAWS more references (policy.judge).
    verdict.judge(rec, policy.RecordPolicy.of(
        spec.policy, lambda: _cond_ratio(spec, case, o, p, ks.fmt, blocks),
        lambda k, floor: paired.worst_rank(out, bout, ref, k, floor, blocks)))
    if rec.status == Status.FAILED and not rec.known:
        # the backend's own kernel, on the first draw, is the yardstick
        _borrow_backend_finding(rec, spec, kern, case, device,
                                p.draws[0] if isinstance(p, _Pooled) else p)
    if rec.status != Status.PASSED:
        rec.worst_elements = elements.worst_elements(out, ref, o.scale)
        if isinstance(p, _Pooled):
            rec.worst_elements = f"[draw, *index] of {len(p.draws)} pooled draws: " + (
                rec.worst_elements)
        rec.ulp_hist = elements.ulp_histogram(out, ref, ks.fmt)
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
    reached = _memo(p.memo, ("reached", kern.name), lambda: calls.reached_ops(
        kern, _leaves(p.dev_in, p.grads), p.grads, p.kernel_kw, p.backward_kw))
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


def _baseline_measure(o: _Output, ref: torch.Tensor, dtype: torch.dtype, blocks):
    """The baseline in the kernel output's dtype, its ErrorStats and componentwise bound ratio."""
    bout = o.baseline.detach().to(dtype)
    bs = error_stats(bout, ref, blocks=blocks)
    bbound = elements.bound_ratio(bout, ref, o.scale, bs.fmt) if o.scale is not None else math.nan
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
            draws = [(p, _execute(spec, kern, case, device, p))]
            for d in range(1, _draws_for(*draws[0])):
                draws.append(_draw(spec, kern, case, device, p, d))
        except _KernelFailed as e:
            known = environment.known_failure(e.reason)
            if known:  # the torch build or the machine, not the kernel: docs/findings.md
                return [base.replace(status=Status.KNOWN, known=known, traceback=e.tb,
                                     reason=f"known environment failure {cite(known)}: {e.reason}")]
            return [base.replace(status=Status.ERROR, reason=e.reason, traceback=e.tb)]
    if len(draws) > 1:  # the golden's digest covers every draw's inputs
        base.input_digest = inputs.combined_digest([q.memo[("inputs",)][3] for q, _ in draws])
    try:
        records = _judge_draws(spec, kern, case, device, draws, base)
    except _KernelFailed as e:  # a later draw's gradient of the wrong shape, dtype or device
        return [base.replace(status=Status.ERROR, reason=e.reason)]
    if spec.conventions and any(r.status == Status.FAILED for r in records):
        records = conventions.followed(
            spec, kern, case, p.conv, records, lambda conv: _judge_draws(
                spec, kern, case, device, [(_under(spec, q, conv), r) for q, r in draws], base))
    if save_dir is not None and any(r.status != Status.PASSED for r in records):
        _save_inputs(Path(save_dir), spec, kern, case, p.exact, p.kwargs, records)
    return records


# DESIGN rule 13: the golden's sampling slack of an RMS over n elements is Z / sqrt(2n) of it
# (goldens.regression: Z = 8), +-50% at n = 128, where a lost half bit (+41%) hides. Outputs
# under POOL_ELEMENTS are judged over several draws of the case's inputs pooled: 2048 elements
# put the slack at 12.5%, below a quarter bit (+19%).
POOL_ELEMENTS = 2048
POOL_MAX_DRAWS = 16  # 128-element gradients (norm weights of D = 128) reach 2048
# Pooling stops where the draws would cost: the largest output over all draws stays below
# 2^18 elements (a quick norm case of 4 x 128 pools 16 draws of 512; a 32769 x 64 one none).
POOL_BUDGET = 1 << 18
# A draw's seed: the case's plus this stride times the draw (grid seeds are small: 0..4).
_DRAW_SEED = 1000


def _draws_for(p: _Prepared, result: tuple[torch.Tensor, tuple]) -> int:
    """How many draws the case pools: enough for its smallest judged output to reach
    POOL_ELEMENTS, within POOL_MAX_DRAWS and POOL_BUDGET (1: none)."""
    out, kg = result
    sizes = [out.numel()] + [(g if g is not None else p.dev_in[n]).numel()
                             for n, g in zip(p.grads, kg)]
    want = min(POOL_MAX_DRAWS, -(-POOL_ELEMENTS // max(1, min(sizes))))
    return max(1, min(want, POOL_BUDGET // max(1, max(sizes))))


def _draw(spec: OpSpec, kern: Kernel, case: Case, device: str, p: _Prepared,
          d: int) -> tuple[_Prepared, tuple[torch.Tensor, tuple]]:
    """Draw ``d`` of the case: its inputs from another seed, the reference and the kernel."""
    drawn = dataclasses.replace(case, seed=case.seed + _DRAW_SEED * d)
    q = _prepare(spec, kern, drawn, device, p.memo.setdefault(("draw", d), {}))
    q.ref = _memo(q.memo, ("ref", q.variant), lambda: _reference_forward(spec, q))
    return q, _execute(spec, kern, drawn, device, q)  # its own upstream gradient too


def _judge_draws(spec: OpSpec, kern: Kernel, case: Case, device: str,
                 draws: list[tuple[_Prepared, tuple]], base: Record) -> list[Record]:
    """The case's records: its one draw, or its draws pooled (each output stacked)."""
    with numerics.pinned():  # the baseline under the state the kernel ran in
        per = [_yardsticks(spec, case, q, *result) for q, result in draws]
    if len(per) == 1:
        return _judged(spec, kern, case, device, draws[0][0], per[0], base)
    for outs in per[1:]:  # the first draw's are checked where they are measured
        for o in outs:
            _check_output(o.kernel, o.ref, device, o.allowed, o.name)
    p0 = draws[0][0]
    pooled = _Pooled([q for q, _ in draws], p0.memo.setdefault(("pool", len(draws)), {}))
    stacked = [dataclasses.replace(
        first, kernel=torch.stack([o[i].kernel.detach() for o in per]),
        baseline=torch.stack([o[i].baseline.detach() for o in per]),
        ref=torch.stack([o[i].ref.detach() for o in per]),
        scale=None if first.scale is None else torch.stack([o[i].scale for o in per]))
        for i, first in enumerate(per[0])]
    return _judged(spec, kern, case, device, pooled, stacked, base)


def _judged(spec: OpSpec, kern: Kernel, case: Case, device: str, p: "_Prepared | _Pooled",
            outputs: list[_Output], base: Record) -> list[Record]:
    records = []
    for o in outputs:
        try:
            records.append(_measure(spec, kern, case, device, o, base, p))
        except _KernelFailed as e:  # a gradient of the wrong shape, dtype or device
            records.append(base.replace(output=o.name, status=Status.ERROR, reason=e.reason))
    return records


def _under(spec: OpSpec, p: _Prepared, conv: tuple[tuple[str, str], ...]) -> _Prepared:
    """p's draw with the reference and the baseline under other conventions."""
    alt = dataclasses.replace(p, conv=conv, ref=None, g_exact=None, _spread=None)
    alt.ref = _memo(p.memo, ("ref", alt.variant), lambda: _reference_forward(spec, alt))
    return alt


def _save_inputs(root: Path, spec, kern, case, exact, kwargs, records) -> None:
    """Failing inputs for offline debugging: exact float64 values, kwargs, case and records."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{spec.name}-{kern.name}-{case.id}.pt"
    for r in records:
        r.saved_inputs = str(path)
    torch.save({"case": dataclasses.asdict(case), "inputs": exact, "kwargs": kwargs,
                "records": [r.as_row() for r in records]}, path)
