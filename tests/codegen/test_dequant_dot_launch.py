"""The launch rule for the decode step's tensor-core products of dequantized weight tiles
(``dequant_dot_launch`` in pto/codegen/triton/kernel.py): at a few sequences, a GGUF block
format's gate/up (two products a K step) and LM head (a wide tile a step) run unpipelined at no
more than four warps, in the steps of the shapes it was measured on; every other kernel, fp8's,
a narrow model's short loops and the one-sequence GEMVs keep the heuristics'."""

from __future__ import annotations

from dataclasses import fields

import pytest

pytest.importorskip("triton")

from pto.orchestration.model.decode import functions  # noqa: E402
from pto.orchestration.model.program import CONFIGS, tiling_for  # noqa: E402
from pto.orchestration.model.quantized import WeightTypes, for_weights  # noqa: E402

from pto.codegen.triton import render  # noqa: E402
from pto.codegen.triton.kernel import launch_params  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType, dtype_of  # noqa: E402
from pto.machine.target import get  # noqa: E402

GEMVS = ("qkv", "proj", "proj_o", "gate_up", "lm")


def _launches(config: str, spec: str, batch: int) -> dict[str, tuple[dict, dict]]:
    """Per GEMV of the step (``spec``: the layers' type / the head's): the launch it renders with
    and the heuristics' (:func:`launch_params`)."""
    layers, _, head = spec.partition("/")
    kinds = {k: dtype_of(layers) for k in ("w_qkv", "wo", "wg", "wu", "wd")}
    wt = WeightTypes(tuple(sorted({**kinds, "lm_head": dtype_of(head or layers)}.items())))
    cfg = CONFIGS[config]
    fns = functions(cfg, DType.BF16, get("cuda_h100"), for_weights(tiling_for(cfg), wt, batch), batch, wtypes=wt)
    out = {}
    for f in fields(fns):
        fn = getattr(fns, f.name)
        if f.name in GEMVS and fn is not None:
            fn = specialize(fn, {"K": cfg.layer.ffn, "N": cfg.layer.hidden} if f.name == "proj" else None)
            out[f.name] = (render(fn).launch, launch_params(fn))
    return out


@pytest.mark.parametrize("config,spec", [("llama3-8b", "q4_k/q6_k"), ("llama3-8b", "q8_0"),
                                         ("llama3.2-1b", "q4_k/q6_k")])
def test_a_block_formats_gate_up_and_head_at_eight_sequences_run_unpipelined(config, spec):
    got = _launches(config, spec, 8)
    for name in ("gate_up", "lm"):
        launch, heuristics = got[name]
        assert heuristics["num_stages"] == 3  # (what the rule changes: the K loop's pipeline)
        assert launch["num_stages"] == 1 and launch["num_warps"] == min(4, heuristics["num_warps"]), (name, launch)
    # the head's tile is wide enough that the heuristics give it eight warps; the rule four
    assert got["lm"][1]["num_warps"] == 8 and got["lm"][0]["num_warps"] == 4
    for name in ("qkv", "proj", "proj_o"):  # one narrow product a step: pipelined, as measured faster
        launch, heuristics = got[name]
        assert launch == heuristics, name


@pytest.mark.parametrize("config,spec,batch", [("llama3-8b", "fp8", 8), ("llama3-8b", "q4_k/q6_k", 1),
                                               ("smollm2-135m", "q4_1/q8_0", 8)])
def test_fp8_one_sequence_and_short_loops_keep_the_heuristics(config, spec, batch):
    """fp8's tiles are a conversion (unpipelined, its gate/up was 8% slower); one sequence's GEMVs
    read by groups (their own warps rule); SmolLM2's gate/up loops over 576 columns in fewer than
    DEQ_TRIPS steps (slower unpipelined). Its head's 576 columns are nine steps of 64: the rule's."""
    got = _launches(config, spec, batch)
    for name, (launch, heuristics) in got.items():
        if config == "smollm2-135m" and name == "lm":
            assert launch["num_stages"] == 1, launch
            continue
        if batch == 1:  # (the grouped GEMVs' warps are their own rule's; the stages the heuristics')
            assert launch["num_stages"] == heuristics["num_stages"], name
            continue
        assert launch == heuristics, (name, launch)
