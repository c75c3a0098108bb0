"""Pieces shared by the two builders: source locations and expression arguments.

Names are checked by the one registry, :mod:`pto.ir.names` (``check_name``, imported here for the
builders).
"""

from __future__ import annotations

import os
import sys

from pto.errors import BuildError, ParseError
from pto.ir.expr import Expr, ExprLike, as_expr
from pto.ir.names import check_name
from pto.text.expr_parser import parse_expr

_PTO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def expr_of(x: ExprLike | str) -> Expr:
    """An expression argument of a builder: an int, a float, an Expr or expression text
    (``"tile_i * 32"``, bare names), which is parsed here; the IR itself takes no text."""
    if isinstance(x, str):
        try:
            return parse_expr(x)
        except ParseError as err:
            raise BuildError(f"expression {x!r}: {err}") from None
    return as_expr(x)


def caller_loc() -> str | None:
    """``file:line`` of the first frame outside the pto package (the user's program line)."""
    f = sys._getframe(1)
    while f is not None:
        fname = os.path.abspath(f.f_code.co_filename)
        if os.path.basename(fname) == "contextlib.py":
            f = f.f_back
            continue
        if not fname.startswith(_PTO_DIR + os.sep) or "/incore/" in fname or "/orchestration/" in fname:
            return f"{os.path.basename(fname)}:{f.f_lineno}"
        f = f.f_back
    return None


__all__ = ["caller_loc", "check_name", "expr_of"]
