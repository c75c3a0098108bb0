"""A task graph's plan compiled into the persistent megakernel, its device tables and its launch.

The persistent executor (:mod:`pto.exec.persistent`) builds a plan of the graph (the tables of
:class:`pto.exec.plan.Plan`) and asks the backend for a :class:`Megakernel`
(:meth:`TritonBackend.megakernel <pto.backends.triton.backend.TritonBackend.megakernel>`). Here
the kernel is rendered (:mod:`pto.codegen.triton.megakernel`) with each variant's pipelining depth
from its launch configuration, lowered until the compiled kernel fits the device's shared memory
(compiled before any launch; under the interpreter nothing is compiled), the plan is uploaded,
and as many programs as the GPU holds at once are launched. A launch resets the counters on the
device (two memsets and a copy) and launches again, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

import numpy as np
import torch

from pto.backends.triton.launch import LaunchConfig, merged, triton_error
from pto.backends.triton.loader import load_kernel
from pto.codegen.triton.common import RenderOptions
from pto.codegen.triton.megakernel import (
    AHEAD,
    CALLS,
    DISPATCH,
    ITEM_COLS,
    POLL,
    MegaKernel,
    fit_megakernel,
    render_megakernel,
    shared_estimate,
)
from pto.codegen.triton.scan import scan_table
from pto.errors import BuildError, ResourceError, UsageError

#: polls of a predecessor counter before a program gives up (seconds on an H100: a poll is an atomic round trip)
MAX_POLLS = 1 << 24


@dataclass(frozen=True)
class MegakernelSettings:
    """How the megakernel is built: ``sentinel`` renders the non-finite sentinel (``ignore``: the
    variants whose declared infinities it does not report); ``max_polls`` bounds a dependency
    wait; ``shared_limit`` the bytes of shared memory (None: the device's); ``programs`` the
    programs of a launch (None: as many as fit on the GPU); ``dispatch`` how a program finds its
    next item (:data:`~pto.codegen.triton.megakernel.DISPATCH`; None: ``PTO_DISPATCH`` or
    :data:`DEFAULT_DISPATCH`)."""

    sentinel: bool = False
    ignore: frozenset = frozenset()
    max_polls: int = MAX_POLLS
    shared_limit: int | None = None
    programs: int | None = None
    dispatch: str | None = None
    #: programs per multiprocessor to make room for: the kernel's pipelines are lowered to fit
    #: that share of the shared memory and its registers are capped to that share (None:
    #: ``PTO_PER_SM``, else :data:`AUTO`; 0: as many as the compiled kernel allows); a tuple gives
    #: each segment of a split plan its own (the last repeats), e.g. ``(2, 0)``
    per_sm: int | str | tuple | None = None
    #: 1: an item prefetches into L2 what the loops after its wait load of the operands it loads
    #: early (the first trips, up to :attr:`prefetch_kb`), before the wait (a run, which loads
    #: none into registers before it, its first indices' weights:
    #: :meth:`pto.codegen.triton.body.BodyRenderer.run_prefetch`; quantized weights never);
    #: 2: also of the operands it only reads though a predecessor writes them (a decode step's
    #: keys and values: :meth:`pto.codegen.triton.body.BodyRenderer.prefetch`); 0: only its
    #: register loads come first; ``light``: 1, in the tasks that wait last for no GEMV
    #: (:data:`pto.exec.plan.PREFETCH_RULES`) (None: ``PTO_MK_PREFETCH``, else :data:`DEFAULT_PREFETCH`)
    prefetch: int | str | None = None
    #: the most KiB an item prefetches into L2 before its wait (None: ``PTO_MK_PREFETCH_KB``, else
    #: :data:`DEFAULT_PREFETCH_KB`; :attr:`pto.codegen.triton.common.RenderOptions.prefetch_bytes`)
    prefetch_kb: int | str | None = None
    #: where the plan is cut into launches by resource class (:mod:`pto.exec.segments`): ``off``,
    #: ``auto`` or levels that start a segment (None: ``PTO_MK_SPLIT``, else
    #: :data:`pto.exec.segments.DEFAULT_SPLIT`); the persistent executor reads it
    split: str | None = None
    #: which segment of a split plan this kernel runs (its entry of ``per_sm``)
    segment: int = 0
    #: which memrefs an item loads before its wait (:data:`pto.exec.plan.EARLY_RULES`; None:
    #: ``PTO_MK_EARLY``, else :data:`pto.exec.plan.DEFAULT_EARLY`); the persistent executor reads it
    early: str | None = None
    #: a GEMV's task (:func:`pto.exec.plan.takes_runs`) in at most this many work items, each a
    #: run of consecutive indices its branch loops over, pipelined through shared memory, after
    #: one wait (:attr:`pto.codegen.triton.megakernel.Branch.runs`): a number, ``auto`` (two a
    #: multiprocessor: one round of the two programs a multiprocessor the decode steps' kernels
    #: hold) or 0, off (None: ``PTO_MK_RUNS``, else :data:`pto.exec.plan.DEFAULT_RUNS`); the
    #: persistent executor reads it (:func:`pto.exec.plan.resolve_runs`)
    runs: int | str | None = None
    #: what an item waits for: every item of its task's predecessors (``task``) or those whose
    #: data its own conflicts with (``data``: :mod:`pto.exec.item_deps`; None: ``PTO_MK_DEPS``,
    #: else ``task``); the persistent executor reads it
    deps: str | None = None
    #: how an item polls its predecessors' counter on a GPU (:data:`pto.codegen.triton.megakernel.POLL`:
    #: ``one`` thread, or ``every`` thread; None: ``PTO_MK_POLL``, else :data:`DEFAULT_POLL`)
    poll: str | None = None
    #: ``on``: an item that alone waits on its counter runs on the program whose release ends the
    #: count, next, without a poll (:mod:`pto.exec.inline`; ranged dispatch, not with the sentinel);
    #: None: ``PTO_MK_INLINE``, else :data:`DEFAULT_INLINE`
    inline: str | None = None
    #: ``on``: with dependencies at the granularity of data, the list schedule starts an item that
    #: waits for some of its task's predecessors' items on the program of its last producer where
    #: that is free (:func:`pto.exec.plan.item_affinity`); None: ``PTO_MK_AFFINITY``, else
    #: :data:`pto.exec.plan.DEFAULT_AFFINITY`; the persistent executor reads it
    affinity: str | None = None
    #: where a branch takes its memrefs' row strides: ``table`` (each item loads its task's) or
    #: ``constant`` (constants of the branch, one branch per combination of strides;
    #: :attr:`pto.codegen.triton.megakernel.Branch.strides`); None: ``PTO_MK_STRIDES``, else
    #: :data:`pto.exec.plan.DEFAULT_STRIDES`; the persistent executor reads it
    strides: str | None = None
    #: the pipeline stages of every branch whose loops load through shared memory, in place of
    #: its schedule's (lowered, as those are, until the kernel fits its share of shared memory:
    #: :func:`~pto.codegen.triton.megakernel.fit_megakernel`), or ``schedule``: the schedules'
    #: alone; None: ``PTO_MK_STAGES``, else the schedules' with :data:`LONE_DOT_STAGES` in the
    #: lone dot projections, or :data:`QUANT_GEMV_STAGES` everywhere in a step of quantized GEMVs
    #: (:func:`resolve_stages`, :func:`branch_stages`)
    stages: int | str | None = None
    #: when a program loads its next item's descriptor: before the item runs (``held``) or after
    #: its release (``after``; :data:`pto.codegen.triton.megakernel.AHEAD`); None: ``PTO_MK_AHEAD``,
    #: else :data:`DEFAULT_AHEAD`
    ahead: str | None = None
    #: how the kernel calls its branches: ``inline``, ``noinline`` (each a function of its own,
    #: nothing hoisted across branches; :data:`pto.codegen.triton.megakernel.CALLS`) or ``auto``
    #: (:data:`AUTO_CALLS`: inline unless that kernel spills); None: ``PTO_MK_CALLS``, else
    #: :data:`DEFAULT_CALLS`
    calls: str | None = None
    #: the warps of a program, in place of the most any branch's schedule asks for (:func:`merged`):
    #: one of :data:`WARPS` (None: ``PTO_MK_WARPS``, else the branches' most; :func:`resolve_warps`)
    warps: int | None = None


#: the dispatch of a megakernel whose settings and environment name none
DEFAULT_DISPATCH = "static"
#: the poll where the settings and environment name none: ``every`` measured slower on an H200
#: (SmolLM2's step 0.4934-0.5008 ms against 0.4537-0.4558, its median wait 1.06-1.09 us against
#: 0.90-0.93; the 8B's 4.296-4.314 against 4.246-4.261; docs/PERF.md, "Nineteenth session")
DEFAULT_POLL = "one"
#: the L2 prefetch where the settings and environment do not say: off (on SmolLM2's step on an
#: H200 0.5768 against 0.5774 ms without: no measured gain, docs/PERF.md)
DEFAULT_PREFETCH = 0
#: the look-ahead where the settings and environment do not say: ``held`` (``after`` frees the
#: registers of the next item's descriptor in every branch, about 17 in the 8B's quantized GEMV
#: loops compiled for sm_90: docs/PERF.md, "Thirty-seventh session"; timed on an H200 alone it
#: is no faster: the 8B's Q4_K step 2.453 against 2.447 ms, the 1B's 0.850 against 0.803,
#: SmolLM2's Q4_1 0.550 against 0.493, "Thirty-ninth session")
DEFAULT_AHEAD = "held"
#: ``PTO_MK_CALLS=auto``: the branches inlined, and where that kernel compiled for the GPU spills,
#: the kernel rebuilt with none inlined, kept where it spills less. Timed on an H200 (2026-12-05,
#: docs/PERF.md "Thirty-ninth session"): ``noinline`` alone took the 8B's Q4_K step from 2.447 to
#: 2.319 ms and the 1B's from 0.803 to 0.749 (their inlined kernels spill 14 and 28 registers),
#: and SmolLM2's Q4_1 step, whose kernel does not spill, from 0.493 to 0.511: a call an item
#: costs where nothing spills
AUTO_CALLS = "auto"
#: the settings' branch calls: the renderer's (:data:`pto.codegen.triton.megakernel.CALLS`) and
#: :data:`AUTO_CALLS`
CALLS_SETTINGS = (*CALLS, AUTO_CALLS)
#: the branch calls where the settings and environment do not say: ``inline`` (``auto`` is built
#: and its rule timed by its parts; the default until ``auto`` itself is timed and smoke-checked)
DEFAULT_CALLS = "inline"
#: the settings of ``PTO_MK_INLINE`` (:attr:`MegakernelSettings.inline`, :mod:`pto.exec.inline`)
INLINE = ("off", "on")
#: inline items where the settings and environment do not say: off (measured slower on an H200,
#: SmolLM2 0.454 -> 0.536 ms, the 8B 4.19 -> 4.30: docs/PERF.md, "Twenty-fourth session")
DEFAULT_INLINE = "off"
#: the settings of ``PTO_MK_PREFETCH`` (:attr:`MegakernelSettings.prefetch`)
PREFETCH_CHOICES = ("0", "1", "2", "light")
#: the KiB an item prefetches into L2 at most where the settings and environment do not say
DEFAULT_PREFETCH_KB = RenderOptions.prefetch_bytes // 1024


def env_choice(choice: str | None, env: str, default: str, allowed: tuple[str, ...], what: str) -> str:
    """``choice``, else the environment variable ``env``, else ``default``; UsageError naming an
    unknown one."""
    d = choice or os.environ.get(env) or default
    if d not in allowed:
        src = env if not choice else what
        raise UsageError(f"{src}={d!r}: the megakernel's {what} is {' or '.join(allowed)}")
    return d


def resolve_prefetch(choice: int | str | None) -> str:
    """``choice``, else ``PTO_MK_PREFETCH``, else :data:`DEFAULT_PREFETCH`, as text: ``0``, ``1``,
    ``2`` or ``light`` (level 1 in the tasks :func:`pto.exec.plan.after_gemvs` leaves: the plan's
    ``prefetch`` rule); UsageError naming anything else."""
    return env_choice(None if choice is None else str(choice), "PTO_MK_PREFETCH", str(DEFAULT_PREFETCH),
                      PREFETCH_CHOICES, "prefetch")


def resolve_prefetch_kb(choice: int | str | None) -> int:
    """``choice``, else ``PTO_MK_PREFETCH_KB``, else :data:`DEFAULT_PREFETCH_KB`: the KiB an item
    prefetches into L2 at most; UsageError naming anything that is not a positive whole number."""
    src, text = ("prefetch_kb", choice) if choice is not None else ("PTO_MK_PREFETCH_KB",
                                                                      os.environ.get("PTO_MK_PREFETCH_KB", "").strip())
    if text in (None, ""):
        return DEFAULT_PREFETCH_KB
    try:
        kb = int(str(text))
    except ValueError:
        kb = 0
    if kb < 1:
        raise UsageError(f"{src}={text!r}: the megakernel's L2 prefetch budget is a positive number of KiB")
    return kb


def resolve_dispatch(choice: str | None) -> str:
    """``choice``, else ``PTO_DISPATCH``, else :data:`DEFAULT_DISPATCH`."""
    return env_choice(choice, "PTO_DISPATCH", DEFAULT_DISPATCH, DISPATCH, "dispatch")


def resolve_poll(choice: str | None) -> str:
    """``choice``, else ``PTO_MK_POLL``, else :data:`DEFAULT_POLL`."""
    return env_choice(choice, "PTO_MK_POLL", DEFAULT_POLL, POLL, "poll")


def resolve_ahead(choice: str | None) -> str:
    """``choice``, else ``PTO_MK_AHEAD``, else :data:`DEFAULT_AHEAD`."""
    return env_choice(choice, "PTO_MK_AHEAD", DEFAULT_AHEAD, AHEAD, "look-ahead")


def resolve_calls(choice: str | None) -> str:
    """``choice``, else ``PTO_MK_CALLS``, else :data:`DEFAULT_CALLS`: one of
    :data:`CALLS_SETTINGS`."""
    return env_choice(choice, "PTO_MK_CALLS", DEFAULT_CALLS, CALLS_SETTINGS, "branch calls")


def resolve_inline(choice: str | None) -> str:
    """``choice``, else ``PTO_MK_INLINE``, else :data:`DEFAULT_INLINE`."""
    return env_choice(choice, "PTO_MK_INLINE", DEFAULT_INLINE, INLINE, "inline")


#: ``PTO_PER_SM=auto`` (the default): as many programs as the compiled kernel allows, and where
#: that is one and the kernel runs at most :data:`ROOM_WARPS` warps a program, room for a second
#: (its pipelines lowered to half the shared memory, its registers capped to half the file), kept
#: when that kernel compiles without spills. Two programs of the decode steps' GEMVs a
#: multiprocessor hide one's waits behind the other's loads: on an H200 the Llama-3-8B step 4.70
#: against 5.50 ms, Llama-3.2-1B 1.09 against 1.24 (docs/PERF.md, "Two programs a multiprocessor
#: by default"); wider programs (the prefill GEMMs' 8 warps) keep their pipelines
AUTO = "auto"
ROOM_WARPS = 4
#: ``PTO_PER_SM=more``: as many programs as the compiled kernel allows, then room for one more a
#: multiprocessor (registers capped to that share, pipelines lowered to fit), again while the
#: kernel so built compiles without spills: the kernel of the register-saving forms
#: (``PTO_MK_AHEAD=after``, ``PTO_MK_CALLS=noinline``, ``PTO_MK_STRIDES=constant``) of the 8B's
#: and the 1B's Q4_K steps at 3 programs where uncapped it allows 2 (docs/PERF.md, "Thirty-eighth
#: session"); timed on an H200 with those forms no faster (the 8B's Q4_K step 2.351 against
#: 2.335 ms, the 1B's 0.714 against 0.717) and slower on the 8B's bf16 step (4.755 against
#: 4.184: 4 programs of its layers' kernel, "Thirty-ninth session"), so not the default
MORE = "more"


def per_sm_of(asked: int | str | tuple | None, segment: int) -> int | str | None:
    """The programs a multiprocessor that ``asked`` (the settings', else ``PTO_PER_SM``: ``auto``,
    ``more``, ``2``, or one per segment, ``2,0``) makes room for in segment ``segment`` (the last
    entry repeats): a count, None (0) for as many as the compiled kernel allows, :data:`AUTO`
    (unset) or :data:`MORE`; UsageError naming a bad ``PTO_PER_SM``."""
    entries = _per_sm_entries(asked)
    return entries[min(segment, len(entries) - 1)] or None


def _per_sm_entries(asked: int | str | tuple | None) -> tuple:
    """``asked`` (else ``PTO_PER_SM``) as its entries, a segment each (the last repeats)."""
    if asked is None:
        text = os.environ.get("PTO_PER_SM", "").strip() or AUTO
        parts = [p.strip() for p in text.split(",")]
        if not all(p.isdigit() or p in (AUTO, MORE) for p in parts):
            raise UsageError(f"PTO_PER_SM={text!r}: programs per multiprocessor, one number or one per segment of a "
                             "split plan (e.g. 2 or 2,0; 0: as many as fit; auto: room for a second where one fits; "
                             "more: room for more while the kernel does not spill)")
        return tuple(p if p in (AUTO, MORE) else int(p) for p in parts)
    return asked if isinstance(asked, tuple) else (asked,)


def runs_share(asked: int | str | tuple | None) -> int:
    """The programs a multiprocessor a plan's runs are cut for (``PTO_MK_RUNS=auto``:
    :func:`pto.exec.plan.resolve_runs`) where ``asked`` (as :func:`per_sm_of` reads it): the most
    any segment asks a count of, at least two (what :data:`AUTO` makes room for; :data:`MORE`'s
    and "as many as fit" are known only compiled: :func:`programs_found`)."""
    return max([2] + [c for c in _per_sm_entries(asked) if isinstance(c, int)])


def programs_found(kernels: list, asked: int | str | tuple | None, share: int) -> tuple[int, tuple[int, ...]] | None:
    """Where :data:`MORE` (``asked``, as :func:`per_sm_of` reads it, for some segment) made room
    for more programs a multiprocessor than the plan's runs were cut for (``share``): the most
    any kernel holds and, per kernel, the count it made room for (0: as many as it allows), to
    build the plan again with runs for them and each kernel pinned to its count (no second
    search); None elsewhere (the defaults never build twice)."""
    if not kernels or MORE not in _per_sm_entries(asked):
        return None
    wide = max(k.compiled_info.get("programs_per_sm", 0) for k in kernels)
    return (wide, tuple(k.per_sm or 0 for k in kernels)) if wide > share else None


def _env_count(name: str) -> int | None:
    """A positive count from the environment variable ``name`` (None when unset); UsageError
    naming anything else."""
    text = os.environ.get(name)
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{name}={text!r}: a positive number of programs")
    return int(text)


def resolve_stages(asked: int | str | None) -> int | str | None:
    """``asked``, else ``PTO_MK_STAGES``, else None: the pipeline stages of the megakernel's
    loops, a whole number from 1 to :data:`MAX_STAGES` for every loading loop, ``schedule`` for
    each branch's schedule's alone, None for those with :data:`LONE_DOT_STAGES` in the lone dot
    projections (:func:`lone_dots`) or :data:`QUANT_GEMV_STAGES` everywhere in a step of quantized
    GEMVs (:func:`branch_stages`); UsageError naming anything else."""
    src, text = ("stages", asked) if asked is not None else \
        ("PTO_MK_STAGES", os.environ.get("PTO_MK_STAGES", "").strip())
    if text in (None, ""):
        return None
    if str(text) == "schedule":
        return "schedule"
    n = int(text) if re.fullmatch(r"[0-9]+", str(text)) else 0
    if not 1 <= n <= MAX_STAGES:
        raise UsageError(f"{src}={text!r}: the megakernel's pipeline stages are a whole number from 1 to {MAX_STAGES}, "
                         "or schedule")
    return n


#: the warps a program ``PTO_MK_WARPS`` may ask for
WARPS = (1, 2, 4, 8, 16)


def resolve_warps(asked: int | None) -> int | None:
    """``asked``, else ``PTO_MK_WARPS``, else None (the branches' most): the warps of a
    megakernel's program, one of :data:`WARPS`; UsageError naming anything else."""
    src, text = ("warps", asked) if asked is not None else \
        ("PTO_MK_WARPS", os.environ.get("PTO_MK_WARPS", "").strip())
    if text in (None, ""):
        return None
    if not re.fullmatch(r"[0-9]+", str(text)) or int(text) not in WARPS:
        raise UsageError(f"{src}={text!r}: the megakernel's warps a program are one of "
                         f"{', '.join(map(str, WARPS))}")
    return int(text)


#: the deepest pipeline ``PTO_MK_STAGES`` asks for
MAX_STAGES = 8
#: the pipeline stages of a lone dot projection's loop (:func:`lone_dots`), where its schedule
#: asks for fewer: such an item streams its weights as its multiprocessor's only program, and three
#: stages keep too few bytes in flight for the memory's latency. On an H200 Llama-3.2-1B's step at 8
#: sequences 1.386 against 1.539 ms with every loop at 5 stages (4: 1.409, 6: 1.406), its o and down
#: projections (64 items each) 5.6 and 17.4 against 7.4 and 26.5 us a layer and the others as they
#: were; the 8B's, whose projections put two items on a multiprocessor, gained nothing at any depth
#: (docs/PERF.md, "Twenty-ninth session")
LONE_DOT_STAGES = 5
#: the pipeline stages of every loop of a megakernel whose GEMVs of one sequence all take
#: quantized weights (:func:`all_gemvs_quantized`): the dequantizing loop is bound by issue, and a pipelined run stages
#: x and the norm's gain through shared memory again every block (Llama-3-8B's Q4_K GEMV items
#: issue 1.1-2.4x the wave kernels' instructions a block at 3 stages). On an H200 every loop at 1
#: stage took the 8B's Q4_K step 5.70 -> 3.62 ms, Q8_0 5.06 -> 3.81, fp8 4.56 -> 3.35, the 1B's
#: Q4_K 1.62 -> 1.01, SmolLM2's Q4_1 0.498 -> 0.489; the GEMVs alone at 1 stage (attention at its
#: 3) gave 3.67, 4.17, 3.62, 0.997 and 0.497 (docs/PERF.md, "Thirty-third session")
QUANT_GEMV_STAGES = 1
#: the rows of a product's left tile that :func:`lone_dots` takes for a few sequences' (padded to
#: a tensor-core dot's 16)
FEW_ROWS = 16


def lone_dots(plan, multiprocessors: int) -> set[str]:
    """The variants of ``plan``'s branches that are lone dot projections: a parallel axis, products
    that are all tensor-core dots of a few rows (left tiles of exactly :data:`FEW_ROWS`: a decode
    step's sequences padded, or a prefill of a few tokens in 16-row tiles; not a GEMV's
    multiply-sum, not a prefill GEMM's 128 rows) against tiles of memrefs the item loads before
    its wait (weights, not a predecessor's keys and values: attention is none), and every task of
    every branch of the variant at most one item a multiprocessor (``multiprocessors``), so that
    each item streams alone on its multiprocessor."""
    from pto.ir.facts import tile_shape
    from pto.ir.nodes import walk_instrs
    from pto.ir.ops import MATMUL, Op

    out, crowded = set(), set()
    for k, b in enumerate(plan.branches):
        fn = b.fn
        if b.runs or fn.parallel is None:
            continue
        tiles, dims = {t.name: t for t in fn.tiles}, dict(fn.variant)
        instrs = list(walk_instrs(fn.body))
        products = [i for i in instrs if i.op in MATMUL]
        # (each product's right operand a tile loaded from a memref the item loads before its wait:
        # weights, not a predecessor's keys and values)
        loaded = {i.dst: i.srcs[0] for i in instrs if i.op is Op.LOAD}
        try:
            few = bool(products) and all(tile_shape(tiles[i.srcs[0]], dims)[0] == FEW_ROWS
                                         and loaded.get(i.srcs[1]) in b.early for i in products)
        except BuildError:
            continue
        mine = (plan.task_branch == k) & plan.tasks
        if not (few and mine.any()):
            continue
        # (a variant is one compiled function: every branch of it must qualify)
        (out if int(plan.nitems[mine].max()) <= multiprocessors else crowded).add(fn.variant_name)
    return out - crowded


def quantized_gemvs(plan) -> set[str]:
    """The variants of ``plan``'s branches with a GEMV of one row of x that takes a quantized
    weight tile's blocks as stored (:func:`pto.ir.analysis.gemv_quantized_loads`: a decode step's
    quantized projections at one sequence, the integer or half dots by groups)."""
    return {v for v, quantized in _one_row_gemvs(plan).items() if quantized}


def _one_row_gemvs(plan) -> dict[str, bool]:
    """The variants of ``plan``'s branches with a multiply-sum of one row of x (a GEMV of one
    sequence), each with whether its weights are quantized tiles it takes as stored."""
    from pto.ir.analysis import gemv_quantized_loads
    from pto.ir.facts import tile_shape
    from pto.ir.nodes import walk_instrs
    from pto.ir.ops import Op

    out: dict[str, bool] = {}
    for b in plan.branches:
        fn = b.fn
        tiles, dims = {t.name: t for t in fn.tiles}, dict(fn.variant)

        def one_row(t, tiles=tiles, dims=dims) -> bool:
            return tile_shape(tiles[t], dims)[0] == 1

        try:
            if any(i.op is Op.MATMUL_ACC and i.attr("tb") and one_row(i.srcs[0]) for i in walk_instrs(fn.body)):
                out[fn.variant_name] = out.get(fn.variant_name, False) or bool(gemv_quantized_loads(fn, one_row))
        except BuildError:
            continue
    return out


def all_gemvs_quantized(plan) -> bool:
    """Whether ``plan`` has GEMVs of one sequence and every one takes quantized weight tiles as
    stored (:func:`quantized_gemvs`): the steps :data:`QUANT_GEMV_STAGES` was measured on (a
    step with dense layers and only a quantized head keeps its pipelines)."""
    gemvs = _one_row_gemvs(plan)
    return bool(gemvs) and all(gemvs.values())


#: the most bits a weight of the quantized GEMVs of a kernel whose runs "auto" renders as loops over
#: blocks with their K loops' next steps loaded ahead ("steps"; blocks alone at this many or more):
#: a step's weights ahead in registers cost registers by their bits. On an H200 steps took the 8B's
#: Q4_K step (Q6_K head) of one sequence 2.71 -> 2.45 ms and the 1B's 0.813 -> 0.787, but Q8_0's
#: 3.08 -> 3.37 and fp8's 2.69-2.72 -> 2.78 (docs/PERF.md, "Thirty-fourth session")
STEPS_MAX_BITS = 8


def gemv_weight_bits(plan) -> float:
    """The most bits a weight of the quantized weights the GEMVs of one sequence of ``plan`` take
    as stored (:func:`quantized_gemvs`; 0 where none)."""
    gemvs = quantized_gemvs(plan)
    return max((p.dtype.quant.bits_per_weight for b in plan.branches if b.fn.variant_name in gemvs
                for p in b.fn.memrefs if p.dtype.is_quantized), default=0)


def run_loop_of(plan, asked: str) -> str:
    """How ``plan``'s megakernel renders its items' runs (``RenderOptions.run_loop``): as
    ``asked`` ("flat", "blocks", "steps": :func:`~pto.backends.triton.modes.run_loop_mode`) or,
    for "auto" (or nothing), in a kernel whose GEMVs of one sequence all take quantized weights
    (:func:`all_gemvs_quantized`, the kernels measured faster so) "steps" where those weights have
    fewer than :data:`STEPS_MAX_BITS` bits (:func:`gemv_weight_bits`) and "blocks" where they have
    more, and "flat" in any other."""
    if asked in ("flat", "blocks", "steps"):
        return asked
    if not all_gemvs_quantized(plan):
        return "flat"
    return "steps" if gemv_weight_bits(plan) < STEPS_MAX_BITS else "blocks"


def branch_stages(plan, configs: list[LaunchConfig], multiprocessors: int, asked: int | str | None = None,
                  ) -> dict[str, int]:
    """The pipeline stages each variant of ``plan``'s branches asks for (``configs``: each
    branch's, :func:`branch_configs`) as ``asked`` (:func:`resolve_stages`) says: every loop's,
    the schedules' alone, or the schedules' with :data:`LONE_DOT_STAGES` in the lone dot
    projections on ``multiprocessors`` (:func:`lone_dots`), or, in a kernel whose GEMVs of one
    sequence all take quantized weights (:func:`all_gemvs_quantized`), :data:`QUANT_GEMV_STAGES`
    in every loop; the kernel lowers them where shared memory runs out
    (:func:`~pto.codegen.triton.megakernel.fit_megakernel`)."""
    forced = resolve_stages(asked)
    if forced is None and all_gemvs_quantized(plan):
        forced = QUANT_GEMV_STAGES
    lone = lone_dots(plan, multiprocessors) if forced is None else set()
    want: dict[str, int] = {}
    for b, c in zip(plan.branches, configs):
        v = b.fn.variant_name
        want[v] = forced if isinstance(forced, int) else \
            max(want.get(v, 1), c.num_stages, LONE_DOT_STAGES if v in lone else 1)
    return want


def multiprocessors_of(device: torch.device, plan) -> int:
    """``device``'s multiprocessors; off a GPU (the interpreter) the programs ``plan`` was made for."""
    if device.type != "cuda":
        return plan.programs
    from pto.machine.target import detect

    return detect("cuda", device.index or 0).sm_count or plan.programs


def branch_configs(backend, plan) -> list[LaunchConfig]:
    """Each branch's launch configuration: its schedule for the number of tasks it runs."""
    tasks = np.bincount(plan.task_branch, minlength=len(plan.branches))
    return [backend.launch_config(b.fn, int(n)) for b, n in zip(plan.branches, tasks)]


#: the GPU whose multiprocessor the interpreter's resource estimate assumes (no GPU to ask)
ESTIMATE_TARGET = "cuda_h100"


def sram_per_sm(device: torch.device) -> int:
    """Shared memory a multiprocessor of ``device`` holds (the interpreter's: an H100's)."""
    from pto.machine.target import detect, get

    return (detect("cuda", device.index or 0) if device.type == "cuda" else get(ESTIMATE_TARGET)).sram_bytes


def occupancy(backend, plan, asked: int | str | None = None) -> tuple[tuple[str, ...], np.ndarray]:
    """Per branch of ``plan``, the programs a multiprocessor its launch configuration allows
    alone, by threads (its warps) and by shared memory (:func:`~pto.codegen.triton.megakernel.shared_estimate`
    at the pipelining depth the kernel asks for: :func:`branch_stages`, ``asked`` the settings'
    stages), before compiling: registers are known only after (the compiled kernel's,
    :attr:`Megakernel.compiled_info`)."""
    configs = branch_configs(backend, plan)
    stages = branch_stages(plan, configs, multiprocessors_of(backend.device, plan), asked)
    sram = sram_per_sm(backend.device)
    threads = [min(32, 2048 // (32 * c.num_warps)) for c in configs]
    # (at least one: the fit lowers the pipelines of a branch that asks for more than there is)
    shared = [max(1, min(32, (sram + 1024) // (shared_estimate(b.fn, stages[b.fn.variant_name], b.runs) + 1024)))
              for b in plan.branches]
    return ("threads", "shared memory"), np.array([threads, shared], np.int64).T.reshape(len(configs), 2)


def item_descriptors(plan, order: np.ndarray | None = None, counters=None) -> np.ndarray:
    """The kernel's ``items``: per work item, in queue order (or the queue indices ``order``:
    the programs' streams), (task, parallel index, the task's branch, its row's offset in the
    table, 1 if it waits for anything, the parallel indices it runs: a run's, else 1, the counter
    it waits on, its release row: ``counters``', a :class:`pto.exec.item_deps.Counters`, by default
    :meth:`pto.exec.plan.Plan.counters`), int64
    ``[n_items, ITEM_COLS]`` (at least one row)."""
    out = np.zeros((max(plan.n_items, 1), ITEM_COLS), np.int64)
    out[:, 5] = 1
    if plan.n_items:
        c = plan.counters() if counters is None else counters
        pick = np.arange(plan.n_items) if order is None else order
        items = plan.items[pick]
        task = items[:, 0].astype(np.int64)
        out[:, 0] = task
        out[:, 2], out[:, 3] = plan.task_branch[task], plan.task_row[task]
        out[:, 4] = c.waits[pick]
        out[:, 1], out[:, 5] = plan.item_indices(items)  # (an item of a run: its first index, how many)
        out[:, 6], out[:, 7] = c.counter[pick], c.row[pick]
    return out


def _check_constant_strides(plan, strides: np.ndarray) -> None:
    """A branch whose row strides are constants of the kernel (``PTO_MK_STRIDES=constant``) runs
    only on tensors of those strides (``strides``: per tensor of ``plan``): BuildError naming the
    first that differs (a plan built for other tensors), not wrong addresses. A segment's tasks
    alone (those of other segments are its branch 0's in its table, and run in other kernels)."""
    for k, b in enumerate(plan.branches):
        if not b.strides:
            continue
        rows = plan.task_tensor[(plan.task_branch == k) & plan.tasks, :len(b.strides)].astype(np.int64)
        bad = np.argwhere(strides[rows] != np.array(b.strides, np.int64)[None, :])
        if len(bad):
            task, j = (int(v) for v in bad[0])
            name = plan.tensor_names[int(rows[task, j])]
            raise BuildError(f"megakernel: tensor {name!r} has row stride {int(strides[rows[task, j]])} where the "
                             f"kernel's branch of {b.fn.variant_name} takes {b.strides[j]} as a constant "
                             "(PTO_MK_STRIDES=constant: build the plan for these tensors)")


class Megakernel:
    """``plan`` (a :class:`pto.exec.plan.Plan`) as one compiled persistent kernel over
    ``tensors``, ready to launch."""

    def __init__(self, backend, plan, tensors: dict[str, torch.Tensor], settings: MegakernelSettings,
                 after: Megakernel | None = None):
        self.backend, self.plan, self.tensors, self.settings = backend, plan, tensors, settings
        self.max_polls = settings.max_polls  # tests lower it to provoke a give-up
        self.dispatch = resolve_dispatch(settings.dispatch)
        self.poll = resolve_poll(settings.poll)
        self.ahead = resolve_ahead(settings.ahead)
        calls = resolve_calls(settings.calls)
        #: how the rendered kernel calls its branches (``auto`` starts inlined: :meth:`_calls_for_spills`)
        self.calls = "inline" if calls == AUTO_CALLS else calls
        #: inline items (:mod:`pto.exec.inline`): asked, and not in the sentinel's kernel (whose
        #: releases count tasks); with ranged dispatch only
        self.inline = resolve_inline(settings.inline) == "on" and not settings.sentinel
        if self.inline and self.dispatch == "queue":
            raise UsageError("the megakernel's inline items (PTO_MK_INLINE=on) need ranged dispatch "
                             "(PTO_DISPATCH=static or stream), not the queue")
        asked = per_sm_of(settings.per_sm, settings.segment)
        #: the programs a multiprocessor this kernel made room for (None: as many as it allows)
        self.per_sm: int | None = None if asked in (AUTO, MORE) else asked
        #: the kernel launched before this one (a split plan's previous segment): its logical
        #: clock is this one's, so the interpreter's trace ticks order the segments' items
        self.after = after
        prefetch = resolve_prefetch(settings.prefetch)
        #: the kernel's ``PREFETCH`` level (``light``: 1, in the branches the plan lets prefetch)
        self.prefetch = 1 if prefetch == "light" else int(prefetch)
        #: the render's options: the backend's, with the L2 prefetch's budget and the runs' form
        #: (:func:`run_loop_of`)
        self.options = replace(backend.options, prefetch_bytes=resolve_prefetch_kb(settings.prefetch_kb) * 1024,
                               run_loop=run_loop_of(plan, backend.options.run_loop))
        #: the uploaded item table's order: queue indices grouped by program (ranged dispatch),
        #: or the queue (None)
        self.order: np.ndarray | None = None
        self.device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
        self.compiled_info: dict = {}
        self.tracing = 0
        configs = branch_configs(backend, plan)  # each branch's schedule, looked up once
        #: one configuration for the whole kernel (:func:`merged`); pipelining is per loop, in the
        #: source (``self.stages``)
        self.config = merged(configs)
        warps = resolve_warps(settings.warps)
        if warps is not None:
            self.config = replace(self.config, num_warps=warps)
        try:
            self._rebuild(configs)
            if calls == AUTO_CALLS:
                self._calls_for_spills(configs)
            if asked == AUTO:
                self._room_for_two(configs)
            elif asked == MORE:
                self._room_for_more(configs)
            self._upload_streams()
        except Exception as e:
            one_line = self._translated(e)
            if one_line is e:
                raise
            raise one_line from e

    # -- building ---------------------------------------------------------------------------------
    def _build(self, configs: list[LaunchConfig]) -> None:
        s = self.settings
        want = branch_stages(self.plan, configs, multiprocessors_of(self.device, self.plan), s.stages)

        def render(stages: dict[str, int]) -> MegaKernel:
            return render_megakernel(self.plan.branches, self.options, sentinel=s.sentinel,
                                     ignore=s.ignore, stages=stages, dispatch=self.dispatch, poll=self.poll,
                                     inline=self.inline, ahead=self.ahead, calls=self.calls)

        self.stages = want
        self.rendered = render(want)
        self._upload()
        if not self.compiles:
            return
        limit = s.shared_limit or self.backend.shared_limit()
        if self.per_sm:  # room for that many programs on a multiprocessor
            limit = min(limit, self._sram() // self.per_sm - 1024)

        def shared(kernel: MegaKernel) -> int:
            self.rendered = kernel
            return int(load_kernel(kernel).warmup(*self.args(), grid=(1,), **self.consts()).metadata.shared)

        self.rendered, self.stages, _ = fit_megakernel(self.plan.branches, want, shared, limit, render)

    def _calls_for_spills(self, configs: list[LaunchConfig]) -> None:
        """:data:`AUTO_CALLS`: where the kernel compiled for the GPU with its branches inlined
        spills, rebuild it with none inlined; keep that where it spills less (else the kernel as it
        was)."""
        spills = self.compiled_info.get("spills", 0)
        if not (self.compiles and spills):
            return
        kept = self._state()
        self.calls = "noinline"
        self._rebuild(configs)
        if self.compiled_info["spills"] >= spills:
            self._restore(kept)

    def _state(self) -> tuple:
        """What a rebuild replaces (:meth:`_restore` puts it back)."""
        return (self.per_sm, self.calls, self.rendered, self.stages, self.jit, self.programs, self.compiled_info,
                self.buf)

    def _restore(self, kept: tuple) -> None:
        (self.per_sm, self.calls, self.rendered, self.stages, self.jit, self.programs, self.compiled_info,
         self.buf) = kept

    def _rebuild(self, configs: list[LaunchConfig]) -> None:
        """Render, fit, upload and compile the kernel (again: its form as the attributes now say)."""
        self._build(configs)
        self.jit = load_kernel(self.rendered)
        self.programs = self._resident_programs()

    def _room_for_two(self, configs: list[LaunchConfig]) -> None:
        """:data:`AUTO`: where the GPU holds one program of this kernel a multiprocessor and it
        runs at most :data:`ROOM_WARPS` warps, rebuild it with room for two; keep that unless it
        spills, cannot fit or holds fewer (then the kernel as it was)."""
        if not (self.compiles and self.compiled_info.get("programs_per_sm") == 1
                and self.config.num_warps <= ROOM_WARPS and self._count_free()):
            return
        self._try_room(configs, 2)

    def _room_for_more(self, configs: list[LaunchConfig]) -> None:
        """:data:`MORE`: rebuild the kernel with room for one more program a multiprocessor than
        it holds, while that kernel compiles without spills and holds them (each step kept only
        so; the threads of a multiprocessor bound the count)."""
        if not (self.compiles and self._count_free()):
            return
        while True:
            more = self.compiled_info["programs_per_sm"] + 1
            if more * self.config.num_warps > 64 or more > 32 or not self._try_room(configs, more):
                return

    def _count_free(self) -> bool:
        """No count of programs is asked for (the settings' ``programs``, ``PTO_PROGRAMS``)."""
        return not self.settings.programs and not _env_count("PTO_PROGRAMS")

    def _try_room(self, configs: list[LaunchConfig], per_sm: int) -> bool:
        """Rebuild the kernel with room for ``per_sm`` programs a multiprocessor; keep it (True)
        unless it spills, cannot fit or holds fewer (then the kernel as it was, False)."""
        kept = self._state()
        self.per_sm = per_sm
        try:
            self._rebuild(configs)
            if self.compiled_info["spills"] == 0 and self.compiled_info["programs_per_sm"] >= per_sm:
                return True
        except Exception as e:  # one stage everywhere is still more than that share of the shared
            # memory, or Triton found no way to compile it in that share of the registers
            if not isinstance(e, ResourceError) and self._translated(e) is e:
                raise
        self._restore(kept)
        return False

    @property
    def compiles(self) -> bool:
        """The kernel is compiled for the GPU (not run by the Triton interpreter)."""
        return self.device.type == "cuda" and self.backend.compiles

    def _upload(self) -> None:
        p, dev = self.plan, self.device
        # a task's memref columns, as wide as this kernel's widest branch (a segment of a split
        # plan may dispatch narrower ones than the graph's widest; the columns past a task's
        # memrefs are never read)
        task_tensor = np.ascontiguousarray(p.task_tensor[:, :self.rendered.max_memrefs])
        # what each item waits on and releases: the successors' counts are their predecessor tasks
        # with the sentinel (a task's last item releases), else their predecessors' items (each
        # item releases), with data dependencies those items that write what it reads
        self.counters = c = p.counters(self.settings.sentinel)
        #: per counter, the queue index of the item run where its count ends, or -1
        self.inline_items = p.inline_items(c) if self.inline else np.full(len(c.init), -1, np.int64)
        t = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in (
            ("task_branch", p.task_branch), ("task_row", p.task_row), ("tab", p.tab),
            ("task_tensor", task_tensor), ("pending0", c.init if len(c.init) else np.zeros(1, np.int32)),
            ("nitems", p.nitems), ("succ_ptr", c.rel_ptr), ("succ", c.rel if len(c.rel) else np.zeros(1, np.int32)))}
        tensors = [self.tensors[name] for name in p.tensor_names]
        strides = np.array([x.stride(0) for x in tensors], np.int64)
        _check_constant_strides(p, strides)
        t["ptrs"] = torch.tensor([x.data_ptr() for x in tensors], dtype=torch.int64, device=dev)
        t["strides"] = torch.from_numpy(strides).to(dev)
        t["items"] = torch.from_numpy(item_descriptors(p, counters=c)).to(dev)
        t["stream"] = torch.zeros(2, dtype=torch.int64, device=dev)  # (ranged dispatch: _upload_streams)
        rows = max(len(c.rel_ptr) - 1, 1)  # (and these: per release row, its inline counter and item)
        t["inl_cnt"] = torch.full((rows,), -1, dtype=torch.int64, device=dev)
        t["inl_item"] = torch.full((rows,), -1, dtype=torch.int64, device=dev)
        # each task's memrefs resolved to their tensors' base and row stride (one load, not two);
        # the columns past a task's memrefs hold tensor 0's and are never read
        idx = t["task_tensor"].long()
        t["task_ptr"] = t["ptrs"][idx].contiguous() if tensors else torch.zeros_like(idx)
        t["task_stride"] = t["strides"][idx].contiguous() if tensors else torch.zeros_like(idx)
        t["pending"] = t["pending0"].clone()
        t["done"] = torch.zeros(p.n_tasks, dtype=torch.int32, device=dev)
        t["nxt"] = torch.zeros(1, dtype=torch.int32, device=dev)
        t["err"] = torch.zeros(2, dtype=torch.int32, device=dev)
        t["clock"] = self.after.buf["clock"] if self.after is not None else torch.zeros(1, dtype=torch.int32,
                                                                                            device=dev)
        t["trace"] = torch.zeros((max(p.n_items, 1), 3), dtype=torch.int64, device=dev)
        if self.settings.sentinel:
            t["spend"] = t["pending0"].clone()
            t["sread"] = torch.full((max(p.n_tasks, 1), 4), -1, dtype=torch.int64, device=dev)
            t["swrite"] = torch.full((max(p.n_tasks, 1), 4), -1, dtype=torch.int64, device=dev)
            t["stab"] = torch.tensor(scan_table([b.fn for b in p.branches], self.rendered.max_memrefs),
                                     dtype=torch.int32, device=dev)
        self.buf = t

    def _upload_streams(self) -> None:
        """With ranged dispatch, the item table as the programs' streams (each program's items
        in queue order, :meth:`pto.exec.plan.Plan.streams`) and each program's range of it."""
        if self.dispatch == "queue":
            return
        p, dev = self.plan, self.device
        if self.inline:  # the inline items after every program's stream
            self.order, start, counter, item = p.inline_streams(self.programs, self.dispatch, self.counters,
                                                                self.inline_items)
            if len(counter):
                self.buf["inl_cnt"] = torch.from_numpy(counter).to(dev)
                self.buf["inl_item"] = torch.from_numpy(item).to(dev)
        else:
            self.order, start = p.streams(self.programs, self.dispatch)
        self.buf["items"] = torch.from_numpy(item_descriptors(p, self.order, self.counters)).to(dev)
        self.buf["stream"] = torch.from_numpy(start).to(dev)

    def args(self) -> tuple:
        b = self.buf
        b["tracing"] = self.tracing
        return (b["items"], self.plan.n_items, b["nxt"], b["stream"], b["task_branch"], b["task_row"], b["tab"],
                b["task_tensor"], b["ptrs"], b["strides"], b["task_ptr"], b["task_stride"], b["pending"],
                b["done"], b["nitems"],
                b["succ_ptr"], b["succ"], b["err"], b["trace"], b["clock"], b["tracing"],
                *((b["spend"], b["sread"], b["swrite"], b["stab"]) if self.settings.sentinel else ()),
                *((b["inl_cnt"], b["inl_item"]) if self.inline else ()))

    def consts(self) -> dict:
        cfg = self.config
        out = {"MAXM": self.rendered.max_memrefs, "MAX_POLLS": self.max_polls,
               "SUCC_BLOCK": 32 * cfg.num_warps, "GPU_CLOCK": self.device.type == "cuda",
               "PREFETCH": self.prefetch,
               **cfg.kwargs()}
        if self.per_sm and self.compiles:  # the registers' share: 64K a multiprocessor, in steps of 8
            out["maxnreg"] = min(255, 65536 // (self.per_sm * 32 * cfg.num_warps) // 8 * 8)
        return out

    def _sram(self) -> int:
        """Shared memory per multiprocessor (the target's)."""
        return sram_per_sm(self.device)

    def _resident_programs(self) -> int:
        """As many programs as the GPU holds at once (registers, shared memory, threads); 2 under
        the interpreter (it runs programs one after another), 1 with ranged dispatch there (a
        program would wait for an item of one that has not started). A count the settings (or
        ``PTO_PROGRAMS``) ask for is taken as it is, but ranged dispatch refuses more than are
        resident at once."""
        asked = self.settings.programs or _env_count("PTO_PROGRAMS")
        if asked and self.dispatch == "queue":
            return asked
        if not self.compiles:
            if asked and asked > 1 and (self.plan.pending > 0).any():
                raise UsageError(f"{self.dispatch} dispatch of {asked} programs under the Triton interpreter: it runs "
                                 "them one after another, so a program would wait for an item of one not started (a "
                                 "graph with dependencies takes one program)")
            return asked or (2 if self.dispatch == "queue" else 1)
        fit = self._resident_on_gpu()
        if asked and asked > fit:
            raise UsageError(f"{self.dispatch} dispatch of {asked} programs: the GPU holds {fit} of this kernel at "
                             "once, and every program must be resident (use at most that many, or the queue)")
        return asked or fit

    def _resident_on_gpu(self) -> int:
        """The compiled kernel's programs the GPU holds at once (its compile info recorded)."""
        from pto.machine.target import detect

        tg = detect("cuda", self.device.index or 0)
        consts = self.consts()
        compiled = self.jit.warmup(*self.args(), grid=(1,), **consts)
        compiled._init_handles()  # loads the module: registers and spills are known from here
        warps = consts["num_warps"]
        by_regs = (tg.regs_per_block or 65536) // max(compiled.n_regs * 32 * warps, 1)
        smem = compiled.metadata.shared
        by_smem = (tg.sram_bytes + 1024) // (smem + 1024) if smem else 32
        by_threads = 2048 // (32 * warps)
        per_sm = max(1, min(by_regs, by_smem, by_threads, 32))
        self.compiled_info = {"regs": compiled.n_regs, "spills": compiled.n_spills, "shared": smem,
                              "programs_per_sm": per_sm, "warps": warps,
                              "stages": {v: n for v, n in self.stages.items() if n > 1}}
        return per_sm * (tg.sm_count or 1)

    def _translated(self, e: Exception) -> Exception:
        """An error Triton raised compiling or launching the kernel as one line naming it; any
        other error unchanged."""
        try:
            from triton.errors import TritonError
        except ImportError:  # pragma: no cover - the backend needs Triton
            return e
        if not isinstance(e, TritonError):
            return e
        cfg = self.config.kwargs()
        return triton_error(e, f"the persistent kernel over {len(self.plan.branches)} branches", cfg)

    # -- running ----------------------------------------------------------------------------------
    def launch(self, trace: bool = False) -> None:
        """Reset the counters and run every item (``trace``: record each item's span)."""
        b = self.buf
        b["nxt"].zero_()
        b["pending"].copy_(b["pending0"])
        if self.settings.sentinel:  # (only its kernel counts a task's finished items)
            b["done"].zero_()
            b["spend"].copy_(b["pending0"])
            b["sread"].fill_(-1)
            b["swrite"].fill_(-1)
        self.tracing = int(trace)
        try:
            self.jit[(max(1, min(self.programs, self.plan.n_items)),)](*self.args(), **self.consts())
        except Exception as e:
            one_line = self._translated(e)
            if one_line is e:
                raise
            raise one_line from e
        finally:
            self.tracing = 0

    def gave_up(self) -> int | None:
        """The task (index in the plan) a program gave up waiting for, if one did since the flag
        was last cleared (:meth:`clear_give_up`)."""
        flag, task = (int(v) for v in self.buf["err"].tolist())
        return task if flag else None

    def clear_give_up(self) -> None:
        """Clear the give-up flag once it is reported (on the host: a replay never resets it, so
        a give-up reported once would otherwise stop every later launch)."""
        self.buf["err"].zero_()

    def items_taken(self) -> int:
        return int(self.buf["nxt"].cpu()[0])

    def trace(self) -> np.ndarray:
        """``[n_items, 4]``: (start, end, program, multiprocessor: -1 where not known) of each item
        of the last traced launch, in queue order (the kernel stores the last two in one word,
        ``program | ((multiprocessor + 1) << 32)``)."""
        tr = self.buf["trace"].cpu().numpy()[: self.plan.n_items]
        if self.order is not None:
            out = np.empty_like(tr)
            out[self.order] = tr
            tr = out
        return np.concatenate([tr[:, :2], tr[:, 2:] & 0xFFFFFFFF, (tr[:, 2:] >> 32) - 1], axis=1)

    def sentinel_records(self) -> tuple[np.ndarray, np.ndarray]:
        """Per task, the first non-finite element each read and wrote (the sentinel's records)."""
        n = self.plan.n_tasks
        return self.buf["sread"].cpu().numpy()[:n], self.buf["swrite"].cpu().numpy()[:n]


__all__ = ["AUTO", "MORE", "ROOM_WARPS", "Megakernel", "MegakernelSettings", "env_choice", "MAX_POLLS",
           "DEFAULT_DISPATCH", "DEFAULT_INLINE", "INLINE", "resolve_inline", "DEFAULT_AHEAD", "resolve_ahead",
           "DEFAULT_CALLS", "resolve_calls", "AUTO_CALLS", "CALLS_SETTINGS", "DEFAULT_PREFETCH", "DEFAULT_PREFETCH_KB",
           "PREFETCH_CHOICES", "resolve_prefetch", "MAX_STAGES", "resolve_stages", "WARPS", "resolve_warps",
           "LONE_DOT_STAGES", "FEW_ROWS", "lone_dots", "QUANT_GEMV_STAGES", "quantized_gemvs", "all_gemvs_quantized",
           "STEPS_MAX_BITS",
           "gemv_weight_bits", "run_loop_of", "branch_stages",
           "multiprocessors_of", "resolve_prefetch_kb", "resolve_dispatch",
           "branch_configs", "item_descriptors", "occupancy", "per_sm_of", "sram_per_sm", "runs_share",
           "programs_found"]
