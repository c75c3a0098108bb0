"""Text generation with task graphs (``pto generate``): the prompt through the layer program
(prefill, which fills the KV cache), then the decode step's graph (:mod:`.decode`) replayed once
per token.

Prefill runs ``llama``'s layer program on each prompt but its last token, layer by layer, and
copies each layer's keys (after RoPE) and values into the sequence's cache block; the decode
step then starts from the last prompt token at its position, so its first step yields the first
new token. The step's graph is built once for the batch and a cache capacity (a power of two of
whole attention chunks, at least the longest prompt plus the new tokens; the window for a
sliding-window model) and replayed: the token and the position are device data the step itself
advances, so nothing is rebuilt and nothing synchronizes with the host inside a step. Reading the
new tokens back (to print them) happens between steps.

Tensor parallelism (``tp`` > 1, one process per rank under torchrun): every rank's step is its
share of the heads and FFN columns (:func:`~.program.shard_inputs`), its cache the key/value
heads it holds; prefill runs the whole layer on every rank and keeps the rank's heads of the
keys and values. Every rank picks the same tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from pto.orchestration.llama.reference import rope_tables
from pto.orchestration.model.checkpoint import ModelWeights
from pto.orchestration.model.decode import DecodeTiling, build_step
from pto.orchestration.model.decode import allreduce_dtype as reduce_dtype  # (the argument's name)
from pto.orchestration.model.program import PROGRAM, shard_inputs, stack_weights, tiling_for
from pto.orchestration.model.sampling import Sampler

from pto.errors import UsageError
from pto.ir.dtypes import DType


@dataclass
class Generation:
    """What a generation made: every sequence's new tokens and the timings."""

    tokens: list[list[int]]
    prompt_tokens: list[int]
    prefill_ms: float
    decode_ms: list[float] = field(default_factory=list)  # per step (graph replay, device-synchronized)
    capacity: int = 0
    tasks_per_step: int = 0
    executor: str = ""

    def to_json(self) -> dict:
        steps = len(self.decode_ms)
        per = sorted(self.decode_ms)[steps // 2] if steps else None
        return {"new_tokens": [len(t) for t in self.tokens], "prompt_tokens": self.prompt_tokens,
                "prefill_ms": round(self.prefill_ms, 3), "steps": steps,
                "ms_per_token": None if per is None else round(per, 4),
                "tokens_per_s": None if not per else round(len(self.tokens) * 1e3 / per, 1),
                "cache": self.capacity, "tasks_per_step": self.tasks_per_step, "executor": self.executor}


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
    """A model's weights on a device, ready to generate for batches of prompts: the layer
    program's runners for prefill (one per prompt length, cached) and the decode step's graph
    (one per batch size and capacity, cached). ``tp``: this process is one of that many ranks,
    whose partial sums are summed in the storage dtype or f32 (``allreduce_dtype``)."""

    def __init__(self, weights: ModelWeights, device: str, dtype: DType, backend: str = "auto",
                 executor: str = "auto", tiling: DecodeTiling | None = None, tp: int = 1,
                 allreduce_dtype: str = "storage"):
        from pto import dist
        from pto.backends import resolve as resolve_backend

        self.weights, self.config = weights, weights.config
        self.device, self.dtype = device, dtype
        self.backend = resolve_backend(backend, device)
        self.executor = executor
        from pto.target import resolve as resolve_target

        # the step's block sizes (the bench sweeps them)
        self.tiling = tiling or tiling_for(self.config, resolve_target(None, device))
        self.tp, self.rank = tp, dist.rank() if tp > 1 else 0
        # the dtype the ranks' partial sums are summed in (the model program's --allreduce-dtype)
        self.reduce = reduce_dtype(dtype, allreduce_dtype)
        if tp > 1 and dist.world_size() != tp:
            raise UsageError(f"--tp {tp} runs one process per rank (torchrun --nproc-per-node {tp}); this process "
                             f"group has {dist.world_size()}")
        try:
            self.local = self.config.shard(tp)  # this rank's layers
        except ValueError as e:
            raise UsageError(f"--tp {tp}: {e}") from None
        self._layer_jobs: dict = {}
        self._steps: dict = {}
        self.cos, self.sin = rope_tables(self.config.max_positions, self.config.layer, dtype, device)

    # -- the decode step ----------------------------------------------------------------------
    def step(self, batch: int, capacity: int):
        """The decode step's prepared graph for ``batch`` sequences of ``capacity`` slots."""
        key = (batch, capacity)
        chunk = self.tiling.chunk
        if capacity < chunk or capacity % chunk:
            raise UsageError(f"a decode step of {capacity} cache slots: the attention chunk is {chunk} slots, and the "
                             "cache must be whole chunks")
        if key not in self._steps:
            from pto.engine import Placement, Prepared, build_module_graph
            from pto.exec import resolve as resolve_executor
            from pto.target import resolve as resolve_target

            module = build_step(self.config, self.dtype, resolve_target(None, self.device), batch, self.tiling,
                                self.tp, self.reduce, cache=capacity)
            built = build_module_graph(module, {"B": batch, "C": capacity})
            executor = resolve_executor(self.executor, self.device, self.backend)
            if executor == "auto":
                executor = PROGRAM.auto_executor
            place = Placement(self.device, self.backend, executor, schedules=PROGRAM.schedules)
            inputs = stack_weights(self.weights, self.tiling.wt, self.tiling.lm_wt)
            if self.tp > 1:
                inputs = shard_inputs(self.config, inputs, self.tp, self.rank, self.tiling.wt)
            inputs = {k: v.to(self.device) for k, v in inputs.items()}
            inputs.update(cos=self.cos, sin=self.sin)
            kvd = self.local.layer.kv_dim
            for name in ("k_cache", "v_cache"):  # slots never written are masked, and finite
                inputs[name] = torch.zeros(self.config.layers * batch * capacity, kvd, dtype=self.dtype.torch,
                                           device=self.device)
            inputs.update(tok=torch.zeros(batch, 1, device=self.device), pos=torch.zeros(batch, 1, device=self.device))
            self._steps[key] = Prepared(built, place, inputs)
        return self._steps[key]

    # -- prefill ------------------------------------------------------------------------------
    def _layer_runner(self, seq: int):
        """The layer program's runner at ``seq`` tokens (cached by length)."""
        from pto.engine import Runner, resolve

        if seq not in self._layer_jobs:
            job = resolve("llama", device=self.device, backend=self.backend, executor="auto",
                          dtype=self.dtype.short, config=self.config.layer.spec())
            self._layer_jobs[seq] = Runner(job, seq)
        return self._layer_jobs[seq]

    def prefill(self, step, prompts: list[list[int]], capacity: int) -> None:
        """Fill each sequence's cache block with its prompt but the last token, and set its token
        and position for the first step."""
        t = step.tensors
        L, B = self.config.layers, len(prompts)
        kvd = self.local.layer.kv_dim
        heads = slice(self.rank * kvd, (self.rank + 1) * kvd)  # this rank's key/value heads
        for b, prompt in enumerate(prompts):
            n = len(prompt) - 1
            if n > 0:
                x = self.weights.embedding[torch.tensor(prompt[:n])].to(self.device)
                runner = self._layer_runner(n)
                slots = torch.arange(n, device=self.device) % capacity
                keep = slots if n <= capacity else slots[n - capacity:]
                for layer in range(L):
                    y = runner({"x": x, **self._layer_inputs(layer, n)})["y"]
                    row = (layer * B + b) * capacity
                    for src, dst in ((runner.tensors["kr"], "k_cache"), (self._values(runner), "v_cache")):
                        t[dst][row + keep] = src[n - len(keep):, heads]
                    x = y.clone()
            t["tok"][b, 0] = float(prompt[-1])
            t["pos"][b, 0] = float(n)

    def _values(self, runner) -> torch.Tensor:
        """The layer's values: the columns of ``qkv`` after q and k (the unfused layer writes the
        three projections into one tensor), or ``v``."""
        t = runner.tensors
        if "v" in t:
            return t["v"]
        qd, kvd = self.config.layer.q_dim, self.config.layer.kv_dim
        return t["qkv"][:, qd + kvd:qd + 2 * kvd]

    def _layer_inputs(self, layer: int, seq: int) -> dict[str, torch.Tensor]:
        w = self.weights.layers[layer]
        return {**{k: v.to(self.device) for k, v in w.items()}, "cos": self.cos[:seq], "sin": self.sin[:seq]}

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
        step = self.step(len(prompts), capacity)
        t0 = time.perf_counter()
        self.prefill(step, prompts, capacity)
        self._sync()
        out = Generation([[] for _ in prompts], [len(p) for p in prompts], (time.perf_counter() - t0) * 1e3,
                         capacity=capacity, tasks_per_step=step.graph.tasks)
        stop = set(self.config.eos_ids if stop_ids is None else stop_ids)
        done = [False] * len(prompts)
        for _ in range(max_new_tokens):
            t1 = time.perf_counter()
            step()
            if sampler is not None and not sampler.greedy:
                t = step.tensors
                t["tok"].copy_(sampler(t["logits"]).to(t["tok"].dtype)[:, None])
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

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def close(self) -> None:
        for r in [*self._layer_jobs.values(), *self._steps.values()]:
            r.close()


__all__ = ["Generator", "Generation", "capacity_for"]
