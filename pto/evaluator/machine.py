"""The tile evaluator: InCore functions on torch tensors (any device), batched.

One call runs a specialized InCore function for a batch of B tasks at once: each memref
parameter is bound, per task, to a region ``(row0, col0, rows, cols)`` of one torch tensor, and
each scalar parameter to a per-task value. The parallel axis becomes part of the batch
(instances = tasks x parallel index), so a batch of tiles is one torch op per instruction.
With B = 1 it is the reference interpreter's InCore step (:func:`pto.interp.incore.run_incore`),
the oracle that graph execution and the Triton backend are checked against; with larger B it is
the ``torch`` backend of the executors.

Its cost is per op, not per element: loads and stores are one strided or indexed copy
(:mod:`pto.evaluator.regions`), offsets no loop changes are computed once per batch, and on
the CPU small batches run on one intra-op thread (:mod:`pto.evaluator.support`); the same
elements move and the same ops compute.

Numerics (the contract the Triton renderer follows too): elementwise, unary, reduction,
broadcast and mask ops compute in f32 and round to the destination's dtype; matmul multiplies
the operands in their own dtype and accumulates in ``acc`` (f32 by default); loads return
``pad`` outside the region's valid extent; stores skip elements outside it; ``allreduce`` sums
over the ranks of torch.distributed's default process group in its ``acc`` dtype (:mod:`pto.machine.dist`).
"""

from __future__ import annotations

import torch

from pto.data.batch import RegionBatch
from pto.errors import ExecutionError
from pto.evaluator.regions import Offset, Regions
from pto.evaluator.support import (
    ARITH_FN,
    REDUCE_FN,
    UNARY_FN,
    Env,
    Tiles,
    all_true,
    arange,
    as_dtype,
    f32_const,
    instances,
    intra_op_threads,
    loop_vars,
)
from pto.ir.dtypes import dtype_of
from pto.ir.expr import evaluate
from pto.ir.facts import tile_shape
from pto.ir.nodes import ForRange, IncoreFunction, Instr
from pto.ir.ops import (
    ARITH,
    BINARY,
    BROADCAST,
    CAST,
    COL_BROADCAST,
    COL_REDUCE,
    COLLECTIVE,
    MASK,
    MATMUL,
    REDUCE_KIND,
    ROW_BROADCAST,
    ROW_REDUCE,
    SCALAR_BINARY,
    UNARY,
    Op,
)
from pto.machine.dist import all_reduce
from pto.quant.planes import dequantize_tiles

#: op -> the kind of rule that runs it (one dictionary lookup per instruction, not a chain of
#: set lookups: an Op's hash is computed in Python)
_KIND = {Op.LOAD: "load", Op.STORE: "store", Op.STORE_ADD: "store_add", Op.FULL: "full", Op.LOAD_SCALAR: "load_scalar",
         Op.ROWTAKEMAX: "takemax", Op.DEINTERLEAVE: "deinterleave"}
for _kind, _ops in (("binary", BINARY), ("scalar", SCALAR_BINARY), ("unary", UNARY), ("row_reduce", ROW_REDUCE),
                    ("col_reduce", COL_REDUCE), ("broadcast", BROADCAST), ("matmul", MATMUL), ("cast", CAST),
                    ("mask", MASK), ("collective", COLLECTIVE)):
    for _op in _ops:
        _KIND.setdefault(_op, _kind)


