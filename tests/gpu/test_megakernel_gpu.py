"""The persistent megakernel on the GPU with the schedules pto ships (skipped without CUDA): the
7B layer at odd lengths crashed on an H100 with "out of resource: shared memory, Required:
294912" (the kernel took the deepest pipelining any branch asked for); it now fits by
construction, and a kernel that cannot fit falls back to the wave executor with one line."""

from __future__ import annotations

import logging

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

H100 = "NVIDIA H100 80GB HBM3"


def _runner(seq: int, tmp_path, attention: str = "fused"):
    from pto.backends.triton.schedules import ScheduleDB
    from pto.engine import Runner, resolve

    job = resolve("llama7b", device="cuda", backend="triton", executor="persistent", config="7b", dtype="bf16",
                  options={"attention": attention})
    runner = Runner(job, seq)
    # the schedules shipped for the H100, on whichever sm_90 GPU runs the test
    runner.executor.backend.schedules = ScheduleDB(H100, user_dir=tmp_path, shipped=job.program.schedules)
    return job, runner


@pytest.mark.parametrize("seq", [1537, 5555])
def test_shipped_h100_schedules_on_the_persistent_executor(seq, tmp_path):
    from pto.engine import rel_err

    job, runner = _runner(seq, tmp_path)
    try:
        inputs = job.program.inputs(job.settings, job.program.shape(seq), "cuda", seed=5)
        out = runner(inputs)["y"]
        assert runner.executor.name == "persistent"
        runner.executor.check()
        ref = job.program.reference(job.settings, job.program.shape(seq), inputs)["y"]
        assert rel_err(out, ref) <= 2e-2
        props = torch.cuda.get_device_properties(0)
        rep = runner.executor.report()  # (one kernel, or a kernel a segment of a split plan)
        assert max(s["shared"] for s in rep.get("segments", [rep])) <= props.shared_memory_per_block_optin
    finally:
        runner.close()


def test_a_kernel_that_cannot_fit_falls_back_to_waves(tmp_path, caplog):
    from pto.backends.triton import MegakernelSettings
    from pto.engine import rel_err

    job, runner = _runner(777, tmp_path)
    runner.executor.settings = MegakernelSettings(shared_limit=1024)  # no branch of the 7B layer fits 1 KiB
    try:
        inputs = job.program.inputs(job.settings, job.program.shape(777), "cuda", seed=6)
        with caplog.at_level(logging.WARNING, logger="pto.exec"):
            out = runner(inputs)["y"]
        assert runner.executor.name == "waves"
        (line,) = [r.getMessage() for r in caplog.records if r.name == "pto.exec"]
        assert "shared memory" in line and "(the device allows 1,024)" in line and "--executor waves" in line
        ref = job.program.reference(job.settings, job.program.shape(777), inputs)["y"]
        assert rel_err(out, ref) <= 2e-2
    finally:
        runner.close()


def test_a_schedule_too_deep_for_a_specialization_is_lowered(tmp_path):
    """A launch setting whose pipelining does not fit (8 stages of the 7B GEMMs' tiles) runs
    with the deepest that fits, per launch: the masked path of residual tiles may need more than
    the full tiles the schedule was measured on."""
    from pto.engine import Runner, rel_err, resolve

    job = resolve("llama7b", device="cuda", backend="triton", executor="waves", config="7b", dtype="bf16")
    runner = Runner(job, 1537)
    runner.executor.backend.launch_overrides["matmul_tile"] = {"num_stages": 8}
    try:
        inputs = job.program.inputs(job.settings, job.program.shape(1537), "cuda", seed=7)
        out = runner(inputs)["y"]
        assert rel_err(out, job.program.reference(job.settings, job.program.shape(1537), inputs)["y"]) <= 2e-2
    finally:
        runner.close()


def test_a_kernel_too_big_for_shared_memory_is_one_error_naming_it():
    """Operands of one dot that no pipelining depth fits: one ResourceError naming the kernel,
    the resource, the settings and where they came from, before any launch."""
    from pto import InCore, f32
    from pto.errors import ResourceError
    from tests.opkit import run_incore_triton

    k = InCore("big_dot")
    a, b, c = k.memref("a", f32), k.memref("b", f32), k.memref("c", f32)
    ta, tb, acc = k.tile("ta", 256, 128, f32), k.tile("tb", 128, 256, f32), k.tile("acc", 256, 256, f32)
    k.load(ta, a, 0, 0)
    k.load(tb, b, 0, 0)
    k.matmul(acc, ta, tb)
    k.store(c, 0, 0, acc)
    fn = k.build()
    x, y = torch.randn(256, 128, device="cuda"), torch.randn(128, 256, device="cuda")
    out = torch.zeros(256, 256, device="cuda")
    with pytest.raises(ResourceError, match=r"^`big_dot` \(the heuristics\): needs [\d,]+ bytes of shared memory "
                                            r"with num_warps=\d+, num_stages=1 \(the device allows [\d,]+\)$"):
        run_incore_triton(fn, {"a": (x, 0, 0, 256, 128), "b": (y, 0, 0, 128, 256), "c": (out, 0, 0, 256, 256)})


def test_traced_items_name_their_program_and_multiprocessor():
    """A traced run's records unpack the kernel's packing: every program within the launch's,
    every multiprocessor within the GPU's, each program on one multiprocessor for the launch (a
    resident program does not move), and the programs spread over several."""
    from pto.engine import Runner, resolve

    job = resolve("softmax", device="cuda", backend="triton", executor="persistent", dtype="bf16")
    runner = Runner(job, 65536, record=True)
    try:
        runner(job.program.inputs(job.settings, job.program.shape(65536), "cuda"))
        recs = runner.stats.records
    finally:
        runner.close()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert recs and all(0 <= r.sm < sms and 0 <= r.program < 2**20 for r in recs)
    where = {}
    for r in recs:
        assert where.setdefault((r.segment, r.program), r.sm) == r.sm
    assert len(set(where.values())) > 1
