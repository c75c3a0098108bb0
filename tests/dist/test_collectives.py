"""The choice of a sum's algorithm (pto.collectives): by size where symmetric memory runs, the
process group's where it does not (the CPU, gloo), forced by PTO_COLLECTIVES, and the one-line
errors of what cannot be. The sums themselves over gloo: tests/dist/test_tp_ranks.py; over NCCL
and symmetric memory on two GPUs: tests/gpu/test_tp_gpu.py."""

from __future__ import annotations

import pytest
import torch

from pto import collectives, dist
from pto.collectives import GROUP, ONE_SHOT, TWO_SHOT, Limits, choose
from pto.errors import UsageError

LIMITS = Limits(one_shot=1024, two_shot=8192)


@pytest.mark.parametrize("nbytes,how,want", [
    (16, "auto", ONE_SHOT), (1024, "auto", ONE_SHOT), (1040, "auto", TWO_SHOT), (8192, "auto", TWO_SHOT),
    (8208, "auto", GROUP), (1 << 30, "auto", GROUP),
    (8208, "symm", TWO_SHOT), (1 << 30, "symm", TWO_SHOT), (16, "symm", ONE_SHOT),
    (16, "group", GROUP), (1 << 30, "group", GROUP), (16, "evaluator", GROUP), (0, "auto", GROUP)])
def test_symmetric_memory_takes_the_small_sums_where_it_runs(nbytes, how, want):
    assert choose(nbytes, symmetric=True, aligned=True, how=how, bounds=LIMITS) == want


@pytest.mark.parametrize("how", ["auto", "symm"])
def test_without_symmetric_memory_or_alignment_every_sum_is_the_process_groups(how):
    for n in (16, 4096, 1 << 20, 1 << 30):
        assert choose(n, symmetric=False, aligned=True, how=how, bounds=LIMITS) == GROUP
        assert choose(n, symmetric=True, aligned=False, how=how, bounds=LIMITS) == GROUP


def test_alignment_is_sixteen_bytes_of_size_and_offset():
    assert collectives.aligned(32, 0) and collectives.aligned(16, 48)
    assert not collectives.aligned(24, 0) and not collectives.aligned(32, 8)


def test_the_modes_and_the_limits_from_the_environment(monkeypatch):
    assert collectives.mode() == "auto" and collectives.limits() == collectives.DEFAULT_LIMITS
    monkeypatch.setenv("PTO_COLLECTIVES", "native")  # the former name of auto
    assert collectives.mode() == "auto"
    for m in collectives.MODES:
        monkeypatch.setenv("PTO_COLLECTIVES", m)
        assert collectives.mode() == m
    monkeypatch.setenv("PTO_COLLECTIVES", "nccl2")
    with pytest.raises(UsageError, match="^PTO_COLLECTIVES='nccl2': expected one of auto, group, symm, evaluator$"):
        collectives.mode()
    monkeypatch.setenv("PTO_COLLECTIVES", "auto")
    monkeypatch.setenv("PTO_ONE_SHOT_MAX", "4096")
    monkeypatch.setenv("PTO_TWO_SHOT_MAX", "0")
    assert collectives.limits() == Limits(4096, 0)
    assert choose(8192, True, True) == GROUP and choose(4096, True, True) == ONE_SHOT
    monkeypatch.setenv("PTO_TWO_SHOT_MAX", "1M")
    with pytest.raises(UsageError, match=r"^PTO_TWO_SHOT_MAX='1M': expected a number of bytes \(0 or more\)$"):
        collectives.check()


def test_on_the_cpu_symmetric_memory_says_why_not():
    """No process group, and this machine (a CPU, or a torch without the ops): unusable, with
    the reason ``pto info`` prints."""
    assert not collectives.symmetric_memory().usable and collectives.symmetric_memory().why == "no process group"
    here = collectives.machine()
    if not torch.cuda.is_available():
        assert not here.usable and here.why == "no CUDA GPU"
    info = collectives.info()
    assert info["symmetric_memory"] == here.usable and info["symmetric_memory_why"] == here.why
    assert info["mode"] == "auto" and info["multicast"] is False and info["gloo"]


def test_a_one_rank_group_sums_nothing_and_copies_a_separate_result(tmp_path):
    """With one rank every algorithm leaves the buffer (one-shot's separate result a copy), and
    gloo's group is never symmetric memory's."""
    torch.distributed.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'store'}")
    try:
        a = collectives.symmetric_memory()
        assert not a.usable and a.why == "one rank: nothing to sum"
        send, recv = torch.arange(8.0), torch.zeros(8)
        for how in collectives.ALGORITHMS:
            recv.zero_()
            out = collectives.all_reduce(send, send if how != ONE_SHOT else recv, how)
            assert torch.equal(out, torch.arange(8.0)) and torch.equal(send, torch.arange(8.0))
        assert dist.counters()["calls"] == 0  # nothing was sent
        dist.shutdown()  # forgets the decision with the group
        assert collectives._DECIDED == {} and not dist.initialized()
    finally:
        if dist.initialized():
            torch.distributed.destroy_process_group()
        if collectives._forget in dist._AT_SHUTDOWN:
            dist._AT_SHUTDOWN.remove(collectives._forget)


@pytest.mark.slow
def test_forcing_symmetric_memory_where_it_cannot_run_is_one_line_before_any_work():
    """PTO_COLLECTIVES=symm over two gloo ranks on the CPU: every rank refuses, naming why,
    before building anything."""
    from tests.dist import driver

    r = driver.launch(2, "-m", "pto.cli", "run", "model", "--tp", "2", "--device", "cpu",
                      env={"PTO_COLLECTIVES": "symm"})
    errors = [line for line in r.stderr.splitlines() if line.startswith("pto: error")]
    assert r.returncode != 0 and r.stdout == "", r.stderr[-2000:]
    want = ("pto: error: rank {}: PTO_COLLECTIVES=symm: symmetric memory cannot run here (the process group is gloo, "
            "it needs NCCL on CUDA GPUs); unset it or give auto or group")
    assert sorted(errors) == [want.format(0), want.format(1)], errors
