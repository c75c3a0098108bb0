"""bench/records.py, the persistent executor's traced items saved on the GPU and studied off it:
a round trip through its file, and per task its items, programs, rounds, median item, span and
tail, its skew and slowest item, and (where the trace knows each item's multiprocessor) the
items that shared one against those that ran alone, against records whose schedule is known."""

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
    assert programs == 2 and funcs == ["f", "g"] and items.shape == (5, 8) and (items[:, 7] == -1).all()
    assert items[:, 3].min() == 0 and items[:, 5].tolist() == [0, 0, 0, 1, 1]
    stats = records.task_stats(items)
    f, g = stats[7], stats[9]
    assert (f["items"], f["programs"], f["rounds"]) == (3, 2, 2)
    assert f["item_ns"] == 10 and f["span_ns"] == 22 and f["tail_ns"] == 22 - 11
    assert (g["items"], g["rounds"], g["span_ns"], g["tail_ns"]) == (2, 1, 8, 3)
    assert (f["skew_ns"], f["slow_ns"], g["skew_ns"], g["slow_ns"]) == (10, 2, 0, 1.5)
    assert f["shared"] is None  # (no multiprocessors in these records)
    rows = records.by_variant(stats, funcs)
    assert [r["variant"] for r in rows] == ["f", "g"]  # the longest total span first
    assert rows[0]["span_us"] == 22 / 1e3 and rows[0]["tail_us"] == 11 / 1e3
    lines = records.report(path, top=5)
    assert "5 items, 2 tasks, 2 programs" in lines[0] and lines[2].split()[0] == "f"


def test_items_beside_another_on_one_multiprocessor_against_those_alone(tmp_path):
    """Task 3's items 0 and 1 run at once on multiprocessor 5 (10 and 14 units), item 2 alone on
    6 (8): the shared ones' median over the lone one's, 12 / 8. Item 3 runs on 5 after the others
    ended there: alone. A file saved without multiprocessors (seven columns) still loads."""
    recs = [ItemRecord(3, 0, 0, 0, 10, "f", sm=5), ItemRecord(3, 1, 1, 2, 16, "f", sm=5),
            ItemRecord(3, 2, 2, 1, 9, "f", sm=6), ItemRecord(3, 3, 0, 20, 28, "f", sm=5)]
    path = str(tmp_path / "sm.npz")
    records.save(path, recs, programs=3)
    items, _, _ = records.load(path)
    assert items[:, 7].tolist() == [5, 5, 6, 5]
    (st,) = records.task_stats(items).values()
    assert st["shared"] == 12 / 8 and st["skew_ns"] == 20 and st["slow_ns"] == 14 - 9
    assert records.report(path, top=1)[2].split()[-1] == "1.50"
    old = str(tmp_path / "old.npz")
    np.savez_compressed(old, items=items[:, :7], funcs=np.array(["f"]), programs=np.int64(3))
    assert (records.load(old)[0][:, 7] == -1).all()


def test_the_shared_ratio_is_the_all_pairs_one_on_random_items():
    """The sorted sweep against every pair compared (seeded random items on a few
    multiprocessors, some touching end to start: not overlapping)."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(2, 60))
        start = rng.integers(0, 200, n)
        end = start + rng.integers(1, 40, n)
        sm = rng.integers(0, 5, n)
        it = np.zeros((n, 8), np.int64)
        it[:, 3], it[:, 4], it[:, 7] = start, end, sm
        dur = end - start
        pairs = (sm[:, None] == sm[None, :]) & (start[:, None] < end[None, :]) & (start[None, :] < end[:, None])
        beside = pairs.sum(1) > 1
        want = None if beside.all() or not beside.any() else \
            float(np.median(dur[beside]) / np.median(dur[~beside]))
        assert records.shared_ratio(it, dur) == want


def test_a_layers_timeline_of_a_known_schedule(tmp_path):
    """Three layers of two variants (``a`` then ``b``) and a task of its own (``lm``, left out:
    not one a layer). The middle layer: ``a`` starts 75 after the first layer's last end, its
    items start 2 apart, end 4 apart, span 14; ``b`` starts 1 after ``a``'s last end, its
    items start 1 and end 5 apart, span 10; the layer spans 25. With ``--layers`` the report
    prints it."""
    recs = []
    for layer in range(3):
        b0 = 100 * layer
        recs += [ItemRecord(10 + layer, 0, 0, b0, b0 + 10, "a"), ItemRecord(10 + layer, 1, 1, b0 + 2, b0 + 14, "a"),
                 ItemRecord(20 + layer, 0, 0, b0 + 15, b0 + 20, "b"),
                 ItemRecord(20 + layer, 1, 1, b0 + 16, b0 + 25, "b")]
    recs.append(ItemRecord(30, 0, 0, 300, 340, "lm"))
    path = str(tmp_path / "layers.npz")
    records.save(path, recs, programs=2)
    items, funcs, _ = records.load(path)
    rows, span = records.layer_timeline(items, funcs, 3)
    assert span == 25 / 1e3
    assert [r["variant"] for r in rows] == ["a", "b"]
    a, b = ({k: round(v * 1e3, 6) for k, v in r.items() if k != "variant"} for r in rows)
    assert a == {"gap_us": 75, "skew_us": 2, "span_us": 14, "ends_us": 4}
    assert b == {"gap_us": 1, "skew_us": 1, "span_us": 10, "ends_us": 5}
    lines = records.timeline_report(path, 3)
    assert "a layer of 3" in lines[0] and [line.split()[0] for line in lines[2:]] == ["a", "b"]
