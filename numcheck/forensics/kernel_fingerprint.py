"""Kernel forensics: how a kernel accumulates, inferred from crafted inputs (``nc.fingerprint``).

A GEMM's result depends on more than its inputs: how many bits its accumulator keeps, how it
rounds, in which order it adds the K products, whether a rerun or another batch size gives the
same bits. ``fingerprint(op, fn)`` measures each of these with inputs built so that every
hypothesis predicts a distinct, exact output, and keeps the evidence (which probe, what came
out). The reduction probed is the op's sum over K: matmul and linear over K, sdpa over the keys
(the P V product, with q = 0 so that every weight is exactly 1/S; QK^T is a matmul: fingerprint
the kernel that computes it as one).

Probes (every value a power of two or 3 x one, exact in the input dtype; the output exact in
the output dtype, else compared after numcheck's own rounding of the prediction):

* order: +B at position i, -B at j, a unit U everywhere else, with B / U just beyond the
  measured accumulator's reach (2^(acc_bits + 12), B <= 2^14 where U >= 2^-12 allows: an
  fp16 accumulator holds it; the dtype's limit, 2^105 for bf16/fp32 inputs, 2^40 for fp16,
  2^28 for e4m3, where acc_bits is unknown or wider). Whatever adds into a partial sum that
  holds +-B is swamped (or, rounding toward zero, steps it), so the output counts the units
  outside the smallest subtree of the summation tree that holds both i and j. Pairs (0, j)
  and (n-1, j) at n = 128, 256, 512 tell sequential, pairwise, blocked:<k> (sequential blocks
  of k, whatever n), split:<s> (s chunks, whatever n) and strided:<w> (w lanes) apart; each
  hypothesis's prediction is computed by evaluating its tree exactly with the measured
  accumulator (its bits and rounding), and the order is the hypothesis that predicts every
  probe.
* acc_bits: X = 1.5 2^b at 0, 2^(b-q) at the leaf summed first with it, -X at the last leaf:
  the output is 2^(b-q) while X + 2^(b-q) survives, 0 (or a rounding up) once it does not;
  acc_bits is the largest q that survives (23 for fp32 accumulation, 52 for fp64). X + s and
  -X + s stay in X's binade: the answer does not depend on which the tree adds s to first.
* promote_every: the same probe with the small value at j = 2, 4, ..., 256 on rows of 4j:
  where partial sums of k products are kept in fewer bits and then added in a wider
  accumulator, X and the small value meet in the wide one once j >= k (bisected to k).
* acc_rounding: X + 0.75 ulp, -X - 0.75 ulp, X + 0.5 ulp and X - 0.25 ulp (ulp at acc_bits):
  rne, rna, rz, rd (toward -inf) or ru (toward +inf) from which of them leave X.
* deterministic: the same random inputs N times, bitwise; the spread in ULPs when they differ.
* batch_invariant: rows of a batched call against the same rows computed alone and in other
  batch sizes (sdpa: batch entries and shorter query blocks), bitwise.

Limits: fp16 inputs reach 2^40 between B and U (an accumulator wider than ~36 bits reads as
"unknown" order there); sdpa needs bf16 or fp32 (fp16's range holds no swamping probe);
reductions inside norms and softmax sum positive terms only (squares, exponentials), which no
cancellation probe can be built from: only their determinism and batch invariance are measured.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from numcheck import formats
from numcheck.forensics import summation_orders as orders
from numcheck.forensics.summation_orders import SIZES
from numcheck.measure import numerics
from numcheck.errors import UsageError
from numcheck.cases.grid import Case
from numcheck.records import Record, Status

PROPERTIES = ("acc_bits", "promote_every", "acc_rounding", "order", "deterministic",
              "batch_invariant")
_REPEATS = 5  # determinism: runs compared bitwise
_ROWS = 256  # probe rows per kernel call


@dataclass(frozen=True)
class Fingerprint:
    """What ``fingerprint`` inferred, with the evidence of each property (``evidence[name]``).

    acc_bits: fraction bits the accumulator keeps (23 = fp32; None: no probe survived even
    q = 1, or the op has no accumulation probe). promote_every: None, or the block length after
    which partial sums are added in a wider accumulator. acc_rounding: "rne" | "rna" | "rz" |
    "rd" | "ru" | "unknown". order: "sequential" | "pairwise" | "blocked:<k>" | "split:<s>" |
    "strided:<w>" | "blocked:<k>/strided:<w>[+carry]" (K tiles in lanes) |
    "blocked:<k128>,<k256>,<k512>" (K-dependent blocks) | "sequential:permuted" |
    "blocked:<k128>,<k256>,<k512>:permuted" | "unknown" (docs/fingerprints.md).
    deterministic: bitwise equal over repeated runs. batch_invariant: rows independent of the
    batch they are computed in."""

    op: str
    kernel: str
    dtype: str
    device: str
    acc_bits: int | None
    promote_every: int | None
    acc_rounding: str
    order: str
    deterministic: bool
    batch_invariant: bool
    evidence: dict[str, str] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def properties(self) -> dict[str, Any]:
        """The six inferred properties (what a golden row holds)."""
        return {p: getattr(self, p) for p in PROPERTIES}

    def __str__(self) -> str:
        head = f"{self.op}/{self.kernel} {self.dtype} on {self.device}"
        lines = [head] + [f"  {p:<15} {getattr(self, p)!s:<14} {self.evidence.get(p, '')}"
                          for p in PROPERTIES]
        return "\n".join(lines)


# ---- the ops' reductions ------------------------------------------------------------------------

@dataclass(frozen=True)
class _Scales:
    """Probe magnitudes for one input dtype, as exponents of two: the swamping pair (big, unit),
    the precision probe's binade b (X = 1.5 2^b) and the largest q it may use."""

    big: int
    unit: int
    base: int
    max_t: int
    factored: bool = False  # values built as products of two factors of the input dtype
    direct: tuple[int, int] = (100, -5)  # (big, unit) held directly (batch/determinism rows)


