"""A task-graph dump as the arrays a drawing needs, and every task's dependency level.

:func:`load_dump` reads a dump (:func:`pto.dump.read_dump`, the format of docs/RUNTIME.md) into a
:class:`DumpGraph`; :func:`compute_levels` gives each task the length of the longest dependency
chain that ends at it, the column it is drawn in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pto.dump import read_dump
from pto.errors import ParseError, UsageError
from pto.ir.names import base_name


@dataclass
class DumpGraph:
    """The parts of a dump a drawing needs, as arrays indexed by task position (id order).

    ``succ[ptr[i]:ptr[i+1]]`` are the positions of the successors of task ``i``; ``func[i]``
    indexes ``func_names`` (variant names, e.g. ``matmul_tile__K256_N256_R32``) and
    ``base[i]`` indexes ``base_names`` (the InCore function, e.g. ``matmul_tile``). ``title``
    heads a drawing (the dump's file name unless the caller names what it shows).
    """

    path: str
    ids: np.ndarray
    func: np.ndarray
    func_names: list[str]
    base: np.ndarray
    base_names: list[str]
    buffer_bytes: np.ndarray
    ptr: np.ndarray
    succ: np.ndarray
    title: str = ""

    @property
    def n_tasks(self) -> int:
        return len(self.ids)

    @property
    def n_edges(self) -> int:
        return len(self.succ)


def load_dump(path: str | Path) -> DumpGraph:
    """Read a dump (:func:`pto.dump.read_dump`) into arrays.

    Raises:
        UsageError: the file cannot be read.
        ParseError: it is not a well-formed dump, or an edge names a task the dump lacks.
    """
    try:
        dump = read_dump(path)
    except UnicodeDecodeError as exc:
        raise ParseError(f"{path}: not a task-graph dump (binary data at byte {exc.start})") from None
    except OSError as exc:
        raise UsageError(f"cannot read task-graph dump {path}: {exc.strerror or exc}") from None
    tasks = dump.tasks
    n = len(tasks)
    ids = np.fromiter((t.id for t in tasks), np.int64, n)
    # func ids index the FUNC table; keep a dense local numbering in registration order
    fids = sorted(dump.funcs)
    local = {fid: k for k, fid in enumerate(fids)}
    func_names = [dump.funcs[f] for f in fids]
    unknown = [t for t in tasks if t.func_id not in local]
    if unknown:
        raise ParseError(f"{path}: task {unknown[0].id} uses function id {unknown[0].func_id}, "
                         "which has no FUNC line")
    func = np.fromiter((local[t.func_id] for t in tasks), np.int32, n)
    base_names: list[str] = []
    base_of_func = []
    for name in func_names:
        b = base_name(name)
        if b not in base_names:
            base_names.append(b)
        base_of_func.append(base_names.index(b))
    base = np.asarray(base_of_func, np.int32)[func] if n else np.zeros(0, np.int32)
    buffer_bytes = np.fromiter((t.buffer_bytes for t in tasks), np.int64, n)
    counts = np.fromiter((len(t.fanout) for t in tasks), np.int64, n)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    succ_ids = np.fromiter((s for t in tasks for s in t.fanout), np.int64, int(ptr[-1]))
    # task ids ascend through the dump, so a binary search maps ids to positions
    if n and np.any(np.diff(ids) <= 0):
        raise ParseError(f"{path}: task ids are not strictly increasing")
    pos = np.searchsorted(ids, succ_ids)
    bad = (pos >= n) | (ids[np.minimum(pos, max(n - 1, 0))] != succ_ids) if n else succ_ids >= 0
    if np.any(bad):
        k = int(np.argmax(bad))
        owner = int(ids[np.searchsorted(ptr, k, side="right") - 1])
        raise ParseError(f"{path}: task {owner} has successor {int(succ_ids[k])}, which is not in the dump")
    return DumpGraph(str(path), ids, func, func_names, base, base_names, buffer_bytes, ptr,
                     pos.astype(np.int64), Path(path).name)


def compute_levels(ptr: np.ndarray, succ: np.ndarray, path: str = "graph") -> np.ndarray:
    """Dependency level of every task: 0 without predecessors, else 1 + the highest level of
    its predecessors (the longest path to it).

    Kahn's algorithm, one whole frontier at a time: every edge is looked at exactly once, when
    its source enters the frontier, so the cost is linear in tasks plus edges (numpy per level).

    Raises:
        ParseError: the edges contain a cycle (not a task graph).
    """
    n = len(ptr) - 1
    indeg = np.bincount(succ, minlength=n).astype(np.int64) if n else np.zeros(0, np.int64)
    level = np.full(n, -1, np.int64)
    owner = np.empty(n, np.int64)
    frontier = np.nonzero(indeg == 0)[0]
    depth = 0
    while len(frontier):
        level[frontier] = depth
        starts, counts = ptr[frontier], ptr[frontier + 1] - ptr[frontier]
        total = int(counts.sum())
        if total == 0:
            break
        # positions of all outgoing edges of the frontier, without a Python loop
        offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts)
        targets = succ[offsets + np.arange(total)]
        np.subtract.at(indeg, targets, 1)
        ready = targets[indeg[targets] == 0]
        # a task reached by several frontier edges appears several times: keep one copy
        # (the index written last for each task wins, whichever that is; no sort needed)
        owner[ready] = np.arange(len(ready))
        frontier = ready[owner[ready] == np.arange(len(ready))]
        depth += 1
    if np.any(level < 0):
        stuck = int(np.argmax(level < 0))
        raise ParseError(f"{path}: the dependencies contain a cycle (through task position {stuck})")
    return level
