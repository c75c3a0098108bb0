"""The persistent megakernel: one Triton kernel that runs a whole task graph (the ``persistent``
executor, :mod:`pto.exec.persistent`, compiled and launched by :mod:`pto.backends.triton.megakernel`).

Every program of the launch loops over work items (a task and an index of its parallel axis):
its own range of the item table (ranged dispatch: static or stream), or the next index of a
device queue (one atomic counter). It calls the task's branch (the device function of its InCore
variant in the megakernel form, :class:`pto.codegen.triton.body.BodyRenderer`), which loads the
tiles of tensors none of the task's predecessors writes (the plan's early rule), then waits
until the item's pending counter is zero (acquire; not at all for an item with nothing to wait
for or one whose counter this program already saw ready), then runs the rest; and marks
completion: every item decrements the counters of its release row (release). By default a
counter is a task's, starting at the work items of all its predecessors, and an item's release
row its task's successors; with dependencies at the granularity of data
(:mod:`pto.exec.item_deps`) the items of a task that wait for the same predecessor items share a
counter and an item releases the counters that wait for it. With the sentinel, the last item of
a task to finish releases its successors (the counters count predecessor tasks). A program
loads its next item's descriptor and the current item's release row before it runs the current
one, so those loads' latency hides behind the work. The proof that this cannot
deadlock and the memory ordering of each flag are in docs/ARCHITECTURE.md.

Kernel contract (argument order):

- ``items`` int64 ``[max(n_items, 1), ITEM_COLS]``, in queue order (ranged dispatch: grouped by
  program, each program's in queue order): an item's descriptor, (task, parallel index, the task's
  branch, the offset of its row in ``tab``, 1 if the item waits for anything, the parallel
  indices the item runs from its own: 1, or a run branch's run, the counter it waits on, its
  release row), so that one round trip to memory gives what the dispatch needs; ``n_items``;
  ``nxt`` int32 ``[1]``, the queue head (0 before a run; with ranged dispatch each program adds
  the items it ran at its end);
  ``stream`` int64 ``[programs + 1]``: program k's range of ``items`` (ranged dispatch);
- ``task_branch`` int32 ``[n]``: the branch (variant and EVEN/ALIGN flags) of each task;
  ``task_row`` int64 ``[n]``: the offset of the task's row in ``tab`` (the variant's
  :class:`~pto.codegen.triton.body.TableLayout`); ``task_tensor`` int32 ``[n, MAXM]``: the tensor
  of each memref parameter; ``ptrs`` int64 / ``strides`` int64 ``[tensors]``: base addresses and
  row strides (the sentinel's scan reads these); ``task_ptr`` / ``task_stride`` int64 ``[n,
  MAXM]``: the same resolved per task (the base address and row stride of each memref's tensor),
  one load where those tables take two dependent ones;
- ``pending`` int32 ``[counters]`` (before a run: :class:`pto.exec.item_deps.Counters`'s
  ``init``; a task's counter by default, the work items of all its predecessors; with the
  sentinel the number of its predecessors), ``done`` int32 ``[n]`` (0 before a run; the
  sentinel's count of a task's finished items), ``nitems`` int32 ``[n]``, the release rows in
  CSR ``succ_ptr`` int32 ``[rows + 1]`` / ``succ`` int32 (counters; by default, and with the
  sentinel, a row a task: its successors);
- ``err`` int32 ``[2]``: set to (1, task) by a program whose wait exceeded ``MAX_POLLS``; every
  program then stops;
- ``trace`` int64 ``[n_items, 3]``: (start: the end of the wait, end, ``program | ((multiprocessor
  + 1) << 32)``, 0 above the program where not known: the interpreter) of every item (in
  the order of ``items``) when ``tracing`` is not 0 (a run-time switch: one compiled kernel serves
  both); ``clock`` int32 ``[1]``: a logical
  clock where the GPU's global timer is not available (``GPU_CLOCK`` false: the interpreter).
- with ``sentinel=True`` only (another source; the kernel without it is unchanged): ``spend``
  int32 ``[n]``, a second copy of the predecessor counts, ``sread`` / ``swrite`` int64
  ``[n, 4]``, the non-finite records of every task, and ``stab`` int32, the branches' memref
  slots (:func:`pto.codegen.triton.scan.scan_table`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from pto.codegen.triton.body import BodyRenderer
from pto.codegen.triton.common import PREFETCH_L2, TL_DTYPE, RenderOptions, _loops, block_shape, file_source
from pto.codegen.triton.scan import RELEASE, scan_functions
from pto.errors import BuildError, ResourceError
from pto.ir.facts import constant_trips, tile_shape
from pto.ir.nodes import IncoreFunction, walk_instrs
from pto.ir.ops import Op

KERNEL = "pto_persistent"
#: how a program finds its next item: ``queue``, the next index of a device queue (an atomic
#: counter: any number of programs, resident or not); ``static``, every P-th item of the queue
#: order from its program id; ``stream``, its own list of items, made on the host by the list
#: schedule's simulation (:func:`pto.exec.order.streams`). ``static`` and ``stream`` take no
#: atomic, and every program must be resident at once; both read a program's items as a range of
#: the uploaded item table (the same kernel source)
DISPATCH = ("queue", "static", "stream")
#: how an item polls its predecessors' counter on a GPU: ``one`` thread, each poll's value
#: broadcast to the others through shared memory behind two barriers (Triton's lowering of a
#: scalar atomic: the default); ``every`` thread with an acquire load of its own, no barrier a poll,
#: and one barrier that ANDs the threads' outcomes at the end (``bar.red.and.pred``), so that
#: every thread takes the same branch after a wait that gave up (docs/ARCHITECTURE.md, "The wait").
#: Under the interpreter both are the atomic poll
POLL = ("one", "every")
#: when a program loads its next item's descriptor (and the first block of the current item's
#: release row): ``held``, before it runs the current item, so those loads' latency hides behind
#: the work (their values live across the item: about 17 registers in a GEMV's loop); ``after``,
#: after the current item's release, nothing of them live across the item (a load's latency an
#: item, on the descriptor's cache line)
AHEAD = ("held", "after")
#: how the kernel calls the branches' device functions: ``inline`` (Triton's default: the
#: compiler may hoist any branch's values computed from the thread index alone out of the run
#: loop, so all branches' stay live in every item) or ``noinline`` (each a function of its own:
#: nothing moves across a branch, at a call's cost an item)
CALLS = ("inline", "noinline")
#: int64 columns of an item's descriptor: task, parallel index, branch, table row, has
#: predecessors, and the parallel indices it runs from its own (1; a run branch's run, :attr:`Branch.runs`)
ITEM_COLS = 8


@dataclass(frozen=True)
class Branch:
    """One dispatch target: a specialized variant with the EVEN/ALIGN flags of its tasks."""

    fn: IncoreFunction
    even: tuple[bool, ...]  # per memref parameter, declaration order
    align: tuple[bool, ...]
    # per memref: every task's tensor has a row stride that is a multiple of 16 elements and a
    # 16-byte aligned base. The batched kernels get this from Triton's specialization of their
    # arguments; loaded from a table, the megakernel must say it, or no load is vectorized and
    # no K loop pipelined.
    aligned: tuple[bool, ...] = ()
    # per memref: no task of the graph writes any task's tensor (weights, tables): the item loads
    # it, or prefetches it into L2, before it waits for its predecessors
    pre: tuple[bool, ...] = ()
    #: an item runs a run of consecutive parallel indices of its task (its descriptor's count),
    #: in one pipelined loop after one wait (:class:`pto.codegen.triton.body.BodyRenderer`'s
    #: ``runs``; the plan's ``runs``); nothing loads into registers before the wait (its
    #: weights' first bytes may prefetch into L2 there: ``BodyRenderer.run_prefetch``)
    runs: bool = False
    #: the item may prefetch into L2 before its wait where the kernel's ``PREFETCH`` asks (the
    #: plan's prefetch rule, :data:`pto.exec.plan.PREFETCH_RULES`, clears it)
    prefetch: bool = True
    #: per memref: the row stride of every task's tensor, a constant of the branch (so that the
    #: compiler folds the address arithmetic that uses it, on the uniform datapath), or empty:
    #: each item loads its task's from the stride table (``PTO_MK_STRIDES``,
    #: :func:`pto.exec.plan.resolve_strides`)
    strides: tuple[int, ...] = ()

    @property
    def early(self) -> tuple[str, ...]:
        """The memrefs the item may load before its wait (:attr:`pre`)."""
        return tuple(m.name for m, ok in zip(self.fn.memrefs, self.pre) if ok)


@dataclass(frozen=True)
class MegaKernel:
    name: str
    source: str
    digest: str
    branches: tuple[Branch, ...]
    max_memrefs: int


_CLOCK = [
    "@triton.jit",
    "def _now(clock, GPU_CLOCK: tl.constexpr):",
    "    if GPU_CLOCK:",
    "        # the GPU's global nanosecond timer (one value for every program, unlike clock64)",
    "        t = tl.inline_asm_elementwise(\"mov.u64 $0, %globaltimer;\", \"=l,r\", [tl.program_id(0)],",
    "                                      dtype=tl.int64, is_pure=False, pack=1)",
    "    else:",
    "        t = tl.atomic_add(clock, 1).to(tl.int64)",
    "    return t",
    "",
    "",
    "@triton.jit",
    "def _sm(GPU_CLOCK: tl.constexpr):",
    "    # the multiprocessor the program runs on, plus 1 (0: not known, the interpreter)",
    "    if GPU_CLOCK:",
    "        s = tl.inline_asm_elementwise(\"mov.u32 $0, %smid;\", \"=r,r\", [tl.program_id(0)],",
    "                                      dtype=tl.int32, is_pure=False, pack=1) + 1",
    "    else:",
    "        s = tl.program_id(0) * 0",
    "    return s",
]

#: the poll of a counter until it reads 0 (acquire: every predecessor's stores are visible to the
#: loads that follow), at most MAX_POLLS polls, or until another program gave up (the error flag,
#: read every 256 polls, not on the path); the counter's last value (Triton makes the scalar
#: atomic one thread's acquire load, broadcast through shared memory behind two barriers)
_POLL_ONE = [
    "@triton.jit",
    "def _pto_poll(cnt, err, MAX_POLLS: tl.constexpr):",
    "    pend = tl.atomic_add(cnt, 0, sem=\"acquire\")",
    "    polls = 0",
    "    while (pend > 0) & (polls < MAX_POLLS):",
    "        pend = tl.atomic_add(cnt, 0, sem=\"acquire\")",
    "        polls += 1",
    "        if polls % 256 == 0:",
    "            if tl.atomic_add(err, 0, sem=\"relaxed\") != 0:",
    "                polls = MAX_POLLS",
    "    return pend",
]

#: ``poll="every"`` on a GPU (:data:`POLL`): the same poll by each thread with an acquire load of
#: its own (inline PTX), no barrier a poll; the threads leave the loop at different polls (each
#: once it reads 0, or gives up) and meet at the barrier whose AND of ``pend == 0`` they all
#: return, so an error in one thread stops them all (``_pto_poll_every``: 0 ready, 1 not)
_POLL_EVERY = [
    "@triton.jit",
    "def _pto_ld(p, ACQUIRE: tl.constexpr):",
    "    if ACQUIRE:",
    "        v = tl.inline_asm_elementwise(\"ld.acquire.gpu.global.b32 $0, [$1];\", \"=r,l\", [p], dtype=tl.int32,",
    "                                      is_pure=False, pack=1)",
    "    else:",
    "        v = tl.inline_asm_elementwise(\"ld.relaxed.gpu.global.b32 $0, [$1];\", \"=r,l\", [p], dtype=tl.int32,",
    "                                      is_pure=False, pack=1)",
    "    return v",
    "",
    "",
    "@triton.jit",
    "def _pto_poll_every(cnt, err, MAX_POLLS: tl.constexpr):",
    "    pend = _pto_ld(cnt, True)",
    "    polls = 0",
    "    while (pend > 0) & (polls < MAX_POLLS):",
    "        pend = _pto_ld(cnt, True)",
    "        polls += 1",
    "        if polls % 256 == 0:",
    "            if _pto_ld(err, False) != 0:",
    "                polls = MAX_POLLS",
    "    # every thread of the program at one barrier: 0 in each if all read 0, else 1",
    "    return tl.inline_asm_elementwise(\"{ .reg .pred p, q; setp.eq.s32 p, $1, 0; bar.red.and.pred q, 0, p; \"",
    "                                     \"selp.s32 $0, 0, 1, q; }\", \"=r,r\", [pend], dtype=tl.int32,",
    "                                     is_pure=False, pack=1)",
]


def _wait_lines(poll: str) -> list[str]:
    """The wait for a task's predecessors, called inside each branch's device function after the
    loads it may issue first (:class:`pto.codegen.triton.body.BodyRenderer`'s megakernel form):
    ``(1, time)`` once the counter reads 0, ``(0, time)`` when the wait gave up (MAX_POLLS polls)
    or another program did; a task without predecessors, or one this program already saw ready,
    does not ask (``on``). ``poll`` (:data:`POLL`): ``every`` polls with every thread on a GPU
    (:data:`_POLL_EVERY`), the atomic poll under the interpreter."""
    if poll == "every":
        polled = ["        if GPU:",
                  "            pend = _pto_poll_every(cnt, err, MAX_POLLS)",
                  "        else:",
                  "            pend = _pto_poll(cnt, err, MAX_POLLS)"]
    else:
        polled = ["        pend = _pto_poll(cnt, err, MAX_POLLS)"]
    return [
        *_POLL_ONE, "", "",
        *(_POLL_EVERY + ["", ""] if poll == "every" else []),
        "@triton.jit",
        "def _pto_wait(cnt, on, err, clock, tracing, MAX_POLLS: tl.constexpr, GPU: tl.constexpr):",
        "    pend = tl.zeros((), dtype=tl.int32)",
        "    if on != 0:",
        *polled,
        "    t0 = tl.zeros((), dtype=tl.int64)",
        "    if tracing != 0:",
        "        t0 = _now(clock, GPU)",
        "    return (pend == 0).to(tl.int32), t0",
        "",
        "",
        *PREFETCH_L2,
    ]


#: the kernel's arguments and their Triton types (the contract in the module docstring)
_ARGS = {"items": "*i64", "n_items": "i32", "nxt": "*i32", "stream": "*i64", "task_branch": "*i32", "task_row": "*i64",
         "tab": "*i32", "task_tensor": "*i32", "ptrs": "*i64", "strides": "*i64", "task_ptr": "*i64",
         "task_stride": "*i64", "pending": "*i32", "done": "*i32", "nitems": "*i32", "succ_ptr": "*i32",
         "succ": "*i32", "err": "*i32", "trace": "*i64", "clock": "*i32", "tracing": "i32"}
_SENTINEL_ARGS = {"spend": "*i32", "sread": "*i64", "swrite": "*i64", "stab": "*i32"}
_INLINE_ARGS = {"inl_cnt": "*i64", "inl_item": "*i64"}
_CONSTEXPRS = ("MAXM", "MAX_POLLS", "SUCC_BLOCK", "GPU_CLOCK", "PREFETCH")


def kernel_signature(sentinel: bool = False, inline: bool = False) -> dict[str, str]:
    """The rendered kernel's parameters in order, each its Triton type (``constexpr`` for the
    compile-time ones): what a compile without a launch (``triton.compile`` of an ``ASTSource``)
    needs; ``sentinel``, ``inline``: as :func:`render_megakernel` was given them."""
    return {**_ARGS, **(_SENTINEL_ARGS if sentinel else {}), **(_INLINE_ARGS if inline else {}),
            **dict.fromkeys(_CONSTEXPRS, "constexpr")}


def render_megakernel(branches: list[Branch], options: RenderOptions | None = None,
                      sentinel: bool = False, ignore: frozenset[int] = frozenset(),
                      stages: dict[str, int] | None = None, dispatch: str = "queue",
                      poll: str = "one", inline: bool = False, ahead: str = "held",
                      calls: str = "inline") -> MegaKernel:
    """The source of the persistent kernel that dispatches ``branches`` (branch id = index);
    ``sentinel``: also record every task's first non-finite input and output element (NaN and
    the infinities whose codes are not in ``ignore``, :mod:`pto.codegen.triton.scan`);
    ``dispatch``: how a program finds its next item (:data:`DISPATCH`); ``poll``: how it polls a
    counter (:data:`POLL`); ``inline``: a program whose release ends the count of a counter that
    one item waits on runs that item next (:mod:`pto.exec.inline`; ranged dispatch, no sentinel:
    the kernel takes the parameters ``inl_cnt`` and ``inl_item``, per release row its inline
    counter and that counter's item's table index, or -1); ``ahead``: when a program loads its
    next item's descriptor (:data:`AHEAD`); ``calls``: how it calls the branches (:data:`CALLS`)."""
    if dispatch not in DISPATCH:
        raise ValueError(f"unknown dispatch {dispatch!r} (choose {', '.join(DISPATCH)})")
    if poll not in POLL:
        raise ValueError(f"unknown poll {poll!r} (choose {', '.join(POLL)})")
    if ahead not in AHEAD:
        raise ValueError(f"unknown look-ahead {ahead!r} (choose {', '.join(AHEAD)})")
    if calls not in CALLS:
        raise ValueError(f"unknown branch calls {calls!r} (choose {', '.join(CALLS)})")
    if inline and (sentinel or dispatch == "queue"):
        raise ValueError("inline items need ranged dispatch and no sentinel")
    devices, branch_calls = _branch_calls(branches, options or RenderOptions(), stages or {}, calls == "noinline")
    maxm = max((len(b.fn.memrefs) for b in branches), default=1) or 1
    body = _kernel_lines(branch_calls, sentinel, dispatch != "queue", inline, ahead == "held")
    scans = scan_functions([b.fn for b in branches], ignore) if sentinel else []
    src = file_source(f"Generated by pto.codegen.triton.megakernel: a persistent kernel over {len(branches)} "
                      "InCore branches." + (" With the non-finite sentinel." if sentinel else "")
                      + (" Branches not inlined." if calls == "noinline" else "")
                      + (" The next item's descriptor loaded after the release." if ahead == "after" else ""),
                      [_CLOCK, _wait_lines(poll), *devices.values(), *scans, body])
    return MegaKernel(KERNEL, src, hashlib.sha256(src.encode()).hexdigest()[:20], tuple(branches), maxm)


