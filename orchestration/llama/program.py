"""The LLaMA-family programs over the pieces of this package: ``llama7b`` (:class:`LlamaProgram`,
``PROGRAM``: the 7B layer on a GPU, ``tiny`` on the CPU) and ``llama`` (:class:`LlamaFamily`,
``FAMILY``: the same program defaulting to LLaMA-3-8B's shape, ``tiny-gqa`` on the CPU). Both
take every built-in configuration, a Hugging Face ``config.json`` (``--hf-config``) and one
layer's weights from a safetensors checkpoint (``--weights``, ``--layer``). Their measured launch
parameters ship beside them as schedule data (``schedules/<device>/``, :attr:`Program.schedules`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import torch
from pto.orchestration.llama.config import ATTENTION_MODES, CONFIGS, LlamaConfig, config_named
from pto.orchestration.llama.counts import closed_form
from pto.orchestration.llama.hf import load_hf_config
from pto.orchestration.llama.llama7b import build_module
from pto.orchestration.llama.reference import layer_flops, reference_layer, rope_tables
from pto.orchestration.llama.tiling import LayerForm, LlamaTiling, allreduce_dtype, fit_functions
from pto.orchestration.llama.weights import GATE_UP, check_weights, fold_gains, folded, load_layer, unfold_gains

from pto import Var
from pto.errors import UsageError
from pto.ir.dtypes import DType
from pto.ir.nodes import Module
from pto.machine.target import Target
from pto.passes.fusion.fuse import FusionReport, fuse
from pto.program import Baseline, Option, Program, Settings, Shape, ShapeParam, seeded_randn

#: seed 004's published task counts (with, without adaptive tiles) of its setting (Ascend 910B,
#: f32, bidirectional, split attention), and the bytes per task of its runtime
SEED_ROWS = {1024: (1024, 3584), 2048: (3584, 13312), 4096: (13312, 51200), 8192: (51200, 200704),
             16384: (200704, 794624)}


SEED_BYTES_PER_TASK = 2864


class Configs(Mapping):
    """The built-in configurations by name (what ``--config`` lists), and also, by its
    :meth:`LlamaConfig.spec`, any configuration read from a file: the name ``--hf-config`` gives
    the settings, so that the built module, the caches and every report follow the file."""

    def __init__(self, named: dict[str, LlamaConfig]):
        self._named = named

    def __getitem__(self, name: str) -> LlamaConfig:
        try:
            return config_named(name)
        except (KeyError, ValueError):
            raise KeyError(name) from None

    def __contains__(self, name) -> bool:
        try:
            self[name]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._named)

    def __len__(self) -> int:
        return len(self._named)


class LlamaProgram(Program):
    name = "llama7b"
    schedules = (Path(__file__).resolve().parent / "schedules",)
    description = "one LLaMA decoder layer (7b: hidden 4096, 32 heads x 128, FFN 11008; tiny for the CPU)"
    configs = Configs(CONFIGS)
    #: --config auto on a GPU and on the CPU
    gpu_default, cpu_default = "7b", "tiny"
    options = (
        Option("attention", "fused", "attention granularity: split (3 tasks per q x kv tile pair, the seed's), "
               "pair (1 task per pair) or fused (1 task per q tile, residuals and SwiGLU fused too)",
               choices=ATTENTION_MODES),
        Option("causal", True, "causal attention"),
        Option("fuse", True, "fuse each chain of calls that carries state through memory, and each producer into "
               "the consumers that alone read it, into one InCore function (split and pair attention become one "
               "task per q tile, the state on chip); --no-fuse keeps the graph as written"),
        Option("fuse_norm_rope", False, "with --attention fused: fold each RMSNorm into the projections after it "
               "(its gain into the weights, each row's scale from a statistics task) and apply RoPE in the q and k "
               "projections' epilogue (9 tasks per row tile instead of 11); the layer's inputs are then wq_g, wk_g, "
               "wv_g and wgu_g (gate and up interleaved) instead of the gains and wq, wk, wv, wg, wu (an --inputs file "
               "of those is folded as it is loaded)"),
        Option("hf_config", "", "a Hugging Face config.json (or its folder) of the LLaMA family (model_type llama "
               "or mistral): the layer's dimensions, eps, RoPE base and scaling, sliding window; instead of --config"),
        Option("weights", "", "a safetensors checkpoint (a file, a sharded one's index.json, or their folder): the "
               "layer's weights under the Hugging Face names instead of random ones"),
        Option("layer", 0, "the decoder layer of --weights to run"),
        Option("row_tiles", "auto", "whole: every row tile the q tile's height, the last one clipped (one kernel a "
               "phase on a GPU); adaptive: binary expansion's blocks with residual tiles of the base height (the "
               "seed's: fewer padding rows, a kernel more per phase); auto: whole on a GPU with --attention fused",
               choices=("auto", "whole", "adaptive")),
        Option("allreduce_dtype", "storage", "with --tp N: the dtype the ranks' partial sums are all-reduced in: "
               "the storage dtype (half the bytes of f32 in bf16, as Megatron: faster on two H100s, the same error) "
               "or f32",
               choices=("storage", "f32"), tp_only=True),
    )
    shape_params = (ShapeParam("seq", 128, "tokens (rows of x)"),)
    outputs = ("y",)
    tensor_parallel = True

    def default_config(self, device: str) -> str:
        return self.gpu_default if device == "cuda" else self.cpu_default

    def settings(self, *, device: str = "cpu", config: str | None = None, **kw) -> Settings:
        """The base rule, and ``--hf-config`` in place of ``--config``: the file's configuration
        becomes the settings' config (its :meth:`LlamaConfig.spec`)."""
        if kw.get("layer") is not None and not kw.get("weights"):
            raise UsageError(f"{self.name}: --layer picks a layer of --weights; give --weights FILE too")
        if kw.get("hf_config"):
            if config not in (None, "auto"):
                raise UsageError(f"{self.name}: --hf-config and --config {config} both give the layer's "
                                 "configuration; give one of them")
            config = load_hf_config(kw["hf_config"]).spec()
        return super().settings(device=device, config=config, **kw)

    def config(self, s: Settings) -> LlamaConfig:
        """The whole layer's configuration (one rank's: ``config(s).shard(s.tp)``)."""
        return self.configs[s.config]

    def _reduce_dtype(self, s: Settings) -> DType:
        return allreduce_dtype(s.dtype, s["allreduce_dtype"])

    def scratch_bytes(self, s: Settings, shape: Shape) -> int:
        """Under ``tp`` > 1 the sum buffer of the row-parallel projections' collective tasks
        (pto/backends/triton/collective.py): at most every row tile of one batch, ``hidden``
        values a row in the sum's dtype, one tile's rows of padding at most."""
        if s.tp == 1:
            return 0
        return (shape["seq"] + self.tiling(s).tq) * self.config(s).hidden * self._reduce_dtype(s).itemsize

    def check_settings(self, s: Settings) -> None:
        cfg = self.config(s)
        if s["row_tiles"] == "whole" and s["attention"] != "fused":
            raise UsageError(f"{self.name}: --row-tiles whole needs --attention fused (the pair and split modes' "
                             f"kv loops are binary-expanded; got --attention {s['attention']})")
        if s["fuse_norm_rope"] and s["attention"] != "fused":
            raise UsageError(f"{self.name}: --fuse-norm-rope needs --attention fused "
                             f"(got --attention {s['attention']})")
        if cfg.window and not s["causal"]:
            raise UsageError(f"{self.name}: the configuration attends within a sliding window of {cfg.window} "
                             "tokens, which is causal: --no-causal does not apply to it")
        if s["layer"] < 0:
            raise UsageError(f"{self.name}: --layer {s['layer']} is negative")
        if s["weights"]:
            check_weights(s["weights"], s["layer"], cfg)
        try:
            cfg.shard(s.tp)
        except ValueError as e:
            raise UsageError(f"{self.name}: --tp {s.tp}: {e}") from None

    def written(self, s: Settings, shape=None):
        """One rank's module as written (the whole layer with ``s.tp`` 1)."""
        return build_module(self.config(s), s.dtype, s.target, self.form(s))

    def build(self, s: Settings, shape=None):
        """:meth:`written`, fused unless ``--no-fuse`` (:func:`layer_module`)."""
        return layer_module(self.config(s), s.dtype, s.target, self.form(s), s["fuse"])

    def fusion(self, s: Settings, shape=None):
        return fused_layer(self.config(s), s.dtype, s.target, self.form(s))[1] if s["fuse"] else None

    def tiling(self, s: Settings) -> LlamaTiling:
        return fit_functions(self.config(s).shard(s.tp), s.dtype, s.target, self.form(s))[0]

    def form(self, s: Settings) -> LayerForm:
        """Which layer the settings ask for (attention mode, causal, fusions, tensor parallelism)."""
        rt = s["row_tiles"]
        whole = rt == "whole" or (rt == "auto" and s.target.is_gpu and s["attention"] == "fused")
        return LayerForm(s["attention"], s["causal"], s["fuse_norm_rope"], s.tp, self._reduce_dtype(s), whole)

    def counts(self, s: Settings, shape: Shape, adaptive: bool = True) -> dict[str, int] | None:
        """Exact task and edge counts of one rank's graph (see :func:`closed_form`), for ``pto
        estimate``; None for the fused split and pair modes (counted on their graphs)."""
        if s["fuse"] and self.fusion(s, shape).fused:
            return None
        return self.written_counts(s, shape, adaptive)

    def written_counts(self, s: Settings, shape: Shape, adaptive: bool = True) -> dict[str, int]:
        """The counts of the graph as written (an upper bound of the fused graph's)."""
        return closed_form(self.config(s), self.tiling(s), shape["seq"], s["attention"], s["causal"], adaptive,
                           s["fuse_norm_rope"], s.tp)

    def check_size(self, s: Settings, shape: Shape) -> None:
        """Refuse, before any work, a graph the runtime cannot hold (2^31 - 1 task ids, 2^31
        edges)."""
        self.check_shape(s, shape)
        c = self.written_counts(s, shape, True)
        if c["tasks"] >= 2**31 - 1 or c["edges"] >= 2**31:
            raise UsageError(f"{self.name} at seq {shape['seq']}: {c['tasks']:,} tasks and {c['edges']:,} edges "
                             "exceed the "
                             "runtime's limits (2^31 task ids and edges); use a shorter --seq or "
                             "`pto estimate` for the counts")

    def seed_settings(self, config: str) -> Settings:
        """The setting of seed 004's table."""
        from pto.machine.target import get

        return self.settings(config=config, dtype="f32", target=get("ascend910b"), attention="split", causal=False)

    def estimate_baselines(self, s: Settings) -> list[Baseline]:
        if s.config not in CONFIGS or self.config(s).window:
            return []  # the seed's setting is bidirectional: a layer of a file or with a window has none
        return [Baseline("seed setting", self.seed_settings(s.config),
                         {k: v[0] for k, v in SEED_ROWS.items()}, ("seed runtime", SEED_BYTES_PER_TASK))]

    def estimate_columns(self, s: Settings, shape: Shape) -> dict[str, int]:
        return {}  # the layer's bytes are its tensors' (the table's own column)

    def scalar_exprs(self, s):
        return {"S": Var("seq")}

    def inputs(self, s, shape, device, seed=0):
        """Seeded random activations; the weights random too (scaled by 1/sqrt(fan-in)) or the
        layer's from ``--weights``; cos and sin of the positions from the configuration's RoPE. With
        ``--fuse-norm-rope`` the norms' gains are folded into the weights after them, once, here
        (:func:`fold_gains`: the module takes ``wq_g``, ..., and no gains)."""
        cfg = self.config(s)
        dt = s.dtype
        dev = torch.device(device)
        g = torch.Generator(device=dev if dev.type == "cuda" else "cpu").manual_seed(seed)

        def rnd(*shape, scale=1.0):
            if dev.type == "cuda":
                return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * scale).to(dt.torch)
            return seeded_randn(shape, dt, dev, g, scale)

        seq = shape["seq"]
        cos, sin = rope_tables(seq, cfg, dt, dev)
        x = rnd(seq, cfg.hidden)
        if s["weights"]:
            layer = {"x": x, **load_layer(s["weights"], s["layer"], cfg, dt.torch, dev), "cos": cos, "sin": sin}
        else:
            layer = self._random_layer(rnd, x, cfg, cos, sin)
        return fold_gains(layer) if s["fuse_norm_rope"] else layer

    @staticmethod
    def _random_layer(rnd, x, cfg, cos, sin):
        H, Fd, QD, KVD = cfg.hidden, cfg.ffn, cfg.q_dim, cfg.kv_dim
        dt = x.dtype
        return {
            "x": x,
            "g_attn": (1.0 + 0.1 * rnd(1, H).float()).to(dt),
            "g_ffn": (1.0 + 0.1 * rnd(1, H).float()).to(dt),
            "wq": rnd(H, QD, scale=H ** -0.5), "wk": rnd(H, KVD, scale=H ** -0.5),
            "wv": rnd(H, KVD, scale=H ** -0.5), "wo": rnd(QD, H, scale=QD ** -0.5),
            "wg": rnd(H, Fd, scale=H ** -0.5), "wu": rnd(H, Fd, scale=H ** -0.5),
            "wd": rnd(Fd, H, scale=Fd ** -0.5),
            "cos": cos, "sin": sin,
        }

    def packed_inputs(self, s):
        """:func:`packed_weights` of the settings' layer."""
        return packed_weights(self.config(s), self.form(s))

    def input_conversions(self, s):
        """With ``--fuse-norm-rope``: the unfused layer's inputs (the gains and wq, ..., wu), folded
        (:func:`fold_gains`), so that a file saved without the flag runs with it."""
        if not s["fuse_norm_rope"]:
            return []
        plain = replace(s, options=tuple((k, False if k == "fuse_norm_rope" else v) for k, v in s.options))
        return [(plain, fold_gains)]

    def reference(self, s, shape, inputs):
        """The layer in plain torch; with ``--fuse-norm-rope`` the inputs' folded weights with unit
        gains (:func:`unfold_gains`: the same layer)."""
        if s["fuse_norm_rope"]:
            inputs = unfold_gains(inputs)
        return {"y": reference_layer(inputs, self.config(s), s["causal"])}

    def shard(self, s, inputs, rank):
        """Rank ``rank``'s weights (Megatron's split, as :meth:`LlamaConfig.shard` describes):
        columns of wq, wk, wv, wg and wu, rows of wo and wd, the rank's heads and FFN columns
        (grouped-query attention: its query heads read its key/value heads); x, the norms' gains
        and the RoPE tables whole. With ``--fuse-norm-rope``: columns of wq_g, wk_g and wv_g, and
        of the interleaved wgu_g the pairs of the rank's FFN columns (a contiguous slice)."""
        if s.tp == 1:
            return inputs
        cfg, tp = self.config(s), s.tp
        q, kv, f = cfg.q_dim // tp, cfg.kv_dim // tp, cfg.ffn // tp
        out = dict(inputs)
        if s["fuse_norm_rope"]:  # of the interleaved gate/up weight, the pairs of the rank's FFN columns
            cols = ((folded("wq"), q), (folded("wk"), kv), (folded("wv"), kv), (GATE_UP, 2 * f))
        else:
            cols = (("wq", q), ("wk", kv), ("wv", kv), ("wg", f), ("wu", f))
        for name, w in cols:
            out[name] = inputs[name][:, rank * w:(rank + 1) * w]
        for name, w in (("wo", q), ("wd", f)):
            out[name] = inputs[name][rank * w:(rank + 1) * w]
        return out

    def flops(self, s, shape):
        return layer_flops(self.config(s), shape["seq"], s["causal"])


