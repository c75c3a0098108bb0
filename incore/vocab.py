"""The vocabulary-parallel LM head's second stage: every rank's best token gathered on every rank.

Under tensor parallelism each rank computes the logits of its share of the vocabulary (the LM
head's rows of its ids: ``lmhead_argmax_*`` of :mod:`.decode` on the rank's shard, its first
stage of the argmax per vocabulary block). :func:`argmax_candidates_tile` takes each sequence's
best of those blocks and gathers it, with its id in the whole vocabulary, onto every rank: a
gather written as a sum, the one collective the IR has. Each rank puts its candidate in its own
columns of an otherwise zero row (``place``: the rank's data, so that every rank runs the same
function) and the row is summed over the ranks: ``x + 0 = x`` exactly, so every rank holds every
rank's candidate bit for bit, and :func:`~.decode.argmax_advance` over them picks the same token
on every rank (the first of equal logits: the lowest id, the ranks' shares being in id order, as
``torch.argmax`` over the whole logits breaks ties).

The candidates' row is :func:`candidate_width` f32 values: the best logits at columns ``[0,
ranks)``, the ids at ``[ranks, 2 ranks)`` (exact in f32 below 2^24), the rest zero.
"""

from __future__ import annotations

from pto import InCore, f32
from pto.ir.nodes import IncoreFunction

#: the largest finite f32
FLT_MAX = 3.4028234663852886e38


def candidate_width(ranks: int) -> int:
    """Columns of the candidates' row for ``ranks`` ranks: ``2 ranks`` rounded up to a power of
    two, at least 4 (16 bytes: the sum's buffer aligned for symmetric memory's kernels)."""
    w = 4
    while w < 2 * ranks:
        w *= 2
    return w


def argmax_candidates_tile(rows: int, blocks: int, ranks: int, target=None) -> IncoreFunction:
    """For ``rows`` sequences, this rank's best logit over its ``blocks`` first-stage maxima
    (``best``, ``index``: ids within the rank's share) and its id in the whole vocabulary (plus
    the share's first id), placed by ``place`` (``[3, W]``: row 0 one at the rank's logit column,
    row 1 one at its id column, row 2 the share's first id) into a row of W
    (:func:`candidate_width`) values, summed over the ranks in f32 into ``cand`` ``[rows, W]``.
    The logits must not be NaN (a zero column times NaN is NaN: the sum would spread it)."""
    k = InCore("argmax_candidates_tile")
    width = candidate_width(ranks)
    R = k.dim("R", rows)
    best, index = k.memref("best", f32, shape=(R, blocks)), k.memref("index", f32, shape=(R, blocks))
    place = k.memref("place", f32, shape=(3, width))
    cand = k.memref("cand", f32, shape=(R, width))
    bt, it = k.tile("bt", R, blocks, f32), k.tile("it", R, blocks, f32)
    k.load(bt, best, 0, 0, pad=float("-inf"))
    k.load(it, index, 0, 0)
    top, at = k.tile("top", R, 1, f32), k.tile("at", R, 1, f32)
    k.rowmax(top, bt)
    # a row without logits (a tile's rows past the batch load -inf) would put -inf x 0 = NaN in
    # its zero columns: its best is made the most negative finite f32 instead
    k.maxs(top, top, -FLT_MAX)
    k.rowtakemax(at, bt, it)
    logit_col, id_col, first = (k.tile(n, 1, width, f32) for n in ("logit_col", "id_col", "first"))
    for i, t in enumerate((logit_col, id_col, first)):
        k.load(t, place, i, 0)
    row, ids = k.tile("row", R, width, f32), k.tile("ids", R, width, f32)
    k.rowexpand(row, top)
    k.colexpandmul(row, row, logit_col)
    k.rowexpand(ids, at)
    k.colexpandadd(ids, ids, first)
    k.colexpandmul(ids, ids, id_col)
    k.add(row, row, ids)
    k.allreduce(row, row, acc=f32)  # f32 whatever the model's dtype: the ids stay exact
    k.store(cand, 0, 0, row)
    return k.build(target)


__all__ = ["candidate_width", "argmax_candidates_tile"]