def _branch_calls(branches: list[Branch], opts: RenderOptions, stages: dict[str, int], noinline: bool = False):
    """The device functions (name -> lines; ``noinline``: each compiled as a function of its own)
    and, per branch, ``(id, the loads of its memrefs' pointers and strides, the call of its device
    function)``."""
    devices: dict[str, list[str]] = {}
    calls = []
    for k, b in enumerate(branches):
        r = BodyRenderer(b.fn, replace(opts, pre=b.early), stages.get(b.fn.variant_name), megakernel=True,
                         runs=b.runs, prefetch=b.prefetch, noinline=noinline)
        name, lines = r.device_function()
        if devices.setdefault(name, lines) != lines:  # (the name must say all that shapes the body)
            raise BuildError(f"megakernel: two branches render different bodies as {name}")
        args, loads = [], []
        for j, p in enumerate(b.fn.memrefs):
            ptr = f"tl.load(tptr + {j}).to(tl.pointer_type({TL_DTYPE[p.dtype]}))"
            # (a constant stride says its own divisibility)
            stride = str(b.strides[j]) if b.strides else f"tl.load(tstride + {j})"
            if b.aligned and b.aligned[j]:  # (on the pointer, not the integer: the cast drops it)
                ptr = f"tl.multiple_of({ptr}, 16)"
                stride = stride if b.strides else f"tl.multiple_of({stride}, 16)"
            loads.append(f"P_{p.name} = {ptr}")
            loads.append(f"S_{p.name} = {stride}")
            args.append(f"P_{p.name}, S_{p.name}")
        args += [str(v) for v in b.even] + [str(v) for v in b.align]
        args += ["None, False"] * len(r.tma)  # no tensor descriptors: pointer loads
        args.append("pending + cnt, on, err, clock, tracing, MAX_POLLS, GPU_CLOCK, PREFETCH")
        if b.fn.parallel is not None:
            args.insert(0, "p, n" if r.runs else "p")
        calls.append((k, loads, f"ok, t0 = {name}(row, {', '.join(args)})"))
    return devices, calls


