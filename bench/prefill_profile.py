"""Where a prefill's time goes (issue 46: the prefill on quantized weights against bf16's): for each
weight spec, ``--repeat`` timed prefills of a ``--tokens``-token prompt (each one's milliseconds,
after a first, compiling one), then one under ``torch.profiler``: the host's wall time against the
device's busy time, and the operations taking most of each.

    python bench/prefill_profile.py --config smollm2-135m --specs bf16,q4_1/q8_0 --tokens 512
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import quantized_spec  # noqa: E402
from pto.orchestration.llm.generate import Generator  # noqa: E402
from pto.orchestration.model.program import CONFIGS, random_weights  # noqa: E402

from pto.ir.dtypes import DType  # noqa: E402


def one(gen: Generator, step, prompt: list[int], cap: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    gen.prefill(step, [prompt], cap)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="smollm2-135m", choices=sorted(CONFIGS))
    ap.add_argument("--specs", default="bf16,q4_1/q8_0")
    ap.add_argument("--ways", default="dequantize,native", help="the Generator's quant_prefill values")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--budgets", default="",
                    help="the dequantizer's budgets (bytes; DEQUANT_BUDGET), each once a round")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--python", action="store_true", help="also the host's Python functions (cProfile) of one prefill")
    args = ap.parse_args(argv)
    cfg = CONFIGS[args.config]
    g = torch.Generator("cuda").manual_seed(0)
    base = random_weights(cfg, torch.bfloat16, g)
    prompt = torch.randint(0, cfg.vocab, (args.tokens + 1,), generator=torch.Generator().manual_seed(1)).tolist()
    cap = args.tokens + 64
    if args.budgets:
        return budgets(args, base, prompt, cap, g)
    for spec in args.specs.split(","):
        w = quantized_spec(base, spec, g)
        for how in args.ways.split(",") if spec != "bf16" else ["dequantize"]:
            gen = Generator(w, "cuda", DType.BF16, quant_prefill=how)
            try:
                step = gen.step(1, cap)
                one(gen, step, prompt, cap)
                times = [round(one(gen, step, prompt, cap), 3) for _ in range(args.repeat)]
                print(f"{args.config} {spec} {how}: prefill ms {times} median {sorted(times)[len(times) // 2]}",
                      flush=True)
                acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                with torch.profiler.profile(activities=acts) as prof:
                    wall = one(gen, step, prompt, cap)
                ev = prof.key_averages()
                busy = sum(e.self_device_time_total for e in ev) / 1e3
                kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                                 if e.device_type == torch.autograd.DeviceType.CUDA)
                span = (kernels[-1][1] - kernels[0][0]) / 1e3 if kernels else 0.0
                gaps = sorted((b[0] - a[1] for a, b in zip(kernels, kernels[1:]) if b[0] > a[1]), reverse=True)
                print(f"  profiled: wall {wall:.2f} ms, device busy {busy:.2f} ms, first kernel to last {span:.2f} ms, "
                      f"idle between {sum(gaps) / 1e3:.2f} ms (largest gaps us: {[round(x) for x in gaps[:8]]})",
                      flush=True)
                for key, title in (("self_device_time_total", "device"), ("self_cpu_time_total", "host")):
                    print(f"  by {title} time:")
                    for e in sorted(ev, key=lambda e: -getattr(e, key))[:args.top]:
                        print(f"    {getattr(e, key) / 1e3:8.3f} ms {e.count:6d}x  {e.key[:110]}")
                if args.python:
                    import cProfile
                    import pstats

                    pr = cProfile.Profile()
                    pr.enable()
                    one(gen, step, prompt, cap)
                    pr.disable()
                    pstats.Stats(pr).sort_stats("tottime").print_stats(args.top * 2)
            finally:
                gen.close()
            torch.cuda.empty_cache()
    return 0


def budgets(args, base, prompt: list[int], cap: int, g) -> int:
    """The dequantizing prefill of each spec under each ``--budgets`` value, ``--rounds`` times in
    turn, each in a Generator of its own: its prefills' milliseconds."""
    from pto.orchestration.model import quantized

    for spec in args.specs.split(","):
        w = quantized_spec(base, spec, g)
        for r in range(args.rounds):
            for budget in (int(b) for b in args.budgets.split(",")):
                quantized.DEQUANT_BUDGET = budget
                gen = Generator(w, "cuda", DType.BF16, quant_prefill="dequantize")
                try:
                    step = gen.step(1, cap)
                    one(gen, step, prompt, cap)
                    times = sorted(round(one(gen, step, prompt, cap), 3) for _ in range(args.repeat))
                    span = gen._dequantizer.span if gen._dequantizer else None
                    print(f"{spec} round {r} budget {budget} (span {span}): median {times[len(times) // 2]} "
                          f"min {times[0]} ms", flush=True)
                finally:
                    gen.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
