"""The vocabulary-parallel LM head, in one process: N ranks' shares of the head (1 to 8, a
vocabulary that divides and ones that do not), each rank's InCore functions run by the reference
interpreter, the all-reduce between the cut's two parts done here by torch over the ranks'
buffers (the same sum the process group computes; tests/dist runs it over gloo). The token every
rank picks must be ``torch.argmax`` of the whole logits (ties to the lowest id), and the ranks'
logits joined must be the whole head's, bit for bit (each logit is the same dot product).
"""

from __future__ import annotations

import pytest
import torch
from pto.incore.decode import argmax_advance, lmhead_argmax_gemv_tile, lmhead_argmax_tile
from pto.incore.vocab import argmax_candidates_tile, candidate_width
from pto.orchestration.model.vocab import VocabSplit

from pto.interp.incore import run_incore
from pto.ir.analysis import specialize
from pto.ir.dtypes import DType
from pto.passes.collective import split_collective

H, BV, BK, EPS = 32, 16, 16, 1e-5


def _head(x, g, w, vocab: int, output_major: bool):
    """The LM head's function over ``vocab`` ids on ``x``: (logits, best, index)."""
    B = x.shape[0]
    build = lmhead_argmax_gemv_tile if output_major else lmhead_argmax_tile
    fn = specialize(build(DType.F32, B, H, vocab, BV, BK, EPS), {"R": B})
    blocks = -(-vocab // BV)
    y, best, index = torch.full((B, vocab), float("nan")), torch.zeros(B, blocks), torch.zeros(B, blocks)
    run_incore(fn, {"x": (x, 0, 0, B, H), "g": (g, 0, 0, 1, H), "w": (w, 0, 0, *w.shape),
                    "y": (y, 0, 0, B, vocab), "best": (best, 0, 0, B, blocks), "index": (index, 0, 0, B, blocks)})
    return y, best, index


def _ranks_tokens(x, g, head, split: VocabSplit, output_major: bool):
    """Every rank's token (``[ranks, B]``) and the ranks' logits joined."""
    B, N, W = x.shape[0], split.ranks, split.width
    cut = split_collective(specialize(argmax_candidates_tile(B, -(-split.height // BV), N), {"R": B}))
    firsts, buffers, shares = [], [], []
    for r in range(N):
        y, best, index = _head(x, g, split.shard_head(head, r, output_major), split.height, output_major)
        shares.append(y)
        mems = {"best": (best, 0, 0, *best.shape), "index": (index, 0, 0, *index.shape),
                "place": (split.place(r), 0, 0, 3, W), "cand": (torch.full((B, W), float("nan")), 0, 0, B, W)}
        buffer = torch.full((B, W), float("nan"))
        run_incore(cut.pre, {**mems, cut.buffer: (buffer, 0, 0, B, W)})
        firsts.append(mems)
        buffers.append(buffer)
    summed = torch.stack(buffers).sum(0)  # what the process group's all-reduce leaves on every rank
    tokens = []
    advance = argmax_advance(N)
    for mems in firsts:
        run_incore(cut.post, {**mems, cut.buffer: (summed.clone(), 0, 0, B, W)})
        cand = mems["cand"][0]
        tok, pos = torch.zeros(B, 1), torch.zeros(B, 1)
        for b in range(B):
            run_incore(advance, {"best": (cand, b, 0, 1, N), "index": (cand, b, N, 1, N), "tok": (tok, b, 0, 1, 1),
                                 "pos": (pos, b, 0, 1, 1)})
        assert torch.equal(pos, torch.ones(B, 1))
        tokens.append(tok[:, 0])
    return torch.stack(tokens), split.join(shares)


@pytest.mark.parametrize("ranks", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("vocab", [512, 501, 9])
@pytest.mark.parametrize("output_major", [True, False])
def test_every_rank_picks_the_whole_heads_argmax(ranks, vocab, output_major):
    if vocab < ranks:
        pytest.skip("fewer ids than ranks")
    gen = torch.Generator().manual_seed(ranks * 1000 + vocab)
    B = 3
    x, g = torch.randn(B, H, generator=gen), 1 + 0.1 * torch.randn(1, H, generator=gen)
    head = torch.randn(vocab, H, generator=gen)
    # sequence 1's largest logit twice, in two ranks' shares (the larger id a copy of the smaller):
    # the lowest id must win, as torch.argmax breaks ties
    whole, _, _ = _head(x, g, head if output_major else head.t().contiguous(), vocab, output_major)
    top = int(whole[1].argmax())
    head[vocab - 1] = head[top]
    w = head if output_major else head.t().contiguous()
    whole, _, _ = _head(x, g, w, vocab, output_major)
    tokens, joined = _ranks_tokens(x, g, w, VocabSplit(vocab, ranks), output_major)
    want = whole.argmax(-1).float()
    assert torch.equal(joined, whole)
    assert all(torch.equal(t, want) for t in tokens), (tokens, want)
    assert top == vocab - 1 or int(want[1]) == min(top, vocab - 1)


def test_the_split_covers_the_vocabulary_once_in_balanced_shares():
    for vocab, ranks in ((49152, 3), (128256, 8), (500, 8), (9, 8), (7, 7)):
        s = VocabSplit(vocab, ranks)
        counts = [s.count(r) for r in range(ranks)]
        assert sum(counts) == vocab and max(counts) - min(counts) <= 1 and min(counts) >= 1
        assert [s.start(r) for r in range(ranks)] == [sum(counts[:r]) for r in range(ranks)]
        assert s.height == max(counts) and s.width == candidate_width(ranks) >= 2 * ranks
        assert s.width * 4 % 16 == 0  # the candidates' sum aligned for symmetric memory's kernels
    with pytest.raises(ValueError, match="the vocabulary of 3 ids does not divide among 4 ranks"):
        VocabSplit(3, 4)


def test_a_short_share_is_padded_with_copies_of_its_first_row():
    head = torch.arange(10 * 4, dtype=torch.float32).view(10, 4)
    s = VocabSplit(10, 4)  # shares of 2, 3, 2, 3 ids: height 3
    for r in range(4):
        a, n = s.start(r), s.count(r)
        rows = s.shard_head(head, r, output_major=True)
        assert rows.shape == (3, 4) and torch.equal(rows[:n], head[a:a + n])
        assert all(torch.equal(rows[i], head[a]) for i in range(n, 3))
        assert torch.equal(s.shard_head(head.t().contiguous(), r, output_major=False), rows.t())
        place = s.place(r)
        assert place[0].tolist() == [float(i == r) for i in range(s.width)]
        assert place[1].tolist() == [float(i == 4 + r) for i in range(s.width)]
        assert set(place[2].tolist()) == {float(a)}


@pytest.mark.interpret
@pytest.mark.parametrize("ranks,rank", [(2, 1), (3, 2), (8, 5)])
def test_the_candidates_task_on_triton_is_the_interpreters(ranks, rank):
    """The candidates task through the Triton backend (its two kernels around the sum, under the
    interpreter; one process: the sum is the identity) against the reference interpreter: the
    same bits, the rank's logit and id in its columns, zeros elsewhere."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1)")
    from pto.backends.triton import run_incore_triton

    B, blocks, split = 3, 5, VocabSplit(1000, ranks)
    gen = torch.Generator().manual_seed(ranks)
    best, index = torch.randn(B, blocks, generator=gen), torch.randint(0, 100, (B, blocks), generator=gen).float()
    fn = specialize(argmax_candidates_tile(B, blocks, ranks), {"R": B})
    outs = []
    for run in (run_incore, run_incore_triton):
        cand = torch.full((B, split.width), float("nan"))
        run(fn, {"best": (best, 0, 0, B, blocks), "index": (index, 0, 0, B, blocks),
                 "place": (split.place(rank), 0, 0, 3, split.width), "cand": (cand, 0, 0, B, split.width)})
        outs.append(cand)
    assert torch.equal(outs[0], outs[1])
    top, at = best.max(-1)
    want = torch.zeros(B, split.width)
    want[:, rank], want[:, ranks + rank] = top, index.gather(1, at[:, None])[:, 0] + split.start(rank)
    assert torch.equal(outs[0], want)
