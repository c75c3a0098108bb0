"""Facts derived from an InCore function: which region each memref parameter touches and in
which direction, tile bytes and liveness under given dims, and specialization of dims to values
(verified: :func:`specialize` runs :func:`pto.ir.verify_incore.verify_incore` on the variant).
What the body says directly (loop ranges, loads and stores, tile shapes) is :mod:`pto.ir.facts`,
which the verifiers read too.

These are what make a call's regions correct by construction: the direction (in/out/inout)
and the extent of every parameter come from the callee's own loads and stores, never from
parameter names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pto.errors import BuildError
from pto.ir.bounds import bounds
from pto.ir.dtypes import DType
from pto.ir.expr import Const, Expr, const_value, emax, fold, substitute
from pto.ir.facts import loop_ranges, memref_accesses, reads_memref, tile_shape, writes_memref
from pto.ir.nodes import ForRange, IncoreFunction, Instr, MemRefParam, Parallel, walk_instrs
from pto.ir.ops import COLLECTIVE, SIGNATURE, Op
from pto.ir.verify_incore import verify_incore


@dataclass(frozen=True)
class Access:
    """How a memref parameter is used: ``direction`` in {"in", "out", "inout"} and the extent
    of its region (expressions over the function's scalar parameters and dims)."""

    direction: str
    rows: Expr
    cols: Expr


def has_collective(fn: IncoreFunction) -> bool:
    """Does ``fn`` communicate with other ranks (an op of the collective group anywhere)? Such a
    function runs where collectives do (the torch evaluator over torch.distributed), never in a
    Triton kernel, and its tasks must be issued in the same order on every rank."""

    def visit(body) -> bool:
        return any(visit(s.body) if isinstance(s, ForRange) else s.op in COLLECTIVE for s in body)

    return visit(fn.body)


def param_access(fn: IncoreFunction) -> dict[str, Access]:
    """Direction and region extent of each memref parameter."""
    ranges = loop_ranges(fn)
    reads: dict[str, bool] = {}
    writes: dict[str, bool] = {}
    ext_rows: dict[str, list[Expr]] = {}
    ext_cols: dict[str, list[Expr]] = {}
    shaped = {p.name for p in fn.memrefs if p.shape is not None}
    for mem, ins, row, col, tile in memref_accesses(fn):
        reads[mem] = reads.get(mem, False) or reads_memref(ins)
        writes[mem] = writes.get(mem, False) or writes_memref(ins)
        if mem in shaped:  # the declared shape is the extent (offsets may be device data)
            ext_rows.setdefault(mem, [])
            continue
        _, rhi = bounds(row, ranges)
        _, chi = bounds(col, ranges)
        ext_rows.setdefault(mem, []).append(fold(rhi + tile.rows))
        ext_cols.setdefault(mem, []).append(fold(chi + tile.cols))
    out: dict[str, Access] = {}
    for p in fn.memrefs:
        if p.name not in ext_rows:
            continue
        direction = "inout" if reads.get(p.name) and writes.get(p.name) else (
            "in" if reads.get(p.name) else "out")
        if p.shape is not None:
            rows, cols = p.shape
        else:
            rows = _max_all(ext_rows[p.name])
            cols = _max_all(ext_cols[p.name])
        out[p.name] = Access(direction, rows, cols)
    return out


def _max_all(xs: list[Expr]) -> Expr:
    uniq: list[Expr] = []
    for x in xs:
        if x not in uniq:
            uniq.append(x)
    consts = [const_value(x) for x in uniq]
    if all(c is not None for c in consts):
        return Const(max(consts))
    out = uniq[0]
    for x in uniq[1:]:
        out = emax(out, x)
    return out


def substitute_stmt(s, mapping: dict[str, Expr]):
    """Statement ``s`` with the names of ``mapping`` replaced in its scalar operands and loop bounds."""

    def sub(e):
        return substitute(e, mapping) if isinstance(e, Expr) else e

    if isinstance(s, ForRange):
        return ForRange(s.var, sub(s.lb), sub(s.ub), sub(s.step), tuple(substitute_stmt(b, mapping) for b in s.body))
    return replace(s, srcs=tuple(sub(x) for x in s.srcs))


def specialize(fn: IncoreFunction, dims: dict[str, int] | None = None) -> IncoreFunction:
    """The function with every dim replaced by a value (defaults for dims not given).

    The result has no dims left and records the values in ``variant``; it is what renderers and
    interpreters run. Raises BuildError for an unknown dim name or a non-positive value.
    """
    dims = dict(dims or {})
    known = dict(fn.dims)
    for k, v in dims.items():
        if k not in known:
            names = ", ".join(known) or "none"
            raise BuildError(f"`{fn.name}` has no dim `{k}` (its dims: {names})")
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise BuildError(f"`{fn.name}`: dim `{k}` must be a positive integer, got {v!r}")
    if not known:
        return fn
    values = {**known, **dims}
    mapping = {k: Const(v) for k, v in values.items()}

    def sub(e):
        return substitute(e, mapping) if isinstance(e, Expr) else e

    params = tuple(
        replace(p, shape=(sub(p.shape[0]), sub(p.shape[1])))
        if isinstance(p, MemRefParam) and p.shape is not None else p
        for p in fn.params
    )
    tiles = tuple(replace(t, rows=sub(t.rows), cols=sub(t.cols)) for t in fn.tiles)
    parallel = None if fn.parallel is None else Parallel(fn.parallel.var, sub(fn.parallel.extent))
    spec = IncoreFunction(
        name=fn.name,
        params=params,
        dims=(),
        tiles=tiles,
        body=tuple(substitute_stmt(s, mapping) for s in fn.body),
        parallel=parallel,
        variant=tuple(sorted(values.items())),
        loc=fn.loc,
    )
    verify_incore(spec)
    return spec


def tile_bytes(fn: IncoreFunction, dims: dict[str, int] | None = None) -> dict[str, int]:
    """Bytes of every tile, by name, under the given dims (defaults if not given)."""
    d = {**dict(fn.dims), **(dims or {})}
    out = {}
    for t in fn.tiles:
        r, c = tile_shape(t, d)
        out[t.name] = r * c * t.dtype.itemsize
    return out


def staged_bytes(fn: IncoreFunction, ins: Instr, dims: dict[str, int] | None = None) -> int:
    """Bytes a load of a quantized memref holds besides its tile while it dequantizes: the
    tile's rows of packed blocks (0 for any other instruction)."""
    if ins.op is not Op.LOAD:
        return 0
    q = next(p.dtype.quant for p in fn.memrefs if p.name == ins.srcs[0])
    if q is None:
        return 0
    r, c = tile_shape(next(t for t in fn.tiles if t.name == ins.dst), {**dict(fn.dims), **(dims or {})})
    return r * (q.header_bytes + c // q.block * q.block_bytes)


def live_tiles_peak(fn: IncoreFunction, dims: dict[str, int] | None = None,
                    as_stored: frozenset[str] = frozenset()) -> tuple[int, list[str]]:
    """Peak bytes of tiles live at the same time, and the names live at the peak.

    A tile's value is live from the write that produces it to its last read; a write that does
    not read the tile (a load, a fill, a cast into it) ends the previous value's life. Inside a
    loop, a tile whose first access in the body is a read carries its value from one iteration
    to the next (an accumulator, a running max) and is live across the whole loop. A load of a
    quantized memref also holds the tile's packed blocks (:func:`staged_bytes`), named
    ``"<tile> (packed)"``, while it runs. A tile of ``as_stored`` (quantized weights a product
    takes as stored, never made: :func:`gemv_quantized_loads`) is its packed blocks only.
    """
    sizes = tile_bytes(fn, dims)
    loads = {i.dst: i for i in walk_instrs(fn.body) if i.op is Op.LOAD}
    sizes.update({t: staged_bytes(fn, loads[t], dims) for t in as_stored})
    staged: dict[int, tuple[str, int]] = {}  # position -> the packed blocks a load there holds
    events: dict[str, list[tuple[int, bool, bool]]] = {n: [] for n in sizes}
    loops: list[tuple[int, int, dict[str, bool]]] = []  # (start, end, tile -> first access reads)
    pos = 0

    def visit(body, open_loops):
        nonlocal pos
        for s in body:
            if isinstance(s, ForRange):
                info: dict[str, bool] = {}
                start = pos
                visit(s.body, open_loops + [info])
                loops.append((start, pos - 1, info))
                continue
            packed = 0 if s.dst in as_stored else staged_bytes(fn, s, dims)
            if packed:
                staged[pos] = (f"{s.dst} (packed)", packed)
            reads = instr_reads(s)
            writes = {s.dst} if s.dst is not None else set()
            for name in (reads | writes) & sizes.keys():
                events[name].append((pos, name in reads, name in writes))
                for info in open_loops:
                    info.setdefault(name, name in reads)
            pos += 1

    visit(fn.body, [])
    intervals: dict[str, list[list[int]]] = {n: [] for n in sizes}
    for name, evs in events.items():
        cur = None
        for p, r, w in evs:
            if w and not r:  # a new value
                if cur is not None:
                    intervals[name].append(cur)
                cur = [p, p]
            elif cur is None:  # read of a value made in an earlier iteration (or never: NaN)
                cur = [p, p]
            else:
                cur[1] = p
        if cur is not None:
            intervals[name].append(cur)
    for start, end, info in loops:
        for name, read_first in info.items():
            if read_first:
                intervals[name].append([start, end])
    peak, peak_names = 0, []
    for p in range(pos):
        live = [n for n, ivs in intervals.items() if any(a <= p <= b for a, b in ivs)]
        b = sum(sizes[n] for n in live)
        if p in staged:
            live.append(staged[p][0])
            b += staged[p][1]
        if b > peak:
            peak, peak_names = b, live
    return peak, peak_names


def instr_reads(ins: Instr) -> set[str]:
    """Tiles an instruction reads (matmul_acc also reads its destination)."""
    out = {x for k, x in zip(SIGNATURE[ins.op][0], ins.srcs) if k == "T"}
    if ins.op is Op.MATMUL_ACC:
        out.add(ins.dst)
    return out


#: the most rows of a CPU's product against an output-major (transposed) operand that takes dot
#: products (the c backend's GEMV: ``pto_mm_dot``, and ``pto_dqdots_<format>`` with quantized
#: weights read as stored; runtime_c/pto_tile.h's PTO_DOT_ROWS); more rows pack the operand
#: row-major for register blocks. SmolLM2's f32 step on the development VM: gate/up 32.4 against
#: 62.4 ms packed at 8 sequences, 50.6 against 77.8 at 16 (docs/PERF.md, "A CPU batch's rows
#: unpadded")
DOT_ROWS = 16


def gemv_quantized_loads(fn: IncoreFunction, few_rows) -> frozenset[str]:
    """The f32 tiles loaded (pad 0) from a quantized memref whose one reader is a ``matmul_acc``
    into an f32 tile of an f32 left operand of few rows (``few_rows(tile)``) by them (``tb``: a GEMV's
    multiply-sum, in the same loop body): a backend's product may take the tile's blocks as
    they are stored instead of a tile of values (the Triton renderer sums per unit, the C one
    dequantizes into the dot product; the sums reassociated, as a half-precision kernel's may be)."""
    memrefs = {p.name: p for p in fn.memrefs}
    dtypes = {t.name: t.dtype for t in fn.tiles}
    where: dict[str, list[tuple[int, Instr]]] = {}  # tile -> (body id, instr) of its loads and reads

    def visit(body):
        for s in body:
            if isinstance(s, ForRange):
                visit(s.body)
                continue
            for t in instr_reads(s) | ({s.dst} if s.dst is not None else set()):
                where.setdefault(t, []).append((id(body), s))

    visit(fn.body)
    out = set()
    for t, uses in where.items():
        if len(uses) != 2 or dtypes.get(t) is not DType.F32 or uses[0][0] != uses[1][0]:
            continue
        (_, load), (_, mm) = uses
        if not (load.op is Op.LOAD and load.dst == t and memrefs[load.srcs[0]].dtype.is_quantized
                and float(load.attr("pad")) == 0.0 and mm.op is Op.MATMUL_ACC and mm.srcs[1] == t
                and mm.dst != t and mm.srcs[0] != t and mm.attr("tb") and not mm.attr("ta")
                and str(mm.attr("acc")) == "f32" and few_rows(mm.srcs[0]) and dtypes[mm.srcs[0]] is DType.F32
                and dtypes[mm.dst] is DType.F32):
            continue
        out.add(t)
    return frozenset(out)
