"""The ranks of a device mesh: torch.distributed's default process group, and the collectives
the tile ops of :data:`pto.ir.ops.COLLECTIVE` run.

Tensor parallelism (docs/ARCHITECTURE.md, "Tensor parallelism") runs one process per rank,
started by ``torchrun``; every rank builds the same task graph with its own shards of the
weights, and a collective task sums its region over the ranks here. Nothing in this module
knows a program:

- :func:`environment`: (rank, world size, local rank) from torchrun's variables, or None;
- :func:`init`: the default process group, once (gloo on the CPU; NCCL on a GPU, the local rank's
  device, with NVLink multicast off; ``PTO_DIST_BACKEND=gloo`` on a GPU lets ranks share the
  GPUs, local rank modulo their count, to check a tensor-parallel run on a one-GPU machine: gloo
  sums CUDA tensors through the host, so its times say nothing of NCCL's), after checking that the
  mesh has ``tp`` ranks;
- :func:`rank`, :func:`world_size`: of the group (0 and 1 without one);
- :func:`all_reduce`: the sum over the ranks (the identity with one rank), counted in
  :func:`counters`; :func:`all_reduce_` the same in place, in the tensor's dtype, by the process
  group's algorithm (the Triton backend's collective tasks take it or one of symmetric memory's
  by size, :mod:`pto.collectives`: no host synchronization, captured in CUDA graphs with NCCL);
  :func:`all_gather` every rank's tensor, :func:`all_reduce_min` a decision the ranks share;
  :func:`backend`: the process group's;
- :func:`gather`: one picklable value from every rank (reports), :func:`barrier`,
  :func:`shutdown` (after the releases registered with :func:`at_shutdown`: a CUDA graph that
  captured NCCL calls must be freed before the process group is destroyed).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from pto.errors import UsageError

#: NVLink multicast (NVLS, symmetric memory's multimem) stays off on the GPU machines: the
#: collectives take NCCL's ring and tree algorithms and symmetric memory's peer loads and stores
_ENV_DEFAULTS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
#: a rank that waits longer than this in a collective fails instead of hanging (seconds)
TIMEOUT_S = float(os.environ.get("PTO_DIST_TIMEOUT_S", "300"))
BACKENDS = ("nccl", "gloo")


@dataclass(frozen=True)
class Env:
    """Where this process sits in a torchrun launch."""

    rank: int
    world: int
    local_rank: int


def environment() -> Env | None:
    """This process's rank, world size and local rank from torchrun's environment (RANK,
    WORLD_SIZE, LOCAL_RANK), or None when it was not started by torchrun."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    try:
        world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        raise UsageError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r}, RANK={os.environ['RANK']!r}: not integers") \
            from None
    return Env(rank, world, local)


def _available() -> bool:
    return torch.distributed.is_available()


def initialized() -> bool:
    return _available() and torch.distributed.is_initialized()


def world_size() -> int:
    """Ranks of the default process group (1 without one)."""
    return torch.distributed.get_world_size() if initialized() else 1


def rank() -> int:
    """This process's rank in the default process group (0 without one)."""
    return torch.distributed.get_rank() if initialized() else 0


def check_launch(tp: int, command: str = "run PROGRAM") -> Env | None:
    """This launch's place (None outside torchrun) after checking that it has ``tp`` ranks: one
    line naming what the user wrote, before any file is read or process group started."""
    env = environment()
    if env is None:
        if tp > 1:
            raise UsageError(f"--tp {tp} runs one process per rank: start it with `torchrun --nproc-per-node {tp} "
                             f"-m pto.cli {command} --tp {tp} ...`")
        return None
    if env.world != tp:
        raise UsageError(f"--tp {tp} but torchrun started {env.world} process{'es' if env.world != 1 else ''} "
                         f"(WORLD_SIZE={env.world}); give --nproc-per-node {tp} or --tp {env.world}")
    return env


def init(device: str, tp: int, command: str = "run PROGRAM") -> int:
    """Check that this launch has ``tp`` ranks (:func:`check_launch`) and start the default
    process group (once); returns this process's rank. ``tp`` 1 outside torchrun needs no group.
    Errors are one line naming what the user wrote."""
    env = check_launch(tp, command)
    if env is None:
        return 0
    if initialized():
        if world_size() != tp:
            raise UsageError(f"--tp {tp} but the process group has {world_size()} ranks")
        return rank()
    if not _available():
        raise UsageError("--tp: this torch has no torch.distributed")
    for k, v in _ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)
    backend = os.environ.get("PTO_DIST_BACKEND", "nccl" if device == "cuda" else "gloo")
    if backend not in BACKENDS or (backend == "nccl" and device != "cuda"):
        raise UsageError(f"PTO_DIST_BACKEND={backend!r}: expected " +
                         ("nccl or gloo" if device == "cuda" else "gloo (NCCL needs --device cuda)"))
    kw = {}
    if device == "cuda":
        count = torch.cuda.device_count()
        if backend == "nccl" and env.local_rank >= count:
            raise UsageError(f"rank {env.rank}: local rank {env.local_rank} has no GPU ({count} visible); "
                             "PTO_DIST_BACKEND=gloo lets ranks share GPUs (to check, not to time)")
        gpu = env.local_rank % count
        torch.cuda.set_device(gpu)
        if backend == "nccl":
            kw["device_id"] = torch.device("cuda", gpu)
    torch.distributed.init_process_group(backend, timeout=timedelta(seconds=TIMEOUT_S), **kw)
    return rank()


