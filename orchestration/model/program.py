"""``model``: one decode step of a whole LLaMA-family model as a program (``pto run model``, ``pto
estimate model``, ``pto graph model``), and the program ``pto generate`` drives.

The shape is the batch (sequences decoded together) and the cache capacity (slots per
sequence); a step's position and token id are device data (:mod:`.decode`). The configuration
is built in (random weights of a real model's shape) or read with the weights from a GGUF file
or a Hugging Face folder (``--weights``). ``pto run model --check`` runs one step from a cache
filled with random keys and values at random positions and compares the logits, the chosen
token and the next position with :class:`.reference.ReferenceModel`'s step on the same state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch
from pto.orchestration.llama.config import LlamaConfig, RopeScaling
from pto.orchestration.llama.reference import rope_tables
from pto.orchestration.model.checkpoint import ModelWeights, file_weight_types
from pto.orchestration.model.config import ModelConfig
from pto.orchestration.model.decode import DecodeTiling, allreduce_dtype, build_step, tile_rows, vocab_split
from pto.orchestration.model.gguf_file import given_as, is_gguf, open_gguf
from pto.orchestration.model.quantized import (
    DENSE,
    QUANTIZERS,
    RANDOM_TYPES,
    KeepFileTypes,
    WeightTypes,
    for_weights,
    is_quantized,
    quantize_weights,
    random_quantized_weights,
    weight_shapes,
)
from pto.orchestration.model.reference import KVCache, ReferenceModel
from pto.orchestration.model.tiling import round_block

from pto import Var
from pto.errors import UsageError
from pto.ir.dtypes import DType, dtype_of
from pto.machine.target import Target
from pto.machine.target import get as named_target
from pto.program import Baseline, Option, Program, Settings, Shape, ShapeParam
from pto.quant import QTensor

CONFIGS = {
    "tiny": ModelConfig(LlamaConfig(hidden=64, heads=4, head_dim=16, ffn=160, kv_heads=2), vocab=512, layers=2,
                        tied=True, max_positions=1024, eos_ids=(2,)),
    "tiny-swa": ModelConfig(LlamaConfig(hidden=64, heads=4, head_dim=16, ffn=160, kv_heads=2, window=64), vocab=512,
                            layers=2, tied=False, max_positions=1024, eos_ids=(2,)),
    # 24 query heads, each its own key/value head: splits over 2, 3, 4, 6 and 8 ranks (the CPU's
    # tensor-parallel tests up to 8 ranks); a vocabulary that 3 and 8 do not divide
    "tiny-mha24": ModelConfig(LlamaConfig(hidden=64, heads=24, head_dim=8, ffn=192, kv_heads=24), vocab=500,
                              layers=2, tied=True, max_positions=1024, eos_ids=(2,)),
    "smollm2-135m": ModelConfig(LlamaConfig(hidden=576, heads=9, head_dim=64, ffn=1536, kv_heads=3, eps=1e-5,
                                            theta=100000.0), vocab=49152, layers=30, tied=True, max_positions=8192,
                                eos_ids=(2,)),
    "llama3-8b": ModelConfig(LlamaConfig(hidden=4096, heads=32, head_dim=128, ffn=14336, kv_heads=8, eps=1e-5,
                                         theta=500000.0), vocab=128256, layers=32, tied=False, max_positions=8192,
                             eos_ids=(128001, 128009)),
    # Llama-3.2-1B's shape (tied embedding, 32 query and 8 key/value heads of 64): the model the
    # published megakernels report on, for a like-for-like comparison
    "llama3.2-1b": ModelConfig(LlamaConfig(hidden=2048, heads=32, head_dim=64, ffn=8192, kv_heads=8, eps=1e-5,
                                           theta=500000.0, rope_scaling=RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)),
                               vocab=128256, layers=16, tied=True, max_positions=131072,
                               eos_ids=(128001, 128008, 128009)),
    # LLaMA 3.1's 128K context (its RoPE scaling): the 8B model's shape at long caches
    "llama3.1-8b": ModelConfig(LlamaConfig(hidden=4096, heads=32, head_dim=128, ffn=14336, kv_heads=8, eps=1e-5,
                                           theta=500000.0, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)),
                               vocab=128256, layers=32, tied=False, max_positions=131072,
                               eos_ids=(128001, 128008, 128009)),
}
#: the tiles of the CPU's tiny configurations (few tasks) and of real sizes
TINY_TILING = DecodeTiling(chunk=32, tk=16, bn=32, bk=32, bv=128, lm_bk=32, dot_bk=32)
#: the rest (hidden 256 to 2047): the down projection in K steps of 2048, the other projections
#: in steps of 1024, the LM head in blocks of 256 vocabulary columns. Measured on SmolLM2 only (an
#: H200: its down projection's 1536 columns in one step 2.91 against 3.65 us a layer in two of
#: 1024; the head 22.2 against 25.2 us a step in blocks of 512); a model of this range with an
#: FFN wider than 2048 takes several steps, one of them partly masked, unmeasured
#: From 2 to 4 sequences the projections multiply-sum each weight tile against every row, unpadded
#: (:attr:`~pto.orchestration.model.tiling.DecodeTiling.dense_rows`): SmolLM2's step on an H200
#: at 2 sequences 0.555 against 0.986 ms padded to 16 rows for tensor-core dots, at 4 0.627
#: against 1.048, at 8 0.949 against 1.058 on the launches but 1.588 against 0.953 on the
#: megakernel, which 8 keep (docs/PERF.md, "Unpadded rows at 2-4 sequences")
TILING = DecodeTiling(bk=2048, qkv_bk=1024, o_bk=1024, ffn_bk=1024, bv=256, dense_rows=4)
#: models of hidden 2048 and more: the gate/up projection in blocks of 8 outputs, K steps of 2048
#: (an 8B model's, measured on an H100: DecodeTiling.ffn_bn); RoPE as its own task (the 8B
#: model's projection with RoPE in its epilogue took 25.9 us a layer against 21.0 + 2.7 for the
#: two: 5.756 against 5.689 ms a step, where SmolLM2 gains 5.8%: docs/PERF.md); from 2
#: sequences on, blocks of 32 outputs on the dot path (the 8B step at batch 8: 7.22 against 8.34
#: ms with 16; SmolLM2's 1.14 against 1.09, so it keeps 16)
#: With quantized weights (read by groups, :mod:`pto.codegen.triton.quant_groups`) longer K
#: steps: the q, k, v and o projections 8 outputs a block over the whole of an 8B model's 4096,
#: the down projection 8 in steps of 2048, gate/up 4 over 4096, the LM head 16 vocabulary rows in
#: steps of 2048 (a Q6_K head's of 1024: quantized.HEAD_STEPS). The 8B model's GEMVs alone on an
#: H200 (bench/qgemv.py, weights past L2): Q4_K gate/up 36.97 against 51.24 us, down 20.19 /
#: 22.47, o 7.50 / 8.29, its Q6_K head 245 / 352;
#: Q8_0 gate/up 44.81 / 55.60, down 23.73 / 29.40, head 207 / 250; fp8 (by groups here, by units
#: in the default tiles) gate/up 35.72 / 40.11, down 19.64 / 21.45, o 7.39 / 8.11, head 140 / 204.
#: The whole step (waves): Q4_K with a Q6_K head 2.71 ms against 3.39-3.48, Q8_0 3.27 against
#: 3.77-4.01, fp8 (by units) 2.61 against 3.16 (docs/PERF.md, "Quantized weights", 2026-11-29).
#: Two sequences unpadded (``dense_rows``): on an H200 the 8B step at 2 sequences 5.300 against
#: 5.820 ms padded (the megakernel), the 1B's 1.200 against 1.492; at 4 the 1B's 2.071 against
#: 1.503 and at 8 the 8B's 20.25 against 5.91 (a broadcast sum of 8 rows against 4096-wide tiles)
QUANT_WIDE = (("bn", 8), ("bk", 2048), ("o_bn", 8), ("o_bk", 4096), ("qkv_bn", 8), ("qkv_bk", 4096),
              ("ffn_bn", 4), ("ffn_bk", 4096), ("lm_bk", 2048), ("bv", 16))
WIDE_TILING = DecodeTiling(ffn_bn=8, ffn_bk=2048, rope_in_qkv=False, dot_bn=32, quant_tiles=QUANT_WIDE,
                           dense_rows=2)


#: on a CPU, the rest's projections in blocks of 32 outputs, K steps of 192 (both of SmolLM2's
#: contractions, 576 and 1536, whole steps): a block is a loop iteration of one task there, and
#: each recomputes the folded norm's statistics, so wider blocks read the same weights with less of
#: it (SmolLM2 on one core of the development VM: 55 against 87 ms a step, docs/PERF.md "Native
#: CPU execution")
CPU_TILING = replace(TILING, bn=32, bk=192, qkv_bk=None, o_bk=None, ffn_bk=None, quant_whole_k=True)


def tiling_for(cfg: ModelConfig, target: Target | None = None) -> DecodeTiling:
    """The step's tiles for ``cfg`` on ``target`` (a GPU's where None; at a given cache:
    ``tiling_for(cfg).for_cache(cache)``)."""
    if cfg.layer.hidden < 256:
        return TINY_TILING
    if cfg.layer.hidden >= 2048:
        return WIDE_TILING
    return CPU_TILING if target is not None and target.kind == "cpu" else TILING


#: the persistent megakernel's tiles where they differ (hidden 2048 and more, one sequence): q, k
#: and v in blocks of 8 outputs, gate/up in blocks of 8 in K steps of 1024 (half the wave
#: executor's 2048: a gate/up run takes twice the trips for its pipeline and a smaller first load;
#: on an H200 in one call Llama-3.2-1B's step 0.959 against 0.991 ms, Llama-3-8B's 4.192 against
#: 4.227, batch 8 unchanged; docs/PERF.md, "The runs' L2 prefetch and K steps measured"),
#: the o and down projections in blocks of :func:`megakernel_block` outputs: one round of items
#: over the launch's programs, where wider blocks of every projection (16, K steps of 1024) left a
#: last round partly idle. On an H200 in one call: Llama-3-8B's step 4.558 against 4.689 ms in
#: blocks of 16, Llama-3.2-1B's 1.040 against 1.081 (docs/PERF.md, "The megakernel's blocks by its
#: programs"); from 2 sequences on, each projection's block gives one round of items where
#: ``dot_bn``'s would take more (:attr:`~pto.orchestration.model.tiling.DecodeTiling.dot_round`:
#: the 8B model at batch 8 5.979 against 6.440 ms a step on an H200)
MEGAKERNEL_WIDE = dict(qkv_bn=8, ffn_bn=8, ffn_bk=1024, dot_round=True)
#: the programs a multiprocessor the decode step's megakernel holds (its 4-warp GEMVs two a
#: multiprocessor: pto.backends.triton.megakernel.AUTO)
MEGAKERNEL_PER_SM = 2
#: the rest (hidden 256 to 2047) on the persistent executor of a GPU: blocks of 8 outputs, half
#: the items of the wave executor's 4 (SmolLM2's step on an H200 0.4625 against 0.506 ms in
#: blocks of 4, the wave executor's 0.478 in the same call; docs/PERF.md, "Two programs a
#: multiprocessor by default, the critical path")
MEGAKERNEL_NARROW = dict(bn=8)
#: the tiles a step is built in (the model's ``--tiles``): the wave executor's launches', which
#: the native and the reference executors run too, or the persistent executor's megakernel's
TILES = ("waves", "persistent")


def megakernel_programs(target: Target | None = None) -> int:
    """The decode step's megakernel's programs on ``target`` (an H200's where it is None or has no
    multiprocessor count, a CPU): :data:`MEGAKERNEL_PER_SM` a multiprocessor."""
    sms = (target if target is not None and target.sm_count else named_target("cuda_h200")).sm_count
    return MEGAKERNEL_PER_SM * sms


def megakernel_block(outputs: int, target: Target | None = None) -> int:
    """The block of a projection of ``outputs`` outputs whose items make one round over the
    megakernel's programs on ``target`` (an H200's multiprocessors where it is None or has no
    count, a CPU): the narrowest power of two from 4 to 16 that gives at most
    :data:`MEGAKERNEL_PER_SM` items a multiprocessor, else 16 (more than one round: outputs past
    32 a multiprocessor). The 8B model's 4096 outputs on an H200: 16, 256 items on 264 programs;
    the 1B model's 2048: 8."""
    return round_block(outputs, megakernel_programs(target), 4, 16)


