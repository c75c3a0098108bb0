"""The launch rule for the decode step's tensor-core products of dequantized weight tiles
(``dequant_dot_launch`` in pto/codegen/triton/kernel.py): at a few sequences, a GGUF block
format's LM head (a wide tile a step), and with the tiles' scales loaded a value a unit its
gate/up (two products a K step), run unpipelined at no more than four warps, in the steps of the
shapes it was measured on; every other kernel, fp8's, a narrow model's short loops and the
one-sequence GEMVs keep the heuristics'."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from pto.codegen.triton.kernel import launch_params  # noqa: E402
from tests.codegen.tritonkit import step_kernels, temp_cache_dir  # noqa: E402,F401 (applies itself)

GEMVS = ("qkv", "proj", "proj_o", "gate_up", "lm")


def _launches(config: str, spec: str, batch: int, qscales: str = "") -> dict[str, tuple[dict, dict]]:
    """Per GEMV of the step: the launch it renders with and the heuristics' (:func:`launch_params`)."""
    return {name: (k.launch, launch_params(k.fn)) for name, k in step_kernels(config, spec, batch, qscales).items()
            if name in GEMVS}


@pytest.mark.parametrize("config,spec", [("llama3-8b", "q4_k/q6_k"), ("llama3-8b", "q8_0"),
                                         ("llama3.2-1b", "q4_k/q6_k")])
@pytest.mark.parametrize("qscales", ["", "units"])
def test_a_block_formats_head_at_eight_sequences_runs_unpipelined(config, spec, qscales):
    """The head always; gate/up only with the scales a value a unit (by groups it is pipelined,
    as measured faster)."""
    got = _launches(config, spec, 8, qscales)
    for name in ("gate_up", "lm") if qscales == "units" else ("lm",):
        launch, heuristics = got[name]
        assert heuristics["num_stages"] == 3  # (what the rule changes: the K loop's pipeline)
        assert launch["num_stages"] == 1 and launch["num_warps"] == min(4, heuristics["num_warps"]), (name, launch)
    # the head's tile is wide enough that the heuristics give it eight warps; the rule four
    assert got["lm"][1]["num_warps"] == 8 and got["lm"][0]["num_warps"] == 4
    for name in ("qkv", "proj", "proj_o") + (("gate_up",) if qscales != "units" else ()):
        # one narrow product a step, or the scales by groups: pipelined, as measured faster
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


def test_a_spec_names_the_layers_and_the_heads_types():
    """``WeightTypes.of_spec``: the stacked kinds of the first type, the head of the second (the
    first where none), the embedding dense; a name that is no type is one line."""
    from pto.orchestration.model.quantized import STACKED, WeightTypes

    from pto.errors import BuildError
    from pto.ir.dtypes import DType

    wt = WeightTypes.of_spec("q4_k/q6_k")
    assert {k: wt.get(k, DType.BF16) for k in STACKED} == dict.fromkeys(STACKED, DType.Q4_K)
    assert wt.get("lm_head", DType.BF16) is DType.Q6_K and wt.get("emb", DType.BF16) is DType.BF16
    assert WeightTypes.of_spec("q8_0").get("lm_head", DType.BF16) is DType.Q8_0
    with pytest.raises(BuildError, match="unknown dtype 'q9_9'"):
        WeightTypes.of_spec("q9_9")
