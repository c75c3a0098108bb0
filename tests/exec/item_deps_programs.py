"""Random programs for the data dependencies' fuzzer (tests/exec/test_item_deps.py): seeded
calls of nine small f32 InCore functions on random ranges of a few tensors, so that the tasks'
regions overlap in part, not only whole or not at all, and their items touch them in different
ways: row blocks, a causal prefix read, a read shifted past the item's own rows, column halves in
place, interleaved rows, a GEMV's column pairs (whose items may be runs of indices), and stores
that leave rows as they were (every other row, or a gap between two stores: what the runtime's
tensor map takes as written whole). Beside each program, the elements every work item of it
reads and writes, from what each function is known to do (not from the IR): the oracle the
plan's counters are checked against."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from pto import InCore, Orchestration, f32
from tests.exec.split_programs import axpy

N, COLS, HALF = 16, 8, 4  # rows and columns of every tensor, half the columns
TENSORS = ("a", "b", "c", "d", "y")  # a the input; the others written first (copied from a)


def _copy_rows(p: int):
    """``y = x`` in ``p`` items of two rows each."""
    k = InCore(f"copy_rows_{p}")
    x, y = k.memref("x", f32), k.memref("y", f32)
    h = k.parallel("h", p)
    t = k.tile("t", 2, COLS, f32)
    k.load(t, x, 2 * h, 0)
    k.store(y, 2 * h, 0, t)
    return k.build()


def _prefix(p: int):
    """Item h: ``y[2h:2h+2] = (x[0:2] + ... + x[2h:2h+2]) / 4``, reading every row block up to
    its own (a causal read)."""
    k = InCore(f"prefix_{p}")
    x, y = k.memref("x", f32), k.memref("y", f32)
    h = k.parallel("h", p)
    t, acc = k.tile("t", 2, COLS, f32), k.tile("acc", 2, COLS, f32)
    k.full(acc, 0.0)
    with k.for_range("r", 0, h + 1) as r:
        k.load(t, x, 2 * r, 0)
        k.add(acc, acc, t)
    k.muls(acc, acc, 0.25)
    k.store(y, 2 * h, 0, acc)
    return k.build()


def _shift(p: int):
    """Item h: ``y[2h:2h+2] = x[2h+1:2h+3] * 0.5`` (x's region a row longer than y's)."""
    k = InCore(f"shift_{p}")
    x, y = k.memref("x", f32), k.memref("y", f32)
    h = k.parallel("h", p)
    t = k.tile("t", 2, COLS, f32)
    k.load(t, x, 2 * h + 1, 0)
    k.muls(t, t, 0.5)
    k.store(y, 2 * h, 0, t)
    return k.build()


def _half_negate():
    """``x[:, half h] *= -0.5`` in place over four rows, two items (column halves)."""
    k = InCore("half_negate")
    x = k.memref("x", f32)
    h = k.parallel("h", 2)
    t = k.tile("t", 2, HALF, f32)
    with k.for_range("r", 0, 2) as r:
        k.load(t, x, 2 * r, h * HALF)
        k.muls(t, t, -0.5)
        k.store(x, 2 * r, h * HALF, t)
    return k.build()


def _interleave():
    """Item h copies rows h, h+2, h+4, h+6 of eight (two items, interleaved rows: their
    bounding boxes overlap, their elements do not)."""
    k = InCore("interleave")
    x, y = k.memref("x", f32), k.memref("y", f32)
    h = k.parallel("h", 2)
    t = k.tile("t", 1, COLS, f32)
    with k.for_range("r", 0, 4) as r:
        k.load(t, x, 2 * r + h, 0)
        k.muls(t, t, 0.75)
        k.store(y, 2 * r + h, 0, t)
    return k.build()


def _even_rows():
    """Item h (a column half) copies rows 0, 2, 4, 6 of seven: the odd rows of y's region are
    left as they were (a store with holes)."""
    k = InCore("even_rows")
    x, y = k.memref("x", f32), k.memref("y", f32)
    h = k.parallel("h", 2)
    t = k.tile("t", 1, HALF, f32)
    with k.for_range("r", 0, 4) as r:
        k.load(t, x, 2 * r, h * HALF)
        k.store(y, 2 * r, h * HALF, t)
    return k.build()


def _gap_store():
    """Item h (a column half) copies rows 0-1 and 4-5 of six, two stores apart: rows 2-3 of y's
    region are left as they were (a hole between accesses)."""
    k = InCore("gap_store")
    x, y = k.memref("x", f32), k.memref("y", f32)
    h = k.parallel("h", 2)
    t, u = k.tile("t", 2, HALF, f32), k.tile("u", 2, HALF, f32)
    k.load(t, x, 0, h * HALF)
    k.load(u, x, 4, h * HALF)
    k.muls(u, u, 1.5)
    k.store(y, 0, h * HALF, t)
    k.store(y, 4, h * HALF, u)
    return k.build()


def _gemv(p: int):
    """Item h: ``y[0, 2h:2h+2] = x[0, :] @ w[:, 2h:2h+2]`` (a GEMV: its items may be runs of
    consecutive indices)."""
    k = InCore(f"gemv_{p}")
    x, w, y = k.memref("x", f32), k.memref("w", f32), k.memref("y", f32)
    h = k.parallel("h", p)
    xt, wt, out = k.tile("xt", 1, COLS, f32), k.tile("wt", COLS, 2, f32), k.tile("out", 1, 2, f32)
    k.load(xt, x, 0, 0)
    k.load(wt, w, 0, 2 * h)
    k.matmul(out, xt, wt)
    k.muls(out, out, 0.125)
    k.store(y, 0, 2 * h, out)
    return k.build()


@dataclass(frozen=True)
class Kind:
    """A function and what its items touch: ``shape`` the rows and columns of each memref's
    region, ``items`` how many, ``touch(h)`` per memref (reads, writes) as lists of (rows, cols)
    element ranges in the region's coordinates."""

    fn: object
    items: int
    shape: dict
    touch: object


