"""How a buffer is summed over the ranks: the algorithm chosen by the message's size and the
machine, and the buffers each algorithm needs.

A collective task's sum (docs/ARCHITECTURE.md, "Tensor parallelism") is one call over a buffer
that every rank fills in the same order. Three algorithms do it, none waiting for the host, so a
CUDA graph captures each:

- ``one_shot``: PyTorch's symmetric-memory one-shot all-reduce
  (``torch.ops.symm_mem.one_shot_all_reduce_out``): after a barrier over peer memory, every rank
  reads every peer's buffer over NVLink and sums it into its own output. One barrier and no
  ring: the latency-optimized sum for decode's few kilobytes (a step's o and down projections,
  8-256 KB), where NCCL's ring costs some 16 us a call;
- ``two_shot``: its two-shot all-reduce (``two_shot_all_reduce_``, in place): a reduce-scatter
  and an all-gather over peer memory, half the bytes a rank reads of one-shot's at 2 ranks, for
  medium messages;
- ``group``: the process group's own ``all_reduce`` in place: NCCL on GPUs (rings and trees,
  bandwidth-optimal for the prefill's megabytes), gloo on the CPU.

Symmetric memory is used where it can be (:func:`symmetric_memory`): the process group is NCCL
on CUDA GPUs of one host that reach each other's memory, and this torch has the ops. NVLink
multicast (NVLS, the ``multimem`` ops) is never used: it stays off on the lent machines
(``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, :mod:`pto.machine.dist`).

``PTO_COLLECTIVES`` (:func:`mode`) forces a choice: ``auto`` (the default; ``native``, its
former name, means the same): by size, :func:`choose`; ``group``: always the process group's;
``symm``: symmetric memory at every size (a one-line error where it cannot run);
``evaluator``: every collective task on the tile evaluator (the Triton backend does not cut
them; :mod:`pto.backends.triton.collective`). ``PTO_ONE_SHOT_MAX`` and ``PTO_TWO_SHOT_MAX``
(bytes) move the size limits (:func:`limits`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from pto.errors import UsageError
from pto.machine import dist

MODES = ("auto", "group", "symm", "evaluator")
#: the former spelling of ``auto`` (when every cut collective went through the process group)
_ALIASES = {"native": "auto"}
ONE_SHOT, TWO_SHOT, GROUP = "one_shot", "two_shot", "group"
ALGORITHMS = (ONE_SHOT, TWO_SHOT, GROUP)
#: symmetric-memory kernels load and store 16 bytes a thread: a buffer (and its offset in the
#: allocation) that is not a multiple of that goes through the process group
ALIGN = 16
#: the dtypes symmetric memory's all-reduce kernels sum (others, f16, go through the process group)
SYMMETRIC_DTYPES = (torch.float32, torch.bfloat16)


def mode() -> str:
    """``PTO_COLLECTIVES``: auto (the default), group, symm or evaluator."""
    m = os.environ.get("PTO_COLLECTIVES", "auto")
    m = _ALIASES.get(m, m)
    if m not in MODES:
        raise UsageError(f"PTO_COLLECTIVES={os.environ['PTO_COLLECTIVES']!r}: expected one of {', '.join(MODES)}")
    return m


@dataclass(frozen=True)
class Limits:
    """The largest message (bytes) each symmetric-memory algorithm takes under ``auto``: up to
    ``one_shot`` one-shot, up to ``two_shot`` two-shot, the process group above."""

    one_shot: int
    two_shot: int


#: the defaults: one-shot up to 64 KiB (a decode sum of an 8B model up to 8 sequences), two-shot
#: up to 2 MiB; above, NCCL, whose rings use fewer SMs beside the prefill's GEMMs. Two H200s
#: (bench/allreduce.py, docs/PERF.md "Two GPUs measured"): one-shot fastest to 64 KiB (6.9 us),
#: two-shot from 128 KiB (7.8 against 8.3; 256 KiB 8.0 against 9.0) to 64 MiB, NCCL at no size;
#: the two-shot limit stays where the prefill's chunked sums overlap its GEMMs (unmeasured with
#: two-shot there), and four GPUs are unmeasured
DEFAULT_LIMITS = Limits(64 << 10, 2 << 20)


def _bytes_env(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None:
        return default
    if not v.isdigit():
        raise UsageError(f"{name}={v!r}: expected a number of bytes (0 or more)")
    return int(v)


def limits() -> Limits:
    """:data:`DEFAULT_LIMITS`, or ``PTO_ONE_SHOT_MAX`` / ``PTO_TWO_SHOT_MAX`` where set."""
    return Limits(_bytes_env("PTO_ONE_SHOT_MAX", DEFAULT_LIMITS.one_shot),
                  _bytes_env("PTO_TWO_SHOT_MAX", DEFAULT_LIMITS.two_shot))


def choose(nbytes: int, symmetric: bool, aligned: bool, how: str = "auto", bounds: Limits | None = None) -> str:
    """The algorithm for a sum of ``nbytes`` (each rank's buffer) under mode ``how``:
    ``symmetric``, whether symmetric memory can run here (:func:`symmetric_memory`); ``aligned``,
    whether the buffer is (:func:`aligned`). Without both, or under ``group``, the process
    group's; else one-shot up to ``bounds.one_shot`` bytes, two-shot up to ``bounds.two_shot``
    (at every larger size under ``symm``), the process group's above."""
    if how not in ("auto", "symm") or not symmetric or not aligned or nbytes == 0:
        return GROUP
    bounds = bounds or limits()
    if nbytes <= bounds.one_shot:
        return ONE_SHOT
    if how == "symm" or nbytes <= bounds.two_shot:
        return TWO_SHOT
    return GROUP


def aligned(nbytes: int, offset: int) -> bool:
    """Can the symmetric-memory kernels take a view of ``nbytes`` at byte ``offset`` of its
    buffer: both multiples of :data:`ALIGN`?"""
    return nbytes % ALIGN == 0 and offset % ALIGN == 0


# -- where symmetric memory runs ---------------------------------------------------------------------


@dataclass(frozen=True)
class Availability:
    """Whether symmetric memory's all-reduce can run (``usable``), and if not, ``why`` (one
    clause, for ``pto info`` and for the error of ``PTO_COLLECTIVES=symm``)."""

    usable: bool
    why: str = ""


def _ops_available() -> bool:
    """Does this torch have the symmetric-memory all-reduce kernels (CUDA builds)?"""
    try:
        ops = torch.ops.symm_mem
        return all(hasattr(ops, name) for name in ("one_shot_all_reduce_out", "two_shot_all_reduce_"))
    except (AttributeError, RuntimeError):
        return False


def _peers(devices: list[int]) -> str:
    """'' when every pair of ``devices`` reaches each other's memory, else the first pair that
    does not, as a clause."""
    for a in devices:
        for b in devices:
            if a != b and not torch.cuda.can_device_access_peer(a, b):
                return f"GPU {a} has no peer access to GPU {b}"
    return ""


def machine() -> Availability:
    """What this machine and this torch offer before any process group: the ops, and two GPUs or
    more that reach each other's memory (``pto info``)."""
    if not torch.distributed.is_available():
        return Availability(False, "this torch has no torch.distributed")
    if not torch.cuda.is_available():
        return Availability(False, "no CUDA GPU")
    if not _ops_available():
        return Availability(False, "this torch has no torch.ops.symm_mem all-reduce")
    count = torch.cuda.device_count()
    if count < 2:
        return Availability(False, f"{count} GPU visible, it joins two or more")
    why = _peers(list(range(count)))
    return Availability(not why, why)


def _local_availability(backend: str, world: int, local_world: int) -> Availability:
    if world < 2:
        return Availability(False, "one rank: nothing to sum")
    if backend != "nccl":
        return Availability(False, f"the process group is {backend}, it needs NCCL on CUDA GPUs")
    if not _ops_available():
        return Availability(False, "this torch has no torch.ops.symm_mem all-reduce")
    if local_world != world:
        return Availability(False, f"the {world} ranks span several hosts, LOCAL_WORLD_SIZE={local_world}")
    if torch.cuda.device_count() < world:
        return Availability(False, f"a rank sees {torch.cuda.device_count()} GPUs of the {world} ranks'")
    why = _peers(list(range(world)))
    return Availability(not why, why)


_DECIDED: dict = {}


def _forget() -> None:
    """Drop the decisions (the process group they were agreed in is leaving)."""
    _DECIDED.clear()


def symmetric_memory() -> Availability:
    """Can this process group sum through symmetric memory? NCCL on CUDA GPUs, every rank on this
    host with a GPU of its own, each pair of GPUs reaching the other's memory, and the ops in this
    torch. Decided once per group, and agreed: the first call is a collective (every rank calls
    it at the same point: the commands' :func:`check`, or the first collective launch), so that
    no rank sums by one algorithm while another waits in another."""
    if not dist.initialized():
        return Availability(False, "no process group")
    key = (id(torch.distributed.group.WORLD), dist.world_size())
    if key not in _DECIDED:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", dist.world_size()))
        mine = _local_availability(str(dist.backend()), dist.world_size(), local)
        if dist.backend() == "nccl":  # (gloo never uses it: nothing to agree on)
            everyone = dist.all_reduce_min(int(mine.usable))
            if mine.usable and not everyone:
                mine = Availability(False, "another rank cannot use it")
        _DECIDED[key] = mine
        dist.at_shutdown(_forget)
    return _DECIDED[key]


def check() -> None:
    """The collectives' environment, checked before any work (the commands call it after starting
    the process group; the Triton backend when it meets a collective task): ``PTO_COLLECTIVES``
    and the size limits well formed, and ``symm`` only where symmetric memory runs (one line
    naming why not)."""
    m = mode()
    limits()
    if m == "symm" and dist.world_size() > 1:
        a = symmetric_memory()
        if not a.usable:
            raise UsageError(f"PTO_COLLECTIVES=symm: symmetric memory cannot run here ({a.why}); "
                             "unset it or give auto or group")


def info() -> dict:
    """What ``pto info`` says of the collectives: the mode, the process groups' backends this
    torch has, whether symmetric memory's all-reduce can run on this machine (and why not), the
    size limits, NVLink multicast (off unless the environment turns it on)."""
    avail = machine()
    nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
    gloo = torch.distributed.is_available() and torch.distributed.is_gloo_available()
    m, b = mode(), limits()
    return {"mode": m, "nccl": nccl, "gloo": gloo, "symmetric_memory": avail.usable,
            "symmetric_memory_why": avail.why, "one_shot_max_bytes": b.one_shot, "two_shot_max_bytes": b.two_shot,
            "multicast": os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1") != "1"}


# -- the buffers and the sum ----------------------------------------------------------------------------


class SumBuffers:
    """The collective batches' buffers of one backend: per dtype, device and kind (``plain``, or
    ``symmetric``: allocated by symmetric memory and registered with the group's peers), one
    flat tensor whose front a batch uses, grown to the largest batch, so that the batches share
    it (each batch's second part reads its sums, on the executor's stream, before the next
    batch's first part writes). Growing a symmetric buffer is a collective (its rendezvous): the
    ranks grow theirs at the same launches, as they prepare the same batches in the same order."""

    def __init__(self):
        self._flat: dict = {}

    def get(self, numel: int, dtype: torch.dtype, device: torch.device, symmetric: bool = False) -> torch.Tensor:
        key = (dtype, str(device), symmetric)
        flat = self._flat.get(key)
        if flat is None or flat.numel() < numel:
            flat = _symmetric(numel, dtype, device) if symmetric else torch.zeros(numel, dtype=dtype, device=device)
            self._flat[key] = flat
        return flat[:numel]


def _symmetric(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed buffer of symmetric memory on ``device``, registered with the default group."""
    import torch.distributed._symmetric_memory as symm_mem

    t = symm_mem.empty(max(numel, 1), dtype=dtype, device=device)
    t.zero_()
    symm_mem.rendezvous(t, torch.distributed.group.WORLD)
    return t


def group_name() -> str:
    return torch.distributed.group.WORLD.group_name


def all_reduce(send: torch.Tensor, recv: torch.Tensor, algorithm: str) -> torch.Tensor:
    """Sum ``send`` over the ranks into ``recv`` by ``algorithm`` (:data:`ALGORITHMS`), on the
    current stream, without waiting for the host. ``recv`` is ``send`` itself for ``group`` and
    ``two_shot`` (in place); one-shot writes another tensor (its peers read ``send`` while it
    sums). Counted in :func:`pto.machine.dist.counters`."""
    in_place = recv.data_ptr() == send.data_ptr()
    if dist.world_size() == 1:
        if not in_place:
            recv.copy_(send)
        return recv
    if algorithm == GROUP:
        assert in_place, "the process group's sum is in place"
        return dist.all_reduce_(send)
    t0 = time.perf_counter()
    if algorithm == ONE_SHOT:
        torch.ops.symm_mem.one_shot_all_reduce_out(send, "sum", group_name(), recv)
    elif algorithm == TWO_SHOT:
        assert in_place, "two-shot sums in place"
        torch.ops.symm_mem.two_shot_all_reduce_(send, "sum", group_name())
    else:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}")
    dist.count(send.numel() * send.element_size(), time.perf_counter() - t0, algorithm)
    return recv


__all__ = ["MODES", "ALGORITHMS", "ONE_SHOT", "TWO_SHOT", "GROUP", "ALIGN", "SYMMETRIC_DTYPES", "Limits",
           "DEFAULT_LIMITS", "mode", "limits", "choose", "aligned", "Availability", "machine", "symmetric_memory",
           "check", "info", "SumBuffers", "group_name", "all_reduce"]
