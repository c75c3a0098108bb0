"""The Triton backend's modes that the environment may set: how a batch splits into launches
(``PTO_SPLIT``), tensor-descriptor loads (``PTO_TMA``), programmatic dependent launch
(``PTO_PDL``), persistent tile loops (``PTO_PERSISTENT``, ``PTO_BLOCKS_FORMATS``,
``PTO_BLOCKS_FUNCTIONS``) and how the GEMVs read quantized
weights (``PTO_QGEMV``), each with its default for the GPU the kernels are compiled for."""

from __future__ import annotations

import os

from pto.codegen.triton.common import BLOCKS_AUTO_FORMATS, PDL_MODES, PERSISTENT_MODES, QGEMV_MODES
from pto.errors import UsageError
from pto.ir.dtypes import DType

#: the PDL policies a backend takes (``pdl=``, ``PTO_PDL``): the render modes, and "auto" (each
#: launch "late", but "chain" where the next launch loads memory before its wait; the executor
#: says where: ``TaskBatch.chain``)
PDL_POLICIES = PDL_MODES + ("auto",)

SPLIT_MODES = ("align", "masks", "none")


def split_mode(asked: str | None) -> str:
    """The backend's split mode: ``asked``, else ``PTO_SPLIT``, else "align"."""
    mode = asked if asked is not None else os.environ.get("PTO_SPLIT", "align")
    if mode not in SPLIT_MODES:
        src = "split" if asked is not None else "PTO_SPLIT"
        raise UsageError(f"{src}={mode!r}: one of {', '.join(SPLIT_MODES)}")
    return mode


def tma_mode(capability: tuple[int, int] | None, compiles: bool = True) -> bool:
    """Do the batched kernels load through tensor descriptors by default: ``PTO_TMA`` (on, off;
    default on) where they are compiled (``compiles``) for a GPU of ``capability`` 9.0 and later."""
    env = os.environ.get("PTO_TMA", "on")
    if env not in ("on", "off"):
        raise UsageError(f"PTO_TMA={env!r}: on or off")
    return env == "on" and compiles and capability is not None and tuple(capability) >= (9, 0)


def persistent_mode() -> str:
    """The persistent tile loop of the batched kernels whose loops multiply large tiles (the
    GEMMs' K loops, attention's key loop; :func:`pto.codegen.triton.tma.tma_memrefs`) where no
    schedule says: ``PTO_PERSISTENT`` (auto, loop, ws, flat, blocks, off or empty; default auto: "blocks"
    for the gate/up GEMVs of the formats measured faster so, ``RenderedKernel.blocks_auto``, no
    loop elsewhere; flat also the kernels with a parallel axis, blocks only those: each program
    loops over its task's parallel indices; :data:`~pto.codegen.triton.common.PERSISTENT_MODES`)."""
    mode = os.environ.get("PTO_PERSISTENT", "auto")
    if mode not in PERSISTENT_MODES + ("auto", "off", ""):
        raise UsageError(f"PTO_PERSISTENT={mode!r}: one of auto, {', '.join(PERSISTENT_MODES)} or off")
    return "" if mode in ("off", "") else mode


def blocks_formats() -> frozenset:
    """The weight formats whose gate/up GEMV the "auto" persistent policy runs in "blocks" form
    (``RenderedKernel.blocks_auto_in``): ``PTO_BLOCKS_FORMATS``, formats by their short names
    separated by commas (``q4_0,q4_1,q4_k``), or with a leading "+" added to the default (``+q5_k``:
    the measured set and Q5_K, for an A/B); by default
    :data:`~pto.codegen.triton.common.BLOCKS_AUTO_FORMATS` (measured faster so on an H200)."""
    text = os.environ.get("PTO_BLOCKS_FORMATS", "").strip()
    if not text:
        return BLOCKS_AUTO_FORMATS
    add = text.startswith("+")
    names = [t.strip() for t in text.lstrip("+").split(",") if t.strip()]
    known = [d.short for d in DType if d.is_quantized]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise UsageError(f"PTO_BLOCKS_FORMATS={text!r}: quantized formats separated by commas ({', '.join(known)}), "
                         "or a leading + to add them to the default")
    return frozenset(names) | (BLOCKS_AUTO_FORMATS if add else frozenset())