class _Machine:
    def __init__(self, fn: IncoreFunction, mems: dict[str, RegionBatch], scalars: dict[str, torch.Tensor],
                 batch: int, device):
        self.fn = fn
        self.mems = mems
        self.device = device
        dims = dict(fn.variant)
        self.shapes = {t.name: tile_shape(t, dims) for t in fn.tiles}
        self.dtypes = {t.name: t.dtype.torch for t in fn.tiles}
        # per-task environment (vectors of length B)
        env_b: dict[str, torch.Tensor] = {k: v.to(device) for k, v in scalars.items()}
        for name, rb in mems.items():
            env_b[f"{name}.rows"] = rb.rows
            env_b[f"{name}.cols"] = rb.cols
        ext = evaluate(fn.parallel.extent, {**env_b, **dims}) if fn.parallel is not None else 1
        if isinstance(ext, torch.Tensor):
            ext = torch.as_tensor(ext, device=device).expand(batch).clone()
            self.p = max(int(ext.max().item()) if batch else 0, 0)
        else:  # the same extent for every task: every instance is active
            self.p = max(int(ext), 0)
        self.n = n = batch * self.p
        # instance n = task (n // P), parallel index (n % P); with P = 1, instance i is task i
        task, pidx = instances(batch, self.p, device)
        self.task = None if self.p == 1 else task
        self.env = Env(env_b, self.task)
        self.env.update(dims)
        self.regions = Regions(mems, self.task, n, device)
        self.active = all_true(n, device)
        self.all_active = True
        if fn.parallel is not None:
            self.env[fn.parallel.var] = pidx
            if isinstance(ext, torch.Tensor):
                self.active = pidx < (ext if self.task is None else ext[self.task])
                self.all_active = bool(self.active.all())
        self.tiles = Tiles(n, self.shapes, self.dtypes, device)
        self.quant = {p.name: p.dtype.quant for p in fn.memrefs}
        self._loop_vars = loop_vars(fn.body, set())
        # offsets of the expressions (by id) that no loop variable changes, and the others
        self._fixed: dict[int, Offset] = {}
        self._varying: set[int] = set()
        self._attrs: dict[int, tuple] = {}  # attributes of the instructions (by id) loops repeat

    # helpers ---------------------------------------------------------------------------------
    def _vec(self, e) -> torch.Tensor:
        return self._as_vec(evaluate(e, self.env))

    def _as_vec(self, v) -> torch.Tensor:
        return torch.as_tensor(v, device=self.device).expand(self.n).to(torch.int64)

    def _offset(self, e) -> Offset:
        """An integer expression's value (what :meth:`_vec` would give, an int where it is the
        same for every instance), computed once per batch unless a loop variable changes it."""
        off = self._fixed.get(id(e))
        if off is not None:
            return off
        if id(e) in self._varying:
            return Offset.of(evaluate(e, self.env))
        if not self._loop_vars.isdisjoint(e.free_vars()):
            self._varying.add(id(e))
            return Offset.of(evaluate(e, self.env))
        off = self._fixed[id(e)] = Offset.of(evaluate(e, self.env), fixed=True)
        return off

    def _scalar_value(self, e):
        v = evaluate(e, self.env)
        if isinstance(v, torch.Tensor):
            return v.to(torch.float32).view(-1, 1, 1)
        return f32_const(float(v), self.device)

    def _write(self, name: str, value: torch.Tensor) -> None:
        value = as_dtype(value, self.dtypes[name])
        if self.all_active:
            self.tiles[name] = value
        else:
            m = self.active.view(-1, 1, 1)
            self.tiles[name] = torch.where(m, value, self.tiles[name])

    def _f32(self, name: str) -> torch.Tensor:
        return as_dtype(self.tiles[name], torch.float32)

    # execution -------------------------------------------------------------------------------
    def run(self, body) -> None:
        for s in body:
            if isinstance(s, ForRange):
                self._loop(s)
            else:
                self._instr(s)

    def _loop(self, s: ForRange) -> None:
        lb, ub, st = (evaluate(e, self.env) for e in (s.lb, s.ub, s.step))
        if type(lb) is int and type(ub) is int and type(st) is int:
            self._uniform_loop(s, lb, ub, st)
            return
        lb, ub, st = self._as_vec(lb), self._as_vec(ub), self._as_vec(st)
        trips = torch.clamp((ub - lb + st - 1) // st, min=0)
        saved_active, saved_all = self.active, self.all_active
        tmin, tmax = 0, 0
        if bool(saved_active.any()):
            tmin, tmax = (int(v) for v in torch.stack([trips[saved_active].min(), trips[saved_active].max()]))
        for t in range(tmax):
            self.env[s.var] = lb + st * t
            if t >= tmin:  # before the shortest active loop ends, the loop leaves the mask as it is
                self.active = saved_active & (t < trips)
                self.all_active = bool(self.active.all())
            self.run(s.body)
        self.env.pop(s.var, None)
        self.active, self.all_active = saved_active, saved_all

    def _uniform_loop(self, s: ForRange, lb: int, ub: int, st: int) -> None:
        """A loop with the same bounds in every instance: the loop variable is an int and the
        active mask stays as it is."""
        trips = max((ub - lb + st - 1) // st, 0)
        if not (self.all_active or bool(self.active.any())):
            trips = 0
        for t in range(trips):
            self.env[s.var] = lb + st * t
            self.run(s.body)
        self.env.pop(s.var, None)

    def _load_scalar(self, ins: Instr) -> None:
        """The element's integer value per instance (truncated; the memref holds exact
        integers): a scalar of the environment from here on."""
        mem, row, col = ins.srcs
        regions = self.regions
        place = regions.place(mem, self._offset(row), self._offset(col), 1, 1)
        flat = regions.clamped(mem, regions.flat(mem, place, 1, 1))
        self.env[ins.dst] = regions.read(mem, flat).reshape(-1).to(torch.int64).expand(self.n)

    def _load(self, ins: Instr) -> None:
        mem, row, col = ins.srcs
        if self.quant.get(mem) is not None:
            self._load_quantized(ins)
            return
        r, c = self.shapes[ins.dst]
        step = int(ins.attr("step"))
        if step > 1:  # a strided load: every step-th row of the rows it spans, read as one tile
            r = (r - 1) * step + 1
        row, col = self._offset(row), self._offset(col)
        regions = self.regions
        place = regions.place(mem, row, col, r, c)
        write = self._write if step == 1 else (lambda dst, v: self._write(dst, v[:, ::step].contiguous()))
        if regions.all_inside(mem, row, col, r, c):
            write(ins.dst, regions.gather(mem, place, r, c))
            return
        pad = float(ins.attr("pad"))
        if self.all_active:
            good, bad = regions.partition(mem, row, col, r, c)
            if good is None:
                write(ins.dst, regions.masked_read(mem, place, row, col, r, c, pad))
                return
            vals = torch.empty((self.n, r, c), dtype=self.mems[mem].tensor.dtype, device=self.device)
        else:
            # an inactive instance keeps its old tile (_write), so what it loads is never seen:
            # the pad, unless its tile lies inside its region anyway
            inside = regions.inside(mem, row, col, r, c)
            good, bad = inside.nonzero().view(-1), (~inside & self.active).nonzero().view(-1)
            vals = torch.full((self.n, r, c), pad, dtype=self.mems[mem].tensor.dtype, device=self.device)
        # the tiles inside their regions as above, the others padded
        if good.shape[0]:
            vals.index_copy_(0, good, regions.gather(mem, regions.subset(place, good), r, c))
        if bad.shape[0]:
            vals.index_copy_(0, bad, regions.masked_read(mem, regions.subset(place, bad), row, col, r, c, pad, bad))
        write(ins.dst, vals)

    def _load_quantized(self, ins: Instr) -> None:
        """A tile of a quantized memref: every instance's rows and blocks dequantized
        (:func:`pto.quant.planes.dequantize_tiles`, the format's one routine), ``pad`` outside
        its region."""
        mem, row, col = ins.srcs
        r, c = self.shapes[ins.dst]
        fmt, b = self.quant[mem], self.regions.bound(mem)
        row, col = self._offset(row), self._offset(col)
        first = b.per_instance("col0") + self._as_vec(col.value)
        if bool(((first % fmt.block != 0) & self.active).any()):
            raise ExecutionError(f"`{self.fn.name}`: a load of {fmt.name} memref `{mem}` starts at column "
                                 f"{int(first[(first % fmt.block != 0) & self.active][0])}, not a multiple of its "
                                 f"block of {fmt.block}")
        nrows, cols = b.tensor.shape[0], fmt.blocks_of_row(b.tensor.shape[1]) * fmt.block
        rows = b.per_instance("row0").view(-1, 1) + self._as_vec(row.value).view(-1, 1) + arange(r, self.device)
        vals = dequantize_tiles(fmt, b.tensor, cols, rows.clamp(0, nrows - 1), first.clamp(0, cols - fmt.block), c)
        pad = f32_const(float(ins.attr("pad")), self.device)
        self._write(ins.dst, torch.where(self.regions.valid(mem, row, col, r, c, None), vals, pad))

    def _store(self, ins: Instr) -> None:
        tile, mem, row, col = ins.srcs
        r, c = self.shapes[tile]
        vals = as_dtype(self.tiles[tile], self.mems[mem].tensor.dtype)
        row, col = self._offset(row), self._offset(col)
        regions = self.regions
        place = regions.place(mem, row, col, r, c)
        if self.all_active and regions.all_inside(mem, row, col, r, c):
            regions.scatter(mem, place, vals, r, c)
            return
        # active tiles inside their regions as above; of the others, the elements inside
        if self.all_active:
            good, bad = regions.partition(mem, row, col, r, c)
            if good is None:
                regions.masked_write(mem, place, row, col, r, c, vals)
                return
        else:
            inside = regions.inside(mem, row, col, r, c)
            good, bad = (inside & self.active).nonzero().view(-1), (~inside & self.active).nonzero().view(-1)
        if good.shape[0]:
            regions.scatter(mem, regions.subset(place, good), vals[good], r, c)
        if bad.shape[0]:
            regions.masked_write(mem, regions.subset(place, bad), row, col, r, c, vals[bad], bad)

    def _store_add(self, ins: Instr) -> None:
        """Every active instance's tile added into its region, the elements inside it (instances
        may add into the same elements: each value is added)."""
        tile, mem, row, col = ins.srcs
        r, c = self.shapes[tile]
        vals = as_dtype(self.tiles[tile], self.mems[mem].tensor.dtype)
        row, col = self._offset(row), self._offset(col)
        regions = self.regions
        keep = regions.valid(mem, row, col, r, c, None)
        if not self.all_active:
            keep = keep & self.active.view(-1, 1, 1)
        shape = (self.n, r, c)
        keep, vals = keep.expand(shape), vals.expand(shape)
        flat = regions.flat(mem, regions.place(mem, row, col, r, c), r, c).expand(shape)
        regions.add(mem, flat[keep], vals[keep])

    def _instr(self, ins: Instr) -> None:
        op = ins.op
        kind = _KIND.get(op)
        if kind == "load":
            self._load(ins)
        elif kind == "store":
            self._store(ins)
        elif kind == "store_add":
            self._store_add(ins)
        elif kind == "binary":
            a, b = ins.srcs
            self._write(ins.dst, ARITH_FN[ARITH[op]](self._f32(a), self._f32(b)))
        elif kind == "scalar":
            a, s = ins.srcs
            self._write(ins.dst, ARITH_FN[ARITH[op]](self._f32(a), self._scalar_value(s)))
        elif kind == "unary":
            self._write(ins.dst, UNARY_FN[op](self._f32(ins.srcs[0])))
        elif kind == "row_reduce":
            self._write(ins.dst, REDUCE_FN[REDUCE_KIND[op]](self._f32(ins.srcs[0]), 2))
        elif kind == "takemax":  # b's element at a's row maximum
            at = self._f32(ins.srcs[0]).argmax(dim=2, keepdim=True)
            self._write(ins.dst, self._f32(ins.srcs[1]).gather(2, at))
        elif kind == "load_scalar":
            self._load_scalar(ins)
        elif kind == "col_reduce":
            self._write(ins.dst, REDUCE_FN[REDUCE_KIND[op]](self._f32(ins.srcs[0]), 1))
        elif kind == "broadcast":
            self._broadcast(ins)
        elif kind == "matmul":
            self._matmul(ins)
        elif kind == "cast":
            self._write(ins.dst, self.tiles[ins.srcs[0]])
        elif kind == "full":
            r, c = self.shapes[ins.dst]
            v = float(evaluate(ins.srcs[0], {}))
            self._write(ins.dst, torch.full((self.n, r, c), v, device=self.device))
        elif kind == "mask":
            self._mask(ins)
        elif kind == "deinterleave":
            self._write(ins.dst, self.tiles[ins.srcs[0]][:, :, int(ins.attr("part"))::2])
        elif kind == "collective":
            # one collective for the whole batch (tasks x parallel indices, stacked): every rank
            # runs the same graph and the executor batches it identically, so every rank issues
            # the same collectives in the same order
            self._write(ins.dst, all_reduce(self.tiles[ins.srcs[0]], dtype_of(ins.attr("acc")).torch))
        else:  # pragma: no cover - every op is handled above
            raise ExecutionError(f"interpreter has no rule for `{op.value}`")

    def _broadcast(self, ins: Instr) -> None:
        op = ins.op
        r, c = self.shapes[ins.dst]
        vec = self._f32(ins.srcs[-1])
        vec = vec.expand(self.n, r, c) if op in ROW_BROADCAST | COL_BROADCAST else vec
        if ARITH[op] == "copy":
            self._write(ins.dst, vec.clone())
        else:
            self._write(ins.dst, ARITH_FN[ARITH[op]](self._f32(ins.srcs[0]), vec))

    def _matmul(self, ins: Instr) -> None:
        a, b = self.tiles[ins.srcs[0]], self.tiles[ins.srcs[1]]
        ta, tb, acc_dt = self._matmul_attrs(ins)
        if ta:
            a = a.transpose(1, 2)
        if tb:
            b = b.transpose(1, 2)
        # products of the operands' values, summed in the accumulation dtype
        prod = as_dtype(torch.matmul(as_dtype(a, torch.float32), as_dtype(b, torch.float32)), acc_dt)
        if ins.op is Op.MATMUL_ACC:
            prod = as_dtype(self.tiles[ins.dst], acc_dt) + prod
        self._write(ins.dst, prod)

    def _matmul_attrs(self, ins: Instr) -> tuple[bool, bool, torch.dtype]:
        """``(ta, tb, acc dtype)`` of a matmul, looked up once per batch (loops repeat it)."""
        got = self._attrs.get(id(ins))
        if got is None:
            got = self._attrs[id(ins)] = (ins.attr("ta"), ins.attr("tb"), dtype_of(ins.attr("acc")).torch)
        return got

    def _mask(self, ins: Instr) -> None:
        src, bound = ins.srcs
        r, c = self.shapes[ins.dst]
        x = self._f32(src)
        k = evaluate(bound, self.env)
        k = k.to(torch.int64).view(-1, 1, 1) if isinstance(k, torch.Tensor) else int(k)
        ri, ci = arange(r, self.device).view(1, r, 1), arange(c, self.device).view(1, 1, c)
        if ins.op is Op.MASK_CAUSAL:
            keep = ci <= ri + k
        elif ins.op is Op.MASK_COLS:
            keep = ci < k
        else:
            keep = ri < k
        self._write(ins.dst, torch.where(keep, x, f32_const(float(ins.attr("fill")), self.device)))


def run_incore_batch(fn: IncoreFunction, mems: dict[str, RegionBatch],
                     scalars: dict[str, torch.Tensor] | None = None, batch: int | None = None) -> None:
    """Run a specialized InCore function (no dims left) for a batch of tasks, in place.

    ``mems`` maps every memref parameter to its per-task regions; ``scalars`` every scalar
    parameter to a per-task int64 vector. Tasks of one batch must not write overlapping elements.
    """
    if fn.dims:
        raise ExecutionError(f"`{fn.name}` still has dims {dict(fn.dims)}; specialize it first")
    scalars = scalars or {}
    missing = [p.name for p in fn.memrefs if p.name not in mems] + \
              [p.name for p in fn.scalars if p.name not in scalars]
    if missing:
        raise ExecutionError(f"`{fn.name}`: no binding for {', '.join(missing)}")
    if batch is None:
        batch = len(next(iter(mems.values())).row0)
    if batch == 0:
        return
    device = next(iter(mems.values())).tensor.device
    for p in fn.memrefs:
        t = mems[p.name].tensor
        if t.dtype != p.dtype.torch:
            raise ExecutionError(f"`{fn.name}`: memref `{p.name}` is {p.dtype} but the tensor is {t.dtype}")
        if not t.is_contiguous():
            raise ExecutionError(f"`{fn.name}`: tensor for `{p.name}` must be contiguous")
    m = _Machine(fn, mems, scalars, batch, device)
    with intra_op_threads(device, m.n * max((r * c for r, c in m.shapes.values()), default=0)):
        m.run(fn.body)


__all__ = ["run_incore_batch"]
