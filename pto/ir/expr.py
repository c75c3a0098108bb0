"""Scalar expressions: offsets, extents, loop bounds and conditions.

An expression is an immutable tree of :class:`Const`, :class:`Var`, :class:`Attr` (``x.rows``:
the valid rows of a memref region, or the tile height of an adaptive loop) and :class:`Bin`
nodes. Python operators build them (``i * 32 + 1``, ``(n + 31) // 32``, ``i < n``); ``==`` stays
structural equality, so use :func:`eq` / :func:`ne` for comparisons that yield 0 or 1.

Semantics are those of Python integers: ``//`` and ``%`` floor (renderers to C and Triton
emit floor-division helpers), comparisons and ``and``/``or`` yield 0 or 1. Floats appear
only as constants of tile-scalar ops.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Union

from pto.errors import BuildError

Number = Union[int, float]


class Expr:
    """Base class; subclasses are frozen dataclasses so that equal trees compare equal."""

    __slots__ = ()

    # arithmetic -----------------------------------------------------------------------------
    def __add__(self, o):
        return binop("+", self, o)

    def __radd__(self, o):
        return binop("+", o, self)

    def __sub__(self, o):
        return binop("-", self, o)

    def __rsub__(self, o):
        return binop("-", o, self)

    def __mul__(self, o):
        return binop("*", self, o)

    def __rmul__(self, o):
        return binop("*", o, self)

    def __floordiv__(self, o):
        return binop("//", self, o)

    def __rfloordiv__(self, o):
        return binop("//", o, self)

    def __mod__(self, o):
        return binop("%", self, o)

    def __rmod__(self, o):
        return binop("%", o, self)

    def __neg__(self):
        return binop("-", Const(0), self)

    def __lt__(self, o):
        return binop("<", self, o)

    def __le__(self, o):
        return binop("<=", self, o)

    def __gt__(self, o):
        return binop(">", self, o)

    def __ge__(self, o):
        return binop(">=", self, o)

    def __bool__(self):
        raise BuildError(
            f"scalar expression `{self}` has no truth value while the program is being built; "
            "use the builder's if_/else_ for run-time conditions"
        )

    def __str__(self) -> str:
        from pto.text.printer import format_expr

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

ExprLike = Union[Expr, int, float, str]


def as_expr(x: ExprLike) -> Expr:
    """Turn an int, float, expression or expression text (``"tile_i * 32"``) into an Expr."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(int(x))
    if isinstance(x, int):
        return Const(int(x))
    if isinstance(x, float):
        return Const(float(x))
    if isinstance(x, str):
        from pto.text.parser import parse_expr

        return parse_expr(x)
    try:  # numpy integers and the like
        import numbers

        if isinstance(x, numbers.Integral):
            return Const(int(x))
        if isinstance(x, numbers.Real):
            return Const(float(x))
    except ImportError:  # pragma: no cover
        pass
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


# intrinsics ------------------------------------------------------------------------------------

def _select(c, a, b):
    if _is_scalar(c):
        return a if c else b
    import torch

    return torch.where(_as_t(c) != 0, _as_t(a), _as_t(b))