def tiling_for_executor(cfg: ModelConfig, executor: str, target: Target | None = None) -> DecodeTiling:
    """The step's tiles for ``cfg`` run by ``executor`` on ``target``: the megakernel's blocks on
    the persistent executor for models of hidden 2048 and more (:data:`MEGAKERNEL_WIDE`, the o and
    down projections in blocks of :func:`megakernel_block`) and, on a GPU, of hidden 256 and more
    (:data:`MEGAKERNEL_NARROW`), else :func:`tiling_for`'s."""
    base = tiling_for(cfg, target)
    if executor == "persistent" and cfg.layer.hidden >= 2048:
        block = megakernel_block(cfg.layer.hidden, target)
        return replace(base, **MEGAKERNEL_WIDE, bn=block, o_bn=block, round_programs=megakernel_programs(target))
    if executor == "persistent" and cfg.layer.hidden >= 256 and (target is None or target.kind != "cpu"):
        return replace(base, **MEGAKERNEL_NARROW, round_programs=megakernel_programs(target))
    return base


#: the widest model (hidden) whose steps of a few sequences run faster on the launches
NARROW_HIDDEN = 2047
#: the most sequences a narrow model's step runs on the launches: those whose rows stay unpadded
NARROW_WAVES_BATCH = TILING.dense_rows


