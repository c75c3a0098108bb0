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

from pto.backends import get_backend  # noqa: E402
from pto.buffers import allocate, tensor_shapes  # noqa: E402
from pto.engine import rel_err, resolve  # noqa: E402
from pto.exec.persistent import PersistentExecutor  # noqa: E402
from pto.exec.waves import WaveExecutor  # noqa: E402
from pto.graph import CompiledProgram  # noqa: E402
from pto.timing import median_ms  # noqa: E402


def measure(mode: str, seq: int, repeat: int) -> dict:
    job = resolve("llama7b", device="cuda", config="7b", dtype="bf16", options={"attention": mode})
    prog, s = job.program, job.settings
    module = prog.build(s)
    scalars = prog.scalars(s, prog.shape(seq))
    graph = CompiledProgram.get(module, target=s.target).build_graph(scalars)
    inputs = prog.inputs(s, prog.shape(seq), "cuda", seed=seq)
    ref = prog.reference(s, prog.shape(seq), inputs)["y"]
    fn = module.entry_function
    row = {"mode": mode, "seq": seq, "tasks": graph.tasks}
    for name in ("waves", "list", "levels"):
        tensors = allocate(fn, tensor_shapes(fn, scalars), inputs, "cuda")
        backend = get_backend("triton", "cuda", shipped=prog.schedules)  # as pto run: the shipped schedules
        ex = WaveExecutor(backend, tensors) if name == "waves" else PersistentExecutor(backend, tensors, order=name)
        ex.run(graph)
        torch.cuda.synchronize()
        row[f"{name}_rel_err"] = rel_err(tensors["y"], ref)
        g = ex.capture()
        row[f"{name}_ms"] = round(median_ms(g.replay, repeat, warmup=3), 4)
        ex.check()
        if name != "waves":
            row[f"{name}_gap_us"] = ex.report().get("item_gap_us")
        del g, ex, tensors
        torch.cuda.empty_cache()
    graph.close()
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
