"""bench/smoke.py --shard K/N: the GPU smoke check split over N device calls. The N shards'
jobs are the whole check's, each once, in its order; a shard that is not K/N with 1 <= K <= N is
one line naming what was written. The schedules the matrix runs under, by device."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_SMOKE = Path(__file__).resolve().parents[2] / "bench" / "smoke.py"
_spec = importlib.util.spec_from_file_location("smoke_bench", _SMOKE)
smoke = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = smoke  # (its dataclasses look their module up)
_spec.loader.exec_module(smoke)


def _jobs(capsys, *args: str) -> list[str]:
    assert smoke.main(["--list", *args]) == 0
    return capsys.readouterr().out.splitlines()


def test_the_shards_are_the_whole_check_each_job_once(capsys):
    whole = _jobs(capsys)
    assert len(whole) > 10 and len(set(whole)) == len(whole)
    for n in (2, 3):
        shards = [_jobs(capsys, "--shard", f"{k}/{n}") for k in range(1, n + 1)]
        assert all(shards) and sorted(j for s in shards for j in s) == sorted(whole)
        assert all(s == [j for j in whole if j in s] for s in shards)  # each in the whole check's order


@pytest.mark.parametrize("bad", ["3/2", "0/2", "1", "a/b"])
def test_a_shard_that_is_not_k_of_n_is_one_line(bad):
    with pytest.raises(SystemExit, match=rf"^smoke: --shard {bad}: K/N, the K-th of N parts \(1 <= K <= N\)$"):
        smoke.main(["--list", "--shard", bad])


def test_the_h100s_schedules_run_apart_only_where_the_device_does_not_run_them_already():
    h100 = {"PTO_SCHEDULES": smoke.H100}
    assert "h100" not in smoke.schedule_sets(smoke.H100) and "h100" not in smoke.schedule_sets("")
    # an H200 runs the H100's where its own folder has no entry (KIN), which its "device" jobs check
    assert smoke.schedule_sets("NVIDIA H200") == {"device": {}, "none": {"PTO_SCHEDULES": "none"}}
    assert smoke.schedule_sets("NVIDIA A100-SXM4-80GB")["h100"] == h100
