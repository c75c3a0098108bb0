"""The persistent megakernel's design choices, measured on decode steps: milliseconds per token of
each choice against the wave executor in the same process (random weights of the real shapes,
bf16, batch 1, the cache filled to half; a GPU).

    python bench/megakernel.py [--configs smollm2-135m,llama3.2-1b,llama3-8b] [--cache 1024]
        [--variants 'd=static;d=stream,f=1'] [--tilings 'default;waves;bn=8'] [--steps 32] [--json FILE]

A variant is comma-separated settings of the megakernel's environment: ``d=`` dispatch
(``PTO_DISPATCH``), ``f=`` 0 or 1 (``PTO_MK_PREFETCH``), ``s=`` programs per multiprocessor
(``PTO_PER_SM``), ``g=`` programs (``PTO_PROGRAMS``), e.g. ``d=static,f=1``. A tiling is
``default`` (the executor's own, :func:`pto.orchestration.model.program.tiling_for_executor`),
``waves`` (the wave executor's) or fields replaced in the wave executor's, as bench/decode.py
takes them. Each persistent run reports its megakernel's items, median item gap and dependency
wait, registers, spills, shared memory and programs per SM. Every row is printed as a JSON line as
soon as it is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import copy_bandwidth, floor_ms, ours, parse_tiling  # noqa: E402
from pto.orchestration.model.program import CONFIGS, random_weights, tiling_for, tiling_for_executor  # noqa: E402

#: the short names of a variant's settings
ENV = {"d": "PTO_DISPATCH", "f": "PTO_MK_PREFETCH", "s": "PTO_PER_SM", "g": "PTO_PROGRAMS"}


def tiling(text: str, cfg, executor: str):
    if text == "default":
        return tiling_for_executor(cfg, executor)
    return parse_tiling("default" if text == "waves" else text, tiling_for(cfg))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="smollm2-135m,llama3.2-1b,llama3-8b")
    ap.add_argument("--cache", type=int, default=1024)
    ap.add_argument("--variants", default="d=static;d=stream")
    ap.add_argument("--tilings", default="default")
    ap.add_argument("--waves", default="default", help="tilings the wave executor runs ('' none)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    bw = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name(0)}, {sms} SMs", flush=True)
    rows = []
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        w = random_weights(cfg, torch.bfloat16, torch.Generator(device="cuda").manual_seed(0))
        base = {"config": name, "cache": args.cache, "floor_ms": floor_ms(cfg, 1, args.cache, bw)}
        runs = [("waves", t, "") for t in args.waves.split(";") if t]
        runs += [("persistent", t, v) for t in args.tilings.split(";") for v in args.variants.split(";")]
        for executor, tl, variant in runs:
            env = dict(kv.split("=") for kv in variant.split(",")) if variant else {}
            env = {ENV[k]: v for k, v in env.items()}
            old = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                res = ours(w, 1, args.cache, executor, args.steps, tiling(tl, cfg, executor))
            except Exception as e:  # report it, measure the rest
                res = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            finally:
                for k, v in old.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            row = {**base, "executor": executor, "tiling": tl, "variant": variant, **res}
            if "ms" in res:
                row["x_floor"] = round(base["floor_ms"] / res["ms"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
        del w
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "bandwidth": bw,
                                               "rows": rows}, indent=1))
    for r in rows:
        what = r["executor"] + (f" [{r['variant']}]" if r["variant"] else "") + f" tiling {r['tiling']}"
        rep = r.get("report", {})
        print(f"{r['config']:14s} {what:44s} {r.get('ms', r.get('error'))} ms  floor {r['floor_ms']}  "
              f"items {rep.get('items', '')} gap {rep.get('item_gap_us', '')} wait {rep.get('dependency_wait_us', '')} "
              f"regs {rep.get('regs', '')} spills {rep.get('spills', '')} smem {rep.get('shared', '')} "
              f"per_sm {rep.get('programs_per_sm', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
