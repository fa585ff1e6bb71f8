"""A per-layer format plan from what-if records (``nc.telemetry.plan``; docs/telemetry.md,
"Which layers can take which format").

For each linear layer, the candidates are tried from the cheapest (fewest bits per element,
block scales included: nvfp4 4.5, mxfp4 4.25, fp8 8, mxfp8 8.25, bf16 16) and the first whose
statistics stay within ``LIMITS`` is the layer's format. The statistics come from
``sensitivity`` records (or any telemetry frame with the same what-if rows):

* the layer's own GEMMs under the candidate, that layer alone (``shadow_sqnr_db`` of the roles
  output, grad_input, grad_weight), against the same candidate's SQNR on Gaussian operands of
  the layer's shapes (``gemm_fields`` on N(0, 1) x, w, dy; seeded): a layer whose data costs
  more than LIMITS["gemm_drop_db"] below that does not suit the format;
* the operands' quantization statistics (input, weight, grad_output): saturation beyond the
  format's own on Gaussian data, and optional limits on underflow and worst-block SQNR;
* optional absolute floors (``min_gemm_sqnr_db``): a level a training run showed a layer needs.

Worst over the recorded steps. ``bf16`` (when a candidate) is the fallback that needs no limit:
it is the baseline the convergence gate measures against. A layer no candidate passes gets the
widest candidate, and says so.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from numcheck.errors import UsageError

__all__ = ["LIMITS", "Plan", "plan"]

# name -> default (None: off). Sources:
LIMITS: dict[str, float | None] = {
    # One bit (6.02 dB: a factor of 2 in error amplitude) below what the candidate does to the
    # same GEMM on Gaussian operands. Measured at init on the tiny models (docs/telemetry.md):
    # unplanted layers at most 3.2 dB below their Gaussian level under nvfp4, fp8_tensor and
    # mxfp8_rceil; the planted massive-activation and loud-gradient layers 11-16 dB below under
    # nvfp4 and mxfp4; mxfp8's floor scales clip two real tensors (the CE gradient's target
    # entry: tiny_lm head dgrad 10.3 dB below; tiny_dit's sinusoidal timestep embedding 7.9).
    "gemm_drop_db": 6.02,
    # Saturated operand values beyond the candidate's own on Gaussian data, in percentage
    # points: 0.1 = the convergence gate's SAT_TOL (1e-3, gate.py), where clipped values start
    # to show in the loss of a delayed-scaling FP8 run. Not applied to formats that clip by
    # design (MX floor scales: up to 12.5% off the block's largest value, 0.5-0.7% of the
    # elements measured; their GEMM rows see what that costs).
    "saturation_pts": 0.1,
    # Off by default: underflow counts elements, not their energy. The SwiGLU and softmax
    # gradients of the healthy tiny models flush 22-29% of their elements under nvfp4 (Gaussian
    # 7%) with their dgrad SQNR at the Gaussian level. A peer's run-time rule switches a GEMM
    # to high precision above 5% (docs/telemetry.md): give underflow_pct=5 to apply it.
    "underflow_pct": None,
    # Off by default: the worst block of an operand dominated by an outlier looks healthy (the
    # outlier holds the block's energy): the GEMM rows see what it costs.
    "worst_block_drop_db": None,
    # Off by default: an absolute floor on the layer's own GEMM SQNR, in dB, for every
    # candidate but bf16: the level a training run (numcheck converge with the plan) showed a
    # model needs.
    "min_gemm_sqnr_db": None,
}
GEMM_ROLES = ("output", "grad_input", "grad_weight")
OPERAND_ROLES = ("input", "weight", "grad_output")


def _bits(name: str, recipe) -> float:
    """Storage bits per element of the recipe's activation operand, block scales included."""
    given = getattr(recipe, "bits_per_element", None)
    if given is not None:
        return float(given)
    fmt = getattr(getattr(recipe, "x", None), "format", None)
    if fmt is None:
        raise UsageError(f"candidate {name!r}: its x quantizer has no format to price it by; "
                         "give the recipe a bits_per_element attribute")
    block = fmt.block
    size = math.prod(block) if isinstance(block, tuple) else block
    scale_bits = {"e8m0": 8, "e4m3": 8}.get(getattr(fmt, "scale_fmt", "fp32"), 32)
    return fmt.bits + (scale_bits / size if isinstance(size, int) and size > 0 else 0.0)


