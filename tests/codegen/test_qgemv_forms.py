"""bench/qgemv_forms.py's kernel texts: the Q4_K gate/up with x prequantized and the loop forms
of every grouped type, made from the renderer's own text (the probe fails loudly where the
rendered names move; these tests say so on the CPU, before a GPU call is spent on it)."""

import ast
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import qgemv_forms  # noqa: E402  (bench/ is not a package)
import qgemv_sass  # noqa: E402


def _rendered(tmp_path, spec: str) -> str:
    (job,) = [j for j in qgemv_sass.jobs(spec, "auto", "default", tmp_path, pdl="late") if j["kernel"] == "gate_up"]
    return Path(job["path"]).read_text()


def _function(src: str, name: str) -> str:
    tree = ast.parse(src)
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return ast.get_source_segment(src, fn)


def test_the_prequantized_form_loads_x_and_leaves_its_rounding_and_the_norm_out(tmp_path):
    src = qgemv_forms.prequantized(_rendered(tmp_path, "q4_k/q6_k"))
    helper = _function(src, "_pre_dot_q4_k")
    # x's 16 words a group, its scales and sums loaded; its rounding and packing gone
    assert "tl.load(X + _v1 * 16 + lane)" in helper and helper.count("tl.load(X.to(") == 2
    assert "_pto_pack2" not in helper and "12582912.0" not in helper
    assert all(f"    {w} = " in helper for w in qgemv_forms._WORDS)
    body = _function(src, "d_gemv_norm_swiglu_tile__R1")
    assert body.count("_pre_dot_q4_k(") == 2 and "_pto_dqx16_dot_q4_k" not in body
    assert "rsqrt" not in body and "t_xt" not in body  # (the row factor is loaded)


@pytest.mark.parametrize("spec", ["q4_k/q6_k", "q8_0", "fp8"])
@pytest.mark.parametrize("ahead", [False, True])
def test_the_loop_form_takes_the_rendered_loads_and_dots_and_strides_over_the_blocks(tmp_path, spec, ahead):
    rendered = _rendered(tmp_path, spec)
    src = qgemv_forms._loop_source(rendered, ahead)
    body = _function(src, "d_gemv_norm_swiglu_tile__R1")
    load = next(n for n in ("q4_k", "q8_0", "fp8") if spec.startswith(n))
    # x normalized once, before the loop; each block's two matrices loaded and dotted in it
    before, loop = body.split("    for it in tl.range(0, NIT, num_stages=STAGES):")
    assert "tl.math.rsqrt" in before and "t_a32 =" in before
    assert loop.count(f"_pto_dqg_load_{load}(") == 2 and loop.count("t_a32, 4, 4096)") == 2
    assert before.count(f"_pto_dqg_load_{load}(") == (2 if ahead else 0)
    assert ("jn = tl.minimum(jj + NPROG, NIT * NPROG - 1)" in loop) == ahead
    assert "jj = i_j + it * NPROG" in loop and "tl.store(P_y + _c16, t_gb)" in loop
    # the rendered helpers kept as they are
    assert _function(src, f"_pto_dqg_load_{load}") == _function(rendered, f"_pto_dqg_load_{load}")


def test_a_rendered_kernel_without_the_expected_dot_is_refused():
    with pytest.raises(SystemExit, match="loads or dots"):
        qgemv_forms._loop_source("@triton.jit\ndef d_x():\n    pass\n", False)
    with pytest.raises(SystemExit, match="_pto_dqx16_dot_q4_k"):
        qgemv_forms.prequantized("@triton.jit\ndef d_x():\n    pass\n")


def test_the_sass_jobs_compile_the_down_projection_at_the_steps_contraction(tmp_path):
    """bench/qgemv_sass.py compiles the down projection (``proj``) specialized to the step's call,
    K the FFN's width, so that its warps and K loop are the step's; the others contract over the
    hidden size."""
    from pto.orchestration.model.program import CONFIGS

    layer = CONFIGS["llama3-8b"].layer
    jobs = {j["kernel"]: j for j in qgemv_sass.jobs("q4_k/q6_k", "auto", "default", tmp_path)}
    assert jobs["proj"]["K"] == layer.ffn and jobs["proj"]["K"] // jobs["proj"]["bk"] == 7
    assert all(jobs[k]["K"] == layer.hidden for k in ("qkv", "gate_up", "proj_o"))


@pytest.mark.parametrize("spec", ["q4_0", "q8_0"])
def test_the_sass_jobs_loop_over_the_blocks_as_the_backend_would(tmp_path, spec):
    """``--persistent auto``: the kernels the backend's default policy loops over their blocks
    (the 4-bit gate/up GEMV), compiled at BLOCK_MAXNREG registers, the others as the plain grid;
    ``blocks``: every kernel; none by default."""
    from pto.codegen.triton.common import BLOCK_MAXNREG

    def looped(persistent: str) -> dict:
        return {j["kernel"]: ("for _b in tl.range" in Path(j["path"]).read_text(), j["options"].get("maxnreg"))
                for j in qgemv_sass.jobs(spec, "auto", "default", tmp_path, pdl="late", persistent=persistent)}

    auto, every, plain = looped("auto"), looped("blocks"), looped("")
    assert auto["gate_up"] == ((True, BLOCK_MAXNREG) if spec == "q4_0" else (False, None))
    # SmolLM2's gate/up: 384 blocks, fewer than two a program of an H200's 528
    smol = qgemv_sass.jobs(spec, "auto", "default", tmp_path, persistent="auto", config="smollm2-135m")
    assert not any("for _b in tl.range" in Path(j["path"]).read_text() for j in smol)
    assert all(not loop for k, (loop, _) in auto.items() if k != "gate_up")
    assert all(loop for loop, _ in every.values()) and not any(loop for loop, _ in plain.values())