def _kinds() -> list[Kind]:
    all_cols = range(COLS)
    out = []
    for p in (2, 4):
        out.append(Kind(_copy_rows(p), p, {"x": (2 * p, COLS), "y": (2 * p, COLS)},
                        lambda h: {"x": ([(range(2 * h, 2 * h + 2), all_cols)], []),
                                   "y": ([], [(range(2 * h, 2 * h + 2), all_cols)])}))
        out.append(Kind(_prefix(p), p, {"x": (2 * p, COLS), "y": (2 * p, COLS)},
                        lambda h: {"x": ([(range(0, 2 * h + 2), all_cols)], []),
                                   "y": ([], [(range(2 * h, 2 * h + 2), all_cols)])}))
        out.append(Kind(_shift(p), p, {"x": (2 * p + 1, COLS), "y": (2 * p, COLS)},
                        lambda h: {"x": ([(range(2 * h + 1, 2 * h + 3), all_cols)], []),
                                   "y": ([], [(range(2 * h, 2 * h + 2), all_cols)])}))
    half = [range(0, HALF), range(HALF, COLS)]
    out.append(Kind(_half_negate(), 2, {"x": (4, COLS)},
                    lambda h: {"x": ([(range(4), half[h])], [(range(4), half[h])])}))
    out.append(Kind(_interleave(), 2, {"x": (8, COLS), "y": (8, COLS)},
                    lambda h: {"x": ([(range(h, 8, 2), all_cols)], []), "y": ([], [(range(h, 8, 2), all_cols)])}))
    out.append(Kind(_even_rows(), 2, {"x": (7, COLS), "y": (7, COLS)},
                    lambda h: {"x": ([(range(0, 8, 2), half[h])], []), "y": ([], [(range(0, 8, 2), half[h])])}))
    gap = [range(0, 2), range(4, 6)]
    out.append(Kind(_gap_store(), 2, {"x": (6, COLS), "y": (6, COLS)},
                    lambda h: {"x": ([(r, half[h]) for r in gap], []), "y": ([], [(r, half[h]) for r in gap])}))
    for p in (2, 4):
        out.append(Kind(_gemv(p), p, {"x": (1, COLS), "w": (COLS, 2 * p), "y": (1, 2 * p)},
                        lambda h: {"x": ([(range(1), all_cols)], []),
                                   "w": ([(range(COLS), range(2 * h, 2 * h + 2))], []),
                                   "y": ([], [(range(1), range(2 * h, 2 * h + 2))])}))
    out.append(Kind(axpy(2, COLS, "axpy_rows"), 1, {"x": (2, COLS), "y": (2, COLS)},
                    lambda h: {"x": ([(range(2), all_cols)], []),
                               "y": ([(range(2), all_cols)], [(range(2), all_cols)])}))
    return out


