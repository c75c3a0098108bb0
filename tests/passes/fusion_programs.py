"""Random small f32 programs for the fusion property test (issue 42), from a seed.

:func:`generate` draws a program of one to three blocks over scalars S, L and T, each block
perhaps inside an outer loop over column blocks (plain or adaptive):

- a **chain**: a loop whose calls carry a one-row state (``acc += colsum(x)``, ``acc =
  max(acc, colmax(x))``, the column sums of the rows a scalar argument counts, a K-split
  ``y += x @ w`` with ``matmul_acc``), directly or through a
  producer whose output only the accumulation reads, perhaps with a second state, a second
  update of the same state or an in-place recurrence that does not re-associate; then perhaps
  the call that reads the state (or a region next to it: a near miss);
- a **producer-consumer pair**, straight or in a loop that carries nothing, whose consumer
  reads what the producer wrote, or a near miss: a shifted, shorter or clamped region, a
  second input;
- and later blocks that read what earlier ones wrote (second readers).

Loops are plain or adaptive (several levels over base heights of 1, 2 and 4 rows), with or
without ``reassociate`` (only where every region all iterations update is an associative
accumulation, the author's promise kept); bounds that may give no trip or a negative count
(``cdiv(S - c, b)``, ``L .. T``, S = -2), some through a let, plain loops stepping over every
other tile, a block repeated by an outer loop (its state carried by both); moving regions at
affine offsets, at strides other than the base height, clamped or cut at a fixed row, at offsets
before the tensor's start for iterations that do not run, with residual, growing, constant or
cut extents, and tiles that do or do not grow with the loop's height. A seed always gives the
same program; ``python -m tests.passes.fusion_programs SEED`` prints its text form and checks it.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass

from pto import InCore, Orchestration, cdiv, emax, emin, f32, format_module
from pto.ir.nodes import IncoreFunction, Module

W = 4  # the columns of one column block
NCB = 3  # column blocks of every data tensor
LEVELS = ({0: 1, 2: 2}, {0: 1, 2: 2, 4: 4}, {0: 1, 4: 2}, {0: 1, 2: 2, 4: 4, 8: 8})  # in base heights
ACCUMULATE = ("colsum_acc", "colmax_acc")  # associative updates of a state: re-association keeps them


def _kernels() -> dict[str, IncoreFunction]:
    out = {}

    def kernel(name, build):
        k = InCore(name)
        rows = k.dim("R", 2) if name != "finish" else None
        build(k, rows, k.dim("W", W))
        out[name] = k.build()

    def plus1(k, R, C):  # y = x + 1
        x, y, t = k.memref("x", f32), k.memref("y", f32), k.tile("t", R, C, f32)
        k.load(t, x, 0, 0)
        k.adds(t, t, 1.0)
        k.store(y, 0, 0, t)

    def twice1(k, R, C):  # y = 2 y + 1, in place (a recurrence on a region every iteration updates)
        y, t = k.memref("y", f32), k.tile("t", R, C, f32)
        k.load(t, y, 0, 0)
        k.muls(t, t, 2.0)
        k.adds(t, t, 1.0)
        k.store(y, 0, 0, t)

    def add2(k, R, C):  # y = a + b
        a, b, y = k.memref("a", f32), k.memref("b", f32), k.memref("y", f32)
        ta, tb = k.tile("ta", R, C, f32), k.tile("tb", R, C, f32)
        k.load(ta, a, 0, 0)
        k.load(tb, b, 0, 0)
        k.add(ta, ta, tb)
        k.store(y, 0, 0, ta)

    def reduce_into(reduce, combine, pad):
        def body(k, R, C):  # acc (one row) = combine(acc, reduce(x))
            x, acc = k.memref("x", f32), k.memref("acc", f32)
            t, c, a = k.tile("t", R, C, f32), k.tile("c", 1, C, f32), k.tile("a", 1, C, f32)
            k.load(t, x, 0, 0, pad=pad)
            getattr(k, reduce)(c, t)
            k.load(a, acc, 0, 0)
            getattr(k, combine)(a, a, c)
            k.store(acc, 0, 0, a)
        return body

    def colsum_valid(k, R, C):  # acc (one row) += column sums of the first n rows of x (n a scalar)
        x, acc, n = k.memref("x", f32), k.memref("acc", f32), k.scalar("n")
        t, c, a = k.tile("t", R, C, f32), k.tile("c", 1, C, f32), k.tile("a", 1, C, f32)
        k.load(t, x, 0, 0)
        k.mask_rows(t, t, n)
        k.colsum(c, t)
        k.load(a, acc, 0, 0)
        k.add(a, a, c)
        k.store(acc, 0, 0, a)

    def finish(k, _, C):  # y = acc + 1 on one row (the state's reader after a chain)
        x, y, t = k.memref("x", f32), k.memref("y", f32), k.tile("t", 1, C, f32)
        k.load(t, x, 0, 0)
        k.adds(t, t, 1.0)
        k.store(y, 0, 0, t)

    def kstep(k, R, C):  # y (4 x C) += x (4 x R) @ w (R x C)
        x, w, y = k.memref("x", f32), k.memref("w", f32), k.memref("y", f32)
        a, b, acc = k.tile("a", 4, R, f32), k.tile("b", R, C, f32), k.tile("acc", 4, C, f32)
        k.load(a, x, 0, 0)
        k.load(b, w, 0, 0)
        k.load(acc, y, 0, 0)
        k.matmul_acc(acc, a, b)
        k.store(y, 0, 0, acc)

    for name, body in (("plus1", plus1), ("twice1", twice1), ("add2", add2),
                       ("colsum_acc", reduce_into("colsum", "add", 0.0)),
                       ("colmax_acc", reduce_into("colmax", "max", -math.inf)), ("colsum_valid", colsum_valid),
                       ("finish", finish),
                       ("kstep", kstep)):
        kernel(name, body)
    return out


KERNELS = _kernels()


@dataclass(frozen=True)
class Program:
    seed: int
    module: Module
    scalars: tuple[dict, ...]

    def text(self) -> str:
        return f"# seed {self.seed}, scalars {list(self.scalars)}\n{format_module(self.module)}"


class _Loop:
    """A loop being written: its variable, base height, whether it is adaptive, and the
    expression ``X`` its trips count tiles of (``ub = cdiv(X, b)``), for residual extents."""

    def __init__(self, var, b: int, adaptive: bool, end):
        self.var, self.b, self.adaptive, self.end = var, b, adaptive, end

    @property
    def height(self):
        return self.var.rows if self.adaptive else self.b


class _Gen:
    def __init__(self, seed: int):
        self.rng = rng = random.Random(seed)
        self.seed = seed
        self.o = o = Orchestration(f"p{seed}")
        self.S, self.L, self.T = o.scalar("S"), o.scalar("L"), o.scalar("T")
        self.b = rng.choice((1, 2, 4))
        self.margin = 4 * self.b
        self.rows = 2 * self.S + 2 * self.margin + 20 * self.b  # room for strides of two tiles and margins
        self.tensors: dict[str, object] = {}
        self.written: list[tuple] = []  # regions earlier blocks wrote, for second readers
        self.loops = 0

    # tensors, declared where first used (every declared tensor must be used) ------------------
    def tensor(self, name: str):
        if name not in self.tensors:
            o, rows, cols = self.o, self.rows, NCB * W
            kind = name.rstrip("0123456789")
            if kind == "t":  # an intermediate: a temporary, or an output the program returns
                make = o.temp if self.rng.random() < 0.6 else o.output
            else:
                make = {"x": o.input, "acc": o.inout, "y": o.output, "kx": o.input, "kw": o.input,
                        "ky": o.inout}[kind]
            shape = {"acc": (8, cols), "kx": (4, rows), "kw": (rows, W), "ky": (4, W)}.get(kind, (rows, cols))
            self.tensors[name] = make(name, *shape, f32)
        return self.tensors[name]

    def any_of(self, kind: str):
        return self.tensor(f"{kind}{self.rng.randrange(2)}")

    # pieces ---------------------------------------------------------------------------------
    def pick(self, *options, weights=None):
        return self.rng.choices(options, weights=weights)[0]

    def levels(self) -> dict[int, int]:
        return {p: m * self.b for p, m in self.pick(*LEVELS).items()}

    def bounds(self):
        """(lb, ub, X): the loop counts base tiles of ``[.., X)`` (residual extents cut at X); the
        upper bound perhaps a let just before the loop."""
        S, L, T, b = self.S, self.L, self.T, self.b
        kind = self.pick("cdiv", "minus", "LT", "Lcdiv", "one", "zeroT", weights=(4, 2, 2, 1, 1, 1))
        c = self.rng.randint(1, 4)
        lb, ub, end = {"cdiv": (0, cdiv(S, b), S), "minus": (0, cdiv(S - c, b), S - c), "LT": (L, T, T * b),
                       "Lcdiv": (L, cdiv(S, b), S), "one": (1, cdiv(S, b), S), "zeroT": (0, T, T * b)}[kind]
        if self.rng.random() < 0.2:
            ub = self.o.let(f"n{self.loops + 1}", ub)
        return lb, ub, end

    def step(self, adaptive: bool) -> int:
        """A plain loop may skip every other tile."""
        return 1 if adaptive or self.rng.random() < 0.85 else 2

    def loop_var(self, name: str) -> str:
        self.loops += 1
        return f"{name}{self.loops}"

    def moving_rows(self, lp: _Loop):
        """(row offset, row extent, dim R) of a region that moves with loop ``lp``."""
        j, b, M, S = lp.var, lp.b, self.margin, self.S
        v = self.pick(0, 0, 0, -b, b, -1, b // 2) if b > 1 else self.pick(0, 0, 0, -1, 1, 2)
        form = self.pick("affine", "stride2", "clamp", "min", "tight", weights=(10, 1, 1, 1, 1))
        row = {"affine": M + j * b + v, "stride2": M + j * 2 * b, "clamp": M + emax(emin(j * b + v, S - b), 0),
               "min": M + emin(j * b, 2 * b), "tight": j * b - b}[form]
        h = lp.height
        ext = self.pick("residual", "height", "const", "cut", weights=(6, 3, 1, 1))
        if not lp.adaptive and ext in ("height", "cut"):
            ext = "const"
        rows = {"residual": emin(h, lp.end - j * b), "height": h, "const": b, "cut": emin(h, 2 * b)}[ext]
        # a tile that does not grow with the height (the builder wants the height used somewhere)
        grows = lp.adaptive and (self.rng.random() < 0.85 or ext == "const")
        return row, rows, (h if grows else b)

    def valid_rows(self, lp: _Loop):
        """The rows a ``colsum_valid`` call counts: a scalar that moves with the loop, or one that
        counts every row. (Binary expansion takes the author's word that a callee given such a
        scalar computes each row of a taller tile as in the base tile holding it, and that it has
        a tile as tall as the loop's: a constant that counts fewer rows would break that word.)"""
        return self.pick(emin(lp.height, lp.end - lp.var * lp.b), lp.end - lp.var * lp.b, 64)

    def state_row(self):
        return self.pick(0, 1, 2, self.T - 1, weights=(4, 2, 1, 1))

    # blocks ---------------------------------------------------------------------------------
    def program(self) -> Program:
        for _ in range(self.rng.randint(1, 3)):
            block = self.pick(self.chain, self.pair, self.kstep_chain, weights=(5, 3, 1))
            around = self.rng.random()
            if block is not self.kstep_chain and around < 0.3:
                self.in_column_loop(block)
            elif around > 0.88:
                self.repeated(block)
            else:
                block(0, W)
        sets = tuple(dict(S=self.rng.choice((-2, 0, 1, 2, 3, 4, 5, 7, 9, 12)), L=self.rng.randint(0, 3),
                          T=self.rng.randint(0, 5)) for _ in range(3))
        return Program(self.seed, self.o.module(), sets)

    def repeated(self, block) -> None:
        """``block`` a few times over: what it updates in place is carried by the outer loop too
        (a chain of fused chains)."""
        with self.o.for_loop(self.loop_var("r"), 0, self.pick(1, 2, self.T)):
            block(0, W)

    def in_column_loop(self, block) -> None:
        """``block`` once per column block, the outer loop plain or adaptive over column blocks."""
        n = self.pick(1, 2, 3, self.L)
        if self.rng.random() < 0.3:
            with self.o.for_loop(self.loop_var("c"), 0, emin(n, NCB - 1), tile_levels={0: W, 2: 2 * W}) as c:
                block(c * W, c.rows)
        else:
            with self.o.for_loop(self.loop_var("c"), 0, emin(n, NCB)) as c:
                block(c * W, W)

    def chain(self, col, width) -> None:
        """A loop carrying one-row state, then perhaps a reader of the state."""
        rng, o = self.rng, self.o
        lb, ub, end = self.bounds()
        adaptive = rng.random() < 0.7
        levels = self.levels() if adaptive else None
        body = self.pick("direct", "handoff", "two_states", "same_twice", "recurrence", weights=(4, 3, 2, 1, 1))
        reassociate = adaptive and body != "recurrence" and rng.random() < 0.75
        attrs = dict(tile_levels=levels, reassociate=reassociate) if adaptive else dict(step=self.step(False))
        ai, arow = rng.randrange(2), self.state_row()
        acc = self.tensor(f"acc{ai}")
        kernel = self.pick(*ACCUMULATE, "colsum_valid")
        with o.for_loop(self.loop_var("j"), lb, ub, **attrs) as j:
            lp = _Loop(j, self.b, adaptive, end)
            row, rows, R = self.moving_rows(lp)
            src = self.any_of("x")
            dims = {"R": R, "W": width}
            if body == "handoff":
                t = self.any_of("t")
                o.call(KERNELS["plus1"], {"x": (src, row, col, rows, width), "y": (t, row, col, rows, width)}, dims)
                src = t
            args = {"x": (src, row, col, rows, width), "acc": (acc, arow, col, 1, width)}
            if kernel == "colsum_valid":
                args["n"] = self.valid_rows(lp)
                dims = {"R": lp.height, "W": width}
            o.call(KERNELS[kernel], args, dims)
            if body == "two_states":
                o.call(KERNELS[rng.choice(ACCUMULATE)], {"x": (src, row, col, rows, width),
                                                         "acc": (self.tensor(f"acc{1 - ai}"), arow, col, 1, width)},
                       dims)
            elif body == "same_twice":
                row2, rows2, R2 = self.moving_rows(lp)
                args = {"x": (self.any_of("x"), row2, col, rows2, width), "acc": (acc, arow, col, 1, width)}
                if kernel == "colsum_valid":
                    args["n"], R2 = self.valid_rows(lp), lp.height
                o.call(KERNELS[kernel], args, {"R": R2, "W": width})
            elif body == "recurrence":
                o.call(KERNELS["twice1"], {"y": (self.tensor(f"acc{1 - ai}"), 3, col, 1, width)},
                       {"R": 1, "W": width})
        self.written.append((acc, arow, col, 1, width))
        if rng.random() < 0.6:  # the state's reader (or a near miss: the row after it)
            near = rng.random() < 0.2
            reader = self.pick("finish", "plus1")
            o.call(KERNELS[reader], {"x": (acc, arow + (1 if near else 0), col, 1, width),
                                     "y": (self.any_of("y"), arow, col, 1, width)},
                   {"W": width} if reader == "finish" else {"R": 1, "W": width})

    def pair(self, col, width) -> None:
        """A producer and its consumer (or a near miss), straight or in a loop that carries
        nothing; the consumer may read what an earlier block wrote (a second reader)."""
        rng, o, M = self.rng, self.o, self.margin
        looped = rng.random() < 0.6
        if not looped:
            row, rows, R = M + self.pick(0, 1, self.b), self.b, self.b
            self._pair(row, rows, R, col, width)
            return
        lb, ub, end = self.bounds()
        adaptive = rng.random() < 0.6
        attrs = dict(tile_levels=self.levels()) if adaptive else dict(step=self.step(False))
        with o.for_loop(self.loop_var("j"), lb, ub, **attrs) as j:
            lp = _Loop(j, self.b, adaptive, end)
            row, rows, R = self.moving_rows(lp)
            self._pair(row, rows, R, col, width)

    def _pair(self, row, rows, R, col, width) -> None:
        rng, o, S, M = self.rng, self.o, self.S, self.margin
        t = self.any_of("t")
        dims = {"R": R, "W": width}
        # the producer reads an input, or what an earlier block wrote
        src = self.written[-1][0] if self.written and rng.random() < 0.25 else self.any_of("x")
        o.call(KERNELS["plus1"], {"x": (src, row, col, rows, width), "y": (t, row, col, rows, width)}, dims)
        # the consumer's region: the producer's, or one next to it
        near = self.pick("same", "shifted", "shorter", "clamped", weights=(6, 1, 1, 1))
        r2, n2 = {"same": (row, rows), "shifted": (row + 1, rows), "shorter": (row, emin(rows, 1)),
                  "clamped": (emax(emin(row, 2 * S + M), 0), rows)}[near]
        consumer = self.pick("plus1", "add2", "twice1", "accumulate", weights=(3, 2, 1, 1))
        if consumer == "plus1":
            o.call(KERNELS["plus1"], {"x": (t, r2, col, n2, width), "y": (self.any_of("y"), r2, col, n2, width)},
                   dims)
        elif consumer == "add2":
            o.call(KERNELS["add2"], {"a": (t, r2, col, n2, width), "b": (self.any_of("x"), r2, col, n2, width),
                                     "y": (self.any_of("y"), r2, col, n2, width)}, dims)
        elif consumer == "twice1":
            o.call(KERNELS["twice1"], {"y": (t, r2, col, n2, width)}, dims)
        else:
            o.call(KERNELS[rng.choice(ACCUMULATE)], {"x": (t, r2, col, n2, width),
                                                     "acc": (self.any_of("acc"), 4, col, 1, width)}, dims)
        self.written.append((t, row, col, rows, width))

    def kstep_chain(self, col, width) -> None:
        """A K-split product: ky += kx[:, k-block] @ kw[k-block, :], the state updated only by
        matmul_acc."""
        rng, o = self.rng, self.o
        lb, ub, end = self.bounds()
        adaptive = rng.random() < 0.7
        attrs = dict(tile_levels=self.levels(), reassociate=rng.random() < 0.8) if adaptive else {}
        with o.for_loop(self.loop_var("k"), lb, ub, **attrs) as k:
            lp = _Loop(k, self.b, adaptive, end)
            off, ext, R = self.moving_rows(lp)
            x, w, y = self.tensor("kx"), self.tensor("kw"), self.tensor("ky")
            o.call(KERNELS["kstep"], {"x": (x, 0, off, 4, ext), "w": (w, off, 0, ext, 4), "y": (y, 0, 0, 4, 4)},
                   {"R": R, "W": W})


def generate(seed: int) -> Program:
    """The program of ``seed`` and the scalar sets it is checked at."""
    return _Gen(seed).program()


def main(argv: list[str]) -> int:
    from tests.passes.fusion_check import check_fusion

    for a in argv:
        p = generate(int(a))
        print(p.text())
        out = check_fusion(p.module, list(p.scalars), seed=p.seed)
        print(f"# fused {out.fused}, refused {len(out.refused)}, runs {out.runs}, invalid scalar sets {out.invalid}")
        for r in out.refused + out.expansion_refused:
            print(f"#   refused: {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
