"""A cost estimate of one work item (a task and one index of its parallel axis), for the order of
the persistent executor's queue.

From the specialized InCore function and the task's scalars and regions: the matmul flops and the
tile bytes loaded and stored, each multiplied by the trip counts of the loops around it (bounds
evaluated per task), give ``max(flops / FLOPS, bytes / BYTES) + OVERHEAD`` nanoseconds per item.
The rates are an H100 SM's share of its dense bf16 peak and of its L2 bandwidth: only the ratios
between items matter (which work is long, which chain is critical), not the absolute values.
"""

from __future__ import annotations

import numpy as np
import torch

from pto.ir.analysis import staged_bytes
from pto.ir.expr import evaluate
from pto.ir.facts import tile_shape
from pto.ir.nodes import ForRange, IncoreFunction
from pto.ir.ops import MATMUL, STORES, Op

FLOPS = 6.0e3  # flop per ns and SM (790 TFLOP/s over 132 SMs)
BYTES = 75.0  # bytes per ns and SM (about 10 TB/s of L2 over 132 SMs)
OVERHEAD = 3.0e3  # ns per item: scheduling, dependency check, dispatch (measured 2.8-2.9 us)


def _vec(v, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(v.numpy() if torch.is_tensor(v) else v, dtype=np.float64), (n,))


def item_costs(fn: IncoreFunction, env: dict[str, torch.Tensor], n: int) -> np.ndarray:
    """Nanoseconds per work item of each of ``n`` tasks of ``fn`` (``env``: per-task int64
    vectors of the scalars, ``p.rows``/``p.cols`` of the memrefs)."""
    dims = dict(fn.variant)
    shapes = {t.name: tile_shape(t, dims) for t in fn.tiles}
    itemsize = {t.name: t.dtype.itemsize for t in fn.tiles}
    scope = dict(env)
    if fn.parallel is not None:
        scope[fn.parallel.var] = torch.zeros(n, dtype=torch.int64)
    flops = np.zeros(n)
    nbytes = np.zeros(n)

    def walk(body, mult):
        nonlocal flops, nbytes
        for s in body:
            if isinstance(s, ForRange):
                try:
                    lb, ub, st = (_vec(evaluate(e, scope), n) for e in (s.lb, s.ub, s.step))
                    trips = np.maximum(np.ceil((ub - lb) / np.maximum(st, 1)), 0)
                    scope[s.var] = torch.as_tensor(np.array(lb), dtype=torch.int64)
                except Exception:  # a bound the estimate cannot evaluate: count one trip
                    trips = np.ones(n)
                walk(s.body, mult * trips)
            elif s.op in MATMUL:
                a, b = s.srcs[0], s.srcs[1]
                m, k = shapes[a][::-1] if s.attr("ta") else shapes[a]
                nn = shapes[b][0] if s.attr("tb") else shapes[b][1]
                flops = flops + mult * 2.0 * m * k * nn
            elif s.op is Op.LOAD:  # a quantized memref's tile: its packed blocks
                r, c = shapes[s.dst]
                nbytes = nbytes + mult * (staged_bytes(fn, s, dims) or r * c * itemsize[s.dst])
            elif s.op in STORES:  # an add reads what it adds to
                r, c = shapes[s.srcs[0]]
                nbytes = nbytes + mult * r * c * itemsize[s.srcs[0]] * (2 if s.op is Op.STORE_ADD else 1)

    walk(fn.body, np.ones(n))
    return np.maximum(flops / FLOPS, nbytes / BYTES) + OVERHEAD


__all__ = ["item_costs", "FLOPS", "BYTES", "OVERHEAD"]
