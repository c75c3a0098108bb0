"""A whole model's quantized weights: which of a GGUF file's tensors stay as the file stores them
(:class:`KeepFileTypes`, the checkpoint loader's hook), pto's own quantization of float weights
at load (:func:`quantize_weights`), random quantized weights of a real shape (the benchmarks'),
what the decode step's weight inputs are stored as (:class:`WeightTypes`), dense copies (the
reference model's, and the prefill's, a layer at a time), and the bytes the weights hold and a
step reads.

A quantized matrix of :class:`~.checkpoint.ModelWeights` is a :class:`pto.quant.QTensor`,
output-major (``[out, in]``, as GGUF and ``nn.Linear`` store it: its blocks run along the
contraction), where a dense one is ``[in, out]``. The decode step stacks each kind of layer
matrix into one tensor (``w_qkv``: q, k and v; ``wo``, ``wg``, ``wu``, ``wd``: :data:`STACKED`,
their shapes :func:`weight_shapes`), so a kind stays
quantized only where all its matrices have one type that runs natively (Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, Q4_K, Q5_K, Q6_K); the others are dequantized at load, and the loader says which and why in one line.
The embedding and the LM head are two more inputs, each of its own type (a tied model's are one
tensor).

The checkpoint loader (:mod:`.checkpoint`) and the step's builder (:mod:`.decode`) import this
module, never the other way: what it makes of a :class:`~.checkpoint.ModelWeights` is a copy
(:func:`dataclasses.replace`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import torch
from pto.orchestration.llama.tiling import whole_blocks
from pto.orchestration.model.config import ModelConfig
from pto.orchestration.model.tiling import grouped_rows

from pto.errors import UsageError
from pto.ir.dtypes import DType, dtype_of
from pto.quant import QTensor, format_of_gguf
from pto.quant.planes import pack_rows

#: the decode step's stacked weight inputs, from the layers' matrices
STACKED = {"w_qkv": ("wq", "wk", "wv"), "wo": ("wo",), "wg": ("wg",), "wu": ("wu",), "wd": ("wd",)}
#: the matrices that must share a type: one stacked input, or two inputs of one task (gate, up)
SAME_TYPE = {"w_qkv": ("wq", "wk", "wv"), "wo": ("wo",), "wg and wu": ("wg", "wu"), "wd": ("wd",)}
MATRICES = tuple(m for ms in STACKED.values() for m in ms)
#: what ``--quantize`` takes: pto's quantizers (float weights in), and for random weights also
#: GGUF's other types (random blocks)
QUANTIZERS = ("fp8", "q8_0", "q4_0")
RANDOM_TYPES = ("fp8", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")


def is_quantized(t) -> bool:
    return isinstance(t, QTensor)


@dataclass
class KeepFileTypes:
    """The loader's hook for a GGUF file: which tensors to keep as the file stores them
    (:meth:`choose`); the others are dequantized, and :attr:`notes` says which and why (one
    entry per reason)."""

    notes: list[str] = field(default_factory=list)

    def choose(self, qtypes: dict[str, list[tuple[str, str]]]) -> set[str]:
        """The file's tensor names to keep quantized, from ``qtypes``: per layer input (``wq``,
        ..., ``emb``, ``lm_head``), its tensors' (name, GGUF type) in layer order."""
        keep: set[str] = set()
        groups = {kind: [nt for m in ms for nt in qtypes[m]] for kind, ms in SAME_TYPE.items()}
        groups.update({k: qtypes[k] for k in ("emb", "lm_head") if qtypes.get(k)})
        for kind, tensors in groups.items():
            types = {t for _, t in tensors}
            quantized = [(n, t) for n, t in tensors if t not in ("F32", "F16", "BF16")]
            if not quantized:
                continue
            foreign = sorted({t for _, t in quantized if format_of_gguf(t) is None})
            if foreign:
                self._note(quantized, f"{', '.join(foreign)} has no kernel in pto")
            elif len(types) > 1:
                self._note(quantized, f"the decode step needs {kind}'s {len(tensors)} matrices in one type (one "
                                      f"tensor, one task), and they are {' and '.join(sorted(types))}")
            else:
                keep.update(n for n, _ in tensors)
        return keep

    def _note(self, tensors: list[tuple[str, str]], why: str) -> None:
        names = [n for n, _ in tensors]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        self.notes.append(f"{shown} ({len(names)} tensors): dequantized at load: {why}")


