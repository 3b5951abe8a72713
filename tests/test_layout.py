"""The package's layering, checked on the source: lower layers never import upper ones (including imports
inside functions), and no module grows past 500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "learntok"

FORBIDDEN = {
    "nn": ("boundaries", "model", "config", "data", "train", "evaluation", "generation", "viz", "cli"),
    "boundaries": ("model", "train", "evaluation", "generation", "viz", "cli", "config"),
    "model": ("train", "evaluation", "generation", "viz", "cli", "data"),
    "data": ("model", "train", "evaluation", "generation", "viz", "cli", "boundaries"),
    "train": ("evaluation", "generation", "viz", "cli"),
    "evaluation": ("train", "generation", "viz", "cli"),
    "viz": ("cli",),
}
"""Package (or module) under learntok -> the learntok packages it must not import."""


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py"))


def _learntok_imports(path: Path) -> set[str]:
    """First component after `learntok.` of every learntok import in the file, at any depth."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "learntok" and len(parts) > 1:
                out.add(parts[1])
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_upward_imports(layer):
    files = [p for p in _modules() if p.relative_to(SRC).parts[0] in (layer, f"{layer}.py")]
    assert files, layer
    bad = {str(p.relative_to(SRC)): sorted(_learntok_imports(p) & set(FORBIDDEN[layer])) for p in files}
    assert not {k: v for k, v in bad.items() if v}


def test_the_checker_sees_lazy_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from learntok.train import train\n    import learntok.viz.render\n")
    assert _learntok_imports(f) == {"train", "viz"}


def test_no_module_over_500_lines():
    long = {str(p.relative_to(SRC)): n for p in _modules() if (n := len(p.read_text().splitlines())) > 500}
    assert not long
