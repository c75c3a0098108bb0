"""The batched Triton kernel of a specialized InCore function (what the ``waves`` executor
launches through :mod:`pto.backends.triton`).

Kernel contract:

- grid ``(B, P)``: ``program_id(0)`` is the task of the batch, ``program_id(1)`` the index on the
  function's parallel axis (``P`` = the largest extent over the batch, 1 without an axis); a
  program whose index is not below its own task's extent does nothing. With ``GROUP > 0`` the
  grid is 1-D, ``NB x NP`` programs in groups of ``GROUP`` tasks x every parallel index. In the
  persistent "blocks" form ``program_id(1)`` is a program of the task's ``num_programs(1)``, which
  takes the indices ``program_id(1) + k num_programs(1)`` itself (``RenderOptions.persistent``).
- arguments: ``tab``, the per-task table (int32 or int64, ``B x F``, row-major), then for every
  memref parameter in declaration order its tensor pointer ``P_<p>`` and row stride ``S_<p>``, then
  the constexpr flags ``EVEN_<p>`` (every task's region is full: loads and stores skip their
  masks) and ``ALIGN_<p>`` (every task's region starts on a multiple of 16 columns and is a
  multiple of 16 columns wide: a vectorization hint, also for masked loads), in the same
  parameter order.
- a table row holds, for every memref parameter in declaration order, its region's ``row0, col0,
  rows, cols`` (rows/cols: the valid extent), then the value of every scalar parameter
  (:class:`TableLayout`).

The kernel computes its task and parallel index and calls the function's device function
(:mod:`pto.codegen.triton.body`) with its table row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from pto.codegen.triton.body import BodyRenderer
from pto.codegen.triton.common import (
    BLOCKS_AUTO_FORMATS,
    BLOCKS_AUTO_MIN,
    FLAT_STAGES,
    PDL_IMPORTS,
    PDL_MODES,
    PDL_SIGNAL,
    PDL_WAIT,
    PERSISTENT_MODES,
    TL_PTR,
    RenderOptions,
    TableLayout,
    _loops,
    block_shape,
    file_source,
    kernel_name,
)
from pto.errors import BuildError
from pto.ir.analysis import specialize
from pto.ir.bounds import bounds
from pto.ir.expr import Const, Expr
from pto.ir.facts import constant_trips, loop_ranges, memref_accesses, tile_shape
from pto.ir.nodes import ForRange, IncoreFunction, walk_instrs
from pto.ir.ops import MATMUL, REDUCE, Op


@dataclass(frozen=True)
class RenderedKernel:
    """A generated kernel: its source and what launching it needs to know."""

    fn: IncoreFunction
    name: str  # the @triton.jit function's name in ``source``
    source: str
    layout: TableLayout
    launch: dict = field(hash=False, compare=False)  # default num_warps / num_stages / fp fusion
    digest: str = ""  # content hash of ``source`` (the loader's cache key)
    pdl: str = ""  # launch with programmatic dependent launch (RenderOptions.pdl: early, late)
    #: content hash of the source rendered without the PDL prologue and tensor-descriptor loads:
    #: the arithmetic, what the schedule database keys entries by (a schedule holds with PDL and
    #: TMA on or off)
    schedule_digest: str = ""
    #: memrefs the kernel may load through tensor descriptors, with their block shapes (the
    #: arguments ``D_<p>`` and ``TMA_<p>``: :mod:`pto.codegen.triton.tma`)
    tma: dict = field(default_factory=dict, hash=False, compare=False)
    #: the memrefs the body loads before it waits for the previous launch (RenderOptions.pre;
    #: empty: the kernel waits before the body)
    early: frozenset = frozenset()
    #: the kernel loops over its pairs (RenderOptions.persistent): launched on at most one
    #: program per multiprocessor (:func:`pto.backends.triton.launch.calls`); "blocks": over its
    #: task's parallel indices, on a grid of tasks by at most BLOCK_PROGRAMS programs a
    #: multiprocessor
    persistent: str = ""
    #: ("blocks") each block loads the next one's weights ahead (their registers: the backend
    #: compiles such a kernel of 4 warps or fewer to at most BLOCK_MAXNREG registers)
    block_ahead: bool = False
    #: the weight formats of a GEMV whose form the "blocks" loop takes (:func:`blocks_formats`: the
    #: gate/up pair by integer dots in one K step); empty for any other kernel
    blocks_formats: frozenset = frozenset()

    def blocks_auto_in(self, formats: frozenset = BLOCKS_AUTO_FORMATS) -> bool:
        """Does the "auto" persistent policy run this kernel in "blocks" form where it takes the
        weight formats ``formats`` so (the backend's: ``PTO_BLOCKS_FORMATS``, by default
        :data:`~pto.codegen.triton.common.BLOCKS_AUTO_FORMATS`): its GEMV's are all of them."""
        return bool(self.blocks_formats) and self.blocks_formats <= formats

    @property
    def blocks_auto(self) -> bool:
        """:meth:`blocks_auto_in` the formats measured faster so (``BLOCKS_AUTO_FORMATS``)."""
        return self.blocks_auto_in()

    def loops_blocks(self, programs: int, formats: frozenset = BLOCKS_AUTO_FORMATS) -> bool:
        """Does the "auto" persistent policy run this kernel in "blocks" form on ``programs``
        programs a task: its form and formats say so (:meth:`blocks_auto_in` ``formats``) and its
        parallel axis, of a constant extent, gives each program at least ``BLOCKS_AUTO_MIN`` blocks."""
        extent = self.fn.parallel.extent if self.fn.parallel is not None else None
        return self.blocks_auto_in(formats) and isinstance(extent, Const) and \
            extent.value >= BLOCKS_AUTO_MIN * programs

    @property
    def waits(self) -> bool:
        """Does the body wait itself (after its early loads)?"""
        return bool(self.early)

    @property
    def filename(self) -> str:
        return f"{self.name}.py"

    def signature(self) -> dict[str, str]:
        """Triton signature of the kernel's arguments (for ahead-of-time compilation); the
        table is int32 here."""
        sig = {"tab": "*i32"}
        for p in self.fn.memrefs:
            sig[f"P_{p.name}"] = TL_PTR[p.dtype]
            sig[f"S_{p.name}"] = "i32"
        for p in self.fn.memrefs:
            sig[f"EVEN_{p.name}"] = "constexpr"
        for p in self.fn.memrefs:
            sig[f"ALIGN_{p.name}"] = "constexpr"
        for m in self.tma:  # the pointer path: no descriptor
            sig[f"D_{m}"] = sig[f"TMA_{m}"] = "constexpr"
        if self.fn.parallel is not None:
            sig.update(NB="i32", NP="i32", GROUP="constexpr")
        elif self.persistent:
            sig["NB"] = "i32"
        return sig


