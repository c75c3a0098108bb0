"""Scalar expressions: offsets, extents, loop bounds and conditions.

An expression is an immutable tree of :class:`Const`, :class:`Var`, :class:`Attr` (``x.rows``:
the valid rows of a memref region, or the tile height of an adaptive loop) and :class:`Bin`
nodes. Python operators build them (``i * 32 + 1``, ``(n + 31) // 32``, ``i < n``); ``==`` stays
structural equality, so use :func:`eq` / :func:`ne` for comparisons that yield 0 or 1.

Semantics are those of Python integers: ``//`` and ``%`` floor (renderers to C and Triton
emit floor-division helpers), comparisons and ``and``/``or`` yield 0 or 1 (the value tables are
in :mod:`pto.ir.evaluation`). Floats appear only as constants of tile-scalar ops.

Here too: constant folding, substitution, evaluation and the infix
text (:func:`format_expr`, what ``str(e)`` and every message print). Expression *text* is not
accepted here; the builders parse it (:func:`pto.builder.common.expr_of`). Symbolic interval
bounds: :mod:`pto.ir.bounds`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Union

from pto.errors import BuildError
from pto.ir.evaluation import EVAL, FUNCS, bx_blocks, bx_count, bx_size, bx_start

Number = Union[int, float]


def _binary(op: str, reflected: bool = False):
    """The operator method that builds ``self op other`` (``other op self`` when ``reflected``)."""
    if reflected:
        return lambda self, o: binop(op, o, self)
    return lambda self, o: binop(op, self, o)


class Expr:
    """Base class; subclasses are frozen dataclasses so that equal trees compare equal."""

    __slots__ = ()

    # arithmetic and comparisons (``==`` stays structural: :func:`eq`) --------------------------
    __add__, __radd__ = _binary("+"), _binary("+", True)
    __sub__, __rsub__ = _binary("-"), _binary("-", True)
    __mul__, __rmul__ = _binary("*"), _binary("*", True)
    __floordiv__, __rfloordiv__ = _binary("//"), _binary("//", True)
    __mod__, __rmod__ = _binary("%"), _binary("%", True)
    __lt__, __le__, __gt__, __ge__ = _binary("<"), _binary("<="), _binary(">"), _binary(">=")

    def __neg__(self):
        return binop("-", Const(0), self)

    def __bool__(self):
        raise BuildError(
            f"scalar expression `{self}` has no truth value while the program is being built; "
            "use the builder's if_/else_ for run-time conditions"
        )

    def __str__(self) -> str:
        return format_expr(self)

    # queries ---------------------------------------------------------------------------------
    def free_vars(self) -> set[str]:
        out: set[str] = set()
        _collect(self, out)
        return out


@dataclass(frozen=True, eq=True, slots=True)
class Const(Expr):
    value: Number

    def __repr__(self) -> str:
        return f"Const({self.value!r})"


@dataclass(frozen=True, eq=True, slots=True)
class Var(Expr):
    name: str

    def __repr__(self) -> str:
        return f"Var({self.name!r})"

    @property
    def rows(self) -> Attr:
        """``i.rows``: the current tile height of adaptive loop ``i``."""
        return Attr(self.name, "rows")


@dataclass(frozen=True, eq=True, slots=True)
class Attr(Expr):
    """``base.field``: ``x.rows`` / ``x.cols`` (valid extent of memref ``x``'s region inside an
    InCore function) or ``i.rows`` (current tile height of adaptive loop ``i``)."""

    base: str
    field: str

    def __repr__(self) -> str:
        return f"Attr({self.base!r}, {self.field!r})"


@dataclass(frozen=True, eq=True, slots=True)
class Bin(Expr):
    op: str
    a: Expr
    b: Expr

    def __repr__(self) -> str:
        return f"Bin({self.op!r}, {self.a!r}, {self.b!r})"


@dataclass(frozen=True, eq=True, slots=True)
class Fn(Expr):
    """An integer intrinsic ``name(args...)`` from :data:`FUNCS` (``select``, and the block
    functions of binary expansion)."""

    name: str
    args: tuple[Expr, ...]

    def __repr__(self) -> str:
        return f"Fn({self.name!r}, {self.args!r})"


ARITH_OPS = ("+", "-", "*", "//", "%")
CMP_OPS = ("<", "<=", ">", ">=", "==", "!=")
LOGIC_OPS = ("and", "or")
FUNC_OPS = ("min", "max")
BIN_OPS = ARITH_OPS + CMP_OPS + LOGIC_OPS + FUNC_OPS

# what the expression constructors take; text (``"tile_i * 32"``) only at the builders' entry
# points, which parse it (pto.builder.common.expr_of)
ExprLike = Union[Expr, int, float]


def as_expr(x: ExprLike) -> Expr:
    """Turn an int, a float or an expression into an Expr (numpy numbers too)."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(int(x))
    if isinstance(x, numbers.Integral):
        return Const(int(x))
    if isinstance(x, numbers.Real):
        return Const(float(x))
    if isinstance(x, str):
        raise BuildError(f"expected a scalar expression, got the text {x!r} (the builders parse expression "
                         "text; elsewhere use pto.parse_expr)")
    raise BuildError(f"expected a scalar expression, got {type(x).__name__} {x!r}")


