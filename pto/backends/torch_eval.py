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

import torch

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
    "argmax": lambda x, d: x.argmax(dim=d, keepdim=True).to(torch.float32),  # the first of equal ones
}


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
        self.env = {k: v[self.task] for k, v in env_b.items()}
        self.env.update(dims)
        self.active = torch.ones(n, dtype=torch.bool, device=device)
        if fn.parallel is not None:
            pidx = torch.arange(self.p, device=device).repeat(batch)
            self.env[fn.parallel.var] = pidx
            self.active = pidx < ext[self.task]
        self.tiles: dict[str, torch.Tensor] = {}
        for t in fn.tiles:
            r, c = self.shapes[t.name]
            # poison: reading a tile before writing it shows up as NaN
            self.tiles[t.name] = torch.full((n, r, c), float("nan"), dtype=t.dtype.torch, device=device)
        self.all_active = bool(self.active.all())

    # helpers ---------------------------------------------------------------------------------
    def _vec(self, e) -> torch.Tensor:
        v = evaluate(e, self.env)
        return torch.as_tensor(v, device=self.device).expand(self.n).to(torch.int64)

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

    def _region_index(self, mem: str, row_e, col_e, r: int, c: int):
        """Global row and column indices (N x r, N x c), clamped into the tensor, and the
        valid mask (N x r x c, or None when every element lies inside its region)."""
        rb = self.mems[mem]
        task = self.task
        ri = self._vec(row_e).view(-1, 1) + torch.arange(r, device=self.device).view(1, r)
        ci = self._vec(col_e).view(-1, 1) + torch.arange(c, device=self.device).view(1, c)
        rvalid = (ri >= 0) & (ri < rb.rows[task].view(-1, 1))
        cvalid = (ci >= 0) & (ci < rb.cols[task].view(-1, 1))
        nrows, ncols = rb.tensor.shape
        grow = (rb.row0[task].view(-1, 1) + ri).clamp_(0, nrows - 1)
        gcol = (rb.col0[task].view(-1, 1) + ci).clamp_(0, ncols - 1)
        valid = None
        if not (bool(rvalid.all()) and bool(cvalid.all())):
            valid = rvalid.view(-1, r, 1) & cvalid.view(-1, 1, c)
        return grow.view(-1, r, 1), gcol.view(-1, 1, c), valid

    # execution -------------------------------------------------------------------------------
    def run(self, body) -> None:
        for s in body:
            if isinstance(s, ForRange):
                self._loop(s)
            else:
                self._instr(s)

    def _loop(self, s: ForRange) -> None:
        lb, ub, st = self._vec(s.lb), self._vec(s.ub), self._vec(s.step)
        trips = torch.clamp((ub - lb + st - 1) // st, min=0)
        saved_active, saved_all = self.active, self.all_active
        tmax = int(trips[saved_active].max().item()) if bool(saved_active.any()) else 0
        for t in range(tmax):
            self.env[s.var] = lb + st * t
            self.active = saved_active & (t < trips)
            self.all_active = bool(self.active.all())
            self.run(s.body)
        self.env.pop(s.var, None)
        self.active, self.all_active = saved_active, saved_all

    def _instr(self, ins: Instr) -> None:
        op = ins.op
        if op is Op.LOAD:
            mem, row, col = ins.srcs
            r, c = self.shapes[ins.dst]
            grow, gcol, valid = self._region_index(mem, row, col, r, c)
            t = self.mems[mem].tensor
            vals = t[grow, gcol]
            if valid is not None:
                pad = torch.tensor(float(ins.attr("pad")), dtype=t.dtype, device=self.device)
                vals = torch.where(valid, vals, pad)
            self._write(ins.dst, vals)
        elif op is Op.STORE:
            tile, mem, row, col = ins.srcs
            r, c = self.shapes[tile]
            grow, gcol, valid = self._region_index(mem, row, col, r, c)
            t = self.mems[mem].tensor
            vals = self.tiles[tile].to(t.dtype)
            if valid is None and self.all_active:
                t[grow, gcol] = vals
            else:
                keep = self.active.view(-1, 1, 1).expand(-1, r, c)
                if valid is not None:
                    keep = keep & valid
                gr, gc = grow.expand(-1, r, c), gcol.expand(-1, r, c)
                t[gr[keep], gc[keep]] = vals[keep]
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
        elif op is Op.ROWTAKEMAX:  # b's element at a's row maximum
            at = self._f32(ins.srcs[0]).argmax(dim=2, keepdim=True)
            self._write(ins.dst, self._f32(ins.srcs[1]).gather(2, at))
        elif op in ROW_REDUCE:
            self._write(ins.dst, _REDUCE[REDUCE_KIND[op]](self._f32(ins.srcs[0]), 2))
        elif op is Op.LOAD_SCALAR:
            self._load_scalar(ins)
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

    def _load_scalar(self, ins: Instr) -> None:
        """The element's integer value per instance (truncated; the memref holds exact
        integers): a scalar of the environment from here on."""
        mem, row, col = ins.srcs
        grow, gcol, _ = self._region_index(mem, row, col, 1, 1)
        self.env[ins.dst] = self.mems[mem].tensor[grow.view(-1), gcol.view(-1)].to(torch.int64)

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
    m.run(fn.body)


__all__ = ["run_incore_batch"]
