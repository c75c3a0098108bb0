"""Choosing the next token from logits: greedy (the most likely token, ties to the lowest id as
``torch.argmax`` breaks them) or sampled at a temperature from the ``top_k`` most likely tokens
and/or the smallest set whose probability reaches ``top_p`` (nucleus), with a seeded
``torch.Generator`` so that a run repeats."""

from __future__ import annotations

import math

import torch

from pto.errors import UsageError


class Sampler:
    """``temperature`` 0 (the default): greedy; above 0: sample from ``softmax(logits /
    temperature)`` restricted by ``top_k`` (None, or the vocabulary's size or more: no limit, as
    transformers clamps it) and ``top_p`` (None or 1: no limit), drawing from a generator seeded
    with ``seed``."""

    def __init__(self, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                 seed: int = 0):
        if not 0 <= temperature < math.inf:
            raise UsageError(f"temperature must be 0 (greedy) or a positive number, got {temperature}")
        if top_k is not None and top_k < 1:
            raise UsageError(f"top-k must be at least 1, got {top_k}")
        if top_p is not None and not 0 < top_p <= 1:
            raise UsageError(f"top-p must be in (0, 1], got {top_p}")
        self.temperature, self.top_k, self.top_p, self.seed = temperature, top_k, top_p, seed
        self._generators: dict[str, torch.Generator] = {}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def _generator(self, device: torch.device) -> torch.Generator:
        """One generator per device, seeded once: successive calls continue one random stream."""
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[key]

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """``[B, vocab]`` float32: the distribution sampled from (zero outside top-k / top-p)."""
        z = logits.float() / self.temperature
        if self.top_k is not None and self.top_k < z.shape[-1]:
            kth = torch.topk(z, self.top_k, dim=-1).values[..., -1:]
            z = z.masked_fill(z < kth, float("-inf"))
        probs = torch.softmax(z, dim=-1)
        if self.top_p is not None and self.top_p < 1:
            p, order = torch.sort(probs, dim=-1, descending=True)
            # keep a token while the tokens before it hold less than top_p: the first always stays
            drop = (p.cumsum(-1) - p) >= self.top_p
            probs = probs.scatter(-1, order, p.masked_fill(drop, 0.0))
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token of each row of ``logits [B, vocab]``: ``[B]`` int64."""
        if self.greedy:
            return logits.argmax(dim=-1)
        probs = self.probabilities(logits)
        return torch.multinomial(probs, 1, generator=self._generator(probs.device))[:, 0]


__all__ = ["Sampler"]