def _block_shapes(fn: IncoreFunction) -> dict[str, tuple[int, int]]:
    """Each tile's block (its shape in the variant, padded dims rounded up to powers of two)."""
    return {t.name: block_shape(tile_shape(t, dict(fn.variant))) for t in fn.tiles}


def launch_params(fn: IncoreFunction) -> dict:
    """Default launch parameters from the static tile sizes.

    4 warps; 8 for a matmul with a 128x128 (or larger) output or tiles of 32K elements and more;
    3 pipeline stages when a loop loads tiles that feed a matmul (the K loop), else 1 (2 for
    other loops with loads). FP fusion (FMA contraction) only for kernels with f16/bf16 tiles:
    all-f32 kernels keep the interpreter's rounding, instruction by instruction. Sizes are the
    blocks' (a padded tile takes its whole block of registers).
    """
    shapes = _block_shapes(fn)
    biggest = max((r * c for r, c in shapes.values()), default=1)
    big_dot = any(i.op in MATMUL and shapes[i.dst][0] * shapes[i.dst][1] >= 128 * 128
                  for i in walk_instrs(fn.body))
    warps = 8 if big_dot or biggest >= 32 * 1024 else 4
    stages = 1
    for loop in _loops(fn.body):
        ops = {i.op for i in walk_instrs(loop.body)}
        if Op.LOAD in ops and ops & MATMUL:
            stages = 3
        elif Op.LOAD in ops:
            stages = max(stages, 2)
    # contraction into FMAs changes rounding: allowed for kernels with half-precision tiles
    # (their tolerance is the dtype's), not for all-f32 ones, which match the interpreter
    half = any(t.dtype.is_half for t in fn.tiles)
    out = {"num_warps": warps, "num_stages": stages, "enable_fp_fusion": half}
    if fn.parallel is not None:
        out["GROUP"] = 0  # program order: tasks fastest (see the kernel's prologue)
    return out


