"""What the tile evaluator (:mod:`pto.evaluator.machine`) keeps for one batch, and how it runs it on the CPU.

The tiles (created on first use), the instances' environment (per-task values expanded on first
use), small shared constants, and the intra-op thread count of a batch of small tiles.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from pto.ir.nodes import ForRange
from pto.ir.ops import Op


class Tiles(dict):
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


class Env(dict):
    """The environment of the instances: per-task vectors (``per_task``) are expanded to the
    instances (``v[task]``) when an expression first reads them."""

    def __init__(self, per_task: dict[str, torch.Tensor], task: torch.Tensor | None):
        super().__init__()
        self.per_task, self.task = per_task, task

    def __missing__(self, name: str):
        v = self.per_task[name]  # KeyError for an unknown name, as evaluate expects
        v = self[name] = v if self.task is None else v[self.task]
        return v


def loop_vars(body, out: set[str]) -> set[str]:
    """The variables of the loops in ``body``, added to ``out``."""
    for s in body:
        if isinstance(s, ForRange):
            out.add(s.var)
            loop_vars(s.body, out)
    return out


@functools.lru_cache(maxsize=256)
def arange(n: int, device: torch.device) -> torch.Tensor:
    """``torch.arange(n)``, shared (never written to)."""
    return torch.arange(n, device=device)


@functools.lru_cache(maxsize=256)
def instances(batch: int, p: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(task, index)`` of the ``batch * p`` instances of a batch with a parallel axis of
    extent ``p``: instance ``i`` is parallel index ``i % p`` of task ``i // p``; shared."""
    return arange(batch, device).repeat_interleave(p), arange(p, device).repeat(batch)


@functools.lru_cache(maxsize=256)
def all_true(n: int, device: torch.device) -> torch.Tensor:
    """``n`` times True, shared (never written to)."""
    return torch.ones(n, dtype=torch.bool, device=device)


def f32_const(v: float, device: torch.device) -> torch.Tensor:
    """``v`` as a 0-d f32 tensor, shared (never written to)."""
    return _f32_const(v.hex(), device)  # by the bits: 0.0 == -0.0, and they multiply differently


@functools.lru_cache(maxsize=256)
def _f32_const(bits: str, device: torch.device) -> torch.Tensor:
    return torch.tensor(float.fromhex(bits), dtype=torch.float32, device=device)


def as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)


#: tile batches (instances x tile elements) up to this size run on one intra-op thread on the CPU
PARALLEL_MIN_ELEMENTS = 1 << 20


@contextlib.contextmanager
def intra_op_threads(device, elements: int):
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


def _in_f64(fn):
    """``fn`` computed in float64 and rounded to the input's dtype. torch's f32 transcendentals
    on the CPU round an element by the code path it takes (a vector lane, or the scalar loop of
    a buffer's last few elements), so an element's value would depend on how many tiles a batch
    holds, which the ready order decides; rounded from float64 it does not."""
    return lambda x: fn(x.double()).to(x.dtype)


#: the torch function of each unary op, binary arithmetic and reduction
UNARY_FN = {
    Op.EXP: _in_f64(torch.exp),
    Op.EXP2: _in_f64(torch.exp2),
    Op.LOG: _in_f64(torch.log),
    Op.SQRT: torch.sqrt,
    Op.RSQRT: torch.rsqrt,
    Op.RECIP: torch.reciprocal,
    Op.NEG: torch.neg,
    Op.ABS: torch.abs,
    Op.RELU: torch.relu,
    Op.SILU: _in_f64(torch.nn.functional.silu),
}

ARITH_FN = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "max": torch.maximum,
    "min": torch.minimum,
}

REDUCE_FN = {
    "sum": lambda x, d: x.sum(dim=d, keepdim=True),
    "max": lambda x, d: x.amax(dim=d, keepdim=True),
    "min": lambda x, d: x.amin(dim=d, keepdim=True),
    "argmax": lambda x, d: x.argmax(dim=d, keepdim=True).to(torch.float32),  # the first of equal ones
}

__all__ = ["Tiles", "Env", "loop_vars", "arange", "instances", "all_true", "f32_const", "as_dtype", "intra_op_threads",
           "PARALLEL_MIN_ELEMENTS", "UNARY_FN", "ARITH_FN", "REDUCE_FN"]
