"""Exact task and edge counts of the LLaMA layer's graph without building it (docs/ESTIMATE.md
derives them): what ``pto estimate llama7b`` reports at any length, checked against the built
graph and a per-tile enumeration by the tests."""

from __future__ import annotations

from pto.orchestration.llama import tiling
from pto.orchestration.llama.config import LlamaConfig
from pto.orchestration.llama.tiling import LlamaTiling

from pto.ir.expr import bx_blocks
from pto.passes.expansion.binary_expansion import closed_form_iterations, height_of_block, tile_levels


def row_tiles(n: int, base: int, top: int) -> list[tuple[int, int]]:
    """(start, height) in base tiles of the row tiles an adaptive loop over n base tiles runs
    after binary expansion (one task per tile per call in the loop body)."""
    levels = tile_levels(base, top)
    if len(levels) == 1:
        return [(i, 1) for i in range(n)]
    lv = tuple(sorted(levels.items()))
    out = []
    for start, size in bx_blocks(n, tiling.MAX_RANGE, 2):
        hb = (height_of_block(lv, size) if size >= 2 else base) // base
        out += [(start + k * hb, hb) for k in range(size // hb)]
    return out


class _Pairs:
    """Counts of (q tile, kv tile) pairs of adaptive loops over base tiles, closed form: binary
    expansion's blocks of at most ``M`` base tiles (min_range 2), kv tiles of ``kv_levels``, q
    tiles of ``q_levels`` (heights in rows over base tiles of ``base`` rows)."""

    def __init__(self, base: int, q_levels: tuple, kv_levels: tuple, M: int):
        self.base, self.q_levels, self.kv_levels, self.M = base, q_levels, kv_levels, M

    def w(self, p: int) -> int:
        """kv tiles of one binary-expansion block of p base tiles (p = 1: the residual tile)."""
        return p if p < 2 else p // (height_of_block(self.kv_levels, p) // self.base)

    def low(self, r: int) -> int:
        """kv tiles over the r < M base tiles after the full blocks: one block per set bit."""
        return sum(self.w(1 << b) for b in range(r.bit_length()) if r >> b & 1)

    def K(self, m: int) -> int:
        """kv tiles of a kv loop over m base tiles."""
        return (m // self.M) * self.w(self.M) + self.low(m % self.M)

    def q_block(self, start: int, p: int) -> tuple[int, int]:
        """(q tiles, pairs) of the q block of p base tiles at ``start`` within its M-chunk."""
        h = height_of_block(self.q_levels, p) // self.base if p >= 2 else 1
        c = p // h
        # the bit arithmetic needs power-of-two tiles dividing their block: tile_levels gives
        # min(p * base, top) with power-of-two base and top, so this only guards future levels
        if h & (h - 1) or p % h:
            raise ValueError(f"q tiles of {h} base tiles in a block of {p}: not a power-of-two split")
        return c, c * self.low(start) + self.w(p) + (c // 2) * sum(self.w(h << b) for b in range(c.bit_length() - 1))

    def causal_pairs(self, n: int) -> int:
        """The sum over the q tiles of n base tiles of K(end of the q tile).

        K(m) = (m // M) w(M) + low(m % M): the blocks of bx_blocks (min_range 2), additive over
        disjoint bits. A q block of p base tiles starts at a multiple of 2p (the sum of the
        larger bits), so its c = p / h q tiles end at start + j h (j = 1 .. c): K sums to
        c low(start) + w(p) (the last end sets bit p) + the bits of j h for j < c, each bit of
        j < c being set for c / 2 of them. Per block O(log n) instead of O(tiles * log n).
        """
        M = self.M
        full = n // M
        c_full, per_full = self.q_block(0, M)
        # full block k: its q tiles also count the k full kv blocks before it (its last tile,
        # ending at (k + 1) M, counts w(M) more: in per_full)
        total = full * per_full + c_full * self.w(M) * (full * (full - 1) // 2)
        for start, p in bx_blocks(n % M, M, 2):
            c, pairs = self.q_block(start, p)
            total += pairs + c * full * self.w(M)
        return total


def closed_form(cfg: LlamaConfig, t: LlamaTiling, seq: int, attention: str, causal: bool,
                adaptive: bool = True, fuse: bool = False, tp: int = 1) -> dict[str, int]:
    """Exact task and edge counts of the layer's graph without building it, in O(n / 4096 +
    log^2 n) for n base tiles (milliseconds up to 2**31 - 1 tokens: nothing is enumerated per
    tile; a sliding window adds O(window / tile) terms).

    With T row tiles, P (q tile, kv tile) pairs and Q = sum over q tiles of the row tiles their
    kv range overlaps (docs/ESTIMATE.md derives each term):
    fused: tasks 11T, edges 11T + 2Q; pair: tasks 16T + P, edges 16T + 4P;
    split: tasks 16T + 3P, edges 14T + 10P. With ``fuse`` (fused attention, RMSNorm folded into
    the projections after a statistics task each, RoPE in the Q/K epilogue): tasks 9T, edges
    10T + 2Q (the q, k and v projections read only inputs and the first statistics, the FFN's
    projection its own). Grouped-query attention changes none of these (k and v
    are narrower, not split); a sliding window (causal only) changes P and Q: each q tile's kv
    range starts at the kv tile holding its first row's first key. One rank's graph under ``tp``
    > 1 ranks: each row-parallel projection, its sum over the ranks and the residual are one
    task, as the fused layer's projection with the residual in the epilogue (the same counts);
    the split and pair layers' product and residual add become that one task: 2T fewer tasks
    and edges (the edge from the product to the add).
    """
    n = -(-seq // t.base)
    tq, tk = (t.tq, t.tk) if adaptive else (t.base, t.base)
    q_levels = tuple(sorted(tile_levels(t.base, tq).items()))
    kv_levels = tuple(sorted(tile_levels(t.base, tk).items()))
    M = tiling.MAX_RANGE
    pairs = _Pairs(t.base, q_levels, kv_levels, M)
    # a loop without adaptive levels is not expanded (one iteration per base tile); with a
    # single level closed_form_iterations counts exactly that
    T = closed_form_iterations(n, M, 2, q_levels)
    if causal and cfg.window:
        P, Q = window_terms(n, t.base, tq // t.base, t.tk // t.base, cfg.window, pairs.K, pairs.causal_pairs)
        if attention == "fused":
            P = 0
    else:
        if attention == "fused":
            P = 0  # no pair loop: one attention task per q tile
        elif causal:
            P = pairs.causal_pairs(n)
        else:
            P = T * closed_form_iterations(n, M, 2, kv_levels)
        # every kv range ends on a row-tile boundary: q tile i overlaps i + 1 row tiles (causal)
        Q = T * (T + 1) // 2 if causal else T * T
    tasks = {"fused": 11 * T, "pair": 16 * T + P, "split": 16 * T + 3 * P}[attention]
    edges = {"fused": 11 * T + 2 * Q, "pair": 16 * T + 4 * P, "split": 14 * T + 10 * P}[attention]
    if fuse:
        tasks, edges = 9 * T, 10 * T + 2 * Q
    if tp > 1 and attention != "fused":
        tasks, edges = tasks - 2 * T, edges - 2 * T
    return {"tasks": tasks, "edges": edges, "row_tiles": T, "pairs": P}


def window_start(qs: int, base: int, align: int, window: int) -> int:
    """The first base tile of the kv range of the q tile starting at base tile ``qs``: the one
    holding key ``qs * base - window + 1``, rounded down to a multiple of ``align`` base tiles
    (the module's kv tile height, also when the graph is built without adaptive tiles), as the
    orchestration computes it."""
    return max(0, ((qs * base - (window - 1)) // (align * base)) * align)


def window_terms(n: int, base: int, h: int, align: int, window: int, K, causal_pairs) -> tuple[int, int]:
    """(P, Q) of causal attention within a sliding window over n base tiles: P the pairs (the
    sum over q tiles of K(end - start of the kv range)), Q the row tiles the kv ranges overlap.

    Row tiles are h base tiles high up to n_u = n - n % h (binary expansion's blocks of at least
    h base tiles), then the tail: one tile per set bit of n % h. The kv range of uniform q tile t
    (base tiles [t h, (t + 1) h)) starts at lo_t = :func:`window_start` of t h, which is 0 for the
    first t_z tiles (they see every key before them: the causal count of their t_z h base tiles)
    and after them depends on t modulo p = max(1, align / h) only: with t = u p + v, lo_t = t h -
    v h + align f_v, f_v = floor((v h base - window + 1) / (align base)), so the range spans the
    same h + v h - align f_v base tiles and overlaps the same 1 + v - floor(align f_v / h) row
    tiles for every t of residue v. The tail's few q tiles are counted one by one. O(p + log n)
    besides ``causal_pairs``."""
    n_u = n - n % h
    T_u = n_u // h
    t_z = min(T_u, -(-(align * base + window - 1) // (h * base)))
    P, Q = causal_pairs(t_z * h), t_z * (t_z + 1) // 2
    p = max(1, align // h)
    for v in range(p):
        f = (v * h * base - (window - 1)) // (align * base)
        count = (T_u - 1 - v) // p - (t_z - 1 - v) // p  # t in [t_z, T_u) with t % p == v
        P += count * K(h + v * h - align * f)
        Q += count * (1 + v - (align * f) // h)
    tail = []  # (start, height) of the tail's row tiles
    start = n_u
    for b in reversed(range((n % h).bit_length())):
        if n % h >> b & 1:
            tail.append((start, 1 << b))
            start += 1 << b

    def ended_by(x: int) -> int:
        """Row tiles ending at or before base tile x."""
        return min(x, n_u) // h + sum(1 for s, hh in tail if s + hh <= x)

    for j, (s, hh) in enumerate(tail):
        lo = window_start(s, base, align, window)
        P += K(s + hh - lo)
        Q += T_u + j + 1 - ended_by(lo)
    return P, Q
