"""One decode step of a whole model as one task graph: for every sequence of the batch one new
token, through every layer, to the next token.

The step reads each sequence's token id and position from device tensors (``tok``, ``pos``,
``[B, 1]`` f32) inside its tasks (``load_scalar``), and its last tasks write the chosen token and
the next position back: the graph is built once per shape (batch ``B``, cache capacity ``C``)
and replayed for every step, with no host synchronization inside a step.

Per layer (weights of all layers stacked in one tensor per kind, a layer's block at row
``l * rows``):

1. ``matmul_norm_tile``: qkv = rmsnorm(x) @ [wq wk wv] (the norm folded into the projection);
2. per sequence: ``rope_qkv_append`` (RoPE on q at the position, into a ``[heads, D]`` block;
   RoPE on k, k and v appended to the sequence's cache block at the position
   modulo C: a ring for sliding-window models); with one sequence (output-major weights, and
   ``DecodeTiling.rope_in_qkv``: models below hidden 2048, measured) 1 and 2 are one task,
   ``gemv_norm_rope_append_tile``, RoPE and the append in the projection's epilogue;
3. per sequence and key/value head, per chunk of ``chunk`` cache slots: ``decode_attn_part``
   (flash-decoding), then per query head ``decode_attn_combine_parts`` (a head's partial states
   read at once, where they are at most ``COMBINE_ROWS``; else ``decode_attn_combine``'s loop
   over them); for a long cache (more than ``DecodeTiling.span`` chunks, a multiple of it,
   and more than ``COMBINE_ROWS``) first ``decode_attn_merge`` per span of that many chunks and
   query head, then the combine over the spans;
4. ``matmul_residual_tile``: x2 = x + attn @ wo; ``matmul_norm_swiglu_tile``: h =
   swiglu(rmsnorm(x2)); ``matmul_residual_tile``: x = x2 + h @ wd.

Tensor parallelism (``tp`` > 1, Megatron's split as the layer program's): the module is one
rank's, the same on every rank, with ``1/tp`` of every layer's query and key/value heads and FFN
columns (the weights and the cache are the rank's shards, :func:`shard_inputs`). The o and down
projections are then partial sums: each is one task of the product, its sum over the ranks and
the residual (``gemv_allreduce_residual_tile``), so every rank holds the whole activation row
after it. The embedding and the final norm run whole on every rank. The LM head is
vocabulary-parallel (``vocab_parallel``, the default; :mod:`.vocab`): each rank computes the
logits of its share of the vocabulary and the first stage of their argmax, then
``argmax_candidates_tile`` gathers every rank's best token onto every rank (a sum over the ranks
of rows that hold one rank's candidate each: exact), and ``argmax_advance`` over the ranks'
candidates picks the same token on every rank. Replicated (``vocab_parallel=False``), every
rank computes the whole head and picks the same token (the all-reduce leaves the same bits on
every rank).

Then ``lmhead_argmax_tile`` (the final norm folded into the LM head, each vocabulary block's
largest logit and its index) and per sequence ``argmax_advance``. The KV cache is a state of
the graph: ``k_cache``/``v_cache`` ``[L * B * C, kv_heads * D]``, sequence b's block of layer l at
row ``(l * B + b) * C``; slot ``p mod C`` holds position p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from pto.incore import decode as dk
from pto.incore.collective import gemv_allreduce_residual_tile, matmul_allreduce_residual_tile
from pto.incore.fused import matmul_norm_swiglu_tile, matmul_norm_tile
from pto.incore.gemv import (
    gemv_add_tile,
    gemv_norm_rope_append_tile,
    gemv_norm_swiglu_down_tile,
    gemv_norm_swiglu_tile,
    gemv_norm_tile,
    gemv_residual_tile,
)
from pto.incore.matmul import matmul_residual_tile
from pto.incore.vocab import argmax_candidates_tile
from pto.orchestration.llama.tiling import allreduce_dtype
from pto.orchestration.model.config import ModelConfig
from pto.orchestration.model.quantized import DENSE, STACKED, WeightTypes, for_weights, weight_shapes
from pto.orchestration.model.tiling import (
    COMBINE_ROWS,
    DOT_ROUND_MAX,
    DecodeTiling,
    folds_combine,
    folds_down,
    grouped_rows,
    residual_f32,
    round_block,
    spans,
    tile_rows,
)
from pto.orchestration.model.vocab import VocabSplit

from pto import Orchestration, f32
from pto.ir.dtypes import DType
from pto.ir.nodes import IncoreFunction, Module
from pto.machine.target import Target


@dataclass(frozen=True)
class DecodeFunctions:
    qkv: IncoreFunction
    rope: IncoreFunction
    part: IncoreFunction
    combine: IncoreFunction
    proj: IncoreFunction  # h @ wd + x2 (K and N dims: also attn @ wo + x, as proj_o may be)
    gate_up: IncoreFunction | None  # None where the FFN is one level (ffn)
    lm: IncoreFunction
    embed: IncoreFunction
    advance: IncoreFunction
    merge: IncoreFunction  # a span of chunks (long caches: the first of two combine levels)
    combine_spans: IncoreFunction  # the combine over the spans
    qkv_rope: IncoreFunction | None = None  # one sequence: the projection, RoPE and the append
    proj_o: IncoreFunction | None = None  # attn @ wo + x (None: proj)
    combine_parts: IncoreFunction | None = None  # the combine reading a head's states at once
    candidates: IncoreFunction | None = None  # vocabulary-parallel: every rank's best token gathered
    #: the FFN in one level (DecodeTiling.fold_down): x2's norm, gate, up and the down projection
    #: added into x, the residual stream then f32 (``proj`` the o projection, which stores its
    #: sum to x2 and to x)
    ffn: IncoreFunction | None = None
    #: one sequence's attention combine folded into the o projection (DecodeTiling.fold_combine;
    #: None: the combine per head, then ``proj_o`` or ``proj``)
    combine_o: IncoreFunction | None = None
    #: the down projection by parts of its contraction, each program adding its product into x
    #: (DecodeTiling.split_down; the residual stream then f32, and ``proj`` the o projection, which
    #: stores its sum to x2 and to x); None: ``proj``
    down: IncoreFunction | None = None

    @property
    def adds(self) -> bool:
        """Whether a task adds into the residual stream (the folded FFN, the split down
        projection), which is then f32."""
        return self.ffn is not None or self.down is not None


def functions(cfg: ModelConfig, dt: DType, target: Target | None, t: DecodeTiling, batch: int,
              reduce: DType | None = None, parts: int | None = None,
              wtypes: WeightTypes = DENSE, split: VocabSplit | None = None) -> DecodeFunctions:
    """The step's InCore functions for ``batch`` sequences (the rows of the projections' tiles);
    ``cfg`` is one rank's, and ``reduce`` the dtype of the row-parallel projections' sum over the
    ranks (None: one rank, no sum); ``parts``: the partial states a head's attention leaves
    (chunks or spans; None: not known at build); ``wtypes``: the weights' types (quantized ones
    load dequantized, their K steps whole blocks: :func:`~.quantized.for_weights`); ``split``: the
    vocabulary-parallel LM head's (None: the whole head)."""
    if wtypes.quantized and reduce is not None:
        from pto.errors import UsageError

        raise UsageError("quantized weights run on one rank (--tp 1); dequantize them for tensor parallelism")

    def wkw(*kinds: str) -> dict:
        """The builders' weight dtype for ``kinds`` (one type), where it is quantized."""
        d = {wtypes.get(k, dt) for k in kinds}
        if len(d) > 1:
            from pto.errors import UsageError

            raise UsageError(f"the weights {' and '.join(kinds)} feed one task and need one type, not "
                             f"{' and '.join(sorted(map(str, d)))}")
        (d,) = d
        return {"wdtype": d} if d.is_quantized else {}

    least = {k: max(16, wtypes.blocks((k,))) for k in ("w_qkv", "wo", "wg", "wd")}
    rows = batch
    c = cfg.layer
    H, D, QD, KVD, F = c.hidden, c.head_dim, c.q_dim, c.kv_dim, c.ffn
    G = c.heads // c.kv_heads
    # one sequence: a multiply-sum along the weight rows (the GEMV); several: their rows padded to
    # 16 (rows past the batch load as zeros, are never stored) and blocks of 16 outputs, so the
    # products are tensor-core dots instead of broadcast sums of rows x bn x bk elements (8
    # sequences of the 8B model: 15.7 ms a step as broadcast sums); a few with quantized weights
    # and DecodeTiling.quant_rows: unpadded, the GEMVs reading the weights by groups for every row
    batch = tile_rows(batch, target, grouped_rows(t, wtypes.quantized))
    if batch >= 16:
        t = dot_tiles(t, H, QD + 2 * KVD, F, wtypes.blocks(STACKED))
    t = whole_steps(cfg, dt, t, wtypes)

    def whole(*kinds: str) -> bool:
        """Whether the K step of ``kinds`` is a whole contraction (quant_whole_k), narrowed to
        its divisors where it does not fit."""
        return t.quant_whole_k and all(wtypes.get(k, dt).is_quantized for k in kinds)

    fold = folds_down(t, batch, wtypes.quantized, reduce is None)
    stream32 = residual_f32(t, batch, wtypes.quantized, reduce is None)  # (the fold, else the parts)
    xkw = {"xdtype": f32} if stream32 else {}  # the residual stream's dtype, where not dt
    lm, bv = _lm_head(cfg, dt, target, t, batch, wtypes, split.height if split else None, stream32)
    norm, residual, swiglu = (gemv_norm_tile, gemv_residual_tile, gemv_norm_swiglu_tile) if t.wt else \
        (matmul_norm_tile, matmul_residual_tile, matmul_norm_swiglu_tile)
    # each projection with the widest contraction step up to bk whose tiles fit the target (a
    # batch of 32 rows in steps of 1024 does not fit an H100's 227 KiB)
    qkv_bn, qkv_bk = t.qkv_bn or t.bn, t.qkv_bk or t.bk
    qkv = _widest(lambda bk: norm(dt, batch, H, QD + 2 * KVD, qkv_bn, bk, c.eps, target, **wkw("w_qkv"), **xkw),
                  qkv_bk, least["w_qkv"], whole("w_qkv"))[0]

    def projection(bn: int, bk: int, kind: str) -> IncoreFunction:
        if reduce is not None:  # the product, its sum over the ranks and the residual: one task
            summed = gemv_allreduce_residual_tile if t.wt else matmul_allreduce_residual_tile
            return _widest(lambda b: summed(dt, batch, QD, H, bn, b, reduce, target), bk)[0]
        return _widest(lambda b: residual(dt, batch, QD, H, bn, b, target, **wkw(kind)), bk, least[kind],
                       whole(kind))[0]

    o_tiles = (t.o_bn or t.bn, t.o_bk or t.bk)
    ffn = down = None
    if stream32:  # the o projection's f32 sum to x2 and x; the FFN or its down projection adds into x
        proj = _widest(lambda b: gemv_residual_tile(dt, batch, QD, H, o_tiles[0], b, target, rdtype=f32, copy=True,
                                                    **wkw("wo")), o_tiles[1], least["wo"], whole("wo"))[0]
        proj_o = None
        if fold:
            ffn = _folded_ffn(cfg, dt, target, t, batch)
        else:
            down = _split_down(cfg, dt, target, t, batch, least["wd"], wkw("wd"))
    else:
        proj = projection(t.bn, t.bk, "wd")
        # tiles (or weights) of its own: a function of its own (a module's InCore functions have
        # distinct names)
        same = o_tiles == (t.bn, t.bk) and wtypes.get("wo", dt) == wtypes.get("wd", dt)
        proj_o = proj if same else replace(projection(*o_tiles, "wo"), name=f"{proj.name}_o")
    gate_up = None if fold else _widest(
        lambda bk: swiglu(dt, batch, H, F, t.ffn_bn or t.bn, bk, c.eps, target, **wkw("wg", "wu"), **xkw),
        t.ffn_bk or t.bk, least["wg"], whole("wg", "wu"))[0]
    combine_o = None
    if folds_combine(t, batch, wtypes.get("wo", dt).is_quantized, reduce is None, parts):
        # the widest block up to fold_combine whose tiles fit (a CPU's 48 KiB: the 8B's heads of 128
        # in f32 take 32 outputs a program where 64 were asked)
        combine_o = _widest(lambda bn: dk.decode_attn_combine_o(dt, c.heads, D, parts, H, bn, target, **(
            {"rdtype": f32, "copy": True} if stream32 else {})), t.fold_combine, 1)[0]
    combine_parts = None
    if t.combine_parts and parts and parts <= COMBINE_ROWS:  # a head's states fit one strided tile
        combine_parts = dk.decode_attn_combine_parts(dt, c.heads, D, parts, target)
    return DecodeFunctions(
        combine_parts=combine_parts,
        qkv_rope=_qkv_rope(cfg, dt, target, t, (qkv_bn, qkv_bk), {**wkw("w_qkv"), **xkw})
        if batch == 1 and t.wt and t.rope_in_qkv else None,
        qkv=qkv,
        rope=dk.rope_qkv_append(dt, c.heads, c.kv_heads, D, cfg.max_positions, target),
        # the widest key tile up to tk that fits (a CPU's 48 KiB holds a head of 128 in tiles of 16)
        part=_widest(lambda tk: dk.decode_attn_part(dt, G, D, t.chunk, tk, target), t.tk)[0],
        combine=dk.decode_attn_combine(dt, D, t.chunk, target),
        merge=dk.decode_attn_merge(D, t.chunk, max(t.span, 2), target),
        combine_spans=dk.decode_attn_combine(dt, D, t.chunk * max(t.span, 2), target),
        proj=proj,
        proj_o=proj_o,
        gate_up=gate_up,
        lm=lm,
        embed=dk.embed_row(dt, H, cfg.vocab, min(H, 1024), target, **wkw("emb"), **xkw),
        advance=dk.argmax_advance(split.ranks if split else cdiv_int(cfg.vocab, bv), target),
        candidates=argmax_candidates_tile(rows, cdiv_int(split.height, bv), split.ranks, target) if split else None,
        ffn=ffn,
        combine_o=combine_o,
        down=down,
    )


