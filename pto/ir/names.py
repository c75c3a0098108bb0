"""The one registry of names: which names a program may declare, and how variants are named.

Every name a user declares (functions, parameters, tiles, dims, tensors, scalars, lets, loop
variables) must be a name that the text form, expression text, C and Python (Triton kernels)
can all carry. The builders, the verifiers (and so the text parser) check names here and
nowhere else.
"""

from __future__ import annotations

import keyword
import re

from pto.errors import BuildError
from pto.ir.evaluation import FUNCS

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# words the expression syntax gives a meaning (operators, constants, functions), the text form's
# `loc`, and Python's keywords (kernels are Python)
EXPR_WORDS = frozenset({"and", "or", "not", "min", "max", "inf", "nan", "true", "false"}) | frozenset(FUNCS)
RESERVED = EXPR_WORDS | frozenset({"loc"}) | frozenset(keyword.kwlist)

# a leading `__` is kept for names the code generators make up (C's `__d_R` for a callee dim)
INTERNAL_PREFIX = "__"

# a variant of an InCore function is named base + `__` + its dim values (`softmax_tile__R64`),
# so a function's own name may not contain it
VARIANT_SEP = "__"


def check_name(name: object, what: str, owner: str | None = None, function: bool = False) -> str:
    """Return ``name`` if a program may declare it as ``what`` (inside ``owner``), else raise a
    BuildError saying why."""
    where = f" in `{owner}`" if owner else ""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise BuildError(f"{what} name {name!r}{where} is not an identifier")
    if name in RESERVED:
        raise BuildError(f"{what} name `{name}`{where} is a reserved word")
    if name.startswith(INTERNAL_PREFIX):
        raise BuildError(f"{what} name `{name}`{where} starts with `{INTERNAL_PREFIX}`, which is kept for "
                         "generated names")
    if function and VARIANT_SEP in name:
        raise BuildError(f"{what} name `{name}` contains `{VARIANT_SEP}`, which separates a variant's "
                         "dims (`f__R64`)")
    return name


def fresh_name(base: str, taken: set[str], sep: str = "") -> str:
    """``base``, or ``base`` + ``sep`` + the first count from 2 that is not in ``taken``; added
    to ``taken``."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{sep}{k}"
    taken.add(name)
    return name


def variant_name(name: str, variant: tuple[tuple[str, int], ...]) -> str:
    """``name`` plus the dim values of a variant: ``softmax_tile__R64`` (``name`` without any)."""
    if not variant:
        return name
    return name + VARIANT_SEP + "_".join(f"{k}{v}" for k, v in variant)


def base_name(name: str) -> str:
    """The InCore function a variant name belongs to, for readers that only have the name as
    text (a runtime dump); anything holding the IncoreFunction reads its ``name``."""
    return name.split(VARIANT_SEP, 1)[0]


__all__ = ["RESERVED", "EXPR_WORDS", "INTERNAL_PREFIX", "VARIANT_SEP", "check_name", "variant_name",
           "base_name"]
