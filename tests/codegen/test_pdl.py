"""Programmatic dependent launch (``RenderOptions.pdl``): the batched kernel's prologue, its
digest, the launch keyword, and the PTX Triton makes of it for an H100 (compiled without a GPU).
On a GPU of compute capability 9.0 and later the backend takes the "auto" policy by default (every kernel
"late", or "chain" before a kernel that loads its inputs early: tests/codegen/test_pdl_early.py;
PTO_PDL=off|early|late|chain|auto; docs/PERF.md), so tests/gpu and bench/smoke.py run every batched kernel
with it."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from pto.incore.matmul import gemm_tile  # noqa: E402

from pto.backends.triton import TritonBackend, pdl_mode  # noqa: E402
from pto.backends.triton.launch import LaunchConfig, LaunchGroup, calls  # noqa: E402
from pto.codegen.triton import RenderOptions, render  # noqa: E402
from pto.errors import BuildError, UsageError  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType  # noqa: E402
from tests.sm90 import compile_sm90  # noqa: E402


def _gemm():
    return specialize(gemm_tile(DType.BF16, 64, 128, 64))


@pytest.mark.parametrize("mode", ["early", "late"])
def test_prologue_waits_before_any_access(mode):
    """With ``pdl`` the kernel waits before it calls the device function (its first load) and
    signals the next launch before ("early") or after ("late") it; the digest, which keys the
    schedule database, is the plain kernel's."""
    plain, pdl = render(_gemm()), render(_gemm(), RenderOptions(pdl=mode))
    assert not plain.pdl and pdl.pdl == mode
    assert "_gdc" not in plain.source
    body = pdl.source.split(f"def {pdl.name}(")[1]
    wait, call, signal = body.index("_gdc_wait()"), body.index("(tab + task *"), body.index("_gdc_launch_dependents()")
    assert wait < call
    assert (signal < wait) if mode == "early" else (signal > call)
    # schedules hold with PDL on or off; the loader's cache tells the two sources apart
    assert pdl.schedule_digest == plain.schedule_digest == plain.digest != pdl.digest
    with pytest.raises(BuildError, match="pdl='sometimes'"):
        render(_gemm(), RenderOptions(pdl="sometimes"))


def test_the_loader_keeps_both_sources_apart(monkeypatch, tmp_path):
    """A process that loads the plain kernel and then the PDL one (two backends, or a bench that
    switches) gets each its own function: a kernel launched with ``launch_pdl`` always waits."""
    from pto.backends.triton.loader import load_kernel

    monkeypatch.setenv("PTO_CACHE_DIR", str(tmp_path))
    plain, pdl = render(_gemm()), render(_gemm(), RenderOptions(pdl="late"))
    a, b = load_kernel(plain), load_kernel(pdl)
    assert a is not b
    assert all("_gdc_wait" in p.read_text() for p in tmp_path.rglob(f"{pdl.digest}.py"))
    assert any(tmp_path.rglob(f"{pdl.digest}.py")) and any(tmp_path.rglob(f"{plain.digest}.py"))
    assert not any("_gdc_wait" in p.read_text() for p in tmp_path.rglob(f"{plain.digest}.py"))


