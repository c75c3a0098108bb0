"""Benchmark one LLaMA-7B decoder layer on the GPU: pto against PyTorch eager and torch.compile.

In one run, on the same inputs (bf16, causal by default): our layer (batched Triton launches,
replayed as one CUDA graph), the PyTorch reference layer eagerly (cuBLAS + SDPA) and the same
reference under torch.compile. Prints ms, TFLOP/s and the ratios, where our time goes (per
InCore function, launches, dispatch overhead), and writes everything as JSON.

    python bench/llama_layer.py --seq 1024,4096,8192,16384 --attention fused --json out.json
    python bench/llama_layer.py --check-modes          # rel_err of every attention mode

Timing: CUDA events around each replay, median of ``--repeat`` after warm-up; inputs are the
program's seeded random inputs (never zeros).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from pto.orchestration.llama.config import CONFIGS  # noqa: E402
from pto.orchestration.llama.reference import reference_layer  # noqa: E402

from pto.backends import get_backend  # noqa: E402
from pto.buffers import allocate, tensor_shapes  # noqa: E402
from pto.engine import rel_err  # noqa: E402
from pto.exec.waves import WaveExecutor  # noqa: E402
from pto.graph import CompiledProgram  # noqa: E402
from pto.programs import get  # noqa: E402
from pto.target import detect  # noqa: E402
from pto.timing import median_ms  # noqa: E402


def bench_seq(seq: int, attention: str, causal: bool, repeat: int, do_compile: bool, profile: bool) -> dict:
    prog = get("llama7b")
    opts = prog.settings(device="cuda", config="7b", dtype="bf16", causal=causal, attention=attention,
                         target=detect("cuda"))
    cfg = CONFIGS["7b"]
    flops = prog.flops(opts, seq)
    inputs = prog.inputs(opts, seq, "cuda", seed=seq)
    out = {"seq": seq, "attention": attention, "causal": causal, "gflop": round(flops / 1e9, 1)}

    # PyTorch eager and torch.compile of the same reference layer
    ref = reference_layer(inputs, cfg, causal)
    out["eager_ms"] = median_ms(lambda: reference_layer(inputs, cfg, causal), repeat, warmup=3)
    if do_compile:
        compiled = torch.compile(reference_layer)
        t0 = time.perf_counter()
        compiled(inputs, cfg, causal)
        torch.cuda.synchronize()
        out["compile_s"] = round(time.perf_counter() - t0, 1)
        out["torch_compile_ms"] = median_ms(lambda: compiled(inputs, cfg, causal), repeat, warmup=3)

    # ours
    t0 = time.perf_counter()
    module = prog.build(opts)
    cp = CompiledProgram.get(module)
    out["codegen_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    graph = cp.build_graph(prog.scalars(opts, seq))
    out.update(tasks=graph.tasks, edges=graph.edges, build_ms=round(graph.build_ms, 3))
    fn = module.entry_function
    tensors = allocate(fn, tensor_shapes(fn, prog.scalars(opts, seq)), inputs, "cuda")
    ex = WaveExecutor(get_backend("triton", "cuda", launch=prog.launch_defaults(opts)), tensors)
    t0 = time.perf_counter()
    stats = ex.run(graph)
    torch.cuda.synchronize()
    out["first_run_s"] = round(time.perf_counter() - t0, 2)  # includes Triton compilation
    out.update(waves=stats.waves, launches=stats.launches)
    out["rel_err"] = rel_err(tensors["y"], ref)
    graph.close()
    ex.replay()  # warm
    out["python_launch_ms"] = median_ms(ex.replay, max(3, repeat // 4), warmup=3)
    cg = ex.capture()
    out["ours_ms"] = median_ms(cg.replay, repeat, warmup=3)
    out["dispatch_share"] = round(max(0.0, 1 - out["ours_ms"] / out["python_launch_ms"]), 3)
    # the graph replays must keep computing the same output
    torch.cuda.synchronize()
    out["rel_err_after_replay"] = rel_err(tensors["y"], ref)
    if profile:
        out["profile_ms"] = {k: round(v, 3) for k, v in ex.profile().items()}
    for k in ("ours_ms", "eager_ms", "torch_compile_ms"):
        if k in out:
            out[k.replace("_ms", "_tflops")] = round(flops / (out[k] * 1e-3) / 1e12, 1)
    out["vs_eager"] = round(out["eager_ms"] / out["ours_ms"], 3)
    if "torch_compile_ms" in out:
        out["vs_compile"] = round(out["torch_compile_ms"] / out["ours_ms"], 3)
    return out


def check_modes(seqs: list[int]) -> list[dict]:
    """rel_err of every attention mode through the full pto run pipeline (bf16, causal)."""
    from pto.engine import run

    rows = []
    for seq in seqs:
        for attention in ("fused", "pair", "split"):
            t0 = time.perf_counter()
            r = run("llama7b", seq=seq, config="7b", device="cuda", backend="triton", dtype="bf16",
                    attention=attention, causal=True, check=True)
            rows.append({"seq": seq, "attention": attention, "rel_err": r["rel_err"], "tasks": r["tasks"],
                         "launches": r["launches"], "waves": r["waves"], "exec_ms": r["exec_ms"],
                         "wall_s": round(time.perf_counter() - t0, 1)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", default="1024,4096,8192,16384")
    ap.add_argument("--attention", default="fused", choices=["fused", "pair", "split"])
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--check-modes", action="store_true", help="rel_err of all attention modes instead")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("llama_layer: needs a CUDA GPU", file=sys.stderr)
        return 2
    seqs = [int(s) for s in args.seq.split(",")]
    dev = torch.cuda.get_device_name(0)
    if args.check_modes:
        rows = check_modes(seqs)
        result = {"device": dev, "check_modes": rows}
    else:
        rows = []
        for seq in seqs:
            r = bench_seq(seq, args.attention, not args.no_causal, args.repeat, not args.no_compile,
                          not args.no_profile)
            rows.append(r)
            torch.cuda.empty_cache()
            print(json.dumps(r), flush=True)
        result = {"device": dev, "rows": rows}
        print(f"\n{dev}, bf16, {'bidirectional' if args.no_causal else 'causal'}, attention={args.attention}")
        print(f"{'seq':>6} {'ours ms':>9} {'eager ms':>9} {'compile ms':>10} {'ours TF/s':>9} "
              f"{'eager TF/s':>10} {'x eager':>8} {'x compile':>9} {'launches':>8} {'dispatch':>8} "
              f"{'rel_err':>9}")
        for r in rows:
            print(f"{r['seq']:>6} {r['ours_ms']:>9.3f} {r['eager_ms']:>9.3f} "
                  f"{r.get('torch_compile_ms', 0):>10.3f} "
                  f"{r['ours_tflops']:>9.1f} {r['eager_tflops']:>10.1f} {r['vs_eager']:>8.3f} "
                  f"{r.get('vs_compile', 0):>9.3f} {r['launches']:>8} {r['dispatch_share']:>8.3f} "
                  f"{r['rel_err']:>9.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