def auto_step_executor(tp: int, quantized: bool, hidden: int = 0, batch: int = 1) -> str:
    """What ``--executor auto`` runs a decode step of ``batch`` sequences of a model of ``hidden``
    with on a GPU: the persistent executor in its own tiles, which on an H200 beat the launches on
    the wide models at every batch (2026-12-01, docs/PERF.md "The executors today": Llama-3-8B
    4.257 against 4.361 ms at one sequence, 5.942 against 6.102 at 8; the 1B shape 0.960 against
    1.020, 1.525 against 1.622; at 2 sequences, rows unpadded, 5.300 against 5.587 and 1.200
    against 1.248; on 2026-12-02 the 8B's two within 1% either way, 4.2045 against 4.2394 and
    then 4.2482 against 4.2032, the 1B's 0.9459 against 0.9654: "Twenty-eighth session"; on
    2026-12-03 level at one sequence, 4.2033 against 4.1687 and 0.9564 against 0.9535, ahead at
    8, 5.927 against 5.999 and 1.3488 against 1.5847: "Thirtieth session") and on
    the narrow ones (hidden up to :data:`NARROW_HIDDEN`) from 5 sequences on (SmolLM2 at 8: 0.953
    against 0.949-1.058; 0.879 since its lone dot projections take five stages, 2026-12-03); the
    launches for a narrow model's 1 to
    :data:`NARROW_WAVES_BATCH` sequences (SmolLM2 at 1: 0.401 against 0.454 ms in two calls of the
    same session; at 2 and 4, rows unpadded, 0.555 against 0.600 and 0.627 against 0.932), for
    steps with collectives (``tp`` > 1: the persistent kernel runs none) and for quantized weights
    (the 8B step on an H200: Q4_K 2.72 against 6.47-6.95 ms, Q8_0 3.27 against 6.79-7.65, fp8
    2.65 against 3.39-4.64 in the megakernel's tiles or the GEMVs'; docs/PERF.md, "Data
    dependencies measured and on by default"; on 2026-12-04 with the megakernel's quantized GEMVs
    unpipelined, Q4_K 1.92 against 3.62, Q8_0 2.56 against 3.81, fp8 2.54 against 3.35 at one
    sequence, Q4_K 8.64 against 9.84 at 8: "Thirty-third session"). ``hidden`` 0: not known (the
    persistent rule)."""
    if tp > 1 or quantized:
        return "waves"
    return "waves" if 0 < hidden <= NARROW_HIDDEN and batch <= NARROW_WAVES_BATCH else "persistent"