def blocks_functions() -> frozenset:
    """InCore functions (generic names, as ``--timeline`` shows a kernel without its ``__``
    suffix) that the "auto" persistent policy also runs in "blocks" form, whatever their weights:
    ``PTO_BLOCKS_FUNCTIONS``, names separated by commas (``gemv_residual_tile``: the decode step's
    down projection, and its o projection too where that shares the function; an o projection of
    other tiles or weights is ``gemv_residual_tile_o``); none by default. A switch for
    measuring one kernel's loop in the whole step, as ``PTO_PERSISTENT=blocks`` would loop them all
    (a kernel without a parallel axis, or with a collective, stays as it is; a schedule's own
    ``persistent`` still wins; a name no kernel has changes nothing)."""
    return _function_names("PTO_BLOCKS_FUNCTIONS", "gemv_residual_tile")


def pdl_late_functions() -> frozenset:
    """InCore functions (generic names, as :func:`blocks_functions`'s) whose launches load
    nothing before their PDL wait under the "auto" and "chain" policies, so that the launch
    before them does not signal early for them either: ``PTO_PDL_LATE``, names separated by
    commas; none by default. A switch for measuring what a launch's early loads cost the
    latency-bound launch they overlap (a quantized step's o projection, ``gemv_residual_tile_o``,
    during attention's combine; docs/PERF.md, "Thirty-first session")."""
    return _function_names("PTO_PDL_LATE", "gemv_residual_tile_o")


def _function_names(env: str, example: str) -> frozenset:
    """The InCore function names the environment variable ``env`` lists (commas between them);
    UsageError naming the text where one is not an identifier."""
    text = os.environ.get(env, "").strip()
    names = [t.strip() for t in text.split(",") if t.strip()]
    if any(not n.isidentifier() for n in names):
        raise UsageError(f"{env}={text!r}: InCore function names separated by commas (e.g. {example})")
    return frozenset(names)


def qgemv_mode(compiles: bool = True) -> str:
    """How the GEMVs' products read quantized weights (:data:`~pto.codegen.triton.common.QGEMV_MODES`):
    ``PTO_QGEMV`` (auto, units, groups, int8, int16; default auto: integer dots with 16-bit x for
    every integer format, Q4_0 to Q6_K and Q8_0, half dots for fp8), "auto"
    where kernels are ``compiles``'d for a GPU; the interpreter reads by units unless asked (its f32
    arithmetic is the CPU tests' reference; the other paths have tests of their own)."""
    mode = os.environ.get("PTO_QGEMV", "auto")
    if mode not in QGEMV_MODES:
        raise UsageError(f"PTO_QGEMV={mode!r}: one of {', '.join(QGEMV_MODES)}")
    return "units" if mode == "auto" and not compiles else mode


#: how the tensor-core paths' tile loads read a quantized format's scales (``PTO_QSCALES``,
#: :func:`qscales_mode`)
QSCALES_MODES = ("groups", "units")


def qscales_mode() -> str:
    """How a quantized tile load read by units (the dot path's tiles at a few sequences, the
    prefill's GEMMs, ``PTO_QGEMV=units``) takes a scale plane whose group spans four units or
    more (``RenderOptions.qscales``): ``PTO_QSCALES`` "groups" (the default: a value a group,
    broadcast to its units) or "units" (a value a unit, the group's units loading it again; the
    same values). On the H200 at 8 sequences, groups took the 8B's Q4_K step 13.9 -> 9.3 ms,
    Q8_0 12.6 -> 7.8, the 1B's Q4_K 3.26 -> 2.15, SmolLM2's Q4_1 1.39 -> 1.28; the one-sequence
    steps are level (docs/PERF.md, "Thirty-third session")."""
    mode = os.environ.get("PTO_QSCALES", "").strip() or QSCALES_MODES[0]
    if mode not in QSCALES_MODES:
        raise UsageError(f"PTO_QSCALES={mode!r}: one of {', '.join(QSCALES_MODES)}")
    return mode


#: how the megakernel renders a run of a GEMV's parallel indices (``PTO_MK_RUNLOOP``,
#: :func:`run_loop_mode`)
RUN_LOOP_MODES = ("auto", "flat", "blocks", "steps")