def _kernel_lines(calls: list, sentinel: bool, ranged: bool, inline: bool = False, held: bool = True) -> list[str]:
    """The kernel: take an item, dispatch on its branch (whose device function waits for the
    task's predecessors after its early loads), complete it (see the module docstring);
    ``ranged``: a program runs a range of the item table (static and stream dispatch);
    ``inline``: and the items its releases make ready where one item waits (``s_next``: the
    stream's next index, which an inline item does not advance); ``held``: the next item's
    descriptor and the release row's first block are loaded before the item runs (else after its
    release, :data:`AHEAD`)."""
    if ranged:
        first = ["    i = tl.load(stream + tl.program_id(0))", "    end = tl.load(stream + tl.program_id(0) + 1)"]
        then = "i + 1"
        if inline:
            first.append("    s_next = i + 1")
            then = "s_next"
    else:
        first = ["    i = tl.atomic_add(nxt, 1, sem=\"relaxed\")", "    end = n_items"]
        then = "tl.atomic_add(nxt, 1, sem=\"relaxed\")"
    if held:
        ahead = [
            "        # take the next item now (a queue atomic's result is broadcast behind a barrier: its",
            "        # round trip overlaps the wait; still deadlock-free, docs/ARCHITECTURE.md), and load its",
            "        # descriptor and this task's successors (with the sentinel its item count too): loads in",
            "        # flight while the item waits and runs",
            f"        i_next = {then}",
            *_descriptor_lines("        ", "i_next", "dn", "_n"),
        ]
    else:
        ahead = ["        # this task's successors (with the sentinel its item count too); the next item is taken",
                 "        # after the release, so nothing of it is live while this one runs"]
    body = [
        "# (``tracing`` is a run-time switch: not specialized on its value, one compiled kernel serves both)",
        "@triton.jit(do_not_specialize=[\"tracing\"])",
        f"def {KERNEL}(items, n_items, nxt, stream, task_branch, task_row, tab, task_tensor, ptrs, strides,",
        "        task_ptr, task_stride, pending, done, nitems, succ_ptr, succ, err, trace, clock, tracing,"
        + (" spend, sread, swrite, stab," if sentinel else "") + (" inl_cnt, inl_item," if inline else ""),
        "        MAXM: tl.constexpr, MAX_POLLS: tl.constexpr, SUCC_BLOCK: tl.constexpr, GPU_CLOCK: tl.constexpr,",
        "        PREFETCH: tl.constexpr):",
        "    # the queue head and the error flag order no data: relaxed (no fence around them); with",
        "    # ranged dispatch a program runs its own range of the item table, and counts it at its end",
        *first,
        "    taken = 0",
        "    running = i < end",
        "    # the last counter this program saw ready: it stays 0 for the rest of the launch, so the",
        "    # next items that wait on it do not poll",
        "    ready = tl.full((), -1, tl.int32)",
        "    # the item's descriptor (a program past the last item reads the last one's, or the table's",
        "    # one row of zeros when there are none, and stops)",
        *_descriptor_lines("    ", "i", "d", ""),
        "    while running:",
        *ahead,
        *(["        want = tl.load(nitems + task)"] if sentinel else []),
        "        s0 = tl.load(succ_ptr + rrow)",
        "        s1 = tl.load(succ_ptr + rrow + 1)",
        *([] if sentinel or not held else _release_row_lines("        ", inline)),
        "        row = tab + roff",
        "        tptr = task_ptr + task.to(tl.int64) * MAXM",
        "        tstride = task_stride + task.to(tl.int64) * MAXM",
        "        on = (waits != 0) & (cnt != ready)",
        "        ok = tl.zeros((), dtype=tl.int32)",
        "        t0 = tl.zeros((), dtype=tl.int64)",
    ]
    for k, loads, call in calls:
        body.append(f"        {'if' if k == 0 else 'elif'} branch == {k}:")
        body += [f"            {line}" for line in loads]
        body.append(f"            {call}")
    tail = ["    if taken > 0:", "        tl.atomic_add(nxt, taken, sem=\"relaxed\")"] if ranged else []
    return body + _completion_lines(sentinel, inline, held, then) + tail