class ModelProgram(Program):
    name = "model"
    description = ("one decode step of a whole LLaMA-family model (embedding, every layer with a KV cache, the LM "
                   "head, greedy sampling) as one task graph; pto generate runs it token by token")
    configs = CONFIGS
    options = (Option("weights", "", "a GGUF file or a Hugging Face folder: the model's configuration and weights "
                      "(replaces --config)"),
               Option("quantize", "auto", "how the weights are stored: auto (a GGUF file's own types, floats as "
                      "they are), none (all dequantized), or a type: fp8, q8_0, q4_0 quantized by pto at load (random "
                      "weights also q4_1, q5_0, q5_1, q4_k, q5_k, q6_k: random blocks); the embedding as it is",
                      choices=("auto", "none", *RANDOM_TYPES)),
               Option("allreduce_dtype", "storage", "with --tp N: the dtype the ranks' partial sums are all-reduced "
                      "in: the storage dtype (as Megatron) or f32", choices=("storage", "f32"), tp_only=True),
               Option("lm_head", "parallel", "with --tp N: the LM head split by vocabulary (each rank its share's "
                      "logits, the argmax combined over the ranks) or replicated on every rank",
                      choices=("parallel", "replicated"), tp_only=True),
               Option("tiles", "auto", "the projections' tiles: the executor's own (auto), the launches' (waves) or "
                      "the megakernel's (persistent: wider blocks, items of one round over the GPU's programs)",
                      choices=("auto", *TILES)))
    shape_params = (ShapeParam("cache", 256, "KV-cache slots per sequence (a multiple of the attention chunk)"),
                    ShapeParam("batch", 1, "sequences decoded together"))
    outputs = ("logits", "tok", "pos")
    tensor_parallel = True

    def auto_executor(self, s: Settings, shape: Shape | Mapping | int | None = None) -> str | None:
        """:func:`auto_step_executor` of ``s``'s ranks, weights and model at ``shape``'s batch
        (the default's where not given)."""
        # (a sweeping command's flags may hold lists, and an int is the swept cache: the default then)
        given = shape.get("batch") if isinstance(shape, Mapping) else None
        batch = given if isinstance(given, int) else self.shape()["batch"]
        return auto_step_executor(s.tp, self.weight_types(s).quantized, self.config(s).layer.hidden, batch)

    def default_config(self, device: str) -> str:
        return "smollm2-135m" if device == "cuda" else "tiny"

    def settings(self, *, device: str = "cpu", config: str | None = None, **kw) -> Settings:
        """The base rule, and ``--weights`` in place of ``--config``: the settings' config is then
        the file's shape (:meth:`ModelConfig.spec`), so that every report names what ran (the
        file itself is the ``weights`` option)."""
        if kw.get("weights") and config not in (None, "auto"):
            raise UsageError(f"{self.name}: --weights and --config {config} both give the model's configuration; "
                             "give one of them")
        s = super().settings(device=device, config=config, **kw)
        return replace(s, config=self.config(s).spec()) if s["weights"] else s

    def config(self, s: Settings) -> ModelConfig:
        if s["weights"]:
            from pto.orchestration.model.config import load_config

            with given_as("--weights", s["weights"]):
                return load_config(s["weights"])
        return CONFIGS[s.config]

    def weight_types(self, s: Settings) -> WeightTypes:
        """What the step's weight inputs are stored as under ``s`` (a GGUF file's from its
        headers; no data read)."""
        q = s["quantize"]
        if q == "none":
            return DENSE
        if q == "auto":
            if s["weights"] and is_gguf(s["weights"]):
                with given_as("--weights", s["weights"]):
                    return file_weight_types(open_gguf(s["weights"]))[0]
            return DENSE
        cfg = self.config(s)
        kinds = ["w_qkv", "wo", "wg", "wu", "wd"] + ([] if cfg.tied else ["lm_head"])
        return WeightTypes(tuple(sorted((k, dtype_of(q)) for k in kinds)))

    def check_settings(self, s: Settings) -> None:
        q = s["quantize"]
        if s["weights"] and q not in ("auto", "none", *QUANTIZERS):
            raise UsageError(f"{self.name}: --quantize {q}: pto quantizes weights to {', '.join(QUANTIZERS)} (random "
                             "weights also to GGUF's other types)")
        cfg = self.config(s)  # a file that is not a model: one line now
        if q not in ("auto", "none"):
            for n in (cfg.hidden, cfg.layer.q_dim, cfg.layer.ffn):
                if n % dtype_of(q).quant.block:
                    raise UsageError(f"{self.name}: --quantize {q}: the model's rows of {n} inputs are not whole "
                                     f"blocks of {dtype_of(q).quant.block}")
        if s.tp > 1 and self.weight_types(s).quantized:
            raise UsageError(f"{self.name}: --tp {s.tp}: quantized weights run on one rank (--quantize none)")
        try:
            cfg.shard(s.tp)
            self._split(s)
        except ValueError as e:
            raise UsageError(f"{self.name}: --tp {s.tp}: {e}") from None

    def _reduce_dtype(self, s: Settings) -> DType:
        return allreduce_dtype(s.dtype, s["allreduce_dtype"])

    def _split(self, s: Settings):
        """The vocabulary-parallel LM head's split (None: one rank, or ``--lm-head replicated``)."""
        return vocab_split(self.config(s), s.tp, s["lm_head"] == "parallel")

    def for_executor(self, s: Settings, executor: str) -> Settings:
        """``--tiles auto``: the tiles of ``executor`` (the persistent executor's or the launches',
        which the other executors run too), as ``pto generate`` and bench/decode.py take them."""
        if s["tiles"] != "auto":
            return s
        tiles = executor if executor in TILES else "waves"
        return replace(s, options=tuple(sorted({**dict(s.options), "tiles": tiles}.items())))

    def tiling(self, s: Settings) -> DecodeTiling:
        """The step's tiles under ``s`` (``--tiles``; ``auto``, settings no executor resolved: the
        launches')."""
        tiles = s["tiles"]
        return tiling_for_executor(self.config(s), "waves" if tiles == "auto" else tiles, s.target)

    def build(self, s: Settings, shape: Shape | None = None):
        shape = self.shape(shape)
        cfg = self.config(s)
        return build_step(cfg, s.dtype, s.target, shape["batch"], self.tiling(s), s.tp,
                          self._reduce_dtype(s), shape["cache"], self.weight_types(s), s["lm_head"] == "parallel")

    def scratch_bytes(self, s: Settings, shape: Shape) -> int:
        """Under ``tp`` > 1 the sum buffer of the o and down projections' collective tasks: one
        task's rows (the batch, padded as the tiles are) of ``hidden`` values in the sum's dtype;
        and the vocabulary-parallel head's candidates (f32); each twice (symmetric memory's
        one-shot sum, which a step's small sums take on GPUs that have it, writes a second
        buffer: pto.machine.collectives)."""
        if s.tp == 1:
            return 0
        split = self._split(s)
        candidates = shape["batch"] * split.width * 4 if split else 0
        rows = tile_rows(shape["batch"], s.target)
        return 2 * (rows * self.config(s).hidden * self._reduce_dtype(s).itemsize + candidates)

    def shard(self, s: Settings, inputs: dict, rank: int) -> dict:
        """Rank ``rank``'s inputs (:func:`shard_inputs`)."""
        if s.tp == 1:
            return inputs
        tiling = tiling_for(self.config(s))
        return shard_inputs(self.config(s), inputs, s.tp, rank, tiling.wt, self._split(s), tiling.lm_wt)

    def unshard(self, s: Settings, outputs: dict) -> dict:
        """The whole outputs on every rank: the vocabulary-parallel head's logits joined from the
        ranks' shares (a collective); the rest every rank holds whole."""
        split = self._split(s)
        if split is None:
            return outputs
        from pto.orchestration.model.vocab import whole_logits

        return {**outputs, "logits": whole_logits(outputs["logits"], split)}

    def check_shape(self, s: Settings, shape: Shape) -> None:
        cfg, chunk = self.config(s), tiling_for(self.config(s)).chunk
        if shape["cache"] % chunk:
            raise UsageError(f"{self.name}: --cache {shape['cache']} must be a multiple of {chunk} (the attention "
                             "chunk: the slots of one attention task, more in a long cache)")
        window = cfg.layer.window
        if window and shape["cache"] != window:
            raise UsageError(f"{self.name}: the model attends to a sliding window of {window} positions: its cache "
                             f"is a ring of exactly that many slots (--cache {window}, not {shape['cache']})")
        if shape["cache"] > cfg.max_positions and not window:
            raise UsageError(f"{self.name}: --cache {shape['cache']} exceeds the model's context of "
                             f"{cfg.max_positions} positions")

    def estimate_columns(self, s, shape):
        """The KV cache (every layer's keys and values for every slot) and the bytes one step
        must read from memory at a full cache: every layer's weights and the LM head once (of
        the embedding only a row per sequence) and the whole cache; over the memory bandwidth,
        the step's floor. Under ``--tp`` one rank's: its share of the layers and of the cache,
        and of the LM head (whole with ``--lm-head replicated``; with its candidates' places)."""
        split = self._split(s)
        cfg = self.config(s).shard(s.tp)
        c, esize = cfg.layer, s.dtype.itemsize
        kv = cfg.layers * shape["batch"] * shape["cache"] * 2 * c.kv_dim * esize
        wtypes = self.weight_types(s)
        shapes = weight_shapes(cfg, True)  # (N, K): rows of outputs, blocks along the inputs

        def nbytes(kind: str, rows: int, cols: int) -> int:
            return wtypes.get(kind, s.dtype).nbytes(rows, cols)

        layers = cfg.layers * (sum(nbytes(k, *shapes[k]) for k in shapes) + 2 * c.hidden * esize)
        head = nbytes("lm_head", split.height if split else cfg.vocab, c.hidden)
        emb = nbytes("emb", cfg.vocab, c.hidden)
        final = c.hidden * esize  # the final norm's gain
        place = 3 * split.width * 4 if split else 0  # where the rank's candidate goes (f32)
        resident = layers + emb + final + place + (0 if cfg.tied and split is None else head)
        return {"kv_cache_bytes": kv, "weight_bytes": resident, "step_read_bytes": layers + head + final + place + kv}

    def estimate_baselines(self, s: Settings) -> list[Baseline]:
        return []  # no published counts of a decode step to draw beside

    def scalar_exprs(self, s):
        return {"B": Var("batch"), "C": Var("cache")}

    def inputs(self, s, shape, device, seed=0):
        """The weights (random, scaled by 1/sqrt(fan-in), or ``--weights``'), the RoPE tables, and
        a state to step from: every sequence at a seeded random position with random keys and
        values in its cache and a random token."""
        cfg = self.config(s)
        g = torch.Generator().manual_seed(seed)
        weights = load_or_random(s, cfg, g)
        B, C = shape["batch"], shape["cache"]
        kvd = cfg.layer.kv_dim
        cache = torch.randn(2, cfg.layers * B * C, kvd, generator=g).to(s.dtype.torch)
        # a ring (sliding window) has wrapped at positions past its slots
        pos = torch.randint(0, 3 * C if cfg.layer.window else C, (B, 1), generator=g).float()
        pos[-1, 0] = C - 1  # a full cache
        tok = torch.randint(0, cfg.vocab, (B, 1), generator=g).float()
        tiling = for_weights(tiling_for(cfg), self.weight_types(s))
        out = {**stack_weights(weights, tiling.wt, tiling.lm_wt), "k_cache": cache[0], "v_cache": cache[1], "tok": tok,
               "pos": pos}
        cos, sin = rope_tables(cfg.max_positions, cfg.layer, s.dtype, "cpu")
        out.update(cos=cos, sin=sin)
        return {k: v.to(device) for k, v in out.items()}

    def reference(self, s, shape, inputs, dtype: torch.dtype = torch.float32):
        """:class:`ReferenceModel`'s decode step from the same weights and state, computed in
        ``dtype`` (float32 for ``--check``; float64 and bfloat16 measure a bf16 run's error
        against a framework's own)."""
        cfg = self.config(s)
        B, C = shape["batch"], shape["cache"]
        wtypes = self.weight_types(s)
        tiling = for_weights(tiling_for(cfg), wtypes)
        quantized = dict(wtypes.types)
        w = unstack_weights(cfg, {k: v if k in quantized else v.to(dtype) for k, v in inputs.items()}, tiling.wt,
                            tiling.lm_wt, wtypes, dtype)
        L, NKV, D = cfg.layers, cfg.layer.kv_heads, cfg.layer.head_dim

        def blocks(t):
            return t.to(dtype).view(L, B, C, NKV, D).permute(0, 1, 3, 2, 4).contiguous()

        pos = inputs["pos"].view(-1).long()
        cache = KVCache(blocks(inputs["k_cache"]), blocks(inputs["v_cache"]), pos.clone(), C)
        if cfg.layer.window:  # a ring of C slots: the reference's cache is a ring when max_len > capacity
            cache.max_len = cfg.max_positions
        logits = ReferenceModel(w).decode_step(cache, inputs["tok"].view(-1).long())
        return {"logits": logits, "tok": logits.argmax(-1, keepdim=True).float(), "pos": (pos + 1)[:, None].float()}


