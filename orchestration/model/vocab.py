"""The vocabulary-parallel LM head's split: which ids each rank's share holds, its shard of the
LM head, where its candidate goes, and the whole logits from the ranks' shares.

Rank r of ``ranks`` holds ids ``[start(r), start(r) + count(r))``, ``start(r) = r V // ranks``
(balanced: the counts differ by at most one, each at least one where ``V >= ranks``). Every
rank's step is the same module (docs/ARCHITECTURE.md, "Why every rank issues the same
collectives in the same order"), so every share is :attr:`VocabSplit.height` ids tall: a short
share is padded with copies of its own first row. A copy's logit equals that row's bit for bit
(the same weights, the same products), and the argmax takes the first of equal values, the real
row: a pad never wins, and its logits are dropped when the shares are joined
(:func:`whole_logits`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pto.incore.vocab import candidate_width

from pto import dist


@dataclass(frozen=True)
class VocabSplit:
    """``vocab`` ids over ``ranks`` ranks."""

    vocab: int
    ranks: int

    def __post_init__(self):
        if self.vocab < self.ranks:
            raise ValueError(f"the vocabulary of {self.vocab} ids does not divide among {self.ranks} ranks")

    def start(self, rank: int) -> int:
        return rank * self.vocab // self.ranks

    def count(self, rank: int) -> int:
        return self.start(rank + 1) - self.start(rank)

    @property
    def height(self) -> int:
        """Ids in every rank's share, padded: the largest count."""
        return -(-self.vocab // self.ranks)

    @property
    def width(self) -> int:
        """Columns of the candidates' row (:func:`pto.incore.vocab.candidate_width`)."""
        return candidate_width(self.ranks)

    def shard_head(self, head: torch.Tensor, rank: int, output_major: bool) -> torch.Tensor:
        """Rank ``rank``'s share of the LM head ``head`` (``[V, H]`` when ``output_major``, else
        ``[H, V]``), padded to :attr:`height` ids with copies of its first id's weights."""
        rows = head if output_major else head.t()
        a, n = self.start(rank), self.count(rank)
        share = torch.cat([rows[a:a + n], rows[a:a + 1].expand(self.height - n, -1)])
        return (share if output_major else share.t()).contiguous()

    def place(self, rank: int, device=None) -> torch.Tensor:
        """``[3, width]`` f32: row 0 one at the rank's logit column (``rank``), row 1 one at its id
        column (``ranks + rank``), row 2 the share's first id (what the argmax_candidates task
        reads)."""
        out = torch.zeros(3, self.width, device=device)
        out[0, rank] = 1.0
        out[1, self.ranks + rank] = 1.0
        out[2] = float(self.start(rank))
        return out

    def join(self, shares: list[torch.Tensor]) -> torch.Tensor:
        """The whole ``[B, V]`` logits from every rank's ``[B, height]`` share, the pads dropped."""
        return torch.cat([s[:, :self.count(r)] for r, s in enumerate(shares)], 1)


def whole_logits(local: torch.Tensor, split: VocabSplit) -> torch.Tensor:
    """The whole logits on every rank from each rank's share ``local`` (a collective: every rank
    calls it, in the same order)."""
    return split.join(dist.all_gather(local))


__all__ = ["VocabSplit", "whole_logits"]
