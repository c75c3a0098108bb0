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
