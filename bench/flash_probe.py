"""What the Triton renderer's causal flash attention would gain from source changes it does not
emit (issue 23): ``flash_fused`` of the LLaMA-7B layer (32 heads of 128, 128 x 128 blocks, every
q tile of ``seq`` tokens, longest first as the waves executor orders them) through the Triton
backend, its generated source patched per variant (warp specialization of the kv loops, Triton
3.6's ``tl.range(..., warp_specialize=True)``; q pre-scaled by the softmax scale instead of the
scores), under several launch settings, against SDPA in the same process (TFLOP/s of the causal
half, the median of 10 launches). An H100 (sm_90).

    python3 bench/flash_probe.py [SEQ] [--patches base,ws-full,...] [--tk 64]   (default 16384, every patch)

The launch settings include the persistent tile loop (``RenderOptions.persistent``: one program a
multiprocessor, each looping over the q tiles and heads in the grid's order).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json

import torch
import torch.nn.functional as F
from pto.incore.attention import flash_fused

import pto.backends.triton.backend as backend
from pto.backends.triton import TritonBackend
from pto.data.batch import RegionBatch, TaskBatch
from pto.engine import rel_err
from pto.exec.timing import median_ms
from pto.ir.analysis import specialize
from pto.ir.dtypes import DType

NH, D, TQ = 32, 128, 128
SCALE = "0.127517431974411"  # 1/sqrt(128) * log2(e), as the renderer writes it
FULL, DIAG = "for i_j in range(0, s_nfull, 128):", "for i_j2 in range(s_nfull, s_nkv, 128):"
INIT = "    t_m = tl.full((128, 1), _NEG_INF, tl.float32)"


# 2^x on the FMA units: 2^floor(x) into the exponent bits, 2^frac(x) by a degree-3 polynomial
# (relative error 7.5e-5, below bf16's rounding of P); x <= 0 here (scores minus their row max)
POLY = """
@triton.jit
def _exp2_poly(x):
    x = tl.maximum(x, -126.0)
    j = tl.floor(x)
    f = x - j
    p = 0.07802337 * f + 0.22606645
    p = p * f + 0.69583508
    p = p * f + 0.99992492
    return (p.to(tl.int32, bitcast=True) + (j.to(tl.int32) << 23)).to(tl.float32, bitcast=True)


@triton.jit
def _exp2_half(x):
    a, b = tl.split(tl.reshape(x, (128, 64, 2)))
    return tl.reshape(tl.join(tl.exp2(a), _exp2_poly(b)), (128, 128))

"""
EXP = "t_S = tl.exp2(t_S)"
HEAD = '_NEG_INF = tl.constexpr(float("-inf"))\n'


def _exp(fn: str):
    return lambda s: s.replace(HEAD, HEAD + POLY).replace(EXP, f"t_S = {fn}(t_S)")


# the full blocks' loop software-pipelined by hand: block j+1's scores are computed (their wgmma
# issued) before block j's softmax, so the tensor cores may run while the softmax does; the last
# trip computes one block's scores again (unused)
DOT = "        t_S = tl.dot(t_Q, tl.trans(t_Kt), out_dtype=tl.float32)\n"
SOFTMAX = "        t_mnew = tl.max(t_S, axis=1)[:, None]\n"


def _pipelined(src: str) -> str:
    head, rest = src.split("    for i_j in range(0, s_nfull, 128):\n", 1)
    loop, tail = rest.split("    for i_j2 in", 1)
    kload = loop[:loop.index("        _r7 = ")]  # the K block's load (every path), at i_j
    vload = loop[loop.index("        _r7 = "):loop.index(DOT)]
    body = loop[loop.index(SOFTMAX):]
    first = "".join("    " + line + "\n" for line in kload.replace("i_j", "0").splitlines())
    return (head + "    t_Sn = tl.full((128, 128), 0.0, tl.float32)\n    if s_nfull > 0:\n" + first
            + "    " + DOT.replace("t_S =", "t_Sn =")
            + "    for i_j in range(0, s_nfull, 128):\n        t_S = t_Sn\n" + vload
            + "        i_n = tl.minimum(i_j + 128, s_nfull - 128)\n" + kload.replace("i_j", "i_n")
            + DOT.replace("t_S =", "t_Sn =") + body + "    for i_j2 in" + tail)


def _ws(loop: str) -> str:
    head, rng = loop.split(" in ")
    return f"{head} in tl.{rng[:-2]}, warp_specialize=True):"


PATCHES = {
    "base": lambda s: s,
    "ws-full": lambda s: s.replace(FULL, _ws(FULL)),
    "ws-both": lambda s: s.replace(FULL, _ws(FULL)).replace(DIAG, _ws(DIAG)),
    "poly-all": _exp("_exp2_poly"),  # every exponential on the FMA units
    "poly-half": _exp("_exp2_half"),  # half the columns on MUFU, half on the FMA units
    "pipelined": _pipelined,
    "qscale": lambda s: s.replace(INIT, f"    t_Q = (t_Q.to(tl.float32) * {SCALE}).to(tl.bfloat16)\n{INIT}")
                         .replace(f"t_mnew = t_mnew * {SCALE}", "").replace(f"t_S = t_S * {SCALE}", ""),
}
LAUNCHES = ({"num_warps": 8, "num_stages": 3, "GROUP": 16}, {"num_warps": 8, "num_stages": 2, "GROUP": 16},
            {"num_warps": 8, "num_stages": 3, "GROUP": 0}, {"num_warps": 4, "num_stages": 3, "GROUP": 16},
            {"num_warps": 8, "num_stages": 3, "GROUP": 16, "persistent": "loop"},
            {"num_warps": 8, "num_stages": 3, "GROUP": 0, "persistent": "loop"},
            {"num_warps": 8, "num_stages": 3, "GROUP": 0, "persistent": "ws"})


def _root(e: BaseException) -> str:
    """The innermost cause's message (Triton nests the callee's compile error), its last lines."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return f"{type(e).__name__}: {str(e)[-800:]}"