def _release_row_lines(indent: str, inline: bool) -> list[str]:
    """The loads of the first block of the item's release row (``ids0``; ``inline``: and the row's
    inline counter and its item), which the releases (:data:`_ITEM_RELEASES`,
    :data:`_INLINE_RELEASES`) read."""
    out = ["# the first block of successors too: the release after the item waits for no load",
           "first = s0 + tl.arange(0, SUCC_BLOCK)",
           "ids0 = tl.load(succ + first, mask=first < s1, other=0)"]
    if inline:
        out += ["# the row's inline counter (-1: none) and its item's table row",
                "ic = tl.load(inl_cnt + rrow)",
                "it = tl.load(inl_item + rrow)"]
    return [indent + line for line in out]


def _descriptor_lines(indent: str, index: str, ptr: str, suffix: str) -> list[str]:
    """The loads of item ``index``'s descriptor (clamped into the table) into ``task``, ``p``,
    ``branch``, ``roff``, ``waits``, ``n``, ``cnt`` and ``rrow`` (each name with ``suffix``)."""
    out = [f"{ptr} = items + {ITEM_COLS} * tl.maximum(tl.minimum({index}, n_items - 1), 0).to(tl.int64)"]
    for col, (name, cast) in enumerate((("task", ".to(tl.int32)"), ("p", ".to(tl.int32)"),
                                        ("branch", ".to(tl.int32)"), ("roff", ""), ("waits", ""),
                                        ("n", ".to(tl.int32)"), ("cnt", ".to(tl.int32)"),
                                        ("rrow", ".to(tl.int32)"))):
        out.append(f"{name}{suffix} = tl.load({ptr}{f' + {col}' if col else ''}){cast}")
    return [indent + line for line in out]


