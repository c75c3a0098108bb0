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

from pto.builder import InCore, Orchestration  # noqa: E402
from pto.errors import BuildError, ParseError, PTOError  # noqa: E402
from pto.ir.dtypes import DType, bf16, f16, f32  # noqa: E402
from pto.ir.expr import Expr, Var, cdiv, emax, emin, eq, land, lor, ne  # noqa: E402
from pto.ir.nodes import IncoreFunction, Module, OrchFunction  # noqa: E402
from pto.ir.ops import Op  # noqa: E402
from pto.ir.verify import verify_module  # noqa: E402
from pto.text import format_module, parse_expr, parse_module  # noqa: E402
from pto.version import __version__  # noqa: E402

__all__ = [
    "InCore", "Orchestration", "Module", "IncoreFunction", "OrchFunction", "Op",
    "DType", "f32", "f16", "bf16", "Expr", "Var", "cdiv", "emin", "emax", "eq", "ne", "land", "lor",
    "PTOError", "BuildError", "ParseError", "parse_module", "parse_expr", "format_module", "verify_module",
    "__version__",
]