@dataclass(frozen=True)
class WeightTypes:
    """What each weight input of the decode step is stored as: the stacked kinds
    (:data:`STACKED`), ``emb`` and ``lm_head``; a kind not named is dense (the step's dtype)."""

    types: tuple[tuple[str, DType], ...] = ()

    def get(self, kind: str, dense: DType) -> DType:
        return dict(self.types).get(kind, dense)

    @property
    def quantized(self) -> bool:
        return bool(self.types)

    def blocks(self, kinds: Iterable[str]) -> int:
        """The largest block of the quantized types of ``kinds`` (1: none quantized): a K step
        of their GEMVs is whole blocks."""
        return max((d.quant.block for k, d in self.types if k in kinds), default=1)

    def to_json(self) -> dict[str, str]:
        return {k: d.short for k, d in self.types}

    @staticmethod
    def of_spec(spec: str) -> WeightTypes:
        """``LAYERS[/HEAD]`` (type names, e.g. ``q4_k/q6_k``): every stacked kind (:data:`STACKED`)
        of type LAYERS, the LM head of HEAD (of LAYERS where none is given), the embedding dense;
        a name that is no type is :func:`~pto.ir.dtypes.dtype_of`'s BuildError."""
        layers, _, head = spec.partition("/")
        kinds = {k: dtype_of(layers) for k in STACKED} | {"lm_head": dtype_of(head or layers)}
        return WeightTypes(tuple(sorted(kinds.items())))

    @staticmethod
    def of(w) -> WeightTypes:
        """The types of ``w``'s (:class:`~.checkpoint.ModelWeights`) step inputs (each kind's
        matrices share a type: :class:`KeepFileTypes`, :func:`quantize_weights`)."""
        out = {}
        for kind, ms in STACKED.items():
            mats = [layer[m] for layer in w.layers for m in ms]
            if all(is_quantized(t) for t in mats) and len({t.dtype for t in mats}) == 1:
                out[kind] = mats[0].dtype
            elif any(is_quantized(t) for t in mats):
                raise UsageError(f"the layers' {kind} matrices mix quantized and dense ones, or types; the decode step "
                                 "stacks them in one tensor of one type")
        for kind, t in (("emb", w.embedding), ("lm_head", w.lm_head)):
            if is_quantized(t):
                out[kind] = t.dtype
        return WeightTypes(tuple(sorted(out.items())))


#: every weight dense
DENSE = WeightTypes()


def weight_shapes(cfg: ModelConfig, wt: bool) -> dict[str, tuple[int, int]]:
    """One layer's ``(K, N)`` of each stacked weight kind: the layers' blocks are ``K`` rows of
    ``N`` (``N`` rows of ``K`` when output-major, ``wt``)."""
    c = cfg.layer
    H, QD, KVD, F = c.hidden, c.q_dim, c.kv_dim, c.ffn
    kn = {"w_qkv": (H, QD + 2 * KVD), "wo": (QD, H), "wg": (H, F), "wu": (H, F), "wd": (F, H)}
    return {k: (n, kk) if wt else (kk, n) for k, (kk, n) in kn.items()}


