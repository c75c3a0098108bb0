"""What the scalar operators and intrinsic functions compute, on values.

Values are Python numbers or torch tensors (a batch of tasks evaluated at once). Integer
``//`` and ``%`` floor, as in Python; comparisons and ``and``/``or`` yield 0 or 1. The
expression nodes (:mod:`pto.ir.expr`) fold constants and evaluate trees with these tables;
renderers to C and Triton implement the same names.
"""

from __future__ import annotations

import operator

from pto.errors import BuildError


def _is_scalar(v) -> bool:
    return isinstance(v, (int, float))


def _as_t(v):
    import torch

    return torch.as_tensor(v)


def _tensor_op(name, a, b):
    import torch

    return getattr(torch, name)(torch.as_tensor(a), torch.as_tensor(b))


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


def _min(a, b):
    if _is_scalar(a) and _is_scalar(b):
        return min(a, b)
    return _tensor_op("minimum", a, b)


def _max(a, b):
    if _is_scalar(a) and _is_scalar(b):
        return max(a, b)
    return _tensor_op("maximum", a, b)


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


# operator -> implementation on values
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
    """How many blocks :func:`bx_blocks` makes of ``n`` base tiles."""
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
    """First base tile of block ``k``."""
    return _bx_block(n, k, max_range, min_range)[0]


def bx_size(n, k, max_range, min_range):
    """Base tiles in block ``k``."""
    return _bx_block(n, k, max_range, min_range)[1]


# name -> (arity, implementation); renderers to C keep a table of the same names
FUNCS = {
    "select": (3, _select),
    "bx_count": (3, bx_count),
    "bx_start": (4, bx_start),
    "bx_size": (4, bx_size),
}

__all__ = ["EVAL", "FUNCS", "bx_blocks", "bx_count", "bx_start", "bx_size"]