def _folded_ffn(cfg: ModelConfig, dt: DType, target: Target | None, t: DecodeTiling, rows: int) -> IncoreFunction:
    """The FFN in one level (:attr:`DecodeTiling.fold_down`) for ``rows`` tile rows: the widest
    gate/up K step up to ``ffn_bk`` (else ``bk``) whose tiles fit the target, and the down
    projection's step ``fold_dn`` (by default the hidden size up to 1024, halved until the tiles
    fit: a CPU's 48 KiB holds 8 rows of the 1B's FFN in steps of 512)."""
    c = cfg.layer
    dn = t.fold_dn or min(c.hidden, 1024)

    def with_step(dn: int) -> IncoreFunction:
        return _widest(lambda bk: gemv_norm_swiglu_down_tile(dt, rows, c.hidden, c.ffn, t.fold_down, bk, dn, c.eps,
                                                             target, xdtype=f32), t.ffn_bk or t.bk)[0]

    return _widest(with_step, dn, dn if t.fold_dn else 16)[0]  # (a step given is not narrowed)


def _split_down(cfg: ModelConfig, dt: DType, target: Target | None, t: DecodeTiling, rows: int, least: int,
                wkw: dict) -> IncoreFunction:
    """The down projection by parts (:attr:`DecodeTiling.split_down`) for ``rows`` tile rows:
    parts of equal width, the widest that divides the contraction in whole ``least`` (16 or the
    weight's block) and is at most ``split_down`` (the whole contraction where none is), each in
    the widest K step up to ``bk`` that divides it and whose tiles fit the target (``wkw``: the
    weight's dtype where quantized). SmolLM2's 1,536 in parts of at most 1,024: two of 768."""
    K = cfg.layer.ffn
    widths = [p for p in range(least, min(t.split_down, K) + 1, least) if K % p == 0]
    part = widths[-1] if widths else K
    step = max((b for b in range(least, min(t.bk, part) + 1, least) if part % b == 0), default=part)
    return _widest(lambda bk: gemv_add_tile(dt, rows, K, cfg.layer.hidden, t.bn, bk, part, target, **wkw),
                   step, least, whole=True)[0]


