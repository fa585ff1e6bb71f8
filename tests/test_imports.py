"""The package's import graph: no cycles, no private names taken from another module.

Every ``import`` in numcheck counts, function-level ones included (a lazy import still couples
two modules at run time); only imports under ``if TYPE_CHECKING:`` are left out. A private name
is one with a single leading underscore (``_round``), reached by ``from m import _x`` or as
``m._x`` on a module bound by an import.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import numcheck

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


if __name__ == "__main__":  # python tests/test_imports.py: print the graph's cycles and leaks
    g, p = import_graph()
    for c in cycles(g):
        print(f"cycle ({len(c)}): {' '.join(c)}")
    print("\n".join(p))
    pytest.main([__file__, "-q"])