@dataclass
class Plan:
    """``plan``'s answer. ``choices``: module -> recipe name; ``explain``: one row per (module,
    candidate, check) tried (value, limit, ok, source), the cheapest candidates first;
    ``fallbacks``: the layers kept above the cheapest candidate with the check that forced it;
    ``flops``: recipe -> fraction of the GEMM FLOPs (forward, dgrad, wgrad) it runs."""
    choices: dict[str, str]
    explain: object
    fallbacks: object
    flops: dict[str, float]
    candidates: tuple[str, ...]
    limits: dict = field(default_factory=dict)

    def summary(self) -> str:
        lines = [f"{len(self.choices)} linear layers; GEMM FLOPs: "
                 + ", ".join(f"{r} {100 * f:.1f}%" for r, f in self.flops.items())]
        for module, rec in self.choices.items():
            why = self.fallbacks[self.fallbacks["module"] == module]
            reason = "" if why.empty else "  <- " + "; ".join(
                f"{r.candidate}: {r.check} {r.role} {r.value:.1f} (limit {r.limit:.1f})"
                for r in why.itertuples())
            lines.append(f"  {module}: {rec}{reason}")
        return "\n".join(lines)

    def apply(self, model, state=None):
        """Swap each planned ``nn.Linear`` of ``model`` for a QuantLinear of its recipe (in
        place; bf16: both operands rounded to bf16, fp32 sums); returns the model. ``state``:
        a ``convergence.linear.QuantState`` (its SR stream), default seed 0."""
        from numcheck.convergence.linear import QuantState, apply_plan
        from numcheck.convergence.recipes import plan_recipes

        if state is None:
            device = next((p.device for p in model.parameters()), "cpu")
            state = QuantState(0, str(device))
        return apply_plan(model, plan_recipes(self.choices), state)

    def verify(self, model: str, cases: str = "quick"):
        """(the ConvergenceRun, whether the plan passed its gate): ``model`` (a built-in or
        planted model name) trained under the plan and under the cheapest candidate alone."""
        import warnings

        from numcheck.convergence import converge
        from numcheck.records import failing

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = converge(model, recipes={self.candidates[0]: None, "plan": self},
                           cases=cases)
        return run, not any(failing(r) for r in run.records() if r.kernel == "plan")

    def to_json(self, path) -> Path:
        p = Path(path)
        p.write_text(json.dumps({"choices": self.choices, "flops": self.flops,
                                 "candidates": list(self.candidates), "limits": self.limits,
                                 "fallbacks": self.fallbacks.to_dict("records")}, indent=1))
        return p

    @classmethod
    def from_json(cls, path) -> "Plan":
        import pandas as pd
        try:
            d = json.loads(Path(path).read_text())
            return cls(dict(d["choices"]), pd.DataFrame(), pd.DataFrame(d.get("fallbacks", [])),
                       dict(d.get("flops", {})), tuple(d.get("candidates", ())),
                       dict(d.get("limits", {})))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(f"{path}: not a plan written by Plan.to_json / numcheck plan "
                             f"({type(e).__name__}: {e})") from e


def _frame(records):
    import pandas as pd
    from numcheck.telemetry import fields

    if isinstance(records, pd.DataFrame):
        return records
    if isinstance(records, (str, Path)):
        records = [records]
    frames = []
    for r in records:
        if isinstance(r, pd.DataFrame):
            frames.append(r)
            continue
        try:
            frames.append(pd.read_parquet(r))
        except Exception as e:  # noqa: BLE001 - any unreadable file is a usage error
            raise UsageError(f"{r}: not a telemetry parquet file ({type(e).__name__}: {e})") from e
    if not frames:
        raise UsageError("plan: no records given")
    df = pd.concat(frames, ignore_index=True)
    missing = [c for c in fields.KEY if c not in df.columns]
    if missing:
        raise UsageError(f"plan: the records lack {', '.join(missing)}: give telemetry records "
                         "(nc.telemetry.sensitivity or watch(..., what_if=...))")
    return df


