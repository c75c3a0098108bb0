"""The body of a Triton InCore kernel: a specialized InCore function rendered as a
``@triton.jit`` device function that runs one task (and one index of its parallel axis, or in
the persistent "blocks" form a program's share of them: :meth:`BodyRenderer._block_loop`).

Numerics follow :mod:`pto.evaluator.machine`: elementwise, unary, reduction, broadcast and
mask ops compute in f32 and round to the destination's dtype; matmul feeds the operands in their
own dtype to ``tl.dot`` with f32 accumulation (an exact f32 broadcast-multiply-sum where a block
dim is below 16, which ``tl.dot`` does not take); loads read ``pad`` outside the valid extent and
stores skip it; scalar ``//`` and ``%`` floor as in Python. A tile whose dims are not powers of
two is held in a padded block whose padding lanes never reach a logical lane
(:mod:`pto.codegen.triton.tileops` says how); the code of power-of-two tiles has no padding.

The walk is generic: this module walks the structure (parameters, loops and the tiles they
carry, scalar expressions), :mod:`pto.codegen.triton.tileops` renders the tile instructions, one
method per op group with small per-op format tables (the options, table layout, literals and
file prelude they share with the kernel builders are in :mod:`pto.codegen.triton.common`). Both
executors call the same device function: the batched kernels of :mod:`pto.codegen.triton.kernel`
and the persistent megakernel of :mod:`pto.codegen.triton.megakernel`.
"""

from __future__ import annotations

from dataclasses import replace

from pto.codegen.triton import quant_groups
from pto.codegen.triton.common import (
    ALIGN,
    FLAT_STAGES,
    GROUPED_ROWS,
    LINE_BYTES,
    NAN_SOURCE,
    PDL_SIGNAL,
    PDL_WAIT,
    TL_DTYPE,
    RenderOptions,
    TableLayout,
    block_shape,
    check_tiles,
    device_name,
    float_literal,
    reads_by_groups,
)
from pto.codegen.triton.operands import separate_operand_loads
from pto.codegen.triton.quant import render_helpers
from pto.codegen.triton.tileops import TileOps
from pto.codegen.triton.tma import tma_memrefs
from pto.errors import BuildError
from pto.ir.analysis import gemv_quantized_loads, instr_reads, param_access, substitute_stmt
from pto.ir.dtypes import DType
from pto.ir.expr import Attr, Bin, Const, Expr, Fn, Var, const_value
from pto.ir.facts import constant_trips, loop_ranges
from pto.ir.nodes import ForRange, IncoreFunction, Instr, walk_instrs
from pto.ir.ops import MATMUL, MEMORY, SCALAR_LOAD, SIGNATURE, STORES, Op
from pto.ir.quant import FORMATS

# scalar-expression operators: Python spelling that keeps the IR's integer semantics
_EXPR_FMT = {
    "+": "({a} + {b})",
    "-": "({a} - {b})",
    "*": "({a} * {b})",
    "//": "_floordiv({a}, {b})",
    "%": "_floormod({a}, {b})",
    "<": "({a} < {b}).to(tl.int32)",
    "<=": "({a} <= {b}).to(tl.int32)",
    ">": "({a} > {b}).to(tl.int32)",
    ">=": "({a} >= {b}).to(tl.int32)",
    "==": "({a} == {b}).to(tl.int32)",
    "!=": "({a} != {b}).to(tl.int32)",
    "and": "(({a} != 0) & ({b} != 0)).to(tl.int32)",
    "or": "(({a} != 0) | ({b} != 0)).to(tl.int32)",
    "min": "tl.minimum({a}, {b})",
    "max": "tl.maximum({a}, {b})",
}

# tile dataflow: which loops carry which tiles ------------------------------------------------


def _reads(ins: Instr) -> set[str]:
    names = {x for k, x in zip(SIGNATURE[ins.op][0], ins.srcs) if k == "T"}
    if ins.op is Op.MATMUL_ACC:
        names.add(ins.dst)
    return names


def _first_access(body, tile: str) -> str | None:
    """"read" if ``tile`` may be read in ``body`` before being written, "write" if it is written
    first on every path, None if the body leaves it alone (loops may run zero times)."""
    for s in body:
        if isinstance(s, ForRange):
            if _first_access(s.body, tile) == "read":
                return "read"
        else:
            if tile in _reads(s):
                return "read"
            if s.dst == tile:
                return "write"
    return None


def _written(body) -> set[str]:
    return {i.dst for i in walk_instrs(body) if i.dst is not None}


def _live_after(frames: list[tuple[tuple, int]], tile: str) -> bool:
    """May ``tile`` be read after statement ``frames[0]`` (body, index), before being
    rewritten? ``frames[1:]`` are the enclosing loops' positions, innermost first."""
    for depth, (body, idx) in enumerate(frames):
        first = _first_access(body[idx + 1:], tile)
        if first is not None:
            return first == "read"
        if depth + 1 < len(frames):  # end of a loop body: the next iteration may read it
            obody, oidx = frames[depth + 1]
            if _first_access(obody[oidx].body, tile) == "read":
                return True
    return False


# the programmatic-dependent-launch wait inside the body (RenderOptions.pre) --------------------


def _touches(s, pre: frozenset) -> bool:
    """Does statement ``s`` access memory other than by a load of a ``pre`` memref (what must
    come after the wait for the previous launch)?"""
    return any(i.op in MEMORY | SCALAR_LOAD and not _pre_load(i, pre)
               for i in (walk_instrs((s,)) if isinstance(s, ForRange) else (s,)))


def _one_trip(s) -> bool:
    """A loop that runs exactly once."""
    return isinstance(s, ForRange) and constant_trips(s) == 1


def _flat(stmts: tuple) -> tuple:
    """``stmts`` with each loop that runs once replaced by its body (the loop variable its start)."""
    out = []
    for s in stmts:
        if _one_trip(s):
            out += _flat(tuple(substitute_stmt(b, {s.var: s.lb}) for b in s.body))
        else:
            out.append(s)
    return tuple(out)


def _pre_load(s, pre: frozenset) -> bool:
    """A load (of a tile or a scalar) of a ``pre`` memref."""
    return isinstance(s, Instr) and s.op in (Op.LOAD, Op.LOAD_SCALAR) and s.srcs[0] in pre