def binop(op: str, a: ExprLike, b: ExprLike) -> Expr:
    if op not in BIN_OPS:
        raise BuildError(f"unknown scalar operator {op!r}")
    return fold(Bin(op, as_expr(a), as_expr(b)))


def emin(a: ExprLike, b: ExprLike, *more: ExprLike) -> Expr:
    out = binop("min", a, b)
    for m in more:
        out = binop("min", out, m)
    return out


def emax(a: ExprLike, b: ExprLike, *more: ExprLike) -> Expr:
    out = binop("max", a, b)
    for m in more:
        out = binop("max", out, m)
    return out


def eq(a: ExprLike, b: ExprLike) -> Expr:
    return binop("==", a, b)


def ne(a: ExprLike, b: ExprLike) -> Expr:
    return binop("!=", a, b)


def land(a: ExprLike, b: ExprLike) -> Expr:
    return binop("and", a, b)


def lor(a: ExprLike, b: ExprLike) -> Expr:
    return binop("or", a, b)


def cdiv(a: ExprLike, b: ExprLike) -> Expr:
    """Ceiling division ``(a + b - 1) // b`` for positive b."""
    a, b = as_expr(a), as_expr(b)
    return (a + b - 1) // b


def fn(name: str, *args: ExprLike) -> Expr:
    """Build an intrinsic call, folding it when every argument is constant."""
    if name not in FUNCS:
        raise BuildError(f"unknown scalar function `{name}` (known: {', '.join(FUNCS)})")
    arity = FUNCS[name][0]
    if len(args) != arity:
        raise BuildError(f"`{name}` takes {arity} arguments, got {len(args)}")
    return fold(Fn(name, tuple(as_expr(a) for a in args)))


def select(cond: ExprLike, a: ExprLike, b: ExprLike) -> Expr:
    """``a`` where ``cond`` is non-zero, else ``b``."""
    return fn("select", cond, a, b)


# text ------------------------------------------------------------------------------------------

# binding strength of the infix operators (min and max print as calls)
PREC = {"or": 1, "and": 2, "<": 3, "<=": 3, ">": 3, ">=": 3, "==": 3, "!=": 3,
        "+": 4, "-": 4, "*": 5, "//": 5, "%": 5}


