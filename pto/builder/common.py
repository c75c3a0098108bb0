"""Pieces shared by the two builders: source locations and name checks."""

from __future__ import annotations

import keyword
import os
import re
import sys

from pto.errors import BuildError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PTO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# words the expression syntax gives a meaning (plus Python's keywords: kernels are Python)
RESERVED = frozenset({"and", "or", "not", "min", "max", "inf", "nan", "true", "false", "select",
                      "bx_count", "bx_start", "bx_size", "loc"}) | frozenset(keyword.kwlist)


def check_name(name: object, what: str, owner: str | None = None) -> str:
    """A user-facing name must be an identifier that the text form and C can carry."""
    where = f" in `{owner}`" if owner else ""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise BuildError(f"{what} name {name!r}{where} is not an identifier")
    if name in RESERVED:
        raise BuildError(f"{what} name `{name}`{where} is a reserved word")
    return name


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
