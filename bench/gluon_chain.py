"""What a loader buys the megakernel's GEMVs (issue 45), measured apart from pto: a chain of L
dependent GEMV layers ``x[l + 1] = W[l] @ x[l]`` (bf16 weights, f32 activations, square D x D)
run by one persistent launch of D / R programs (at most two a multiprocessor, all resident: a
cooperative launch), each program R rows of every layer. A program waits until every program
has written ``x[l]`` (a counter per layer, the megakernel's acquire poll), computes its rows,
stores them and releases the next layer's counter (the megakernel's release). Three ways:

- ``triton``: as the megakernel's runs do today: the wait, then a K loop pipelined by Triton
  (``tl.range(..., num_stages=S)``), whose first loads are issued after the wait;
- ``early``: the same with each layer's first chunk of weights loaded into registers before its
  wait (issued at the end of the layer before), plain Triton;
- ``gluon``: a loader in the style of Hazy Research's megakernels, written in Gluon (Triton's
  layout-explicit dialect: shared memory and ``cp.async`` by hand): a ring of ``NBUF`` shared
  memory buffers of ``R x BK`` weights that streams the program's chunks of every layer in
  order, so that the next layer's first ``NBUF`` chunks are in flight while the program waits
  for that layer's activations (every iteration commits one group, an empty one past the
  stream's end, so ``wait_group(NBUF - 1)`` means the iteration's chunk has landed; the
  compiler adds a barrier after each wait and before each refill of a buffer); a layer's x is
  loaded once after the wait (one round trip) and staged in shared memory for its chunks.

Two more ways, which take a program's whole block of a layer's weights in one load issued before
the wait (as a megakernel's GEMV item takes them: its weights do not depend on the wait) and
differ in how a layer waits for x (issue 45: a SmolLM2 step's megakernel pays 0.7-1.2 us a level
on the wait, six levels a layer; measure at SmolLM2's width, ``--d 576``):

- ``pre``: the counter, as the megakernel does: an acquire poll of the layer's counter, then x's
  load (two round trips after the last writer's release), the writer's stores ordered before its
  release by a barrier and a fence;
- ``ll``: no counter: x passed as 8-byte words of the value's bits and a flag (NCCL's "LL"
  protocol), the reader loading x until every word carries the layer's flag: one round trip, no
  fence. What a megakernel would gain by passing its small activations so;
- ``lpdl`` and ``lll``: a launch a layer, as the wave executor runs its GEMVs, each launch let in
  by the one before at its start (programmatic dependent launch): ``lpdl`` waits for the previous
  launch to finish (``griddepcontrol.wait``, the wave executor's way), ``lll`` for its x's words
  alone, starting while the previous launch's other programs still run. What the wave executor
  would gain by the words.

Measured on an H200 (2026-12-02, docs/PERF.md "Twenty-fifth session"; 32 layers, BK 64, 4 warps,
us a layer with the waits): at 576 wide the words take 0.24-0.25 us a layer off the counter and
tie the launch a layer under PDL (R 4: pre 1.60, ll 1.35, lpdl 1.37, lll 1.82; R 8: 1.51, 1.27,
1.29); at 1,024 and 2,048 they lose (1.91, 2.19, 1.69, 2.51; and 3.84, 4.56, 3.93), each program
reading all of x as words, twice its bytes.

Per variant, with the waits and without them (the layers' streaming alone): microseconds a layer,
its multiple of the floor, and the last layer's error against torch. The floor is the weights at
the copy's bandwidth; a layer's cost above it is what the wait and the pipeline's fill add (the
megakernel's 8B layer: six GEMV levels, each paying it; docs/PERF.md, "A layer's budget").

    python3 bench/gluon_chain.py [--d 2048,4096] [--rows 16,32] [--layers 32] [--nbuf 4,8]
                                 [--bk 256] [--waits on,off] [--ways triton,early,gluon,pre,ll]
                                 [--warps 4] [--json FILE]

Needs a CUDA GPU of sm_80 or later (``cp.async``); the Gluon chain needs Gluon's API of Triton
3.5-3.6 (the GPU machine's 3.6; later versions renamed its copy), else the Triton chain runs alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

gluon = None
if triton.__version__.startswith(("3.5", "3.6")):  # Gluon's copy as these name it (3.9 renamed it)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy


@triton.jit
def chain_triton(W, X, C, L, D: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, P: tl.constexpr,
                 STAGES: tl.constexpr, WAIT: tl.constexpr):
    rows = tl.program_id(0) * R + tl.arange(0, R)
    cols = tl.arange(0, BK)
    for layer in range(L):
        if WAIT:
            while tl.atomic_add(C + layer, 0, sem="acquire") < P:
                pass
        acc = tl.zeros([R], dtype=tl.float32)
        base = W + layer * D * D
        for k in tl.range(0, D, BK, num_stages=STAGES):
            w = tl.load(base + rows[:, None] * D + (k + cols)[None, :])
            x = tl.load(X + layer * D + k + cols)
            acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        tl.store(X + (layer + 1) * D + rows, acc)
        tl.debug_barrier()
        tl.atomic_add(C + layer + 1, 1, sem="release")


@triton.jit
def chain_early(W, X, C, L, D: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, P: tl.constexpr,
                STAGES: tl.constexpr, WAIT: tl.constexpr):
    """``chain_triton`` with each layer's first chunk of weights loaded into registers before its
    wait (at the end of the layer before: plain Triton, what a megakernel item could do today)."""
    rows = tl.program_id(0) * R + tl.arange(0, R)
    cols = tl.arange(0, BK)
    w0 = tl.load(W + rows[:, None] * D + cols[None, :])
    for layer in range(L):
        if WAIT:
            while tl.atomic_add(C + layer, 0, sem="acquire") < P:
                pass
        acc = tl.sum(w0.to(tl.float32) * tl.load(X + layer * D + cols)[None, :], axis=1)
        base = W + layer * D * D
        for k in tl.range(BK, D, BK, num_stages=STAGES):
            w = tl.load(base + rows[:, None] * D + (k + cols)[None, :])
            x = tl.load(X + layer * D + k + cols)
            acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        w0 = tl.load(W + tl.minimum(layer + 1, L - 1) * D * D + rows[:, None] * D + cols[None, :])
        tl.store(X + (layer + 1) * D + rows, acc)
        tl.debug_barrier()
        tl.atomic_add(C + layer + 1, 1, sem="release")


@triton.jit
def _block(W, layer, D: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, NKP: tl.constexpr):
    """The program's rows, a row's offsets as ``[NKP, BK]`` chunks (``NKP`` a power of two, those
    past ``D`` masked, so a row is one load) and its whole ``R x D`` block of layer ``layer``'s
    weights."""
    rows = tl.program_id(0) * R + tl.arange(0, R)
    offs = tl.arange(0, NKP)[:, None] * BK + tl.arange(0, BK)[None, :]
    inside = offs < D
    w = tl.load(W + layer * D * D + rows[:, None, None] * D + offs[None, :, :], mask=inside[None, :, :], other=0.0)
    return rows, offs, inside, w


@triton.jit
def _product(w, x):
    """The block's rows times x (``[NKP, BK]``), in f32."""
    return tl.sum(tl.sum(w.to(tl.float32) * x[None, :, :], axis=2), axis=1)


