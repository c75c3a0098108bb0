"""What one accumulator would buy the FFN's gate/up projection with SwiGLU (issue 23): the layer's
``matmul_swiglu_tile`` (two 128 x 128 accumulators a program, one per projection) against
``matmul_tile`` over the two weights side by side (one 128 x 256 accumulator: what a gate/up
weight with interleaved columns runs), both through the Triton backend with the shipped H100
schedules and a few launch settings, cuBLAS over the same 4096 x 22016 product and torch's eager
SwiGLU; ``seq`` rows of LLaMA-7B's hidden 4096 and FFN 11008, bf16, the median of 10 launches.

    python3 bench/swiglu_probe.py [SEQ]     (default 16384)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from pto.incore.matmul import matmul_swiglu_tile, matmul_tile

from pto.backends.triton import TritonBackend
from pto.backends.triton.schedules import for_device
from pto.data.batch import RegionBatch, TaskBatch
from pto.exec.timing import median_ms
from pto.ir.analysis import specialize
from pto.ir.dtypes import DType

H, FD, TQ = 4096, 11008, 128
SHIPPED = (Path(__file__).resolve().parents[1] / "orchestration" / "llama" / "schedules",)
LAUNCHES = ({"num_warps": 8, "num_stages": 3, "GROUP": 8}, {"num_warps": 8, "num_stages": 3, "GROUP": 16},
            {"num_warps": 8, "num_stages": 4, "GROUP": 8})


def main() -> None:
    seq = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(seq, H, generator=g, device=dev).to(torch.bfloat16)
    wg, wu = ((torch.randn(H, FD, generator=g, device=dev) / 64).to(torch.bfloat16) for _ in range(2))
    wgu = torch.cat([wg, wu], 1).contiguous()
    n = seq // TQ
    r0, z = torch.arange(n, device=dev) * TQ, torch.zeros(n, dtype=torch.long, device=dev)

    def full(v):
        return torch.full((n,), v, device=dev, dtype=torch.long)

    def rb(t, per_row):
        return RegionBatch(t, r0 if per_row else z, z, full(TQ) if per_row else full(t.shape[0]), full(t.shape[1]))

    def run(fn, mems, launch):
        be = TritonBackend(dev, launch={fn.name: launch} if launch else None, schedules=for_device(str(dev), SHIPPED))
        go = be.prepare(TaskBatch(fn, mems, {}, n))
        go()
        return median_ms(go, 10, 2)

    flop = 2.0 * seq * H * 2 * FD

    def show(what, ms):
        print(f"{what}: {ms:.3f} ms {flop / ms / 1e9:.0f} TFLOP/s", flush=True)

    y = torch.empty(seq, FD, device=dev, dtype=torch.bfloat16)
    sw = specialize(matmul_swiglu_tile(DType.BF16, TQ, H, FD, 128, 64))
    for launch in (None, *LAUNCHES):  # None: the shipped schedule
        mems = {"x": rb(x, True), "wg": rb(wg, False), "wu": rb(wu, False), "y": rb(y, True)}
        show(f"matmul_swiglu_tile (two 128x128 accumulators) {launch}", run(sw, mems, launch))
    y2 = torch.empty(seq, 2 * FD, device=dev, dtype=torch.bfloat16)
    mm = specialize(matmul_tile(DType.BF16, TQ, H, 2 * FD, 256, 64))
    for launch in LAUNCHES:
        show(f"matmul_tile N={2 * FD} (one 128x256 accumulator) {launch}",
             run(mm, {"x": rb(x, True), "w": rb(wgu, False), "y": rb(y2, True)}, launch))
    show("cuBLAS x @ [wg wu]", median_ms(lambda: torch.mm(x, wgu), 10, 2))
    show("eager silu(x wg) * (x wu)", median_ms(lambda: F.silu(x @ wg) * (x @ wu), 10, 2))


if __name__ == "__main__":
    main()