def test_a_schedule_cannot_switch_pdl(monkeypatch):
    """PDL is the backend's (a compiled kernel on sm_90, the launch keyword with it): a launch
    override or schedule entry that names it is refused, never rendered under the interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    be = TritonBackend("cpu", launch={"gemm_tile": {"pdl": "late"}})
    with pytest.raises(UsageError, match="unknown launch setting 'pdl'"):
        be.launch_config(_gemm())
    assert TritonBackend("cpu", pdl="off").options.pdl == ""


def test_a_gpu_backend_takes_its_mode_from_the_capability(monkeypatch):
    """A compiling backend (device cuda, no interpreter; the capability as a driver reports it):
    "auto" by default from 9.0 on (kernels rendered "late" unless a batch says otherwise), off
    below; asking for PDL below 9.0 is one error."""
    import torch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("PTO_PDL", raising=False)
    for cap, policy, mode in (((9, 0), "auto", "late"), ((8, 0), "", "")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=cap: c)
        be = TritonBackend("cuda")
        assert (be.pdl, be.options.pdl) == (policy, mode)
    with pytest.raises(UsageError, match="needs compute capability 9.0 or later; cuda has 8.0"):
        TritonBackend("cuda", pdl="early")


def test_launch_keyword_follows_the_kernel():
    """``launch_pdl`` only for a kernel rendered with the prologue, never for a plain one."""
    import torch

    group = [LaunchGroup(torch.zeros(1), (1, 1), {}, torch.zeros(1, 4, dtype=torch.int32))]
    assert "launch_pdl" not in calls(group, (), LaunchConfig())[0][2]
    assert calls(group, (), LaunchConfig(), pdl="late")[0][2]["launch_pdl"] is True


def test_interpreter_backend_refuses_pdl(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("PTO_PDL", "early")
    assert TritonBackend("cpu").options.pdl == ""  # auto: off where nothing is compiled
    with pytest.raises(UsageError, match="programmatic dependent launch"):
        TritonBackend("cpu", pdl="early")
    with pytest.raises(UsageError, match="pdl='yes'"):
        TritonBackend("cpu", pdl="yes")
    monkeypatch.setenv("PTO_PDL", "maybe")
    with pytest.raises(UsageError, match="PTO_PDL='maybe'"):
        TritonBackend("cpu")


def test_the_mode_follows_the_gpu_and_the_environment(monkeypatch):
    """"auto" by default from compute capability 9.0 on, where kernels are compiled; PTO_PDL
    chooses; a misspelt value is one error; ``pto info`` says which mode a GPU gets."""
    from pto.cli.commands.info import format_info, info

    monkeypatch.delenv("PTO_PDL", raising=False)
    assert [pdl_mode(c) for c in ((9, 0), (10, 0), (8, 9), None)] == ["auto", "auto", "", ""]
    assert pdl_mode((9, 0), compiles=False) == ""
    for env, mode in (("early", "early"), ("late", "late"), ("chain", "chain"), ("auto", "auto"), ("off", "")):
        monkeypatch.setenv("PTO_PDL", env)
        assert pdl_mode((9, 0)) == mode
    monkeypatch.setenv("PTO_PDL", "on")
    with pytest.raises(UsageError, match="PTO_PDL='on'"):
        pdl_mode((9, 0))
    monkeypatch.delenv("PTO_PDL")
    d = info("cpu")
    assert "pdl" not in d and "dependent launch" not in format_info(d)
    # the GPU branch of `pto info`, with an H100's description in place of a driver's
    import pto.cli.commands.info
    import pto.machine.target

    monkeypatch.setattr(pto.cli.commands.info, "detect", lambda dev: pto.machine.target.get("cuda_h100"))
    monkeypatch.setattr(pto.cli.commands.info, "resolve_device", lambda dev: "cuda")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("PTO_PERSISTENT", raising=False)
    gpu = info("auto")
    assert gpu["pdl"] == "auto"
    assert "programmatic dependent launch auto (PTO_PDL)" in format_info(gpu) and "PTO_PDL_LATE" not in format_info(gpu)
    monkeypatch.setenv("PTO_PDL_LATE", "gemv_residual_tile_o,gemv_residual_tile")
    assert ("programmatic dependent launch auto (PTO_PDL), nothing loaded before the wait by gemv_residual_tile, "
            "gemv_residual_tile_o (PTO_PDL_LATE)") in format_info(info("auto"))
    monkeypatch.delenv("PTO_PDL_LATE")
    assert gpu["tma"] == "on" and "tensor descriptors on (PTO_TMA)" in format_info(gpu)
    monkeypatch.delenv("PTO_QSCALES", raising=False)
    assert "the tiles' scales by groups (PTO_QSCALES)" in format_info(gpu)
    monkeypatch.setenv("PTO_QSCALES", "units")
    assert "the tiles' scales by units (PTO_QSCALES)" in format_info(info("auto"))
    monkeypatch.delenv("PTO_QSCALES")
    monkeypatch.delenv("PTO_K_AHEAD", raising=False)
    assert "their K steps loaded ahead auto (PTO_K_AHEAD)" in format_info(info("auto"))
    monkeypatch.setenv("PTO_K_AHEAD", "first")
    assert "their K steps loaded ahead first (PTO_K_AHEAD)" in format_info(info("auto"))
    monkeypatch.delenv("PTO_K_AHEAD")
    assert gpu["persistent"] == "auto" and "persistent tile loops auto (PTO_PERSISTENT" in format_info(gpu)
    monkeypatch.delenv("PTO_BLOCKS_FORMATS", raising=False)
    assert "the gate/up GEMVs of q4_0, q4_1, q4_k, q5_k weights loop" in format_info(gpu)
    monkeypatch.setenv("PTO_BLOCKS_FORMATS", "+q5_0")
    assert "the gate/up GEMVs of q4_0, q4_1, q4_k, q5_0, q5_k weights loop" in format_info(info("auto"))
    monkeypatch.setenv("PTO_PDL", "off")
    assert info("auto")["pdl"] == "off"
    monkeypatch.setenv("PTO_TMA", "off")
    assert info("auto")["tma"] == "off"
    monkeypatch.setenv("PTO_PERSISTENT", "off")
    assert info("auto")["persistent"] == "off"


@pytest.mark.sm90
@pytest.mark.slow
def test_pdl_kernel_compiles_for_sm90(tmp_path):
    """Triton turns the prologue into ``griddepcontrol`` instructions ahead of the first load."""
    kern = render(_gemm(), RenderOptions(pdl="late"))
    flags = {f"{w}_{p.name}": True for w in ("EVEN", "ALIGN") for p in kern.fn.memrefs}
    job = {"source": kern.source, "name": kern.name, "signature": kern.signature(), "aligned": True,
           "constexprs": {**flags, **{k: v for k, v in kern.launch.items() if k.isupper()}},
           "options": {**{k: v for k, v in kern.launch.items() if not k.isupper()}, "launch_pdl": True}}
    (res,) = compile_sm90([job], tmp_path)
    assert res["ok"], res.get("error")
    ptx = res["ptx"]
    assert "griddepcontrol.launch_dependents" in ptx and "griddepcontrol.wait" in ptx
    assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")