def early_loads(stmts: tuple, pre: frozenset) -> tuple | None:
    """The body with its loops that run once flattened and the loads (of tiles and scalars) of
    ``pre`` memrefs (memory the launch before does not write) moved up to the first statement
    that touches other memory, where they may move: past statements that neither read nor write
    their tile nor define a scalar their offsets use, and never past a store (which may write
    what they read: an in-place residual binds two memrefs to one tensor), nor past a product (a
    later phase's weights, held in registers through the phase before: the folded FFN's down
    projection weights loaded before its gate and up products took a 16 KiB stack frame of
    spills at one row, 32 registers, and its step 100 ms on an H200 against 0.6 at two rows).
    None where no such load would come before that first statement (the kernel then waits before
    the body, as without ``pre``). A longer loop is not peeled: the 8B model's GEMVs (K loops of 4
    and 7 steps) with their first step's weights loaded early took 5.78 against 5.64 ms a step on
    an H100."""
    stmts = _flat(stmts)
    first = next((i for i, s in enumerate(stmts) if _touches(s, pre)), len(stmts))
    moved, rest, tiles, scalars, closed = [], [], set(), set(), False
    for s in stmts[first:]:
        offsets = set().union(*(e.free_vars() for e in s.srcs[1:])) if _pre_load(s, pre) else set()
        if _pre_load(s, pre) and not closed and s.dst not in tiles and not offsets & scalars:
            moved.append(s)
            continue
        rest.append(s)
        for i in (walk_instrs((s,)) if isinstance(s, ForRange) else (s,)):
            tiles |= instr_reads(i) | ({i.dst} if i.dst is not None else set())
            if i.op is Op.LOAD_SCALAR:
                scalars.add(i.dst)
            # a store may write what a later load reads (aliases); a product ends the first phase
            closed = closed or i.op in STORES or i.op in MATMUL
    early = any(_pre_load(s, pre) or (isinstance(s, ForRange) and any(_pre_load(i, pre) for i in walk_instrs(s.body)))
                for s in stmts[:first]) or bool(moved)
    return stmts[:first] + tuple(moved) + tuple(rest) if early else None


def _before_wait(stmts: tuple, pre: frozenset) -> frozenset[str]:
    """The memrefs ``stmts`` (as :func:`early_loads` leaves them) load before the wait."""
    out = set()
    for s in stmts:
        if _touches(s, pre):
            break
        out |= {i.srcs[0] for i in (walk_instrs((s,)) if isinstance(s, ForRange) else (s,)) if _pre_load(i, pre)}
    return frozenset(out)


# the loop over a task's parallel indices (RenderOptions.persistent "blocks") ----------------------

#: the operations with effects past their destination tile: they run for every block
_EFFECTS = STORES | {Op.ALLREDUCE}


def block_invariant(stmts: tuple, var: str) -> tuple[tuple, tuple]:
    """``stmts`` (a body with its one-trip loops flattened, :func:`_flat`) parted into the
    statements that do not depend on the parallel index ``var`` and those that do, each part in
    its order: the first run once a program, before its loop over its task's indices; the others
    in that loop. A statement depends on the index where an operand or a loop bound names it or
    a scalar a dependent statement loads, where it reads a tile a dependent statement writes,
    where it writes a tile a dependent statement also writes (an accumulator each index starts
    afresh) or reads before it (the read must see the earlier value), where it stores (or is a
    collective), or where it loads after a store (two memrefs may bind one tensor, as an
    in-place residual's do); a loop depends as a whole if anything in it does. Sound by the
    parallel axis's contract: no index writes what another reads, so a load that names no index
    and comes before every store reads the same values for every one."""
    def parts(s) -> list:
        return list(walk_instrs((s,))) if isinstance(s, ForRange) else [s]

    def names(s) -> set[str]:
        exprs = [x for i in parts(s) for x in i.srcs if isinstance(x, Expr)]
        for loop in ([s] if isinstance(s, ForRange) else []):
            exprs += [loop.lb, loop.ub, loop.step]
        return set().union(*(e.free_vars() for e in exprs)) if exprs else set()

    def writes(s) -> set[str]:
        return {i.dst for i in parts(s) if i.dst is not None and i.op is not Op.LOAD_SCALAR}

    def reads(s) -> set[str]:
        return set().union(*(instr_reads(i) for i in parts(s)))

    effect = next((k for k, s in enumerate(stmts) if any(i.op in _EFFECTS for i in parts(s))), len(stmts))
    dep = [k > effect and any(i.op in (Op.LOAD, Op.LOAD_SCALAR) for i in parts(s)) for k, s in enumerate(stmts)]
    while True:
        scalars = {var} | {i.dst for s, d in zip(stmts, dep) if d for i in parts(s) if i.op is Op.LOAD_SCALAR}
        tiles = set().union(*(writes(s) for s, d in zip(stmts, dep) if d))
        now, read = [], set()  # (read: what the dependent statements before this one read)
        for s, d in zip(stmts, dep):
            d = d or bool(names(s) & scalars) or any(i.op in _EFFECTS for i in parts(s)) \
                or bool((reads(s) | writes(s)) & tiles) or bool(writes(s) & read)
            now.append(d)
            read |= reads(s) if d else set()
        if now == dep:
            return (tuple(s for s, d in zip(stmts, dep) if not d), tuple(s for s, d in zip(stmts, dep) if d))
        dep = now


def block_weights(each: tuple, allowed: set[str], readonly: frozenset[str]) -> tuple:
    """The loads of ``each`` (a block's statements, :func:`block_invariant`'s) that a program may
    issue a block ahead (the next block's while this one computes; the first block's before the
    PDL wait): loads of memrefs the function only reads, outside any loop, addressed by the index
    alone (the names ``allowed``: the index, and a K loop's variable for :func:`step_weights`),
    into tiles no other statement of the block writes nor reads before them."""
    out = []
    for k, s in enumerate(each):
        if not (isinstance(s, Instr) and s.op is Op.LOAD and s.srcs[0] in readonly):
            continue
        if not set().union(*(e.free_vars() for e in s.srcs[1:] if isinstance(e, Expr))) <= allowed:
            continue
        others = [i for j, t in enumerate(each) if j != k for i in walk_instrs((t,))]
        before = [i for t in each[:k] for i in walk_instrs((t,))]
        if any(i.dst == s.dst for i in others) or any(s.dst in instr_reads(i) for i in before):
            continue
        out.append(s)
    return tuple(out)


def step_weights(loop: ForRange, var: str, readonly: frozenset[str]) -> tuple:
    """The loads of ``loop`` (a K loop of a run's index, rendered as a loop over blocks) that a
    program may issue a step ahead, the next step's (past the last, the next index's first) while
    this one computes: :func:`block_weights` of its body addressed by its variable and the index
    ``var``, in a loop of constant bounds and one trip or more (none in another: a load at its
    first step before it, or the next index's, must be one the loop makes) that stores nothing
    and runs no collective (a next step's load would come before this step's store, and two
    memrefs may bind one tensor)."""
    trips = constant_trips(loop)
    if not trips or any(i.op in _EFFECTS for i in walk_instrs(loop.body)):
        return ()
    return block_weights(loop.body, {loop.var, var}, readonly)