def render(fn: IncoreFunction, options: RenderOptions | None = None) -> RenderedKernel:
    """The batched Triton kernel of a specialized InCore function (a function without dims is
    specialized with its defaults): the device function and a kernel that runs it for program
    ``(task, parallel index)``. Raises BuildError for shapes Triton cannot hold."""
    if fn.dims:
        fn = specialize(fn)
    r = BodyRenderer(fn, options or RenderOptions())
    dname, dlines = r.device_function()
    kname = kernel_name(fn)
    params = ["tab"] + [f"P_{p.name}, S_{p.name}" for p in fn.memrefs]
    params += [", ".join(f"{w}_{p.name}: tl.constexpr" for p in fn.memrefs) for w in ("EVEN", "ALIGN")]
    params += [f"D_{m}, TMA_{m}: tl.constexpr" for m in r.tma]
    args = [f"P_{p.name}, S_{p.name}" for p in fn.memrefs]
    args += [", ".join(f"{w}_{p.name}" for p in fn.memrefs) for w in ("EVEN", "ALIGN")]
    args += [f"D_{m}, TMA_{m}" for m in r.tma]
    persistent = "" if r.opts.persistent == "blocks" and fn.parallel is None else r.opts.persistent
    if fn.parallel is not None:  # ("blocks": the program's first index, then the programs of a task)
        args.insert(0, "tl.program_id(1), tl.num_programs(1)" if persistent == "blocks" else f"i_{fn.parallel.var}")
    extra, body = _program_lines(fn, f"{dname}(tab + task * {r.layout.width}, {', '.join(args)})", persistent)
    params += extra
    sig = ",\n        ".join(params)
    title = f"Generated by pto.codegen.triton from InCore function `{fn.name}`{f' ({kname})' if fn.variant else ''}."

    def source(lines: list[str], imports: str = "") -> str:
        kernel = [f"@triton.jit\ndef {kname}(\n        {sig}):"] + ["    " + line for line in lines]
        return file_source(title, [dlines, kernel], imports)

    src = source(body)
    # the arithmetic: with or without PDL and tensor-descriptor loads
    # (loads moved or a loop's first step peeled, the arithmetic not)
    moved = r.tma or r.opts.tma or r.early or persistent or r.step_ahead or r.peeled
    plain = render(fn, replace(r.opts, pdl="", tma=False, pre=(), persistent="", k_ahead="")).schedule_digest \
        if moved else hashlib.sha256(src.encode()).hexdigest()[:20]
    pdl = r.opts.pdl
    if pdl:
        src = source(_with_pdl(body, pdl, bool(r.early)), PDL_IMPORTS)
    digest = hashlib.sha256(src.encode()).hexdigest()[:20] if pdl or r.tma or persistent or r.step_ahead \
        or r.peeled else plain
    launch = launch_params(fn)
    if r.grouped:
        floor = dict(r.opts.qgemv_warps_by).get(fn.name, r.opts.qgemv_warps)
        one_row = all(r.x_rows.get(t, 1) == 1 for t in r.grouped)
        launch["num_warps"] = grouped_warps(fn, r.grouped, floor, r.opts.qgemv_cols or 1024, one_row)
    else:
        launch.update(dequant_dot_launch(fn, launch, r.opts.qscales != "units"))
    return RenderedKernel(fn, kname, src, r.layout, launch, digest, pdl, plain, dict(r.tma), r.early, persistent,
                          r.block_ahead, blocks_formats(fn, r))


