"""The non-finite sentinel's per-task flags: did a task read a NaN or an infinity, did it write
one, and where (``pto run --sentinel``).

For every task, :class:`TaskFlags` keeps two records, ``read`` (its input regions: ``in`` and
``inout`` arguments, as they were when it started) and ``wrote`` (its output regions: ``out`` and
``inout``, as it left them), each ``(argument, row, col, code)``: the first argument (in call
order) whose region holds a non-finite element, that element's row and column in the tensor
(the region's first one, row-major) and what it is (:data:`NAN`, :data:`POS_INF`,
:data:`NEG_INF`); ``-1`` everywhere when the regions are finite. A task that wrote a non-finite
value from finite inputs is where one was born (:attr:`TaskFlags.born`).

The wave executor checks on the host between waves (:meth:`TaskFlags.scan`: reads before a
wave, writes after it; tasks of one wave never write what another reads); the persistent
executor checks on the device (:mod:`pto.codegen.triton.scan`) and scans here only the tasks
without predecessors, before its launch. A region is checked through a summed-area table of the
tensor's non-finite elements, built only for a tensor that holds one, so a finite run costs one
``isfinite`` per tensor a wave touches.

An infinity that the program's InCore functions write on purpose is a value, not an accident:
a running maximum starts at -inf, a causal mask fills -inf. :func:`declared_infinities` finds
the signs that appear as constants in the functions (fills, pads, operands); the sentinel
ignores those (``ignore``) and tracks NaN and the other infinities.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pto.ir.expr import Const
from pto.ir.nodes import ForRange, IncoreFunction

#: what a non-finite element is (the ``code`` of a record)
NAN, POS_INF, NEG_INF = 1, 2, 3
CODE_NAMES = {NAN: "nan", POS_INF: "inf", NEG_INF: "-inf"}
#: export argument kinds that a task reads, and that it writes
READS, WRITES = (0, 2), (1, 2)


def code_of(value: float) -> int:
    """The record code of a non-finite value."""
    if value != value:
        return NAN
    return POS_INF if value > 0 else NEG_INF


def declared_infinities(functions) -> frozenset[int]:
    """The codes (:data:`POS_INF`, :data:`NEG_INF`) of the infinities that appear as constants
    in ``functions`` (attributes such as a mask's fill or a load's pad, scalar operands)."""
    found: set[int] = set()

    def visit(body):
        for s in body:
            if isinstance(s, ForRange):
                visit(s.body)
                continue
            values = [v for _, v in s.attrs] + [x.value for x in s.srcs if isinstance(x, Const)]
            for v in values:
                if isinstance(v, float) and math.isinf(v):
                    found.add(POS_INF if v > 0 else NEG_INF)

    for fn in functions:
        if isinstance(fn, IncoreFunction):
            visit(fn.body)
    return frozenset(found)


class TaskFlags:
    """Per-task read and write records of one run (see the module docstring).

    ``export``: the graph's :class:`pto.runtime.GraphExport`; ``tensors``: the run's tensors by
    runtime tensor id; ``ignore``: codes of the infinities the program uses as values."""

    def __init__(self, export, tensors: dict[int, torch.Tensor], ignore: frozenset[int] = frozenset()):
        self.export = export
        self.tensors = tensors
        self.ignore = frozenset(ignore)
        n = export.n_tasks
        self.read = np.full((n, 4), -1, np.int64)
        self.wrote = np.full((n, 4), -1, np.int64)

    def clear(self) -> None:
        self.read.fill(-1)
        self.wrote.fill(-1)

    @property
    def born(self) -> np.ndarray:
        """Rows (task index from the export's first task) that wrote a non-finite value while
        every region they read was finite, ascending."""
        return np.nonzero((self.wrote[:, 0] >= 0) & (self.read[:, 0] < 0))[0]

    def scan(self, ids: np.ndarray, writes: bool) -> None:
        """Check the regions of tasks ``ids`` (runtime ids) that they write (``writes``) or read,
        in the tensors' current state, into ``wrote`` or ``read``."""
        ex = self.export
        rows = np.asarray(ids, np.int64) - ex.first_task
        if len(rows) == 0:
            return
        starts, ends = ex.arg_ptr[rows], ex.arg_ptr[rows + 1]
        counts = ends - starts
        total = int(counts.sum())
        if total == 0:
            return
        owner = np.repeat(rows, counts)
        pos = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        arg = np.repeat(starts, counts) + pos
        keep = np.isin(ex.arg_kind[arg], WRITES if writes else READS)
        owner, pos, arg = owner[keep], pos[keep], arg[keep]
        out = self.wrote if writes else self.read
        tens = ex.arg_tensor[arg]
        for tid in np.unique(tens):
            sel = np.nonzero(tens == tid)[0]
            hits = first_nonfinite(self.tensors[int(tid)], ex.arg_region[arg[sel]], self.ignore)
            for j, (r, c, code) in hits.items():
                t, k = owner[sel[j]], pos[sel[j]]
                if out[t, 0] < 0 or k < out[t, 0]:
                    out[t] = (k, r, c, code)


def nonfinite_mask(t: torch.Tensor, ignore: frozenset[int] = frozenset()) -> torch.Tensor:
    """Where ``t`` holds a NaN or an infinity whose code is not in ``ignore``."""
    bad = ~torch.isfinite(t)
    if NEG_INF in ignore:
        bad &= t != float("-inf")
    if POS_INF in ignore:
        bad &= t != float("inf")
    return bad


def first_nonfinite(t: torch.Tensor, regions: np.ndarray, ignore: frozenset[int] = frozenset()
                    ) -> dict[int, tuple[int, int, int]]:
    """For each region ``(row0, col0, rows, cols)`` of ``t`` that holds a NaN or an infinity (of
    a code not in ``ignore``): its index -> ``(row, col, code)`` of its first such element
    (row-major)."""
    bad = nonfinite_mask(t, ignore)
    if not bool(bad.any()):
        return {}
    big = bad.numel() >= 2**31
    sat = torch.zeros((t.shape[0] + 1, t.shape[1] + 1), dtype=torch.int64 if big else torch.int32,
                      device=t.device)
    sat[1:, 1:] = bad.to(sat.dtype).cumsum(0).cumsum(1)
    reg = torch.from_numpy(np.ascontiguousarray(regions)).to(t.device)
    r0, c0 = reg[:, 0], reg[:, 1]
    r1, c1 = r0 + reg[:, 2], c0 + reg[:, 3]
    n = sat[r1, c1] - sat[r0, c1] - sat[r1, c0] + sat[r0, c0]
    out = {}
    for j in torch.nonzero(n).flatten().tolist():
        a, b, h, w = (int(v) for v in regions[j])
        flat = int(torch.nonzero(bad[a:a + h, b:b + w].reshape(-1))[0])
        r, c = a + flat // w, b + flat % w
        out[j] = (r, c, code_of(float(t[r, c])))
    return out


__all__ = ["TaskFlags", "first_nonfinite", "nonfinite_mask", "declared_infinities", "code_of", "NAN", "POS_INF",
           "NEG_INF", "CODE_NAMES", "READS", "WRITES"]
