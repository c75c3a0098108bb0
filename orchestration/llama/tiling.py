"""Tile sizes of the LLaMA layer from the target's on-chip memory, and its InCore functions.

The flash-attention block (Q, K, V, O and the score tile S) decides the q tile height
(:func:`flash_tile_rows`); :func:`choose_tiling` derives every other size from it;
:func:`fit_functions` builds the functions (:class:`Functions`) and, where the builder's SRAM
check refuses one, retries with lower tiles and narrower column blocks. ``MAX_RANGE`` and
:func:`loop_attrs` are the binary-expansion attributes of the layer's row-tile loops (the closed
forms of :mod:`.counts` read the same ``MAX_RANGE``).

Grouped-query attention changes no block: a program of the attention functions holds one query
head and the key/value head it reads, so the model counts one head's Q, K, V, O and S whatever
the number of key/value heads (the k and v projections and k's RoPE are narrower, their own
functions where the head count differs). A sliding window adds one f32 TQ x TK bias tile to the
attention functions, which the builder's check of live tiles counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from pto.incore.attention import (
    Mask,
    flash_fused,
    flash_fused_nc,
    flash_fused_swa,
    flash_init,
    flash_normalize,
    flash_output,
    flash_pair,
    flash_score,
    flash_softmax,
)
from pto.incore.collective import matmul_allreduce_residual_tile
from pto.incore.elementwise import residual_add, swiglu_tile
from pto.incore.fused import (
    Fold,
    Heads,
    matmul_norm_rope_k_tile,
    matmul_norm_rope_tile,
    matmul_norm_swiglu_tile,
    matmul_norm_tile,
)
from pto.incore.matmul import (
    matmul_nk_residual_tile,
    matmul_nk_swiglu_tile,
    matmul_nk_tile,
    matmul_residual_tile,
    matmul_swiglu_tile,
    matmul_tile,
)
from pto.incore.norm import rms_scale_tile, rmsnorm_tile
from pto.incore.rope import rope_tile
from pto.orchestration.llama.config import LlamaConfig

from pto.errors import SramError, UsageError
from pto.ir.dtypes import DType
from pto.machine.target import KiB, Target
from pto.passes.expansion.binary_expansion import tile_levels

MAX_RANGE = 4096  # base tiles in one full block of binary expansion (128K tokens of 32 rows)


def flash_sram_bytes(rows: int, head_dim: int, dtype: DType) -> int:
    """On-chip bytes of one flash-attention block: Q, K, V, O (rows x d each) and S (rows x rows),
    so S grows quadratically and caps the tile height."""
    return (4 * rows * head_dim + rows * rows) * dtype.itemsize


def flash_tile_rows(target: Target, head_dim: int, dtype: DType, candidates=(256, 128, 64, 32, 16)) -> int:
    """The largest tile height whose flash-attention block fits the target's on-chip memory."""
    for r in candidates:
        if flash_sram_bytes(r, head_dim, dtype) <= target.sram_bytes:
            return r
    raise SramError(f"no flash-attention tile of {list(candidates)} rows with head dim {head_dim} "
                    f"({dtype}) fits the {target.sram_bytes // KiB} KiB of target {target.name}")


@dataclass(frozen=True)
class LlamaTiling:
    """Tile sizes of every function, derived from the target's on-chip memory."""

    base: int  # base tile height (residual tiles)
    tq: int  # q (and row) tile height
    tk: int  # kv tile height
    bn: int  # matmul output column block
    bk: int  # matmul K step
    norm_rows: int  # RMSNorm rows per program
    norm_chunk: int  # RMSNorm columns per pass step
    ew_block: int  # elementwise column block