def load_or_random(s: Settings, cfg: ModelConfig, g: torch.Generator) -> ModelWeights:
    """The weights of ``--weights``, else seeded random ones of ``cfg``'s shape; stored as
    ``--quantize`` says."""
    q = s["quantize"]
    if s["weights"]:
        from pto.orchestration.model.checkpoint import load_weights

        keep = KeepFileTypes() if q == "auto" else None
        with given_as("--weights", s["weights"]):
            w = load_weights(s["weights"], s.dtype.torch, keep=keep)
        return w if q in ("auto", "none") else quantize_weights(w, q)
    w = random_weights(cfg, s.dtype.torch, g)
    return w if q in ("auto", "none") else random_quantized_weights(w, q, g)


def random_weights(cfg: ModelConfig, dtype: torch.dtype, g: torch.Generator) -> ModelWeights:
    """Normal weights scaled by 1/sqrt(fan-in) (norm gains near 1), made in f32 on the
    generator's device (a CUDA generator makes a billion-parameter model in seconds)."""
    c = cfg.layer
    H, QD, KVD, F = c.hidden, c.q_dim, c.kv_dim, c.ffn

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=g.device) * scale).to(dtype)

    def gain():
        return (1 + 0.1 * torch.randn(1, H, generator=g, device=g.device)).to(dtype)

    layers = [{"g_attn": gain(), "wq": rnd(H, QD, scale=H ** -0.5), "wk": rnd(H, KVD, scale=H ** -0.5),
               "wv": rnd(H, KVD, scale=H ** -0.5), "wo": rnd(QD, H, scale=QD ** -0.5), "g_ffn": gain(),
               "wg": rnd(H, F, scale=H ** -0.5), "wu": rnd(H, F, scale=H ** -0.5), "wd": rnd(F, H, scale=F ** -0.5)}
              for _ in range(cfg.layers)]
    emb = rnd(cfg.vocab, H)
    head = emb.t() if cfg.tied else rnd(H, cfg.vocab, scale=H ** -0.5)
    return ModelWeights(cfg, emb, gain(), head, layers)