# bf16 / fp32 hold 2^100 and 2^-5 directly (B / U = 2^105). fp16 builds each value as a
# product of two factors within +-2^15 (B = 2^30, U = 2^-10); X = 1.5 2^14 keeps the precision
# probe's 2^(14-q) a normal fp16 output up to q = 28 and an exact subnormal up to q = 38, and
# X + 2^13 within an fp16 accumulator's range (1.5 2^15 + 2^14 overflows it). e4m3
# (FP8 GEMMs: the kernel gets e4m3 operands and returns bf16/fp16/fp32): factors within
# 2^-6 .. 2^8 (normal, 448 max), B = 2^16, U = 2^-12, X = 1.5 2^16, 2^(16-q) down to 2^-12.
_SCALES = {"bf16": _Scales(100, -5, 0, 80), "fp32": _Scales(100, -5, 0, 80),
           "fp16": _Scales(30, -10, 14, 38, True, (15, -9)),
           "e4m3": _Scales(16, -12, 16, 28, True, (8, -6))}
_TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "e4m3": torch.float8_e4m3fn}
_OUT_FMT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _factors(v: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """v = left * right, both exact in dtype (fp16, e4m3: each about half of v's exponent)."""
    if not _SCALES[dtype].factored:
        return v, torch.ones_like(v)
    e = torch.where(v == 0, torch.zeros_like(v), torch.floor(torch.log2(v.abs())))
    right = torch.exp2(torch.floor(e / 2))
    return v / right, right


class _Reduction:
    """How one op's kernel computes many dot products: ``dots(fn, left, right)`` returns
    sum_k left[p, k] right[p, k] for every row p as the kernel computed it (float64)."""

    op = ""
    dtypes = ("bf16", "fp16", "fp32")
    probes_accumulation = True  # dot products with cancellation: acc_bits, rounding, order

    def dots(self, fn, left, right, dtype, device) -> torch.Tensor:  # pragma: no cover
        """The kernel's outputs holding the dot products (read by ``sums``)."""
        raise NotImplementedError

    def calls(self, fn, dtype, device, gen, probe) -> dict[str, Callable[[torch.Tensor], Any]]:
        """The batch-invariance and determinism inputs: name -> a call of ``fn`` on the rows
        ``idx`` of one batch of inputs (order probe rows ``probe``, whose outputs move with any
        change of summation tree, and random data)."""
        raise NotImplementedError


def _rand(shape, dtype, device, gen) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(_TORCH[dtype]).to(device)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """0.0 when bitwise equal, else the largest |a - b| (the smallest positive float where only
    bits differ: -0 against +0, NaN payloads)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return math.inf
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    a, b = a.detach().contiguous().cpu(), b.detach().contiguous().cpu()
    if torch.equal(a.view(ints), b.view(ints)):
        return 0.0
    d = (a.double() - b.double()).abs().nan_to_num(nan=math.inf)
    return max(float(d.max()), 5e-324)


class _GEMM(_Reduction):
    """matmul(a, b) / linear(x, weight): probe rows as the left operand against columns of ones
    (factored probes, fp16 and e4m3: the diagonal of a P x P product, row p of the left operand
    with column p of the right one), P = _ROWS rows per call."""

    def __init__(self, op: str) -> None:
        self.op = op
        self.dtypes = ("bf16", "fp16", "fp32", "e4m3") if op == "matmul" else \
            ("bf16", "fp16", "fp32")

    def _call(self, fn, a, b):
        return fn(a, b) if self.op == "matmul" else fn(a, b.mT)  # linear's weight is (N, K)

    def dots(self, fn, left, right, dtype, device):
        t = _TORCH[dtype]
        a = left.to(t).to(device)
        if bool((right == 1).all()):  # every row against one column of ones (16 alike)
            return self._call(fn, a, torch.ones((left.shape[1], 16), dtype=t,
                                                device=device))[:, 0]
        return self._call(fn, a, right.to(t).mT.contiguous().to(device)).diagonal()

    def calls(self, fn, dtype, device, gen, probe):
        t = _TORCH[dtype]
        pa, pb = probe.to(t).to(device), torch.ones((probe.shape[1], 16), dtype=t, device=device)
        ra, rb = _rand((48, 256), dtype, device, gen), _rand((256, 48), dtype, device, gen)
        return {"probe rows": lambda idx: self._call(fn, pa[idx].clone(), pb.clone()),
                "random rows": lambda idx: self._call(fn, ra[idx].clone(), rb.clone())}


class _SDPA(_Reduction):
    """sdpa(q, k, v) over the keys: q = k = 0 make every weight exactly 1/S (S a power of two),
    so S out = sum_j v[j]; one probe per head, v's head dim 8 (all columns alike)."""

    op = "sdpa"
    dtypes = ("bf16", "fp32")

    def dots(self, fn, left, right, dtype, device):
        if not bool((right == 1).all()):
            raise UsageError("sdpa probes carry their values in v only")
        t = _TORCH[dtype]
        p, s = left.shape
        q = torch.zeros((1, p, 1, 8), dtype=t, device=device)
        k = torch.zeros((1, p, s, 8), dtype=t, device=device)
        v = left.to(t).to(device)[None, :, :, None].expand(1, p, s, 8).contiguous()
        return fn(q, k, v)[0, :, 0, 0] * s  # s a power of two: exact

    def calls(self, fn, dtype, device, gen, probe):
        t = _TORCH[dtype]
        b, s = probe.shape
        zeros = torch.zeros((b, 1, s, 8), dtype=t, device=device)
        v = probe.to(t).to(device)[:, None, :, None].expand(b, 1, s, 8).contiguous()
        q, k, rv = (_rand((48, 2, 64, 64), dtype, device, gen) for _ in range(3))
        return {"probe batch entries": lambda idx: fn(zeros[idx, :, :1], zeros[idx], v[idx]),
                "random batch entries": lambda idx: fn(q[idx], k[idx], rv[idx]),
                "random query rows": lambda idx: fn(q[:1, :, idx], k[:1], rv[:1]).transpose(0, 2)}


class _RowReduction(_Reduction):
    """softmax, log_softmax, rms_norm, layer_norm: reductions of positive terms (exponentials,
    squares), from which no cancellation probe can be built: no accumulation probes, only
    determinism and batch invariance, on rows of 4096 whose sums depend on the order: random
    heavy-tailed values and magnitude ladders (2^-12 .. 2^11, alternating signs)."""

    probes_accumulation = False
    dtypes = ("bf16", "fp16", "fp32")

    def __init__(self, op: str) -> None:
        self.op = op

    def _call(self, fn, x):
        d = x.shape[-1]
        if self.op in ("softmax", "log_softmax"):
            return fn(x, dim=-1)
        w = torch.ones(d, dtype=x.dtype, device=x.device)
        if self.op == "rms_norm":
            return fn(x, w, 1e-6)
        return fn(x, w, torch.zeros_like(w), 1e-5)

    def calls(self, fn, dtype, device, gen, probe):
        t = _TORCH[dtype]
        g = torch.randn((48, 4096), generator=gen, dtype=torch.float64)
        heavy = (g * torch.exp(torch.randn((48, 4096), generator=gen, dtype=torch.float64)))
        k = torch.arange(4096, dtype=torch.float64)
        ladder = torch.exp2((k + torch.arange(48, dtype=torch.float64)[:, None]) % 24 - 12) * \
            torch.where(k % 2 == 0, 1.0, -1.0)
        if self.op in ("softmax", "log_softmax"):  # exp of the ladder: terms 2^-? .. 1
            ladder = ladder.abs().log2() - 12
        rows = {"random rows": heavy.to(t).to(device), "ladder rows": ladder.to(t).to(device)}
        return {name: (lambda idx, x=x: self._call(fn, x[idx].clone())) for name, x in rows.items()}


_REDUCTIONS: dict[str, _Reduction] = {"matmul": _GEMM("matmul"), "linear": _GEMM("linear"),
                                      "sdpa": _SDPA(),
                                      **{op: _RowReduction(op) for op in
                                         ("softmax", "log_softmax", "rms_norm", "layer_norm")}}


# ---- the probes -----------------------------------------------------------------------------------

class _Prober:
    """Runs probe rows through one kernel, _ROWS rows per call, and reads the sums back."""

    def __init__(self, red: _Reduction, fn, dtype: str, device: str) -> None:
        self.red, self.fn, self.dtype, self.device = red, fn, dtype, device
        self.out_fmt = dtype  # the kernel's output format, read from its first output

    def sums(self, values: torch.Tensor) -> torch.Tensor:
        """Kernel's sum of each row of ``values`` (float64, exact in the input dtype)."""
        parts = []
        for r0 in range(0, values.shape[0], _ROWS):
            v = values[r0:r0 + _ROWS]
            if v.shape[0] < _ROWS:  # pad to a fixed shape: one kernel path for every call
                v = torch.cat([v, torch.zeros(_ROWS - v.shape[0], v.shape[1],
                                              dtype=torch.float64)])
            left, right = _factors(v, self.dtype)
            try:
                got = self.red.dots(self.fn, left, right, self.dtype, self.device)
            except UsageError:
                raise
            except Exception as exc:
                raise UsageError(f"fingerprint: the {self.red.op} kernel raised "
                                 f"{type(exc).__name__} on a probe of shape {tuple(v.shape)}: "
                                 f"{exc}") from exc
            if got.dtype not in _OUT_FMT:
                raise UsageError(f"fingerprint: the {self.red.op} kernel returned {got.dtype}; "
                                 f"the probes read bf16, fp16 or fp32 outputs")
            self.out_fmt = _OUT_FMT[got.dtype]
            parts.append(got.detach().double().cpu()[: min(_ROWS, values.shape[0] - r0)])
        return torch.cat(parts)


def _order(pr: _Prober, sc: _Scales, p: int, mode: str,
           promoted: tuple[int, int, str] | None = None) -> tuple[str, str]:
    """The hypothesis that predicts every order probe at every size, with its evidence.
    promoted: (k, bits, mode) of a narrower accumulator inside blocks of k (promote_every)."""
    unit = 2.0 ** sc.unit
    probes, got, sizes = {}, {}, {}
    for n in SIZES:
        classes = orders.unit_classes(n, pr.out_fmt)
        probes[n] = orders.order_rows(n, sc, classes)
        got[n] = pr.sums(probes[n][1])
        counts = got[n].view(-1, classes).sum(1) / unit
        sizes[n] = [n - int(c) if math.isfinite(c) else 0 for c in counts[: n - 1].tolist()]
    alive = orders.hypotheses() + orders.derived(sizes)
    if promoted:
        k, bits, inner = promoted
        alive.insert(0, (f"blocked:{k}", orders.fixed(orders.promoted(k, bits, inner))))
    misses: dict[str, tuple[int, tuple]] = {}
    for n in SIZES:  # the smallest size rules most hypotheses out cheaply
        keys, rows = probes[n]
        still = []
        for name, tree in alive:
            pred = orders.predict(tree(n), rows, p, mode, pr.out_fmt)
            bad = ~((pred == got[n]) | (pred.isnan() & got[n].isnan()))
            if bool(bad.any()):
                r = int(bad.nonzero()[0])
                misses.setdefault(name, (int(bad.sum()), (n, keys[r][0], float(got[n][r]),
                                                          float(pred[r]))))
            else:
                still.append((name, tree))
        alive = still
    shown = "; ".join(f"n={n}: " + ",".join(map(str, sz[:12])) + ",..." for n, sz in
                      sizes.items()) + _order_evidence_nonfinite(got)
    what = (f"{sum(len(k) for k, _ in probes.values())} probes (+B at i, -B at j, units "
            f"elsewhere, B/U = 2^{sc.big - sc.unit}) at n = {', '.join(map(str, SIZES))}, "
            f"predicted with a {p}-bit {mode} accumulator; smallest subtree holding leaves "
            f"0 and j = 1, 2, ...: {shown}")
    if alive:
        names = list(dict.fromkeys(n for n, _ in alive))
        alt = f"; equally consistent: {', '.join(names[1:])}" if len(names) > 1 else ""
        return names[0], f"every output as {names[0]} predicts{alt}. {what}"
    name, (miss, (n, (i, j), g, w)) = min(misses.items(), key=lambda kv: kv[1][0])
    return "unknown", (f"no hypothesis predicts them all; nearest {name} misses {miss} "
                       f"(n={n}, +B at {i}, -B at {j}: output {g / unit:g} units, {name} "
                       f"predicts {w / unit:g}). {what}")


def _bits_at(pr: _Prober, sc: _Scales, n: int, j: int, last: int) -> int | None:
    """The largest q such that X + 2^-q 2^b survives, X = 1.5 2^b at 0, the small value at j,
    -X at ``last`` (fewer than 1 bit: None). X + s and -X + s both stay in X's binade, so the
    answer does not depend on which of the two the tree adds the small value to first."""
    x, b = 1.5 * 2.0 ** sc.base, sc.base
    qs = range(1, sc.max_t + 1)
    rows = torch.zeros((len(qs), n), dtype=torch.float64)
    rows[:, 0], rows[:, last] = x, -x
    for r, q in enumerate(qs):
        rows[r, j] = 2.0 ** (b - q)
    got = pr.sums(rows)
    best = None
    for r, q in enumerate(qs):
        if not bool(got[r] == 2.0 ** (b - q)):
            break
        best = q
    return best


# (X + 0.75 ulp, -X - 0.75 ulp, X + 0.5 ulp, X - 0.25 ulp) rounded away from X -> the mode
_MODES = {(True, True, False, False): "rne", (True, True, True, False): "rna",
          (False, False, False, True): "rz", (False, True, False, True): "rd",
          (True, False, True, False): "ru"}


def _rounding(pr: _Prober, sc: _Scales, n: int, j: int, p: int) -> tuple[str, str]:
    """The accumulator's rounding at p bits from four sums of X = 1.5 2^b (its last bit even)
    and a fraction of its ulp, cancelled by -X at the end: which of them leave X."""
    x, ulp = 1.5 * 2.0 ** sc.base, 2.0 ** (sc.base - p)
    rows = torch.zeros((4, n), dtype=torch.float64)
    rows[:, 0], rows[:, n - 1] = x, -x
    rows[1, 0], rows[1, n - 1] = -x, x
    for r, frac in enumerate((0.75, -0.75, 0.5, -0.25)):
        rows[r, j] = frac * ulp
    got = pr.sums(rows)
    away = (bool(got[0] == ulp), bool(got[1] == -ulp), bool(got[2] == ulp),
            bool(got[3] == -ulp))
    ev = ", ".join(f"{name} -> {'moved' if a else 'X'}" for name, a in
                   zip(("X + 0.75 ulp", "-X - 0.75 ulp", "X + 0.5 ulp (a tie, X even)",
                        "X - 0.25 ulp"), away))
    mode = _MODES.get(away, "unknown")
    extra = "" if mode != "unknown" else "; no rounding of the exact sum does that (an " \
        "accumulator that truncates the addend before adding, for one)"
    return mode, f"{ev} (ulp = 2^-{p} of X's binade){extra}"


def _order_evidence_nonfinite(got: dict) -> str:
    bad = sum(int((~torch.isfinite(g)).sum()) for g in got.values())
    return (f"; {bad} outputs are NaN/inf: the probe's B overflowed the accumulator"
            if bad else "")


def _promotion(pr: _Prober, sc: _Scales, acc_bits: int | None, j: int, seen: list):
    """(k, bits across blocks) where X and the small value meet in a wider accumulator once
    they are k apart, else (None, acc_bits). Probed at j = 2, 4, ..., 256 on rows of 4j (the
    cancelling -X four blocks away), then bisected for a k between two powers of two."""
    def bits(k: int) -> int | None:
        n = max(SIZES[-1], 4 * k)
        b = _bits_at(pr, sc, n, k, n - 1)
        seen.append(f"j={k}: {b}")
        return b

    lo = j
    for k in (2, 4, 8, 16, 32, 64, 128, 256):
        if k <= j or acc_bits is None:
            continue
        b = bits(k)
        if b is not None and b > acc_bits:
            while k - lo > 1:  # the first position in the next block
                mid = (lo + k) // 2
                bm = bits(mid)
                if bm is not None and bm > acc_bits:
                    k, b = mid, bm
                else:
                    lo = mid
            return k, b
        lo = k
    return None, acc_bits


def fingerprint(op: str, fn, *, dtype: str = "bf16", device: str | None = None,
                kernel_name: str | None = None) -> Fingerprint:
    """Fingerprint ``fn``, a kernel of ``op`` ("matmul", "linear" or "sdpa", called as the op's
    signature says: ``fn(a, b)``, ``fn(x, weight)``, ``fn(q, k, v)``), on ``dtype`` inputs.
    softmax, log_softmax, rms_norm and layer_norm (``fn(x, dim=-1)``, ``fn(x, weight, eps)``,
    ``fn(x, weight, bias, eps)``): determinism and batch invariance only (the accumulation
    properties read None / "unknown", their evidence says why).

    ``fn`` may also be the name of a registered kernel of ``op``. device: default cuda when
    available, else cpu. Raises UsageError for an op without a probe, a dtype the op's probe
    cannot hold, or a kernel that fails on a probe (the message names the probe's shape)."""
    if op not in _REDUCTIONS:
        raise UsageError(f"fingerprint: op {op!r} has no probe; use one of "
                         f"{', '.join(sorted(_REDUCTIONS))}")
    red = _REDUCTIONS[op]
    if dtype not in red.dtypes:
        raise UsageError(f"fingerprint: {op} probes need dtype in {', '.join(red.dtypes)}, "
                         f"got {dtype!r}")
    if isinstance(fn, str):
        from numcheck.catalog import kernels
        found = kernels(op)
        if fn not in found:
            raise UsageError(f"fingerprint: {op} has no kernel {fn!r}; registered: "
                             f"{', '.join(sorted(found))}")
        kernel_name, fn = kernel_name or fn, found[fn].fn
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with numerics.pinned():  # the verify numerics state: TF32/oneDNN knobs off, threads fixed
        return _fingerprint(op, red, fn, dtype, device, kernel_name)


def _fingerprint(op, red, fn, dtype, device, kernel_name) -> Fingerprint:
    sc, pr = _SCALES[dtype], _Prober(red, fn, dtype, device)
    evidence: dict[str, str] = {}
    if red.probes_accumulation:
        pr.sums(torch.zeros((1, SIZES[0]), dtype=torch.float64))  # learns the output format
        n = SIZES[-1]  # the precision probes' rows: -X at 511, far from the small value
        acc_bits, rounding, promote, order = _accumulation(pr, sc, n, 1, evidence)
        if order.startswith("strided:"):  # leaf 0's first partner is w positions away
            acc_bits, rounding, promote, order = _accumulation(pr, sc, n, int(order[8:]),
                                                               evidence)
    else:
        acc_bits, rounding, promote, order = None, "unknown", None, "unknown"
        why = (f"not probed: {op} sums positive terms (squares, exponentials), from which no "
               f"cancellation probe can be built")
        evidence.update({p: why for p in ("acc_bits", "promote_every", "acc_rounding",
                                            "order")})

    gen = torch.Generator().manual_seed(20261202)
    calls = red.calls(fn, dtype, device, gen, _batch_probe(sc))
    deterministic, evidence["deterministic"] = _determinism(calls, pr.out_fmt)
    invariant, evidence["batch_invariant"] = _invariance(calls)
    name = kernel_name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"
    return Fingerprint(op, name, dtype,
                       torch.device(device).type, acc_bits, promote, rounding, order,
                       deterministic, invariant, evidence)


def _accumulation(pr: _Prober, sc: _Scales, n: int, j: int, evidence: dict):
    """acc_bits, acc_rounding, promote_every and order, probing the precision with the small
    value at position j (the leaf summed first with leaf 0), the order under what those found."""
    last = n - 1
    acc_bits = _bits_at(pr, sc, n, j, last)
    within = _bits_at(pr, sc, n, j, j + 1)
    evidence["acc_bits"] = (f"X = 1.5 at 0, 2^-q at {j}, -X at {last} (n={n}): kept up to "
                            f"q = {acc_bits}" + (" (the probe's limit)" if acc_bits == sc.max_t
                                                 else "")
                            + f"; with -X right after it (at {j + 1}): {within}")
    seen: list[str] = []
    promote, wide = _promotion(pr, sc, acc_bits, j, seen)
    evidence["promote_every"] = ("X at 0, 2^-q at j, -X four blocks away: bits kept "
                                 + ", ".join(seen) if seen else "not probed")
    if acc_bits is None or acc_bits >= sc.max_t:
        rounding = "unknown"
        evidence["acc_rounding"] = f"acc_bits {acc_bits}: no rounding position to probe"
    else:
        rounding, evidence["acc_rounding"] = _rounding(pr, sc, n, j, acc_bits)
    # the order's predictions: the measured accumulator (unknown rounding simulated as RNE);
    # with a promotion, acc_bits in the measured mode inside blocks and the wider sum across
    # them, assumed RNE (partial sums of units inside a block are exact in the narrow one)
    mode = rounding if rounding != "unknown" else "rne"
    if promote:
        order, evidence["order"] = _order(pr, _fitted(sc, wide), min(wide, 52), "rne",
                                          (promote, acc_bits, mode))
    else:
        order, evidence["order"] = _order(pr, _fitted(sc, acc_bits), min(acc_bits or 52, 52),
                                          mode)
    return acc_bits, rounding, promote, order


def _fitted(sc: _Scales, p: int | None) -> _Scales:
    """The order probe's (big, unit) for a p-bit accumulator: B / U = 2^(p + 12), the units
    (512 U at most) under a quarter of B's ulp, with B = 2^14 where U stays >= 2^-12 (B within
    an fp16 accumulator's range; U normal in an fp16 output and a product of normal e4m3
    factors). B / U far beyond the accumulator's reach would bring in what acc_bits and
    acc_rounding do not describe: an fp16 accumulator overflows on B = 2^100, an adder that
    aligns addends in a window drops a unit 2^105 below B where a truncating one would step
    toward zero. The dtype's own scales where it cannot hold that ratio (e4m3) or p is unknown
    (None, the probe's limit)."""
    if p is None or p >= sc.max_t or p + 12 >= sc.big - sc.unit:
        return sc
    unit = max(2 - p, -12)
    return dataclasses.replace(sc, big=unit + p + 12, unit=unit)


def _batch_probe(sc: _Scales) -> torch.Tensor:
    """48 order-probe rows at n = 256 (+B at 0 or 255, -B at j, units elsewhere), values exact
    in the input dtype without factoring (_Scales.direct): their outputs depend on the
    summation tree, where random inputs rounded to a bf16 output rarely show a changed one."""
    n, big, unit = 256, 2.0 ** sc.direct[0], 2.0 ** sc.direct[1]
    rows = torch.full((48, n), unit, dtype=torch.float64)
    for r in range(48):
        i, j = (0, 1 + 11 * r) if r < 24 else (n - 1, 11 * (r - 24))  # j across all of n
        rows[r, i], rows[r, j] = big, -big
    return rows


_BATCHES = (1, 5, 16, 33)  # sub-batch sizes compared with the whole batch of 48


def _invariance(calls: dict) -> tuple[bool, str]:
    seen, bad = [], []
    for name, call in calls.items():
        full = call(slice(0, 48))
        for m in _BATCHES:
            d = _diff(call(slice(0, m)), full[:m])
            seen.append(f"{name} 0..{m - 1} as a batch of {m}")
            if d:
                bad.append(f"{seen[-1]} (max |diff| {d:.3g})")
        for i in (7, 47):
            d = _diff(call(slice(i, i + 1)), full[i:i + 1])
            seen.append(f"{name} {i} alone")
            if d:
                bad.append(f"{seen[-1]} (max |diff| {d:.3g})")
    if bad:
        return False, "against the batch of 48, differ: " + "; ".join(bad)
    return True, "against the batch of 48, bitwise equal: " + "; ".join(seen)


def _determinism(calls: dict, dtype: str) -> tuple[bool, str]:
    worst = []
    for name, call in calls.items():
        outs = [call(slice(0, 48)) for _ in range(_REPEATS)]
        if any(_diff(o, outs[0]) for o in outs[1:]):
            worst.append(f"{name}: max {_ulps(outs, dtype):.3g} ULP of {dtype} apart")
    if worst:
        return False, f"{_REPEATS} runs of the same inputs differ: " + "; ".join(worst)
    return True, f"{_REPEATS} runs of each input ({', '.join(calls)}): bitwise equal"


def _ulps(outs: list[torch.Tensor], dtype: str) -> float:
    """The largest difference between runs in ULPs of dtype at the first run's values."""
    f = formats.get(dtype)
    base = outs[0].detach().double().cpu()
    ulp = torch.exp2(torch.floor(torch.log2(base.abs().clamp_min(f.min_normal))) - f.mbits)
    return max(float(((o.detach().double().cpu() - base).abs() / ulp)
                     .nan_to_num(nan=math.inf).max()) for o in outs[1:])


# ---- records and the built-in suite --------------------------------------------------------------

def as_record(fp: Fingerprint, *, suite: str = "fingerprint") -> Record:
    """The fingerprint as a record (family "fingerprint", output "fingerprint", case id = the
    dtype): the six properties in ``metrics`` (what the golden row holds), the evidence in
    ``notes``. Judged by numcheck.forensics.fingerprint_rules."""
    from numcheck.measure import environment
    return Record(suite=suite, op=fp.op, kernel=fp.kernel, case_id=fp.dtype,
                  output="fingerprint", device_class=environment.device_class(fp.device),
                  platforms=_platform(fp.device),
                  dtype=fp.dtype, family="fingerprint", metrics=fp.properties(),
                  device=fp.device, notes=" | ".join(f"{k}: {v}" for k, v in fp.evidence.items()),
                  repro=f"numcheck fingerprint --op {fp.op} --kernel {fp.kernel} --dtype "
                        f"{fp.dtype} --device {fp.device}")


def _platform(device: str) -> str:
    """The golden platform id (golden.platform_of) plus what picks a CPU GEMM library's code
    path and ATen's tier does not name: the CPU's ISA flags and the ISA caps of oneDNN / MKL
    set in the environment (the same CPU name can hide AVX512-BF16 on a VM)."""
    import os

    from numcheck.measure import environment
    from numcheck.goldens import store as golden
    prov = environment.provenance(device)
    plat = golden.platform_of(prov)
    if torch.device(device).type != "cpu":
        return plat
    caps = [f"{k}={os.environ[k]}" for k in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                                             "MKL_ENABLE_INSTRUCTIONS") if os.environ.get(k)]
    return ", ".join([plat, prov.get("cpu_isa") or "?"] + caps)