def choose_tiling(cfg: LlamaConfig, dtype: DType, target: Target, tq: int | None = None,
                  shrink: int = 1, tk: int | None = None, whole: bool = False) -> LlamaTiling:
    """Tiles for ``target``: the q tile height from the flash-attention SRAM model (or ``tq``),
    kv tiles of ``tk`` rows (default: as tall as the q tiles); ``shrink`` divides the column
    blocks for targets with little on-chip memory. ``whole``: the base tile is the q tile (every
    row tile as tall, the last one clipped), else binary expansion's blocks of base tiles with a
    residual of the base height."""
    if tq is None:
        tq = min(flash_tile_rows(target, cfg.head_dim, dtype), 128)
    tk = tq if tk is None else min(tk, tq)
    base = tq if whole else 32 if tq > 32 else max(tq // 2, 8)
    big = cfg.hidden >= 1024
    # 128 x 256 output blocks for the GEMMs where they fit (Hopper's shared memory, half types)
    wide = big and dtype.is_half and target.sram_bytes >= 200 * 1024
    # RMSNorm (and its statistics alone): on such a GPU two rows a program, up to 4096 columns a
    # step (a divisor of the width), for many programs with large loads each (bench/norm_probe.py:
    # 0.026 against 0.036 ms at 4096 tokens of 4096, 0.097 against 0.140 at 16384)
    norm_rows, chunk = (2, _divisor(cfg.hidden, 4096)) if wide else (16, min(512 if big else 128, cfg.hidden))
    return LlamaTiling(
        base=base, tq=tq, tk=tk,
        bn=max((256 if wide else 128 if big else 64) // shrink, 16), bk=max((64 if big else 32) // shrink, 16),
        norm_rows=norm_rows, norm_chunk=max(chunk // shrink, 16),
        ew_block=max((128 if big else 64) // shrink, 16),
    )


def _divisor(n: int, most: int) -> int:
    """The largest power of two up to ``most`` that divides ``n``; where that is under 512 (a
    width with few factors of two, 3200 say), the power of two up to ``most`` that covers ``n``
    in the fewest steps (the last one masked), not many small ones."""
    c = most
    while c > 512 and n % c:
        c //= 2
    return c if n % c == 0 else min(most, 1 << (n - 1).bit_length())


def loop_attrs(base: int, top: int) -> dict:
    """Binary-expansion attributes of a loop over base tiles whose tallest tile is ``top`` rows."""
    levels = tile_levels(base, top)
    if len(levels) == 1:
        return dict(tile_levels=levels)
    return dict(tile_levels=levels, max_range=MAX_RANGE, min_range=2)


@dataclass(frozen=True)
class LayerForm:
    """Which layer the functions compute: ``causal`` or bidirectional attention at ``attention``
    granularity (``split``, ``pair`` or ``fused``); ``fuse`` (fused attention only): RMSNorm folded
    into the projections, RoPE into q and k's; ``tp`` > 1: one rank's share of the layer split
    over ``tp`` ranks, its all-reduces summing in ``reduce_dt``; ``whole`` (fused attention
    only): every row tile the q tile's height, the last one clipped, instead of binary
    expansion's residual tiles of the base height (:func:`choose_tiling`); ``kv_out``: the keys
    after RoPE and the values are outputs of the module (:data:`~.llama7b.KV_OUTPUTS`: what a
    prefill fills a decode cache from), not temporaries; ``wtypes``: the weight matrices (``wq``,
    ``wk``, ``wv``, ``wo``, ``wg``, ``wu``, ``wd``) stored block-quantized, each with its type:
    the module takes them output-major (``[out, in]``, as stored) and their projections are the
    ``matmul_nk_*`` functions, whose loads dequantize the tiles (no dense copy); unfused, one
    rank only (:meth:`Functions.projection`).

    On a GPU a residual tile is a kernel of its own in every phase: it reads every weight again
    for a few rows, with a few programs (the 7B layer at 1,537 tokens took 1.90 ms against 0.80
    at 1,024, docs/PERF.md). Whole tiles put the last rows in the phase's one kernel, at the
    price of computing the clipped tile's padding rows."""

    attention: str = "fused"
    causal: bool = True
    fuse: bool = False
    tp: int = 1
    reduce_dt: DType = DType.F32
    whole: bool = False
    kv_out: bool = False
    wtypes: tuple[tuple[str, DType], ...] = ()

    def wtype(self, matrix: str) -> DType | None:
        """The quantized type ``matrix`` is stored in (None: dense, ``[in, out]``)."""
        return dict(self.wtypes).get(matrix)


def allreduce_dtype(dtype: DType, choice: str) -> DType:
    """The dtype the ranks' partial sums are summed in (:attr:`LayerForm.reduce_dt`, the programs'
    ``--allreduce-dtype``): the storage ``dtype`` (``choice`` "storage", as Megatron) or f32."""
    from pto.errors import UsageError

    if choice not in ("storage", "f32"):
        raise UsageError(f"--allreduce-dtype {choice!r}: expected storage or f32")
    return dtype if choice == "storage" else DType.F32


def whole_blocks(bn: int, bk: int, block: int) -> tuple[int, int]:
    """A GEMM's output block and K step fitted to a quantized weight of ``block``-element blocks:
    the step whole blocks (rounded down, at least one), and where it grew, fewer outputs (a power
    of two) so that a tile holds about as many weights as before."""
    k = max(bk, block) // block * block
    return (bn if k <= bk else 1 << max(bn * bk // k, 1).bit_length() - 1), k


def rope_heads(heads: int, head_dim: int, bn: int) -> int:
    """Heads per program of the q/k projection with RoPE in its epilogue: as many as one of the
    GEMMs' output column blocks holds (``bn`` columns), down to a divisor of ``heads``."""
    hp = max(1, bn // head_dim)
    while heads % hp:
        hp -= 1
    return hp


class Functions:
    """The InCore functions of one (config, dtype, tiling, target, layer form)."""

    def __init__(self, cfg: LlamaConfig, dt: DType, t: LlamaTiling, target: Target, form: LayerForm):
        causal, attention, fuse, tp, reduce_dt = form.causal, form.attention, form.fuse, form.tp, form.reduce_dt
        H, NH, D, Fd = cfg.hidden, cfg.heads, cfg.head_dim, cfg.ffn
        NKV, W = cfg.kv_heads, cfg.window if causal else None
        gqa = dict(kv_heads=NKV) if NKV != NH else {}
        tg = target
        self.rmsnorm = rmsnorm_tile(H, dt, t.tq, t.norm_rows, t.norm_chunk, cfg.eps, tg)
        # one matmul definition; calls bind K and N (dims) per weight
        self.matmul = matmul_tile(dt, t.tq, H, H, t.bn, t.bk, tg)
        self.rope = rope_tile(dt, t.tq, NH, D, target=tg)
        # k's RoPE over the key/value heads (the same function when there are as many)
        self.rope_k = rope_tile(dt, t.tq, NKV, D, target=tg, name="rope_k_tile") if NKV != NH else self.rope
        #: (role, matrix) -> the matmul_nk_* function of a quantized matrix (:meth:`projection`)
        self._nk: dict[tuple[str, str], object] = {}
        if form.wtypes:
            self._quantized(cfg, dt, t, tg, form)
        if tp > 1:  # the row-parallel projections: their partial products summed over the ranks, plus the
            # residual, one task a row tile
            self.matmul_allreduce_residual = matmul_allreduce_residual_tile(dt, t.tq, H, H, t.bn, t.bk,
                                                                            acc=reduce_dt, target=tg)
        if attention == "fused":
            # the coarse-grained layer: epilogue fusions as well as the fused attention
            if fuse:  # and the norms folded into the projections after them (their gains into the
                # weights, each row's scale from a statistics task), RoPE into q and k's
                self.rms_scale = rms_scale_tile(H, dt, t.tq, t.norm_rows, t.norm_chunk, cfg.eps, tg)
                fold = Fold(cfg.eps, "stats")
                self.matmul_norm = matmul_norm_tile(dt, t.tq, H, cfg.kv_dim, t.bn, t.bk, fold, tg)
                self.matmul_norm_rope = matmul_norm_rope_tile(dt, t.tq, H, Heads(NH, D, rope_heads(NH, D, t.bn)),
                                                              t.bk, fold, tg)
                self.matmul_norm_rope_k = self.matmul_norm_rope if NKV == NH else matmul_norm_rope_k_tile(
                    dt, t.tq, H, Heads(NKV, D, rope_heads(NKV, D, t.bn)), t.bk, fold, tg)
                self.matmul_norm_swiglu = matmul_norm_swiglu_tile(dt, t.tq, H, Fd, t.bn // 2, t.bk, fold, tg)
            self.matmul_residual = matmul_residual_tile(dt, t.tq, H, H, t.bn, t.bk, tg)
            self.matmul_swiglu = matmul_swiglu_tile(dt, t.tq, H, Fd, t.bn // 2, t.bk, tg)
            if W:
                self.fused = flash_fused_swa(dt, NH, D, t.tq, t.tk, W, tg, **gqa)
            else:
                self.fused = (flash_fused if causal else flash_fused_nc)(dt, NH, D, t.tq, t.tk, tg, **gqa)
            return
        self.residual = residual_add(dt, t.tq, H, t.ew_block, tg)
        self.swiglu = swiglu_tile(dt, t.tq, Fd, t.ew_block, tg)
        self.init = flash_init(NH, D, t.tq, tg)
        self.normalize = flash_normalize(dt, NH, D, t.tq, tg)
        if attention == "pair":
            self.pair = flash_pair(dt, NH, D, t.tq, t.tk, Mask(causal, W), tg, **gqa)
        else:
            self.score = flash_score(dt, NH, D, t.tq, t.tk, Mask(causal, W), tg, **gqa)
            self.softmax = flash_softmax(NH, t.tq, t.tk, tg)
            self.output = flash_output(dt, NH, D, t.tq, t.tk, tg, **gqa)


    def _quantized(self, cfg: LlamaConfig, dt: DType, t: LlamaTiling, tg: Target, form: LayerForm) -> None:
        """The projections against quantized weights (:attr:`LayerForm.wtypes`): one ``matmul_nk_*``
        function per role and type, its K step whole blocks (:func:`whole_blocks`)."""
        asked = ", ".join(f"{m} {d.short}" for m, d in form.wtypes)
        if form.fuse:
            raise UsageError(f"quantized layer weights ({asked}) run in the unfused layer only, not with the norms "
                             "folded into the projections (--fuse-norm-rope)")
        if form.tp > 1:
            raise UsageError(f"quantized layer weights ({asked}) run on one rank, not with --tp {form.tp}")
        fused = form.attention == "fused"
        H, QD, Fd = cfg.hidden, cfg.q_dim, cfg.ffn
        # each matrix's contraction and the role its projection has in this form
        roles = {"wq": (H, "matmul"), "wk": (H, "matmul"), "wv": (H, "matmul"),
                 "wo": (QD, "residual" if fused else "matmul"), "wg": (H, "swiglu" if fused else "matmul"),
                 "wu": (H, "swiglu" if fused else "matmul"), "wd": (Fd, "residual" if fused else "matmul")}
        if fused and form.wtype("wg") != form.wtype("wu"):
            raise UsageError(f"quantized layer weights ({asked}): the gate and up projections are one task and "
                             "need wg and wu in one type")
        made: dict[tuple[str, str], object] = {}  # one function per role and type
        for m, d in form.wtypes:
            if m not in roles:
                raise UsageError(f"quantized layer weights ({asked}): {m} is no weight matrix of the layer "
                                 f"(expected {', '.join(roles)})")
            K, role = roles[m]
            block = d.quant.block
            if K % block:
                raise UsageError(f"quantized layer weights ({asked}): {m}'s rows of {K} inputs are not whole "
                                 f"blocks of {d.short} ({block})")
            if (role, d.short) not in made:
                made[(role, d.short)] = self._nk_function(role, d, cfg, dt, t, tg)
            self._nk[(role, m)] = made[(role, d.short)]

    @staticmethod
    def _nk_function(role: str, d: DType, cfg: LlamaConfig, dt: DType, t: LlamaTiling, tg: Target):
        H, Fd = cfg.hidden, cfg.ffn
        if role == "swiglu":
            bn, bk = whole_blocks(t.bn // 2, t.bk, d.quant.block)
            return matmul_nk_swiglu_tile(dt, t.tq, H, Fd, bn, bk, d, tg, name=f"matmul_nk_swiglu_{d.short}_tile")
        bn, bk = whole_blocks(t.bn, t.bk, d.quant.block)
        if role == "residual":
            return matmul_nk_residual_tile(dt, t.tq, H, H, bn, bk, d, tg, name=f"matmul_nk_residual_{d.short}_tile")
        return matmul_nk_tile(dt, t.tq, H, H, bn, bk, d, tg, name=f"matmul_nk_{d.short}_tile")

    def projection(self, role: str, matrix: str):
        """The function of ``role`` (``matmul``, ``residual``: with the residual in the epilogue,
        ``swiglu``: the gate's and up's) against weight ``matrix``: its ``matmul_nk_*`` function
        where it is quantized, else the dense one."""
        fn = self._nk.get((role, matrix))
        if fn is not None:
            return fn
        return {"matmul": self.matmul, "residual": getattr(self, "matmul_residual", None),
                "swiglu": getattr(self, "matmul_swiglu", None)}[role]


def fit_functions(cfg: LlamaConfig, dt: DType, target: Target, form: LayerForm):
    """The tiling and functions: the SRAM model's q tile height, kv tiles as tall or 64 rows,
    narrower column blocks, then halved, until every function's live tiles fit the target (the
    model counts Q, K, V, O and S in the storage dtype; the functions also keep f32 scores and
    statistics). ``cfg`` is one rank's layer with ``form.tp`` > 1 (:meth:`LlamaConfig.shard`), whose
    all-reduces sum in ``form.reduce_dt`` (f32, or the storage dtype: half the bytes)."""
    tq = min(flash_tile_rows(target, cfg.head_dim, dt), 128)
    last = None
    while tq >= 8:
        for tk in sorted({tq, min(tq, 64)}, reverse=True):  # the tallest kv tiles that fit
            for shrink in (1, 2, 4, 8):
                t = choose_tiling(cfg, dt, target, tq, shrink, tk, form.whole)
                try:
                    return t, Functions(cfg, dt, t, target, form)
                except SramError as e:
                    last = e
        tq //= 2
    raise last