def stack_weights(w: ModelWeights, wt: bool = False, lm_wt: bool = False) -> dict[str, torch.Tensor]:
    """The step's weight tensors: every layer's block of a kind stacked (:mod:`.decode`), each
    block output-major with ``wt``, the LM head with ``lm_wt`` (:class:`DecodeTiling`); a
    quantized kind's blocks (output-major, :mod:`.quantized`) as their rows of bytes."""
    ls = w.layers

    def stack(blocks):
        if is_quantized(blocks[0]):
            return QTensor.cat(blocks).data
        return torch.cat([b.t() if wt else b for b in blocks]).contiguous()

    def qkv(x):
        if is_quantized(x["wq"]):  # output-major: q, k and v one after the other as rows
            return QTensor.cat([x["wq"], x["wk"], x["wv"]])
        return torch.cat([x["wq"], x["wk"], x["wv"]], 1)

    def whole(t, transposed: bool):
        if is_quantized(t):
            return t.data
        return (t.t() if transposed else t).contiguous()

    return {"emb": whole(w.embedding, False), "w_qkv": stack([qkv(x) for x in ls]),
            "g_attn": torch.cat([x["g_attn"] for x in ls]), "wo": stack([x["wo"] for x in ls]),
            "g_ffn": torch.cat([x["g_ffn"] for x in ls]), "wg": stack([x["wg"] for x in ls]),
            "wu": stack([x["wu"] for x in ls]), "wd": stack([x["wd"] for x in ls]),
            "g_out": w.norm.contiguous(), "lm_head": whole(w.lm_head, lm_wt)}


