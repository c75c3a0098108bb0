"""Peeling the masks off a fused loop's first iterations (:mod:`pto.passes.fuse_build`).

A chain's members mask every tile the way the written program did, one call per tile: the
causal mask and the kv edge on each score tile of the split and pair attention, where only the
tiles that meet the diagonal or the sequence's end need them. Inside one loop the pass can see
where that stops: a row, column or causal mask whose bound falls as the loop advances keeps the
whole tile in every iteration before some point, and is a no-op there. :func:`split_masks`
cuts the loop at the first iteration where any of them may cut the tile: the iterations before
run without those masks, the rest as written. The iterations and their order are the same, so
the result is bit-exact.

A bound qualifies when it is the ``min`` of parts, each affine in the loop variable with a
coefficient that is not positive (other variables as they are); a mask keeps the whole tile
while every part is at least the tile's extent (``mask_rows``: its rows; ``mask_cols``: its
columns; ``mask_causal``, which keeps ``c <= r + bound``: its columns minus one).
"""

from __future__ import annotations

from pto.ir.expr import Bin, Const, Expr, Fn, Var, emax, emin, fold, substitute
from pto.ir.nodes import ForRange, Instr, Tile
from pto.ir.ops import Op
from pto.passes.affine import linear
from pto.passes.inline import Names

_MASKS = (Op.MASK_ROWS, Op.MASK_COLS, Op.MASK_CAUSAL)


def _min_parts(e: Expr) -> list[Expr]:
    if isinstance(e, Bin) and e.op == "min":
        return _min_parts(e.a) + _min_parts(e.b)
    return [e]


def _last_whole(bound: Expr, need: Expr, loop: ForRange) -> Expr | None:
    """The first value of the loop's variable from which ``bound >= need`` may fail (every
    earlier value keeps it), or None where the bound is not of the qualifying form."""
    it = loop.var
    stops = []
    for part in _min_parts(fold(bound)):
        terms, k = linear(fold(part - need))
        c = terms.pop(Var(it), 0)
        if not isinstance(c, int) or c > 0 or any(it in a.free_vars() for a in terms):
            return None
        rest = Const(k)  # part - need without its term in the loop variable
        for atom, coef in terms.items():
            rest = fold(rest + atom * coef)
        if c == 0:  # the same in every iteration: a prefix of all iterations or of none
            stops.append(Fn("select", (fold(rest >= 0), loop.ub, loop.lb)))
        else:
            stops.append(fold(rest // (-c) + 1))
    return emin(*stops) if len(stops) > 1 else stops[0]


def _need(ins: Instr, tiles: dict[str, Tile]) -> Expr:
    t = tiles[ins.dst]
    if ins.op is Op.MASK_ROWS:
        return t.rows
    return fold(t.cols - 1) if ins.op is Op.MASK_CAUSAL else t.cols


def split_masks(loop: ForRange, tiles: dict[str, Tile], names: Names) -> list:
    """``loop`` as two loops, the first without the masks that keep the whole tile there (the
    module docstring); ``[loop]`` where no mask qualifies."""
    peel, stops = set(), []
    for x in loop.body:
        if isinstance(x, Instr) and x.op in _MASKS and x.dst == x.srcs[0]:
            stop = _last_whole(x.srcs[1], _need(x, tiles), loop)
            if stop is not None:
                peel.add(id(x))
                stops.append(stop)
    if not stops:
        return [loop]
    stop = emin(*stops) if len(stops) > 1 else stops[0]
    # on the loop's grid, inside its range: the first iteration at or after ``stop``
    first = fold(loop.lb + ((emax(stop, loop.lb) - loop.lb + loop.step - 1) // loop.step) * loop.step)
    cut = fold(emin(first, loop.ub))
    plain = tuple(x for x in loop.body if id(x) not in peel)
    var2 = names.fresh(f"{loop.var}m")
    masked = tuple(_rename_var(x, loop.var, var2) for x in loop.body)
    return [ForRange(loop.var, loop.lb, cut, loop.step, plain), ForRange(var2, cut, loop.ub, loop.step, masked)]


def _rename_var(x, old: str, new: str):
    m = {old: Var(new)}
    if isinstance(x, ForRange):
        return ForRange(x.var, substitute(x.lb, m), substitute(x.ub, m), substitute(x.step, m),
                        tuple(_rename_var(y, old, new) for y in x.body))
    return Instr(x.op, x.dst, tuple(substitute(s, m) if isinstance(s, Expr) else s for s in x.srcs), x.attrs, x.loc)


__all__ = ["split_masks"]
