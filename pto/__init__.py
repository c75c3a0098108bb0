"""pto: a task-graph runtime and orchestration code generator for tiled (PTO-style) programs.

The user-facing API:

- :class:`InCore` builds tile kernels (InCore functions) from the tile ISA (:class:`Op`);
- :class:`Orchestration` builds the program that calls them on regions of whole tensors;
- a :class:`Module` holds both, prints as text (:func:`format_module`) and parses back
  (:func:`parse_module`, which verifies it like :func:`verify_module`);
- :mod:`pto.interp` runs modules with the reference interpreter (the oracle).
"""

from pathlib import Path as _Path

from pto import layout as _layout

# incore/, orchestration/ and runtime_c/ are pto.incore, pto.orchestration and pto.runtime_c in a
# plain checkout too (pto/layout.py says how, installed or not)
_layout.install(_Path(__file__).resolve().parent)

# The names below are imported on first use (PEP 562): ``import pto.cli`` then costs no compiler
# import, so the command line answers a typo at once and catches Ctrl-C from its first line on
_EXPORTS = {
    "InCore": "pto.builder", "Orchestration": "pto.builder",
    "BuildError": "pto.errors", "ParseError": "pto.errors", "PTOError": "pto.errors",
    "DType": "pto.ir.dtypes", "bf16": "pto.ir.dtypes", "f16": "pto.ir.dtypes", "f32": "pto.ir.dtypes",
    **dict.fromkeys(("Expr", "Var", "cdiv", "emax", "emin", "eq", "land", "lor", "ne"), "pto.ir.expr"),
    "IncoreFunction": "pto.ir.nodes", "Module": "pto.ir.nodes", "OrchFunction": "pto.ir.nodes",
    "Op": "pto.ir.ops", "verify_module": "pto.ir.verify",
    "format_module": "pto.text", "parse_expr": "pto.text", "parse_module": "pto.text",
    "__version__": "pto.version",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pto' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "InCore", "Orchestration", "Module", "IncoreFunction", "OrchFunction", "Op",
    "DType", "f32", "f16", "bf16", "Expr", "Var", "cdiv", "emin", "emax", "eq", "ne", "land", "lor",
    "PTOError", "BuildError", "ParseError", "parse_module", "parse_expr", "format_module", "verify_module",
    "__version__",
]
