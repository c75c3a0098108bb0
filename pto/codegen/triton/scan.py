"""The non-finite sentinel's device code: Triton functions that the persistent megakernel calls
under ``pto run --sentinel`` (:func:`pto.codegen.triton.megakernel.render_megakernel` with
``sentinel=True``) to find the first NaN or infinity of a task's regions.

``_scan(task, out, WANT, ...)`` checks the regions of the task's memref parameters that its
variant reads (``WANT`` 1: ``in``, ``inout``) or writes (2: ``out``, ``inout``), in parameter
order, stopping at the first that holds a non-finite element, and stores ``(parameter index,
row, col, code)`` in row ``task`` of ``out`` (int64 ``[n, 4]``), the layout of
:class:`pto.exec.sentinel.TaskFlags` (code 1 NaN, 2 +inf, 3 -inf). What it needs per branch
comes from a table (:func:`scan_table`: per memref slot, its direction bits, dtype and parameter
index), so the scan is one loop whatever the number of branches: one copy of the region scan per
dtype, not per variant, which keeps the sentinel kernel's compile time near the plain one's.

The megakernel calls ``_scan(..., 2, ...)`` in the last item of a task, after every item's stores
are visible to it and before it releases a successor, and ``_scan(..., 1, ...)`` for a successor
in the program that releases its last predecessor, before the successor can start.
"""

from __future__ import annotations

from pto.codegen.triton.common import TL_DTYPE
from pto.ir.analysis import param_access
from pto.ir.dtypes import DType
from pto.ir.nodes import IncoreFunction

#: a region is scanned in blocks of this many rows x columns
BLOCK = (32, 64)
#: direction bits of a memref slot in the table
READ, WRITE = 1, 2
DTYPES = (DType.F32, DType.BF16, DType.F16)

#: what counts as bad, by the codes of the infinities that are values (2 +inf, 3 -inf)
_BAD = {frozenset(): "(x != x) | (tl.abs(x) == _INF)", frozenset({3}): "(x != x) | (x == _INF)",
        frozenset({2}): "(x != x) | (x == _NEG_INF)", frozenset({2, 3}): "x != x"}

_FIRST_BAD = [
    "@triton.jit",
    "def _first_bad(P, S, r0, c0, nr, nc):",
    "    # the region's first NaN or infinity, row-major: (flat index, code); code 0: none",
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
    "    code = tl.zeros((), tl.int32)",
    "    if first < n:",
    "        v = tl.load(P + (r0 + first // nc).to(tl.int64) * S + (c0 + first % nc)).to(tl.float32)",
    "        code = tl.where(v != v, 1, tl.where(v > 0, 2, 3))",
    "    return first, code",
]


def scan_table(functions: list[IncoreFunction], maxm: int) -> list[int]:
    """Flat int32 table ``[branch, slot, 3]``: for memref slot ``j`` of branch ``k`` (running
    ``functions[k]``), its direction bits (:data:`READ`, :data:`WRITE`; 0 for no memref), its
    dtype's index in :data:`DTYPES` and its index among the variant's parameters."""
    out = []
    for fn in functions:
        access = param_access(fn)
        names = [p.name for p in fn.params]
        for j in range(maxm):
            if j < len(fn.memrefs):
                p = fn.memrefs[j]
                d = access[p.name].direction
                bits = (READ if d in ("in", "inout") else 0) | (WRITE if d in ("out", "inout") else 0)
                if p.dtype.is_quantized:  # weights' bytes, not values: not scanned
                    out += [0, 0, names.index(p.name)]
                    continue
                out += [bits, DTYPES.index(p.dtype), names.index(p.name)]
            else:
                out += [0, 0, 0]
    return out


def scan_functions(functions: list[IncoreFunction], ignore: frozenset[int] = frozenset()) -> list[list[str]]:
    """``_first_bad`` and ``_scan`` for the megakernel whose branch ``k`` runs ``functions[k]``;
    ``ignore``: the codes of the infinities that are values
    (:func:`pto.exec.sentinel.declared_infinities`; 2 +inf, 3 -inf)."""
    first = [line.replace("BAD", _BAD[frozenset(ignore)]) for line in _FIRST_BAD]
    used = [d for d in DTYPES if any(p.dtype is d for fn in functions for p in fn.memrefs)] or [DType.F32]
    scan = [
        "@triton.jit",
        "def _scan(task, out, WANT: tl.constexpr, task_branch, task_row, tab, task_tensor, ptrs, strides, stab,",
        "          MAXM: tl.constexpr):",
        "    branch = tl.load(task_branch + task)",
        "    row = tab + tl.load(task_row + task)",
        "    tids = task_tensor + task * MAXM",
        "    found = tl.zeros((), tl.int32)",
        "    for j in range(MAXM):",
        "        e = stab + (branch * MAXM + j) * 3",
        "        if ((tl.load(e) & WANT) != 0) & (found == 0):",
        "            t = tl.load(tids + j)",
        "            base = tl.load(ptrs + t)",
        "            S = tl.load(strides + t)",
        "            r0 = tl.load(row + 4 * j)",
        "            c0 = tl.load(row + 4 * j + 1)",
        "            nr = tl.load(row + 4 * j + 2)",
        "            nc = tl.load(row + 4 * j + 3)",
        "            dt = tl.load(e + 1)",
        "            first = nr.to(tl.int64) * nc",
        "            code = tl.zeros((), tl.int32)",
    ]
    for k, d in enumerate(used):
        ptr = f"base.to(tl.pointer_type({TL_DTYPE[d]}))"
        scan += [f"            {'if' if k == 0 else 'elif'} dt == {DTYPES.index(d)}:",
                 f"                first, code = _first_bad({ptr}, S, r0, c0, nr, nc)"]
    scan += [
        "            if code != 0:",
        "                tl.store(out + 4 * task, tl.load(e + 2).to(tl.int64))",
        "                tl.store(out + 4 * task + 1, (r0 + first // nc).to(tl.int64))",
        "                tl.store(out + 4 * task + 2, (c0 + first % nc).to(tl.int64))",
        "                tl.store(out + 4 * task + 3, code.to(tl.int64))",
        "                found = 1",
    ]
    return [first, scan]


_ARGS = "task_branch, task_row, tab, task_tensor, ptrs, strides, stab, MAXM"

#: the megakernel's release of a finished task's successors under the sentinel (replaces the
#: vectorized release): one successor at a time, the last predecessor scanning its reads first
RELEASE = [
    "tl.debug_barrier()",
    f"_scan(task, swrite, 2, {_ARGS})",
    "for k in range(s0, s1):",
    "    s = tl.load(succ + k)",
    "    # acq_rel: the last predecessor to get here sees every predecessor's stores",
    "    if tl.atomic_add(spend + s, -1, sem=\"acq_rel\") == 1:",
    "        tl.debug_barrier()",
    f"        _scan(s, sread, 1, {_ARGS})",
    "    tl.debug_barrier()",
    "    tl.atomic_add(pending + s, -1, sem=\"release\")",
]

__all__ = ["scan_functions", "scan_table", "RELEASE", "BLOCK", "READ", "WRITE", "DTYPES"]