_AT_SHUTDOWN: list = []


def at_shutdown(release) -> None:
    """Call ``release()`` before :func:`shutdown` leaves the process group (once per function):
    what holds CUDA graphs with captured NCCL calls must free them first, or NCCL's
    communicator destruction waits forever (pytorch/pytorch#115388)."""
    if release not in _AT_SHUTDOWN:
        _AT_SHUTDOWN.append(release)


def shutdown() -> None:
    """Leave the default process group (if this process started one), after the releases of
    :func:`at_shutdown`."""
    if initialized():
        if backend() == "nccl":
            torch.cuda.synchronize()  # nothing in flight on a graph's memory when it is freed
        for release in _AT_SHUTDOWN:
            release()
        torch.distributed.destroy_process_group()


# -- collectives ----------------------------------------------------------------------------------

_COUNTERS: dict = {"calls": 0, "bytes": 0, "host_ms": 0.0, "algorithms": {}}


def all_reduce(t: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """The elementwise sum of ``t`` over the ranks of the default process group, computed (and
    sent) in ``acc``; a new tensor of dtype ``acc``. With one rank (or no group) ``t`` in
    ``acc``. Every rank must call it with the same shape, in the same order."""
    return all_reduce_(t.to(acc, copy=True).contiguous())


def all_reduce_(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over the ranks in place, in its own dtype, by the process group's own algorithm
    (NCCL's, gloo's), without waiting for the host (on the current CUDA stream with NCCL; a CUDA
    graph captures it); ``t`` itself. With one rank (or no group) nothing happens. Every rank
    must call it with the same shape, in the same order. (:mod:`pto.collectives` chooses among
    this and symmetric memory's sums by size.)"""
    if world_size() > 1:
        t0 = time.perf_counter()
        torch.distributed.all_reduce(t)
        count(t.numel() * t.element_size(), time.perf_counter() - t0, "group")
    return t


def count(nbytes: int, seconds: float, algorithm: str) -> None:
    """Count one sum of ``nbytes`` (each rank's buffer) that took ``seconds`` of host time, by
    ``algorithm`` (:data:`pto.collectives.ALGORITHMS`)."""
    _COUNTERS["host_ms"] += seconds * 1e3
    _COUNTERS["calls"] += 1
    _COUNTERS["bytes"] += nbytes
    _COUNTERS["algorithms"][algorithm] = _COUNTERS["algorithms"].get(algorithm, 0) + 1


def all_reduce_min(value: int) -> int:
    """The smallest of every rank's ``value`` (a host synchronization: for decisions the ranks
    must share, before any graph is captured); ``value`` itself without a group."""
    if world_size() == 1:
        return value
    device = f"cuda:{torch.cuda.current_device()}" if backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.int64, device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
    return int(t.item())


def all_gather(t: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``t`` (the same shape on every rank), in rank order; ``[t]`` without a group."""
    if world_size() == 1:
        return [t]
    out = [torch.empty_like(t) for _ in range(world_size())]
    torch.distributed.all_gather(out, t.contiguous())
    return out


def backend() -> str | None:
    """The default process group's backend ("nccl", "gloo"), None without one."""
    return str(torch.distributed.get_backend()) if initialized() else None


def counters(reset: bool = False) -> dict:
    """Collectives issued by this process: ``calls``, ``bytes`` (each rank's buffer),
    ``host_ms`` (host time inside them: the whole cost with gloo, the launch with NCCL) and
    ``algorithms`` (calls by algorithm: ``group``, ``one_shot``, ``two_shot``)."""
    out = {**_COUNTERS, "host_ms": round(_COUNTERS["host_ms"], 3), "algorithms": dict(_COUNTERS["algorithms"])}
    if reset:
        _COUNTERS.update(calls=0, bytes=0, host_ms=0.0, algorithms={})
    return out


def gather(value) -> list:
    """``value`` (picklable) of every rank, in rank order (``[value]`` without a group)."""
    if world_size() == 1:
        return [value]
    out: list = [None] * world_size()
    torch.distributed.all_gather_object(out, value)
    return out


def barrier() -> None:
    """Wait until every rank gets here (nothing without a group)."""
    if world_size() > 1:
        torch.distributed.barrier()


__all__ = ["Env", "environment", "check_launch", "init", "initialized", "rank", "world_size", "shutdown", "at_shutdown",
           "all_reduce", "all_reduce_", "count", "all_reduce_min", "all_gather", "backend", "counters", "gather",
           "barrier", "TIMEOUT_S"]
