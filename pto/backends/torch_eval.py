"""The tile evaluator: InCore functions on torch tensors (any device), batched.

One call runs a specialized InCore function for a batch of B tasks at once: each memref
parameter is bound, per task, to a region ``(row0, col0, rows, cols)`` of one torch tensor, and
each scalar parameter to a per-task value. The parallel axis becomes part of the batch
(instances = tasks x parallel index), so a batch of tiles is one torch op per instruction.
With B = 1 it is the reference interpreter's InCore step (:func:`pto.interp.incore.run_incore`),
the oracle that graph execution and the Triton backend are checked against; with larger B it is
the ``torch`` backend of the executors.

Numerics (the contract the Triton renderer follows too): elementwise, unary, reduction,
broadcast and mask ops compute in f32 and round to the destination's dtype; matmul multiplies
the operands in their own dtype and accumulates in ``acc`` (f32 by default); loads return
``pad`` outside the region's valid extent; stores skip elements outside it; ``allreduce`` sums
over the ranks of torch.distributed's default process group in its ``acc`` dtype (:mod:`pto.dist`).
"""

from __future__ import annotations

import contextlib

import torch

from pto.backends.torch_regions import Regions, pick
from pto.batch import RegionBatch
from pto.dist import all_reduce
from pto.errors import ExecutionError
from pto.ir.analysis import tile_shape
from pto.ir.dtypes import dtype_of
from pto.ir.expr import evaluate
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

_UNARY = {
    Op.EXP: torch.exp,
    Op.EXP2: torch.exp2,
    Op.LOG: torch.log,
    Op.SQRT: torch.sqrt,
    Op.RSQRT: torch.rsqrt,
    Op.RECIP: torch.reciprocal,
    Op.NEG: torch.neg,
    Op.ABS: torch.abs,
    Op.RELU: torch.relu,
    Op.SILU: torch.nn.functional.silu,
}

_ARITH = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "max": torch.maximum,
    "min": torch.minimum,
}

_REDUCE = {
    "sum": lambda x, d: x.sum(dim=d, keepdim=True),
    "max": lambda x, d: x.amax(dim=d, keepdim=True),
    "min": lambda x, d: x.amin(dim=d, keepdim=True),
}