# The widest shape each op's probes pass a kernel (rows x reduced length; sdpa: B, H, S, D).
_PROBE_SHAPE = {"matmul": (256, 512, 256), "linear": (256, 512, 256),
                "sdpa": (48, 2, 64, 64, 64), "softmax": (48, 4096), "log_softmax": (48, 4096),
                "rms_norm": (48, 4096), "layer_norm": (48, 4096)}


def suite_items(device: str) -> list[tuple[str, str, str, str | None]]:
    """(op, kernel name, dtype, skip reason or None) for every registered kernel of a probed op
    and every dtype its probe holds."""
    from numcheck.catalog import kernels
    dev = torch.device(device).type
    out = []
    for op, red in sorted(_REDUCTIONS.items()):
        for name, kern in sorted(kernels(op).items()):
            for dtype in red.dtypes:
                why = None
                if kern.devices is not None and dev not in kern.devices:
                    why = f"kernel {name} runs on {', '.join(kern.devices)}, not {dev}"
                elif kern.dtypes is not None and dtype not in kern.dtypes:
                    why = f"kernel {name} supports {', '.join(kern.dtypes)}, not {dtype}"
                elif kern.compiled:
                    why = (f"compiled kernel {name} is not fingerprinted: each probe shape "
                           f"would be a new graph")
                elif name == "triton" and dev == "cpu":  # numcheck.kernels.triton_builtin
                    why = ("Triton kernels run in Triton's interpreter on the CPU: their "
                           "fingerprint would be numpy's (fingerprinted compiled on CUDA)")
                elif kern.supports is not None:  # the kernel's own limits at a probe's shape
                    try:
                        why = kern.supports(Case(op, dtype, _PROBE_SHAPE[op], "normal", 0),
                                            device)
                    except Exception:  # a constraint written for its op's grid: probe anyway
                        why = None
                out.append((op, name, dtype, why))
    return out