def dense(t, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A weight as the dense layout of :class:`~.checkpoint.ModelWeights` (a quantized matrix
    dequantized and transposed to ``[in, out]``; the embedding and a tied head are
    :func:`dense_weights`' business)."""
    if not is_quantized(t):
        return t if dtype is None else t.to(dtype)
    return t.dequantize(dtype or torch.float32).t()


def dense_weights(w, dtype: torch.dtype | None = None):
    """``w`` with every quantized tensor dequantized (the dense layout; in ``dtype``, by default
    ``w``'s): what the reference model computes with."""
    dt = dtype or w.dtype
    emb = w.embedding.dequantize(dt) if is_quantized(w.embedding) else w.embedding.to(dt)
    if w.config.tied:
        head = emb.t()
    else:
        head = dense(w.lm_head, dt)
    layers = [{k: dense(v, dt) for k, v in layer.items()} for layer in w.layers]
    return replace(w, embedding=emb, norm=w.norm.to(dt), lm_head=head, layers=layers)


def embedding_rows(emb, tokens: torch.Tensor) -> torch.Tensor:
    """The embedding's rows of ``tokens`` (dequantized where it is quantized)."""
    if is_quantized(emb):
        return emb.take_rows(tokens.to(emb.device)).dequantize()
    return emb[tokens]


def matrix_rows(cfg: ModelConfig, kind: str) -> list[tuple[str, int, int]]:
    """Where each matrix of stacked ``kind`` is in one layer's output-major block: (matrix,
    first row, rows); q, k and v one after the other."""
    c = cfg.layer
    widths = {"wq": c.q_dim, "wk": c.kv_dim, "wv": c.kv_dim}
    out, at = [], 0
    for m in STACKED[kind]:
        n = widths.get(m, weight_shapes(cfg, True)[kind][0])
        out.append((m, at, n))
        at += n
    return out


def layer_wtypes(wtypes: WeightTypes) -> tuple[tuple[str, DType], ...]:
    """The layer program's quantized matrices (``LayerForm.wtypes``) of the step's ``wtypes``."""
    return tuple((m, d) for kind, d in wtypes.types if kind in STACKED for m in STACKED[kind])


def stored_layer(step: dict[str, torch.Tensor], wtypes: WeightTypes, cfg: ModelConfig, layer: int
                 ) -> dict[str, torch.Tensor]:
    """Layer ``layer``'s quantized matrices as stored, for the layer program of quantized weights
    (``LayerForm.wtypes``): views of the decode step's stacked tensors ``step`` (output-major rows
    of blocks; each kind ``rows`` rows a layer), nothing copied or dequantized."""
    shapes, out = weight_shapes(cfg, True), {}
    for kind, _ in wtypes.types:
        if kind in STACKED:
            r0 = layer * shapes[kind][0]
            out.update({m: step[kind][r0 + at:r0 + at + n] for m, at, n in matrix_rows(cfg, kind)})
    return out


#: the bytes of dense matrices the prefill's dequantizer keeps at once: as many layers' matrices
#: as fit are made dense by one launch a kind (SmolLM2 in bf16: 9 layers a span, 20 launches a
#: prefill where a layer at a time took 150; its 512-token prefill on an H200 waits on the host,
#: 12.8-13.3 ms at one layer a span, 8.8-10.7 at 9 or 30: docs/PERF.md); a layer larger than this
#: (the 8B's 436 MB in bf16) one at a time
DEQUANT_BUDGET = 64 << 20


class LayerDequantizer:
    """Each layer's quantized matrices made dense for the prefill's layer program (``[in, out]``
    views of ``dtype``), from the decode step's stacked tensors ``step`` on their device (nothing
    copied from the host), by ``backend`` (a :class:`pto.backends.Backend`: on a GPU the format's
    Triton helper, the GEMVs' own dequantization; on the CPU the routine on whole rows,
    :meth:`pto.quant.QTensor.dequantize`, ten times faster than the evaluator's tiles).

    The layers go in spans of :attr:`span` consecutive layers, as many as ``budget`` bytes of
    dense matrices hold (at least one): a layer's first call in a span makes the whole span's
    matrices dense, one prepared launch per kind (kept: a prefill replays them), into one buffer
    per kind, overwritten by the next span's (the layer program copies its inputs in first, and
    the launches run in order on the device)."""

    def __init__(self, backend, wtypes: WeightTypes, step: dict[str, torch.Tensor], cfg, dtype: DType,
                 launches: bool | None = None, budget: int | None = None):
        self.backend, self.step, self.cfg, self.dtype = backend, step, cfg, dtype
        #: through the backend's launches (None: where the weights are on a GPU)
        self.use_launches = launches if launches is not None else step["w_qkv"].device.type == "cuda"
        self.kinds = {k: d for k, d in wtypes.types if k in STACKED}
        self.shapes = weight_shapes(cfg, True)
        layer_bytes = sum(r * c for r, c in (self.shapes[k] for k in self.kinds)) * dtype.torch.itemsize
        #: layers made dense together
        budget = DEQUANT_BUDGET if budget is None else budget
        self.span = max(1, min(cfg.layers, budget // max(1, layer_bytes)))
        dev = step["w_qkv"].device
        self.buffers = {k: torch.empty(self.span * self.shapes[k][0], self.shapes[k][1], dtype=dtype.torch,
                                       device=dev) for k in self.kinds}
        self.launches: dict[tuple[str, int], object] = {}  # by kind and a span's first layer
        self.functions: dict[tuple[str, int], object] = {}  # by kind and layers
        self.dense_span: int | None = None  # the first layer of the span the buffers hold
        self.views: dict[int, dict[str, torch.Tensor]] = {}

    @property
    def nbytes(self) -> int:
        """The bytes of its dense buffers (kept for the Generator's life: a prefill replays the
        prepared launches into them)."""
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def __call__(self, layer: int) -> dict[str, torch.Tensor]:
        first = layer - layer % self.span
        if self.dense_span != first:
            n = min(self.span, self.cfg.layers - first)
            for kind in self.kinds:
                self._dequantize(kind, first, n)
            self.dense_span = first
        out = self.views.get(layer)
        if out is None:  # (views of the buffers, the same for every span: made once a layer)
            out = self.views[layer] = {}
            for kind in self.kinds:
                rows = self.shapes[kind][0]
                block = self.buffers[kind][(layer - first) * rows:(layer - first + 1) * rows].t()
                for m, at, n in matrix_rows(self.cfg, kind):
                    out[m] = block[:, at:at + n]
        return dict(out)

    def _dequantize(self, kind: str, first: int, layers: int) -> None:
        rows, cols = self.shapes[kind]
        if not self.use_launches:  # the routine on whole rows: one op per plane
            block = QTensor(self.kinds[kind], self.step[kind][first * rows:(first + layers) * rows], cols)
            self.buffers[kind][:layers * rows].copy_(block.dequantize())
            return
        launch = self.launches.get((kind, first))
        if launch is None:
            launch = self.launches[(kind, first)] = self._prepare(kind, first, layers)
        launch()

    def _prepare(self, kind: str, first: int, layers: int):
        from pto.incore.dequantize import dequantize_rows, dequantize_tile_shape

        from pto.data.batch import RegionBatch, TaskBatch
        from pto.ir.analysis import specialize

        rows, cols = self.shapes[kind]
        rows *= layers
        fn = self.functions.get((kind, layers))
        if fn is None:  # one function per kind and span length (every span's block has its shape)
            d = self.kinds[kind]
            br, bk = dequantize_tile_shape(d.quant.block, cols)
            fn = self.functions[(kind, layers)] = specialize(dequantize_rows(d, self.dtype, rows, cols, bk, br=br))

        def region(t: torch.Tensor, r0: int) -> RegionBatch:
            return RegionBatch(t, *(torch.tensor([v]) for v in (r0, 0, rows, cols)))

        mems = {"w": region(self.step[kind], first * self.shapes[kind][0]), "y": region(self.buffers[kind], 0)}
        return self.backend.prepare(TaskBatch(fn, mems, {}, 1))


def quantize_weights(w, qtype: str, embedding: bool = False):
    """``w`` with every layer matrix and the LM head (and, with ``embedding``, the embedding;
    a tied head goes with it) quantized by pto to ``qtype`` (fp8, q8_0, q4_0)."""
    dt = dtype_of(qtype)
    if qtype not in QUANTIZERS:
        raise UsageError(f"--quantize {qtype}: pto quantizes to {', '.join(QUANTIZERS)} (a GGUF file keeps its own "
                         "types)")

    def q(t: torch.Tensor) -> QTensor:  # [in, out] -> output-major rows of blocks along `in`
        _check_blocks(dt, t.shape[0], qtype)
        return QTensor.quantize(dt, t.t().contiguous())

    layers = [{k: q(v) if k in MATRICES else v for k, v in layer.items()} for layer in w.layers]
    emb = QTensor.quantize(dt, w.embedding) if embedding else w.embedding
    if w.config.tied:
        head = emb if embedding else w.lm_head
    else:
        head = q(w.lm_head)
    return replace(w, embedding=emb, lm_head=head, layers=layers)


def _check_blocks(dt: DType, cols: int, what: str) -> None:
    if cols % dt.quant.block:
        raise UsageError(f"--quantize {what}: a row of {cols} inputs is not whole blocks of {dt.quant.block}")


def random_quantized(dtype: DType, rows: int, cols: int, scale: float, g: torch.Generator) -> QTensor:
    """A ``rows x cols`` matrix of random blocks of ``dtype`` whose values have about the
    standard deviation ``scale`` (every field random: quantized values uniform, scales around
    what a quantizer would pick), made on the generator's device: the benchmarks' weights of a
    real shape in a type pto does not quantize to itself (q4_k, q5_k, q6_k, q4_1, q5_0, q5_1)."""
    fmt = dtype.quant
    _check_blocks(dtype, cols, dtype.short)
    dev = g.device

    def ints(bits: int, n: int, signed: bool = False) -> torch.Tensor:
        v = torch.randint(0, 1 << bits, (rows, n), generator=g, device=dev)
        return (v - (1 << (bits - 1))).to(torch.int8) if signed else v.to(torch.uint8)

    fields = {}
    for p in fmt.planes:
        n = 1 if p.header else cols // p.group
        if p.kind in ("u", "i"):  # (a k-quant's sub-block scales and minimums: 6 bits, unpacked)
            six = fmt.name in ("q4_k", "q5_k") and p.name in ("sc", "m")
            fields[p.name] = ints(6 if six else p.bits, n, p.kind == "i")
        elif p.kind == "e4m3":
            x = torch.randn(rows, n, generator=g, device=dev) * 150
            fields[p.name] = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        else:
            fields[p.name] = torch.full((rows, n), 1.0, device=dev)
    # scales chosen so the weights' standard deviation is about `scale`: the quantized values'
    # spread times each format's scale factors
    spread = {"q4_0": 4.6, "q4_1": 4.6, "q5_0": 9.2, "q5_1": 9.2, "q8_0": 74.0, "q4_k": 4.6 * 32, "q5_k": 9.2 * 32,
              "q6_k": 18.5 * 74, "fp8": 150.0}[fmt.name]
    for name in ("d", "s"):
        if name in fields:
            fields[name] = fields[name] * (scale / spread)
    # the minimums: the quantized values' mean (their element planes' bits together), so that the
    # weights centre near 0: a k-quant's dmin, or the block's f16 minimum (q4_1, q5_1)
    mid = (2 ** sum(p.bits for p in fmt.planes if p.group == 1) - 1) / 2
    if "dmin" in fields:
        fields["dmin"] = fields["d"] * mid
    elif "m" in fields and fmt.plane("m").kind == "f16":
        fields["m"] = fields["d"] * -mid
    return QTensor(dtype, pack_rows(fmt, fields, cols), cols)


def random_quantized_weights(w, qtype: str, g: torch.Generator, embedding: bool = False):
    """``w``'s layer matrices and LM head replaced by random blocks of ``qtype`` of the same
    shapes and scale (:func:`random_quantized`; pto's own quantizers where they apply, which are
    faster to make and closer to real weights)."""
    dt = dtype_of(qtype)
    if qtype in QUANTIZERS:
        return quantize_weights(w, qtype, embedding)

    def q(t: torch.Tensor) -> QTensor:
        return random_quantized(dt, t.shape[1], t.shape[0], t.shape[0] ** -0.5, g)

    layers = [{k: q(v) if k in MATRICES else v for k, v in layer.items()} for layer in w.layers]
    emb = random_quantized(dt, *w.embedding.shape, 1.0, g) if embedding else w.embedding
    head = (emb if embedding else w.lm_head) if w.config.tied else q(w.lm_head)
    return replace(w, embedding=emb, lm_head=head, layers=layers)


def weight_bytes(w) -> dict[str, int]:
    """Bytes of ``w``'s tensors: ``resident`` (what they hold, a tied head once) and
    ``step_read`` (what one decode step reads of them: every layer and the LM head, of the
    embedding a row per sequence, left out)."""
    def nbytes(t) -> int:
        return t.nbytes if is_quantized(t) else t.numel() * t.element_size()

    layers = sum(nbytes(t) for layer in w.layers for t in layer.values())
    emb, norm, head = nbytes(w.embedding), nbytes(w.norm), nbytes(w.lm_head)
    return {"resident": layers + emb + norm + (0 if w.config.tied else head), "step_read": layers + norm + head}


#: LM-head formats whose GEMV takes shorter K steps than :attr:`~.tiling.DecodeTiling.quant_tiles`'
#: ``lm_bk`` where those tiles apply (one sequence, or up to ``quant_rows``): Q6_K's head (Q4_K_M
#: and Q5_K_M files have one) in the 8B model at steps of 2,048 runs 254 registers, two programs a
#: multiprocessor, at 1,024 128 and four (the 1B's head in two steps of 1,024 against one of 2,048:
#: 99.8 against 122.3 us; 78.8 since its two steps take four warps, ``kernel.STREAM_TRIPS``). On
#: an H200 the 8B's Q6_K head took 140.5-141.0 us against 168.5-168.8 a step at 2,048 (the step
#: 1.888-1.900 against 1.908 ms); Q8_0's and fp8's heads lose there (157.8-158.6 against
#: 156.3-156.9 us, 141.9-143.5 against 136.2-136.5): docs/PERF.md, "Twenty-seventh session"
HEAD_STEPS = {DType.Q6_K: 1024}


def for_weights(t, wtypes: WeightTypes, rows: int = 1):
    """The decode tiling ``t`` (:class:`~.tiling.DecodeTiling`) fitted to quantized weights for
    a step of ``rows`` sequences: for one (or up to :attr:`~.tiling.DecodeTiling.quant_rows`,
    whose rows read by groups as one's do), its :attr:`~.tiling.DecodeTiling.quant_tiles` (the
    GEMVs they were measured for; more sequences take the dot path's tiles, where the LM head's
    long K step would hold 16 padded rows of it); output-major matrices (the GEMVs) and LM head,
    and contraction steps of whole blocks (fewer outputs a tile where a step grows)."""
    if not wtypes.quantized:
        return t
    if t.quant_tiles and (rows == 1 or rows <= grouped_rows(t, True)):
        # (applied once: a tiling fitted again keeps what was set since)
        tiles = dict(t.quant_tiles)
        head_step = HEAD_STEPS.get(wtypes.get("lm_head", None))
        if "lm_bk" in tiles and head_step:  # (not where the user set lm_bk: it is then not in quant_tiles)
            tiles["lm_bk"] = min(tiles["lm_bk"], head_step)
        t = replace(t, **tiles, quant_tiles=())
    layers = wtypes.blocks(STACKED)
    head = wtypes.blocks(("lm_head",))

    def steps(v):
        return None if v is None else max(v, layers) // layers * layers

    # a step grown to whole blocks (a CPU's K steps of 192 for 256-element blocks): fewer outputs
    # a tile (a power of two), so that its weights and their packed blocks fit where the tile did
    bn, bk = whole_blocks(t.bn, t.bk, layers)
    out = replace(t, wt=True, bn=bn, bk=bk, dot_bk=steps(t.dot_bk), qkv_bk=steps(t.qkv_bk), o_bk=steps(t.o_bk),
                  ffn_bk=steps(t.ffn_bk))
    if head > 1:  # the head's GEMV: whole blocks a step, a tile of about as many weights as before
        lm_bk = max(t.lm_bk, head) // head * head
        out = replace(out, lm_wt=True, lm_bk=lm_bk, bv=max(16, t.bv * t.lm_bk // lm_bk))
    return out


__all__ = ["KeepFileTypes", "WeightTypes", "DENSE", "SAME_TYPE", "STACKED", "weight_shapes",
           "MATRICES", "QUANTIZERS", "RANDOM_TYPES", "is_quantized", "dense", "dense_weights", "embedding_rows",
           "LayerDequantizer", "matrix_rows", "layer_wtypes", "stored_layer", "quantize_weights", "random_quantized",
           "random_quantized_weights", "weight_bytes", "HEAD_STEPS", "for_weights"]
