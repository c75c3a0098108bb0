"""The markers CI selects by: a test that compiles kernels for sm_90 with Triton's own compiler
(tests/sm90.py, minutes of CPU each) is marked ``sm90`` and ``slow``, and only such a test is.
.ci/run compiles them once, with the Triton the GPU machine runs (3.6), and leaves them out of
the slow run under the newest Triton; a compiling test without the mark would run under the
newest only, one with a stale mark would be skipped by the slow run for nothing.

Which tests compile is read from the source: a test function that calls one of the compilers
(:data:`COMPILERS`), or calls a function of the test tree that does, by name, however deep."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: the functions of tests/ that run Triton's compiler for sm_90
COMPILERS = {"compile_sm90"}


def _called(fn: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return names


def _marks(fn: ast.FunctionDef) -> set[str]:
    out = set()
    for d in fn.decorator_list:
        node = d.func if isinstance(d, ast.Call) else d
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
            out.add(node.attr)
    return out


def _functions() -> list[tuple[Path, ast.FunctionDef]]:
    out = []
    for path in sorted(TESTS.rglob("*.py")):
        if "golden" in path.parts:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        out += [(path, n) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    return out


def _compiling(functions) -> set[str]:
    """Every function name of the tree that reaches a compiler through calls by name."""
    reach = set(COMPILERS)
    calls = {}
    for _, fn in functions:
        calls.setdefault(fn.name, set()).update(_called(fn))
    grown = True
    while grown:
        grown = False
        for name, called in calls.items():
            if name not in reach and called & reach:
                reach.add(name)
                grown = True
    return reach


def test_every_test_that_compiles_for_sm90_is_marked_sm90_and_slow_and_only_those():
    functions = _functions()
    reach = _compiling(functions)
    tests = {(p.relative_to(TESTS).as_posix(), fn.name): _marks(fn) for p, fn in functions
             if fn.name.startswith("test_")}
    compiling = {key for key in tests if key[1] in reach}
    marked = {key for key, marks in tests.items() if "sm90" in marks}
    assert len(compiling) >= 15  # (the reader finds them: the renderers' compile checks)
    assert compiling - marked == set(), "compile for sm_90 without @pytest.mark.sm90"
    assert marked - compiling == set(), "marked sm90 but compile nothing"
    assert {key for key in marked if "slow" not in tests[key]} == set(), "marked sm90 but not slow"
