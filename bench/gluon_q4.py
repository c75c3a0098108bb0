"""Does a shared-memory ring make a 4-bit GEMV stream at the copy's rate? (issue 46), measured apart
from pto.

pto's 4-bit GEMVs read their weights below a copy's bandwidth on the 8B's shapes alone: by this
session's `bench/qgemv.py`, Q4_K's gate/up at 0.80 (0.55-0.61 before the sixteenth session's
"blocks" loops), down at 0.53, o at 0.38, where Q8_0's, with twice the bytes for the same
instructions, reached 0.85-0.96 on gate/up. The fifteenth session's analysis: a program's time is
close to the *sum* of its instructions' issue time and its bytes' streaming time, since the
programs of a multiprocessor load together and then compute together; a producer that keeps the
weights streaming into a ring of shared memory while the warps compute would make it their
*maximum*. This script measures that claim on the smallest 4-bit arithmetic there is, so that the
instructions a weight are few and the question is the streaming alone:

- weights: 4-bit values ``q`` (eight a 32-bit word, value ``8j + i`` in bits ``4i..4i+3``) with a
  half-precision scale ``d`` and minimum ``m`` a group of 32 (Q4_1's arithmetic, ``d * q + m``;
  20 bytes a group, as Q4_1's file stores it, in planes);
- x: rounded once (as "x quantized once where it is written" would give it) to 8-bit integers a
  group of 32 with a scale ``dx`` and the group's sum ``sx = dx * sum(xq)`` (llama.cpp's Q8_1), its
  bytes packed to match the weights' nibbles: a word of the even values and one of the odd;
- a group's product: ``d * dx * idot + m * sx``, ``idot`` two ``dp4a`` a word of weights (the
  word's low nibbles against the even values, its high nibbles against the odd): about one SASS
  instruction a weight in all.

The ways:

- ``plain``: Triton, a program a block of ``R`` rows, a K loop of ``BK`` columns pipelined by
  Triton (``num_stages`` S), as pto renders its GEMVs;
- ``ring``: Gluon (Triton's layout-explicit dialect), persistent programs (``P`` a
  multiprocessor), each streaming its blocks' chunks of weights and scales through a ring of
  ``NBUF`` shared-memory buffers by ``cp.async``, refilled as each chunk is read, so that the next
  chunks, the next block's too, are in flight while the warps compute; x staged once a program.
  The compiler still puts two barriers in each chunk (after the wait for the chunk, before its
  refill), so a program's warps go chunk by chunk together;
- ``tiled``: the ring on the weights and scales repacked so that each block's chunks follow each
  other (a block one run of memory; a program's blocks are still ``P`` blocks apart);
- ``read``: no product, every word of the weights and scales read once (16 KiB a program, a plain
  grid) and summed: what one simple kernel of this size streams the same bytes at.

Measured on an H200 (2026-12-02, docs/PERF.md "Twenty-sixth session"): on the gate/up shape the
ring reads at 0.87-0.89 of a copy against the Triton loop's 0.65, where pto's own "blocks" loop
already reads at 0.80-0.83; on down and o the ring reads at 0.58-0.62 and at best 0.48 whatever
its depth, rows, programs or layout, so what limits them is not the stream's overlap (by
inference a fixed cost a kernel; ``read``, added after, measures what a simple kernel of their
size reaches).

Shapes: the 8B's gate/up (4,096 -> 2 x 14,336: one matrix of 28,672 rows), down (14,336 -> 4,096)
and o (4,096 x 4,096). Each kernel's time is its own (CUPTI, :func:`pto.exec.timing.kernel_times`),
rotating over enough copies of the weights that they never stay in L2; every result against a
float64 reference of the same arithmetic (the integer dots exact, so the error is the f32 sums').

    python3 bench/gluon_q4.py [--shapes gate_up,down,o] [--ways read,plain,ring,tiled] [--rows 16,32]
                              [--nbuf 4,8] [--stages 1,3] [--per-sm 1,2] [--runs 50] [--json FILE]

Needs a CUDA GPU of sm_80 or later and Triton 3.5-3.6's Gluon (the GPU machine's 3.6); without
Gluon the plain kernel runs alone. ``--compile-only`` compiles both for sm_90 with this Triton and
prints their registers and shared memory (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

try:
    import torch
except ImportError:  # (--compile-only runs in a Triton without torch)
    torch = None

gluon = None
if triton.__version__.startswith(("3.5", "3.6")):  # Gluon's copy as these name it (3.9 renamed it)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy

#: the 8B's GEMVs at batch 1: name -> (rows N, columns K)
SHAPES = {"gate_up": (28672, 4096), "down": (4096, 14336), "o": (4096, 4096)}
#: columns a chunk (a K step): 32 groups of 32, a warp's lanes one group each
BK = 1024
#: the read kernel's words a program (16 KiB)
READ_BLOCK = 4096
_DP4A = tl.constexpr("dp4a.s32.s32 $0, $1, $2, $3;")


@triton.jit
def _scales(sc):
    """A group's packed scale word: its ``d`` (low half) and ``m`` (high half) as f32."""
    d = (sc & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    m = (sc >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return d, m


@triton.jit
def q4_plain(Q, SC, XLO, XHI, DX, SX, Y, K: tl.constexpr, R: tl.constexpr, BK: tl.constexpr,
             STAGES: tl.constexpr):
    G: tl.constexpr = BK // 32
    rows = tl.program_id(0) * R + tl.arange(0, R)
    g = tl.arange(0, G)
    e = tl.arange(0, 4)
    wofs = rows[:, None, None] * (K // 8) + g[None, :, None] * 4 + e[None, None, :]
    sofs = rows[:, None] * (K // 32) + g[None, :]
    xofs = g[:, None] * 4 + e[None, :]
    acc = tl.zeros([R, G], tl.float32)
    for kk in tl.range(0, K // BK, num_stages=STAGES):
        w = tl.load(Q + kk * (BK // 8) + wofs)
        sc = tl.load(SC + kk * G + sofs)
        xl = tl.load(XLO + kk * (BK // 8) + xofs)[None, :, :]
        xh = tl.load(XHI + kk * (BK // 8) + xofs)[None, :, :]
        dx = tl.load(DX + kk * G + g)[None, :]
        sx = tl.load(SX + kk * G + g)[None, :]
        lo = w & 0x0F0F0F0F
        hi = (w >> 4) & 0x0F0F0F0F
        zero = tl.zeros_like(w)
        part = tl.inline_asm_elementwise(_DP4A, "=r,r,r,r", [lo, xl + zero, zero], dtype=tl.int32, is_pure=True,
                                         pack=1)
        part = tl.inline_asm_elementwise(_DP4A, "=r,r,r,r", [hi, xh + zero, part], dtype=tl.int32, is_pure=True,
                                         pack=1)
        idot = tl.sum(part, axis=2)
        d, m = _scales(sc)
        acc += d * (dx * idot.to(tl.float32)) + m * sx
    tl.store(Y + rows, tl.sum(acc, axis=1))


@triton.jit
def read_words(Q, SC, OUT, NQ: tl.constexpr, NS: tl.constexpr, BLOCK: tl.constexpr):
    """Every word of the weights and the scales read once and summed a program: what a kernel
    of this size streams the same bytes at, with no arithmetic to speak of."""
    pid = tl.program_id(0)
    nqb: tl.constexpr = (NQ + BLOCK - 1) // BLOCK
    if pid < nqb:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(Q + offs, mask=offs < NQ, other=0)
    else:
        offs = (pid - nqb) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(SC + offs, mask=offs < NS, other=0)
    tl.store(OUT + pid, tl.sum(v, axis=0))


if gluon is not None:
    @gluon.jit
    def _ring_issue(Q, SC, wring, sring, i, pid, wofs, sofs, P: gl.constexpr, K: gl.constexpr,
                    R: gl.constexpr, BK: gl.constexpr, NBUF: gl.constexpr, TOTAL, TILED: gl.constexpr):
        """Chunk ``i`` of the program's stream (its block ``i // NK``, K step ``i % NK``) into ring
        buffer ``i % NBUF``, weights and scales; every call commits a group (an empty one past the
        stream's end), so that ``wait_group(NBUF - 1)`` always means "chunk i has landed"."""
        NK: gl.constexpr = K // BK
        if i < TOTAL:
            block = pid + (i // NK) * P
            kk = i % NK
            if TILED:  # a chunk's rows contiguous, a block's chunks in order
                wbase = (block * NK + kk) * R * (BK // 8)
                sbase = (block * NK + kk) * R * (BK // 32)
            else:
                wbase = block * R * (K // 8) + kk * (BK // 8)
                sbase = block * R * (K // 32) + kk * (BK // 32)
            async_copy.async_copy_global_to_shared(wring.index(i % NBUF), Q + wbase + wofs)
            async_copy.async_copy_global_to_shared(sring.index(i % NBUF), SC + sbase + sofs)
        async_copy.commit_group()

    @gluon.jit
    def q4_ring(Q, SC, XLO, XHI, DX, SX, Y, N: gl.constexpr, K: gl.constexpr, R: gl.constexpr,
                BK: gl.constexpr, NBUF: gl.constexpr, P: gl.constexpr, TILED: gl.constexpr):
        G: gl.constexpr = BK // 32
        NK: gl.constexpr = K // BK
        RT: gl.constexpr = R // gl.num_warps()
        # a thread: RT rows x one group's 4 words (16 bytes: one cp.async a row); a warp's lanes
        # the chunk's 32 groups; the warps over the rows
        L3: gl.constexpr = gl.BlockedLayout([RT, 1, 4], [1, 32, 1], [gl.num_warps(), 1, 1], [2, 1, 0])
        LS: gl.constexpr = gl.SliceLayout(2, L3)  # [R, G]: the scales, the groups' sums
        LX: gl.constexpr = gl.SliceLayout(0, L3)  # [G, 4]: x's words, the same for every row
        LG: gl.constexpr = gl.SliceLayout(0, LS)  # [G]
        LR: gl.constexpr = gl.SliceLayout(1, LS)  # [R]
        # (a buffer array's layout is its buffers': the leading dimension is the index)
        sh3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])
        sh2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        sh1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        wring = gl.allocate_shared_memory(gl.int32, [NBUF, R, G, 4], sh3)
        sring = gl.allocate_shared_memory(gl.int32, [NBUF, R, G], sh2)
        xlo_s = gl.allocate_shared_memory(gl.int32, [NK, G, 4], sh2)
        xhi_s = gl.allocate_shared_memory(gl.int32, [NK, G, 4], sh2)
        dx_s = gl.allocate_shared_memory(gl.float32, [NK, G], sh1)
        sx_s = gl.allocate_shared_memory(gl.float32, [NK, G], sh1)
        pid = gl.program_id(0)
        r = gl.arange(0, R, layout=LR)
        g = gl.arange(0, G, layout=LG)
        e = gl.arange(0, 4, layout=gl.SliceLayout(0, LX))
        r3 = gl.expand_dims(gl.expand_dims(r, 1), 2)
        g3 = gl.expand_dims(gl.expand_dims(g, 0), 2)
        e3 = gl.expand_dims(gl.expand_dims(e, 0), 0)
        wofs = r3 * (BK // 8 if TILED else K // 8) + g3 * 4 + e3
        sofs = gl.expand_dims(r, 1) * (G if TILED else K // 32) + gl.expand_dims(g, 0)
        nblocks: gl.constexpr = N // R
        mine = (nblocks - pid + P - 1) // P
        TOTAL = mine * NK
        for i in gl.static_range(NBUF):  # the first chunks in flight before x is staged
            _ring_issue(Q, SC, wring, sring, i, pid, wofs, sofs, P, K, R, BK, NBUF, TOTAL, TILED)
        gx = gl.arange(0, G, layout=gl.SliceLayout(1, LX))
        xofs = gl.expand_dims(gx, 1) * 4 + gl.expand_dims(e, 0)
        for c in gl.static_range(NK):  # x once a program: its words, scales and sums
            xlo_s.index(c).store(gl.load(XLO + c * (BK // 8) + xofs))
            xhi_s.index(c).store(gl.load(XHI + c * (BK // 8) + xofs))
            dx_s.index(c).store(gl.load(DX + c * G + g))
            sx_s.index(c).store(gl.load(SX + c * G + g))
        gl.thread_barrier()
        acc = gl.zeros([R, G], gl.float32, layout=LS)
        for i in range(TOTAL):
            kk = i % NK
            async_copy.wait_group(NBUF - 1)
            w = wring.index(i % NBUF).load(L3)
            sc = sring.index(i % NBUF).load(LS)
            # the buffer just read (each thread's own bytes, now in registers) takes chunk i + NBUF
            # (the compiler still puts a barrier before the refill, and one after each wait)
            _ring_issue(Q, SC, wring, sring, i + NBUF, pid, wofs, sofs, P, K, R, BK, NBUF, TOTAL, TILED)
            xl = gl.expand_dims(xlo_s.index(kk).load(LX), 0)
            xh = gl.expand_dims(xhi_s.index(kk).load(LX), 0)
            dx = gl.expand_dims(dx_s.index(kk).load(LG), 0)
            sx = gl.expand_dims(sx_s.index(kk).load(LG), 0)
            lo = w & 0x0F0F0F0F
            hi = (w >> 4) & 0x0F0F0F0F
            zero = gl.zeros_like(w)
            part = gl.inline_asm_elementwise(_DP4A, "=r,r,r,r", [lo, xl + zero, zero], dtype=gl.int32,
                                             is_pure=True, pack=1)
            part = gl.inline_asm_elementwise(_DP4A, "=r,r,r,r", [hi, xh + zero, part], dtype=gl.int32,
                                             is_pure=True, pack=1)
            idot = gl.sum(part, axis=2)
            d = (sc & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            m = (sc >> 16).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            acc += d * (dx * idot.to(gl.float32)) + m * sx
            if kk == NK - 1:
                block = pid + (i // NK) * P
                gl.store(Y + block * R + r, gl.sum(acc, axis=1))
                acc = gl.zeros([R, G], gl.float32, layout=LS)
        async_copy.wait_group(0)


class Operands:
    """One shape's random operands (weights, ``copies`` of them for the rotation past L2) and
    the float64 reference of their product."""

    def __init__(self, N: int, K: int, copies: int, seed: int = 0, device: str = "cuda"):
        if K % BK or N % 32:
            raise SystemExit(f"bench/gluon_q4.py: a shape {N} x {K} needs K a multiple of {BK} and N of 32")
        gen = torch.Generator(device=device).manual_seed(seed)
        self.N, self.K = N, K
        self.Q = [torch.randint(-2 ** 31, 2 ** 31 - 1, (N, K // 8), dtype=torch.int32, device=device, generator=gen)
                  for _ in range(copies)]
        dm = (torch.randn(N, K // 32, 2, device=device, generator=gen) * 0.01).to(torch.float16)
        self.SC = [dm.view(torch.int32).reshape(N, K // 32).clone() for _ in range(copies)]
        x = torch.randn(K, device=device, generator=gen)
        xg = x.reshape(K // 32, 32)
        dx = xg.abs().amax(dim=1) / 127
        xq = torch.round(xg / dx[:, None]).clamp(-127, 127).to(torch.int8)
        self.DX = dx.contiguous()
        self.SX = (dx * xq.float().sum(dim=1)).contiguous()
        pairs = xq.reshape(K // 8, 4, 2)  # [word, byte, even/odd]
        self.XLO = pairs[:, :, 0].contiguous().view(torch.int32).reshape(K // 8).contiguous()
        self.XHI = pairs[:, :, 1].contiguous().view(torch.int32).reshape(K // 8).contiguous()
        # the reference, in float64: the nibbles unpacked, each group's exact integer dot
        q = torch.stack([(self.Q[0] >> (4 * i)) & 15 for i in range(8)], dim=-1).reshape(N, K).double()
        idot = (q.reshape(N, K // 32, 32) * xq.double().reshape(1, K // 32, 32)).sum(dim=2)
        d, m = dm[..., 0].double(), dm[..., 1].double()
        self.ref = (d * dx.double() * idot + m * self.SX.double()).sum(dim=1)
        self.bytes = self.Q[0].numel() * 4 + self.SC[0].numel() * 4
        self._tiled: dict[int, tuple[list, list]] = {}

    def tiled(self, R: int) -> tuple[list, list]:
        """The weights and scales repacked so that each ``R``-row block's chunk is contiguous and a
        block's chunks follow each other (a block one run of memory)."""
        if R not in self._tiled:
            NK = self.K // BK

            def tile(t: torch.Tensor) -> torch.Tensor:
                return t.reshape(self.N // R, R, NK, -1).transpose(1, 2).contiguous()

            self._tiled[R] = ([tile(q) for q in self.Q], [tile(sc) for sc in self.SC])
        return self._tiled[R]


def launch(way: str, ops: Operands, c: int, Y: torch.Tensor, R: int, param: int, per_sm: int) -> None:
    """One call of ``way`` on copy ``c`` of the weights (``param``: the stages, or the ring's buffers)."""
    if way == "read":  # (Y: the programs' sums)
        nq, ns = ops.Q[c].numel(), ops.SC[c].numel()
        read_words[(Y.numel(),)](ops.Q[c], ops.SC[c], Y, NQ=nq, NS=ns, BLOCK=READ_BLOCK, num_warps=4)
        return
    Qs, SCs = ops.tiled(R) if way == "tiled" else (ops.Q, ops.SC)
    args = (Qs[c], SCs[c], ops.XLO, ops.XHI, ops.DX, ops.SX, Y)
    if way == "plain":
        q4_plain[(ops.N // R,)](*args, K=ops.K, R=R, BK=BK, STAGES=param, num_warps=4)
    else:
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        P = min(per_sm * sms, ops.N // R)
        q4_ring[(P,)](*args, N=ops.N, K=ops.K, R=R, BK=BK, NBUF=param, P=P, TILED=way == "tiled", num_warps=4)


class Skipped(Exception):
    """A form these rows or this GPU cannot run (said in its line; the others go on)."""


def ring_smem(ops: Operands, R: int, nbuf: int) -> int:
    """The ring kernel's shared memory: its buffers (weights and scale words) and x staged."""
    G, NK = BK // 32, ops.K // BK
    return nbuf * (R * G * 4 * 4 + R * G * 4) + NK * (2 * G * 4 * 4 + 2 * G * 4)


def measure(way: str, ops: Operands, R: int, param: int, per_sm: int, runs: int, bw: float) -> dict:
    from pto.exec import timing

    if way != "read":
        if R < 4 or R & (R - 1) or ops.N % R:
            raise Skipped(f"--rows {R}: a block's rows must be a power of two from 4 (four warps) dividing {ops.N}")
        smem_max = torch.cuda.get_device_properties(torch.cuda.current_device()).shared_memory_per_multiprocessor
        if way != "plain" and per_sm * ring_smem(ops, R, param) > smem_max:
            raise Skipped(f"{per_sm} programs of {ring_smem(ops, R, param) // 1024} KiB of shared memory do not fit "
                          f"a multiprocessor's {smem_max // 1024} KiB (they would run in waves)")

    if way == "read":
        Y = torch.zeros(-(-ops.Q[0].numel() // READ_BLOCK) - (-ops.SC[0].numel() // READ_BLOCK), dtype=torch.int32,
                        device="cuda")
    else:
        Y = torch.zeros(ops.N, dtype=torch.float32, device="cuda")
    launch(way, ops, 0, Y, R, param, per_sm)
    torch.cuda.synchronize()
    if way == "read":  # (the words' sum modulo 2^32: 0 where every word was read once)
        want = int(ops.Q[0].long().sum() + ops.SC[0].long().sum())
        err = float((int(Y.long().sum()) - want) % 2 ** 32)
    else:
        err = float((Y.double() - ops.ref).abs().max() / ops.ref.abs().max())
    turn = [0]

    def rotate():
        turn[0] = (turn[0] + 1) % len(ops.Q)
        launch(way, ops, turn[0], Y, R, param, per_sm)

    per, _ = timing.kernel_times(rotate, runs)
    name = {"plain": "q4_plain", "read": "read_words"}.get(way, "q4_ring")  # (tiled: the ring, repacked)
    us = sum(ms for k, (_, ms) in per.items() if name in k) * 1e3
    return {"way": way, "N": ops.N, "K": ops.K, "R": R, "param": param, "per_sm": per_sm, "us": us,
            "x_copy": ops.bytes / (us * 1e-6) / bw, "max_err": err}


def compile_only() -> None:
    """Both kernels compiled for sm_90 by this Triton (no GPU): registers and spills (cuobjdump's
    resource usage), shared memory, and their SASS's counts of the instructions that matter."""
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    target = GPUTarget("cuda", 90, 32)
    sig = {k: "*i32" for k in ("Q", "SC", "XLO", "XHI")} | {"DX": "*fp32", "SX": "*fp32", "Y": "*fp32"}
    attrs = {(a,): [["tt.divisibility", 16]] for a in range(len(sig))}
    N, K = SHAPES["gate_up"]
    for R in (16, 32):
        srcs = [("plain", ASTSource(q4_plain, sig | dict.fromkeys(("K", "R", "BK", "STAGES"), "constexpr"),
                                    constexprs={"K": K, "R": R, "BK": BK, "STAGES": 3}, attrs=attrs))]
        if gluon is not None:
            srcs.append(("ring", gluon._runtime.GluonASTSource(
                q4_ring, sig | dict.fromkeys(("N", "K", "R", "BK", "NBUF", "P", "TILED"), "constexpr"),
                constexprs={"N": N, "K": K, "R": R, "BK": BK, "NBUF": 4, "P": 264, "TILED": False}, attrs=attrs)))
        for way, src in srcs:
            cc = triton.compile(src, target=target, options={"num_warps": 4})
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(cc.asm["cubin"])
                f.flush()
                res = subprocess.run([os.path.join(bindir, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                                     text=True).stdout
                sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", f.name], capture_output=True,
                                      text=True).stdout
            regs = re.search(r"REG:(\d+)", res)
            ins = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
            count = {op: sum(1 for i in ins if i.split(".")[0] == op)
                     for op in ("IDP", "LDGSTS", "LDG", "LDS", "BAR", "SHFL", "LOP3", "SHF", "FFMA", "I2F")}
            print(f"{way} R={R}: {regs.group(1) if regs else '?'} registers, {cc.metadata.shared} B shared, "
                  f"{len(ins)} SASS instructions; " + ", ".join(f"{k} {v}" for k, v in count.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="gate_up,down,o")
    ap.add_argument("--ways", default="read,plain,ring", help="read (the bytes alone), plain, ring, tiled (the ring "
                    "on repacked weights)")
    ap.add_argument("--rows", default="16,32", help="rows a block (a thread R / 4 of them: four warps)")
    ap.add_argument("--stages", default="1,3", help="the plain kernel's pipeline depths")
    ap.add_argument("--nbuf", default="4,8", help="the ring's buffers")
    ap.add_argument("--per-sm", default="1,2", help="the ring's programs a multiprocessor")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--json")
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    if a.compile_only:
        return compile_only()
    chosen, known = set(a.ways.split(",")), {"read", "plain", "ring", "tiled"}
    if chosen - known:
        sys.exit(f"bench/gluon_q4.py: --ways {a.ways}: {', '.join(sorted(chosen - known))} is not one of "
                 "read, plain, ring, tiled")
    if not torch.cuda.is_available():
        sys.exit("bench/gluon_q4.py needs a CUDA GPU (or --compile-only)")
    from decode import copy_bandwidth  # (bench/decode.py: the floors' bandwidth)

    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name()}; triton {triton.__version__}"
          + ("" if gluon is not None else " (no ring: this Triton's Gluon is not 3.5-3.6's)"), flush=True)
    out = []

    def keep(r: dict) -> None:  # (the JSON after every row: a later failure keeps what was measured)
        out.append(r)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "copy_Bps": bw, "rows": out}, f, indent=1)

    for shape in a.shapes.split(","):
        N, K = SHAPES[shape]
        ops = Operands(N, K, copies=max(2, -(-200_000_000 // (N * K // 2))))
        print(f"{shape} ({N} x {K}): {ops.bytes / 1e6:.1f} MB a call, floor {ops.bytes / bw * 1e6:.2f} us", flush=True)
        if "read" in chosen:
            r = measure("read", ops, 0, 0, 0, a.runs, bw)
            r["shape"] = shape
            keep(r)
            print(f"  read  (every byte once, {READ_BLOCK * 4 // 1024} KiB a program): {r['us']:7.2f} us, "
                  f"{r['x_copy']:.2f} of a copy, {'sums right' if r['max_err'] == 0 else 'SUMS WRONG'}", flush=True)
        ways = [("plain", int(s), 1) for s in a.stages.split(",")] if "plain" in chosen else []
        for ring in ("ring", "tiled"):
            if ring in chosen and gluon is not None:
                ways += [(ring, int(n), int(p)) for n in a.nbuf.split(",") for p in a.per_sm.split(",")]
        for R in (int(v) for v in a.rows.split(",")):
            for way, param, per_sm in ways:
                tag = f"stages={param}" if way == "plain" else f"nbuf={param} per_sm={per_sm}"
                try:
                    r = measure(way, ops, R, param, per_sm, a.runs, bw)
                except Skipped as exc:
                    print(f"  {way:5s} R={R:2d} {tag}: skipped: {exc}", flush=True)
                    continue
                except Exception as exc:  # (a form this GPU or Triton refuses: said, the others go on)
                    print(f"  {way:5s} R={R:2d} {tag}: failed: {str(exc).splitlines()[0][:160]}", flush=True)
                    continue
                r["shape"] = shape
                keep(r)
                print(f"  {way:5s} R={R:2d} {tag}: {r['us']:7.2f} us, {r['x_copy']:.2f} of a copy, "
                      f"max err {r['max_err']:.1e}", flush=True)


if __name__ == "__main__":
    main()
