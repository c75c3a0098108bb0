"""The kernels the shipped schedules are for: every InCore variant the LLaMA layer runs on a device
the schedules ship for (an H100, an H200) in bf16 (7B and the family's built-in configurations,
every attention mode, causal or not, whole and adaptive row tiles; and one rank of the 7B layer at
tp = 2, its collective tasks as the two kernels the Triton backend runs), by variant name and
kernel source hash."""

from __future__ import annotations

from pto.backends.triton import TritonBackend
from pto.ir.nodes import IncoreFunction
from pto.passes.collective import split_collective

H100 = "NVIDIA H100 80GB HBM3"
#: the devices the LLaMA layer ships schedules for (``orchestration/llama/schedules/<device key>``),
#: by driver name, and the target pto builds for there
SHIPPED = {H100: "cuda_h100", "NVIDIA H200": "cuda_h200"}


def family_kernels(backend: TritonBackend, target_name: str = "cuda_h100") -> dict[tuple[str, str], IncoreFunction]:
    """``(variant name, schedule digest) -> function`` of every variant the family runs on the
    target ``target_name`` (the digest the schedule database keys entries by: the source without
    the PDL prologue and the tensor-descriptor loads, which a GPU's backend adds)."""
    from pto.machine.target import get as target
    from pto.programs import get
    from pto.runtime.graph import CompiledProgram

    prog = get("llama7b")
    out: dict[tuple[str, str], IncoreFunction] = {}
    for config in ("7b", "llama2-7b", "llama3-8b", "mistral-7b"):
        for mode in ("fused", "pair", "split"):
            for causal in (True, False) if config != "mistral-7b" else (True,):  # a window is causal
                # the fused layer's row tiles: whole (the GPU default) and adaptive (residual tiles)
                for rows in ("whole", "adaptive") if mode == "fused" else ("adaptive",):
                    s = prog.settings(device="cuda", config=config, dtype="bf16", target=target(target_name),
                                      attention=mode, causal=causal, row_tiles=rows)
                    for v in CompiledProgram.get(prog.build(s), target=s.target).variants:
                        out[(v.func.variant_name, backend.kernel(v.func).schedule_digest)] = v.func
    for config in ("7b", "llama3-8b"):  # the norms folded into the projections (--fuse-norm-rope)
        s = prog.settings(device="cuda", config=config, dtype="bf16", target=target(target_name), fuse_norm_rope=True)
        for v in CompiledProgram.get(prog.build(s), target=s.target).variants:
            out[(v.func.variant_name, backend.kernel(v.func).schedule_digest)] = v.func
    for reduce in ("storage", "f32"):  # the sum in bf16 (the default) or f32: two first parts
        s = prog.settings(device="cuda", config="7b", dtype="bf16", target=target(target_name), tp=2,
                          allreduce_dtype=reduce)
        for v in CompiledProgram.get(prog.build(s), target=s.target).variants:
            split = split_collective(v.func)
            for f in (split.pre, split.post) if split is not None else (v.func,):
                out[(f.variant_name, backend.kernel(f).schedule_digest)] = f
    return out
