"""What an L2 prefetch during a latency-bound phase buys the GEMV after it (H100/H200, sm_90).

A decode layer's attention phase (RoPE, the attention chunks, the combine) reads little and
leaves the HBM idle for about 11 us on the 8B model; the o projection after it then streams its
weights from HBM. This replays, as one CUDA graph per variant: a flush of the L2 (a 256 MB read,
as the FFN that precedes the phase does), a short phase on a few programs (a spin), then a GEMV
of the shape asked (blocks of 4 output rows, K steps of 1024, weights output-major as
``incore/gemv.py``'s), and reports each kernel's time (torch.profiler) and an iteration's. The
variants: ``plain``; the spin's programs first prefetching the GEMV's weights into the L2, as
bulk prefetches (``bulk``: ``cp.async.bulk.prefetch.L2`` of ``--chunk-kb``), as one
``prefetch.global.L2`` per 128-byte line (``lines``), or the same with the ``evict_last``
policy; and the GEMV launched as a programmatic dependent of the spin (``pdl``), also with an L2
prefetch of its own weight rows before its wait (``pdl_own_prefetch``). docs/PERF.md has what
it measured.

    python bench/l2_prefetch.py [--n 4096,6144] [--k 4096] [--chunk-kb 16,64] [--idle-us 5,10,15]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _gemv(w, x, y, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr, PF: tl.constexpr):
    """y = w @ x in blocks of BN rows, K steps of BK. PDL: launched as a programmatic dependent
    of the kernel before it (its wait before the first load); PF: first an L2 prefetch of the
    program's weight rows (they do not depend on the previous kernel), one ``prefetch.global.L2``
    per 128-byte line."""
    j = tl.program_id(0)
    rows = j * BN + tl.arange(0, BN)
    if PF:
        lines: tl.constexpr = K * 2 // 128
        ptrs = w.to(tl.pointer_type(tl.int8)) + (rows[:, None].to(tl.int64) * K * 2
                                                 + tl.arange(0, lines)[None, :].to(tl.int64) * 128)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)
    if PDL:
        gdc_wait()
    acc = tl.zeros([BN, BK], tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        wt = tl.load(w + rows[:, None] * K + cols[None, :])
        xt = tl.load(x + cols)
        acc += wt.to(tl.float32) * xt.to(tl.float32)[None, :]
    if PDL:
        gdc_launch_dependents()
    tl.store(y + rows, tl.sum(acc, 1).to(y.dtype.element_ty))


@triton.jit
def _spin(out, w, n_iter, nbytes, PREFETCH: tl.constexpr, CHUNK: tl.constexpr, PER: tl.constexpr):
    """Each program spins ``n_iter`` dependent steps; with PREFETCH it first prefetches its share
    (PER chunks of CHUNK bytes, one per thread slot) of the ``nbytes`` at ``w``: PREFETCH 1 as bulk
    prefetches of CHUNK bytes, 2 as one ``prefetch.global.L2`` per 128-byte line, 3 the same with
    the ``evict_last`` policy."""
    pid = tl.program_id(0)
    if PREFETCH >= 2:
        lines: tl.constexpr = CHUNK // 128
        base = pid.to(tl.int64) * PER * CHUNK
        for i in range(PER):
            off = base + i * CHUNK + tl.arange(0, lines).to(tl.int64) * 128
            ptrs = w.to(tl.pointer_type(tl.int8)) + off
            ok = (off < nbytes).to(tl.int32)
            if PREFETCH == 2:
                tl.inline_asm_elementwise(
                    "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                    "=r,l,r", [ptrs, ok], dtype=tl.int32, is_pure=False, pack=1)
            else:
                tl.inline_asm_elementwise(
                    "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
                    "=r,l,r", [ptrs, ok], dtype=tl.int32, is_pure=False, pack=1)
    if PREFETCH == 1:
        idx = pid * PER + tl.arange(0, PER)
        off = idx.to(tl.int64) * CHUNK
        ptrs = w.to(tl.pointer_type(tl.int8)) + off
        ok = off < nbytes
        size = tl.where(ok, tl.minimum(nbytes - off, CHUNK), 0).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [ptrs, size], dtype=tl.int32, is_pure=False, pack=1)
    gdc_wait()
    acc = pid.to(tl.float32)
    for _ in range(n_iter):
        acc = acc * 0.999 + 1.0
    gdc_launch_dependents()
    tl.store(out + pid, acc)


def timed(body, reps: int) -> dict:
    """Each kernel's microseconds per launch over ``reps`` replays of ``body`` captured in one
    CUDA graph (torch.profiler), and the wall time of a replay's iteration (``iter_us``)."""
    from torch.profiler import ProfilerActivity, profile

    body()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            body()
    g.replay()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    g.replay()
    ev[1].record()
    torch.cuda.synchronize()
    out = {"iter_us": round(ev[0].elapsed_time(ev[1]) * 1000 / reps, 2)}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    acc: dict[str, list] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            a = acc.setdefault("_gemv" if "_gemv" in e.name else "_spin" if "_spin" in e.name else "flush", [0, 0.0])
            a[0] += 1
            a[1] += e.device_time_total
    out.update({name: round(t / max(c, 1), 2) for name, (c, t) in acc.items()})
    return out


