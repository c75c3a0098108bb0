"""The shape of the house: pto/ir imports nothing above it (only itself and pto.errors), code
generation does not import the package front, and the IR, builder and text modules stay small."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PTO = Path(__file__).resolve().parent.parent / "pto"


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports (at any depth: lazy imports inside functions count), with
    its line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


@pytest.mark.parametrize("path", sorted((PTO / "ir").glob("*.py")), ids=lambda p: p.name)
def test_ir_imports_nothing_above_it(path):
    bad = [f"{path.name}:{line} imports {mod}" for line, mod in _imports(path)
           if (mod == "pto" or mod.startswith("pto.")) and not (mod.startswith("pto.ir") or mod == "pto.errors")]
    assert not bad, "; ".join(bad)


def test_codegen_does_not_import_the_package_front():
    assert all(mod != "pto" for _, mod in _imports(PTO / "codegen" / "c_orch.py"))


@pytest.mark.parametrize("path", sorted(p for d in ("ir", "builder", "text") for p in (PTO / d).glob("*.py")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_modules_stay_small(path):
    assert len(path.read_text().splitlines()) <= 500, f"{path} has more than 500 lines"
