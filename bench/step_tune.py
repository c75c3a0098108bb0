"""The decode step's kernels' launch settings searched in the replayed step (issue 45): each InCore
function's ``num_warps`` and ``num_stages`` by coordinate descent, every candidate timed as the
whole step's CUDA graph replays, on the wave executor. ``pto tune model`` times one launch at a
time from Python, 30-60 us of host time around a 3-9 us kernel, so its winners changed no
kernel's time in the replayed step (docs/PERF.md, "Decode: a whole model"); here a candidate is
kept only where the step it runs in is faster.

    python3 bench/step_tune.py [--config smollm2-135m] [--batch 1] [--quant bf16] [--warps 2,4,8]
                               [--stages 1,2,3] [--functions all] [--steps 64] [--budget 420]
                               [--keep 0.5] [--json FILE]

Per function (in the order ``--functions`` gives, else the order the step compiles them), each
candidate's step ms against the best so far; a candidate is kept where it is ``--keep`` percent
faster. At the end the defaults and the settings found, in turn, twice each. Nothing is written
to a schedule database."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode import events_rounds, half_filled, quantized_spec, settle_graphs  # noqa: E402
from pto.orchestration.llm.generate import Generator  # noqa: E402
from pto.orchestration.model.program import CONFIGS, random_weights  # noqa: E402

from pto.ir.dtypes import DType  # noqa: E402


def step_ms(w, batch: int, cache: int, steps: int, settings: dict[str, dict]) -> tuple[float, dict]:
    """The wave executor's step of ``batch`` sequences at half of ``cache`` with ``settings`` (function
    name: launch settings), ms (the median of the rounds), and its kernels' own settings."""
    gen = Generator(w, "cuda", DType.BF16, executor="waves")
    try:
        step = gen.step(batch, cache)
        # (the backend's own launch settings given per function: they apply from the first run on)
        step.executor.backend.launch_overrides.update(settings)
        ms = statistics.median(events_rounds(half_filled(step, w.config.vocab, batch, cache), steps))
        kernels = {}
        for k in step.executor.backend.compiled_kernels():
            kernels.setdefault(k["kernel"].split("__")[0], {"num_warps": k["warps"], "num_stages": k["stages"]})
        return ms, kernels
    finally:
        gen.close()
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cache", type=int, default=1024)
    ap.add_argument("--quant", default="bf16", help="the weights: bf16 or LAYERS[/HEAD], e.g. q4_1/q8_0")
    ap.add_argument("--warps", default="2,4,8")
    ap.add_argument("--stages", default="1,2,3")
    ap.add_argument("--functions", default="all", help="the InCore functions to search (names, commas), or all")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--budget", type=float, default=420, help="seconds of searching before the final comparison")
    ap.add_argument("--keep", type=float, default=0.5, help="percent faster a candidate must be to be kept")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    settle_graphs()  # (every step timed in the state a process reaches at its fourth CUDA graph)
    cfg = CONFIGS[args.config]
    g = torch.Generator(device="cuda").manual_seed(0)
    w = quantized_spec(random_weights(cfg, torch.bfloat16, g), args.quant, g)
    t0 = time.perf_counter()
    base, own = step_ms(w, args.batch, args.cache, args.steps, {})
    print(f"{args.config} {args.quant} B={args.batch}: default {base:.4f} ms; the kernels' settings {own}", flush=True)
    names = list(own) if args.functions == "all" else args.functions.split(",")
    best, best_ms, tried = {}, base, []
    for name in names:
        for warps in (int(x) for x in args.warps.split(",")):
            for stages in (int(x) for x in args.stages.split(",")):
                cand = {"num_warps": warps, "num_stages": stages}
                if cand == best.get(name, own.get(name)):
                    continue
                if time.perf_counter() - t0 > args.budget:
                    break
                try:
                    ms, _ = step_ms(w, args.batch, args.cache, args.steps, {**best, name: cand})
                except Exception as e:  # a setting that does not compile or fit: say so, go on
                    print(f"  {name} {cand}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                    continue
                kept = ms < best_ms * (1 - args.keep / 100)
                tried.append({"function": name, **cand, "ms": round(ms, 4), "kept": kept})
                mark = " kept" if kept else ""
                print(f"  {name} warps={warps} stages={stages}: {ms:.4f} ms (best {best_ms:.4f}){mark}", flush=True)
                if kept:
                    best, best_ms = {**best, name: cand}, ms
    final = {"default": [], "found": []}
    for _ in range(2):
        final["default"].append(round(step_ms(w, args.batch, args.cache, args.steps, {})[0], 4))
        final["found"].append(round(step_ms(w, args.batch, args.cache, args.steps, best)[0], 4))
    print(f"settings found: {json.dumps(best)}", flush=True)
    print(f"in turn: default {final['default']} ms, found {final['found']} ms", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"config": args.config, "quant": args.quant, "batch": args.batch,
                                               "own": own, "found": best, "tried": tried, "final": final}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
