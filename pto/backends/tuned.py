"""Launch parameters measured best on a GPU architecture, per InCore function (the persistent
"schedule database" of seed 002, kept as a table in the source: each entry names the benchmark
run it came from; docs/PERF.md has the numbers).

The Triton backend applies them over the renderer's defaults and under user overrides.
"""

from __future__ import annotations

# arch ("sm90": compute capability 9.0) -> InCore function name -> launch parameters.
# sm90: bench/tune_kernels.py --seq 16384 on an H100 80GB HBM3, 2026-11-22 (docs/PERF.md).
TUNED: dict[str, dict[str, dict]] = {
    "sm90": {
        # 128 x 256 output blocks, K step 64, 3 stages, groups of 8 row tiles x every column block
        # (the activation panel stays in L2): 667-695 TFLOP/s; tasks-fastest order: 591-615
        "matmul_tile": {"num_warps": 8, "num_stages": 3, "GROUP": 8},
        "matmul_residual_tile": {"num_warps": 8, "num_stages": 3, "GROUP": 8},
        # two 128 x 128 accumulators (the register budget of one 128 x 256 block), grouped:
        # 588 TFLOP/s with 3 stages, 568 with 4; tasks-fastest order 536
        "matmul_swiglu_tile": {"num_warps": 8, "num_stages": 3, "GROUP": 8},
        # tq 128, tk 128, base-2 softmax: 501 TFLOP/s causal at 16K (tk 64: 476-487)
        "flash_fused": {"num_warps": 8, "num_stages": 3},
        "flash_fused_nc": {"num_warps": 8, "num_stages": 3},
    },
}


def arch_of(device) -> str | None:
    """``"sm90"`` for a compute capability 9.0 device, None off CUDA."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(dev)
    return f"sm{major}{minor}"


def tuned_launch(device) -> dict[str, dict]:
    return dict(TUNED.get(arch_of(device) or "", {}))
