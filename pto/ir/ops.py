"""The tile instruction set: one Op enum, named op groups, and a signature per op.

The verifier (pto.ir.verify_instr, whose rules the builders apply as statements are added), the
printer and parser (pto.text), the reference tile evaluator (pto.evaluator, which the interpreter
and the torch backend run), the Triton renderer (pto.codegen.triton), the fusion passes
(pto.passes.fusion) and the persistent executor's cost model (pto.exec.cost) all branch on these groups
rather than on individual ops, so adding an op means adding it here and to the few tables that
give it meaning.
"""

from __future__ import annotations

import enum


class Op(enum.Enum):
    # memory
    LOAD = "load"
    STORE = "store"
    STORE_ADD = "store_add"
    LOAD_SCALAR = "load_scalar"
    # elementwise binary, tile (op) tile
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    # elementwise binary, tile (op) scalar
    ADDS = "adds"
    SUBS = "subs"
    MULS = "muls"
    DIVS = "divs"
    MAXS = "maxs"
    MINS = "mins"
    # unary
    EXP = "exp"
    EXP2 = "exp2"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIP = "recip"
    NEG = "neg"
    ABS = "abs"
    RELU = "relu"
    SILU = "silu"
    # reductions: rows (R x C -> R x 1), columns (R x C -> 1 x C)
    ROWSUM = "rowsum"
    ROWMAX = "rowmax"
    ROWMIN = "rowmin"
    ROWARGMAX = "rowargmax"
    ROWTAKEMAX = "rowtakemax"
    COLSUM = "colsum"
    COLMAX = "colmax"
    COLMIN = "colmin"
    # broadcast: a row vector (R x 1) or column vector (1 x C) against a tile
    ROWEXPAND = "rowexpand"
    ROWEXPANDADD = "rowexpandadd"
    ROWEXPANDSUB = "rowexpandsub"
    ROWEXPANDMUL = "rowexpandmul"
    ROWEXPANDDIV = "rowexpanddiv"
    COLEXPAND = "colexpand"
    COLEXPANDADD = "colexpandadd"
    COLEXPANDSUB = "colexpandsub"
    COLEXPANDMUL = "colexpandmul"
    COLEXPANDDIV = "colexpanddiv"
    # matrix
    MATMUL = "matmul"
    MATMUL_ACC = "matmul_acc"
    # conversion and data
    CAST = "cast"
    MOV = "mov"
    FULL = "full"
    # layout: every other column
    DEINTERLEAVE = "deinterleave"
    # masking (fill elements outside a predicate)
    MASK_CAUSAL = "mask_causal"
    MASK_COLS = "mask_cols"
    MASK_ROWS = "mask_rows"
    # collectives over the ranks of a device mesh (torch.distributed's default process group)
    ALLREDUCE = "allreduce"

    def __str__(self) -> str:
        return self.value


#: ``store_add %t, %mem[row, col]``: ``mem[region] += t`` (an f32 tile into an f32 memref) as one
#: atomic add an element, so that the items of one task may add into the same region (split-K
#: accumulation: a down projection summed over its intermediate's blocks); a task with one reads
#: and writes its memref (``inout``); the order of the adds, and so the f32 rounding of the sum,
#: is the executor's
STORES = frozenset({Op.STORE, Op.STORE_ADD})
MEMORY = frozenset({Op.LOAD}) | STORES
#: ``load_scalar %p, %mem[row, col]``: the integer value of one element of a region (device data:
#: a decode step's position or token id), a scalar the instructions after it may use
SCALAR_LOAD = frozenset({Op.LOAD_SCALAR})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN})
SCALAR_BINARY = frozenset({Op.ADDS, Op.SUBS, Op.MULS, Op.DIVS, Op.MAXS, Op.MINS})
ELEMENTWISE = BINARY | SCALAR_BINARY
UNARY = frozenset({Op.EXP, Op.EXP2, Op.LOG, Op.SQRT, Op.RSQRT, Op.RECIP, Op.NEG, Op.ABS, Op.RELU, Op.SILU})
#: ``rowargmax dst, a``: the column of each row's largest element (the first of equal ones), as a
#: number in the destination's float dtype (exact below 2**24); ``rowtakemax dst, a, b``: b's
#: element at that column (a second-stage argmax picks the index its first stage recorded)
ROW_REDUCE = frozenset({Op.ROWSUM, Op.ROWMAX, Op.ROWMIN, Op.ROWARGMAX, Op.ROWTAKEMAX})
COL_REDUCE = frozenset({Op.COLSUM, Op.COLMAX, Op.COLMIN})
REDUCE = ROW_REDUCE | COL_REDUCE
ROW_BROADCAST = frozenset({Op.ROWEXPAND, Op.ROWEXPANDADD, Op.ROWEXPANDSUB, Op.ROWEXPANDMUL,
                           Op.ROWEXPANDDIV})
COL_BROADCAST = frozenset({Op.COLEXPAND, Op.COLEXPANDADD, Op.COLEXPANDSUB, Op.COLEXPANDMUL,
                           Op.COLEXPANDDIV})