def blocks_formats(fn: IncoreFunction, r) -> frozenset:
    """The weight formats of ``fn``'s kernel (rendered by ``r``, a :class:`~.body.BodyRenderer`)
    where the "auto" persistent policy may run it as a loop over its task's blocks (empty where
    it may not): a kernel with a parallel axis whose GEMV reads two weight tensors or more (the
    gate/up pair; not one tensor's parts, the RoPE halves of q/k/v), every one by groups in one K
    step with integer dots. The backend loops it where it takes all these formats so
    (:data:`~.common.BLOCKS_AUTO_FORMATS`, the forms measured faster so on an H200; the rest
    slower) and a program gets blocks enough (``BLOCKS_AUTO_MIN``)."""
    if fn.parallel is None or not r.grouped:
        return frozenset()
    loads = [i for i in walk_instrs(fn.body) if i.op is Op.LOAD and i.dst in r.grouped]
    formats = [r.memrefs[i.srcs[0]].dtype.quant for i in loads]
    if len({i.srcs[0] for i in loads}) >= 2 and _load_trips(fn.body, frozenset(r.grouped)) < 2 and \
            all(r.int_dots(f) for f in formats):
        return frozenset(f.name for f in formats)
    return frozenset()


#: a grouped GEMV whose program streams its weights over at least this many K steps runs at
#: least STREAM_WARPS warps: the 8B's and 1B's down projections (7 and 4 steps; docs/PERF.md, "The
#: grouped GEMVs' warps measured"), and since the 1B's Q6_K LM head (2 steps of 1,024) measured
#: 100.2 -> 78.8 us a step at four warps where the count gave it two, the 1B's Q4_K step 0.634 ->
#: 0.607-0.612 ms ("Thirty-seventh session"); no other kernel of the real models' steps changes
STREAM_TRIPS, STREAM_WARPS = 2, 4
#: a plain grouped GEMV (one row of x, nothing reduced but its product: the residual o and down
#: projections, not the ones that normalize x first) runs at least PLAIN_WARPS warps: SmolLM2's
#: Q4_1 o projection 1.95 -> 1.50 us a layer, down 2.06-2.11 -> 1.73, the step 2-4% faster, where
#: four warps made the normalizing q/k/v and gate/up slower (docs/PERF.md, "Twenty-fourth
#: session" and "Twenty-fifth session"); the wider models' such GEMVs had four already
PLAIN_WARPS = 4