def run_loop_mode() -> str:
    """How a megakernel item's run of consecutive parallel indices is rendered
    (``RenderOptions.run_loop``): ``PTO_MK_RUNLOOP`` "flat" (the whole body each index,
    pipelined as one flattened loop), "blocks" (the wave kernels' loop over blocks: the
    statements of no index once after the wait, each index's weights loaded an index ahead in
    registers), "steps" (blocks, with each K loop of constant bounds that stores nothing loading
    its next step's read-only tiles, weights and x, ahead as well: in a quantized step the down
    projection's and the LM head's; only in functions at one pipeline stage, a pipelined loop
    keeping its pipeline) or "auto" (the default: in a kernel whose GEMVs of one sequence all
    take quantized weights, steps where those have under 8 bits a weight and blocks where not,
    flat otherwise; a kernel of a split plan by its own GEMVs:
    :func:`pto.backends.triton.megakernel.run_loop_of`). On an
    H200 blocks took the 8B's Q4_K step of one sequence 3.61 -> 2.71 ms and steps to 2.45,
    Q8_0's 3.79 -> 3.10 (steps 3.37), fp8's 3.35 -> 2.72 (steps 2.78), the 1B's Q4_K 1.05 ->
    0.82 (steps 0.79), SmolLM2's Q4_1 level; the bf16 8B's 4.19 -> 4.52 and the 1B's 0.94 ->
    1.05 with blocks (docs/PERF.md, "Thirty-fourth session")."""
    mode = os.environ.get("PTO_MK_RUNLOOP", "").strip() or RUN_LOOP_MODES[0]
    if mode not in RUN_LOOP_MODES:
        raise UsageError(f"PTO_MK_RUNLOOP={mode!r}: one of {', '.join(RUN_LOOP_MODES)}")
    return mode


#: whether the batched kernels' quantized GEMV K loops load their next step ahead (``PTO_K_AHEAD``,
#: :func:`k_ahead_mode`)
K_AHEAD_MODES = ("auto", "off", "on", "first")
#: the registers a thread a kernel whose K loop carries its next step takes (155-168 compiled for
#: sm_90 at 4 warps: three programs a multiprocessor); "auto" takes the form where a task's
#: programs fit one round at them (``TritonBackend.k_ahead_of``)
K_AHEAD_REGS = 168
#: the steps of a quantized GEMV's K loop from which "auto", where the step ahead does not fit,
#: peels its first step ("first"): the 8B's down projection (7 steps) measured faster so in every
#: format, the LM heads' loops of 2-4 steps mixed (``TritonBackend.k_ahead_of``)
K_FIRST_TRIPS = 7


def k_ahead_mode() -> str:
    """``RenderOptions.k_ahead``: ``PTO_K_AHEAD`` "on" (a wave kernel's K loops of a quantized
    GEMV, the down projection's and the LM head's at one sequence, load their next step's weights
    and x ahead in registers, the first step's weights before the PDL wait), "off" (each step's
    loads after the step before), "first" (only the first step peeled off the loop, its weights
    loaded before the PDL wait, no register carried) or "auto" (the default: on where a task's
    programs fit one round at the registers the form takes, else first for a loop of
    ``K_FIRST_TRIPS`` steps or more, ``TritonBackend.k_ahead_of``: on an H200 the 1B shape's Q4_K
    step 0.683 -> 0.650 ms, its Q8_0 step 0.710 -> 0.687; on, the 8B's down projection (a second
    round) and the LM heads slower; first, the 8B's down projection 1.5 us a layer faster:
    docs/PERF.md, "Thirty-fifth session")."""
    mode = os.environ.get("PTO_K_AHEAD", "").strip() or K_AHEAD_MODES[0]
    if mode not in K_AHEAD_MODES:
        raise UsageError(f"PTO_K_AHEAD={mode!r}: one of {', '.join(K_AHEAD_MODES)}")
    return mode


def _one_of(env: str, allowed: tuple[int, ...]) -> int:
    """The number the environment variable ``env`` names, one of ``allowed`` (the first where it
    names none); UsageError naming it otherwise."""
    text = os.environ.get(env, "").strip() or str(allowed[0])
    if not text.isdigit() or int(text) not in allowed:
        raise UsageError(f"{env}={text!r}: one of {', '.join(map(str, allowed))}")
    return int(text)


#: the settings of ``PTO_QGEMV_WARPS`` (:func:`qgemv_warps`)
QGEMV_WARPS = (1, 2, 4, 8)


def qgemv_warps() -> int:
    """The fewest warps a program of a GEMV that reads by groups takes
    (``RenderOptions.qgemv_warps``): ``PTO_QGEMV_WARPS`` (1, 2, 4 or 8; default 1: the rule's own
    count, a warp per 1,024 columns and per 8 rows past the first 8, four where a program streams
    its weights over two K steps or more or where the GEMV is plain (one row of x, no norm):
    :func:`pto.codegen.triton.kernel.grouped_warps`); its
    entries ``FUNCTION=N`` after it are :func:`qgemv_warps_by`'s."""
    return _qgemv_warps_setting()[0]


