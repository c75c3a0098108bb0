"""Text generation with task graphs: the prompt through the layer program's module (prefill,
which fills the KV cache), then the decode step's graph (:mod:`pto.orchestration.model.decode`)
replayed once per token.

Prefill runs the layer (:func:`pto.orchestration.llama.program.layer_module`, of the form that
outputs its keys and values: ``LayerForm(kv_out=True)``) on each prompt but its last token,
layer by layer, and copies each layer's keys (after RoPE) and values, the module's declared
outputs, into the sequence's cache block; the decode step then starts from the last prompt token
at its position, so its first step yields the first new token. The step's graph is built once
for the batch and a cache capacity (a power of two of whole attention chunks, at least the
longest prompt plus the new tokens; the window for a sliding-window model) and replayed: the
token and the position are device data the step itself advances, so nothing is rebuilt and
nothing synchronizes with the host inside a step. Reading the new tokens back (to print them)
happens between steps. Both modules come from the programs' builders, run where and how
:func:`pto.engine.placement` says, by the engine's one recipe (:class:`pto.engine.Prepared`).

Tensor parallelism (``tp`` > 1, one process per rank under torchrun): every rank's step is its
share of the heads and FFN columns (:func:`~pto.orchestration.model.program.shard_inputs`), its
cache the key/value heads it holds; prefill runs the whole layer on every rank and keeps the
rank's heads of the keys and values. The LM head is vocabulary-parallel (each rank its share's
logits; the step's argmax combines the ranks' candidates, so every rank picks the same greedy
token); sampling joins the ranks' logits first (every rank the whole logits, the same seeded
generator: the same token).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from pto.orchestration.llama.llama7b import KV_OUTPUTS
from pto.orchestration.llama.program import FAMILY as LAYER
from pto.orchestration.llama.program import layer_module, packed_weights
from pto.orchestration.llama.reference import rope_tables
from pto.orchestration.llama.tiling import LayerForm
from pto.orchestration.llama.tiling import allreduce_dtype as reduce_dtype  # (the argument's name)
from pto.orchestration.llm.sampling import Sampler
from pto.orchestration.model.checkpoint import ModelWeights
from pto.orchestration.model.decode import DecodeTiling, build_step, vocab_split
from pto.orchestration.model.program import PROGRAM as STEP
from pto.orchestration.model.program import (
    auto_step_executor,
    shard_inputs,
    stack_weights,
    tiling_for,
    tiling_for_executor,
    unstack_weights,
)
from pto.orchestration.model.quantized import (
    STACKED,
    LayerDequantizer,
    WeightTypes,
    embedding_rows,
    for_weights,
    is_quantized,
    layer_wtypes,
    stored_layer,
)

from pto.errors import UsageError
from pto.ir.dtypes import DType


@dataclass
class Generation:
    """What a generation made: every sequence's new tokens and the timings."""

    tokens: list[list[int]]
    prompt_tokens: list[int]
    prefill_ms: float  # the prompts through the layers (without prefill_prepare_ms)
    decode_ms: list[float] = field(default_factory=list)  # per step (graph replay, device-synchronized)
    capacity: int = 0
    tasks_per_step: int = 0
    executor: str = ""
    #: the decode step's preparation for this batch and capacity (its graph built, the weights
    #: stacked onto the device; 0 when an earlier generation prepared it)
    prepare_ms: float = 0.0
    #: the prefill's preparation: the layer's graph built for a new prompt length, its kernels
    #: compiled or loaded on its first run (:meth:`Generator.prefill`; 0 when done before)
    prefill_prepare_ms: float = 0.0

    def to_json(self) -> dict:
        steps = len(self.decode_ms)
        per = sorted(self.decode_ms)[steps // 2] if steps else None
        return {"new_tokens": [len(t) for t in self.tokens], "prompt_tokens": self.prompt_tokens,
                "prepare_ms": round(self.prepare_ms, 3), "prefill_ms": round(self.prefill_ms, 3),
                "prefill_prepare_ms": round(self.prefill_prepare_ms, 3),
                "first_step_ms": round(self.decode_ms[0], 3) if steps else None, "steps": steps,
                "ms_per_token": None if per is None else round(per, 4),
                "tokens_per_s": None if not per else round(len(self.tokens) * 1e3 / per, 1),
                "cache": self.capacity, "tasks_per_step": self.tasks_per_step, "executor": self.executor}


#: how the prefill takes quantized layer weights (:class:`Generator`'s ``quant_prefill``):
#: every kind as stored, every kind dequantized first, or "auto" (:data:`NATIVE_PREFILL`)
QUANT_PREFILL = ("auto", "dequantize", "native")
#: "auto": the weight types the prefill takes as stored, by device type, where that measured
#: faster than dequantizing first (docs/PERF.md, "The prefill on quantized weights"): on an H200
#: q8_0 (the 8B model's 512-token prefill 67.1 against 73.1 ms; q4_k 74.4 against 72.5, so not
#: it), on the development VM's CPU q4_1 (SmolLM2's file, 1,017 against 1,071 ms) and q8_0
NATIVE_PREFILL = {"cuda": frozenset({"q8_0"}), "cpu": frozenset({"q8_0", "q4_1"})}


def quant_prefill_mode(asked: str | None) -> str:
    """``asked``, else ``$PTO_QUANT_PREFILL``, else ``auto``; one of :data:`QUANT_PREFILL`."""
    mode = asked if asked is not None else os.environ.get("PTO_QUANT_PREFILL", "").strip() or "auto"
    if mode not in QUANT_PREFILL:
        src = "quant_prefill" if asked is not None else "PTO_QUANT_PREFILL"
        raise UsageError(f"{src}={mode!r}: expected {', '.join(QUANT_PREFILL)}")
    return mode


def prefill_kinds(wtypes: WeightTypes, mode: str, device: str) -> tuple[WeightTypes, WeightTypes]:
    """The quantized layer kinds of ``wtypes`` the prefill takes as stored under ``mode`` (a
    :data:`QUANT_PREFILL`) on a ``device`` of that type, and those it dequantizes first."""
    ok = {"native": None, "dequantize": frozenset(), "auto": NATIVE_PREFILL.get(device, frozenset())}[mode]
    layers = [(k, d) for k, d in wtypes.types if k in STACKED]
    stored = tuple((k, d) for k, d in layers if ok is None or d.short in ok)
    return WeightTypes(stored), WeightTypes(tuple(kd for kd in layers if kd not in stored))


def ring_runs(n: int, capacity: int) -> list[tuple[int, int, int]]:
    """Where a prompt of ``n`` positions goes in a cache ring of ``capacity`` slots: the last
    ``capacity`` positions (all, when they fit), position ``p`` in slot ``p % capacity``, as
    runs of consecutive slots, (first position, its slot, positions): one run, two once the
    ring has wrapped."""
    p, runs = max(0, n - capacity), []
    while p < n:
        slot = p % capacity
        count = min(n - p, capacity - slot)
        runs.append((p, slot, count))
        p += count
    return runs


def capacity_for(weights: ModelWeights, longest: int, chunk: int | None = None) -> int:
    """The cache slots a generation needs: the window of a sliding-window model, else the
    smallest power of two of whole attention chunks holding ``longest`` positions."""
    cfg = weights.config
    if cfg.layer.window:
        return cfg.layer.window
    if longest > cfg.max_positions:
        raise UsageError(f"the prompt and the new tokens need {longest} positions; the model's context holds "
                         f"{cfg.max_positions}")
    cap = chunk or tiling_for(cfg).chunk
    while cap < longest:
        cap *= 2
    return cap


class Generator:
    """A model's weights on a device, ready to generate for batches of prompts: the layer's
    prepared graphs for prefill (one per prompt length, cached) and the decode step's (one per
    batch size and capacity, cached). ``tp``: this process is one of that many ranks, whose
    partial sums are summed in the storage dtype or f32 (``allreduce_dtype``), with the LM head
    split by vocabulary (``vocab_parallel``, the default) or replicated. ``quant_prefill`` (None:
    ``$PTO_QUANT_PREFILL``, by default ``dequantize``): how the prefill takes quantized layer
    weights: ``dequantize`` each layer's to dense matrices on the device first
    (:class:`~pto.orchestration.model.quantized.LayerDequantizer`), ``native`` as stored, the
    layer's projections dequantizing their tiles as they load them (``LayerForm.wtypes``)."""

    def __init__(self, weights: ModelWeights, device: str, dtype: DType, backend: str = "auto",
                 executor: str = "auto", tiling: DecodeTiling | None = None, tp: int = 1,
                 allreduce_dtype: str = "storage", vocab_parallel: bool = True, quant_prefill: str | None = None):
        from pto.engine import placement
        from pto.machine import dist
        from pto.machine.target import resolve as resolve_target

        self.weights, self.config = weights, weights.config
        self.dtype = dtype
        #: what the step's weight inputs are stored as (quantized: :mod:`pto.orchestration.model.quantized`)
        self.wtypes = WeightTypes.of(weights)
        self.tp, self.rank = tp, dist.rank() if tp > 1 else 0
        # where the step and the layer run (the programs' own executor choices), checked now: the
        # step of one sequence's; a batch's may differ (:meth:`step_placement`)
        self._executor, self._tiling = executor, tiling
        self._places: dict[int, tuple] = {}
        self.step_place = placement(STEP, device, dtype, backend, executor, self._auto(1))
        self.layer_place = placement(LAYER, device, dtype, self.step_place.backend)
        self.device, self.backend = self.step_place.device, self.step_place.backend
        self.target = resolve_target(None, self.device)
        # the step's block sizes (the bench sweeps them): the executor's (the megakernel's are wider;
        # every executor's share the attention chunk and the weights' layout, which this one gives)
        self.tiling = tiling or tiling_for_executor(self.config, self.step_place.executor, self.target)
        # the dtype the ranks' partial sums are summed in (the model program's --allreduce-dtype)
        self.reduce = reduce_dtype(dtype, allreduce_dtype)
        if tp > 1 and dist.world_size() != tp:
            raise UsageError(f"--tp {tp} runs one process per rank (torchrun --nproc-per-node {tp}); this process "
                             f"group has {dist.world_size()}")
        try:
            self.local = self.config.shard(tp)  # this rank's layers
            self.vocab_parallel = vocab_parallel
            self.split = vocab_split(self.config, tp, vocab_parallel)  # (None: the whole head)
        except ValueError as e:
            raise UsageError(f"--tp {tp}: {e}") from None
        # the layer whole on every rank, its keys and values outputs (a GPU's whole row tiles,
        # as the layer program's --row-tiles auto)
        self.layer_form = LayerForm(whole=self.target.is_gpu, kv_out=True)
        self.quant_prefill = quant_prefill_mode(quant_prefill)
        self._layers: dict = {}
        self._steps: dict = {}
        self._weights: dict[str, torch.Tensor] | None = None  # the step's, on the device (_stacked)
        self._layer_views: list[dict[str, torch.Tensor]] | None = None  # each layer's, views of them
        #: what dequantizes a layer's weights for the prefill (made once, from the step's own tensors)
        self._dequantizer: LayerDequantizer | None = None
        if tp > 1 and self.wtypes.quantized:
            raise UsageError(f"--tp {tp}: quantized weights run on one rank (pto generate --dequantize)")
        #: the quantized kinds the prefill takes as stored (PTO_QUANT_PREFILL) and those it
        #: dequantizes first, and the layer's matrices of the first
        self.stored, self.dequantized = prefill_kinds(self.wtypes, self.quant_prefill, torch.device(self.device).type)
        self.native = layer_wtypes(self.stored)
        if self.native:
            self.layer_form = replace(self.layer_form, wtypes=self.native)
        self.cos, self.sin = rope_tables(self.config.max_positions, self.config.layer, dtype, self.device)

    # -- the decode step ----------------------------------------------------------------------
    def _auto(self, batch: int) -> str:
        """What the executor ``auto`` means for a step of ``batch`` sequences (the model program's
        rule: :func:`~pto.orchestration.model.program.auto_step_executor`)."""
        return auto_step_executor(self.tp, self.wtypes.quantized, self.config.layer.hidden, batch)

    def step_placement(self, batch: int):
        """Where a step of ``batch`` sequences runs and its tiles: the executor asked, or ``auto``'s
        for that batch (a narrow model's few sequences on the launches, more on the megakernel),
        with that executor's tiles (unless the tiles were given)."""
        if batch not in self._places:
            from pto.engine import placement

            place = placement(STEP, self.device, self.dtype, self.backend, self._executor, self._auto(batch))
            tiling = self._tiling or tiling_for_executor(self.config, place.executor, self.target)
            self._places[batch] = (place, tiling)
        return self._places[batch]

    def step(self, batch: int, capacity: int):
        """The decode step's prepared graph for ``batch`` sequences of ``capacity`` slots."""
        key = (batch, capacity)
        chunk = self.tiling.chunk
        if capacity < chunk or capacity % chunk:
            raise UsageError(f"a decode step of {capacity} cache slots: the attention chunk is {chunk} slots, and the "
                             "cache must be whole chunks")
        if key not in self._steps:
            from pto.engine import Prepared, build_module_graph

            place, tiling = self.step_placement(batch)
            module = build_step(self.config, self.dtype, self.target, batch, tiling, self.tp, self.reduce,
                                cache=capacity, wtypes=self.wtypes, vocab_parallel=self.vocab_parallel)
            built = build_module_graph(module, {"B": batch, "C": capacity}, target=self.target)
            inputs = {**self._stacked(), "cos": self.cos, "sin": self.sin}
            kvd = self.local.layer.kv_dim
            for name in ("k_cache", "v_cache"):  # slots never written are masked, and finite
                inputs[name] = torch.zeros(self.config.layers * batch * capacity, kvd, dtype=self.dtype.torch,
                                           device=self.device)
            inputs.update(tok=torch.zeros(batch, 1, device=self.device), pos=torch.zeros(batch, 1, device=self.device))
            self._steps[key] = Prepared(built, place, inputs)
        return self._steps[key]

    def _stacked(self) -> dict[str, torch.Tensor]:
        """The step's weight inputs (this rank's), made once and shared by every step's graph
        (read-only): each tensor moved to the device first, then stacked there (on a GPU the
        transposes and copies of :func:`stack_weights` take milliseconds where the host takes
        seconds)."""
        if self._weights is None:
            w, dev = self.weights, self.device
            if self.wtypes.quantized:  # (stacked as they are stored, then moved: one rank)
                t = for_weights(self.tiling, self.wtypes)
                self._weights = {k: v.to(dev) for k, v in stack_weights(w, t.wt, t.lm_wt).items()}
                return self._weights
            emb = w.embedding.to(dev)
            tied = w.lm_head.untyped_storage().data_ptr() == w.embedding.untyped_storage().data_ptr()
            moved = ModelWeights(w.config, emb, w.norm.to(dev), emb.t() if tied else w.lm_head.to(dev),
                                 [{k: v.to(dev) for k, v in layer.items()} for layer in w.layers])
            stacked = stack_weights(moved, self.tiling.wt, self.tiling.lm_wt)
            if self.tp > 1:
                stacked = shard_inputs(self.config, stacked, self.tp, self.rank, self.tiling.wt, self.split,
                                       self.tiling.lm_wt)
            self._weights = stacked
        return self._weights

    # -- prefill ------------------------------------------------------------------------------
    def _layer(self, seq: int):
        """The layer's prepared graph at ``seq`` tokens (cached by length)."""
        if seq not in self._layers:
            from pto.engine import Prepared, build_module_graph

            layer = self.config.layer
            module = layer_module(layer, self.dtype, self.target, self.layer_form)
            built = build_module_graph(module, {"S": seq}, target=self.target)
            self._layers[seq] = Prepared(built, self.layer_place, packed=packed_weights(layer, self.layer_form))
        return self._layers[seq]

    def prefill(self, step, prompts: list[list[int]], capacity: int) -> float:
        """Fill each sequence's cache block with its prompt but the last token, and set its token
        and position for the first step. Returns the milliseconds of it that prepared rather than
        computed: the layer's graph built for a new prompt length (a first run compiles its C)
        and its first run's kernels compiled or loaded (``ExecStats.kernel_compile_ms``)."""
        t = step.tensors
        L, B = self.config.layers, len(prompts)
        kvd = self.local.layer.kv_dim
        heads = slice(self.rank * kvd, (self.rank + 1) * kvd)  # this rank's key/value heads
        keys, values = KV_OUTPUTS
        prepare_ms = 0.0
        for b, prompt in enumerate(prompts):
            n = len(prompt) - 1
            if n > 0:
                # the prompt's rows gathered where the embedding is (on the host: the model's weights
                # as loaded), then copied from pinned memory and not waited for (from pageable
                # memory the host would wait for the prompt before)
                x = embedding_rows(self.weights.embedding, torch.tensor(prompt[:n])).to(self.dtype.torch)
                if x.device.type == "cpu" and torch.device(self.device).type == "cuda":
                    x = x.pin_memory().to(self.device, non_blocking=True)
                else:
                    x = x.to(self.device)
                fresh, t0 = n not in self._layers, time.perf_counter()
                layer = self._layer(n)
                prepare_ms += (time.perf_counter() - t0) * 1e3 if fresh else 0.0
                # each layer's host work is what a GPU's prefill waits on (docs/PERF.md): the
                # RoPE tables copied in once per graph (every call of it takes the same rows),
                # the keys and values stored by slices, each layer's output copied straight in
                # as the next one's input
                runs = ring_runs(n, capacity)
                fixed = {"cos": self.cos[:n], "sin": self.sin[:n]} if layer.stats is None else {}
                layer_in = {"x": x}
                for i in range(L):
                    first = layer.stats is None
                    out = layer({**layer_in, **fixed, **self._layer_inputs(i)})
                    fixed, layer_in = {}, {}
                    prepare_ms += layer.stats.kernel_compile_ms if first else 0.0
                    row = (i * B + b) * capacity
                    for src, dst in ((keys, "k_cache"), (values, "v_cache")):
                        for at, slot, count in runs:
                            t[dst][row + slot:row + slot + count] = out[src][at:at + count, heads]
                    if i + 1 < L:  # (the last layer's output is not wanted: the step makes the logits)
                        layer.tensors["x"].copy_(out["y"])
        # each sequence's token and position in one copy a tensor, from pinned memory and not
        # waited for, after every prompt's layers are queued (a number set into a device tensor, or
        # a copy from pageable memory, makes the host wait for the device: per prompt, the next
        # prompt's host work waited for this one's layers)
        for name, values in (("tok", [p[-1] for p in prompts]), ("pos", [len(p) - 1 for p in prompts])):
            src = torch.tensor(values, dtype=t[name].dtype)
            t[name][:B, 0].copy_(src.pin_memory() if t[name].is_cuda else src, non_blocking=True)
        return prepare_ms

    def _layer_inputs(self, layer: int) -> dict[str, torch.Tensor]:
        """Layer ``layer``'s weights for the layer's graph: quantized kinds as stored (``native``:
        views of the step's own output-major rows of blocks) or dequantized (dense, ``[in, out]``)
        on the device from the step's own tensors, a layer at a time
        (:class:`~pto.orchestration.model.quantized.LayerDequantizer`); the others views of the
        step's stacked ones (one rank), or the whole layer's from the host (each rank holds its
        share only)."""
        if self.tp == 1:
            if self._layer_views is None:
                if self.wtypes.quantized:  # (the quantized kinds come as stored or from the dequantizer)
                    self._layer_views = [{k: v.to(self.device) for k, v in w.items() if not is_quantized(v)}
                                         for w in self.weights.layers]
                    if self.native:  # the step's own quantized rows, as the layer's nk projections take them
                        for i, w in enumerate(self._layer_views):
                            w.update(stored_layer(self._stacked(), self.stored, self.config, i))
                else:
                    self._layer_views = unstack_weights(self.config, self._stacked(), self.tiling.wt,
                                                        self.tiling.lm_wt).layers
            w = dict(self._layer_views[layer])
        else:
            w = {k: v.to(self.device) for k, v in self.weights.layers[layer].items()}  # (dense: quantized on one rank)
        if self.dequantized.quantized:
            if self._dequantizer is None:
                from pto.backends import get_backend

                backend = get_backend(self.backend, self.device)
                self._dequantizer = LayerDequantizer(backend, self.dequantized, self._stacked(), self.config,
                                                     self.dtype)
            w.update(self._dequantizer(layer))
        return w

    @property
    def prefill_buffer_bytes(self) -> int:
        """The bytes of the dense copies the prefill made of quantized layer matrices (the
        dequantizer's buffers: at most ``DEQUANT_BUDGET``, or one layer's where a layer is larger;
        0 where the prefill read every kind as stored or none is quantized)."""
        return self._dequantizer.nbytes if self._dequantizer is not None else 0

    # -- generating ---------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 on_step: Callable[[list[int | None]], None] | None = None, stop_ids=None,
                 sampler: Sampler | None = None) -> Generation:
        """Generation for a batch of prompts, greedy (the step's own argmax) or with ``sampler``
        (temperature, top-k, top-p, seeded: the step's logits sampled on the device and the token
        written back into the step's state before the next replay); ``on_step(tokens)`` after each
        step (None for a sequence that has stopped: it produced a token of ``stop_ids``, by
        default the model's end tokens)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise UsageError("every prompt needs at least one token")
        if max_new_tokens < 1:
            raise UsageError(f"--max-new-tokens must be positive, got {max_new_tokens}")
        capacity = capacity_for(self.weights, max(map(len, prompts)) + max_new_tokens, self.tiling.chunk)
        t0 = time.perf_counter()
        step = self.step(len(prompts), capacity)
        t1 = time.perf_counter()
        prefill_prepare_ms = self.prefill(step, prompts, capacity)
        self._sync()
        out = Generation([[] for _ in prompts], [len(p) for p in prompts],
                         (time.perf_counter() - t1) * 1e3 - prefill_prepare_ms, capacity=capacity,
                         tasks_per_step=step.graph.tasks, prepare_ms=(t1 - t0) * 1e3,
                         prefill_prepare_ms=prefill_prepare_ms)
        stop = set(self.config.eos_ids if stop_ids is None else stop_ids)
        done = [False] * len(prompts)
        for _ in range(max_new_tokens):
            t1 = time.perf_counter()
            step()
            if sampler is not None and not sampler.greedy:
                t = step.tensors
                t["tok"].copy_(sampler(self.logits(step)).to(t["tok"].dtype)[:, None])
            self._sync()
            out.decode_ms.append((time.perf_counter() - t1) * 1e3)
            new = [None if d else int(v) for d, v in zip(done, step.tensors["tok"].view(-1).tolist())]
            for seq, tok in zip(out.tokens, new):
                if tok is not None:
                    seq.append(tok)
            if on_step is not None:
                on_step(new)
            done = [d or tok in stop for d, tok in zip(done, new)]
            if all(done):
                break
        out.executor = step.executor.name
        return out

    def logits(self, step) -> torch.Tensor:
        """The last step's whole ``[B, vocab]`` logits, on every rank: the step's own, or under
        the vocabulary-parallel head every rank's share joined (a collective)."""
        local = step.tensors["logits"]
        if self.split is None:
            return local
        from pto.orchestration.model.vocab import whole_logits

        return whole_logits(local, self.split)

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def close(self) -> None:
        for r in [*self._layers.values(), *self._steps.values()]:
            r.close()


__all__ = ["Generator", "Generation", "capacity_for"]
