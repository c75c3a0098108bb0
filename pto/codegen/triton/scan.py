"""The non-finite sentinel's device code: Triton functions that the persistent megakernel calls
under ``pto run --sentinel`` (:func:`pto.codegen.triton.megakernel.render_megakernel` with
``sentinel=True``) to find the first NaN or infinity of a task's regions.

``_scan_reads(task, out, ...)`` and ``_scan_writes(task, out, ...)`` dispatch on the task's branch
like the megakernel, and check the regions of its memref parameters that the variant reads
(``in``, ``inout``) or writes (``out``, ``inout``), in parameter order, stopping at the first
that holds a non-finite element; they store ``(parameter index, row, col, code)`` in row
``task`` of ``out`` (int64 ``[n, 4]``), the layout of :class:`pto.exec.sentinel.TaskFlags`
(code 1 NaN, 2 +inf, 3 -inf). The megakernel calls ``_scan_writes`` in the last item of a task,
after every item's stores are visible to it and before it releases a successor, and
``_scan_reads`` for a successor in the program that releases its last predecessor, before the
successor can start.
"""

from __future__ import annotations

from pto.codegen.triton.common import TL_DTYPE
from pto.ir.analysis import param_access
from pto.ir.nodes import IncoreFunction

#: a region is scanned in blocks of this many rows x columns
BLOCK = (32, 64)

_FIRST_BAD = [
    "@triton.jit",
    "def _first_bad(P, S, r0, c0, nr, nc):",
    "    # flat row-major index of the region's first NaN or infinity (nr * nc: none)",
    "    n = nr.to(tl.int64) * nc",
    "    first = n",
    f"    for rb in range(0, nr, {BLOCK[0]}):",
    f"        for cb in range(0, nc, {BLOCK[1]}):",
    f"            rr = rb + tl.arange(0, {BLOCK[0]})[:, None]",
    f"            cc = cb + tl.arange(0, {BLOCK[1]})[None, :]",
    "            live = (rr < nr) & (cc < nc)",
    "            x = tl.load(P + (r0 + rr).to(tl.int64) * S + (c0 + cc), mask=live, other=0.0).to(tl.float32)",
    "            bad = live & (BAD)",
    "            first = tl.minimum(first, tl.min(tl.where(bad, rr.to(tl.int64) * nc + cc, n)))",
    "    return first",
]

#: what counts as bad, by the codes of the infinities that are values (2 +inf, 3 -inf)
_BAD = {frozenset(): "(x != x) | (tl.abs(x) == _INF)", frozenset({3}): "(x != x) | (x == _INF)",
        frozenset({2}): "(x != x) | (x == _NEG_INF)", frozenset({2, 3}): "x != x"}

_RECORD = [
    "@triton.jit",
    "def _record(out, task, k, P, S, r0, c0, nc, first):",
    "    r = r0 + first // nc",
    "    c = c0 + first % nc",
    "    v = tl.load(P + r.to(tl.int64) * S + c).to(tl.float32)",
    "    code = tl.where(v != v, 1, tl.where(v > 0, 2, 3))",
    "    tl.store(out + 4 * task, tl.full((), k, tl.int64))",
    "    tl.store(out + 4 * task + 1, r.to(tl.int64))",
    "    tl.store(out + 4 * task + 2, c.to(tl.int64))",
    "    tl.store(out + 4 * task + 3, code.to(tl.int64))",
]


def _branch_scan(fn: IncoreFunction, writes: bool) -> list[str]:
    """The body of one branch: its regions of one direction, in parameter order, each checked
    only while the ones before it were finite."""
    access = param_access(fn)
    want = ("out", "inout") if writes else ("in", "inout")
    lines: list[str] = []
    depth = 0
    for j, p in enumerate(fn.memrefs):
        if access[p.name].direction not in want:
            continue
        k = [q.name for q in fn.params].index(p.name)
        pad = "    " * depth
        lines += [
            f"{pad}_t{j} = tl.load(tids + {j})",
            f"{pad}P_{j} = tl.load(ptrs + _t{j}).to(tl.pointer_type({TL_DTYPE[p.dtype]}))",
            f"{pad}S_{j} = tl.load(strides + _t{j})",
            f"{pad}r0_{j} = tl.load(row + {4 * j})",
            f"{pad}c0_{j} = tl.load(row + {4 * j + 1})",
            f"{pad}nr_{j} = tl.load(row + {4 * j + 2})",
            f"{pad}nc_{j} = tl.load(row + {4 * j + 3})",
            f"{pad}f_{j} = _first_bad(P_{j}, S_{j}, r0_{j}, c0_{j}, nr_{j}, nc_{j})",
            f"{pad}if f_{j} < nr_{j}.to(tl.int64) * nc_{j}:",
            f"{pad}    _record(out, task, {k}, P_{j}, S_{j}, r0_{j}, c0_{j}, nc_{j}, f_{j})",
            f"{pad}else:",
        ]
        depth += 1
    if not lines:
        return ["pass"]
    return lines + ["    " * depth + "pass"]


def scan_functions(functions: list[IncoreFunction], ignore: frozenset[int] = frozenset()) -> list[list[str]]:
    """``_first_bad``, ``_record``, ``_scan_reads`` and ``_scan_writes`` for the megakernel whose
    branch ``k`` runs ``functions[k]``; ``ignore``: the codes of the infinities that are values
    (:func:`pto.exec.sentinel.declared_infinities`; 2 +inf, 3 -inf)."""
    first = [line.replace("BAD", _BAD[frozenset(ignore)]) for line in _FIRST_BAD]
    out = [first, _RECORD]
    for name, writes in (("_scan_reads", False), ("_scan_writes", True)):
        lines = [
            "@triton.jit",
            f"def {name}(task, out, task_branch, task_row, tab, task_tensor, ptrs, strides, MAXM: tl.constexpr):",
            "    branch = tl.load(task_branch + task)",
            "    row = tab + tl.load(task_row + task)",
            "    tids = task_tensor + task * MAXM",
        ]
        by_fn: dict[IncoreFunction, list[int]] = {}
        for k, fn in enumerate(functions):  # branches of one variant differ in flags only
            by_fn.setdefault(fn, []).append(k)
        for n, (fn, ks) in enumerate(by_fn.items()):
            cond = " | ".join(f"(branch == {k})" for k in ks)
            lines.append(f"    {'if' if n == 0 else 'elif'} {cond}:")
            lines += [f"        {line}" for line in _branch_scan(fn, writes)]
        out.append(lines)
    return out


#: the megakernel's release of a finished task's successors under the sentinel (replaces the
#: vectorized release): one successor at a time, the last predecessor scanning its reads first
RELEASE = [
    "tl.debug_barrier()",
    "_scan_writes(task, swrite, task_branch, task_row, tab, task_tensor, ptrs, strides, MAXM)",
    "s0 = tl.load(succ_ptr + task)",
    "s1 = tl.load(succ_ptr + task + 1)",
    "for k in range(s0, s1):",
    "    s = tl.load(succ + k)",
    "    # acq_rel: the last predecessor to get here sees every predecessor's stores",
    "    if tl.atomic_add(spend + s, -1, sem=\"acq_rel\") == 1:",
    "        tl.debug_barrier()",
    "        _scan_reads(s, sread, task_branch, task_row, tab, task_tensor, ptrs, strides, MAXM)",
    "    tl.debug_barrier()",
    "    tl.atomic_add(pending + s, -1, sem=\"release\")",
]

__all__ = ["scan_functions", "RELEASE", "BLOCK"]
