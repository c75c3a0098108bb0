"""Timing that the engine and the benchmarks share: the median of repeated runs, with CUDA events
on the GPU (device work is asynchronous) and the host clock elsewhere; the kernels a call runs;
and the share of a call's time that communication takes and how much of it overlaps compute
(:func:`comm_profile`, the tensor-parallel benchmarks')."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object], repeat: int = 10, warmup: int = 2, cuda: bool | None = None) -> float:
    """Median milliseconds of ``fn()`` over ``repeat`` runs after ``warmup`` runs."""
    return statistics.median(samples_ms(fn, repeat, warmup, cuda))


def samples_ms(fn: Callable[[], object], repeat: int, warmup: int = 0, cuda: bool | None = None) -> list[float]:
    """Milliseconds of each of ``repeat`` runs of ``fn()`` after ``warmup`` untimed runs."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def kernel_times(fn: Callable[[], object], runs: int) -> tuple[dict[str, tuple[float, float]], float]:
    """What the GPU ran during ``runs`` calls of ``fn``, after one untimed call (the PyTorch
    profiler, CUPTI): per kernel name (memory copies and sets too) its launches and milliseconds
    per call; and the wall milliseconds per call (beyond the kernels' sum: the gaps between them)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3 / runs
    acc: dict[str, tuple[int, float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            n, us = acc.get(e.name, (0, 0.0))
            acc[e.name] = (n + 1, us + e.device_time_total)
    return {name: (n / runs, us / 1e3 / runs) for name, (n, us) in acc.items()}, wall_ms


#: the pause between the profiled calls of :func:`kernel_timeline` (no call idles the GPU this long)
_APART_S = 0.002


def kernel_timeline(fn: Callable[[], object], runs: int = 3) -> list[list[tuple[str, float, float]]]:
    """The kernels of each of ``runs`` calls of ``fn`` (after one untimed call), in the order they
    started: ``(name, start, end)`` in microseconds from the call's first kernel (the PyTorch
    profiler, CUPTI; memory copies and sets left out). Kernels launched under programmatic
    dependent launch overlap their predecessors: :func:`frontier` says what each adds."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    spans = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
            torch.cuda.synchronize()
            time.sleep(_APART_S)  # (the GPU idles between calls: where they part)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset")):
            spans.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    return calls_apart(spans, _APART_S * 1e6 / 2)[-runs:]


def calls_apart(spans: list[tuple[str, float, float]], gap: float) -> list[list[tuple[str, float, float]]]:
    """Kernel spans ``(name, start, end)`` (any order) cut into calls where the GPU idled longer
    than ``gap`` after every kernel before, each call's spans in start order and from its first
    kernel's start."""
    calls: list[list[tuple[str, float, float]]] = []
    end = None
    for s in sorted(spans, key=lambda s: s[1]):
        if end is None or s[1] - end > gap:
            calls.append([])
            end = s[2]
        calls[-1].append(s)
        end = max(end, s[2])
    return [[(n, a - call[0][1], b - call[0][1]) for n, a, b in call] for call in calls]


def frontier(kernels: list[tuple[str, float, float]]) -> list[tuple[str, float, float, float]]:
    """Per kernel of one call (:func:`kernel_timeline`), ``(name, advance, busy, lead)``: how far
    it moved the latest end of the kernels before it (its share of the call's time: the advances
    sum to the call's span), its own duration, and its start less the previous kernel's end
    (negative: it started before its predecessor ended)."""
    out, latest, prev_end = [], 0.0, None
    for name, start, end in kernels:
        lead = start - prev_end if prev_end is not None else 0.0
        advance = max(end, latest) - (latest if prev_end is not None else start)
        latest, prev_end = max(end, latest), end
        out.append((name, advance, end - start, lead))
    return out


# -- communication in a profiler trace -----------------------------------------------------------------


def is_comm_kernel(name: str) -> bool:
    """Is a GPU kernel of this name a collective's: NCCL's, or symmetric memory's all-reduce
    (``one_shot_all_reduce_kernel``, ``two_shot_all_reduce_kernel``...)?"""
    low = name.lower()
    return "nccl" in low or "all_reduce" in low or "allreduce" in low


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(spans) -> float:
    return sum(b - a for a, b in spans)


def _intersection(xs, ys) -> float:
    total, j = 0.0, 0
    for a, b in xs:
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            total += max(0.0, min(b, ys[k][1]) - max(a, ys[k][0]))
            k += 1
    return total


def comm_profile(step: Callable[[], object], steps: int, cuda: bool, trace=None) -> dict:
    """Run ``step`` ``steps`` times under the profiler: ``comm_share`` (time with communication
    running over the steps' wall time), ``overlap`` (the part of the communication time during
    which compute runs too), ``comm_ms_per_step``, ``comm_calls_per_step`` and ``kernels`` (GPU
    time per step of the 12 longest kernels): the collectives' kernels (:func:`is_comm_kernel`)
    against the other kernels on a GPU, the all-reduce calls on the CPU (nothing overlaps them:
    gloo blocks the host). ``trace``: a path for the Chrome trace."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    comm, compute, kernels = [], [], {}
    for e in prof.events():
        on_gpu = e.device_type == torch.autograd.DeviceType.CUDA
        span = (e.time_range.start, e.time_range.end)
        name = e.name.lower()
        if cuda and on_gpu:
            (comm if is_comm_kernel(name) else compute).append(span)
            kernels[e.name[:80]] = kernels.get(e.name[:80], 0.0) + span[1] - span[0]
        elif not cuda and ("allreduce" in name or "all_reduce" in name):
            comm.append(span)
    calls = len(comm)
    comm, compute = _union(comm), _union(compute)
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    c = _length(comm)
    return {"comm_share": round(c / wall_us, 4) if wall_us else 0.0,
            "overlap": round(_intersection(comm, compute) / c, 4) if c else 0.0,
            "comm_ms_per_step": round(c / steps / 1e3, 4), "comm_calls_per_step": round(calls / steps, 2),
            "kernels": {k: round(v / steps / 1e3, 4) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:12]}}
