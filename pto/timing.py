"""Timing that the engine and the benchmarks share: the median of repeated runs, with CUDA events
on the GPU (device work is asynchronous) and the host clock elsewhere."""

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