#: the end of an item without the sentinel: it releases each successor's counter itself (a
#: successor waits for every item of its predecessors: its count is theirs), with no count of
#: the task's items to wait for on the way
_ITEM_RELEASES = [
    "            tl.atomic_add(pending + ids0, -1, mask=first < s1, sem=\"release\")",
    "            for k in range(s0 + SUCC_BLOCK, s1, SUCC_BLOCK):",
    "                offs = k + tl.arange(0, SUCC_BLOCK)",
    "                live = offs < s1",
    "                ids = tl.load(succ + offs, mask=live, other=0)",
    "                tl.atomic_add(pending + ids, -1, mask=live, sem=\"release\")",
]
#: with the sentinel: the task's last item (acq_rel on the count of its items: it acquires the
#: other items' stores; a task of one item is its own last) scans and releases the successors,
#: whose counts are their predecessor tasks
_LAST_RELEASES = [
    "            last = want == 1",
    "            if want > 1:",
    "                old = tl.atomic_add(done + task, 1, sem=\"acq_rel\")",
    "                last = old == want - 1",
    "            if last:",
    *[f"                {line}" for line in RELEASE],
]


#: the end of an item whose release row may hold an inline counter (:mod:`pto.exec.inline`; at
#: most one a row, ``ic``): the row's other counters released as before, that one by a scalar
#: acq_rel atomic (one thread's, its old value broadcast behind a barrier, so every thread of the
#: program is ordered after the acquire) whose old value 1 says this program ended the count:
#: ``j``, the table row of the item to run next, else -1
_INLINE_RELEASES = [
    "            tl.atomic_add(pending + ids0, -1, mask=(first < s1) & (ids0 != ic), sem=\"release\")",
    "            for k in range(s0 + SUCC_BLOCK, s1, SUCC_BLOCK):",
    "                offs = k + tl.arange(0, SUCC_BLOCK)",
    "                live = offs < s1",
    "                ids = tl.load(succ + offs, mask=live, other=0)",
    "                tl.atomic_add(pending + ids, -1, mask=live & (ids != ic), sem=\"release\")",
    "            j = tl.full((), -1, tl.int64)",
    "            if ic >= 0:",
    "                if tl.atomic_add(pending + ic, -1, sem=\"acq_rel\") == 1:",
    "                    j = it",
]