def bx_blocks(n: int, max_range: int, min_range: int) -> list[tuple[int, int]]:
    """Binary expansion of ``n`` base tiles: (start, size) of each block, in order.

    ``n // max_range`` full blocks of ``max_range``, then one block per set bit ``p`` of the
    remainder with ``min_range <= p < max_range`` (descending), then a residual block of the
    ``remainder % min_range`` last tiles (run with the base tile height).
    """
    n = max(int(n), 0)
    out = [(k * max_range, max_range) for k in range(n // max_range)]
    pos = (n // max_range) * max_range
    r = n % max_range
    p = max_range // 2
    while p >= min_range:
        if r & p:
            out.append((pos, p))
            pos += p
        p //= 2
    if r % min_range:
        out.append((pos, r % min_range))
    return out


def bx_count(n, max_range, min_range):
    n = max(int(n), 0)
    r = n % max_range
    return n // max_range + bin(r // min_range).count("1") + (1 if r % min_range else 0)


def _bx_block(n, k, max_range, min_range):
    n, k = max(int(n), 0), int(k)
    nfull = n // max_range
    if k < nfull:
        return k * max_range, max_range
    blocks = bx_blocks(n, max_range, min_range)
    if not 0 <= k < len(blocks):
        raise BuildError(f"bx block {k} out of range for n={n} (max {max_range}, min {min_range})")
    return blocks[k]


def bx_start(n, k, max_range, min_range):
    return _bx_block(n, k, max_range, min_range)[0]


def bx_size(n, k, max_range, min_range):
    return _bx_block(n, k, max_range, min_range)[1]


# name -> (arity, implementation); renderers to C keep a table of the same names
FUNCS = {
    "select": (3, _select),
    "bx_count": (3, bx_count),
    "bx_start": (4, bx_start),
    "bx_size": (4, bx_size),
}


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


# evaluation ------------------------------------------------------------------------------------

def _floordiv(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise ZeroDivisionError("integer division by zero in a scalar expression")
        return a // b
    return _tensor_op("floor_divide", a, b)


def _mod(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise ZeroDivisionError("integer modulo by zero in a scalar expression")
        return a % b
    return _tensor_op("remainder", a, b)


def _tensor_op(name, a, b):
    import torch

    return getattr(torch, name)(torch.as_tensor(a), torch.as_tensor(b))


def _min(a, b):
    if _is_scalar(a) and _is_scalar(b):
        return min(a, b)
    return _tensor_op("minimum", a, b)


def _max(a, b):
    if _is_scalar(a) and _is_scalar(b):
        return max(a, b)
    return _tensor_op("maximum", a, b)


def _is_scalar(v) -> bool:
    return isinstance(v, (int, float))


def _cmp(fn):
    def go(a, b):
        r = fn(a, b)
        return int(r) if isinstance(r, bool) else r.long() if hasattr(r, "long") else r

    return go


def _and(a, b):
    if _is_scalar(a) and _is_scalar(b):
        return int(bool(a) and bool(b))
    return ((_as_t(a) != 0) & (_as_t(b) != 0)).long()


def _or(a, b):
    if _is_scalar(a) and _is_scalar(b):
        return int(bool(a) or bool(b))
    return ((_as_t(a) != 0) | (_as_t(b) != 0)).long()


def _as_t(v):
    import torch

    return torch.as_tensor(v)


EVAL = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "//": _floordiv,
    "%": _mod,
    "<": _cmp(operator.lt),
    "<=": _cmp(operator.le),
    ">": _cmp(operator.gt),
    ">=": _cmp(operator.ge),
    "==": _cmp(operator.eq),
    "!=": _cmp(operator.ne),
    "and": _and,
    "or": _or,
    "min": _min,
    "max": _max,
}


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
            raise BuildError(f"`{format_plain(e)}`: {err}") from None
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


def format_plain(e: Expr) -> str:
    from pto.text.printer import format_expr

    return format_expr(e)


# interval bounds ----------------------------------------------------------------------------

def bounds(e: Expr, ranges: dict[str, tuple[Expr, Expr]]) -> tuple[Expr, Expr]:
    """Symbolic lower and upper bound of ``e`` when each variable in ``ranges`` lies within its
    inclusive (lo, hi) bounds; other variables are taken as exact.

    Exact for expressions monotone in each variable (affine offsets with constant
    coefficients, floor division and modulo by positive constants, min and max), which is what
    tile offsets are; used to derive the region a memref parameter touches.
    """
    if isinstance(e, (Const, Attr)):
        return e, e
    if isinstance(e, Var):
        return ranges.get(e.name, (e, e))
    if isinstance(e, Fn):
        if e.name == "select":
            (_, _), (alo, ahi), (blo, bhi) = (bounds(a, ranges) for a in e.args)
            return fold(Bin("min", alo, blo)), fold(Bin("max", ahi, bhi))
        if all(bounds(a, ranges)[0] == bounds(a, ranges)[1] for a in e.args):
            return e, e
        raise BuildError(f"cannot bound `{format_plain(e)}`")
    if not isinstance(e, Bin):
        raise TypeError(e)
    (alo, ahi), (blo, bhi) = bounds(e.a, ranges), bounds(e.b, ranges)
    op = e.op
    if op == "+":
        return fold(Bin("+", alo, blo)), fold(Bin("+", ahi, bhi))
    if op == "-":
        return fold(Bin("-", alo, bhi)), fold(Bin("-", ahi, blo))
    if op == "*":
        cb = const_value(blo) if blo == bhi else None
        ca = const_value(alo) if alo == ahi else None
        if cb is not None:
            return (fold(Bin("*", alo, blo)), fold(Bin("*", ahi, bhi))) if cb >= 0 else \
                (fold(Bin("*", ahi, blo)), fold(Bin("*", alo, bhi)))
        if ca is not None:
            return (fold(Bin("*", alo, blo)), fold(Bin("*", ahi, bhi))) if ca >= 0 else \
                (fold(Bin("*", alo, bhi)), fold(Bin("*", alo, blo)))
        prods = [fold(Bin("*", x, y)) for x in (alo, ahi) for y in (blo, bhi)]
        return emin(*prods), emax(*prods)
    if op == "//":
        cb = const_value(blo) if blo == bhi else None
        if cb is not None and cb > 0:
            return fold(Bin("//", alo, blo)), fold(Bin("//", ahi, bhi))
        if blo == bhi:  # symbolic positive divisor, assumed
            return fold(Bin("//", alo, blo)), fold(Bin("//", ahi, blo))
    if op == "%":
        cb = const_value(blo) if blo == bhi else None
        if cb is not None and cb > 0:
            if alo == ahi:
                return fold(Bin("%", alo, blo)), fold(Bin("%", ahi, blo))
            return Const(0), Const(cb - 1)
    if op in ("min", "max"):
        return fold(Bin(op, alo, blo)), fold(Bin(op, ahi, bhi))
    if op in CMP_OPS or op in LOGIC_OPS:
        if alo == ahi and blo == bhi:
            v = fold(Bin(op, alo, blo))
            return v, v
        return Const(0), Const(1)
    raise BuildError(f"cannot bound `{format_plain(e)}`")


def is_int_expr(e: Expr) -> bool:
    """True when no float constant occurs in ``e``."""
    return not _has_float(e)

