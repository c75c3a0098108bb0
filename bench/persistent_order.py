"""Compare the persistent executor's queue orders on the GPU (docs/PERF.md): ``list`` (a list
schedule, critical path first) against ``levels`` (topological levels, grouped), with the wave
executor beside them, for the LLaMA layer's attention modes.

    python bench/persistent_order.py --runs fused:4096,fused:16384,pair:4096 --json order.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from pto.engine import Placement, Prepared, build_graph, module_of, rel_err, resolve  # noqa: E402

#: the executors compared: (column, executor, its options)
EXECUTORS = (("waves", "waves", ()), ("list", "persistent", (("order", "list"),)),
             ("levels", "persistent", (("order", "levels"),)))


def measure(mode: str, seq: int, repeat: int) -> dict:
    job = resolve("llama7b", device="cuda", config="7b", dtype="bf16", options={"attention": mode})
    prog, s = job.program, job.settings
    shape = prog.shape(seq)
    module = module_of(job, shape)
    inputs = prog.inputs(s, shape, "cuda", seed=seq)
    ref = prog.reference(s, shape, inputs)["y"]
    row = {"mode": mode, "seq": seq}
    for column, executor, options in EXECUTORS:
        # the graph as every run builds it; the shipped schedules, as pto run
        place = Placement("cuda", "triton", executor, schedules=prog.schedules, options=options)
        run = Prepared(build_graph(job, shape, module=module), place, inputs, packed=prog.packed_inputs(s))
        try:
            row["tasks"] = run.graph.tasks
            row[f"{column}_rel_err"] = rel_err(run()["y"], ref)
            row[f"{column}_ms"] = run.time(repeat)["replay_ms"]
            run.executor.check()
            if executor == "persistent":
                row[f"{column}_gap_us"] = run.executor.report().get("item_gap_us")
        finally:
            run.close()
        torch.cuda.empty_cache()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="fused:4096,fused:16384,pair:4096,split:4096", help="MODE:SEQ,...")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("persistent_order: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for run in args.runs.split(","):
        mode, seq = run.split(":")
        rows.append(measure(mode, int(seq), args.repeat))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