def run(n: int, k: int, chunk_kb: int, idle_us: float, programs: int, reps: int) -> dict:
    dev = torch.device("cuda")
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    x = torch.randn(k, device=dev, dtype=torch.bfloat16)
    y = torch.empty(n, device=dev, dtype=torch.bfloat16)
    big = torch.ones(64 << 20, device=dev, dtype=torch.float32)
    sink = torch.empty(programs, device=dev, dtype=torch.float32)
    nbytes = w.numel() * w.element_size()
    chunk = chunk_kb << 10
    per = triton.next_power_of_2(triton.cdiv(triton.cdiv(nbytes, chunk), programs))
    # calibrate the spin: iterations per microsecond
    n_iter = 1000
    _spin[(programs,)](sink, w, n_iter, nbytes, PREFETCH=False, CHUNK=chunk, PER=per)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(10):
        _spin[(programs,)](sink, w, n_iter, nbytes, PREFETCH=False, CHUNK=chunk, PER=per)
    ev[1].record()
    torch.cuda.synchronize()
    per_iter_us = ev[0].elapsed_time(ev[1]) * 100 / n_iter
    n_iter = max(1, int(idle_us / per_iter_us))

    def body(prefetch: int):
        big.sum()  # the L2 flush (the FFN's streaming before the phase)
        if prefetch >= 4:  # the GEMV as a programmatic dependent, 5: with its own prefetch first
            _spin[(programs,)](sink, w, n_iter, nbytes, PREFETCH=0, CHUNK=chunk, PER=per, launch_pdl=True)
            _gemv[(n // 4,)](w, x, y, K=k, BN=4, BK=min(k, 1024), PDL=True, PF=prefetch == 5, launch_pdl=True)
            return
        _spin[(programs,)](sink, w, n_iter, nbytes, PREFETCH=prefetch, CHUNK=chunk, PER=per)
        _gemv[(n // 4,)](w, x, y, K=k, BN=4, BK=min(k, 1024), PDL=False, PF=False)

    out = {"n": n, "k": k, "mb": nbytes / 1e6, "chunk_kb": chunk_kb, "idle_us": idle_us, "programs": programs}
    for name, pf in (("plain", 0), ("bulk", 1), ("lines", 2), ("lines_evict_last", 3), ("pdl", 4),
                     ("pdl_own_prefetch", 5)):
        out[name] = timed(lambda pf=pf: body(pf), reps)
    ref = w.float() @ x.float()
    out["gemv_ok"] = bool(torch.allclose(y.float(), ref, rtol=2e-2, atol=2e-1))
    out["gemv_hbm_gbs"] = nbytes / out["plain"]["_gemv"] / 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="4096,6144")
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--chunk-kb", default="16,64")
    ap.add_argument("--idle-us", default="5,10,15")
    ap.add_argument("--programs", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), "triton", triton.__version__)
    for n in map(int, a.n.split(",")):
        for c in map(int, a.chunk_kb.split(",")):
            for idle in map(float, a.idle_us.split(",")):
                print(json.dumps(run(n, a.k, c, idle, a.programs, a.reps)), flush=True)


if __name__ == "__main__":
    main()