#: the values of ``RenderOptions.k_ahead`` ("" and "auto" render as "off": "auto" is the backend's
#: to decide per function)
K_AHEAD = ("", "off", "auto", "on", "first")


# the megakernel's wait and its L2 prefetch ------------------------------------------------------

#: the megakernel form's extra parameters (:class:`BodyRenderer`'s ``megakernel``): the task's
#: predecessor counter and whether to wait on it, the error flag, the trace clock and switch, and
#: the wait's constants (:func:`pto.codegen.triton.megakernel.render_megakernel` defines ``_pto_wait``)
MK_PARAMS = "W_cnt, W_on, W_err, W_clock, W_tracing, MAX_POLLS: tl.constexpr, GPU: tl.constexpr, PREFETCH: tl.constexpr"
MK_WAIT = "_ok, _t0 = _pto_wait(W_cnt, W_on, W_err, W_clock, W_tracing, MAX_POLLS, GPU)"


def _pre_loads(stmts, pre: frozenset, defined: set[str]) -> list[Instr]:
    """The tile loads of ``pre`` memrefs among ``stmts`` whose offsets use only ``defined`` names."""
    return [i for i in stmts if isinstance(i, Instr) and i.op is Op.LOAD and i.srcs[0] in pre
            and set().union(*(e.free_vars() for e in i.srcs[1:])) <= defined]


def _trip_bytes(s: ForRange, pre: frozenset, blocks: dict, dtypes: dict, defined: set[str]) -> int:
    """The bytes a trip of loop ``s`` loads of ``pre`` memrefs at offsets of ``defined`` names (and
    the loop's variable); 0 where its bounds use other names or it loads none."""
    bounds = set().union(*(e.free_vars() for e in (s.lb, s.ub, s.step)))
    loads = _pre_loads(s.body, pre, defined | {s.var})
    if not loads or not bounds <= defined:
        return 0
    return sum(blocks[i.dst][0] * blocks[i.dst][1] * dtypes[i.dst].itemsize for i in loads)


