"""The megakernel's forms that leave its GEMV branches fewer registers (issue 45; docs/PERF.md,
"Thirty-seventh session": a branch's registers in the megakernel are about twice its wave
kernel's): the next item's descriptor loaded after the release (``PTO_MK_AHEAD=after``) and each
branch a device function of its own (``PTO_MK_CALLS=noinline``). Under the interpreter each
gives the wave executor's outputs bit for bit; compiled for sm_90 the branches are calls."""

from __future__ import annotations

import os
import re

import pytest

from pto.codegen.triton.megakernel import render_megakernel
from pto.errors import UsageError
from tests.exec.test_item_deps import persistent_against_waves

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")

AFTER_NOINLINE = {"PTO_MK_AHEAD": "after", "PTO_MK_CALLS": "noinline"}


def _in_loop_descriptor_loads(src: str) -> list[int]:
    """Where the kernel loads an item's descriptor inside its run loop (after ``while running``)."""
    loop = src.index("    while running:")
    return [m.start() for m in re.finditer(r"\b(d|dn) = items \+ 8 \* ", src) if m.start() > loop]


@pytest.mark.interpret
@needs_interp
@pytest.mark.parametrize("program,seq,options,shape,env", [
    ("model", None, {"config": "tiny"}, {"batch": 1, "cache": 128}, AFTER_NOINLINE),
    ("model", None, {"config": "tiny"}, {"batch": 2, "cache": 128},
     {**AFTER_NOINLINE, "PTO_MK_DEPS": "data", "PTO_MK_INLINE": "on"}),
    ("llama7b", 40, {"attention": "split"}, None, {"PTO_MK_AHEAD": "after", "PTO_DISPATCH": "queue"}),
], ids=["decode", "decode-inline-items", "split-queue"])
def test_the_register_saving_forms_give_the_waves_results(program, seq, options, shape, env, monkeypatch):
    """The persistent executor with the descriptor loaded after the release (static dispatch;
    with inline items and data dependencies; the queue) and the branches not inlined: the wave
    executor's outputs bit for bit, every item taken once; the kernel loads no descriptor ahead
    (no ``_n`` copies of it), loads the next one after the release's atomics, and declares each
    device function ``noinline`` where asked."""
    rp, _, _ = persistent_against_waves(monkeypatch, program, seq, options, shape, **env)
    try:
        ex = rp.executor
        ex.check()
        (kernel,) = ex.kernels
        src = kernel.rendered.source
        assert kernel.ahead == "after" and "i_next" not in src and "task_n" not in src
        assert min(_in_loop_descriptor_loads(src)) > src.rindex('sem="release")')
        devices = set(re.findall(r"ok, t0 = (\w+)\(", src))
        noinline = set(re.findall(r"@triton\.jit\(noinline=True\)\ndef (\w+)\(", src))
        if env.get("PTO_MK_CALLS") == "noinline":
            assert noinline == devices and len(devices) == len(kernel.plan.branches) > 1, (noinline, devices)
        else:
            assert not noinline
    finally:
        rp.close()


@pytest.mark.interpret
@needs_interp
def test_auto_calls_inline_where_nothing_is_compiled(monkeypatch):
    """``PTO_MK_CALLS=auto`` decides by the compiled kernel's spills; under the interpreter
    nothing is compiled, so the branches stay inlined and the step is the waves executor's bit
    for bit."""
    rp, _, _ = persistent_against_waves(monkeypatch, "model", None, {"config": "tiny"}, {"batch": 1, "cache": 128},
                                        PTO_MK_CALLS="auto")
    try:
        (kernel,) = rp.executor.kernels
        assert kernel.calls == "inline" and "noinline" not in kernel.rendered.source
    finally:
        rp.close()


def test_the_defaults_hold_the_descriptor_ahead_and_inline_the_branches(monkeypatch):
    """Unset, the kernel is today's: the next item's descriptor loaded before the item runs (as
    the ``_n`` names) and every branch inlined; anything but the settings' words is one line
    naming the variable."""
    from pto.backends.triton.megakernel import DEFAULT_AHEAD, DEFAULT_CALLS, resolve_ahead, resolve_calls
    from tests.exec.test_megakernel_design import _tiny_step_plan

    for name in ("PTO_MK_AHEAD", "PTO_MK_CALLS"):
        monkeypatch.delenv(name, raising=False)
    assert (DEFAULT_AHEAD, DEFAULT_CALLS) == ("held", "inline") == (resolve_ahead(None), resolve_calls(None))
    assert (resolve_ahead("after"), resolve_calls("noinline")) == ("after", "noinline")
    plan = _tiny_step_plan()
    held = render_megakernel(plan.branches, dispatch="static").source
    after = render_megakernel(plan.branches, dispatch="static", ahead="after", calls="noinline").source
    assert "i_next = i + 1" in held and "task_n = tl.load(dn)" in held and "noinline" not in held
    assert min(_in_loop_descriptor_loads(held)) < held.index("elif branch == 1:")
    assert min(_in_loop_descriptor_loads(after)) > after.rindex('sem="release")')
    monkeypatch.setenv("PTO_MK_AHEAD", "late")
    with pytest.raises(UsageError, match=r"^PTO_MK_AHEAD='late': the megakernel's look-ahead is held or after$"):
        resolve_ahead(None)
    monkeypatch.setenv("PTO_MK_CALLS", "call")
    with pytest.raises(UsageError, match=r"^PTO_MK_CALLS='call': the megakernel's branch calls is inline or "
                                         r"noinline or auto$"):
        resolve_calls(None)
    with pytest.raises(ValueError, match="unknown look-ahead 'late'"):
        render_megakernel(plan.branches, ahead="late")


@pytest.mark.sm90
@pytest.mark.slow
def test_branches_not_inlined_compile_for_sm90_as_calls(tmp_path):
    """The decode step's megakernel for an H100/H200 (no GPU needed): with ``noinline`` each branch
    is a ``.func`` of the PTX that the kernel calls, where the default inlines them all; with the
    descriptor after the release it compiles too."""
    from tests.exec.test_megakernel_design import _tiny_step_plan
    from tests.sm90 import compile_sm90, megakernel_job

    plan = _tiny_step_plan()
    opts = {"num_warps": 4, "num_stages": 1, "enable_fp_fusion": True}
    marks = [".func", "call.uni"]
    jobs = [{**megakernel_job(render_megakernel(plan.branches, dispatch="static", ahead=a, calls=c), opts),
             "count": marks} for a, c in (("held", "inline"), ("after", "noinline"))]
    inline, noinline = compile_sm90(jobs, tmp_path)
    assert inline["ok"] and noinline["ok"], (inline.get("error"), noinline.get("error"))
    assert inline["counts"]["call.uni"] == 0
    assert noinline["counts"]["call.uni"] >= len(plan.branches) and noinline["counts"][".func"] >= len(plan.branches)
