"""The binary-expansion attributes of an orchestration loop (``tile_levels``, ``max_range``,
``min_range``), checked where the builder takes them and where the verifier meets a parsed
loop (:mod:`pto.ir.verify_orch`)."""

from __future__ import annotations

from pto.errors import BuildError
from pto.ir.expr import Expr, const_value


def check_loop_attrs(owner: str, name: str, step: Expr, max_range, min_range, tile_levels, loc=None):
    """Validate the binary-expansion attributes (``tile_levels`` a dict {block size: tile
    height}); return (tile_levels as a sorted tuple, max_range, min_range) with the defaults
    filled in, or (None, None, None) for a plain loop."""

    def fail(msg):
        where = f" ({loc})" if loc else ""
        raise BuildError(f"`{owner}`{where}: loop `{name}`: {msg}")

    def pow2(v):
        return isinstance(v, int) and not isinstance(v, bool) and v > 0 and (v & (v - 1)) == 0

    if tile_levels is None:
        if max_range is not None or min_range is not None:
            fail("max_range/min_range need tile_levels (the tile height per block size)")
        return None, None, None
    if not isinstance(tile_levels, dict) or not tile_levels:
        fail(f"tile_levels must be a dict {{block size: tile height}}, got {tile_levels!r}")
    for k, v in tile_levels.items():
        if not isinstance(k, int) or isinstance(k, bool) or not isinstance(v, int) or isinstance(v, bool):
            fail(f"tile_levels entries must be int: int, got {k!r}: {v!r}")
    if 0 not in tile_levels:
        fail("tile_levels needs key 0: the base (and residual) tile height")
    base = tile_levels[0]
    if base <= 0:
        fail(f"base tile height tile_levels[0] must be positive, got {base}")
    if const_value(step) != 1:
        fail(f"an adaptive loop counts base tiles and needs step 1, got `{step}`")
    for v, what in ((max_range, "max_range"), (min_range, "min_range")):
        if v is not None and not pow2(v):
            fail(f"{what} must be a positive power of two, got {v!r}")
    keys = sorted(k for k in tile_levels if k != 0)
    mx = max_range if max_range is not None else (keys[-1] if keys else 1)
    mn = min_range if min_range is not None else min(keys[0] if keys else 1, mx)
    if mn > mx:
        fail(f"min_range {mn} exceeds max_range {mx}")
    for p in keys:
        h = tile_levels[p]
        if not pow2(p):
            fail(f"tile_levels key {p} is not a power of two (keys are block sizes in base tiles)")
        if p < mn or p > mx:
            fail(f"tile_levels key {p} lies outside [min_range, max_range] = [{mn}, {mx}]")
        if h <= 0 or h % base:
            fail(f"tile height {h} for blocks of {p} is not a positive multiple of the base height {base}")
        if p % (h // base):
            fail(f"a block of {p} base tiles cannot be cut into tiles of {h} rows "
                 f"({h // base} base tiles each)")
    return tuple(sorted(tile_levels.items())), mx, mn


__all__ = ["check_loop_attrs"]