def _shapes(rows) -> tuple[int, int, int] | None:
    """(M, N, K) of a layer's call from the element counts per call of one recipe's rows: the
    GEMMs' (output M*N, grad_input M*K, grad_weight N*K), else the operands' (input M*K,
    weight N*K) for a forward-only record."""
    for _, part in rows.groupby("recipe"):
        per = {}
        for role in ("output", "grad_input", "grad_weight", "input", "weight"):
            r = part[(part["role"] == role) & (part["calls"] > 0)]
            if not r.empty:
                per[role] = float((r["n"] / r["calls"]).iloc[0])
        mn = per.get("output")
        mk = per.get("grad_input", per.get("input"))
        nk = per.get("grad_weight", per.get("weight"))
        if mn and mk and nk:
            k = math.sqrt(mk * nk / mn)
            return round(mk / k), round(nk / k), round(k)
    return None


class _Gaussian:
    """What each candidate does to N(0, 1) operands of one shape (cached per shape)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed, self.cache = seed, {}

    def stats(self, shape, name: str, recipe) -> dict[str, dict[str, float]]:
        key = (shape, name)
        if key not in self.cache:
            import torch

            from numcheck.telemetry import fields
            from numcheck.telemetry.layer_sensitivity import gemm_fields
            m, n, k = shape
            g = torch.Generator().manual_seed(self.seed)
            x, w, dy = (torch.randn(a, b, generator=g, dtype=torch.float64)
                        for a, b in ((m, k), (n, k), (m, n)))
            raw = gemm_fields(x, w, dy, recipe, torch.Generator().manual_seed(self.seed))
            rows = []
            for role, got in raw.items():
                acc = fields.host_identity()
                fields.host_update(acc, got)
                rows.append({"step": 0, "rank": 0, "module": "", "op": "linear", "role": role,
                             "pass": "", "recipe": name, "what_if": True,
                             **dict(zip(fields.NAMES, acc, strict=True))})
            df = fields.frame(rows).set_index("role")
            self.cache[key] = {role: df.loc[role].to_dict() for role in df.index}
        return self.cache[key]


def _by_design(recipe, role: str) -> bool:
    """The operand's format clips by design (MX floor scales put a block's amax above the
    element max: ``amax_overshoot`` > 1): its saturation says nothing about the data."""
    attr = {"input": "x", "weight": "w", "grad_output": "grad"}[role]
    fmt = getattr(getattr(recipe, attr, None), "format", None)
    return fmt is not None and getattr(fmt, "amax_overshoot", 1.0) > 1.0


def _checks(name, recipe, rows, gauss, lim) -> list[dict]:
    """Every check of one (layer, candidate): dicts check, role, value, limit, ok."""
    out = []
    by_role = {role: part for role, part in rows.groupby("role")}

    def add(check, role, value, limit, ok):
        out.append({"check": check, "role": role, "value": float(value),
                    "limit": float(limit), "ok": bool(ok)})

    for role in GEMM_ROLES:
        part = by_role.get(role)
        if part is None:
            continue
        if part["nonfinite"].sum() > 0:
            add("nonfinite", role, part["nonfinite"].sum(), 0, False)
        # steps where the GEMM made exact zeros both ways (adaLN-Zero layers at init, a
        # gradient behind a zero gate) have nothing to lose; any other step counts
        live = part[(part["sh_sig_sq"] > 0) | (part["sh_err_sq"] > 0)]
        if live.empty:
            add("no signal", role, math.inf, math.nan, True)
            continue
        value = float(live["shadow_sqnr_db"].min())   # the worst step
        g = gauss.get(role, {}).get("shadow_sqnr_db", math.nan)
        if lim.get("gemm_drop_db") is not None:
            # no Gaussian level (the layer's shapes not in the records): a NaN limit, failed
            limit = g - lim["gemm_drop_db"]
            add("gemm_sqnr_db", role, value, limit, value >= limit)
        if lim.get("min_gemm_sqnr_db") is not None:
            add("gemm_sqnr_floor_db", role, value, lim["min_gemm_sqnr_db"],
                value >= lim["min_gemm_sqnr_db"])
    for role in OPERAND_ROLES:
        part = by_role.get(role)
        if part is None or not (part["q_n"] > 0).any():
            continue
        g = gauss.get(role, {})
        if lim.get("saturation_pts") is not None and not _by_design(recipe, role):
            value = float(part["saturation_pct"].max())
            limit = g.get("saturation_pct", 0.0) + lim["saturation_pts"]
            add("saturation_pct", role, value, limit, value <= limit)
        if lim.get("underflow_pct") is not None:
            value = float(part["underflow_pct"].max())
            add("underflow_pct", role, value, lim["underflow_pct"], value <= lim["underflow_pct"])
        wb = part["worst_block_sqnr_db"]
        if lim.get("worst_block_drop_db") is not None and wb.notna().any():
            limit = g.get("worst_block_sqnr_db", math.nan) - lim["worst_block_drop_db"]
            if math.isfinite(limit):
                add("worst_block_sqnr_db", role, wb.min(), limit, wb.min() >= limit)
    return out


def plan(records, candidates=("nvfp4", "mxfp8", "bf16"), limits=None, *, seed: int = 0) -> Plan:
    """The cheapest candidate per linear layer whose what-if statistics in ``records`` (a
    frame, a parquet path or a list of them: ``sensitivity`` records) stay within ``limits``
    (``LIMITS`` updated by the given dict; None turns a limit off). Module doc."""
    import pandas as pd

    from numcheck.telemetry.layer_sensitivity import resolve_candidate

    lim = dict(LIMITS)
    for k, v in (limits or {}).items():
        if k not in LIMITS:
            raise UsageError(f"plan: unknown limit {k!r}; use {', '.join(LIMITS)}")
        lim[k] = None if v is None else float(v)
    cands = [resolve_candidate(c) for c in candidates]
    if not cands:
        raise UsageError("plan: no candidates given")
    priced = sorted(((_bits(n, r), i, n, r) for i, (n, r) in enumerate(cands)))
    df = _frame(records)
    df = df[(df["op"] == "linear") & df["what_if"].astype(bool)]
    gemm = df[df["role"].isin(GEMM_ROLES)]
    if gemm.empty:
        raise UsageError("plan: the records hold no what-if GEMM rows (roles output, "
                         "grad_input, grad_weight with shadow fields): record them with "
                         "nc.telemetry.sensitivity(model, batches, candidates)")
    gauss = _Gaussian(seed)
    explain, fallbacks, choices, flops = [], [], {}, {}
    for module in dict.fromkeys(gemm["module"]):
        mine = df[df["module"] == module]
        shape = _shapes(mine)
        chosen, forced = None, []
        for bits, _, name, recipe in priced:
            rows = mine[mine["recipe"] == name]
            if name == "bf16":
                explain.append({"module": module, "candidate": name, "bits": bits,
                                "check": "fallback", "role": "", "value": math.nan,
                                "limit": math.nan, "ok": True})
                chosen = name
                break
            if rows.empty:
                explain.append({"module": module, "candidate": name, "bits": bits,
                                "check": "not recorded", "role": "", "value": math.nan,
                                "limit": math.nan, "ok": False})
                forced.append({"module": module, "candidate": name, "check": "not recorded",
                               "role": "", "value": math.nan, "limit": math.nan})
                continue
            g = gauss.stats(shape, name, recipe) if shape else {}
            checks = _checks(name, recipe, rows, g, lim)
            explain += [{"module": module, "candidate": name, "bits": bits, **c}
                        for c in checks]
            bad = [c for c in checks if not c["ok"]]
            if not bad:
                chosen = name
                break
            forced.append({"module": module, "candidate": name, **bad[0]})
        if chosen is None:
            chosen = priced[-1][2]
            forced.append({"module": module, "candidate": chosen, "check": "no candidate "
                           "within the limits: the widest kept", "role": "", "value": math.nan,
                           "limit": math.nan})
        choices[module] = chosen
        if forced:   # a layer above the cheapest candidate, or one that none passed
            fallbacks += forced
        if shape:
            m, n, k = shape
            out = mine[mine["role"] == "output"]
            calls = float(out[out["step"] == out["step"].iloc[0]]["calls"].iloc[0])
            flops[chosen] = flops.get(chosen, 0.0) + 6.0 * m * n * k * calls
    total = sum(flops.values())
    flops = {r: flops[r] / total for _, _, r, _ in priced if r in flops} if total else {}
    cols = ["module", "candidate", "check", "role", "value", "limit"]
    return Plan(choices, pd.DataFrame(explain), pd.DataFrame(fallbacks, columns=cols), flops,
                tuple(n for _, _, n, _ in priced), {k: v for k, v in lim.items()})
