"""The whole model in plain torch with a preallocated KV cache: the oracle the task-graph decode
program is checked against, written to match transformers' ``LlamaForCausalLM`` (same operation
order: RMSNorm in float32 then the weight in the run's dtype, attention scores scaled after the
product, softmax in float32) in any dtype on any device.

State is explicit: a :class:`KVCache` holds every layer's keys and values
``[layers, batch, kv_heads, capacity, head_dim]`` and each sequence's length (= the position
of its next token); the model holds only weights. Each call appends tokens to every sequence at
that sequence's own position, attending to what the cache holds plus the new tokens, then
writes the new keys and values in place.

Batches of prompts of different lengths are right-padded: :meth:`ReferenceModel.prefill` takes
``tokens [batch, T]`` and ``lengths [batch]``, and sequence ``b`` uses its first
``lengths[b]`` tokens at positions ``0 .. lengths[b] - 1`` (padding is never written to the
cache and never attended to), so every sequence computes exactly what it would alone.
:meth:`ReferenceModel.decode_step` then gives each sequence one token at its own position.

A sliding window (``LlamaConfig.window``: query ``q`` sees keys ``q - window < k <= q``) shorter
than the cache makes the cache a ring of ``window`` slots: position ``p`` lives in slot ``p %
window``, overwriting the position ``window`` before it, which no later query can see.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from pto.orchestration.llama.reference import inv_frequencies
from pto.orchestration.model.checkpoint import ModelWeights
from pto.orchestration.model.config import ModelConfig

from pto.errors import UsageError


@dataclass
class KVCache:
    """Keys and values of ``batch`` sequences, with room for positions ``0 .. max_len - 1``.
    ``k``, ``v``: ``[layers, batch, kv_heads, capacity, head_dim]``, RoPE already applied to
    ``k``; ``lengths[b]``: tokens sequence ``b`` holds, the position of its next token.
    ``capacity`` is ``max_len``, or the sliding window when that is shorter (a ring)."""

    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor  # [batch] int64
    max_len: int

    @classmethod
    def allocate(cls, config: ModelConfig, batch: int, max_len: int, dtype: torch.dtype, device) -> KVCache:
        """An empty cache (zeros: a slot never written is masked, and must not be NaN either)."""
        if batch < 1 or max_len < 1:
            raise UsageError(f"a KV cache needs at least one sequence and one position, got {batch} x {max_len}")
        if max_len > config.max_positions and not config.layer.window:
            raise UsageError(f"a KV cache of {max_len} positions exceeds the model's context of "
                             f"{config.max_positions} tokens")
        cfg = config.layer
        cap = min(max_len, cfg.window) if cfg.window else max_len
        shape = (config.layers, batch, cfg.kv_heads, cap, cfg.head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(batch, dtype=torch.int64, device=device), max_len)

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def ring(self) -> bool:
        """Whether positions wrap around (a sliding window shorter than ``max_len``)."""
        return self.capacity < self.max_len

    def slot_positions(self) -> torch.Tensor:
        """``[batch, capacity]``: the position each slot holds (-1: none yet): the newest
        position below the sequence's length that maps to the slot."""
        last = self.lengths[:, None] - 1
        slots = torch.arange(self.capacity, device=self.lengths.device)[None, :]
        pos = last - torch.remainder(last - slots, self.capacity)
        return torch.where(pos >= 0, pos, -1)

    def reset(self) -> None:
        """Forget every sequence (the tensors are reused)."""
        self.lengths.zero_()


