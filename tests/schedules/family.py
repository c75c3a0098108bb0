"""The kernels the shipped schedules are for: every InCore variant the LLaMA layer runs on an H100
in bf16 (7B and the family's built-in configurations, every attention mode, causal or not, whole and
adaptive row tiles), by
variant name and kernel source hash."""

from __future__ import annotations

from pto.backends.triton import TritonBackend
from pto.ir.nodes import IncoreFunction

H100 = "NVIDIA H100 80GB HBM3"


def family_kernels(backend: TritonBackend) -> dict[tuple[str, str], IncoreFunction]:
    """``(variant name, kernel digest) -> function`` of every variant the family runs."""
    from pto.graph import CompiledProgram
    from pto.programs import get
    from pto.target import get as target

    prog = get("llama7b")
    out: dict[tuple[str, str], IncoreFunction] = {}
    for config in ("7b", "llama2-7b", "llama3-8b", "mistral-7b"):
        for mode in ("fused", "pair", "split"):
            for causal in (True, False) if config != "mistral-7b" else (True,):  # a window is causal
                # the fused layer's row tiles: whole (the GPU default) and adaptive (residual tiles)
                for rows in ("whole", "adaptive") if mode == "fused" else ("adaptive",):
                    s = prog.settings(device="cuda", config=config, dtype="bf16", target=target("cuda_h100"),
                                      attention=mode, causal=causal, row_tiles=rows)
                    for v in CompiledProgram.get(prog.build(s), target=s.target).variants:
                        out[(v.func.variant_name, backend.kernel(v.func).digest)] = v.func
    return out