def shard_inputs(cfg: ModelConfig, inputs: dict[str, torch.Tensor], tp: int, rank: int,
                 wt: bool = True, split=None, lm_wt: bool = False) -> dict[str, torch.Tensor]:
    """Rank ``rank`` of ``tp``'s step inputs from the whole ones (:func:`stack_weights`'
    layout, output-major blocks with ``wt``): of every layer, the outputs of wq, wk, wv, wg and
    wu and the contraction columns of wo and wd that belong to its query heads, key/value heads
    and FFN columns, and the same key/value heads' columns of both caches; with ``split`` (a
    :class:`~.vocab.VocabSplit`) the rank's share of the LM head (output-major with ``lm_wt``)
    and where its candidate goes (``vocab_place``); the rest whole."""
    c, L = cfg.layer, cfg.layers
    q, kv, f = c.q_dim // tp, c.kv_dim // tp, c.ffn // tp
    shapes = weight_shapes(cfg, wt)
    out = dict(inputs)

    def pick(kind: str, outputs: bool, ranges) -> torch.Tensor:
        """Each layer's block of ``kind`` cut to ``ranges`` (start, length) of its outputs
        (``outputs``) or of its contraction columns."""
        rows, cols = shapes[kind]
        axis = 1 if outputs == wt else 2  # output-major blocks: outputs are rows
        blocks = inputs[kind].view(L, rows, cols)
        return torch.cat([blocks.narrow(axis, a, n) for a, n in ranges], axis).flatten(0, 1).contiguous()

    out["w_qkv"] = pick("w_qkv", True, [(rank * q, q), (c.q_dim + rank * kv, kv), (c.q_dim + c.kv_dim + rank * kv, kv)])
    for kind in ("wg", "wu"):
        out[kind] = pick(kind, True, [(rank * f, f)])
    out["wo"] = pick("wo", False, [(rank * q, q)])
    out["wd"] = pick("wd", False, [(rank * f, f)])
    for name in ("k_cache", "v_cache"):
        if name in inputs:
            out[name] = inputs[name][:, rank * kv:(rank + 1) * kv].contiguous()
    if split is not None:
        out["lm_head"] = split.shard_head(inputs["lm_head"], rank, lm_wt)
        out["vocab_place"] = split.place(rank, inputs["lm_head"].device)
    return out