@lru_cache(maxsize=64)
def fused_layer(cfg: LlamaConfig, dt: DType, target: Target, form: LayerForm) -> tuple[Module, FusionReport]:
    """The layer of ``form`` fused (:func:`pto.passes.fusion.fuse.fuse`) and the fusion's report,
    once per process and layer description (the module does not depend on the sequence length)."""
    return fuse(build_module(cfg, dt, target, form), target=target)


def layer_module(cfg: LlamaConfig, dt: DType, target: Target, form: LayerForm, fused: bool = True) -> Module:
    """The layer's module as the llama programs build it: the orchestration of ``form`` for
    ``cfg`` in ``dt`` tiled for ``target`` (:func:`~.llama7b.build_module`), fused unless not
    ``fused`` (the programs' ``--no-fuse``). What a driver that runs the layer itself calls (the
    generation application's prefill: ``LayerForm(kv_out=True)`` outputs the keys and values)."""
    return fused_layer(cfg, dt, target, form)[0] if fused else build_module(cfg, dt, target, form)


def packed_weights(cfg: LlamaConfig, form: LayerForm) -> tuple[tuple[str, ...], ...]:
    """Unfused, with as many key/value heads as query heads, the q, k and v weights in one
    buffer: the three projections (one function variant) then run as one launch. At 1,664
    tokens on an H100 three 4096 x 4096 products took 0.43 ms, one 4096 x 12288 0.28; the
    7B layer was 0.7-4% faster at 1K-16K. With fewer key/value heads only k and v would
    share a launch: the Llama-3-8B layer at 4096 tokens was 1.6-4.6% slower so, and they
    stay apart (docs/PERF.md, "Twelfth session")."""
    return () if form.fuse or cfg.kv_heads != cfg.heads else (("wq", "wk", "wv"),)


class LlamaFamily(LlamaProgram):
    """``llama``: the same program for the whole family, defaulting to LLaMA-3-8B's layer on a
    GPU and its tiny grouped-query shape on the CPU."""

    name = "llama"
    description = ("one decoder layer of the LLaMA family (LLaMA-1/2/3, Mistral: grouped-query attention, sliding "
                   "window): a built-in configuration or a Hugging Face config.json, random or safetensors weights")
    gpu_default, cpu_default = "llama3-8b", "tiny-gqa"


PROGRAM = LlamaProgram()
FAMILY = LlamaFamily()