class _Tiles(dict):
    """The tiles of a batch, created on first use: poisoned with NaN, so that reading a tile
    before writing it shows up (a tile whose first write covers every instance never needs the
    poison, so it is not allocated)."""

    def __init__(self, n: int, shapes: dict[str, tuple[int, int]], dtypes: dict[str, torch.dtype], device):
        super().__init__()
        self.n, self.shapes, self.dtypes, self.device = n, shapes, dtypes, device

    def __missing__(self, name: str) -> torch.Tensor:
        r, c = self.shapes[name]
        t = self[name] = torch.full((self.n, r, c), float("nan"), dtype=self.dtypes[name], device=self.device)
        return t


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
        if fn.parallel is not None:
            ext = evaluate(fn.parallel.extent, {**env_b, **dims})
            ext = torch.as_tensor(ext, device=device).expand(batch).clone()
            p = int(ext.max().item()) if batch else 0
        else:
            ext, p = None, 1
        self.p = max(p, 0)
        n = batch * self.p
        self.n = n
        # instance n = task (n // P), parallel index (n % P)
        self.task = torch.arange(batch, device=device).repeat_interleave(self.p)
        one = self.p == 1  # instance i is task i: the per-task vectors serve as they are
        self.env = dict(env_b) if one else {k: v[self.task] for k, v in env_b.items()}
        self.env.update(dims)
        self.regions = Regions(mems, None if one else self.task, device)
        self.active = torch.ones(n, dtype=torch.bool, device=device)
        if fn.parallel is not None:
            pidx = torch.arange(self.p, device=device).repeat(batch)
            self.env[fn.parallel.var] = pidx
            self.active = pidx < (ext if one else ext[self.task])
        self.tiles = _Tiles(n, self.shapes, self.dtypes, device)
        self.all_active = bool(self.active.all())

    # helpers ---------------------------------------------------------------------------------
    def _vec(self, e) -> torch.Tensor:
        return self._as_vec(evaluate(e, self.env))

    def _as_vec(self, v) -> torch.Tensor:
        return torch.as_tensor(v, device=self.device).expand(self.n).to(torch.int64)

    def _offset(self, e):
        """An integer expression's value: an int when it is the same for every instance, else
        an int64 vector (what :meth:`_vec` would give, unexpanded)."""
        v = evaluate(e, self.env)
        if isinstance(v, torch.Tensor):
            return v.to(torch.int64)
        return int(v)

    def _scalar_value(self, e):
        v = evaluate(e, self.env)
        if isinstance(v, torch.Tensor):
            return v.to(torch.float32).view(-1, 1, 1)
        return float(v)

    def _write(self, name: str, value: torch.Tensor) -> None:
        value = value.to(self.dtypes[name])
        if self.all_active:
            self.tiles[name] = value
        else:
            m = self.active.view(-1, 1, 1)
            self.tiles[name] = torch.where(m, value, self.tiles[name])

    def _f32(self, name: str) -> torch.Tensor:
        return self.tiles[name].to(torch.float32)

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

    def _load(self, ins: Instr) -> None:
        mem, row, col = ins.srcs
        r, c = self.shapes[ins.dst]
        row, col = self._offset(row), self._offset(col)
        regions = self.regions
        if regions.all_inside(mem, row, col, r, c):
            self._write(ins.dst, regions.gather(mem, regions.flat(mem, row, col, r, c)))
            return
        # the tiles inside their regions the fast way, the others padded
        inside = regions.inside(mem, row, col, r, c)
        good, bad = inside.nonzero().view(-1), (~inside).nonzero().view(-1)
        t = self.mems[mem].tensor
        vals = torch.empty((self.n, r, c), dtype=t.dtype, device=self.device)
        if len(good):
            flat = regions.flat(mem, pick(row, good), pick(col, good), r, c, good)
            vals.index_copy_(0, good, regions.gather(mem, flat))
        grow, gcol, valid = regions.index(mem, self._as_vec(row)[bad], self._as_vec(col)[bad], r, c, bad)
        part = t[grow, gcol]
        if valid is not None:
            pad = torch.tensor(float(ins.attr("pad")), dtype=t.dtype, device=self.device)
            part = torch.where(valid, part, pad)
        vals.index_copy_(0, bad, part)
        self._write(ins.dst, vals)

    def _store(self, ins: Instr) -> None:
        tile, mem, row, col = ins.srcs
        r, c = self.shapes[tile]
        t = self.mems[mem].tensor
        vals = self.tiles[tile].to(t.dtype)
        row, col = self._offset(row), self._offset(col)
        regions = self.regions
        if self.all_active and regions.all_inside(mem, row, col, r, c):
            regions.scatter(mem, regions.flat(mem, row, col, r, c), vals)
            return
        # active tiles inside their regions the fast way, the other active ones element by element
        inside = regions.inside(mem, row, col, r, c)
        good, bad = (self.active & inside).nonzero().view(-1), (self.active & ~inside).nonzero().view(-1)
        if len(good):
            regions.scatter(mem, regions.flat(mem, pick(row, good), pick(col, good), r, c, good), vals[good])
        grow, gcol, valid = regions.index(mem, self._as_vec(row)[bad], self._as_vec(col)[bad], r, c, bad)
        gr, gc, part = grow.expand(-1, r, c), gcol.expand(-1, r, c), vals[bad]
        if valid is not None:
            gr, gc, part = gr[valid], gc[valid], part[valid]
        t[gr, gc] = part

    def _instr(self, ins: Instr) -> None:
        op = ins.op
        if op is Op.LOAD:
            self._load(ins)
        elif op is Op.STORE:
            self._store(ins)
        elif op in BINARY:
            a, b = ins.srcs
            self._write(ins.dst, _ARITH[ARITH[op]](self._f32(a), self._f32(b)))
        elif op in SCALAR_BINARY:
            a, s = ins.srcs
            x = self._f32(a)
            v = self._scalar_value(s)
            v = torch.as_tensor(v, dtype=torch.float32, device=self.device)
            self._write(ins.dst, _ARITH[ARITH[op]](x, v))
        elif op in UNARY:
            self._write(ins.dst, _UNARY[op](self._f32(ins.srcs[0])))
        elif op in ROW_REDUCE:
            self._write(ins.dst, _REDUCE[REDUCE_KIND[op]](self._f32(ins.srcs[0]), 2))
        elif op in COL_REDUCE:
            self._write(ins.dst, _REDUCE[REDUCE_KIND[op]](self._f32(ins.srcs[0]), 1))
        elif op in BROADCAST:
            self._broadcast(ins)
        elif op in MATMUL:
            self._matmul(ins)
        elif op in CAST:
            self._write(ins.dst, self.tiles[ins.srcs[0]])
        elif op is Op.FULL:
            r, c = self.shapes[ins.dst]
            v = float(evaluate(ins.srcs[0], {}))
            self._write(ins.dst, torch.full((self.n, r, c), v, device=self.device))
        elif op in MASK:
            self._mask(ins)
        elif op in COLLECTIVE:
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
            self._write(ins.dst, _ARITH[ARITH[op]](self._f32(ins.srcs[0]), vec))

    def _matmul(self, ins: Instr) -> None:
        a, b = self.tiles[ins.srcs[0]], self.tiles[ins.srcs[1]]
        if ins.attr("ta"):
            a = a.transpose(1, 2)
        if ins.attr("tb"):
            b = b.transpose(1, 2)
        acc_dt = dtype_of(ins.attr("acc")).torch
        # products of the operands' values, summed in the accumulation dtype
        prod = torch.matmul(a.to(torch.float32), b.to(torch.float32))
        if acc_dt != torch.float32:
            prod = prod.to(acc_dt)
        if ins.op is Op.MATMUL_ACC:
            prod = self.tiles[ins.dst].to(acc_dt) + prod
        self._write(ins.dst, prod)

    def _mask(self, ins: Instr) -> None:
        src, bound = ins.srcs
        r, c = self.shapes[ins.dst]
        x = self._f32(src)
        k = self._vec(bound).view(-1, 1, 1)
        ri = torch.arange(r, device=self.device).view(1, r, 1)
        ci = torch.arange(c, device=self.device).view(1, 1, c)
        if ins.op is Op.MASK_CAUSAL:
            keep = ci <= ri + k
        elif ins.op is Op.MASK_COLS:
            keep = ci < k
        else:
            keep = ri < k
        fill = torch.tensor(float(ins.attr("fill")), dtype=torch.float32, device=self.device)
        self._write(ins.dst, torch.where(keep, x, fill))


#: tile batches (instances x tile elements) up to this size run on one intra-op thread on the CPU
PARALLEL_MIN_ELEMENTS = 1 << 20


@contextlib.contextmanager
def _intra_op_threads(device, elements: int):
    """One intra-op thread for a batch of small tiles on the CPU. Each op on them is small: a
    second thread costs a fork and join per op, and where the cores are shared, a wait for a
    descheduled thread (on the 2-core development VM, torch.exp of 128K elements took 0.4-0.9 ms
    on one thread and 6-16 ms on two; the tiny LLaMA layer 35 s against 3 s, docs/PERF.md)."""
    prev = torch.get_num_threads()
    if device.type != "cpu" or elements > PARALLEL_MIN_ELEMENTS or prev == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


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
    with _intra_op_threads(device, m.n * max((r * c for r, c in m.shapes.values()), default=0)):
        m.run(fn.body)


__all__ = ["run_incore_batch"]