def format_number(v) -> str:
    """A constant as the text form writes it (``true``, ``-inf``, ``0.5``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(float(v))


def format_expr(e: Expr, bare: bool = False) -> str:
    """Infix text of an expression, parenthesized only where precedence needs it; names are
    written ``%name`` (the text form) or, with ``bare``, as they are."""
    sig = "" if bare else "%"
    if isinstance(e, Const):
        return format_number(e.value)
    if isinstance(e, Var):
        return sig + e.name
    if isinstance(e, Attr):
        return f"{sig}{e.base}.{e.field}"
    if isinstance(e, Fn):
        return f"{e.name}({', '.join(format_expr(a, bare) for a in e.args)})"
    if isinstance(e, Bin):
        if e.op in ("min", "max"):
            return f"{e.op}({format_expr(e.a, bare)}, {format_expr(e.b, bare)})"
        p = PREC[e.op]
        a = format_expr(e.a, bare)
        b = format_expr(e.b, bare)
        if isinstance(e.a, Bin) and e.a.op in PREC and PREC[e.a.op] < p:
            a = f"({a})"
        if isinstance(e.a, Const) and e.a.value < 0 and p >= PREC["*"]:
            a = f"({a})"
        if isinstance(e.b, Bin) and e.b.op in PREC and PREC[e.b.op] <= p:
            b = f"({b})"
        if isinstance(e.b, Const) and e.b.value < 0:
            b = f"({b})"
        return f"{a} {e.op} {b}"
    raise TypeError(e)


# evaluation, substitution, folding ----------------------------------------------------------

def evaluate(e: Expr, env: dict):
    """Evaluate with ``env`` mapping variable names (and ``"base.field"`` for Attr) to values.

    Values may be Python numbers or torch tensors (vectorized evaluation over a batch of tasks).
    A missing name raises BuildError naming it.
    """
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        try:
            return env[e.name]
        except KeyError:
            raise BuildError(f"scalar `{e.name}` has no value here") from None
    if isinstance(e, Attr):
        key = f"{e.base}.{e.field}"
        try:
            return env[key]
        except KeyError:
            raise BuildError(f"`{key}` has no value here") from None
    if isinstance(e, Bin):
        return EVAL[e.op](evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, Fn):
        return FUNCS[e.name][1](*(evaluate(a, env) for a in e.args))
    raise TypeError(f"not an expression: {e!r}")


def const_value(e: Expr):
    """The value of an expression without free variables, else None."""
    e = fold(e)
    return e.value if isinstance(e, Const) else None


def _collect(e: Expr, out: set[str]) -> None:
    if isinstance(e, Var):
        out.add(e.name)
    elif isinstance(e, Attr):
        out.add(f"{e.base}.{e.field}")
    elif isinstance(e, Bin):
        _collect(e.a, out)
        _collect(e.b, out)
    elif isinstance(e, Fn):
        for a in e.args:
            _collect(a, out)


def substitute(e: Expr, mapping: dict[str, Expr]) -> Expr:
    """Replace variables (and ``"base.field"`` attrs) by expressions, then fold constants."""
    if isinstance(e, Var):
        return mapping.get(e.name, e)
    if isinstance(e, Attr):
        return mapping.get(f"{e.base}.{e.field}", e)
    if isinstance(e, Bin):
        a, b = substitute(e.a, mapping), substitute(e.b, mapping)
        if a is e.a and b is e.b:
            return e
        return fold(Bin(e.op, a, b))
    if isinstance(e, Fn):
        args = tuple(substitute(a, mapping) for a in e.args)
        return fold(Fn(e.name, args))
    return e


def fold(e: Expr) -> Expr:
    """Constant folding and the identities that keep generated code readable."""
    if isinstance(e, Fn):
        if all(isinstance(a, Const) for a in e.args):
            return Const(FUNCS[e.name][1](*(a.value for a in e.args)))
        if e.name == "select":
            c, a, b = e.args
            if a == b:
                return a
            if isinstance(c, Const):
                return a if c.value else b
        return e
    if not isinstance(e, Bin):
        return e
    a, b, op = e.a, e.b, e.op
    if isinstance(a, Const) and isinstance(b, Const):
        try:
            v = EVAL[op](a.value, b.value)
        except ZeroDivisionError as err:
            raise BuildError(f"`{format_expr(e)}`: {err}") from None
        return Const(v)
    if op == "+":
        if _is_const(a, 0):
            return b
        if _is_const(b, 0):
            return a
    elif op == "-":
        if _is_const(b, 0):
            return a
        if a == b:
            return Const(0)
    elif op == "*":
        if _is_const(a, 1):
            return b
        if _is_const(b, 1):
            return a
        if (_is_const(a, 0) or _is_const(b, 0)) and not _has_float(e):
            return Const(0)
    elif op == "//":
        if _is_const(b, 1):
            return a
    elif op in ("min", "max") and a == b:
        return a
    return e


def _is_const(e: Expr, v) -> bool:
    return isinstance(e, Const) and e.value == v and not isinstance(e.value, bool)


def _has_float(e: Expr) -> bool:
    if isinstance(e, Const):
        return isinstance(e.value, float)
    if isinstance(e, Bin):
        return _has_float(e.a) or _has_float(e.b)
    if isinstance(e, Fn):
        return any(_has_float(a) for a in e.args)
    return False


def is_int_expr(e: Expr) -> bool:
    """True when no float constant occurs in ``e``."""
    return not _has_float(e)


__all__ = [
    "Expr", "Const", "Var", "Attr", "Bin", "Fn", "ExprLike", "BIN_OPS", "CMP_OPS", "LOGIC_OPS", "FUNCS",
    "as_expr", "binop", "emin", "emax", "eq", "ne", "land", "lor", "cdiv", "fn", "select",
    "evaluate", "const_value", "substitute", "fold", "is_int_expr", "format_expr", "format_number",
    "bx_blocks", "bx_count", "bx_start", "bx_size",
]
