#!/usr/bin/env python3
"""Is a decode step slower for being built later in a process?

Measured on an H200 (2026-12-02, docs/PERF.md "Twenty-third session"): SmolLM2's bf16 step on the
wave executor, built six times in one process by ``bench/decode.py --quant bf16,bf16,...`` (a new
Generator each time, closed after its timing), took 0.399-0.411 ms the first three times and
0.443-0.461 ms from the fourth on, with or without the profiler, under PDL "auto" and "late"
alike; the persistent executor's did not move. This script tells the explanations apart in one
run:

- ``--keep``: every step stays alive (its Generator open) instead of being closed after its
  timing, so no step reuses the memory of another;
- at the end, the first and the last steps are timed again (``--keep`` keeps the first; without
  it the first is kept alone): if the first is slow now, something of the process or the GPU
  changed (global state), if it is still fast, the later steps themselves differ (where their
  buffers lie, their graphs);
- ``--gc``: ``gc.collect()`` and ``torch.cuda.empty_cache()`` between steps;
- per step: the caching allocator's bytes and segments, the address span of the step's own
  tensors, how the step replays (a CUDA graph or launches), and the GPU's clocks, temperature and
  throttle reasons (``nvidia-smi``);
- per step and re-timing: the host's microseconds to issue one replay, and the live threads;
- ``--no-capture``: the later steps are built and run once but never captured in a CUDA graph;
- ``--graphs K``: K CUDA graphs of plain torch kernels captured before the second step is built
  (``--graph-kernels N`` a graph, ``--no-launch`` never replayed, ``--drop`` then freed,
  ``--graph-kind pool`` in one shared memory pool, ``bare`` through ``capture_begin``/``capture_end``
  alone, ``driver`` captured and instantiated through the driver's API with ``--graph-flags``,
  ``raw`` empty ones through the driver's API);
- ``--hold S``: before building the second step, time the first again every two seconds for S
  seconds with nothing else built: if it slows down, time alone (clocks, heat) does it.

Found on the H200 (2026-12-02, twenty-fourth session; docs/PERF.md): **the fourth CUDA graph a
process captures with torch (``torch.cuda.graph``, as pto's are), slows every later replay of a
many-kernel graph by 10-15%, for good.** The first step timed again after the sixth was built is
as slow as the sixth (0.447 against 0.399 ms), with ``--keep`` and ``--gc`` alike and with PDL off
(0.654 -> 0.722); 40 s of replays alone (``--hold``) do not slow it and the clocks stay at 1,980
MHz with no throttle; the host issues a replay in 50-100 us (far ahead); later steps built and run
but never captured (``--no-capture``) leave it fast; two graphs of plain torch kernels leave it
fast, a third (the process's fourth) slows it, captured and never replayed, of one kernel or of
300, and sixteen do no worse, and freeing them (``--drop``) does not undo it. The persistent
executor's one-launch step does not move. So compare steps in like states: ``bench/decode.py
--settle``.

Later the same day (twenty-fifth session): it is not the count of graphs alone, nor one thing of
torch's. Three graphs of 300 torch kernels slow the step through ``torch.cuda.graph`` (0.3942 ->
0.4428) and in one pool, not through ``capture_begin``/``capture_end`` on a side stream (``bare``:
0.3943), nor the same after ``torch.cuda.empty_cache()`` (``emptied``: 0.3911), nor captured and
instantiated through the driver (``driver``, flags 0, 1 or 9: 0.3950-0.3963); but three
``emptied`` graphs of one kernel do (0.4469); and pto's own steps captured ``bare`` (tried, not
kept) still slowed from the fourth (0.3957 -> 0.4469).

``python3 bench/step_order.py --config smollm2-135m --steps 6 [--keep] [--gc] [--executor waves]``;
one JSON line a step, then the re-timings. On a machine without a GPU it runs the tiny model on
the CPU (the mechanics, not the times).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import events_rounds  # noqa: E402
from pto.orchestration.llm.generate import Generator  # noqa: E402
from pto.orchestration.model.program import CONFIGS, random_weights  # noqa: E402

from pto.ir.dtypes import DType  # noqa: E402


def step_ms(fn, calls: int, cuda: bool) -> float:
    """The median of three rounds' milliseconds a call of ``fn`` (``calls`` a round), after one
    untimed call: CUDA events around each round on a GPU (bench/decode.py's), else the host's clock."""
    if cuda:
        return statistics.median(events_rounds(fn, 3 * calls))
    fn()
    rounds = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(rounds)


def host_us(fn, calls: int, cuda: bool) -> float:
    """Microseconds the host takes to issue one call of ``fn`` (``calls`` issued back to back
    after a synchronization, the clock stopped before the next): a step the host cannot issue
    as fast as the GPU runs it is bound by the host."""
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) * 1e6 / calls
    if cuda:
        torch.cuda.synchronize()
    return round(us, 1)


def torch_graphs(k: int, kernels: int, launch: bool, kind: str = "torch", flags: int = 0) -> list:
    """``k`` CUDA graphs of ``kernels`` small torch kernels each, captured (and replayed once
    where ``launch``): ``kind`` "torch" through ``torch.cuda.graph`` (which synchronizes,
    collects garbage and empties the allocator's cache first), each in a memory pool of its own,
    "pool" the same in one shared pool, "bare" through ``CUDAGraph.capture_begin``/``capture_end``
    alone (none of that first; "emptied" the same after ``torch.cuda.empty_cache()``), "driver"
    captured and instantiated through the driver's API (``libcuda``, instantiated with ``flags``:
    no torch graph, no pool), "raw" empty graphs made and instantiated through the driver's API
    alone (no capture, no kernel)."""
    if kind == "raw":
        return raw_graphs(k)
    if kind == "driver":
        return driver_graphs(k, kernels, launch, flags)
    x = torch.zeros(1024, device="cuda")
    pool = torch.cuda.graph_pool_handle() if kind == "pool" else None
    side = torch.cuda.Stream()  # (the bare captures' stream; torch.cuda.graph takes its own)
    side.wait_stream(torch.cuda.current_stream())
    out = []
    for _ in range(k):
        g = torch.cuda.CUDAGraph()
        if kind in ("bare", "emptied"):
            if kind == "emptied":
                torch.cuda.empty_cache()
            with torch.cuda.stream(side):
                g.capture_begin()
                for _ in range(kernels):
                    x.add_(1.0)
                g.capture_end()
        else:
            with torch.cuda.graph(g, pool=pool):
                for _ in range(kernels):
                    x.add_(1.0)
        if launch:
            g.replay()
        out.append(g)
    torch.cuda.synchronize()
    return out


def _driver(name: str, *args) -> None:
    """Call the CUDA driver API's ``name`` (``libcuda``) with ``args``; RuntimeError where it fails."""
    import ctypes

    rc = getattr(ctypes.CDLL("libcuda.so.1"), name)(*args)
    if rc != 0:
        raise RuntimeError(f"the CUDA driver API's {name} failed with error {rc}")


def raw_graphs(k: int) -> list:
    """``k`` empty CUDA graphs created and instantiated by the driver API (``cuGraphCreate``,
    ``cuGraphInstantiateWithFlags``) in the current context, kept (as their handles)."""
    import ctypes

    out = []
    for _ in range(k):
        graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
        _driver("cuGraphCreate", ctypes.byref(graph), ctypes.c_uint(0))
        _driver("cuGraphInstantiateWithFlags", ctypes.byref(exe), graph, ctypes.c_ulonglong(0))
        out.append((graph, exe))
    return out


def driver_graphs(k: int, kernels: int, launch: bool, flags: int) -> list:
    """``k`` graphs of ``kernels`` small torch kernels each, captured on a side stream by the
    driver's ``cuStreamBeginCapture`` (relaxed mode) and ``cuStreamEndCapture`` and instantiated by
    ``cuGraphInstantiateWithFlags(flags)`` (launched once where ``launch``), kept as handles: the
    kernels torch's, nothing else of torch's graph machinery."""
    import ctypes

    x = torch.zeros(1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    stream = ctypes.c_void_p(side.cuda_stream)
    out = []
    for _ in range(k):
        graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
        with torch.cuda.stream(side):
            _driver("cuStreamBeginCapture_v2", stream, ctypes.c_uint(2))
            for _ in range(kernels):
                x.add_(1.0)
            _driver("cuStreamEndCapture", stream, ctypes.byref(graph))
        _driver("cuGraphInstantiateWithFlags", ctypes.byref(exe), graph, ctypes.c_ulonglong(flags))
        if launch:
            _driver("cuGraphLaunch", exe, stream)
        out.append((graph, exe))
    torch.cuda.synchronize()
    return out


def destroy_raw(graph) -> None:
    """Free one of :func:`raw_graphs`' or :func:`driver_graphs`' graphs (its executable, then the graph)."""
    g, exe = graph
    _driver("cuGraphExecDestroy", exe)
    _driver("cuGraphDestroy", g)


def threads() -> list[str]:
    """The names of the process's live threads (a thread left running by a build competes for
    the interpreter's lock with the thread that issues the replays)."""
    return sorted(t.name for t in threading.enumerate())


def gpu_state(cuda: bool) -> dict:
    """The GPU's SM and memory clocks, temperature and active throttle reasons, as ``nvidia-smi``
    reports them (empty without a GPU or without nvidia-smi)."""
    if not cuda:
        return {}
    fields = "clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits",
                              f"--id={torch.cuda.current_device()}"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(zip(["sm_mhz", "mem_mhz", "temp_c", "power_w", "throttle"], out.split(", ")))


def memory(cuda: bool) -> dict:
    """The caching allocator's allocated and reserved bytes and its segments (GPU only)."""
    if not cuda:
        return {}
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "segments": len(torch.cuda.memory_snapshot())}


class Built:
    """One step of ``batch`` sequences and a ``cache``-slot cache on a Generator of its own,
    its cache half full, and how to time it."""

    def __init__(self, w, device: str, dtype: DType, executor: str, batch: int, cache: int):
        self.gen = Generator(w, device, dtype, executor=executor)
        self.step = self.gen.step(batch, cache)
        t = self.step.tensors
        t["k_cache"].normal_()
        t["v_cache"].normal_()
        t["pos"].fill_(cache // 2)
        t["tok"].copy_(torch.randint(0, w.config.vocab, (batch, 1), generator=torch.Generator().manual_seed(0)))
        self.step()  # the first run: compiles, fits, uploads
        self.start = t["pos"].clone()
        ptrs = [v.data_ptr() for v in t.values() if v.numel()]
        self.span = (min(ptrs), max(ptrs))

    def replay(self) -> str:
        self.step.tensors["pos"].copy_(self.start)  # the same position every call
        return self.step.replay()

    def close(self) -> None:
        self.gen.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=None,
                    help="a model configuration (default: smollm2-135m on a GPU, tiny on the CPU)")
    ap.add_argument("--steps", type=int, default=6, help="steps built one after another")
    ap.add_argument("--executor", default="waves")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cache", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=32, help="replays a timing round (three rounds)")
    ap.add_argument("--keep", action="store_true", help="keep every step alive")
    ap.add_argument("--gc", action="store_true", help="collect garbage and empty the CUDA cache between steps")
    ap.add_argument("--hold", type=float, default=0.0, metavar="S",
                    help="time the first step again every two seconds for S seconds before building the second")
    ap.add_argument("--no-capture", action="store_true",
                    help="build and run the later steps once, never capturing or timing them")
    ap.add_argument("--graphs", type=int, default=0, metavar="K",
                    help="before building the second step, capture K CUDA graphs of 300 small torch kernels each "
                         "(kept alive) and time the first step again")
    ap.add_argument("--graph-kernels", type=int, default=300, help="with --graphs: kernels a graph")
    ap.add_argument("--graph-kind", choices=("torch", "pool", "bare", "emptied", "driver", "raw"), default="torch",
                    help="with --graphs: torch.cuda.graph's (a memory pool each), the same in one shared pool, "
                         "CUDAGraph.capture_begin/end alone (emptied: after torch.cuda.empty_cache()), "
                         "captured and instantiated through the driver's API, "
                         "or empty graphs through the driver's API alone")
    ap.add_argument("--graph-flags", type=int, default=0,
                    help="with --graph-kind driver: cuGraphInstantiateWithFlags' flags (1: auto-free on launch, "
                         "8: node priority; 9 both, as torch instantiates)")
    ap.add_argument("--no-launch", action="store_true", help="with --graphs: capture them, never replay them")
    ap.add_argument("--drop", action="store_true", help="with --graphs: then reset and free them, and time again")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", DType.BF16) if cuda else ("cpu", DType.F32)
    name = args.config or ("smollm2-135m" if cuda else "tiny")
    cfg = CONFIGS[name]
    g = torch.Generator(device=device).manual_seed(0)
    w = random_weights(cfg, torch.bfloat16 if cuda else torch.float32, g)
    cache = args.cache if cuda else min(args.cache, 64)
    kept: list[Built] = []
    first = last = None
    others = []
    for i in range(args.steps):
        b = Built(w, device, dtype, args.executor, args.batch, cache)
        if i and args.no_capture:
            print(json.dumps({"step": i + 1, "built": "run once, not captured"}), flush=True)
            b.close()
            continue
        mode = b.replay()
        ms = step_ms(b.replay, args.calls, cuda)
        print(json.dumps({"config": name, "executor": args.executor, "step": i + 1, "ms": round(ms, 4),
                          "replay": mode, "tensors_span": [hex(p) for p in b.span], **memory(cuda),
                          **gpu_state(cuda), "host_us": host_us(b.replay, args.calls, cuda),
                          "threads": threads()}), flush=True)
        if i == 0 and args.hold > 0:
            t0 = time.monotonic()
            while time.monotonic() - t0 < args.hold:
                time.sleep(2.0)
                print(json.dumps({"hold_s": round(time.monotonic() - t0, 1),
                                  "ms": round(step_ms(b.replay, args.calls, cuda), 4), **gpu_state(cuda)}),
                      flush=True)
        if i == 0 and args.graphs and cuda:
            others = torch_graphs(args.graphs, args.graph_kernels, not args.no_launch, args.graph_kind,
                                  args.graph_flags)
            print(json.dumps({"graphs": args.graphs, "kind": args.graph_kind, "flags": args.graph_flags,
                              "kernels": args.graph_kernels,
                              "launched": not args.no_launch,
                              "ms": round(step_ms(b.replay, args.calls, cuda), 4)}),
                  flush=True)
            if args.drop:
                for other in others:
                    if isinstance(other, torch.cuda.CUDAGraph):
                        other.reset()
                    else:
                        destroy_raw(other)
                others = []
                gc.collect()
                torch.cuda.empty_cache()
                print(json.dumps({"graphs": "dropped", "ms": round(step_ms(b.replay, args.calls, cuda), 4)}),
                      flush=True)
        if i == 0:
            first = b
        elif args.keep:
            kept.append(b)
        elif i < args.steps - 1:
            b.close()
        last = b
        if args.gc:
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    for tag, b in (("first", first), ("last", None if last is first else last)):
        if b is not None:
            print(json.dumps({"again": tag, "ms": round(step_ms(b.replay, args.calls, cuda), 4),
                              "host_us": host_us(b.replay, args.calls, cuda), "threads": threads()}), flush=True)
    for b in {id(x): x for x in [first, last, *kept] if x is not None}.values():
        b.close()
    del others


if __name__ == "__main__":
    main()