def qgemv_warps_by() -> tuple[tuple[str, int], ...]:
    """Per InCore function, the fewest warps of its GEMV read by groups, in place of
    :func:`qgemv_warps`'s (``RenderOptions.qgemv_warps_by``): ``PTO_QGEMV_WARPS``'s entries
    ``NAME=N`` (a function's generic name, as a trace or ``--timeline`` shows it without its
    ``__`` suffix), e.g. ``1,gemv_norm_swiglu_tile=2``: the gate/up projection at two or more,
    every other such GEMV by the rule (an entry is a floor: the rule's own four for the plain o
    and down projections stand above an entry of one). A name no kernel has changes nothing
    (the names are made as the program is built, so they are not checked here)."""
    return _qgemv_warps_setting()[1]


def _qgemv_warps_setting() -> tuple[int, tuple[tuple[str, int], ...]]:
    """``PTO_QGEMV_WARPS``: an optional count for every grouped GEMV, then ``NAME=N`` entries,
    separated by commas; UsageError naming it otherwise."""
    text = os.environ.get("PTO_QGEMV_WARPS", "").strip()
    allowed = ", ".join(map(str, QGEMV_WARPS))
    floor, by = QGEMV_WARPS[0], []
    for i, entry in enumerate(e.strip() for e in text.split(",") if e.strip()):
        name, eq, count = entry.rpartition("=")
        if (not eq and i) or (eq and not name.strip().isidentifier()) or not count.strip().isdecimal() \
                or int(count) not in QGEMV_WARPS:
            raise UsageError(f"PTO_QGEMV_WARPS={text!r}: one of {allowed} (every grouped GEMV's), then or instead "
                             "FUNCTION=N entries (one InCore function's), separated by commas, e.g. "
                             "1,gemv_norm_swiglu_tile=2")
        if eq:
            by.append((name.strip(), int(count)))
        else:
            floor = int(count)
    return floor, tuple(by)


#: the settings of ``PTO_QGEMV_COLS`` (:func:`qgemv_cols`)
QGEMV_COLS = (1024, 2048, 4096)


def qgemv_cols() -> int:
    """The columns of a K step each warp of a GEMV that reads by groups takes
    (``RenderOptions.qgemv_cols``): ``PTO_QGEMV_COLS`` (1024, 2048 or 4096; default 1024: a
    thread a group of each row, 32 4-bit values; 2048: two groups, so x's rounding, the scales'
    products and the reduction over the program's threads are shared by twice the weights, with
    half the warps a program)."""
    return _one_of("PTO_QGEMV_COLS", QGEMV_COLS)


def pdl_mode(capability: tuple[int, int] | None, compiles: bool = True) -> str:
    """The programmatic-dependent-launch policy of the batched kernels: ``PTO_PDL`` (auto, early,
    late, chain, off; default auto) where they are compiled (``compiles``) for a GPU of
    ``capability`` 9.0 and later (the first with PDL), else "" (off). On an H100 "auto" took a
    SmolLM2 step 0.447 ms against 0.553 with "late" (the 8B step 1.2% faster, the prefill layer
    unchanged; "chain" everywhere: SmolLM2 0.522, the 8B step 9% slower; docs/PERF.md, "Tenth
    session")."""
    mode = os.environ.get("PTO_PDL", "auto")
    if mode not in PDL_POLICIES + ("off", ""):
        raise UsageError(f"PTO_PDL={mode!r}: one of {', '.join(PDL_POLICIES)} or off")
    if mode in ("off", "") or not compiles or capability is None or tuple(capability) < (9, 0):
        return ""
    return mode


__all__ = ["K_AHEAD_MODES", "K_AHEAD_REGS", "K_FIRST_TRIPS", "PDL_POLICIES", "QGEMV_COLS", "QGEMV_WARPS",
           "QSCALES_MODES", "RUN_LOOP_MODES", "SPLIT_MODES", "blocks_formats", "blocks_functions", "k_ahead_mode",
           "pdl_late_functions", "pdl_mode", "persistent_mode", "qgemv_cols", "qgemv_mode", "qgemv_warps",
           "qgemv_warps_by", "qscales_mode", "run_loop_mode", "split_mode", "tma_mode"]
