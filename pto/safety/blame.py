"""Non-finite blame (``pto run --sentinel``): when an output holds a NaN or an infinity, the task
that made the first one, and where it came from.

The executors record, per task, the first non-finite element of the regions it read and of the
regions it wrote (:class:`pto.exec.sentinel.TaskFlags`). A task that wrote a non-finite value
while everything it read was finite is where one was born; :func:`blame` names the first of
them in submission order (a topological order of the dependencies, the same whatever executor
ran the graph): its id, InCore function and variant, the call that submitted it with its loop
indices (:func:`pto.interp.orchestration.call_sites` over the lowered module, whose task ``k``
is the generated C's task ``k``), its regions and its first non-finite element. A value that was
non-finite before the run is named as the input tensor and element, with the first task that
read it; a temporary read before any task wrote it (the NaN a run's buffers start with) is named
too.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from pto.errors import PTOError
from pto.exec.sentinel import CODE_NAMES, READS, WRITES, code_of
from pto.interp.orchestration import call_sites
from pto.ir.nodes import If, Loop

KIND_NAMES = {0: "in", 1: "out", 2: "inout"}


class NonFiniteError(PTOError):
    """An output holds a NaN or an infinity (raised by ``execute(..., sentinel=True)``):
    ``report`` is :func:`blame`'s dict, ``tensors`` the run's tensors."""

    def __init__(self, report: dict, tensors: dict[str, torch.Tensor]):
        super().__init__(format_nonfinite(report)[0] + "; " + "; ".join(
            line.strip() for line in format_nonfinite(report)[1:]))
        self.report = report
        self.tensors = tensors


def nonfinite_summary(tensors: dict[str, torch.Tensor], names) -> list[dict]:
    """For each tensor of ``names`` that holds a NaN or an infinity: its name, how many, and the
    first one (row-major)."""
    out = []
    for name in names:
        t = tensors[name]
        bad = ~torch.isfinite(t)
        n = int(bad.sum())
        if n:
            flat = int(torch.nonzero(bad.reshape(-1))[0])
            r, c = divmod(flat, t.shape[1])
            out.append({"tensor": name, "count": n, "row": r, "col": c, "value": _value(t[r, c])})
    return out


def _value(x) -> str:
    return CODE_NAMES[code_of(float(x))]


def _loop_names(module, lowered) -> tuple[str, ...]:
    """The loop variables of the program as written, each followed by the name binary expansion
    gave its tile height (reported as ``i.rows``)."""
    names: list[str] = []

    def visit(body):
        for s in body:
            if isinstance(s, Loop):
                if s.var not in names:
                    names.append(s.var)
                visit(s.body)
            elif isinstance(s, If):
                visit(s.then)
                visit(s.orelse)

    visit(module.entry_function.body)
    lets = _let_names(lowered.entry_function.body)
    out = []
    for v in names:
        out.append(v)
        out += [n for n in lets if re.fullmatch(rf"{re.escape(v)}__rows\d*", n)]
    return tuple(out)


def _let_names(body) -> list[str]:
    from pto.ir.nodes import Let

    out = []
    for s in body:
        if isinstance(s, Let):
            out.append(s.name)
        elif isinstance(s, Loop):
            out += _let_names(s.body)
        elif isinstance(s, If):
            out += _let_names(s.then) + _let_names(s.orelse)
    return out


class _Graph:
    """What a report needs of a built graph, by export row."""

    def __init__(self, graph, export):
        self.graph, self.ex = graph, export
        self.tensor_names = {tid: name for name, tid in graph.tensor_ids.items()}
        self.tensor_ids = dict(graph.tensor_ids)
        self.variants = graph.variant_of_func_id()
        self.roles = {t.name: t.role for t in graph.program.module.entry_function.tensors}

    def args(self, row: int):
        """(position, kind, tensor id, region) of every memref argument of task ``row``."""
        ex = self.ex
        for pos, a in enumerate(range(int(ex.arg_ptr[row]), int(ex.arg_ptr[row + 1]))):
            if ex.arg_kind[a] != 3:
                yield pos, int(ex.arg_kind[a]), int(ex.arg_tensor[a]), [int(v) for v in ex.arg_region[a]]

    def describe(self, row: int, site, record=None) -> dict:
        fn = self.variants[int(self.ex.func[row])]
        params = [p.name for p in fn.params]
        regions = [{"param": params[pos], "tensor": self.tensor_names[tid], "kind": KIND_NAMES[kind],
                    "rows": [r0, r0 + nr], "cols": [c0, c0 + nc]}
                   for pos, kind, tid, (r0, c0, nr, nc) in self.args(row)]
        call, loops = site
        out = {"id": row + int(self.ex.first_task), "function": fn.name, "variant": fn.variant_name,
               "call": call.func, "loc": call.loc, "loops": {_shown(k): v for k, v in loops}, "regions": regions}
        if record is not None and record[0] >= 0:
            k, r, c, code = (int(v) for v in record)
            tensor = next(x["tensor"] for x in regions if x["param"] == params[k])
            out["element"] = {"param": params[k], "tensor": tensor, "row": r, "col": c, "value": CODE_NAMES[code]}
        return out

    def touches(self, tensor: int, r: int, c: int, kinds) -> np.ndarray:
        """Rows of the tasks with an argument of one of ``kinds`` on ``tensor`` covering (r, c)."""
        ex = self.ex
        reg = ex.arg_region
        hit = (ex.arg_tensor == tensor) & np.isin(ex.arg_kind, kinds) & (reg[:, 0] <= r) & (r < reg[:, 0] + reg[:, 2]) \
            & (reg[:, 1] <= c) & (c < reg[:, 1] + reg[:, 3])
        args = np.nonzero(hit)[0]
        return np.unique(np.searchsorted(ex.arg_ptr, args, side="right") - 1)


def _shown(name: str) -> str:
    m = re.fullmatch(r"(.+)__rows\d*", name)
    return f"{m.group(1)}.rows" if m else name


def blame(graph, flags, tensors: dict[str, torch.Tensor], outputs, inputs_before: list[dict] | None = None
          ) -> dict | None:
    """The report of a run whose ``outputs`` (names) hold a NaN or an infinity, or None when
    they are finite. ``flags``: the executor's :class:`pto.exec.sentinel.TaskFlags`;
    ``inputs_before``: :func:`nonfinite_summary` of the input tensors before the run (for
    inputs no task read)."""
    bad_out = nonfinite_summary(tensors, outputs)
    if not bad_out:
        return None
    g = _Graph(graph, flags.export)
    born = flags.born
    culprit = int(born[0]) if len(born) else None
    # tasks that read a non-finite element no earlier task wrote: an input's, or a buffer's poison
    reads = np.nonzero(flags.read[:, 0] >= 0)[0]
    first_read = {}
    for row in reads:
        k, r, c, _ = (int(v) for v in flags.read[row])
        tid = next(t for pos, _, t, _ in g.args(int(row)) if pos == k)
        writers = g.touches(tid, r, c, WRITES)
        if not len(writers) or writers[0] >= row:
            kind = "input" if g.roles[g.tensor_names[tid]] in ("input", "inout") else "unwritten"
            first_read.setdefault(kind, int(row))
        if len(first_read) == 2:
            break
    sites = call_sites(graph.program.lowered, graph.scalars,
                       [x for x in (culprit, *first_read.values()) if x is not None],
                       _loop_names(graph.program.module, graph.program.lowered))
    report = {"outputs": bad_out, "born": int(len(born)), "task": None, "input": None, "unwritten": None}
    if culprit is not None:
        report["task"] = g.describe(culprit, sites[culprit], flags.wrote[culprit])
    for kind, row in first_read.items():
        reader = g.describe(row, sites[row], flags.read[row])
        el = reader.pop("element")
        report[kind] = {"tensor": el["tensor"], "row": el["row"], "col": el["col"], "value": el["value"],
                        "read_by": reader}
    if report["input"] is None and inputs_before:  # an input the flags do not track (an ignored infinity)
        x = inputs_before[0]
        rows = g.touches(g.tensor_ids[x["tensor"]], x["row"], x["col"], (0, 1, 2))
        reader = None
        if len(rows) and len(g.touches(g.tensor_ids[x["tensor"]], x["row"], x["col"], READS)) and \
                g.touches(g.tensor_ids[x["tensor"]], x["row"], x["col"], READS)[0] == rows[0]:
            row = int(rows[0])
            reader = g.describe(row, call_sites(graph.program.lowered, graph.scalars, [row],
                                                _loop_names(graph.program.module, graph.program.lowered))[row])
        report["input"] = {"tensor": x["tensor"], "row": x["row"], "col": x["col"], "value": x["value"],
                           "read_by": reader}
    report["untracked"] = sorted(CODE_NAMES[c] for c in flags.ignore)
    return report


def _task_line(t: dict) -> str:
    loops = ", ".join(f"{k}={v}" for k, v in t["loops"].items())
    where = f"call to `{t['call']}`" + (f" ({t['loc']})" if t["loc"] else "") + (f" with {loops}" if loops else "")
    return f"task {t['id']} `{t['variant']}`, {where}"


def _region(x: dict) -> str:
    (r0, r1), (c0, c1) = x["rows"], x["cols"]
    return f"{x['kind']} `{x['tensor']}` rows {r0}..{r1 - 1} cols {c0}..{c1 - 1}"


def format_nonfinite(report: dict) -> list[str]:
    """The report as lines for a person (the first says which outputs are not finite)."""
    outs = ", ".join(f"`{o['tensor']}` holds {o['count']:,} (first {o['tensor']}[{o['row']}, {o['col']}] = "
                     f"{o['value']})" for o in report["outputs"])
    lines = [f"non-finite output: {outs}"]
    t = report["task"]
    if t is not None:
        el = t["element"]
        wrote = next(x for x in t["regions"] if x["param"] == el["param"])
        lines.append(f"  first made by {_task_line(t)}, from finite inputs: it wrote {el['tensor']}[{el['row']}, "
                     f"{el['col']}] = {el['value']} ({_region(wrote)})")
        if report["born"] > 1:
            lines.append(f"  ({report['born'] - 1:,} later tasks also made non-finite values from finite inputs)")
    x = report["input"]
    if x is not None:
        by = f", first read by {_task_line(x['read_by'])}" if x["read_by"] else ", read by no task"
        lines.append(f"  input `{x['tensor']}` held {x['value']} at {x['tensor']}[{x['row']}, {x['col']}] before the "
                     f"run{by}")
    x = report["unwritten"]
    if x is not None:
        lines.append(f"  {_task_line(x['read_by'])} read {x['tensor']}[{x['row']}, {x['col']}] = {x['value']} before "
                     "any task wrote it")
    if t is None and report["input"] is None and report["unwritten"] is None:
        lines.append("  no task made it and no input held it (an output region no task writes?)")
    if report.get("untracked"):
        lines.append(f"  ({' and '.join(report['untracked'])}: a value the program's functions use on purpose, e.g. a "
                     "mask fill; not tracked)")
    return lines


__all__ = ["blame", "format_nonfinite", "nonfinite_summary", "NonFiniteError", "KIND_NAMES"]
