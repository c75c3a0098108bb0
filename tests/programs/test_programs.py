"""softmax and bgemm with the reference interpreter against torch, including sizes that are not
multiples of the tiles (residual tiles), for f32 and the half types."""

from __future__ import annotations

import pytest

from pto.engine import rel_err
from pto.interp.orchestration import run_program
from pto.ir.dtypes import DType
from pto.programs import get


@pytest.mark.parametrize("name", ["softmax", "bgemm"])
@pytest.mark.parametrize("seq", [1, 31, 32, 33, 100])
def test_program_f32(name, seq):
    prog = get(name)
    opts = prog.settings()
    m = prog.build(opts)
    inputs = prog.inputs(opts, prog.shape(seq), "cpu", seed=seq)
    res = run_program(m, inputs, prog.scalars(opts, prog.shape(seq)))
    for k, ref in prog.reference(opts, prog.shape(seq), inputs).items():
        assert rel_err(res.tensors[k], ref) <= 1e-5


@pytest.mark.parametrize("name", ["softmax", "bgemm"])
@pytest.mark.parametrize("dtype,tol", [(DType.BF16, 1e-2), (DType.F16, 2e-3)])
def test_program_half(name, dtype, tol):
    prog = get(name)
    opts = prog.settings(dtype=dtype)
    m = prog.build(opts)
    inputs = prog.inputs(opts, prog.shape(45), "cpu", seed=3)
    res = run_program(m, inputs, prog.scalars(opts, prog.shape(45)))
    for k, ref in prog.reference(opts, prog.shape(45), inputs).items():
        assert rel_err(res.tensors[k], ref) <= tol


def test_task_count_is_number_of_calls():
    prog = get("bgemm")
    opts = prog.settings()
    m = prog.build(opts)
    res = run_program(m, prog.inputs(opts, prog.shape(70), "cpu"), prog.scalars(opts, prog.shape(70)))
    # batch 2 x ceil(70/32)=3 row tiles x ceil(80/64)=2 column tiles
    assert res.tasks == 2 * 3 * 2


def test_a_source_checkout_registers_the_same_programs(monkeypatch):
    """Not installed (scripts run from the tree, the GPU machine): pto's entry points come from
    its pyproject.toml, the same declarations an install registers."""
    from importlib.metadata import entry_points

    import pto.programs as registry
    from pto import plugins

    installed = {ep.name: ep.value for ep in entry_points(group=registry.GROUP)
                 if ep.dist is not None and ep.dist.name == plugins.DISTRIBUTION}
    from_tree = {ep.name: ep.value for ep in plugins.checkout_entry_points(registry.GROUP)}
    assert from_tree == installed  # the project's own
    monkeypatch.setattr(plugins, "_installed", lambda group: [])  # nothing installed
    monkeypatch.setattr(registry, "_LOADED", {})
    assert registry.names() == sorted(from_tree) and registry.get("softmax").name == "softmax"
