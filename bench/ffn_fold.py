"""The FFN of a decode step in one level (issue 45): ``gemv_norm_swiglu_down_tile`` (gate, up,
SwiGLU and each program's share of the down projection added into the f32 residual with
``store_add``) against the two tasks the step runs today (``gemv_norm_swiglu_tile``, then
``gemv_residual_tile`` for the down projection), each task one kernel of the Triton backend,
timed as CUDA graphs of back-to-back launches (the two-task form: two launches a repetition, as
the wave executor's levels; random bf16 weights of the real shapes, one sequence; a GPU).

    python bench/ffn_fold.py [--configs smollm2-135m,llama3.2-1b,llama3-8b] [--fused 'bn=16,dn=256,rows=1;...']
        [--reps 50] [--json FILE]

A fused variant is ``bn`` (intermediate columns a program), ``bk`` (the gate/up K step, default
the whole hidden size up to 2048), ``dn`` (the down projection's outputs a step) and ``rows`` (1:
the down weight transposed once, ``[F, H]``, a program's share whole rows; 0: as stored, ``[H,
F]``, short strided runs). Each row: microseconds a repetition, the weights' bytes over that time
(GB/s) and the fused result's largest error against the two-task form's (f32 sums in another
order, bf16 residual in the two-task form).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from pto.incore.gemv import gemv_norm_swiglu_down_tile, gemv_norm_swiglu_tile, gemv_residual_tile  # noqa: E402
from pto.orchestration.model.program import CONFIGS, tiling_for_executor  # noqa: E402

from pto.backends.triton import TritonBackend  # noqa: E402
from pto.data.batch import TaskBatch  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType  # noqa: E402


def _graph_time(fns, reps: int) -> float:
    """Microseconds a repetition of ``fns`` (launches) replayed as one CUDA graph."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(reps):
                for f in fns:
                    f()
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1000 / reps)
    return best


def _launch(be: TritonBackend, fn, regions: dict):
    return be.prepare(TaskBatch.one(specialize(fn), regions, {}))


def run(name: str, variants: list[dict], reps: int) -> list[dict]:
    cfg = CONFIGS[name].layer
    H, F, eps, dt = cfg.hidden, cfg.ffn, cfg.eps, DType.BF16
    t = tiling_for_executor(CONFIGS[name], "waves")
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)

    x, gain, r = rnd(1, H), 1 + rnd(1, H, scale=0.1), rnd(1, H)
    wg, wu, wd = rnd(F, H, scale=H ** -0.5), rnd(F, H, scale=H ** -0.5), rnd(H, F, scale=F ** -0.5)
    wdt = wd.T.contiguous()
    be = TritonBackend("cuda")
    nbytes = 3 * H * F * 2
    h = torch.empty(1, F, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(1, H, dtype=torch.bfloat16, device="cuda")
    fbn, fbk = t.ffn_bn or t.bn, min(t.ffn_bk or t.bk, H)
    up = _launch(be, gemv_norm_swiglu_tile(dt, 1, H, F, fbn, fbk, eps),
                 {"x": (x, 0, 0, 1, H), "g": (gain, 0, 0, 1, H), "wg": (wg, 0, 0, F, H), "wu": (wu, 0, 0, F, H),
                  "y": (h, 0, 0, 1, F)})
    down = _launch(be, gemv_residual_tile(dt, 1, F, H, t.bn, min(t.bk, F)),
                   {"x": (h, 0, 0, 1, F), "w": (wd, 0, 0, H, F), "r": (r, 0, 0, 1, H), "y": (out, 0, 0, 1, H)})
    rows = [{"config": name, "form": f"two tasks (gate/up bn={fbn} bk={fbk}; down bn={t.bn} bk={min(t.bk, F)})",
             "us": _graph_time([up], reps) + 0.0}]
    rows[0]["gate_up_us"] = rows[0]["us"]
    rows[0]["down_us"] = _graph_time([down], reps)
    rows[0]["us"] = _graph_time([up, down], reps)
    up()
    down()
    torch.cuda.synchronize()
    ref = out.double()
    for v in variants:
        bn, dn, wrows = int(v.get("bn", 16)), int(v.get("dn", 256)), bool(int(v.get("rows", 1)))
        bk = int(v.get("bk", min(H, 2048)))
        y = torch.empty(1, H, dtype=torch.float32, device="cuda")
        w = wdt if wrows else wd
        fused = _launch(be, gemv_norm_swiglu_down_tile(dt, 1, H, F, bn, bk, dn, eps, wd_rows=wrows),
                        {"x": (x, 0, 0, 1, H), "g": (gain, 0, 0, 1, H), "wg": (wg, 0, 0, F, H),
                         "wu": (wu, 0, 0, F, H), "wd": (w, 0, 0, *w.shape), "y": (y, 0, 0, 1, H)})
        us = _graph_time([fused], reps)  # (y's sum grows with every replay: timing only)
        y.copy_(r.float())
        fused()
        torch.cuda.synchronize()
        err = float((y.double() - ref).abs().max() / ref.abs().max())
        rows.append({"config": name, "form": f"one task bn={bn} bk={bk} dn={dn} rows={int(wrows)}", "us": us,
                     "rel_err": err})
    for row in rows:
        row["GB/s"] = nbytes / row["us"] / 1e3
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="smollm2-135m,llama3.2-1b,llama3-8b")
    ap.add_argument("--fused", default="bn=16,dn=256,rows=1;bn=32,dn=128,rows=1;bn=64,dn=64,rows=0;bn=8,dn=512,rows=1")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/ffn_fold.py: needs a CUDA GPU")
    variants = [dict(kv.split("=") for kv in v.split(",")) for v in args.fused.split(";") if v]
    rows = []
    for name in args.configs.split(","):
        for row in run(name, variants, args.reps):
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(f"\n{'config':14s} {'form':58s} {'us':>8s} {'GB/s':>7s}")
    for row in rows:
        print(f"{row['config']:14s} {row['form']:58s} {row['us']:8.2f} {row['GB/s']:7.0f}"
              + (f"  err {row['rel_err']:.1e}" if "rel_err" in row else
                 f"  (gate/up {row['gate_up_us']:.2f}, down {row['down_us']:.2f})"))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