def suite_record(op: str, kernel: str, dtype: str, device: str, skip: str | None,
                 fn=None) -> Record:
    """One item of the built-in suite: the fingerprint's record, a skipped record, or an error
    record naming the probe the kernel failed on. fn: the kernel (default: the registered
    kernel named ``kernel``)."""
    if skip:
        return Record(suite="fingerprint", op=op, kernel=kernel, case_id=dtype,
                      output="fingerprint", dtype=dtype, family="fingerprint",
                      status=Status.SKIPPED, reason=skip, device=device)
    from numcheck.measure import environment

    def failed(status: Status, reason: str, known: str = "") -> Record:
        return Record(suite="fingerprint", op=op, kernel=kernel, case_id=dtype,
                      output="fingerprint", dtype=dtype, family="fingerprint",
                      device_class=environment.device_class(device), status=status,
                      reason=reason, device=device, known=known)
    try:
        return as_record(fingerprint(op, kernel if fn is None else fn, dtype=dtype,
                                     device=device, kernel_name=kernel))
    except Exception as exc:  # noqa: BLE001 - sorted as run.py sorts a case's failure
        known = environment.known_failure(str(exc))
        if known is not None:   # the torch build's or the machine's: docs/findings.md
            from numcheck.verdicts.findings import cite
            return failed(Status.KNOWN, f"known environment failure {cite(known)}: "
                          f"{type(exc).__name__}: {exc}", known)
        if isinstance(exc, UsageError):   # a probe the kernel failed on
            return failed(Status.ERROR, str(exc))
        raise
