"""bench/decode.py runs transformers' compiled step in a child process: a result comes back as
the child's last line of JSON, and a child that dies (a segmentation fault, an error) is a
RuntimeError that says how, not the end of the benchmark."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parents[2] / "bench"
_spec = importlib.util.spec_from_file_location("decode_bench", _BENCH / "decode.py")
decode = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(decode)


def test_the_childs_last_json_line_is_its_result():
    child = "import json; print('compiling'); print(json.dumps({'ms': 2 ** 0.5}))"
    got = decode.child_json([sys.executable, "-c", child])
    assert got == {"ms": 2 ** 0.5}


def test_a_child_killed_by_a_signal_or_failing_is_an_error_that_says_how():
    with pytest.raises(RuntimeError, match=r"killed by SIGSEGV"):
        decode.child_json([sys.executable, "-c", "import ctypes; ctypes.string_at(0)"])
    with pytest.raises(RuntimeError, match=r"exited with status 1: ValueError: invalid literal"):
        decode.child_json([sys.executable, "-c", "int('x')"])
    with pytest.raises(RuntimeError, match=r"printed no result"):  # no JSON printed
        decode.child_json([sys.executable, "-c", "print('done')"])
    with pytest.raises(RuntimeError, match=r"ran past 1 s and was stopped"):
        decode.child_json([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)


def test_a_persistent_runs_paths_print_with_their_functions_and_each_batch_records_apart(tmp_path):
    """decode.path_lines (bench/decode.py's lines and bench/megakernel.py's table): the critical path
    and the item path, each with its first functions; megakernel.records_path: a file per batch."""
    cp = {"tasks": 3, "total": 9.5, "wait": 1.5, "item": 7.0, "spread": 0.5, "launch": 0.5,
          "by_function": {"f": {"tasks": 2, "wait": 1.0, "item": 5.0, "spread": 0.5, "items": 4.0, "rounds": 1.0},
                          "g": {"tasks": 1, "wait": 0.5, "item": 2.0, "spread": 0.0, "items": 1.0, "rounds": 1.0}}}
    ip = {"items": 3, "total": 9.5, "wait": 2.0, "dispatch": 0.0, "item": 7.0, "launch": 0.5,
          "by_function": {"f": {"items": 2, "wait": 1.5, "dispatch": 0.0, "item": 5.0}}}
    lines = decode.path_lines({"critical_path_us": cp, "item_path_us": ip}, "  ", functions=1)
    assert lines[0] == "  critical path: 3 tasks, 9.5 us = wait 1.5 + item 7.0 + spread 0.5 + between launches 0.5"
    assert lines[1].split()[:6] == ["f", "x2", "wait", "1.0", "item", "5.0"] and len(lines) == 4  # g left out
    assert lines[2].startswith("  item path: 3 items, 9.5 us = wait 2.0 + dispatch 0.0 + item 7.0")
    assert decode.path_lines({}) == []
    spec = importlib.util.spec_from_file_location("megakernel_bench", _BENCH / "megakernel.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    one, eight = (mk.records_path(str(tmp_path), "llama3-8b", "+chunk=256", "d=static", b) for b in (1, 8))
    assert Path(one).name == "llama3-8b__chunk_256_d_static.npz" and Path(eight).name.startswith("llama3-8b-b8_")


def test_a_steps_kernels_advance_its_end_by_what_they_add_past_the_kernels_before():
    """pto.exec.timing.frontier (bench/decode.py --timeline): each kernel's advance is how far it
    moved the latest end of those before it, so the advances sum to the span whatever overlaps;
    its lead is its start less its predecessor's end (negative under a dependent launch)."""
    from pto.exec.timing import frontier

    rng = random.Random(7)
    for _ in range(200):
        t, kernels = 0.0, []
        for i in range(rng.randint(1, 12)):
            start = max(0.0, t + rng.uniform(-3.0, 2.0))  # before or after the previous end
            end = start + rng.uniform(0.1, 5.0)
            kernels.append((f"k{i % 3}", start, end))
            t = end
        kernels.sort(key=lambda k: k[1])
        out = frontier(kernels)
        span = max(e for _, _, e in kernels) - kernels[0][1]
        assert abs(sum(a for _, a, _, _ in out) - span) < 1e-9
        assert all(a >= 0 for _, a, _, _ in out)
        for (name, _, busy, lead), (n, s, e), prev in zip(out, kernels, [None] + kernels[:-1]):
            assert name == n and abs(busy - (e - s)) < 1e-12
            assert lead == (s - prev[2] if prev else 0.0)
    # by hand: B starts 1 us before A ends and ends 2 past it; C lies inside B
    got = frontier([("A", 0.0, 4.0), ("B", 3.0, 6.0), ("C", 4.0, 5.0)])
    assert got == [("A", 4.0, 4.0, 0.0), ("B", 2.0, 3.0, -1.0), ("C", 0.0, 1.0, -2.0)]


def test_a_profiles_kernels_part_into_calls_where_the_gpu_idled():
    """pto.exec.timing.calls_apart (kernel_timeline's calls): a new call where the GPU idled
    longer than the gap after every kernel before (an overlapping kernel that ends late keeps the
    call going), each call from its first kernel's start, in start order."""
    from pto.exec.timing import calls_apart

    spans = [("c", 1000.0, 1001.0), ("a", 0.0, 5.0), ("b", 3.0, 20.0), ("d", 1002.5, 1004.0), ("e", 19.0, 21.0)]
    assert calls_apart(spans, 100.0) == [[("a", 0.0, 5.0), ("b", 3.0, 20.0), ("e", 19.0, 21.0)],
                                         [("c", 0.0, 1.0), ("d", 2.5, 4.0)]]
    assert len(calls_apart(spans, 1.0)) == 3 and calls_apart([], 1.0) == []
    assert len(calls_apart([("a", 0.0, 50.0), ("b", 60.0, 61.0)], 20.0)) == 1  # 10 us after a's end


def test_a_steps_timeline_sums_each_kernels_launches_by_their_medians_and_prints_a_line_each(capsys):
    """bench/decode.py --timeline: per kernel name, launches per call and the medians of their
    advance, duration and lead over the calls; the kernels by what they add a call, most first;
    the span the calls' median."""
    # two calls of three launches: "g" twice a call (advances 4, 2, then 6, 2; durations 4, 2, then
    # 6, 2.5; leads 0, 0, then 0, -0.5), "a" once (advances 1, 2; durations 2, 1; leads -1, 1)
    calls = [[("g", 0.0, 4.0), ("a", 3.0, 5.0), ("g", 5.0, 7.0)],
             [("g", 0.0, 6.0), ("a", 7.0, 8.0), ("g", 7.5, 10.0)]]
    tl = decode.timeline_of(calls)
    assert tl["span_us"] == 8.5  # (7 and 10)
    assert list(tl["kernels"]) == ["g", "a"]  # 3.0 x 2 a call before 1.5 x 1
    assert tl["kernels"]["g"] == {"per_step": 2.0, "advance_us": 3.0, "busy_us": 3.25, "lead_us": 0.0}
    assert tl["kernels"]["a"] == {"per_step": 1.0, "advance_us": 1.5, "busy_us": 1.5, "lead_us": 0.0}
    decode.print_timeline("step", tl)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("step: span 8.5 us a step") and out[1].split() == ["g", "2.0", "3.00", "3.25", "0.00"]
    assert decode.timeline_of([]) == {"span_us": None, "kernels": {}}