def _next_lines(inline: bool, held: bool, then: str) -> list[str]:
    """After an item's release: the stream's next item (``held``: its descriptor loaded before
    the item ran, else loaded now; ``then``: its index), or (``inline``) first the inline item
    the release made ready, whose counter this program saw end (so it does not poll) and which
    leaves the stream where it was."""
    if held:
        advance = [
            "i = i_next",
            "running = i < end",
            "task, p, branch, roff, waits, n = task_n, p_n, branch_n, roff_n, waits_n, n_n",
            "cnt, rrow = cnt_n, rrow_n",
        ]
    else:
        advance = [f"i = {then}", "running = i < end", *_descriptor_lines("", "i", "d", "")]
    if not inline:
        return [f"            {line}" for line in advance[:1] + ["taken += 1"] + advance[1:]]
    return [
        "            taken += 1",
        "            if j >= 0:",
        "                tl.debug_barrier()  # (every thread after the acquire, however the old value reached it)",
        "                i = j",
        *_descriptor_lines("                ", "j", "dj", ""),
        "                ready = cnt",
        "            else:",
        *[f"                {line}" for line in advance],
        f"                s_next = {'i_next' if held else 'i'} + 1",
    ]


def _completion_lines(sentinel: bool, inline: bool, held: bool, then: str) -> list[str]:
    """The end of an item: its trace record, the successors' release (each item's, or with the
    sentinel the task's last item's; ``held``: the release row's first block loaded before the
    item, else now), the next item (:func:`_next_lines`); or, after a wait that gave up, the
    error and the stop."""
    releases = _LAST_RELEASES if sentinel else _INLINE_RELEASES if inline else _ITEM_RELEASES
    row = [] if sentinel or held else _release_row_lines("            ", inline)
    return [
        "        if ok != 0:",
        "            ready = cnt",
        "            if tracing != 0:",
        "                t1 = _now(clock, GPU_CLOCK)",
        "                tl.store(trace + 3 * i, t0)",
        "                tl.store(trace + 3 * i + 1, t1)",
        "                sm = _sm(GPU_CLOCK).to(tl.int64)",
        "                tl.store(trace + 3 * i + 2, tl.program_id(0).to(tl.int64) + (sm << 32))",
        *row,
        "            # every thread's stores before the release",
        "            tl.debug_barrier()",
        *releases,
        *_next_lines(inline, held, then),
        "        else:",
        "            # the wait exceeded its bound (or another program's did): the first to give up",
        "            # reports the task it waited on; every program stops",
        "            if tl.atomic_cas(err, 0, 1) == 0:",
        "                tl.atomic_xchg(err + 1, task)",
        "            running = False",
    ]