#: the most polls of x's words before a program gives up and goes on with what it has (a bug that
#: would hang the GPU becomes a wrong result: the run's check after its timing says so)
LL_TRIES = tl.constexpr(1 << 24)


@triton.jit
def _ll_x(XW, offs, inside, flag, WAIT: tl.constexpr):
    """x from its words at ``XW + offs``: loaded (strong, from L2) until every word carries
    ``flag`` (where ``WAIT``; at most :data:`LL_TRIES` loads), then their low halves as f32."""
    words = tl.load(XW + offs, mask=inside, other=flag << 32, volatile=True)
    if WAIT:
        tries = 0
        while (tl.min(tl.min(((words >> 32) == flag).to(tl.int32), axis=1), axis=0) == 0) & (tries < LL_TRIES):
            words = tl.load(XW + offs, mask=inside, other=flag << 32, volatile=True)
            tries += 1
    return (words & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _ll_store(XW, rows, acc, flag):
    """``acc`` stored as words of ``flag``: each value's f32 bits low, the flag high."""
    tl.store(XW + rows, acc.to(tl.uint32, bitcast=True).to(tl.int64) | (flag << 32))


@triton.jit
def chain_pre(W, X, C, L, D: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, NKP: tl.constexpr, P: tl.constexpr,
              WAIT: tl.constexpr):
    """A layer as a megakernel's GEMV item runs it: the program's whole ``R x D`` block of weights
    loaded first (before the wait: nothing before writes them), then the counter's acquire poll,
    then x in one load, the product, the store, a barrier and the release."""
    for layer in range(L):
        rows, offs, inside, w = _block(W, layer, D, R, BK, NKP)
        if WAIT:
            while tl.atomic_add(C + layer, 0, sem="acquire") < P:
                pass
        tl.store(X + (layer + 1) * D + rows, _product(w, tl.load(X + layer * D + offs, mask=inside, other=0.0)))
        tl.debug_barrier()
        tl.atomic_add(C + layer + 1, 1, sem="release")


@triton.jit(do_not_specialize=["EPOCH", "L"])
def chain_ll(W, XW, L, EPOCH, D: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, NKP: tl.constexpr,
             WAIT: tl.constexpr):
    """``chain_pre`` with no counters: a layer's x is passed as 8-byte words, the value's f32
    bits low and a flag high (``EPOCH * (L + 1) + layer``), each word stored whole (NCCL's "LL"
    protocol), and a program waits for x by loading it again until every word carries the
    layer's flag: the load that sees the data is the one that waits, so a dependency costs one
    round trip where the counter's acquire and then x's load cost two, and no barrier or fence
    orders the writer's stores before a release."""
    for layer in range(L):
        flag = (EPOCH * (L + 1) + layer).to(tl.int64)
        rows, offs, inside, w = _block(W, layer, D, R, BK, NKP)
        x = _ll_x(XW + layer * D, offs, inside, flag, WAIT)
        _ll_store(XW + (layer + 1) * D, rows, _product(w, x), flag + 1)


@triton.jit(do_not_specialize=["layer"])
def layer_pdl(W, X, layer, D: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, NKP: tl.constexpr,
              WAIT: tl.constexpr, PDL: tl.constexpr):
    """One layer of the chain as a launch of its own, as the wave executor runs a GEMV: the next
    launch let in at once (PDL's trigger), the program's weights loaded, then the wait for the
    previous launch to finish (``griddepcontrol.wait``: the whole grid done and its stores
    flushed), x, the product, the store."""
    if PDL:
        gdc_launch_dependents()
    rows, offs, inside, w = _block(W, layer, D, R, BK, NKP)
    if PDL and WAIT:
        gdc_wait()
    tl.store(X + (layer + 1) * D + rows, _product(w, tl.load(X + layer * D + offs, mask=inside, other=0.0)))


@triton.jit(do_not_specialize=["EPOCH", "layer", "L"])
def layer_ll(W, XW, layer, L, EPOCH, D: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, NKP: tl.constexpr,
             WAIT: tl.constexpr, PDL: tl.constexpr):
    """``layer_pdl`` with x as :func:`chain_ll`'s words and no ``griddepcontrol.wait``: a program
    starts on x as soon as every word of it carries the layer's flag, while the previous launch's
    other programs may still run. Safe from deadlock: a launch is let in only once every program
    of the one before has triggered, i.e. is resident, so every program polled for will run."""
    if PDL:
        gdc_launch_dependents()
    flag = (EPOCH * (L + 1) + layer).to(tl.int64)
    rows, offs, inside, w = _block(W, layer, D, R, BK, NKP)
    x = _ll_x(XW + layer * D, offs, inside, flag, WAIT)
    _ll_store(XW + (layer + 1) * D, rows, _product(w, x), flag + 1)


def ll_words(x: torch.Tensor, flag: int) -> torch.Tensor:
    """``x`` (f32) as :func:`chain_ll`'s words: its bits low, ``flag`` high (int64 storage)."""
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return bits | (flag << 32)


def ll_values(words: torch.Tensor) -> torch.Tensor:
    """The f32 values of :func:`chain_ll`'s words."""
    return (words & 0xFFFFFFFF).to(torch.int32).view(torch.float32)


if gluon is not None:
    @gluon.jit
    def _issue(W, smem, i, rows, cols, D: gl.constexpr, NK: gl.constexpr, BK: gl.constexpr,
               NBUF: gl.constexpr, TOTAL: gl.constexpr):
        """Chunk ``i`` of the program's stream (layer ``i // NK``, K step ``i % NK``) into its ring
        buffer; every call commits a group (an empty one past the stream's end), so that
        ``wait_group(NBUF - 1)`` always means "chunk i has landed"."""
        if i < TOTAL:
            layer = i // NK
            k = (i % NK) * BK
            ptrs = W + layer * D * D + rows[:, None] * D + (k + cols)[None, :]
            async_copy.async_copy_global_to_shared(smem.index(i % NBUF), ptrs)
        async_copy.commit_group()

    @gluon.jit
    def chain_gluon(W, X, C, L: gl.constexpr, D: gl.constexpr, R: gl.constexpr, BK: gl.constexpr,
                    P: gl.constexpr, NBUF: gl.constexpr, WAIT: gl.constexpr):
        # each thread 8 consecutive bf16 (16 bytes: one cp.async) of a row, a warp 256 columns
        tile: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [gl.num_warps(), 1], [1, 0])
        shared: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        NK: gl.constexpr = D // BK
        TOTAL: gl.constexpr = L * NK
        # x of a layer, staged once after the wait (one load, one store: one round trip a layer)
        whole: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [gl.num_warps(), 1], [1, 0])
        smem = gl.allocate_shared_memory(gl.bfloat16, [NBUF, R, BK], shared)
        xs = gl.allocate_shared_memory(gl.float32, [NK, 1, BK], shared)  # a chunk: xs.index(kk), [1, BK]
        xflat = xs._reinterpret(gl.float32, [NK, BK], shared)  # the same bytes as [NK, BK], for the one store
        rows = gl.program_id(0) * R + gl.arange(0, R, layout=gl.SliceLayout(1, tile))
        cols = gl.arange(0, BK, layout=gl.SliceLayout(0, tile))
        xoffs = gl.arange(0, NK, layout=gl.SliceLayout(1, whole))[:, None] * BK + \
            gl.arange(0, BK, layout=gl.SliceLayout(0, whole))[None, :]
        for i in gl.static_range(NBUF):  # the first chunks: in flight before the first wait
            _issue(W, smem, i, rows, cols, D, NK, BK, NBUF, TOTAL)
        acc = gl.zeros([R], gl.float32, layout=gl.SliceLayout(1, tile))
        for i in range(TOTAL):
            layer = i // NK
            kk = i % NK
            if kk == 0:
                if WAIT:
                    while gl.atomic_add(C + layer, 0, sem="acquire") < P:
                        pass
                xflat.store(gl.load(X + layer * D + xoffs))
                gl.thread_barrier()
                acc = gl.zeros([R], gl.float32, layout=gl.SliceLayout(1, tile))
            async_copy.wait_group(NBUF - 1)
            w = smem.index(i % NBUF).load(tile)
            x = xs.index(kk).load(tile)  # [1, BK]
            acc += gl.sum(w.to(gl.float32) * x, axis=1)
            # the buffer just read (this thread's own bytes, now in registers) takes chunk i + NBUF:
            # the next layer's first chunks stream while this program waits for that layer
            _issue(W, smem, i + NBUF, rows, cols, D, NK, BK, NBUF, TOTAL)
            if kk == NK - 1:
                gl.store(X + (layer + 1) * D + rows, acc)
                gl.thread_barrier()
                gl.atomic_add(C + layer + 1, 1, sem="release")
        async_copy.wait_group(0)


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """A device-to-device copy's bytes a second (read plus write), the median of 10: pto's
    floors' bandwidth (a read-only stream may go a few percent faster)."""
    a = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    times = []
    for _ in range(12):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return nbytes / sorted(times[2:])[len(times[2:]) // 2]


_PROFILED: list = []


def _profile_host(reset, kernel, cycles: int) -> None:
    """Print, once a process, the GPU's milliseconds for a spin of ``cycles`` and the host's
    microseconds for each part of a run issued behind it (reset, event, launches, query)."""
    _PROFILED.append(True)
    a, b, s = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    a.record()
    torch.cuda._sleep(cycles)
    b.record()
    t = [time.perf_counter()]
    reset()
    t.append(time.perf_counter())
    s.record()
    t.append(time.perf_counter())
    kernel()
    t.append(time.perf_counter())
    late = s.query()
    t.append(time.perf_counter())
    torch.cuda.synchronize()
    names = ("reset", "record", "launch", "query")
    parts = ", ".join(f"{n} {(t[i + 1] - t[i]) * 1e6:.0f}" for i, n in enumerate(names))
    print(f"a spin of {cycles:.1e} cycles: {a.elapsed_time(b):.2f} ms on the GPU; the host's us: {parts}; "
          f"late {late}", flush=True)


class Skipped(Exception):
    """A chain this GPU cannot run as asked (said in its line; the others go on)."""


def run(variant: str, D: int, R: int, L: int, BK: int, param: int, wait: bool, reps: int = 20) -> dict:
    """One chain ``reps`` times (counters reset before each, outside the timing): the median
    microseconds a layer and the last layer's error against torch (f32 sums of the same bf16
    weights in another order: a few 1e-6 a layer). Without ``wait`` the programs do not wait
    for each other (the layers' streaming alone; their results are then whatever they read)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    W = (torch.randn(L, D, D, device="cuda", generator=g) / D ** 0.5).to(torch.bfloat16)
    X = torch.zeros(L + 1, D, device="cuda")
    X[0] = torch.randn(D, device="cuda", generator=g)
    C = torch.zeros(L + 1, dtype=torch.int32, device="cuda")
    P = D // R
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    if D % R:  # (rows no program writes: their readers would wait for them)
        raise Skipped(f"--d {D} --rows {R}: {R} does not divide {D}")
    if 2 * sms < P:  # (two a multiprocessor at most: the megakernel's default)
        raise Skipped(f"--d {D} --rows {R}: {P} programs, more than two a multiprocessor ({sms})")
    ref = X[0].clone()
    for layer in range(L):
        ref = W[layer].float() @ ref

    XW = torch.zeros(L + 1, D, dtype=torch.int64, device="cuda")  # the "ll" chain's words
    epoch = [0]

    def reset():
        C.zero_()
        C[:1].fill_(P)  # (not C[0] = P: a Python number set into a CUDA tensor waits for the GPU)
        epoch[0] += 1  # a new flag for every run: the words of the last one are stale
        XW[0] = ll_words(X[0], epoch[0] * (L + 1))

    def kernel():  # (cooperative: a grid that cannot be resident at once fails, not hangs)
        nkp = 1 << (-(-D // BK) - 1).bit_length()  # the chunks a row, to a power of two
        if variant in ("lpdl", "lll"):  # a launch a layer, each let in by the one before (PDL)
            for layer in range(L):
                if variant == "lpdl":
                    layer_pdl[(P,)](W, X, layer, D=D, R=R, BK=BK, NKP=nkp, WAIT=wait, PDL=True, num_warps=param,
                                    launch_pdl=True)
                else:
                    layer_ll[(P,)](W, XW, layer, L, epoch[0], D=D, R=R, BK=BK, NKP=nkp, WAIT=wait, PDL=True,
                                   num_warps=param, launch_pdl=True)
        elif variant == "ll":
            chain_ll[(P,)](W, XW, L, epoch[0], D=D, R=R, BK=BK, NKP=nkp, WAIT=wait, num_warps=param,
                           launch_cooperative_grid=True)
        elif variant == "pre":
            chain_pre[(P,)](W, X, C, L, D=D, R=R, BK=BK, NKP=nkp, P=P, WAIT=wait, num_warps=param,
                            launch_cooperative_grid=True)
        elif variant in ("triton", "early"):
            (chain_triton if variant == "triton" else chain_early)[(P,)](
                W, X, C, L, D=D, R=R, BK=BK, P=P, STAGES=param, WAIT=wait, num_warps=4, launch_cooperative_grid=True)
        else:
            chain_gluon[(P,)](W, X, C, L=L, D=D, R=R, BK=BK, P=P, NBUF=param, WAIT=wait, num_warps=4,
                              launch_cooperative_grid=True)

    reset()
    try:
        kernel()
        torch.cuda.synchronize()
    except RuntimeError as e:  # a cooperative grid larger than what can be resident at once
        raise Skipped(f"--d {D} --rows {R} {variant} {param}: {P} programs cannot all be resident at once "
                      f"({str(e).splitlines()[0][:120]})") from None
    words = variant in ("ll", "lll")

    def result() -> torch.Tensor:
        return ll_values(XW[L]) if words else X[L]

    first = result().clone()
    err = float((first - ref).norm() / ref.norm())
    times, host_late, issue_us, spun = [], 0, [], 0
    cycles = 10_000_000  # the GPU's busy spin before a run: about 5 ms at 2 GHz, longer where the host is late
    for _ in range(reps):
        # the GPU busy while the run's reset and launches are queued, so that the events time the
        # GPU alone; a run whose start the GPU reached before the host had issued it is the host's
        # time: not counted, and the next spin four times longer (up to about 1.3 s, then no more runs)
        torch.cuda._sleep(cycles)
        spun = cycles
        t0 = time.perf_counter()
        reset()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        kernel()
        late = s.query()
        e.record()
        issue_us.append((time.perf_counter() - t0) * 1e6)
        e.synchronize()
        if late:
            host_late += 1
            if not _PROFILED:  # once a process: where the host's time goes
                _profile_host(reset, kernel, cycles)
            if cycles >= 2_560_000_000:  # late after a 1.3 s spin: the host is not what is late
                break
            cycles *= 4
            continue
        times.append(s.elapsed_time(e) * 1e3 / L)
    # the last timed run's result the checked first run's, bit for bit (each program sums in a
    # fixed order), and for the words every flag its own: no program gave up waiting, none read
    # a stale x
    done = torch.equal(result(), first) and (not words or bool(((XW[L] >> 32) == epoch[0] * (L + 1) + L).all()))
    return {"variant": variant, "D": D, "R": R, "L": L, "BK": BK, "param": param, "wait": wait,
            "us_per_layer": sorted(times)[len(times) // 2] if times else None, "rel_err": err if wait else None,
            "host_late": host_late, "spin_cycles": spun,
            "issue_us": sorted(issue_us)[len(issue_us) // 2] if issue_us else None,
            "last_run_complete": done if wait else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", default="2048,4096", help="the layers' sizes (D x D weights)")
    ap.add_argument("--rows", default="16,32", help="rows a program, one per --d (D / rows programs; e.g. --d "
                    "2048,2048 --rows 16,8: one and two programs a multiprocessor)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--bk", type=int, default=256, help="columns a chunk (a K step)")
    ap.add_argument("--stages", default="3,4", help="the Triton chain's pipeline depths")
    ap.add_argument("--nbuf", default="4,8", help="the Gluon chain's ring buffers")
    ap.add_argument("--waits", default="on,off", help="on: the layers' waits; off: the streaming alone")
    ap.add_argument("--ways", default="triton,early,gluon",
                    help="the chains to run: triton, early, gluon (K loops), pre and ll (a row's weights in one load "
                         "before the wait; the counter's poll or the LL words), lpdl and lll (a launch a layer, "
                         "PDL: griddepcontrol.wait, or the LL words and no wait; a row's weights in registers: "
                         "for narrow layers, SmolLM2's 576)")
    ap.add_argument("--warps", default="4", help="the pre, ll, lpdl and lll chains' warps a program")
    ap.add_argument("--json")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/gluon_chain.py needs a CUDA GPU")
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name()}; triton {triton.__version__}"
          + ("" if gluon is not None else " (no Gluon chain: this Triton's Gluon is not 3.5-3.6's)"), flush=True)
    out = []
    for D, R in zip((int(v) for v in a.d.split(",")), (int(v) for v in a.rows.split(","))):
        floor_us = D * D * 2 / bw * 1e6
        ways = [(v, int(s)) for v in ("triton", "early") for s in a.stages.split(",")]
        ways += [] if gluon is None else [("gluon", int(n)) for n in a.nbuf.split(",")]
        ways += [(v, int(w)) for v in ("pre", "ll", "lpdl", "lll") for w in a.warps.split(",")]
        ways = [(v, p) for v, p in ways if v in a.ways.split(",")]
        for variant, param in ways:
            smem = param * R * a.bk * 2 + D * 4  # the ring, and x staged
            if variant == "gluon" and smem > 200 * 1024:
                print(f"D={D} gluon nbuf={param}: {smem // 1024} KiB of shared memory, skipped", flush=True)
                continue
            what = {"gluon": "nbuf", "pre": "warps", "ll": "warps", "lpdl": "warps", "lll": "warps"}.get(
                variant, "stages")
            for wait in (w == "on" for w in a.waits.split(",")):
                try:
                    r = run(variant, D, R, a.layers, a.bk, param, wait)
                except Skipped as e:
                    print(f"D={D} R={R} {variant:6s} {what}={param}: skipped: {e}", flush=True)
                    continue
                us = r["us_per_layer"]
                r["floor_us"] = floor_us
                r["x_floor"] = None if us is None else us / floor_us
                out.append(r)
                err = f"rel_err {r['rel_err']:.1e}, last run complete {r['last_run_complete']}" if wait else "no waits"
                late = f", {r['host_late']} runs the host's (not counted; the runs' median issue " \
                    f"{r['issue_us']:.0f} us, the last spin {r['spin_cycles']:.1e} cycles)" if r["host_late"] else ""
                timed = "no run timed on the GPU alone" if us is None else \
                    f"{us:7.2f} us a layer ({r['x_floor']:.2f}x the floor {floor_us:.2f})"
                print(f"D={D} R={R} {variant:6s} {what}={param}: {timed}, {err}{late}", flush=True)
                if a.json:  # (after every row: a later hang or kill keeps what was measured)
                    with open(a.json, "w") as f:
                        json.dump({"device": torch.cuda.get_device_name(), "copy_Bps": bw, "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