def unstack_weights(cfg: ModelConfig, t: dict[str, torch.Tensor], wt: bool = False, lm_wt: bool = False,
                    wtypes: WeightTypes = DENSE, dtype: torch.dtype = torch.float32) -> ModelWeights:
    """:func:`stack_weights` undone (the reference's view of the step's inputs); the quantized
    inputs of ``wtypes`` dequantized (to ``dtype``)."""
    QD, KVD = cfg.layer.q_dim, cfg.layer.kv_dim
    shapes = weight_shapes(cfg, wt)
    quantized = dict(wtypes.types)

    def block(kind: str, i: int) -> torch.Tensor:
        rows = shapes[kind][0]
        b = t[kind][i * rows:(i + 1) * rows]
        if kind in quantized:
            b = QTensor(quantized[kind], b, shapes[kind][1]).dequantize(dtype)
        return b.t() if wt else b

    t, H = dict(t), cfg.layer.hidden
    if "emb" in quantized:
        t["emb"] = QTensor(quantized["emb"], t["emb"], H).dequantize(dtype)
    if "lm_head" in quantized:
        t["lm_head"] = QTensor(quantized["lm_head"], t["lm_head"], H).dequantize(dtype)

    layers = []
    for i in range(cfg.layers):
        qkv = block("w_qkv", i)
        layers.append({"g_attn": t["g_attn"][i:i + 1], "wq": qkv[:, :QD], "wk": qkv[:, QD:QD + KVD],
                       "wv": qkv[:, QD + KVD:], "wo": block("wo", i), "g_ffn": t["g_ffn"][i:i + 1],
                       "wg": block("wg", i), "wu": block("wu", i), "wd": block("wd", i)})
    return ModelWeights(cfg, t["emb"], t["g_out"], t["lm_head"].t() if lm_wt else t["lm_head"], layers)


PROGRAM = ModelProgram()

__all__ = ["ModelProgram", "PROGRAM", "CONFIGS", "stack_weights", "shard_inputs", "unstack_weights", "random_weights",
           "tiling_for", "tiling_for_executor", "auto_step_executor", "NARROW_HIDDEN", "NARROW_WAVES_BATCH",
           "MEGAKERNEL_WIDE", "MEGAKERNEL_NARROW", "megakernel_block", "megakernel_programs", "TILES"]
