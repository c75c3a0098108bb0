"""pto: a task-graph runtime and orchestration code generator for tiled (PTO-style) programs.

The user-facing API:

- :class:`InCore` builds tile kernels (InCore functions) from the tile ISA (:class:`Op`);
- :class:`Orchestration` builds the program that calls them on regions of whole tensors;
- a :class:`Module` holds both, prints as text (``module.text()``) and parses back
  (:func:`parse_module`);
- :mod:`pto.interp` runs modules with the reference interpreter (the oracle).
"""

from pto.builder import InCore, Orchestration
from pto.errors import BuildError, ParseError, PTOError
from pto.ir.dtypes import DType, bf16, f16, f32
from pto.ir.expr import Expr, Var, cdiv, emax, emin, eq, land, lor, ne
from pto.ir.nodes import IncoreFunction, Module, OrchFunction
from pto.ir.ops import Op
from pto.text import parse_expr, parse_module

__version__ = "0.1.0"

__all__ = [
    "InCore", "Orchestration", "Module", "IncoreFunction", "OrchFunction", "Op",
    "DType", "f32", "f16", "bf16", "Expr", "Var", "cdiv", "emin", "emax", "eq", "ne", "land", "lor",
    "PTOError", "BuildError", "ParseError", "parse_module", "parse_expr",
]
