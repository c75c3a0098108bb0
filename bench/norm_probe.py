"""The memory-bound pieces of the prefill layer, tiled several ways (docs/PERF.md): RMSNorm
(``rmsnorm_tile``), its statistics alone (``rms_scale_tile``, ``--fuse-norm-rope``) and RoPE
(``rope_tile``), each run as the layer runs it (one batch of every 128-row tile of a ``seq``-row
activation, hidden 4096, bf16) through the Triton backend, for every (rows a program, columns a
step) and launch setting listed; the best launch of each tiling, its bandwidth, and torch's own
op beside it. Each result is checked against torch.

    python bench/norm_probe.py --seq 4096,16384
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pto.incore.norm import rms_scale_tile, rmsnorm_tile  # noqa: E402
from pto.incore.rope import rope_tile  # noqa: E402

from pto.backends.triton import TritonBackend  # noqa: E402
from pto.data.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.engine import rel_err  # noqa: E402
from pto.exec.timing import median_ms  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType  # noqa: E402

H, HEADS, D, TQ, EPS, REPS = 4096, 32, 128, 128, 1e-6, 20
LAUNCH = [{"num_warps": w, "num_stages": s, "GROUP": 0} for w, s in itertools.product((4, 8), (2, 3))]


def batch(fn, tensors: dict, seq: int, dev) -> TaskBatch:
    """Every 128-row tile of ``seq`` rows: ``tensors[p] = (tensor, per_row)`` (per-row tensors
    take the tile's rows, the others are whole)."""
    n = -(-seq // TQ)
    r0 = torch.arange(n, device=dev) * TQ
    z = torch.zeros(n, dtype=torch.long, device=dev)
    mems = {}
    for p, (t, per_row) in tensors.items():
        rows = torch.clamp(seq - r0, max=TQ) if per_row else torch.full((n,), t.shape[0], device=dev)
        mems[p] = RegionBatch(t, r0 if per_row else z, z, rows, torch.full((n,), t.shape[1], device=dev))
    return TaskBatch(fn, mems, {}, n)


def best(fn, tensors, seq, dev, check) -> dict:
    """The fastest launch setting of ``fn`` (ms per launch over ``REPS`` back-to-back launches)."""
    out = None
    for launch in LAUNCH:
        be = TritonBackend(dev, launch={fn.name: launch})
        go = be.prepare(batch(fn, tensors, seq, dev))
        go()
        err = check()
        ms = median_ms(lambda: [go() for _ in range(REPS)], 5, 1) / REPS  # noqa: B023
        if out is None or ms < out["ms"]:
            out = {"ms": round(ms, 4), "launch": launch, "rel_err": err}
    return out


def probe(seq: int, dev) -> list[dict]:
    bf = DType.BF16
    g = torch.Generator(device=dev).manual_seed(seq)
    x = torch.randn(seq, H, generator=g, device=dev).to(torch.bfloat16)
    gain = (1 + 0.1 * torch.randn(1, H, generator=g, device=dev)).to(torch.bfloat16)
    xf = x.float()
    scale = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    rows = []
    gb = 2 * seq * H / 1e9  # bytes of x, GB
    for rb, chunk in ((16, 512), (8, 1024), (4, 2048), (4, 4096), (2, 4096), (1, 4096)):
        r = torch.empty(seq, 1, device=dev)
        fn = specialize(rms_scale_tile(H, bf, TQ, rb, chunk, EPS))
        res = best(fn, {"x": (x, True), "r": (r, True)}, seq, dev, lambda r=r: rel_err(r, scale))
        rows.append({"kernel": "rms_scale_tile", "rows": rb, "chunk": chunk, **res, "tb_s": round(gb / res["ms"], 2)})
        y = torch.empty_like(x)
        fn = specialize(rmsnorm_tile(H, bf, TQ, rb, chunk, EPS))
        want = (xf * scale * gain.float()).to(torch.bfloat16)
        res = best(fn, {"x": (x, True), "g": (gain, False), "y": (y, True)}, seq, dev,
                   lambda y=y, want=want: rel_err(y, want))
        rows.append({"kernel": "rmsnorm_tile", "rows": rb, "chunk": chunk, **res,
                     "tb_s": round(2 * gb / res["ms"], 2)})  # x read once from HBM, y written
    q = x[:, : HEADS * D]
    ang = torch.rand(seq, D // 2, generator=g, device=dev) * 6.28
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    qf = q.float().view(seq, HEADS, D)
    c, s = cos.float()[:, None], sin.float()[:, None]
    a1, a2 = qf[..., : D // 2], qf[..., D // 2:]
    rot = torch.cat([a1 * c - a2 * s, a2 * c + a1 * s], -1).reshape(seq, HEADS * D).to(torch.bfloat16)
    for rb in (32, 64, 128):
        y = torch.empty_like(q)
        fn = specialize(rope_tile(bf, TQ, HEADS, D, row_block=rb))
        res = best(fn, {"x": (q, True), "cos": (cos, True), "sin": (sin, True), "y": (y, True)}, seq, dev,
                   lambda y=y: rel_err(y, rot))
        rows.append({"kernel": "rope_tile", "rows": rb, "chunk": D // 2, **res, "tb_s": round(2 * gb / res["ms"], 2)})
    for name, f in (("torch rms scale", lambda: torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)),
                    ("torch rmsnorm", lambda: (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)
                                               * gain.float()).to(torch.bfloat16))):
        ms = median_ms(lambda f=f: [f() for _ in range(REPS)], 5, 1) / REPS
        rows.append({"kernel": name, "ms": round(ms, 4)})
    return [{"seq": seq, **r} for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", default="4096,16384")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for seq in (int(s) for s in args.seq.split(",")):
        for r in probe(seq, dev):
            rows.append(r)
            print(" ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