KINDS = _kinds()
COPY_ALL = KINDS[3]  # copy_rows_4: eight rows in four items


@dataclass
class Call:
    """One call: its kind and each memref's (tensor, first row, first column)."""

    kind: Kind
    where: dict


@dataclass
class RandomProgram:
    module: object
    calls: list[Call]


def random_program(seed: int, calls: int = 30) -> RandomProgram:
    """The program of ``seed``: every written tensor copied whole from ``a`` first (nothing
    reads an unwritten element), then ``calls`` calls of random kinds at random rows."""
    rng = random.Random(seed)
    o = Orchestration(f"item_deps_random_{seed}")
    tensors = {"a": o.input("a", N, COLS, f32)}
    for name in TENSORS[1:-1]:
        tensors[name] = o.temp(name, N, COLS, f32)
    tensors["y"] = o.output("y", N, COLS, f32)
    made: list[Call] = []

    def call(kind: Kind, where: dict) -> None:
        o.call(kind.fn, {m: (tensors[t], r0, c0, *kind.shape[m]) for m, (t, r0, c0) in where.items()})
        made.append(Call(kind, where))

    for name in TENSORS[1:]:
        for r0 in (0, 8):
            call(COPY_ALL, {"x": ("a", r0, 0), "y": (name, r0, 0)})
    for _ in range(calls):
        kind = rng.choice(KINDS)
        where = {}  # (each memref on a tensor of its own: no item reads what another item writes)
        for m, (rows, cols) in kind.shape.items():
            pool = [t for t in (TENSORS[1:] if kind.touch(0)[m][1] else TENSORS)
                    if t not in {w[0] for w in where.values()}]
            where[m] = (rng.choice(pool), rng.randrange(N - rows + 1), rng.randrange(COLS - cols + 1))
        call(kind, where)
    return RandomProgram(o.module(), made)


def element_sets(prog: RandomProgram, first: np.ndarray, count: np.ndarray, task: np.ndarray):
    """Per work item (``task`` its call's index, ``first``/``count`` the parallel indices it
    runs), the flat element indices (``tensor * N * COLS + row * COLS + col``) it reads and
    writes, as two Python sets."""
    out = []
    for t, f, c in zip(task.tolist(), first.tolist(), count.tolist()):
        call = prog.calls[t]
        reads, writes = set(), set()
        for h in range(f, f + max(c, 1)):
            for m, (rd, wr) in call.kind.touch(h).items():
                name, r0, c0 = call.where[m]
                base = TENSORS.index(name) * N * COLS
                for rows, cols in rd:
                    reads |= {base + (r0 + r) * COLS + c0 + col for r in rows for col in cols}
                for rows, cols in wr:
                    writes |= {base + (r0 + r) * COLS + c0 + col for r in rows for col in cols}
        out.append((reads, writes))
    return out


def inputs(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(N, COLS, generator=g)}


__all__ = ["KINDS", "RandomProgram", "random_program", "element_sets", "inputs", "N", "COLS"]
