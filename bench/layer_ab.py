"""Two settings of one program against each other and torch.compile, timed in turn in one process
(issue 23's choice of ``--fuse-norm-rope``): each variant's task graph built and replayed as a
CUDA graph, the reference under ``torch.compile`` on the first variant's inputs, all of them timed
``--iterations`` runs each, round after round (:func:`pto.cli.commands.bench.interleaved`), so that
a drift of the GPU's clocks falls on all alike. A variant is a JSON object of the program's
options; every variant's result is checked against the reference (its own inputs: a variant that
folds its weights gets them folded from the same seed).

    python3 bench/layer_ab.py --program llama7b --config 7b --seq 1024,4096 \\
        --variants '{}' '{"fuse_norm_rope": true}' [--rounds 5] [--iterations 10] [--json F]

Prints one line per length: each variant's median ms, its spread between rounds (slowest round's
median over the fastest's), each variant over the first and torch.compile over the first (the
median of the rounds' ratios).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from pto.cli.commands.bench import Timing, interleaved, round_medians, round_ratio, spread
from pto.engine import Runner, rel_err, resolve


def row(args, variants: list[dict], seq: int, timing: Timing) -> dict:
    jobs = [resolve(args.program, device=args.device, config=args.config, dtype=args.dtype, executor="waves",
                    options=v) for v in variants]
    out: dict = {"seq": seq}
    timers, runners = {}, []
    try:
        for i, job in enumerate(jobs):
            prog, s = job.program, job.settings
            shape = prog.shape(seq)
            inputs = prog.inputs(s, shape, args.device, timing.seed)
            ref = prog.reference(s, shape, inputs)
            runners.append(Runner(job, shape))
            got = runners[-1](inputs)
            out[f"v{i}_rel_err"] = max(rel_err(got[k], v) for k, v in ref.items())
            runners[-1].replay()  # the CUDA graph
            timers[f"v{i}"] = runners[-1].replay
            if i == 0:
                torch._dynamo.reset()  # the shape's own code, as pto bench compiles it
                inputs0, ref0 = inputs, torch.compile(lambda x, p=prog, s=s, sh=shape: p.reference(s, sh, x),
                                                      dynamic=False)
                ref0(inputs0)
                timers["compile"] = lambda f=ref0, x=inputs0: f(x)
        ms = interleaved(timers, timing, cuda=args.device == "cuda")
    finally:
        for r in runners:
            r.close()
    meds = {name: round_medians(v, timing.rounds) for name, v in ms.items()}
    for name, v in ms.items():
        out[f"{name}_ms"] = round(statistics.median(v), 4)
        out[f"{name}_rounds"] = [round(m, 4) for m in meds[name]]
        out[f"{name}_spread"] = round(spread(meds[name]), 4)
    for name in [n for n in ms if n != "v0"]:
        out[f"{name}_over_v0"] = round(round_ratio(meds[name], meds["v0"]), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default="llama7b")
    ap.add_argument("--config", default="7b")
    ap.add_argument("--seq", default="1024,4096")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--variants", nargs="+", default=["{}", '{"fuse_norm_rope": true}'])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    variants = [json.loads(v) for v in args.variants]
    timing = Timing(iterations=args.iterations, warmup=3, rounds=args.rounds)
    rows = []
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"{args.program} {args.config} on {where}: variants {variants}", flush=True)
    for seq in (int(x) for x in args.seq.split(",")):
        r = row(args, variants, seq, timing)
        rows.append(r)
        cells = [f"v{i} {r[f'v{i}_ms']:.3f} (+-{r[f'v{i}_spread']:.1%}, err {r[f'v{i}_rel_err']:.1e})"
                 for i in range(len(variants))]
        ratios = [f"v{i}/v0 {r[f'v{i}_over_v0']:.3f}" for i in range(1, len(variants))]
        vs = [f"compile/v0 {r['compile_over_v0']:.3f}"]
        print(f"{seq} | " + " | ".join(cells + [f"compile {r['compile_ms']:.3f} (+-{r['compile_spread']:.1%})"]
                                       + ratios + vs), flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"program": args.program, "config": args.config, "variants": variants, "rows": rows}, fh,
                      indent=1)


if __name__ == "__main__":
    main()
