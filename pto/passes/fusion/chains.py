"""Fusion candidates: chains of calls linked by carried regions (issue 24's analysis).

A loop whose calls read and rewrite the same region on every iteration carries state through
memory: the split attention's kv loop updates each q tile's running max, sum and output (``m``,
``l``, ``acc``) once per kv tile, and a K-split GEMM its accumulator once per K block. Fused into
one InCore function with the loop inside, that state would stay on chip. This module finds such
loops and says what a fusion would keep on chip; it changes nothing: the pass
(:mod:`pto.passes.fusion.fuse`) fuses them (and links regions to their loops by
:func:`region_key`), and ``pto graph`` lists the chains a program still has.

For the direct calls of a loop's body, per region (tensor and offset and extent expressions,
compared structurally):

- **carried**: the same region in every iteration (its expressions do not use the loop variable;
  a tile height of the loop, ``var.rows``, is not a position), first accessed by a read, and
  written in the body: each iteration reads what the previous one wrote;
- **scratch**: the same region in every iteration, written before it is read: rewritten whole by
  every iteration;
- **handoffs**: a region one call writes and a later call of the same iteration reads, where no
  call outside the loop's body names the tensor (the intermediate can stay on chip).

A loop with carried regions is a :class:`Chain` of the calls that touch them and the calls its
handoffs link to those, unless a nested loop or branch of the body touches the same tensors (it
interleaves with the chain; the decode step's layer loop is such a loop).
"""

from __future__ import annotations

from dataclasses import dataclass

from pto.ir.analysis import param_access
from pto.ir.nodes import Call, If, IncoreFunction, Loop, Module, RegionBinding

_READ = ("in", "inout")
_WRITE = ("out", "inout")


@dataclass(frozen=True)
class Chain:
    """A loop whose calls carry regions from iteration to iteration."""

    loop: str  # the loop variable
    calls: tuple[str, ...]  # the chained callees, in body order
    carried: tuple[str, ...]  # tensors of the carried regions
    scratch: tuple[str, ...]  # tensors rewritten whole by every iteration
    handoffs: tuple[tuple[str, str, str], ...]  # (producer, consumer, tensor)
    loc: str | None = None  # where the loop's first chained call is

    def to_json(self) -> dict:
        return {"loop": self.loop, "calls": list(self.calls), "carried": list(self.carried),
                "scratch": list(self.scratch), "handoffs": [list(h) for h in self.handoffs], "loc": self.loc}

    def describe(self) -> str:
        where = f" ({self.loc})" if self.loc else ""
        hand = ", ".join(f"{a} -> {b} via {t}" for a, b, t in self.handoffs) or "none"
        return (f"loop {self.loop}{where}: {' + '.join(self.calls)} carry {', '.join(self.carried)} "
                f"through memory (scratch: {', '.join(self.scratch) or 'none'}; handoffs: {hand})")


def region_key(b: RegionBinding) -> tuple:
    """A region as written: its tensor and its offset and extent expressions."""
    return (b.tensor, b.row, b.col, b.rows, b.cols)


def _invariant(b: RegionBinding, var: str) -> bool:
    names: set[str] = set()
    for e in (b.row, b.col, b.rows, b.cols):
        if e is not None:
            names |= e.free_vars()
    return var not in names


def _tensor_uses(stmts, out: dict[str, int]) -> None:
    """How many calls of ``stmts`` (recursively) name each tensor."""
    for s in stmts:
        if isinstance(s, Call):
            for t in {v.tensor for _, v in s.args if isinstance(v, RegionBinding)}:
                out[t] = out.get(t, 0) + 1
        elif isinstance(s, Loop):
            _tensor_uses(s.body, out)
        elif isinstance(s, If):
            _tensor_uses(s.then, out)
            _tensor_uses(s.orelse, out)


class _Finder:
    def __init__(self, module: Module):
        self.module = module
        self.access: dict[str, dict] = {}
        self.uses: dict[str, int] = {}
        _tensor_uses(module.entry_function.body, self.uses)
        self.chains: list[Chain] = []

    def direction(self, call: Call, param: str) -> str:
        if call.func not in self.access:
            f = self.module.get(call.func)
            self.access[call.func] = param_access(f) if isinstance(f, IncoreFunction) else {}
        acc = self.access[call.func].get(param)
        return acc.direction if acc is not None else "in"

    def walk(self, stmts) -> None:
        for s in stmts:
            if isinstance(s, Loop):
                self.loop(s)
                self.walk(s.body)
            elif isinstance(s, If):
                self.walk(s.then)
                self.walk(s.orelse)

    def loop(self, loop: Loop) -> None:
        calls = [s for s in loop.body if isinstance(s, Call)]
        seen: dict[tuple, list[tuple[int, str]]] = {}  # region -> [(call index, direction)]
        for i, c in enumerate(calls):
            for p, v in c.args:
                if isinstance(v, RegionBinding) and _invariant(v, loop.var):
                    seen.setdefault(region_key(v), []).append((i, self.direction(c, p)))
        carried, scratch, members = [], [], set()
        for key, acc in seen.items():
            written = any(d in _WRITE for _, d in acc)
            if written and acc[0][1] in _READ:
                carried.append(key[0])
                members |= {i for i, _ in acc}
            elif written:
                scratch.append(key[0])
        if not carried:
            return
        handoffs = self._handoffs(calls, loop)
        for a, b, _ in handoffs:  # producers and consumers of the chained calls' intermediates
            if calls.index(a) in members or calls.index(b) in members:
                members |= {calls.index(a), calls.index(b)}
        order = sorted(members)
        # a nested loop or branch between the calls that touches what they touch interleaves
        # with them: the chain is not the body's whole story, so it is not reported
        nested: dict[str, int] = {}
        _tensor_uses([s for s in loop.body if not isinstance(s, Call)], nested)
        touched = {v.tensor for i in order for _, v in calls[i].args if isinstance(v, RegionBinding)}
        if touched & set(nested):
            return
        self.chains.append(Chain(loop.var, tuple(calls[i].func for i in order), tuple(dict.fromkeys(carried)),
                                 tuple(dict.fromkeys(scratch)),
                                 tuple((a.func, b.func, t) for a, b, t in handoffs),
                                 calls[order[0]].loc))

    def _handoffs(self, calls: list[Call], loop: Loop) -> list[tuple[Call, Call, str]]:
        """(producer, consumer, tensor): a region written by one call and read by a later one of
        the same iteration, its tensor named by no call outside the loop."""
        inside: dict[str, int] = {}
        _tensor_uses(loop.body, inside)
        out = []
        for i, a in enumerate(calls):
            for p, v in a.args:
                if not isinstance(v, RegionBinding) or self.direction(a, p) not in _WRITE:
                    continue
                if self.uses.get(v.tensor, 0) != inside.get(v.tensor, 0):
                    continue  # read elsewhere too: it must reach memory
                for b in calls[i + 1:]:
                    if any(isinstance(w, RegionBinding) and region_key(w) == region_key(v)
                           and self.direction(b, q) in _READ for q, w in b.args):
                        out.append((a, b, v.tensor))
        return out


def find_chains(module: Module) -> list[Chain]:
    """The loops of ``module``'s orchestration whose calls carry regions (see the module
    docstring), outermost first."""
    f = _Finder(module)
    f.walk(module.entry_function.body)
    return f.chains


__all__ = ["Chain", "find_chains", "region_key"]