def prefetch_plan(rest: tuple, pre: frozenset, blocks: dict, dtypes: dict, defined: set[str],
                  budget: int) -> list[tuple[ForRange, int]]:
    """The loops of ``rest`` (the statements from the wait on) whose ``pre`` loads can be
    prefetched into L2 before the wait, each with its trips to prefetch: a loop whose bounds use
    only ``defined`` names (those in scope at the wait), its loads whose offsets do (and the
    loop's variable); as many trips as ``budget`` bytes hold, shared by the loops in order (at
    least one trip of a loop that starts within it)."""
    out = []
    for s in rest:
        if budget <= 0:
            break
        per_trip = _trip_bytes(s, pre, blocks, dtypes, defined) if isinstance(s, ForRange) else 0
        if not per_trip:
            continue
        trips = max(1, budget // per_trip)
        out.append((s, trips))
        budget -= trips * per_trip
    return out


def whole_trips(plan: list[tuple[ForRange, int]]) -> list[tuple[ForRange, int]] | None:
    """``plan``'s loops each with all its trips, where every one's bounds are constants (None
    where one's are not)."""
    out = [(s, constant_trips(s)) for s, _ in plan]
    return None if any(n is None for _, n in out) else out


# the renderer ---------------------------------------------------------------------------------


class BodyRenderer(TileOps):
    """Walks a specialized InCore function's body into Triton source lines."""

    def __init__(self, fn: IncoreFunction, opts: RenderOptions, stages: int | None = None,
                 megakernel: bool = False, runs: bool = False, prefetch: bool = True, noinline: bool = False):
        # Triton 3.6's pipelining and a multiplied tile read otherwise: the other readers' own load
        fn, self.copies = separate_operand_loads(fn)
        #: the megakernel's form (:data:`MK_PARAMS`): the function waits for its task's
        #: predecessors itself, after the loads of ``opts.pre`` that may come first and the L2
        #: prefetch of those in its loops, and returns whether the wait succeeded and when it ended
        self.mk = megakernel
        #: (the megakernel's form, a function with a parallel axis) the function runs a run of
        #: ``n_run`` consecutive parallel indices from its first, one wait for all: a loop over
        #: them flattened with the function's own and pipelined ``stages`` deep (else
        #: :data:`FLAT_STAGES`), so the next indices' tiles stream into shared memory while this
        #: one's compute (Triton 3.6 pipelines a multiply-sum's loads only so); nothing loads early.
        #: (:attr:`run_blocks`: a loop over blocks instead, its own loops ``stages`` deep)
        self.runs = runs and megakernel and fn.parallel is not None
        #: (a run, ``RenderOptions.run_loop`` "blocks" or "steps", a constant extent) the run
        #: rendered as the loop over blocks (:meth:`_block_loop`): after the wait, the statements
        #: of no index once and the first index's weights, then each index's next weights loaded
        #: ahead in registers ("steps": and its K loops' next steps' too, :meth:`_step_ahead`)
        self.run_blocks = self.runs and opts.run_loop in ("blocks", "steps") and \
            const_value(fn.parallel.extent) is not None
        #: (the megakernel's form) the L2 prefetch before the wait is rendered (``PREFETCH`` picks
        #: its level at compile time); False: this branch's tasks do not prefetch
        self.l2 = prefetch
        #: (the megakernel's form) the device function is compiled as a function of its own, not
        #: inlined into the kernel (:data:`pto.codegen.triton.megakernel.CALLS`)
        self.noinline = noinline and megakernel
        self.withheld = False  # a prefetch the body would have had is left out (not ``l2``)
        self.fn = fn
        self.opts = opts
        self.stages = stages  # software-pipelining depth of every loop (None: the launch's)
        self.shapes = check_tiles(fn)  # logical
        self.blocks = {name: block_shape(shape) for name, shape in self.shapes.items()}
        self.dtypes = {t.name: t.dtype for t in fn.tiles}
        self.memrefs = {p.name: p for p in fn.memrefs}
        self.layout = TableLayout(tuple(p.name for p in fn.memrefs), tuple(p.name for p in fn.scalars))
        self.names: dict[str, str] = {p.name: f"s_{p.name}" for p in fn.scalars}
        for p in fn.memrefs:
            self.names[f"{p.name}.rows"] = f"m_{p.name}_rows"
            self.names[f"{p.name}.cols"] = f"m_{p.name}_cols"
        self.ranges = loop_ranges(fn)
        #: memrefs the kernel may load through tensor descriptors (RenderOptions.tma)
        self.tma = tma_memrefs(fn) if opts.tma else {}
        self.lines: list[str] = []
        self.depth = 1
        self.defined: set[str] = set()
        self.tmp = 0
        self.div = "tl.math.div_rn" if opts.ieee_math else "tl.math.fdiv"
        self.sqrt = "tl.math.sqrt_rn" if opts.ieee_math else "tl.sqrt"
        #: (RenderOptions.persistent "blocks", a function with a parallel axis outside the
        #: megakernel) the program loops over its task's parallel indices (:func:`block_invariant`)
        self.block_loop = opts.persistent == "blocks" and fn.parallel is not None and not megakernel
        self.block_ahead = False  # (set by _block_loop: its blocks load the next one's weights ahead)
        #: (set by _block_loop, a run's) the K loops whose weights load a step ahead, by id, with
        #: those loads (:func:`step_weights`) and the suffix of the tiles they load into
        self.step_ahead: dict[int, tuple[tuple, str]] = {}
        #: (a batched kernel, ``RenderOptions.k_ahead`` "on") the K loops of a quantized GEMV
        #: whose next step's read-only tiles load ahead, by id, with those loads and the suffix of
        #: their tiles (:meth:`_plan_k_ahead`); each moves to :attr:`step_ahead` as it is rendered
        self.k_loops: dict[int, tuple[tuple, str]] = {}
        self.peeled = False  # (k_ahead "first") a loop's first step was peeled off it
        self.pre = frozenset(opts.pre) if (opts.pdl or megakernel) and not self.runs else frozenset()
        #: the memrefs the function only reads (the megakernel's ``PREFETCH >= 2`` prefetches their
        #: loops' first trips into L2 before the wait even where a predecessor writes them)
        self.read_only = frozenset(n for n, a in param_access(fn).items() if a.direction == "in") if megakernel \
            else frozenset()
        #: the memrefs the body loads before it waits for the previous launch itself (none: the
        #: kernel waits before it calls the device function); ``waiting``: that wait is to come
        self.early: frozenset[str] = frozenset()
        self.waiting = False
        #: (a run) the memrefs it prefetches into L2 before its wait (:meth:`run_prefetch`)
        self.prefetched: frozenset[str] = frozenset()
        #: the quantized formats the body loads (their helpers come with the device function);
        #: the quantized tiles only a GEMV's product reads (it takes their planes, no values:
        #: :func:`pto.ir.analysis.gemv_quantized_loads`), and the planes' names of each once loaded
        self.quantized: set[str] = set()
        #: ``x_rows``: each fused tile's x's block rows (past one: read by groups, a few rows of x)
        self.fused, self.x_rows = self._fused_loads(fn)
        self.planes: dict[str, list[str]] = {}
        #: the fused tiles read by groups (RenderOptions.qgemv), with their block's rows and columns
        self.grouped: dict[str, tuple[int, int]] = {}

    def _fused_loads(self, fn: IncoreFunction) -> tuple[frozenset[str], dict[str, int]]:
        """The quantized tiles only a GEMV's product reads (:func:`gemv_quantized_loads`), of x
        of one row, or of up to :data:`GROUPED_ROWS` rows where the product reads by groups
        (``RenderOptions.qgemv``) and the tile's format and columns allow it
        (:func:`quant_groups.applies`: the other tiles of a few rows keep their values and the
        plain product); with each one's x's block rows."""
        grouped = reads_by_groups(self.opts.qgemv)
        fused = gemv_quantized_loads(fn, lambda a: self.blocks[a][0] == 1 or
                                     (grouped and self.blocks[a][0] <= GROUPED_ROWS))
        x_of = {i.srcs[1]: i.srcs[0] for i in walk_instrs(fn.body) if i.op is Op.MATMUL_ACC}
        mem_of = {i.dst: i.srcs[0] for i in walk_instrs(fn.body) if i.op is Op.LOAD}
        rows = {t: self.blocks[x_of[t]][0] for t in fused}
        keep = {t for t in fused if rows[t] == 1 or
                quant_groups.applies(self.memrefs[mem_of[t]].dtype.quant, self.shapes[t][1], self.blocks[t][1])}
        return frozenset(keep), {t: rows[t] for t in keep}

    # output ---------------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def fresh(self, stem: str) -> str:
        # every temporary gets its own name: a name reused inside a loop would make Triton
        # carry it across iterations (with a mismatched shape)
        self.tmp += 1
        return f"_{stem}{self.tmp}"

    # scalar expressions ----------------------------------------------------------------------
    def expr(self, e: Expr) -> str:
        """Source of an integer expression; always an atom (a name, a number, a call or a
        parenthesized operation), so callers may apply operators and ``.to()`` to it."""
        if isinstance(e, Const):
            v = e.value
            text = repr(float(v)) if isinstance(v, float) else str(int(v))
            return f"({text})" if v < 0 else text
        if isinstance(e, (Var, Attr)):
            key = e.name if isinstance(e, Var) else f"{e.base}.{e.field}"
            if key not in self.names:
                raise BuildError(f"`{self.fn.variant_name}`: `{key}` has no value in the Triton kernel")
            return self.names[key]
        if isinstance(e, Bin):
            return _EXPR_FMT[e.op].format(a=self.expr(e.a), b=self.expr(e.b))
        if isinstance(e, Fn) and e.name == "select":
            c, a, b = (self.expr(x) for x in e.args)
            return f"tl.where({c} != 0, {a}, {b})"
        raise BuildError(f"`{self.fn.variant_name}`: `{e}` cannot be computed inside a Triton kernel")

    def scalar_f32(self, e: Expr) -> str:
        """A tile-scalar operand as f32 (the reference converts it with torch.as_tensor(f32))."""
        v = const_value(e)
        if v is not None:
            return float_literal(float(v))
        return f"{self.expr(e)}.to(tl.float32)"

    # tiles --------------------------------------------------------------------------------------
    def f32(self, tile: str) -> str:
        self.use(tile)
        return f"t_{tile}" if self.dtypes[tile] is DType.F32 else f"t_{tile}.to(tl.float32)"

    def use(self, tile: str) -> None:
        if tile not in self.defined:
            # read before any write: the reference's tiles start as NaN
            self.init_nan(tile)

    def init_nan(self, tile: str) -> None:
        r, c = self.blocks[tile]
        self.emit(f"t_{tile} = tl.full(({r}, {c}), {NAN_SOURCE}, {TL_DTYPE[self.dtypes[tile]]})")
        self.defined.add(tile)

    def assign(self, dst: str, value: str, dtype: DType = DType.F32) -> None:
        """``t_dst = value`` rounded to dst's dtype (``value`` has dtype ``dtype``)."""
        if self.dtypes[dst] is not dtype:
            value = f"({value}).to({TL_DTYPE[self.dtypes[dst]]})"
        self.emit(f"t_{dst} = {value}")
        self.defined.add(dst)

    # structure ------------------------------------------------------------------------------
    def device_function(self) -> tuple[str, list[str]]:
        """``(name, source lines)`` of the ``@triton.jit`` device function that runs one task
        (and one parallel index) given its table row: the contract in the package docstring."""
        fn = self.fn
        self.lines, self.depth = [], 1
        params = ["row"]
        if fn.parallel is not None:
            pvar = f"i_{fn.parallel.var}"
            self.names[fn.parallel.var] = pvar
            # (blocks: the program's first index and the programs the task's indices are dealt to)
            params.append(f"{pvar}0, n_run" if self.runs else f"{pvar}0, NPJ" if self.block_loop else pvar)
        params += [f"P_{p.name}, S_{p.name}" for p in fn.memrefs]
        params += [", ".join(f"{w}_{p.name}: tl.constexpr" for p in fn.memrefs) for w in ("EVEN", "ALIGN")]
        params += [f"D_{m}, TMA_{m}: tl.constexpr" for m in self.tma]
        if self.mk:
            params.append(MK_PARAMS)
            # (a task whose parallel index is past its extent runs nothing and succeeds)
            self.emit("_ok = tl.full((), 1, tl.int32)")
            self.emit("_t0 = tl.zeros((), dtype=tl.int64)")
        for p in fn.memrefs:
            for fld in TableLayout.FIELDS:
                self.emit(f"m_{p.name}_{fld} = tl.load(row + {self.layout.column(p.name, fld)})")
            # ALIGN: the region's first column and its width are multiples of 16, so a column
            # mask is constant over 16 lanes and masked loads keep their vector width
            self.emit(f"if ALIGN_{p.name}:")
            self.emit(f"    m_{p.name}_c0 = tl.multiple_of(m_{p.name}_c0, {ALIGN})")
            self.emit(f"    m_{p.name}_cols = tl.multiple_of(m_{p.name}_cols, {ALIGN})")
            # the region's origin, in int64: row * stride overflows int32 on large tensors (a
            # quantized memref's rows of bytes: its first row; the columns are the load's)
            col0 = "" if p.dtype.is_quantized else f" + m_{p.name}_c0"
            self.emit(f"P_{p.name} = P_{p.name} + m_{p.name}_r0.to(tl.int64) * S_{p.name}{col0}")
        for s in fn.scalars:
            self.emit(f"s_{s.name} = tl.load(row + {self.layout.column(s.name)})")
        if self.block_loop:  # the statements of no index once, then the program's indices
            self._block_loop(fn)
            return self._finish(fn, params)
        guarded = fn.parallel is not None and const_value(fn.parallel.extent) is None
        if self.runs:  # one wait, then the run's loop (the body's statements each index)
            self.run_prefetch()
            self.emit(MK_WAIT)
            if self.run_blocks:  # (or a loop over blocks)
                self._block_loop(fn, run=True)
                self.emit("return _ok, _t0")
                return self._finish(fn, params)
            pvar = self.names[fn.parallel.var]
            # (the index from the run's first, a tensor: under the interpreter a loop's variable is an int)
            self.emit(f"for _r in tl.range(0, n_run, num_stages={self.stages or FLAT_STAGES}, flatten=True):")
            self.depth += 1
            self.emit(f"{pvar} = {pvar}0 + _r")
        if guarded:
            # a task's own extent may be below the grid's (a constant extent is the grid itself)
            self.emit(f"if {self.names[fn.parallel.var]} < {self.expr(fn.parallel.extent)}:")
            self.depth += 1
        if self.opts.k_ahead not in K_AHEAD:
            raise BuildError(f"RenderOptions.k_ahead={self.opts.k_ahead!r}: one of {', '.join(map(repr, K_AHEAD))}")
        stmts = self._peel_first(fn.body) if self.opts.k_ahead == "first" and not self.mk else fn.body
        early = early_loads(stmts, self.pre) if self.pre else None
        self.early = frozenset() if early is None else _before_wait(early, self.pre)
        self.waiting = bool(self.early) or (self.mk and not self.runs)
        if self.opts.k_ahead == "on" and not self.mk:
            self._plan_k_ahead(stmts if early is None else early)
        self.body(stmts if early is None else early, [])
        if self.waiting:  # pragma: no cover - every task stores
            self.wait(())
        if self.mk:
            self.depth = 1
            if guarded and not self.runs:  # an item with nothing to do (a task of extent 0) still waits
                self.emit("else:")
                self.emit("    " + MK_WAIT)
            self.emit("return _ok, _t0")
        return self._finish(fn, params)

    def _block_loop(self, fn: IncoreFunction, run: bool = False) -> None:
        """(persistent "blocks") The program's blocks: the block's weights of its first block
        (:func:`block_weights`; a constant extent, so that every program has one) loaded into
        ``<tile>__n`` (before the PDL wait where they are all ``pre`` memrefs), the statements of
        no index (:func:`block_invariant`; none for an extent not constant), then a loop over the
        program's indices, each taking the weights loaded ahead as its own and loading the next
        index's (past its last, its own again) before its other statements. ``run``: the
        megakernel item's run instead (:attr:`run_blocks`, after its wait): the ``n_run``
        consecutive indices from its first."""
        var = fn.parallel.var
        pvar, ext = self.names[var], self.expr(fn.parallel.extent)
        # (a constant extent: every program has a first index; otherwise a task of none, or a
        # program past its task's extent, must run nothing, hoisted scalar loads included)
        constant = const_value(fn.parallel.extent) is not None
        hoisted, each = block_invariant(_flat(fn.body), var) if constant else ((), _flat(fn.body))
        readonly = frozenset(p for p, a in param_access(fn).items() if a.direction == "in")
        ahead = block_weights(each, {var}, readonly) if constant else ()
        self.block_ahead = bool(ahead)
        rest = tuple(s for s in each if not any(s is w for w in ahead))
        nxt = {w.dst: f"{w.dst}__n" for w in ahead}
        for tile, name in nxt.items():
            self._alias(tile, name)

        def load_ahead(index: str) -> None:
            self.names["__block"], self.ranges["__block"] = index, self.ranges[var]
            for w in ahead:
                self.instr(substitute_stmt(replace(w, dst=nxt[w.dst]), {var: Var("__block")}))
            del self.names["__block"], self.ranges["__block"]

        load_ahead(f"{pvar}0")
        # (a run's K loops at one stage: each step's weights a step ahead, the first index's first
        # step's here; :meth:`_step_ahead`)
        if run and self.opts.run_loop == "steps" and (self.stages or 1) == 1:
            for s in rest:
                weights = step_weights(s, var, readonly) if isinstance(s, ForRange) else ()
                if weights:
                    # (a loop's own names: two loops may load ahead into one tile)
                    ahead_of = f"__k{len(self.step_ahead)}"
                    self.step_ahead[id(s)] = (weights, ahead_of)
                    for w in weights:
                        self._alias(w.dst, w.dst + ahead_of)
                    self._load_step(s, weights, ahead_of, f"{pvar}0", self.expr(s.lb))
        if ahead and self.pre and all(w.srcs[0] in self.pre for w in ahead):
            self.early = frozenset(w.srcs[0] for w in ahead)
            self.wait(())
        for idx, s in enumerate(hoisted):  # (a loop's tiles read in the indices' loop are carried out of it)
            if isinstance(s, ForRange):
                self.loop(s, [(hoisted + each, idx)])
            else:
                self.instr(s)
        # (the index from the program's first, a tensor: under the interpreter a loop's variable is an int)
        if run:
            self.emit("for _b in tl.range(0, n_run):")
            self.depth += 1
            self.emit(f"{pvar} = {pvar}0 + _b")
        else:
            self.emit(f"for _b in tl.range(0, tl.cdiv({ext} - {pvar}0, NPJ)):")
            self.depth += 1
            self.emit(f"{pvar} = {pvar}0 + _b * NPJ")
        outer = set(self.defined)
        for tile, name in nxt.items():
            self._take(tile, name)
        if ahead:  # (past the program's (run's) last index: its own again, still in L1)
            following = self.fresh("next")
            more, step = ("_b + 1 < n_run", "1") if run else (f"{pvar} + NPJ < {ext}", "NPJ")
            self.emit(f"{following} = tl.where({more}, {pvar} + {step}, {pvar})")
            load_ahead(following)
        self.body(rest, [])
        self.defined = outer
        self.depth -= 1

    def _plan_k_ahead(self, stmts: tuple) -> None:
        """(a batched kernel, ``RenderOptions.k_ahead`` "on") The loops among ``stmts`` (the
        body's statements, as the wait leaves them) whose next step's read-only tiles load a step
        ahead in registers while this one computes (:func:`step_weights`: constant bounds, no
        store; here also two trips or more and a quantized GEMV's weight tile among them, the
        issue-bound dequantizing loops that no pipeline of Triton's streams), into
        :attr:`k_loops`. Where such a loop is the body's first statement to touch memory the
        previous launch may write, its first step's weights (``pre`` memrefs) load before the
        PDL wait, so the device function waits itself (:attr:`early`)."""
        for s in stmts:
            weights = self._k_weights(s)
            if weights:
                self.k_loops[id(s)] = (weights, f"__k{len(self.k_loops)}")
        first = next((s for s in stmts if _touches(s, self.pre)), None)
        if self.pre and first is not None and id(first) in self.k_loops:
            before = frozenset(w.srcs[0] for w in self.k_loops[id(first)][0] if w.srcs[0] in self.pre)
            if before:
                self.early, self.waiting = self.early | before, True

    def _k_weights(self, s) -> tuple:
        """(``RenderOptions.k_ahead``) The loads loop ``s`` may issue a step ahead
        (:func:`step_weights`) where it is a loop of two constant trips or more with a quantized
        GEMV's weight tile among them (:attr:`fused`), else none."""
        if not isinstance(s, ForRange) or (constant_trips(s) or 0) < 2:
            return ()
        var = self.fn.parallel.var if self.fn.parallel is not None else ""
        readonly = frozenset(p for p, a in param_access(self.fn).items() if a.direction == "in")
        weights = step_weights(s, var, readonly)
        # (a GEMV of one row of x: the form measured; a few rows' grouped products not)
        fused = [w.dst for w in weights if w.dst in self.fused]
        return weights if fused and all(self.x_rows.get(t, 1) == 1 for t in fused) else ()

    def _peel_first(self, stmts: tuple) -> tuple:
        """(``RenderOptions.k_ahead`` "first") ``stmts`` with each loop :meth:`_k_weights` takes
        peeled of its first step (its body at the loop's start, then the loop from its second
        step): the same operations in the same order, so that :func:`early_loads` may move that
        step's weights before the PDL wait, and no register carries a step into the loop."""
        out: list = []
        for s in stmts:
            if self._k_weights(s):
                self.peeled = True
                out += [substitute_stmt(b, {s.var: s.lb}) for b in s.body]
                out.append(replace(s, lb=s.lb + s.step))
            else:
                out.append(s)
        return tuple(out)

    def _first_steps(self, s: ForRange, weights: tuple, ahead_of: str) -> None:
        """Loop ``s``'s first step of ``weights`` (:attr:`k_loops`) into their tiles loaded ahead."""
        index = self.names[self.fn.parallel.var] if self.fn.parallel is not None else ""
        self._load_step(s, weights, ahead_of, index, self.expr(s.lb))

    def _load_step(self, loop: ForRange, weights: tuple, ahead_of: str, index: str, step: str) -> None:
        """``weights`` (:func:`step_weights` of ``loop``) of parallel index ``index`` and the
        loop's step ``step`` into their tiles loaded ahead, ``<tile><ahead_of>``."""
        var = self.fn.parallel.var if self.fn.parallel is not None else None
        moves = {loop.var: Var("__kstep")}
        if var is not None:
            self.names["__kidx"], self.ranges["__kidx"] = index, self.ranges[var]
            moves[var] = Var("__kidx")
        self.names["__kstep"], self.ranges["__kstep"] = step, self.ranges[loop.var]
        for w in weights:
            self.instr(substitute_stmt(replace(w, dst=w.dst + ahead_of), moves))
        for n in ("__kidx", "__kstep") if var is not None else ("__kstep",):
            del self.names[n], self.ranges[n]

    def _step_ahead(self, s: ForRange, weights: tuple, ahead_of: str) -> tuple:
        """(a run's loop over blocks, in K loop ``s``'s body) the step's ``weights``
        (:func:`step_weights`) taken from ``<tile><ahead_of>``, where they were loaded a step
        ahead, and the next step's loaded there (past its last step the next index's first, past
        the run's last index its own first again, still in L1); the body's other statements."""
        var = self.names[s.var]
        pvar = self.names[self.fn.parallel.var] if self.fn.parallel is not None else ""
        lb, ub, step = self.expr(s.lb), self.expr(s.ub), self.expr(s.step)
        for w in weights:
            self._take(w.dst, w.dst + ahead_of)
        more, kn = self.fresh("more"), self.fresh("kn")
        self.emit(f"{more} = {var} + {step} < {ub}")
        if self.run_blocks:
            jn = self.fresh("jn")
            self.emit(f"{kn} = tl.where({more}, {var} + {step}, {lb})")
            self.emit(f"{jn} = tl.where({more}, {pvar}, tl.where(_b + 1 < n_run, {pvar} + 1, {pvar}))")
        else:  # (a batched kernel's loop: past its last step this one's again, still in L1)
            jn = pvar
            self.emit(f"{kn} = tl.where({more}, {var} + {step}, {var})")
        self._load_step(s, weights, ahead_of, jn, kn)
        return tuple(t for t in s.body if not any(t is w for w in weights))

    def _alias(self, tile: str, name: str) -> None:
        """Tile ``name`` of ``tile``'s shape, type and product (a block's weights loaded ahead)."""
        self.shapes[name], self.blocks[name], self.dtypes[name] = self.shapes[tile], self.blocks[tile], \
            self.dtypes[tile]
        if tile in self.fused:
            self.fused = self.fused | {name}
            self.x_rows[name] = self.x_rows[tile]

    def _take(self, tile: str, name: str) -> None:
        """``tile`` (its planes, for a quantized GEMV's) as loaded ahead into ``name``."""
        if name in self.planes:
            self.planes[tile] = [p.replace(f"t_{name}__", f"t_{tile}__", 1) for p in self.planes[name]]
            for mine, loaded in zip(self.planes[tile], self.planes[name]):
                self.emit(f"{mine} = {loaded}")
            if name in self.grouped:
                self.grouped[tile] = self.grouped[name]
        else:
            self.emit(f"t_{tile} = t_{name}")
        self.defined.add(tile)

    def _finish(self, fn: IncoreFunction, params: list[str]) -> tuple[str, list[str]]:
        """The device function's name and lines (:meth:`device_function`), its helpers first."""
        # (the memrefs loaded before the wait are in the name: two branches of one variant that
        # differ in them are two device functions, each loading early only what it may)
        early = sum(1 << k for k, p in enumerate(fn.memrefs) if p.name in self.pre | self.prefetched) if self.mk \
            else 0
        name = device_name(fn) + ("" if self.stages is None else f"__S{self.stages}") + ("__mk" if self.mk else "") \
            + (f"_e{early}" if early else "") + ("_nopf" if self.withheld else "") + ("__run" if self.runs else "") \
            + ("__blocks" if self.block_loop or self.run_blocks else "") + ("_steps" if self.step_ahead else "")
        sig = ",\n        ".join(params)
        # the quantized loads' helpers come with the device function (a file may define one twice)
        helpers = [line for f in sorted(self.quantized)
                   for line in render_helpers(FORMATS[f], self.opts.qscales != "units")]
        grouped = {self.memrefs[i.srcs[0]].dtype.quant.name for i in walk_instrs(fn.body)
                   if i.op is Op.LOAD and i.dst in self.grouped}
        rows = {self.memrefs[i.srcs[0]].dtype.quant.name for i in walk_instrs(fn.body)
                if i.op is Op.LOAD and i.dst in self.grouped and self.x_rows[i.dst] > 1}
        helpers += [line for f in sorted(grouped)
                    for line in quant_groups.render_helpers(FORMATS[f], self.int_dots(FORMATS[f]),
                                                            self.half_dots(FORMATS[f]), f in rows)]
        if any(self.int_dots(FORMATS[f]) for f in grouped):
            helpers += quant_groups.render_int_dots(self.opts.asm)
        if any(self.half_dots(FORMATS[f]) for f in grouped):
            helpers += quant_groups.render_half_dots(self.opts.asm)
        jit = "@triton.jit(noinline=True)" if self.noinline else "@triton.jit"
        return name, helpers + [f"{jit}\ndef {name}(\n        {sig}):"] + self.lines

    def body(self, stmts: tuple, frames: list) -> None:
        for idx, s in enumerate(stmts):
            ahead = self.k_loops.pop(id(s), None)
            if ahead:  # (its first step's weights before the wait, the rest after: _plan_k_ahead)
                weights, ahead_of = ahead
                self.step_ahead[id(s)] = ahead
                for w in weights:
                    self._alias(w.dst, w.dst + ahead_of)
                early = tuple(w for w in weights if w.srcs[0] in self.pre) if self.waiting else ()
                self._first_steps(s, early, ahead_of)
            if self.waiting and _touches(s, self.pre):
                self.wait(stmts[idx:])
            if ahead:
                self._first_steps(s, tuple(w for w in weights if not any(w is e for e in early)), ahead_of)
            if isinstance(s, ForRange):
                self.loop(s, [(stmts, idx), *frames])
            else:
                self.instr(s)

    def wait(self, rest: tuple) -> None:
        """The wait for the previous launch (and, "chain", the signal that the next may start);
        in the megakernel's form the wait for the task's predecessors, after an L2 prefetch of
        what the loops of ``rest`` (the statements from the wait on) load of ``pre`` memrefs."""
        if self.mk:
            self.prefetch(rest)
            self.emit(MK_WAIT)
        else:
            self.emit(PDL_WAIT)
            if self.opts.pdl == "chain":
                self.emit(PDL_SIGNAL)
        self.waiting = False

    def prefetch(self, rest: tuple) -> None:
        """L2 prefetches of the ``pre`` loads in the loops of ``rest`` (:func:`prefetch_plan`:
        their first trips, up to ``opts.prefetch_bytes``), with ``PREFETCH >= 1``; with ``PREFETCH
        >= 2`` also (up to as many bytes again) of the loads of the memrefs the function only
        reads though a predecessor writes them (a decode step's keys and values, of which the
        step's append writes one row): L2 is the GPU's point of coherence, so a line fetched
        before the predecessor's store is updated by it, and the loads after the wait's acquire
        read the store. Under ``GPU`` only (the interpreter has no prefetch); quantized memrefs
        are left out (:meth:`_prefetchable`)."""
        names = set(self.names)
        for level, mems in ((1, self.pre), (2, self.read_only - self.pre)):
            mems = self._prefetchable(mems)
            plan = prefetch_plan(rest, mems, self.blocks, self.dtypes, names, self.opts.prefetch_bytes)
            if not plan:
                continue
            if not self.l2:  # (a body other than the prefetching one's: a name of its own)
                self.withheld = True
                continue
            self.emit(f"if GPU and PREFETCH >= {level}:")
            self.depth += 1
            for loop, trips in plan:
                self.prefetch_loop(loop, trips, mems)
            self.depth -= 1

    def _prefetchable(self, mems) -> frozenset[str]:
        """``mems`` less the quantized memrefs: a quantized tile is rows of packed blocks and
        planes of scales, not the region of elements :meth:`prefetch_tile` walks."""
        return frozenset(m for m in mems if not self.memrefs[m].dtype.is_quantized)

    def run_prefetch(self) -> None:
        """(a run, before its wait) L2 prefetches, with ``PREFETCH >= 1``, of the loads of the
        memrefs none of its task's predecessors writes (``opts.pre``; a run loads none of them
        into registers before its wait, its loop pipelines them) in its loops, up to
        ``opts.prefetch_bytes`` in all: where the loops' bounds are constants, those whose offsets
        do not use the parallel index (a norm's gain) once and the others (the weights' rows) for
        as many whole indices from the run's first as the rest of the budget holds; else the first
        index's first trips (:func:`prefetch_plan`). Quantized memrefs are left out."""
        mems, par = self._prefetchable(self.opts.pre), self.fn.parallel.var
        per = frozenset(i.srcs[0] for i in walk_instrs(self.fn.body) if i.op is Op.LOAD and i.srcs[0] in mems
                        and any(par in e.free_vars() for e in i.srcs[1:]))
        once = mems - per
        first = self.names[par]
        self.names[par] = "_pq"  # (the index prefetched: the run's first, then the next ones)
        try:
            blocks, dtypes, names = self.blocks, self.dtypes, set(self.names)
            plan = prefetch_plan(self.fn.body, mems, blocks, dtypes, names, budget=1 << 62)
            whole = whole_trips(plan)

            def nbytes(ms):
                return sum(n * _trip_bytes(s, ms, blocks, dtypes, names) for s, n in whole or ())

            budget, per_index = self.opts.prefetch_bytes, nbytes(per)
            left = budget - nbytes(once)  # (the shared loads' bytes taken once)
            if whole and 0 < per_index <= left:
                plan, indices = whole, left // per_index
            else:
                plan, indices = prefetch_plan(self.fn.body, mems, blocks, dtypes, names, budget), 1
            if not plan:
                return
            if not self.l2:
                self.withheld = True
                return
            self.prefetched = frozenset(i.srcs[0] for s, _ in plan for i in _pre_loads(s.body, mems, names | {s.var}))
            self.emit("if GPU and PREFETCH >= 1:")
            self.depth += 1
            self.emit(f"_pq = {first}0")
            for ms in ((mems,) if indices == 1 else (once, per)):
                if ms is per:
                    self.emit(f"for _q in range(0, tl.minimum(n_run, {indices})):")
                    self.emit(f"    _pq = {first}0 + _q")
                    self.depth += 1
                for loop, trips in plan:
                    if _pre_loads(loop.body, ms, names | {loop.var}):
                        self.prefetch_loop(loop, trips, ms)
                if ms is per:
                    self.depth -= 1
            self.depth -= 1
        finally:
            self.names[par] = first

    def prefetch_loop(self, s: ForRange, trips: int, mems: frozenset) -> None:
        """``s``'s first ``trips`` trips with only its loads of ``mems``, each an L2 prefetch of
        one address per 128-byte line of its tile."""
        var = f"i_{s.var}"
        self.names[s.var] = var
        lb, step = self.expr(s.lb), self.expr(s.step)
        self.emit(f"for {var} in range({lb}, tl.minimum({self.expr(s.ub)}, {lb} + {trips} * {step}), {step}):")
        self.depth += 1
        for i in _pre_loads(s.body, mems, set(self.names)):
            self.prefetch_tile(i)
        self.depth -= 1
        del self.names[s.var]

    def prefetch_tile(self, ins: Instr) -> None:
        """An L2 prefetch of each 128-byte line of the region ``ins`` (a load) reads: one address
        per line of each of its rows, masked lanes at the region's origin."""
        mem, row, col = ins.srcs
        (r, c), (lr, lc) = self.blocks[ins.dst], self.shapes[ins.dst]
        per = max(1, LINE_BYTES // self.memrefs[mem].dtype.itemsize)
        lines = max(1, c // per)
        ri, ci, ptr = self.fresh("fr"), self.fresh("fc"), self.fresh("fp")
        step = int(ins.attr("step"))
        self.emit(f"{ri} = {self.offset(row, r, True, step)}")
        self.emit(f"{ci} = {self.expr(col)} + tl.arange(0, {lines})[None, :] * {per}")
        conds = [f"(tl.arange(0, {r})[:, None] < {lr})"] if lr < r else []
        conds.append(f"(tl.arange(0, {lines})[None, :] * {per} < {lc})")
        for idx, e, lim in ((ri, row, f"m_{mem}_rows"), (ci, col, f"m_{mem}_cols")):
            if not self.nonnegative(e):
                conds.append(f"({idx} >= 0)")
            conds.append(f"({idx} < {lim})")
        self.emit(f"{ptr} = tl.where({' & '.join(conds)}, P_{mem} + {ri}.to(tl.int64) * S_{mem} + {ci}, P_{mem})")
        self.emit(f"_prefetch_l2({ptr})")

    def loop(self, s: ForRange, frames: list) -> None:
        # tiles the loop writes that are read in a later iteration or after the loop must
        # exist before it with their final type (Triton's loop-carried values)
        for tile in sorted(_written(s.body)):
            carried = _first_access(s.body, tile) == "read" or _live_after(frames, tile)
            if carried and tile not in self.defined:
                self.init_nan(tile)
        var = f"i_{s.var}"
        self.names[s.var] = var
        outer = set(self.defined)
        bounds = f"{self.expr(s.lb)}, {self.expr(s.ub)}, {self.expr(s.step)}"
        ahead = self.step_ahead.get(id(s)) if self.run_blocks or not self.mk else None
        if self.runs and not self.run_blocks:  # (flattened into the run's loop, which carries the depth)
            self.emit(f"for {var} in tl.range({bounds}):")
        elif ahead and not self.mk:  # (its steps loaded ahead in registers: no pipeline of Triton's)
            self.emit(f"for {var} in tl.range({bounds}, num_stages=1):")
        elif self.stages is None:
            self.emit(f"for {var} in range({bounds}):")
        else:  # (a loop loading its steps ahead is at one stage: step_ahead)
            self.emit(f"for {var} in tl.range({bounds}, num_stages={self.stages}):")
        self.depth += 1
        self.body(self._step_ahead(s, *ahead) if ahead else s.body, frames)
        self.depth -= 1
        self.defined = outer
        del self.names[s.var]