def stage_bytes(fn: IncoreFunction, pipelined: bool = False) -> int:
    """What one more pipeline stage of ``fn``'s loops costs in shared memory, estimated: the
    bytes of the tiles its loops load (each stage buffers one more of each, a padded tile's whole
    block). ``pipelined``: only the loops that may run more than one trip (a loop whose constant
    bounds give one trip is not pipelined: a decode GEMV's one K step loads into registers)."""
    shapes = {t.name: block_shape(tile_shape(t, dict(fn.variant))) for t in fn.tiles}
    size = {t.name: t.dtype.itemsize for t in fn.tiles}
    total = 0
    for loop in _loops(fn.body):
        if pipelined and _trips(loop) <= 1:
            continue
        for ins in walk_instrs(loop.body):
            if ins.op is Op.LOAD:
                r, c = shapes[ins.dst]
                total += r * c * size[ins.dst]
    return total


def _trips(loop) -> float:
    """The trip count of ``loop`` where its bounds are constants (inf where a task's scalars set
    them)."""
    n = constant_trips(loop)
    return math.inf if n is None else n


def shared_estimate(fn: IncoreFunction, stages: int, runs: bool = False) -> int:
    """The shared memory ``fn``'s device function needs with ``stages`` pipeline stages,
    estimated before compiling: ``stages - 1`` buffers of every tile its pipelined loops load
    (:func:`stage_bytes` with ``pipelined``; ``runs``: a run branch's, :attr:`Branch.runs`, whose
    run loop pipelines every loop that loads, a K loop of one step too). Within a few hundred
    bytes of what Triton 3.9 compiles for sm_90 for the decode steps' GEMV and LM-head branches
    alone; attention's ``tl.dot`` operands add a layout-conversion buffer it does not count (a
    third more for the 8B step's)."""
    return max(stages - 1, 0) * stage_bytes(fn, pipelined=not runs)