def rms_norm(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as transformers computes it: normalized in float32, cast back, then scaled."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * g


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in Hugging Face's convention: the two halves of each head form the pairs."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention, grouped-query: ``q [B, heads, T, D]`` against ``keys``, ``values`` ``[B,
    kv_heads, S, D]`` (query head ``h`` uses key/value head ``h // group``), ``mask [B, T, S]``
    what each query sees. A query that sees nothing (a padding row) gets zeros, not NaN."""
    B, NH, T, D = q.shape
    KVH, S = keys.shape[1], keys.shape[2]
    G = NH // KVH
    scores = (q.reshape(B, KVH, G * T, D) @ keys.transpose(-1, -2)) * D ** -0.5
    m = mask[:, None, None].expand(B, 1, G, T, S).reshape(B, 1, G * T, S)
    probs = torch.softmax(scores.float().masked_fill(~m, float("-inf")), dim=-1)
    probs = torch.where(m.any(-1, keepdim=True), probs, 0.0).to(q.dtype)
    return (probs @ values).reshape(B, NH, T, D)


class ReferenceModel:
    """A model computing with :class:`~.checkpoint.ModelWeights` (their dtype and device)."""

    def __init__(self, weights: ModelWeights):
        self.weights = weights
        self.config = weights.config
        self._inv_freq = inv_frequencies(self.config.layer).to(weights.device)  # float64

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """An empty cache for ``batch`` sequences of up to ``max_len`` tokens each."""
        return KVCache.allocate(self.config, batch, max_len, self.weights.dtype, self.weights.device)

    def rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[*positions.shape, head_dim]`` (halves repeated), angles in float64 and
        rounded once to the weights' dtype."""
        ang = positions.to(torch.float64)[..., None] * self._inv_freq
        ang = torch.cat([ang, ang], dim=-1)
        return ang.cos().to(self.weights.dtype), ang.sin().to(self.weights.dtype)

    def forward(self, cache: KVCache, tokens: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """Append ``counts[b]`` (default: all T) of ``tokens [B, T]`` to each sequence of ``cache``;
        the final-normed hidden states ``[B, T, hidden]`` (rows past ``counts[b]``: padding,
        whatever they hold)."""
        w, cfg = self.weights, self.config.layer
        tokens, counts = self._check(cache, tokens, counts)
        B, T = tokens.shape
        steps = torch.arange(T, device=tokens.device)
        valid = steps[None, :] < counts[:, None]  # [B, T]
        pos = cache.lengths[:, None] + steps[None, :]  # [B, T]: each sequence at its own position
        n_old = min(cache.capacity, int(cache.lengths.max()))
        key_pos = torch.cat([cache.slot_positions()[:, :n_old], torch.where(valid, pos, -1)], dim=1)
        seen = (key_pos[:, None, :] >= 0) & (key_pos[:, None, :] <= pos[:, :, None])  # [B, T, S]
        if cfg.window:
            seen &= pos[:, :, None] - key_pos[:, None, :] < cfg.window
        cos, sin = (t[:, None] for t in self.rope_tables(pos))
        x = w.embedding[tokens]
        for i, lw in enumerate(w.layers):
            h = rms_norm(x, lw["g_attn"], cfg.eps)
            q = rotate((h @ lw["wq"]).view(B, T, cfg.heads, cfg.head_dim).transpose(1, 2), cos, sin)
            k = rotate((h @ lw["wk"]).view(B, T, cfg.kv_heads, cfg.head_dim).transpose(1, 2), cos, sin)
            v = (h @ lw["wv"]).view(B, T, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
            keys = torch.cat([cache.k[i, :, :, :n_old], k], dim=2)
            values = torch.cat([cache.v[i, :, :, :n_old], v], dim=2)
            a = attend(q, keys, values, seen)
            x = x + a.transpose(1, 2).reshape(B, T, cfg.q_dim) @ lw["wo"]
            h = rms_norm(x, lw["g_ffn"], cfg.eps)
            x = x + (torch.nn.functional.silu(h @ lw["wg"]) * (h @ lw["wu"])) @ lw["wd"]
            self._store(cache, i, k, v, pos, valid)
        cache.lengths += counts
        return rms_norm(x, w.norm, self.config.layer.eps)

    def _check(self, cache: KVCache, tokens: torch.Tensor, counts) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens`` and ``counts`` on the cache's device, padding set to token 0; one UsageError
        for a bad shape, an id outside the vocabulary or a sequence that would overflow."""
        dev = cache.lengths.device
        tokens = torch.as_tensor(tokens, device=dev).long()
        if tokens.dim() != 2 or tokens.shape[0] != cache.batch or tokens.shape[1] < 1:
            raise UsageError(f"tokens must be [{cache.batch}, T >= 1] for this cache, got {list(tokens.shape)}")
        T = tokens.shape[1]
        counts = torch.full((cache.batch,), T, device=dev) if counts is None else torch.as_tensor(counts, device=dev)
        counts = counts.long()
        if counts.shape != (cache.batch,) or bool((counts < 0).any() | (counts > T).any()):
            raise UsageError(f"token counts must be {cache.batch} numbers in 0 .. {T}, got {counts.tolist()}")
        valid = torch.arange(T, device=dev)[None, :] < counts[:, None]
        tokens = tokens.masked_fill(~valid, 0)
        if bool((tokens < 0).any() | (tokens >= self.config.vocab).any()):
            raise UsageError(f"a token id outside the vocabulary 0 .. {self.config.vocab - 1}")
        ends = cache.lengths + counts
        if int(ends.max()) > cache.max_len:
            raise UsageError(f"a sequence would reach {int(ends.max())} tokens, past the cache's {cache.max_len}")
        return tokens, counts

    @staticmethod
    def _store(cache: KVCache, layer: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
               valid: torch.Tensor) -> None:
        """Write the new keys and values ``[B, kv_heads, T, D]`` of the valid tokens at their
        slots; in a ring only each sequence's last ``capacity`` (earlier ones would be overwritten
        in the same write, whose order torch does not define)."""
        last = torch.where(valid, pos, -1).max(dim=1, keepdim=True).values
        keep = valid & (pos > last - cache.capacity)
        b, t = keep.nonzero(as_tuple=True)
        slot = pos[b, t] % cache.capacity
        cache.k[layer, b, :, slot] = k[b, :, t]
        cache.v[layer, b, :, slot] = v[b, :, t]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head: ``hidden [..., hidden]`` -> ``[..., vocab]``."""
        return hidden @ self.weights.lm_head

    def prefill(self, cache: KVCache, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Feed right-padded prompts ``tokens [B, T]`` of ``lengths [B]`` tokens (default: all T);
        the logits ``[B, vocab]`` after each sequence's last prompt token (a sequence given no
        token keeps the logits of nothing: zeros)."""
        hidden = self.forward(cache, tokens, lengths)
        T = hidden.shape[1]
        n = torch.full((cache.batch,), T, device=hidden.device) if lengths is None else \
            torch.as_tensor(lengths, device=hidden.device).long()
        last = hidden[torch.arange(cache.batch, device=hidden.device), (n - 1).clamp(min=0)]
        return torch.where(n[:, None] > 0, self.logits(last), 0.0)

    def decode_step(self, cache: KVCache, next_tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per sequence (``next_tokens [B]``), each at its own position; the
        logits ``[B, vocab]`` for the token after it."""
        tokens = torch.as_tensor(next_tokens, device=cache.lengths.device).long().view(cache.batch, 1)
        return self.logits(self.forward(cache, tokens)[:, 0])

    def generate_steps(self, prompts: list[list[int]], max_new_tokens: int, sampler: Picker | None = None,
                       stop_ids=None) -> Iterator[list[int | None]]:
        """Generate for a batch of prompts: yields, each step, every sequence's new token (None
        once it has stopped: it produced a token of ``stop_ids``, default the model's end of
        sequence tokens); stops after ``max_new_tokens`` steps or when all have stopped.
        ``sampler``: the next tokens ``[B]`` of logits ``[B, vocab]`` (the generation
        application's ``Sampler``); greedy by default (the most likely token, ties to the lowest
        id)."""
        sampler = sampler or greedy
        stop = set(self.config.eos_ids if stop_ids is None else stop_ids)
        if not prompts or any(len(p) == 0 for p in prompts):
            raise UsageError("every prompt needs at least one token")
        cache = self.new_cache(len(prompts), max(map(len, prompts)) + max_new_tokens)
        tokens, lengths = pad_prompts(prompts, device=cache.lengths.device)
        logits = self.prefill(cache, tokens, lengths)
        done = [False] * len(prompts)
        for _ in range(max_new_tokens):
            nxt = sampler(logits)
            out = [None if d else int(t) for d, t in zip(done, nxt.tolist())]
            yield out
            done = [d or t in stop for d, t in zip(done, out)]
            if all(done):
                return
            logits = self.decode_step(cache, nxt)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, sampler: Picker | None = None,
                 stop_ids=None) -> list[list[int]]:
        """The new tokens of each prompt (ending with its stop token when it produced one)."""
        out: list[list[int]] = [[] for _ in prompts]
        for step in self.generate_steps(prompts, max_new_tokens, sampler, stop_ids):
            for seq, t in zip(out, step):
                if t is not None:
                    seq.append(t)
        return out


#: a rule that picks each sequence's next token: logits ``[B, vocab]`` -> tokens ``[B]`` (int64)
Picker = Callable[[torch.Tensor], torch.Tensor]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The most likely token of each row (ties to the lowest id, as ``torch.argmax`` breaks them)."""
    return logits.argmax(dim=-1)


def pad_prompts(prompts: list[list[int]], pad: int = 0, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``tokens [B, max length]`` and ``lengths [B]`` of token lists."""
    n = max(map(len, prompts))
    tokens = torch.tensor([list(p) + [pad] * (n - len(p)) for p in prompts], dtype=torch.int64, device=device)
    return tokens, torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=device)


__all__ = ["KVCache", "ReferenceModel", "pad_prompts", "rms_norm", "rotate", "attend"]
