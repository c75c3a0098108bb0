"""The tiles of a decode step (:class:`DecodeTiling`) and the structure they give it: the spans
of a long cache's two combine levels, the rows of the projections' tiles, the most partial
states a combine reads at once."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pto.codegen.triton.common import GROUPED_ROWS
from pto.machine.target import Target


@dataclass(frozen=True)
class DecodeTiling:
    """Block sizes of the step: ``chunk`` cache slots per attention task (``tk`` keys per
    tile), output columns ``bn`` and contraction ``bk`` of the projections, ``bv`` vocabulary
    columns and contraction ``lm_bk`` per LM-head block (the batch is the tiles' height,
    rounded up to a power of two by the backend)."""

    # 64 cache slots per attention task: one key tile each, and many tasks for one token
    # (1.22 against 1.39 ms a SmolLM2 step with 256 on an H100, docs/PERF.md "Decode")
    chunk: int = 64
    tk: int = 64
    # blocks of 4 outputs of output-major weights in K steps of 1024: the fastest of the GEMV
    # tilings measured on an H100 (SmolLM2 0.92 ms a step, against 1.21 with 16 columns of
    # [K, N] weights in steps of 192; docs/PERF.md "Decode"): every SM gets blocks, each reads
    # long contiguous rows
    bn: int = 4
    bk: int = 1024
    bv: int = 512
    lm_bk: int = 64
    #: the layers' weights stored output-major ([N, K], as nn.Linear keeps them): the
    #: projections are the GEMVs of :mod:`pto.incore.gemv`
    wt: bool = True
    #: the LM head output-major too (``[V, H]``: a tied model's embedding as it is), its GEMV
    #: in blocks of ``bv`` rows; off: measured slower on an H200 (the 8B step 5.61 against 5.04
    #: ms, SmolLM2 0.945 against 0.910; docs/PERF.md "Decode", the second session)
    lm_wt: bool = False
    #: the K step of the projections when their tiles are tensor-core dots (16 rows and more;
    #: None: ``bk``). 128: measured fastest on an H100 at batch 8 and 32 of both models (the 8B
    #: model at 32 sequences 10.4 ms a step against 17.2 with ``bk``'s 1024 and 15.3 with 64)
    dot_bk: int | None = 128
    #: the projections' output block on the dot path (None: ``bn``, at least 16; a block below 16
    #: is computed as a broadcast sum, not a tensor-core dot)
    dot_bn: int | None = None
    #: chunks one ``decode_attn_merge`` task merges when a cache holds more than that many (a
    #: multiple of it) and more than one combine reads at once (:func:`spans`); 0: the combine
    #: always reads every chunk itself
    span: int = 16
    #: the most chunks a sequence's cache is cut into: a longer cache takes wider chunks (``chunk``
    #: doubled while there are more than this many and the doubled chunk divides the cache, so a
    #: cache that is an odd number of chunks keeps ``chunk``; None: always ``chunk``). 128:
    #: a 32K cache of Llama-3.1-8B in chunks of 256 took 7.00 ms a step on an H100, 7.09 in 128,
    #: 7.51 in 64 (docs/PERF.md, "Long caches")
    long_chunks: int | None = 128
    #: the persistent executor: its programs, and the attention chunk widened (doubled while the
    #: doubled chunk divides the cache) until a layer's parts, sequences x key/value heads x
    #: chunks, make one round over them (None: ``chunk`` as it is). At batch 8 the 8B model's 1,024
    #: parts of 64 slots a layer took four rounds of 264 programs; in 256 chunks they make one:
    #: 6.406 against 6.743 ms a step on an H200, the 1B shape's 1.508 against 1.642 (the wave
    #: executor's 1.581 in the same call; docs/PERF.md, "Batch 8: one round of attention parts")
    round_programs: int | None = None
    #: from 2 sequences on (tensor-core dots of 16 rows and more), with ``round_programs``, where
    #: some projection's items in ``dot_bn`` take more than one round over the programs: each
    #: projection's output block the narrowest power of two from 16 to :data:`DOT_ROUND_MAX`
    #: whose items make one round (:func:`round_block`), its K step keeping the weight bytes of
    #: ``dot_bn`` x ``dot_bk`` a step; off, or every projection one round already: ``dot_bn``.
    #: The 8B model at batch 8 (gate/up 448 items in 32, two rounds of an H200's 264 programs; o
    #: and down 128): 5.979 against 6.440 ms a step on an H200 in one call; the 1B's gate/up make
    #: one round (256 items), where re-blocking took 1.540 against 1.522 (docs/PERF.md, "Batch 8:
    #: each projection one round"). The persistent tiles of hidden 2048 and more turn it on
    #: (:data:`~pto.orchestration.model.program.MEGAKERNEL_WIDE`)
    dot_round: bool = False
    #: the gate/up projection's output block and K step where they differ from ``bn`` and ``bk``
    #: (None: the same): an 8B model's gate/up took 79.9 us a layer in blocks of 8 and steps of
    #: 2048 against 84.7 in 4 and 1024 on an H100 (its other projections no faster)
    ffn_bn: int | None = None
    ffn_bk: int | None = None
    #: one sequence: the q, k, v projection's and the o projection's output block and K step where
    #: they differ from ``bn`` and ``bk`` (None: the same; the o projection then shares the down
    #: projection's function, otherwise it is a function of its own); from 2 sequences on the dot
    #: path's ``dot_bn`` and ``dot_bk`` apply instead
    qkv_bn: int | None = None
    qkv_bk: int | None = None
    o_bn: int | None = None
    o_bk: int | None = None
    #: rotation pairs a program of the fused q, k, v projection computes (one sequence, with
    #: ``rope_in_qkv``; None: half the projection's block, so that its rows are the plain GEMV's;
    #: taken down to the largest divisor of half the head)
    rope_bh: int | None = None
    #: one sequence (batch 1, output-major weights): RoPE and the cache append in the q, k, v
    #: projection's epilogue (``gemv_norm_rope_append_tile``: one task where there were two)
    rope_in_qkv: bool = True
    #: the combine task reads a head's partial states at once (``decode_attn_combine_parts``:
    #: strided loads, at most :data:`COMBINE_ROWS` of them) instead of a loop of dependent loads:
    #: 1.99 against 3.47 us a task, SmolLM2's step 0.573 against 0.671 ms on an H200
    #: (docs/PERF.md, "Ninth session")
    combine_parts: bool = True
    #: every GEMV against quantized weights takes its whole contraction in one step, at any batch
    #: (a CPU's: the C kernel never makes the weight tile, it reads each weight row once, in
    #: order, from memory, for all the batch's rows; a step's rows in pieces cost SmolLM2's Q4_1
    #: step 30 against 24 ms of CPU on one core of the development VM, docs/PERF.md "Native CPU
    #: execution", and at batch 2 its 2-row GEMVs in K steps of 192 and 64 took 56 against 21 ms
    #: a step with 2 cores, "A CPU batch's rows unpadded")
    quant_whole_k: bool = False
    #: fields that take other values where the weights are quantized (:func:`for_weights
    #: <pto.orchestration.model.quantized.for_weights>` applies them, then rounds the K steps to
    #: whole blocks): (name, value) pairs; a field set by :meth:`with_fields` is taken as set
    quant_tiles: tuple[tuple[str, int], ...] = ()
    #: on a GPU, a step of 2 to this many sequences (at most 8) with quantized weights keeps its
    #: rows unpadded and the one-sequence quantized tiles (:attr:`quant_tiles`): its GEMVs read
    #: the weights by groups, each thread's weights unpacked once for every row (an integer or
    #: half dot a row; ``PTO_QGEMV``'s modes but "units"), where padded to 16 rows they are
    #: dequantized into a tensor-core dot (the 8B step at 8 sequences in Q4_K: 15.8 ms, 2.6x its
    #: bf16 step; docs/PERF.md, "The grouped GEMVs' warps measured, batch 8 profiled"). 0: off
    #: (by rows that step took 188 ms on an H200: each program prepares x for all its rows)
    quant_rows: int = 0
    #: on a GPU, a step of 2 to this many sequences with dense weights keeps its rows unpadded:
    #: its GEMVs multiply-sum each weight tile against every row, where padded to 16 rows they
    #: are tensor-core dots (0: off, every step of 2 sequences or more padded)
    dense_rows: int = 0
    #: the FFN in one level (:func:`~pto.incore.gemv.gemv_norm_swiglu_down_tile`): each program
    #: computes this many of the intermediate's columns and adds its share of the down projection
    #: into the residual stream, which is then f32 (``store_add``: the programs' adds in any
    #: order); 0: two tasks, gate/up then the down projection with the residual. Where the
    #: projections are GEMVs of unpadded rows (output-major weights, fewer than 16 tile rows),
    #: the weights dense, one rank (:func:`folds_down`); elsewhere the two tasks. Slower than the
    #: two tasks on an H200 (SmolLM2's step 7-11% at one sequence: docs/PERF.md, "Twentieth session")
    fold_down: int = 0
    #: the folded FFN's down projection: outputs a step (None: the hidden size, at most 1024)
    fold_dn: int | None = None
    #: one sequence's attention combine folded into the o projection
    #: (:func:`~pto.incore.decode.decode_attn_combine_o`): each program of this many outputs
    #: combines every head's partial states itself (a level fewer a layer, the states read by
    #: every program); 0: the combine per head, then the projection. Where :func:`folds_combine`
    #: allows it; elsewhere the two tasks. Slower on an H200 (SmolLM2's step about 50%: each
    #: program combines the heads one after another; docs/PERF.md, "Twentieth session")
    fold_combine: int = 0
    #: the down projection's contraction split in parts of this many columns (rounded to whole K
    #: steps; the K step at most this), a program each part of each output block, adding its
    #: product into the residual stream, which is then f32 (:func:`~pto.incore.gemv.gemv_add_tile`:
    #: ``store_add``, the parts' sums in any order). A part of one K step has all its weights to
    #: load before the program's wait (a longer K loop loads nothing before it), and on the
    #: persistent executor the first parts' items wait only for the gate/up items of their
    #: columns. Where the projections are GEMVs of unpadded rows and one rank (:func:`splits_down`;
    #: quantized weights too); 0: off (the down projection with the residual, whole contractions).
    #: Slower on an H200 (the 8B's Q4_K step 1.930 against 1.907 ms, SmolLM2's 0.476 against 0.465
    #: persistent): the down kernel gains (13.3 against 15.7 us a layer) but every reader of the
    #: f32 stream loads twice the bytes of x (docs/PERF.md, "Twenty-first session")
    split_down: int = 0

    def with_fields(self, **fields) -> DecodeTiling:
        """This tiling with ``fields`` replaced, each also where the weights are quantized (its
        entry of :attr:`quant_tiles` dropped)."""
        keep = tuple((k, v) for k, v in self.quant_tiles if k not in fields)
        return replace(self, **fields, quant_tiles=keep)

    def for_cache(self, cache: int | None) -> DecodeTiling:
        """This tiling for a cache of ``cache`` slots (:attr:`long_chunks`)."""
        c = self.chunk
        while self.long_chunks and cache and cache // c > self.long_chunks and cache % (2 * c) == 0:
            c *= 2
        return self if c == self.chunk else replace(self, chunk=c)

    def for_round(self, cache: int | None, heads: int) -> DecodeTiling:
        """This tiling for a cache of ``cache`` slots whose layer runs ``heads`` attention heads'
        parts per chunk (sequences x key/value heads; :attr:`round_programs`)."""
        c = self.chunk
        while self.round_programs and cache and heads * (cache // c) > self.round_programs and cache % (2 * c) == 0:
            c *= 2
        return self if c == self.chunk else replace(self, chunk=c)

    def __post_init__(self):
        from pto.errors import UsageError

        bad = [f"{k}={getattr(self, k)}" for k in ("chunk", "tk", "bn", "bk", "bv", "lm_bk", "dot_bk", "long_chunks",
                                                  "ffn_bn", "ffn_bk", "qkv_bn", "qkv_bk", "o_bn", "o_bk", "rope_bh",
                                                  "dot_bn", "round_programs", "fold_dn")
               if getattr(self, k) is not None and getattr(self, k) < 1]
        if bad:
            raise UsageError(f"decode tiling: {', '.join(bad)}: block sizes are positive")
        unknown = [k for k, _ in self.quant_tiles if k not in self.__dataclass_fields__ or k == "quant_tiles"]
        if unknown:
            raise UsageError(f"decode tiling: quant_tiles names {', '.join(unknown)}: not a field of the tiling")
        if self.fold_down < 0:
            raise UsageError(f"decode tiling: fold_down={self.fold_down}: the folded FFN's block is positive (0: off)")
        if self.split_down < 0:
            raise UsageError(f"decode tiling: split_down={self.split_down}: the down projection's part is positive "
                             "(0: off)")
        if self.fold_combine < 0:
            raise UsageError(f"decode tiling: fold_combine={self.fold_combine}: the folded o projection's block is "
                             "positive (0: off)")
        if self.dense_rows < 0 or self.quant_rows < 0:
            raise UsageError(f"decode tiling: dense_rows={self.dense_rows}, quant_rows={self.quant_rows}: counts of "
                             "sequences are 0 or more")
        if self.span < 0 or self.span == 1:
            raise UsageError(f"decode tiling: span={self.span}: a span merges 2 chunks or more (0: no spans)")
        if self.chunk % self.tk:
            # an attention task's last key tile would run past its chunk into keys it must not see
            raise UsageError(f"decode tiling: chunk={self.chunk} is not a multiple of tk={self.tk} (the attention "
                             "task's key tiles must cover its chunk exactly)")


#: the widest output block :attr:`DecodeTiling.dot_round` gives a projection
DOT_ROUND_MAX = 64


def round_block(outputs: int, programs: int, least: int, most: int) -> int:
    """The narrowest power of two from ``least`` to ``most`` that cuts ``outputs`` outputs into at
    most ``programs`` blocks (one round over that many programs), else ``most``."""
    need = -(-outputs // programs)
    return min(most, max(least, 1 << (need - 1).bit_length()))


#: the most partial states of a head the combine reads at once (its strided tile of them is
#: this many rows of the head size, f32)
COMBINE_ROWS = 32


def spans(cache: int | None, t: DecodeTiling) -> int:
    """Spans of ``t.span`` chunks the first combine level merges for a cache of ``cache`` slots
    (0: one level; None: the cache is not known at build, one level). The combine's loop waits on
    a load per chunk: a 32K cache's 512 chunks of 64 would be one 512-step loop, two levels are
    loops of 16 and 32. A head's chunks that one combine reads at once (at most
    :data:`COMBINE_ROWS`, with ``combine_parts``) take one level: a launch fewer a layer."""
    J = (cache or 0) // t.chunk
    if t.combine_parts and J <= COMBINE_ROWS:
        return 0
    return J // t.span if t.span and t.span < J and J % t.span == 0 else 0


def tile_rows(batch: int, target: Target | None = None, grouped: int = 0) -> int:
    """The rows of the projections' tiles for ``batch`` sequences on ``target``: on a GPU (or
    None) 1, or at least 16 (what a tensor-core dot takes; the rows past the batch are padding),
    or the batch itself up to ``grouped`` sequences (quantized weights read by groups:
    :attr:`DecodeTiling.quant_rows`, :func:`grouped_rows`); on a CPU the batch itself (no tensor
    cores: padding is work, SmolLM2's step at batch 2 on the development VM took 180 ms against
    17 at batch 1 when its 2 rows were 16)."""
    if batch == 1 or batch <= grouped or (target is not None and target.kind == "cpu"):
        return batch
    return max(batch, 16)


def grouped_rows(t: DecodeTiling, quantized: bool) -> int:
    """The most sequences a step of tiling ``t`` keeps unpadded on a GPU: ``t.quant_rows`` (at
    most the Triton renderer's ``GROUPED_ROWS``: more rows of x take the values and a
    tensor-core dot) where the weights are ``quantized``, else ``t.dense_rows``."""
    return min(t.quant_rows, GROUPED_ROWS) if quantized else t.dense_rows


def folds_down(t: DecodeTiling, rows: int, quantized: bool, one_rank: bool) -> bool:
    """Whether a step of ``rows`` tile rows runs its FFN in one level (:attr:`DecodeTiling.fold_down`):
    asked for, output-major GEMVs of fewer than 16 rows (a tensor-core dot's K would be the
    fold's block), dense weights, one rank."""
    return bool(t.fold_down) and t.wt and rows < 16 and not quantized and one_rank


def splits_down(t: DecodeTiling, rows: int, one_rank: bool) -> bool:
    """Whether a step of ``rows`` tile rows splits its down projection's contraction across
    programs (:attr:`DecodeTiling.split_down`): asked for, output-major GEMVs of fewer than 16
    rows, one rank (the FFN folded in one level takes precedence: :func:`folds_down`)."""
    return bool(t.split_down) and t.wt and rows < 16 and one_rank


def residual_f32(t: DecodeTiling, rows: int, quantized: bool, one_rank: bool) -> bool:
    """Whether the step's residual stream (x, x2) is f32: where a task adds into it
    (:func:`folds_down`, :func:`splits_down`)."""
    return folds_down(t, rows, quantized, one_rank) or splits_down(t, rows, one_rank)


def folds_combine(t: DecodeTiling, rows: int, quantized: bool, one_rank: bool, parts: int | None) -> bool:
    """Whether a step of ``rows`` tile rows folds the attention combine into the o projection
    (:attr:`DecodeTiling.fold_combine`): asked for, one sequence's output-major GEMV, the o
    weight dense (its K steps are one head: not whole blocks of a quantized type), one rank, and
    a head's ``parts`` partial states known at build and few enough to read at once
    (:data:`COMBINE_ROWS`, with ``combine_parts``)."""
    return (bool(t.fold_combine) and t.wt and rows == 1 and not quantized and one_rank and t.combine_parts
            and parts is not None and parts <= COMBINE_ROWS)


__all__ = ["DecodeTiling", "COMBINE_ROWS", "DOT_ROUND_MAX", "folds_combine", "folds_down", "grouped_rows",
           "residual_f32", "round_block", "spans", "splits_down", "tile_rows"]
