"""The runtime's text dump (``PTO-TASKGRAPH 1``, format in docs/RUNTIME.md), parsed.

:func:`read_dump` reads what :meth:`pto.runtime.Runtime.dump` (``pto_dump`` in C) writes; the
visualizer and the tests use it. It needs no compiled runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pto.errors import ParseError


@dataclass(frozen=True)
class DumpTensor:
    """A ``TENSOR`` line."""

    id: int
    name: str
    rows: int
    cols: int
    elem_size: int


@dataclass(frozen=True)
class DumpArg:
    """An ``ARG`` line (kind ``in``/``out``/``inout``) or a ``SCALAR`` line (kind ``scalar``)."""

    kind: str
    tensor: int = -1
    row0: int = 0
    col0: int = 0
    rows: int = 0
    cols: int = 0
    value: int = 0


@dataclass
class DumpTask:
    """A ``TASK`` line with the ``ARG``/``SCALAR`` lines after it."""

    id: int
    func_id: int
    func: str
    buffer_bytes: int
    fanin: int
    fanout: list[int]
    args: list[DumpArg] = field(default_factory=list)


@dataclass
class TaskGraphDump:
    """A parsed dump: tensors, functions (id → name) and tasks in id order."""

    tensors: list[DumpTensor]
    funcs: dict[int, str]
    tasks: list[DumpTask]
    n_edges: int

    def edges(self) -> list[tuple[int, int]]:
        """All ``(predecessor, successor)`` pairs."""
        return [(t.id, s) for t in self.tasks for s in t.fanout]


def read_dump(path: str | Path) -> TaskGraphDump:
    """Parse a dump written by :meth:`Runtime.dump` / ``pto_dump``.

    Raises:
        ParseError: the file is not a well-formed ``PTO-TASKGRAPH 1`` dump (the message names
            the line).
    """
    tensors: list[DumpTensor] = []
    funcs: dict[int, str] = {}
    tasks: list[DumpTask] = []
    by_id: dict[int, DumpTask] = {}
    end: tuple[int, int] | None = None
    text = Path(path).read_text()
    lines = text.splitlines()
    if not lines or lines[0].strip() != "PTO-TASKGRAPH 1":
        raise ParseError(f"{path}: line 1: expected 'PTO-TASKGRAPH 1'")
    for lineno, line in enumerate(lines[1:], start=2):
        f = line.split()
        if not f:
            continue
        if end is not None:
            raise ParseError(f"{path}: line {lineno}: text after END")
        try:
            tag = f[0]
            if tag == "TENSOR" and len(f) == 6:
                tensors.append(DumpTensor(int(f[1]), f[2], int(f[3]), int(f[4]), int(f[5])))
            elif tag == "FUNC" and len(f) == 3:
                funcs[int(f[1])] = f[2]
            elif tag == "TASK" and len(f) >= 6:
                nf = int(f[5])
                if len(f) != 6 + nf:
                    raise ValueError(f"{nf} fanout ids announced, {len(f) - 6} given")
                fid = int(f[2])
                task = DumpTask(int(f[1]), fid, funcs.get(fid, "?"), int(f[3]), int(f[4]),
                                [int(x) for x in f[6:]])
                tasks.append(task)
                by_id[task.id] = task
            elif tag == "ARG" and len(f) == 8:
                if f[2] not in ("in", "out", "inout"):
                    raise ValueError(f"bad direction {f[2]!r}")
                by_id[int(f[1])].args.append(DumpArg(f[2], *(int(x) for x in f[3:8])))
            elif tag == "SCALAR" and len(f) == 3:
                by_id[int(f[1])].args.append(DumpArg("scalar", value=int(f[2])))
            elif tag == "END" and len(f) == 3:
                end = (int(f[1]), int(f[2]))
            else:
                raise ValueError(f"unexpected {tag!r} line with {len(f)} fields")
        except (ValueError, KeyError) as exc:
            raise ParseError(f"{path}: line {lineno}: {exc}: {line!r}") from exc
    if end is None:
        raise ParseError(f"{path}: missing END line (truncated dump?)")
    n_edges = sum(len(t.fanout) for t in tasks)
    if end != (len(tasks), n_edges):
        raise ParseError(f"{path}: END says {end[0]} tasks / {end[1]} edges, found {len(tasks)} / {n_edges}")
    return TaskGraphDump(tensors, funcs, tasks, n_edges)
