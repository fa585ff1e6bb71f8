"""The package's import graph: no cycles, no private names taken from another module.

Every ``import`` in numcheck counts, function-level ones included (a lazy import still couples
two modules at run time); only imports under ``if TYPE_CHECKING:`` are left out. A private name
is one with a single leading underscore (``_round``), reached by ``from m import _x`` or as
``m._x`` on a module bound by an import.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import numcheck
from numcheck.goldens import store as golden
from numcheck.measure.errorstats import ErrorStats
from numcheck.records import Record, Status

PKG = Path(numcheck.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(mod: str, is_pkg: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


class _Imports(ast.NodeVisitor):
    def __init__(self, mod: str, is_pkg: bool, modules: set[str]):
        self.mod, self.is_pkg, self.modules = mod, is_pkg, modules
        self.edges: set[str] = set()
        self.private: list[str] = []
        self.aliases: dict[str, str] = {}  # local name -> numcheck module

    def _known(self, name: str) -> str | None:
        while name and name not in self.modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for n in node.orelse:
                self.visit(n)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            target = self._known(a.name)
            if target:
                self.edges.add(target)
                if a.asname:
                    self.aliases[a.asname] = a.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve(self.mod, self.is_pkg, node.level, node.module)
        if not base.startswith("numcheck"):
            return
        for a in node.names:
            sub = f"{base}.{a.name}"
            if sub in self.modules:  # `from . import fp8`: the submodule itself
                self.edges.add(sub)
                self.aliases[a.asname or a.name] = sub
                continue
            target = self._known(base)
            if target:
                self.edges.add(target)
            if a.name.startswith("_") and not a.name.startswith("__") and target != self.mod:
                self.private.append(f"{self.mod}:{node.lineno} imports {a.name} from {target}")

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "import_module" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                target = self._known(_resolve(self.mod, self.is_pkg, len(arg.value) -
                                              len(arg.value.lstrip(".")), arg.value.lstrip(".")))
                if target:
                    self.edges.add(target)
            elif any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(arg)):
                # importlib.import_module(f"{__name__}.x"): an edge no reader can see
                self.private.append(f"{self.mod}:{node.lineno} imports a computed module name")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.aliases and \
                node.attr.startswith("_") and not node.attr.startswith("__"):
            self.private.append(f"{self.mod}:{node.lineno} uses "
                                f"{self.aliases[node.value.id]}.{node.attr}")
        self.generic_visit(node)


def import_graph() -> tuple[dict[str, set[str]], list[str]]:
    files = {(_module_name(p), p) for p in PKG.rglob("*.py")}
    modules = {m for m, _ in files}
    graph, private = {}, []
    for mod, path in sorted(files):
        v = _Imports(mod, path.name == "__init__.py", modules)
        v.visit(ast.parse(path.read_text(), str(path)))
        graph[mod] = v.edges - {mod}
        private += v.private
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walker_sees_a_cycle_and_a_private_import():
    """The checks can fail: a planted two-module cycle and a private import are found."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    v = _Imports("numcheck.x", False, {"numcheck.x", "numcheck.formats"})
    v.visit(ast.parse("from . import formats as f\nfrom .formats import _round\nf._grid\n"))
    assert len(v.private) == 2 and v.edges == {"numcheck.formats"}


def test_no_import_cycles():
    found = cycles(import_graph()[0])
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_private_names_from_other_modules():
    private = import_graph()[1]
    assert not private, "private names used across modules:\n" + "\n".join(private)


# The commands that read parquet, in a fresh interpreter: the modules they loaded.
_READERS = """
import sys
from numcheck.frontends.cli import main
old, new, results, report = sys.argv[1:]
codes = [main(["compare", old, new]), main(["compare", "--all", old, new]), main(["show", old]),
         main(["report", results]), main(["report", results, "--out", report])]
print(codes, sorted(m for m in ("torch", "hypothesis", "pandas", "scipy", "matplotlib")
                    if m in sys.modules))
"""


def _row(case: str, rel: float) -> Record:
    stats = ErrorStats("bf16", 512, 512, 0, 0, 0, 4 * rel, rel, rel, 60.0, 1.0, 0.0, 1, 0.2, 1,
                       0.0, 0.0, 57.0, 0, 4)
    return Record(suite="s", op="rms_norm", kernel="torch", case_id=case, status=Status.PASSED,
                  input_digest="ab", u=2.0 ** -8, kernel_stats=stats, baseline_stats=stats,
                  platforms="cpu, AVX2, torch 2.13.0+cpu")


def test_readers_of_parquet_leave_torch_alone(tmp_path):
    """numcheck compare, show and report on ops goldens and results import neither torch nor
    hypothesis, nor pandas, scipy, matplotlib: `numcheck compare` of two 100k-row goldens is
    a second (bench/bench_golden_compare.py), torch's import alone two or more."""
    files = [tmp_path / f for f in ("old.parquet", "new.parquet", "results.parquet", "r.md")]
    for path, records in ((files[0], [_row("a", 1e-3), _row("b", 1e-3), _row("gone", 1e-3)]),
                          (files[1], [_row("a", 1e-3), _row("b", 3e-3), _row("c", 1e-3)])):
        golden.write(golden.GoldenFile(path),
                     {golden.key_of(r): r for r in map(golden.to_row, records)}, {})
    golden.write_results(files[2], [_row("b", 3e-3)], {"device_class": "cpu"})
    out = subprocess.run([sys.executable, "-c", _READERS, *map(str, files)], capture_output=True,
                         text=True, check=True).stdout.splitlines()[-1]
    codes, loaded = out.split("] ")
    assert json.loads(codes + "]") == [1, 1, 0, 0, 0]
    assert loaded == "[]", f"a reader of parquet imported {loaded}"


def test_import_numcheck_loads_its_public_names_on_first_use():
    """``import numcheck`` is cheap; the public contract's names are all there, each what its
    module defines."""
    import numcheck as nc
    from numcheck import catalog, formats, verification

    from numcheck.verdicts import policy
    from numcheck.measure import stats
    for name in nc.__all__:
        assert getattr(nc, name) is not None and name in dir(nc)
    assert nc.round_to is formats.round_to and nc.verify is verification.verify
    assert nc.kernel is catalog.kernel and nc.Policy is policy.Policy
    assert nc.ErrorStats is stats.ErrorStats and nc.error_stats is stats.error_stats
    with pytest.raises(AttributeError):
        getattr(nc, "no_such_name")


if __name__ == "__main__":  # python tests/test_imports.py: print the graph's cycles and leaks
    g, p = import_graph()
    for c in cycles(g):
        print(f"cycle ({len(c)}): {' '.join(c)}")
    print("\n".join(p))
    pytest.main([__file__, "-q"])
