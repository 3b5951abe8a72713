"""The package's layering, checked on the source: every module belongs to a layer and imports only from its own
layer or below (including imports inside functions), a few packages stay apart, no module imports another in a
cycle, and no module grows past 500 lines.

Imports are read with `ast` at any depth; those under `if TYPE_CHECKING:` are left out (they never run). Names
imported by string (the strategy registry, the command table, learntok.viz's lazy exports) stay inside their own
package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "learntok"

LAYERS = (
    ("foundations", ("version", "errors", "atomic", "vocab", "bpb", "device", "records")),
    ("nn", ("nn",)),
    ("data", ("data",)),
    ("boundaries", ("entropy_model", "boundaries")),
    ("config", ("config", "config_file", "presets", "data.planted")),
    ("model", ("model", "checkpoint", "draw")),
    ("train", ("train",)),
    ("use", ("viz", "generation")),
    ("share", ("card", "hf_files", "pretrained", "tokenizer", "segment", "hub", "transformers_model")),
    ("evaluation", ("evaluation",)),
    ("interface", ("cli", "__main__", "__init__")),
)
"""Bottom to top: layer -> its modules and packages (names under learntok; `__init__` is the package's own
module, the public API). The most specific name wins: data.planted (which builds a DataConfig) sits above data."""

APART = {
    "data": ("boundaries",),
    "model": ("data",),
    "evaluation": ("train", "generation", "viz"),
}
"""Packages the order alone would let import each other but that must not: package -> what it must not import."""


def _modules() -> list[Path]:
    """Source files of the package (models/ holds bundled model directories: data, not modules)."""
    return sorted(p for p in SRC.rglob("*.py") if "models" not in p.relative_to(SRC).parts[:1])


def _name(path: Path) -> str:
    """A source file's module name under learntok: `data.planted`, `viz` (a package), `__init__` (learntok)."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


NAMES = {_name(p) for p in _modules()}


def _layer(name: str) -> int:
    """Index in LAYERS of the most specific entry naming `name` or a package above it."""
    hits = [(len(entry), i) for i, (_, entries) in enumerate(LAYERS) for entry in entries
            if name == entry or name.startswith(entry + ".")]
    if not hits:
        raise KeyError(f"learntok.{name} is in no layer: add it to LAYERS")
    return max(hits)[1]


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _resolve(dotted: str) -> str | None:
    """The learntok module a dotted name imports (its longest existing prefix), or None outside learntok."""
    parts = dotted.split(".")
    if parts[0] != "learntok":
        return None
    parts = parts[1:]
    while parts and ".".join(parts) not in NAMES:
        parts.pop()
    return ".".join(parts) or "__init__"


def _imports(path: Path) -> set[str]:
    """Every learntok module the file imports, at any depth (`from learntok.data import x` -> data, `from learntok
    import segment` -> segment), TYPE_CHECKING-only imports left out."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {_resolve(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out |= {_resolve(f"{node.module}.{a.name}") for a in node.names}
    out.discard(None)
    return out


GRAPH = {(n := _name(p)): _imports(p) - {n} for p in _modules()}


def test_every_module_is_in_a_layer_and_every_entry_is_a_module():
    assert {n: _layer(n) for n in NAMES}
    entries = [e for _, es in LAYERS for e in es]
    assert len(entries) == len(set(entries)) and set(entries) <= NAMES


@pytest.mark.parametrize("layer", [name for name, _ in LAYERS])
def test_no_upward_imports(layer):
    level = [name for name, _ in LAYERS].index(layer)
    bad = {m: sorted(i for i in GRAPH[m] if _layer(i) > level) for m in GRAPH if _layer(m) == level}
    assert not {m: v for m, v in bad.items() if v}


@pytest.mark.parametrize("package", sorted(APART))
def test_apart(package):
    def top(name):
        return name.split(".")[0]

    bad = {m: sorted(i for i in GRAPH[m] if top(i) in APART[package]) for m in GRAPH if top(m) == package}
    assert not {m: v for m, v in bad.items() if v}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (module -> modules it imports) as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m))), None)


def test_no_import_cycles():
    assert _cycle(GRAPH) is None


def test_the_checker_sees_lazy_imports_and_cycles(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from learntok.model import ByteLM\n"
                 "def f():\n    from learntok.train import train\n    import learntok.viz.render\n"
                 "    from learntok import segment, __version__\n")
    assert _imports(f) == {"train", "viz.render", "segment", "__init__"}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_module_over_500_lines():
    long = {str(p.relative_to(SRC)): n for p in _modules() if (n := len(p.read_text().splitlines())) > 500}
    assert not long