def patched(render, patch):
    def rendered(fn, opts=None):
        kern = render(fn, opts)
        src = patch(kern.source)
        return dataclasses.replace(kern, source=src, digest=hashlib.sha256(src.encode()).hexdigest()[:20])
    return rendered


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seq", type=int, nargs="?", default=16384)
    ap.add_argument("--patches", default=",".join(PATCHES), help="which source variants (default: all)")
    ap.add_argument("--launches", type=int, default=len(LAUNCHES), help="time the first N launch settings")
    ap.add_argument("--launch", nargs="*", default=[], help="launch settings (JSON objects) instead of the list's")
    ap.add_argument("--tq", type=int, default=TQ, help="q block height (the patches expect 128)")
    ap.add_argument("--tk", type=int, default=TQ, help="kv block height (the patches expect 128)")
    args = ap.parse_args()
    seq = args.seq
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(seq, NH * D, generator=g, device=dev).to(torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)

    def sdpa():
        return F.scaled_dot_product_attention(*(t.view(seq, NH, D).transpose(0, 1)[None] for t in (q, k, v)),
                                              is_causal=True)

    ref = sdpa()[0].transpose(0, 1).reshape(seq, NH * D)
    flops = 4.0 * NH * D * 0.5 * seq * seq
    ms = median_ms(sdpa, 10, 2)
    print(f"SDPA {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
    tq, tk = args.tq, args.tk
    fn = specialize(flash_fused(DType.BF16, NH, D, tq, tk))
    n = seq // tq
    qpos = torch.arange(n - 1, -1, -1, device=dev) * tq  # longest first
    z = torch.zeros(n, dtype=torch.long, device=dev)

    def full(x):
        return torch.full((n,), x, device=dev, dtype=torch.long)

    mems = {"q": RegionBatch(q, qpos, z, full(tq), full(NH * D)), "k": RegionBatch(k, z, z, qpos + tq, full(NH * D)),
            "v": RegionBatch(v, z, z, qpos + tq, full(NH * D)), "o": RegionBatch(o, qpos, z, full(tq), full(NH * D))}
    # the kv blocks every query row of the tile sees whole, then the diagonal ones (masked)
    scalars = {"qpos": qpos, "nfull": qpos // tk * tk, "nkv": qpos + tq}
    render = backend.render
    try:
        for name in args.patches.split(","):
            patch = PATCHES[name]
            backend.render = patched(render, patch)
            for launch in [json.loads(x) for x in args.launch] or LAUNCHES[:args.launches]:
                try:
                    go = TritonBackend(dev, launch={"flash_fused": launch}).prepare(TaskBatch(fn, mems, scalars, n))
                    o.fill_(float("nan"))
                    go()
                    err = rel_err(o, ref)
                    ms = median_ms(go, 10, 2)
                    print(f"{name} {launch}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s rel_err {err:.1e}", flush=True)
                except Exception as e:  # a variant Triton cannot compile: reported, the others go on
                    print(f"{name} {launch}: FAILED {type(e).__name__}: {_root(e)}", flush=True)
    finally:
        backend.render = render


if __name__ == "__main__":
    main()