def grouped_warps(fn: IncoreFunction, grouped: dict[str, tuple[int, int]], floor: int, span: int = 1024,
                  one_row: bool = False) -> int:
    """The warps of a program of ``fn``, a GEMV whose ``grouped`` tiles (name: rows, columns of a K
    step) read quantized weights by groups: a warp per ``span`` columns of the step (1,024: a
    thread's 32 weights a row; ``RenderOptions.qgemv_cols``) and per 8 rows past the first 8; at
    least ``STREAM_WARPS`` where a tile is loaded in a loop of ``STREAM_TRIPS`` or more trips (a
    K longer than a step, the down projections' and the LM heads': a program streams its row
    block's weights, and two warps a program leave a multiprocessor too few to hide the
    dequantization's latency); at
    least ``PLAIN_WARPS`` (divided by ``span / 1024``, the columns a warp) where ``one_row`` (x
    one row) and the program reduces nothing but its product (no norm: a program that waits,
    then runs once through its inputs, gets the warps to share them); at least ``floor``
    (``RenderOptions.qgemv_warps``); a power of two, at most 8."""
    warps = min(max(1, cols // span) * max(1, rows // 8) for rows, cols in grouped.values())
    if _load_trips(fn.body, frozenset(grouped)) >= STREAM_TRIPS:
        warps = max(warps, STREAM_WARPS)
    if one_row and not any(i.op in REDUCE for i in walk_instrs(fn.body)):
        warps = max(warps, PLAIN_WARPS * 1024 // span)  # (fewer where a warp takes more columns)
    warps = max(warps, floor)
    return min(8, 1 << (warps.bit_length() - 1))


#: a K loop of DEQ_TRIPS trips or more whose products on tensor cores (16 rows of x or fewer: a
#: decode step's batch) take weight tiles a GGUF block format dequantizes in the loop, one such
#: product of DEQ_ELEMS weights a step or more (the LM head) runs unpipelined (1 stage) at no more
#: than 4 warps: the dequantizing loop's registers, not its loads, bound it. With the tiles' scales
#: loaded a value a unit (``PTO_QSCALES=units``) so do two such products a step (gate/up): the 8B
#: at 8 sequences, Q4_K 15.80 -> 13.93 ms a step, Q8_0 13.98 -> 12.72, the 1B shape's Q4_K 3.61 ->
#: 3.26 (docs/PERF.md, "Thirty-second session"); with them a value a group (the default) gate/up is
#: faster pipelined again (the 8B's Q4_K 9.35 -> 8.63, the 1B's Q5_0 2.95 -> 2.86; "Thirty-third
#: session") and the head still unpipelined (9.27 pipelined). The residual GEMVs (one product of a
#: narrower tile: slower unpipelined), SmolLM2's short loops and fp8 (a conversion, not a block
#: format's arithmetic) keep the heuristics'.
DEQ_TRIPS, DEQ_ELEMS = 8, 16384


def dequant_dot_launch(fn: IncoreFunction, launch: dict, scales_by_groups: bool = True) -> dict:
    """What :data:`DEQ_TRIPS`'s rule changes in ``launch`` (the heuristics' settings of ``fn``):
    ``num_stages`` 1 and ``num_warps`` at most 4 where every K loop with products qualifies,
    else nothing. ``scales_by_groups``: the tiles' scale planes are loaded a value a group
    (``RenderOptions.qscales``), so only the one wide product a step qualifies."""
    memrefs = {m.name: m.dtype for m in fn.memrefs}
    shapes = _block_shapes(fn)
    qualified = False
    for loop in _loops(fn.body):
        instrs = list(walk_instrs(loop.body))
        products = [i for i in instrs if i.op in MATMUL]
        if not products:
            continue
        dequantized = {i.dst for i in instrs if i.op is Op.LOAD and memrefs[i.srcs[0]].is_quantized
                       and memrefs[i.srcs[0]].quant.gguf is not None}
        weights = [i.srcs[1] for i in products if i.srcs[1] in dequantized]
        elems = sum(shapes[t][0] * shapes[t][1] for t in weights)
        few_rows = all(shapes[i.dst][0] <= 16 for i in products)
        # (by groups the one wide product, the head; by units gate/up's pair too)
        shaped = (len(weights) == 1 and elems >= DEQ_ELEMS) if scales_by_groups else \
            (len(weights) >= 2 or elems >= DEQ_ELEMS)
        if not (weights and few_rows and (constant_trips(loop) or 0) >= DEQ_TRIPS and shaped):
            return {}
        qualified = True
    return {"num_stages": 1, "num_warps": min(4, launch["num_warps"])} if qualified else {}


def _load_trips(body, tiles: frozenset[str], trips: int = 1) -> int:
    """The most trips of the loops around a load into one of ``tiles`` in ``body`` (nested
    loops' trips multiplied; a loop of bounds not known here counts one)."""
    most = 0
    for s in body:
        if isinstance(s, ForRange):
            most = max(most, _load_trips(s.body, tiles, trips * (constant_trips(s) or 1)))
        elif s.op is Op.LOAD and s.dst in tiles:
            most = max(most, trips)
    return most


def _program_lines(fn: IncoreFunction, call: str, persistent: str) -> tuple[list[str], list[str]]:
    """The kernel's parameters after the memrefs' and its lines: the task and parallel index of
    the program (or, ``persistent``, of each pair its loop takes), then ``call``. GROUP > 0: a
    1-D grid of NB x NP programs in groups of GROUP tasks x every parallel index, so programs
    running together share their tasks' tiles in L2 (the GEMM "grouped ordering"); GROUP = 0:
    grid (NB, NP), tasks fastest."""
    if persistent and persistent not in PERSISTENT_MODES:
        raise BuildError(f"RenderOptions.persistent={persistent!r}: one of {', '.join(PERSISTENT_MODES)} or '' (off)")
    if persistent == "blocks":  # a grid of (task, program); the device function loops over the indices
        return ["NB, NP, GROUP: tl.constexpr"], ["task = tl.program_id(0)", call]
    if fn.parallel is None:
        params, total = (["NB"] if persistent else []), "NB"
        body = ["task = _pid" if persistent else "task = tl.program_id(0)", call]
    else:
        pvar = f"i_{fn.parallel.var}"
        params, total = ["NB, NP, GROUP: tl.constexpr"], "NB * NP"
        grouped = ["    _per = GROUP * NP",
                   "    _first = (_pid // _per) * GROUP",
                   "    _gsize = tl.minimum(NB - _first, GROUP)",
                   "    task = _first + (_pid % _per) % _gsize",
                   f"    {pvar} = (_pid % _per) // _gsize"]
        if persistent:
            ungrouped = ["    task = _pid % NB", f"    {pvar} = _pid // NB"]
        else:
            grouped.insert(0, "    _pid = tl.program_id(0)")
            ungrouped = ["    task = tl.program_id(0)", f"    {pvar} = tl.program_id(1)"]
        body = ["if GROUP > 0:", *grouped, "else:", *ungrouped, call]
    if persistent:
        # at most one program per multiprocessor, each over the pairs the grid would give its index
        extra = {"loop": "", "ws": ", flatten=True, warp_specialize=True",
                 "flat": f", num_stages={FLAT_STAGES}, flatten=True"}[persistent]
        body = [f"for _pid in tl.range(tl.program_id(0), {total}, tl.num_programs(0){extra}):"] + \
            ["    " + line for line in body]
    return params, body


def _with_pdl(body: list[str], pdl: str, waits: bool) -> list[str]:
    """The kernel's lines with the PDL wait (before the device function, unless the body waits
    itself, after the loads it may issue first: RenderOptions.pre) and the signal where the mode
    says."""
    if pdl not in PDL_MODES:
        raise BuildError(f"RenderOptions.pdl={pdl!r}: one of {', '.join(PDL_MODES)} or '' (off)")
    if pdl == "early" and waits:
        # the next launch would start before this one waits, and its own early loads could read
        # what this one's predecessor is still writing
        raise BuildError("RenderOptions.pre needs pdl 'late' or 'chain' (an 'early' signal comes before the wait)")
    wait = [] if waits else [PDL_WAIT]
    if pdl == "early":
        return [PDL_SIGNAL] + wait + body
    if pdl == "late":
        return wait + body + [PDL_SIGNAL]
    return wait + ([] if waits else [PDL_SIGNAL]) + body  # chain: a body that waits also signals


def render_sources(functions: Iterable[IncoreFunction],
                   options: RenderOptions | None = None) -> dict[str, str]:
    """``{filename: source}`` of the kernels of ``functions`` (for ``pto codegen --out``)."""
    out = {}
    for f in functions:
        k = render(f, options)
        out[k.filename] = k.source
    return out


@dataclass(frozen=True)
class AccessBound:
    """Symbolic bounds of one load or store of a memref (over loops and the parallel axis):
    the rows ``[row_lo, row_hi + rows)`` and columns ``[col_lo, col_hi + cols)`` it touches."""

    row_lo: Expr
    row_hi: Expr
    col_lo: Expr
    col_hi: Expr
    rows: int
    cols: int


def access_bounds(fn: IncoreFunction) -> dict[str, list[AccessBound] | None]:
    """Per memref, the bounds of its accesses (None where an offset cannot be bounded); the
    backend evaluates them per task to decide whether a batch may skip masks (``EVEN_<p>``)."""
    from pto.ir.verify_instr import loaded_scalars

    ranges = loop_ranges(fn)
    dims = dict(fn.variant)
    loaded = loaded_scalars(fn)
    out: dict[str, list[AccessBound] | None] = {p.name: [] for p in fn.memrefs}
    for mem, _ins, row, col, tile in memref_accesses(fn):
        if out[mem] is None:
            continue
        if (row.free_vars() | col.free_vars()) & loaded:  # device data: never provably inside
            out[mem] = None
            continue
        try:
            (rlo, rhi), (clo, chi) = bounds(row, ranges), bounds(col, ranges)
        except BuildError:
            out[mem] = None
            continue
        r, c = tile_shape(tile, dims)  # logical: a padded tile's padding lanes are masked even so
        out[mem].append(AccessBound(rlo, rhi, clo, chi, r, c))
    return out


__all__ = ["RenderedKernel", "AccessBound", "PDL_MODES", "render", "render_sources", "launch_params", "access_bounds"]