def fit_megakernel(branches: list[Branch], stages: dict[str, int], shared: Callable[[MegaKernel], int],
                   limit: int, render: Callable[[dict[str, int]], MegaKernel] | None = None,
                   ) -> tuple[MegaKernel, dict[str, int], int]:
    """The megakernel of ``branches`` with the deepest pipelines that fit ``limit`` bytes of
    shared memory: ``stages`` (variant name -> the depth its schedule asks for) is lowered, a
    stage at a time from the variant whose stages cost the most (:func:`stage_bytes`), until
    ``shared(kernel)`` (the compiler's figure for the kernel as it will launch) is within
    ``limit``. Returns ``(kernel, stages, shared bytes)``; raises :class:`ResourceError` naming
    the variants when one stage everywhere is still too much. ``render``: stages -> kernel
    (default :func:`render_megakernel` of ``branches``)."""
    render = render or (lambda st: render_megakernel(branches, stages=st))
    fns = {b.fn.variant_name: b.fn for b in branches}
    cost = {v: stage_bytes(fn) for v, fn in fns.items()}
    # a depth only matters for a loop that loads: the others render as 1 (one kernel source)
    cur = {v: (max(1, stages.get(v, 1)) if cost[v] else 1) for v in fns}
    while True:
        kernel = render(cur)
        need = shared(kernel)
        if need <= limit:
            return kernel, cur, need
        deeper = [v for v in cur if cur[v] > 1]
        if not deeper:
            big = sorted(fns, key=lambda v: -max(cost[v], 1))[:3]
            raise ResourceError(f"persistent kernel: needs {need:,} bytes of shared memory with one pipeline stage "
                                f"per loop (the device allows {limit:,}); its largest branches: "
                                f"{', '.join(f'`{v}`' for v in big)}")
        # branches run one at a time, so the kernel needs about what its largest branch needs:
        # lower every depth whose estimate is within the excess of the largest (at least one)
        est = {v: cur[v] * cost[v] for v in deeper}
        top = max(est.values())
        for v in deeper:
            if est[v] > top - (need - limit) or est[v] == top:
                cur[v] -= 1


__all__ = ["Branch", "MegaKernel", "render_megakernel", "kernel_signature", "KERNEL", "DISPATCH", "POLL", "AHEAD",
           "CALLS", "ITEM_COLS",
           "fit_megakernel", "stage_bytes", "shared_estimate"]
