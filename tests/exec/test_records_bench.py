"""bench/records.py, the persistent executor's traced items saved on the GPU and studied off it:
a round trip through its file, and per task its items, programs, rounds, median item, span and
tail, against records whose schedule is known."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from pto.exec.base import ItemRecord

_spec = importlib.util.spec_from_file_location("records", Path(__file__).resolve().parents[2] / "bench" / "records.py")
records = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(records)


def test_rounds_and_tails_of_a_known_schedule(tmp_path):
    """Task 7 (variant f): program 0 runs two items back to back, program 1 one: two rounds on
    two programs, and program 1 waits the second item's length (the tail). Task 9 (variant g),
    after it on both programs, one item each: one round, the later end's difference its tail."""
    rng = np.random.default_rng(0)
    t0 = int(rng.integers(10**6, 10**9))  # (times are saved from the first start)
    recs = [ItemRecord(7, 0, 0, t0, t0 + 10, "f"), ItemRecord(7, 1, 1, t0 + 1, t0 + 11, "f"),
            ItemRecord(7, 2, 0, t0 + 10, t0 + 22, "f"),
            ItemRecord(9, 0, 0, t0 + 25, t0 + 30, "g", 1), ItemRecord(9, 1, 1, t0 + 25, t0 + 33, "g", 1)]
    path = str(tmp_path / "run.npz")
    records.save(path, recs, programs=2)
    items, funcs, programs = records.load(path)
    assert programs == 2 and funcs == ["f", "g"] and items.shape == (5, 7)
    assert items[:, 3].min() == 0 and items[:, 5].tolist() == [0, 0, 0, 1, 1]
    stats = records.task_stats(items)
    f, g = stats[7], stats[9]
    assert (f["items"], f["programs"], f["rounds"]) == (3, 2, 2)
    assert f["item_ns"] == 10 and f["span_ns"] == 22 and f["tail_ns"] == 22 - 11
    assert (g["items"], g["rounds"], g["span_ns"], g["tail_ns"]) == (2, 1, 8, 3)
    rows = records.by_variant(stats, funcs)
    assert [r["variant"] for r in rows] == ["f", "g"]  # the longest total span first
    assert rows[0]["span_us"] == 22 / 1e3 and rows[0]["tail_us"] == 11 / 1e3
    lines = records.report(path, top=5)
    assert "5 items, 2 tasks, 2 programs" in lines[0] and lines[2].split()[0] == "f"