def dot_tiles(t: DecodeTiling, hidden: int, qkv: int, ffn: int, blocks: int = 1) -> DecodeTiling:
    """``t`` on the dot path (16 rows and more): every projection in ``dot_bn`` outputs and K
    steps of ``dot_bk``; with :attr:`~.tiling.DecodeTiling.dot_round` (and ``round_programs``),
    where some projection's items in ``dot_bn`` take more than one round, each in the block of
    :func:`~.tiling.round_block` for its outputs (``qkv``, ``hidden`` for the o and down
    projections, ``ffn`` for gate/up), its K step keeping the bytes of a step, in whole
    ``blocks`` (the layers' quantized weights' largest block; 1: none quantized)."""
    bn, bk = t.dot_bn or max(t.bn, 16), t.dot_bk or t.bk
    plain = dict(ffn_bn=None, ffn_bk=None, qkv_bn=None, qkv_bk=None, o_bn=None, o_bk=None)
    if not (t.dot_round and t.round_programs) or all(cdiv_int(n, bn) <= t.round_programs for n in (hidden, qkv, ffn)):
        return replace(t, bn=bn, bk=bk, **plain)

    def fit(outputs: int) -> tuple[int, int]:
        b = round_block(outputs, t.round_programs, 16, max(DOT_ROUND_MAX, bn))
        k = max(16, bk * bn // b)
        return b, max(k, blocks) // blocks * blocks

    (ob, ok), (qb, qk), (fb, fk) = fit(hidden), fit(qkv), fit(ffn)
    return replace(t, bn=ob, bk=ok, **{**plain, "qkv_bn": qb, "qkv_bk": qk, "ffn_bn": fb, "ffn_bk": fk})


def _qkv_rope(cfg: ModelConfig, dt: DType, target: Target | None, t: DecodeTiling, tiles: tuple[int, int],
              wkw: dict):
    """One sequence's q, k, v projection with RoPE and the append in its epilogue, ``tiles`` the
    plain projection's (bn, bk): by default a program's pairs are its rows (``wkw``: its weights'
    dtype, where quantized, and x's, where not the step's)."""
    c, (bn, bk) = cfg.layer, tiles
    bh = math.gcd(t.rope_bh or max(1, bn // 2), c.head_dim // 2)
    least = wkw["wdtype"].quant.block if "wdtype" in wkw else 16
    return _widest(lambda b: gemv_norm_rope_append_tile(dt, c.hidden, (c.heads, c.kv_heads, c.head_dim), bh, b, c.eps,
                                                         cfg.max_positions, target, **wkw), bk, least)[0]


def _widest(build, size: int, least: int = 16, whole: bool = False):
    """``(build(s), s)`` for the largest ``s`` of ``size``, ``size / 2``, ... (down to ``least``,
    16 or a quantized weight's block) whose function's tiles fit the target's on-chip memory
    (SRAM-aware sizing); ``whole``: of ``size`` (a whole contraction) and its divisors in whole
    ``least`` instead (576 in blocks of 32: 576, 288, 192, 96, 64, 32; every step whole)."""
    from pto.errors import SramError

    sizes = [s for s in range(size, least - 1, -least) if size % s == 0] if whole else []
    for s in sizes[:-1]:
        try:
            return build(s), s
        except SramError:
            continue
    size = sizes[-1] if sizes else size
    while True:
        try:
            return build(size), size
        except SramError:
            if size <= least:
                raise
            size //= 2


def _lm_head(cfg: ModelConfig, dt: DType, target: Target | None, t: DecodeTiling, batch: int,
             wtypes: WeightTypes = DENSE, vocab: int | None = None, stream32: bool = False):
    """The LM head over ``vocab`` ids (None: the whole vocabulary; a rank's share under the
    vocabulary-parallel head) with the widest vocabulary block up to ``t.bv`` whose tiles fit the
    target's on-chip memory (a CPU's 48 KiB takes narrower blocks than an H100), and that width;
    ``stream32``: x is the f32 residual stream (a task adds into it: :func:`~.tiling.residual_f32`)."""
    build = dk.lmhead_argmax_gemv_tile if t.lm_wt else dk.lmhead_argmax_tile
    c, V = cfg.layer, vocab or cfg.vocab
    w = wtypes.get("lm_head", dt)
    kw = {"wdtype": w} if w.is_quantized else {}
    if stream32:
        kw["xdtype"] = f32

    def widest(bk: int):
        return _widest(lambda bv: build(dt, batch, c.hidden, V, bv, bk, c.eps, target, **kw), min(t.bv, V))

    if not (t.quant_whole_k and w.is_quantized):
        return widest(t.lm_bk)
    # the whole contraction (whole_steps) or a step of whole blocks dividing it: of those that fit,
    # the one whose tiles hold the most weights (each tile recomputes the folded norm's statistics
    # of its rows: SmolLM2's Q8_0 head at 4 sequences took 17.0 ms a step in blocks of 32 over its
    # whole 576, 6.1 in blocks of 128 over 288; docs/PERF.md "A CPU batch's rows unpadded"), the
    # wider step of equal ones
    from pto.errors import SramError

    fits = []
    for bk in (s for s in range(t.lm_bk, w.quant.block - 1, -w.quant.block) if t.lm_bk % s == 0):
        try:
            fits.append((widest(bk), bk))
        except SramError:
            continue
    if not fits:
        return widest(w.quant.block)  # (raises what the narrowest step does)
    return max(fits, key=lambda f: (f[0][1] * f[1], f[1]))[0]


def whole_steps(cfg: ModelConfig, dt: DType, t: DecodeTiling, wtypes: WeightTypes) -> DecodeTiling:
    """``t`` with each quantized projection's and the LM head's K step its whole contraction
    where it asks (:attr:`~.tiling.DecodeTiling.quant_whole_k`; the builders narrow a step that
    does not fit to a divisor of it, :func:`_widest`, :func:`_lm_head`)."""
    if not t.quant_whole_k:
        return t
    c = cfg.layer

    def whole(kind: str, k: int, step: int | None) -> int | None:
        return k if wtypes.get(kind, dt).is_quantized else step

    return replace(t, qkv_bk=whole("w_qkv", c.hidden, t.qkv_bk), o_bk=whole("wo", c.q_dim, t.o_bk),
                   bk=whole("wd", c.ffn, t.bk), ffn_bk=whole("wg", c.hidden, t.ffn_bk),
                   lm_bk=whole("lm_head", c.hidden, t.lm_bk))


def lm_block(cfg: ModelConfig, dt: DType, target: Target | None, t: DecodeTiling, batch: int,
             wtypes: WeightTypes = DENSE, vocab: int | None = None, ranks: int = 1) -> int:
    """The LM head's vocabulary block (what :func:`functions` picks, from the same steps;
    ``vocab`` as there; ``ranks``: the step's)."""
    rows = tile_rows(batch, target, grouped_rows(t, wtypes.quantized))
    stream32 = residual_f32(t, rows, wtypes.quantized, ranks == 1)
    return _lm_head(cfg, dt, target, whole_steps(cfg, dt, t, wtypes), rows, wtypes, vocab, stream32)[1]


def cdiv_int(a: int, b: int) -> int:
    return -(-a // b)


def vocab_split(cfg: ModelConfig, tp: int, vocab_parallel: bool = True) -> VocabSplit | None:
    """The vocabulary-parallel LM head's split of ``cfg``'s vocabulary over ``tp`` ranks (None:
    one rank, or the head replicated)."""
    return VocabSplit(cfg.vocab, tp) if tp > 1 and vocab_parallel else None


@lru_cache(maxsize=32)
def build_step(cfg: ModelConfig, dt: DType, target: Target | None, batch: int,
               tiling: DecodeTiling | None = None, tp: int = 1, reduce: DType = f32,
               cache: int | None = None, wtypes: WeightTypes = DENSE, vocab_parallel: bool = True) -> Module:
    """The decode step of ``cfg`` for ``batch`` sequences; the cache capacity is the scalar
    ``C`` (slots per sequence; a multiple of the tiling's chunk), the batch the scalar ``B``
    (equal to ``batch``: the projections' tiles have that many rows). With ``tp`` > 1 one rank's
    step (the module docstring), the partial sums summed over the ranks in ``reduce``, the LM
    head vocabulary-parallel unless ``vocab_parallel`` is off. ``cache``: the capacity the step
    will run with, where known (a long cache combines in two levels). ``wtypes``: what the weight
    inputs are stored as (quantized ones: the tiling fitted to them,
    :func:`~.quantized.for_weights`). Built once per process and description (the program's runs
    and a generation's steps share it; the module is immutable)."""
    split = vocab_split(cfg, tp, vocab_parallel)
    cfg = cfg.shard(tp)
    t = for_weights(tiling or DecodeTiling(), wtypes, batch).for_cache(cache)
    t = t.for_round(cache, batch * cfg.layer.kv_heads)  # (the rank's heads)
    if tp > 1:  # (a rank's step pads a few sequences' rows as before: unpadded, its sums are not measured)
        t = replace(t, dense_rows=0)
    spans_ = spans(cache, t)
    fn = functions(cfg, dt, target, t, batch, reduce if tp > 1 else None,
                   spans_ or (cache // t.chunk if cache else None), wtypes, split)
    vocab = split.height if split else cfg.vocab
    nbv = cdiv_int(vocab, lm_block(cfg, dt, target, t, batch, wtypes, vocab, tp))
    return _Step(cfg, dt, t, fn, nbv, spans_, wtypes, split).module()


class _Step:
    """The step's orchestration under construction: the rank's configuration ``cfg``, the
    tiling ``t``, the functions ``fn``, the LM head's vocabulary blocks ``nbv``, the combine's
    spans ``S`` (0: one level), the weights' types ``wtypes``; the scalars ``B``, ``C`` and the
    chunks a sequence's cache holds, ``J``; the tensors ``T``."""

    def __init__(self, cfg: ModelConfig, dt: DType, t: DecodeTiling, fn: DecodeFunctions, nbv: int, spans_: int,
                 wtypes: WeightTypes = DENSE, split: VocabSplit | None = None):
        self.cfg, self.c, self.dt, self.t, self.fn, self.nbv, self.S = cfg, cfg.layer, dt, t, fn, nbv, spans_
        self.wtypes = wtypes
        self.split = split
        self.V = split.height if split else cfg.vocab  # the LM head's ids on this rank
        self.o = Orchestration("decode_step")
        self.B, self.C = self.o.scalar("B"), self.o.scalar("C")
        self.T = self._tensors((("qkv",) if fn.qkv_rope is not None else ()) + (("hb",) if fn.ffn is not None else ())
                               + (("attn",) if fn.combine_o is not None else ()), f32 if fn.adds else dt)
        self.ws = weight_shapes(cfg, t.wt)

    def W(self, kind: str, l):
        """Layer ``l``'s block of a stacked weight, as a call's region."""
        rows, cols = self.ws[kind]
        return (self.T[kind], l * rows, 0, rows, cols)

    def A(self, name: str, cols):
        """The batch's rows of an activation (a projection's tiles may be taller: padded)."""
        return (self.T[name], 0, 0, self.B, cols)

    def module(self) -> Module:
        o, fn, T, c, C = self.o, self.fn, self.T, self.c, self.C
        H, D, QD, KVD, NQ = c.hidden, c.head_dim, c.q_dim, c.kv_dim, c.heads
        self.J = o.let("J", C // self.t.chunk)  # attention chunks per sequence
        with o.for_loop("b0", 0, self.B) as b:
            o.call(fn.embed, {"tok": (T["tok"], b, 0, 1, 1), "emb": T["emb"], "x": (T["x"], b, 0, 1, H)})
        with o.for_loop("l", 0, self.cfg.layers) as l:
            projection = {"x": self.A("x", H), "g": (T["g_attn"], l, 0, 1, H), "w": self.W("w_qkv", l)}
            if fn.qkv_rope is not None:  # one sequence: its RoPE and append in the projection's task
                o.call(fn.qkv_rope, {**projection, "pos": (T["pos"], 0, 0, 1, 1), "cos": T["cos"], "sin": T["sin"],
                                     "q": (T["q"], 0, 0, NQ, D), "kc": (T["k_cache"], l * C, 0, C, KVD),
                                     "vc": (T["v_cache"], l * C, 0, C, KVD), "cap": C})
            else:
                o.call(fn.qkv, {**projection, "y": self.A("qkv", QD + 2 * KVD)})
            with o.for_loop("b", 0, self.B) as b:
                self._attention(l, b)
            self._ffn(l)
        self._sample()
        return o.module()

    def _ffn(self, l) -> None:
        """Layer l's o projection with the residual, then the FFN with its own: two tasks where
        the FFN is one level (``fn.ffn``: x2 = x + attn @ wo.T, stored to x too; then x += the
        FFN of x2, added by its programs), else three (x2 as above; h = swiglu of x2; x = x2 +
        h @ wd.T, or with ``fn.down`` x += h @ wd.T added by the parts' programs into the x the
        o projection stored). With ``fn.combine_o`` the o projection's task combines the heads'
        partial states itself (one sequence: its rows of them)."""
        o, fn, T, c = self.o, self.fn, self.T, self.c
        H, QD, F = c.hidden, c.q_dim, c.ffn
        attn = {"w": self.W("wo", l), "r": self.A("x", H), "y": self.A("x2", H)}
        proj = fn.proj if fn.adds else fn.proj_o or fn.proj
        if fn.combine_o is not None:
            (so, sml), n = self._states()
            attn.update(o=(T[so], 0, 0, n * c.heads, c.head_dim), ml=(T[sml], 0, 0, n * c.heads, 2))
            proj = fn.combine_o
        else:
            attn["x"] = self.A("attn", QD)
        norm = {"x": self.A("x2", H), "g": (T["g_ffn"], l, 0, 1, H), "wg": self.W("wg", l), "wu": self.W("wu", l)}
        if fn.ffn is not None:
            o.call(proj, {**attn, "y2": self.A("x", H)})
            o.call(fn.ffn, {**norm, "wd": self.W("wd", l), "y": self.A("x", H)})
            return
        if fn.down is not None:
            o.call(proj, {**attn, "y2": self.A("x", H)})
            o.call(fn.gate_up, {**norm, "y": self.A("hb", F)})
            o.call(fn.down, {"x": self.A("hb", F), "w": self.W("wd", l), "y": self.A("x", H)})
            return
        o.call(proj, attn)
        o.call(fn.gate_up, {**norm, "y": self.A("hb", F)})
        o.call(fn.proj, {"x": self.A("hb", F), "w": self.W("wd", l), "r": self.A("x2", H), "y": self.A("x", H)},
               dims={"K": F, "N": H})

    def _attention(self, l, b) -> None:
        """Layer l's attention of sequence b: RoPE and the append (unless the projection did
        them), the chunks' partial states per key/value head, then the combine."""
        o, fn, T, c, t, C, J = self.o, self.fn, self.T, self.c, self.t, self.C, self.J
        D, QD, KVD, NQ, NKV, G = c.head_dim, c.q_dim, c.kv_dim, c.heads, c.kv_heads, c.heads // c.kv_heads
        row = (l * self.B + b) * C
        if fn.qkv_rope is None:
            tables = {"pos": (T["pos"], b, 0, 1, 1), "cos": T["cos"], "sin": T["sin"]}
            o.call(fn.rope, {**tables, "x": (T["qkv"], b, 0, 1, QD + 2 * KVD), "q": (T["q"], b * NQ, 0, NQ, D),
                             "kc": (T["k_cache"], row, 0, C, KVD), "vc": (T["v_cache"], row, 0, C, KVD), "cap": C})
        with o.for_loop("j", 0, J) as j:
            for g in range(NKV):
                part = (b * J + j) * NQ + g * G
                o.call(fn.part, {"pos": (T["pos"], b, 0, 1, 1), "q": (T["q"], b * NQ + g * G, 0, G, D),
                                 "kc": (T["k_cache"], row + j * t.chunk, g * D, t.chunk, D),
                                 "vc": (T["v_cache"], row + j * t.chunk, g * D, t.chunk, D),
                                 "o": (T["o_part"], part, 0, G, D), "ml": (T["ml_part"], part, 0, G, 2),
                                 "j0": j * t.chunk, "cap": C})
        self._combine(b)

    def _states(self) -> tuple[tuple[str, str], object]:
        """The partial states the last combine reads (the tensors of their outputs and of their
        m and l) and how many a head has: the spans' merged ones (``S``), else the chunks'."""
        return (("o_span", "ml_span"), self.S) if self.S else (("o_part", "ml_part"), self.J)

    def _combine(self, b) -> None:
        """Sequence b's attention output of every query head from its chunks' partial states: one
        combine over the J chunks, or (``S`` spans) a merge per span of ``t.span`` chunks, then a
        combine over the spans; each combine reads its head's states at once where they are few
        (``fn.combine_parts``), else in a loop; with ``fn.combine_o`` the o projection's task
        makes the last combine (the spans' merges stay here)."""
        o, fn, T, S, SPAN, C, J = self.o, self.fn, self.T, self.S, self.t.span, self.C, self.J
        NQ, D = self.c.heads, self.c.head_dim
        pos = (T["pos"], b, 0, 1, 1)
        if S:
            with o.for_loop("s", 0, S) as s:
                for h in range(NQ):
                    first, into = (b * J + s * SPAN) * NQ + h, (b * S + s) * NQ + h
                    o.call(fn.merge, {"pos": pos, "o_in": (T["o_part"], first, 0, (SPAN - 1) * NQ + 1, D),
                                      "ml_in": (T["ml_part"], first, 0, (SPAN - 1) * NQ + 1, 2),
                                      "o": (T["o_span"], into, 0, 1, D), "ml": (T["ml_span"], into, 0, 1, 2),
                                      "stride": NQ, "j0": s * SPAN, "cap": C})
        if fn.combine_o is not None:
            return
        src, n = self._states()
        for h in range(NQ):
            first = b * n * NQ + h
            region = {"o": (T[src[0]], first, 0, (n - 1) * NQ + 1, D),
                      "ml": (T[src[1]], first, 0, (n - 1) * NQ + 1, 2), "y": (T["attn"], b, h * D, 1, D)}
            if fn.combine_parts is not None:
                o.call(fn.combine_parts, region)
                continue
            o.call(fn.combine_spans if S else fn.combine, {**region, "pos": pos, "stride": NQ, "chunks": n, "cap": C})

    def _sample(self) -> None:
        """The step's end: the LM head with the first stage of the argmax, then per sequence the
        token and the next position."""
        o, fn, T, B, H, V, NBV = self.o, self.fn, self.T, self.B, self.c.hidden, self.V, self.nbv
        # the norm's weight as its region (a K step that does not divide H reads past it: masked)
        o.call(fn.lm, {"x": (T["x"], 0, 0, B, H), "g": (T["g_out"], 0, 0, 1, H), "w": T["lm_head"],
                       "y": (T["logits"], 0, 0, B, V), "best": (T["best"], 0, 0, B, NBV),
                       "index": (T["index"], 0, 0, B, NBV)})
        if self.split is not None:
            self._advance_over_ranks()
            return
        with o.for_loop("b1", 0, B) as b:
            o.call(fn.advance, {"best": (T["best"], b, 0, 1, NBV), "index": (T["index"], b, 0, 1, NBV),
                                "tok": (T["tok"], b, 0, 1, 1), "pos": (T["pos"], b, 0, 1, 1)})

    def _advance_over_ranks(self) -> None:
        """The vocabulary-parallel head's end: every rank's best token gathered onto every rank
        (one task for the batch, its sum over the ranks), then per sequence the token over the
        ranks' candidates and the next position."""
        o, fn, T, B, NBV, N, W = self.o, self.fn, self.T, self.B, self.nbv, self.split.ranks, self.split.width
        o.call(fn.candidates, {"best": (T["best"], 0, 0, B, NBV), "index": (T["index"], 0, 0, B, NBV),
                               "place": T["vocab_place"], "cand": (T["cand"], 0, 0, B, W)})
        with o.for_loop("b1", 0, B) as b:
            o.call(fn.advance, {"best": (T["cand"], b, 0, 1, N), "index": (T["cand"], b, N, 1, N),
                                "tok": (T["tok"], b, 0, 1, 1), "pos": (T["pos"], b, 0, 1, 1)})

    def _tensors(self, unused: tuple[str, ...] = (), xdt: DType | None = None) -> dict:
        """The step's tensors: weights (inputs, of ``wtypes``), the state (cache, token, position:
        inout), the logits (output) and the activations between tasks (temps; those in ``unused``
        not declared; the residual stream x, x2 of ``xdt``, by default the step's dtype)."""
        o, cfg, dt, c, t, B, C, S = self.o, self.cfg, self.dt, self.c, self.t, self.B, self.C, self.S
        wtypes = self.wtypes
        J = C // t.chunk
        L, H, D, QD, KVD, F, V = cfg.layers, c.hidden, c.head_dim, c.q_dim, c.kv_dim, c.ffn, self.V
        ws = weight_shapes(cfg, t.wt)

        def stacked(kind: str):
            rows, cols = ws[kind]
            return o.input(kind, L * rows, cols, wtypes.get(kind, dt))

        T = {"emb": o.input("emb", cfg.vocab, H, wtypes.get("emb", dt)), "w_qkv": stacked("w_qkv"),
             "g_attn": o.input("g_attn", L, H, dt), "wo": stacked("wo"),
             "g_ffn": o.input("g_ffn", L, H, dt), "wg": stacked("wg"), "wu": stacked("wu"),
             "wd": stacked("wd"), "g_out": o.input("g_out", 1, H, dt),
             "lm_head": o.input("lm_head", *((V, H) if t.lm_wt else (H, V)), wtypes.get("lm_head", dt)),
             "cos": o.input("cos", cfg.max_positions, D // 2, dt), "sin": o.input("sin", cfg.max_positions, D // 2, dt)}
        T.update(k_cache=o.inout("k_cache", L * B * C, KVD, dt), v_cache=o.inout("v_cache", L * B * C, KVD, dt),
                 tok=o.inout("tok", B, 1, f32), pos=o.inout("pos", B, 1, f32), logits=o.output("logits", B, V, f32))
        for name, rows, cols, dtype in (("x", B, H, xdt or dt), ("x2", B, H, xdt or dt), ("qkv", B, QD + 2 * KVD, dt),
                                        ("q", B * c.heads, D, dt), ("attn", B, QD, dt), ("hb", B, F, dt),
                                        ("o_part", B * J * c.heads, D, f32), ("ml_part", B * J * c.heads, 2, f32),
                                        ("best", B, self.nbv, f32), ("index", B, self.nbv, f32)):
            if name not in unused:  # (qkv: not with the projection's own RoPE)
                T[name] = o.temp(name, rows, cols, dtype)
        if S:
            T.update(o_span=o.temp("o_span", B * S * c.heads, D, f32),
                     ml_span=o.temp("ml_span", B * S * c.heads, 2, f32))
        if self.split is not None:  # the rank's candidate columns (data), the ranks' candidates
            T.update(vocab_place=o.input("vocab_place", 3, self.split.width, f32),
                     cand=o.temp("cand", B, self.split.width, f32))
        return T


# (DecodeTiling, spans and tile_rows: pto.orchestration.model.tiling, kept importable from here)
__all__ = ["DecodeTiling", "DecodeFunctions", "functions", "dot_tiles", "build_step", "vocab_split",
           "allreduce_dtype", "COMBINE_ROWS", "spans", "tile_rows"]