BROADCAST = ROW_BROADCAST | COL_BROADCAST
MATMUL = frozenset({Op.MATMUL, Op.MATMUL_ACC})
CAST = frozenset({Op.CAST, Op.MOV})
FILL = frozenset({Op.FULL})
MASK = frozenset({Op.MASK_CAUSAL, Op.MASK_COLS, Op.MASK_ROWS})
#: ``deinterleave dst, src {part = p}``: dst (R x C) = src's columns p, p + 2, p + 4, ... (src is
#: R x 2C; part 0 the even columns, 1 the odd ones), converted to dst's dtype: the two results of
#: a product whose weight columns were interleaved (gate and up, one accumulator)
LAYOUT = frozenset({Op.DEINTERLEAVE})
#: ``allreduce dst, src``: dst = the sum of src over every rank (each rank runs the same task
#: graph, so the same task issues the collective everywhere); with one rank, src itself
COLLECTIVE = frozenset({Op.ALLREDUCE})

GROUPS = {
    "memory": MEMORY,
    "scalar_load": SCALAR_LOAD,
    "elementwise": ELEMENTWISE,
    "unary": UNARY,
    "reduce": REDUCE,
    "broadcast": BROADCAST,
    "matmul": MATMUL,
    "cast": CAST,
    "fill": FILL,
    "mask": MASK,
    "layout": LAYOUT,
    "collective": COLLECTIVE,
}

# The arithmetic each elementwise/broadcast op applies, by name; renderers map these names to
# their own spelling (torch function, Triton expression).
ARITH = {
    Op.ADD: "add", Op.ADDS: "add", Op.ROWEXPANDADD: "add", Op.COLEXPANDADD: "add",
    Op.SUB: "sub", Op.SUBS: "sub", Op.ROWEXPANDSUB: "sub", Op.COLEXPANDSUB: "sub",
    Op.MUL: "mul", Op.MULS: "mul", Op.ROWEXPANDMUL: "mul", Op.COLEXPANDMUL: "mul",
    Op.DIV: "div", Op.DIVS: "div", Op.ROWEXPANDDIV: "div", Op.COLEXPANDDIV: "div",
    Op.MAX: "max", Op.MAXS: "max",
    Op.MIN: "min", Op.MINS: "min",
    Op.ROWEXPAND: "copy", Op.COLEXPAND: "copy",
}

REDUCE_KIND = {
    Op.ROWSUM: "sum", Op.COLSUM: "sum",
    Op.ROWMAX: "max", Op.COLMAX: "max",
    Op.ROWMIN: "min", Op.COLMIN: "min",
    Op.ROWARGMAX: "argmax", Op.ROWTAKEMAX: "takemax",
}

# Operand signature of each op: the kinds of its sources, in order.
#   T = tile, M = memref parameter, E = scalar expression (int or float)
# and whether it writes a destination tile.
SIGNATURE: dict[Op, tuple[str, bool]] = {}
for _op in BINARY:
    SIGNATURE[_op] = ("TT", True)
for _op in SCALAR_BINARY:
    SIGNATURE[_op] = ("TE", True)
for _op in UNARY | REDUCE | CAST:
    SIGNATURE[_op] = ("T", True)
SIGNATURE[Op.ROWTAKEMAX] = ("TT", True)
for _op in (Op.ROWEXPAND, Op.COLEXPAND):
    SIGNATURE[_op] = ("T", True)
for _op in BROADCAST - {Op.ROWEXPAND, Op.COLEXPAND}:
    SIGNATURE[_op] = ("TT", True)
for _op in MATMUL:
    SIGNATURE[_op] = ("TT", True)
for _op in MASK:
    SIGNATURE[_op] = ("TE", True)
SIGNATURE[Op.ALLREDUCE] = ("T", True)
SIGNATURE[Op.DEINTERLEAVE] = ("T", True)
SIGNATURE[Op.FULL] = ("E", True)
SIGNATURE[Op.LOAD] = ("MEE", True)
SIGNATURE[Op.STORE] = ("TMEE", False)
SIGNATURE[Op.STORE_ADD] = ("TMEE", False)
SIGNATURE[Op.LOAD_SCALAR] = ("MEE", True)  # the destination is a scalar name, not a tile

# Attributes each op accepts, with their defaults. Anything else is a build error.
ATTRS: dict[Op, dict[str, object]] = {op: {} for op in Op}
# step: the tile's rows are every step-th row of the region from the offset (a strided load)
ATTRS[Op.LOAD] = {"pad": 0.0, "step": 1}
ATTRS[Op.MATMUL] = {"ta": False, "tb": False, "acc": "f32"}
ATTRS[Op.MATMUL_ACC] = {"ta": False, "tb": False, "acc": "f32"}
for _op in MASK:
    ATTRS[_op] = {"fill": float("-inf")}
# the dtype the ranks' values are summed (and sent) in: f32, or the source tile's own dtype
# (half the bytes on the wire for a half-precision tile, rounded at every step of the reduction)
ATTRS[Op.ALLREDUCE] = {"acc": "f32"}
ATTRS[Op.DEINTERLEAVE] = {"part": 0}

assert set(SIGNATURE) == set(Op), set(Op) - set(SIGNATURE)

BY_NAME = {op.value: op for op in Op}
