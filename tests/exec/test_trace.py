"""pto.exec.trace on real executions: the Chrome/Perfetto trace-event JSON is well formed, has one
complete event per task on named lanes, and its flow arrows are exactly the graph's
dependencies (or the first ``max_flows`` of them, which ``write_trace`` reports so that the
command line can say so)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

import pto.exec.trace
from pto import viz
from pto.errors import UsageError
from pto.exec import LaunchRecord
from pto.runtime.dump import read_dump

DATA = Path(__file__).resolve().parents[1] / "data" / "taskgraphs"

# keys every event of a phase must have (the trace-event format's required fields)
REQUIRED = {
    "X": {"name", "cat", "ph", "pid", "tid", "ts", "dur"},
    "M": {"name", "ph", "pid", "args"},
    "s": {"name", "cat", "ph", "id", "pid", "tid", "ts"},
    "f": {"name", "cat", "ph", "id", "pid", "tid", "ts", "bp"},
}


def _run(tmp_path, program, *args):
    """``pto run PROGRAM --trace --dump --json`` on the CPU: the trace, the dump and the result."""
    trace, dump = tmp_path / f"{program}.json", tmp_path / f"{program}.txt"
    r = subprocess.run([sys.executable, "-m", "pto.cli", "run", program, "--device", "cpu", "--backend", "torch",
                        "--trace", str(trace), "--dump", str(dump), "--json", *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(trace.read_text(encoding="utf-8")), read_dump(dump), json.loads(r.stdout)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("trace"), "llama7b", "--seq", "100")


def validate(trace: dict) -> dict:
    """Check the structure; returns per-lane X events and the flows (id -> {ph: event})."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    assert trace["displayTimeUnit"] == "ms"
    lanes: dict[int, list[dict]] = defaultdict(list)
    flows: dict[int, dict[str, dict]] = defaultdict(dict)
    for e in trace["traceEvents"]:
        assert e["ph"] in REQUIRED, e
        assert REQUIRED[e["ph"]] <= set(e), e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0
            lanes[e["tid"]].append(e)
        elif e["ph"] in "sf":
            assert e["ph"] not in flows[e["id"]], f"flow id {e['id']} reused"
            flows[e["id"]][e["ph"]] = e
    for tid, events in lanes.items():
        ts = [e["ts"] for e in events]
        assert ts == sorted(ts), f"lane {tid} not in time order"
        for a, b in zip(events, events[1:]):  # slices of one lane never overlap
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
    starts = {(e["tid"], e["ts"], e["cat"]) for events in lanes.values() for e in events}
    for fid, pair in flows.items():
        assert set(pair) == {"s", "f"}, f"flow {fid} is not a start/finish pair"
        assert pair["f"]["bp"] == "e"
        assert pair["s"]["ts"] <= pair["f"]["ts"]
        for ph in "sf":  # each end sits at the start of a slice of its lane (how viewers bind it)
            assert (pair[ph]["tid"], pair[ph]["ts"], pair[ph]["cat"]) in starts
    return {"lanes": lanes, "flows": flows}


def _task_at(lanes):
    return {(e["tid"], e["ts"]): e["args"]["task"] for events in lanes.values() for e in events
            if e["cat"] == "task"}


def test_llama_trace(llama):
    trace, dump, res = llama
    v = validate(trace)
    tasks = [e for events in v["lanes"].values() for e in events if e["cat"] == "task"]
    launches = [e for e in v["lanes"][0]]
    assert len(tasks) == res["tasks"] == len(dump.tasks)
    assert sorted(e["args"]["task"] for e in tasks) == sorted(t.id for t in dump.tasks)
    # one event per batch; a batch is one or more device launches (the JSON's "launches")
    assert 0 < len(launches) <= res["launches"] and all(e["cat"] == "launch" for e in launches)
    assert sum(e["args"]["tasks"] for e in launches) == res["tasks"]
    # named by InCore function; the variant is an arg
    funcs = {t.id: t.func for t in dump.tasks}
    for e in tasks:
        assert e["args"]["variant"] == funcs[e["args"]["task"]]
        assert e["name"] == funcs[e["args"]["task"]].split("__")[0]
    # the k-th task of a launch is on lane k + 1, inside its launch's interval
    by_launch = {e["args"]["launch"]: e for e in launches}
    for e in tasks:
        launch = by_launch[e["args"]["launch"]]
        assert e["tid"] == e["args"]["batch_index"] + 1
        assert (e["ts"], e["dur"]) == (launch["ts"], launch["dur"])
    # arrows: exactly the dependencies of the graph, predecessor to successor
    at = _task_at(v["lanes"])
    drawn = {(at[(p["s"]["tid"], p["s"]["ts"])], at[(p["f"]["tid"], p["f"]["ts"])])
             for p in v["flows"].values()}
    assert len(drawn) == len(v["flows"]) == res["edges"]
    assert drawn == set(dump.edges())
    assert trace["otherData"]["flows_capped"] is False
    # every lane with events is named, and the process too
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(v["lanes"]) <= set(names) and names[0] == "batches"
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in trace["traceEvents"])


def _records_by_level(path: Path) -> tuple[list[LaunchRecord], list[tuple[int, int]]]:
    """One launch per (dependency level, variant) of a real dump, in level order, 10 µs each
    (what the executor records, without executing), and the dump's edges."""
    g = viz.load_dump(path)
    levels = viz.compute_levels(g.ptr, g.succ)
    recs = []
    for level in range(int(levels.max()) + 1):
        for f in np.unique(g.func[levels == level]):
            tasks = g.ids[(levels == level) & (g.func == f)]
            t0 = 1_000_000 + 10_000 * len(recs)
            recs.append(LaunchRecord(level, g.func_names[f], tasks, t0, t0 + 9_000))
    return recs, read_dump(path).edges()


@pytest.fixture(scope="module")
def split_dump(tmp_path_factory) -> Path:
    """The 2,096-task, 5,728-edge llama7b graph (tests/data/taskgraphs/README.md)."""
    path = tmp_path_factory.mktemp("split") / "split.txt"
    path.write_bytes(gzip.decompress((DATA / "llama7b_seq1000_split.txt.gz").read_bytes()))
    return path


def test_flow_cap_is_reported(split_dump, tmp_path):
    recs, edges = _records_by_level(split_dump)
    assert len(edges) == 5728
    info = pto.exec.trace.write_trace(tmp_path / "t.json", recs, edges=edges, max_flows=10)
    assert (info.flows, info.dependencies, info.capped, info.tasks, info.batches) == (10, 5728, True, 2096, len(recs))
    assert info.note == "trace: first 10 of 5,728 dependency arrows drawn"
    trace = json.loads(Path(info.path).read_text(encoding="utf-8"))
    v = validate(trace)
    assert len(v["flows"]) == 10
    other = trace["otherData"]
    assert other["flows_capped"] is True and other["flows"] == 10 and other["dependencies"] == 5728
    labels = [e["args"]["labels"] for e in trace["traceEvents"] if e["name"] == "process_labels"]
    assert "first 10 of 5,728 dependency arrows" in labels[0]
    # the first ten in predecessor order
    at = _task_at(v["lanes"])
    drawn = [(at[(p["s"]["tid"], p["s"]["ts"])], at[(p["f"]["tid"], p["f"]["ts"])])
             for _, p in sorted(v["flows"].items())]
    assert drawn == edges[:10]
    # the default cap, then no cap
    info = pto.exec.trace.write_trace(tmp_path / "t.json", recs, edges=edges)
    assert info.note == "trace: first 5,000 of 5,728 dependency arrows drawn" and info.max_flows == 5000
    info = pto.exec.trace.write_trace(tmp_path / "t.json", recs, edges=edges, max_flows=6000)
    assert (info.flows, info.capped, info.note) == (5728, False, None)
    assert len(validate(json.loads((tmp_path / "t.json").read_text()))["flows"]) == 5728


def test_flow_note_and_max_flows():
    assert pto.exec.trace.flow_note(5000, 21696) == "trace: first 5,000 of 21,696 dependency arrows drawn"
    assert pto.exec.trace.flow_note(12, 12) is None and pto.exec.trace.flow_note(0, 0) is None
    for bad in (-1, 2.5, True, None):
        with pytest.raises(UsageError, match="max_flows"):
            pto.exec.trace.trace_events([], max_flows=bad)


def test_softmax_trace_without_edges(tmp_path):
    trace, dump, res = _run(tmp_path, "softmax")
    v = validate(trace)
    tasks = [e for events in v["lanes"].values() for e in events if e["cat"] == "task"]
    assert len(tasks) == res["tasks"] == len(dump.tasks) and not v["flows"]
    assert Counter(e["tid"] for e in tasks) == Counter(range(1, res["tasks"] + 1))


def test_trace_without_graph_and_empty():
    recs = [LaunchRecord(0, "f__R32", np.array([3, 4]), 1000, 5000),
            LaunchRecord(1, "g", np.array([5]), 6000, 7000)]
    t = pto.exec.trace.trace_events(recs)
    v = validate(t)
    assert [e["name"] for e in v["lanes"][1]] == ["f", "g"]
    assert v["lanes"][1][1]["ts"] == 5.0 and v["lanes"][1][1]["dur"] == 1.0
    empty = pto.exec.trace.trace_events([])
    validate(empty)
    assert empty["otherData"]["tasks"] == 0



def test_critical_path_follows_the_predecessor_that_ended_last():
    """A diamond a -> (b, c) -> d, where c ends after b: the path is a, c, d; its waits are
    c's start after a's end and d's after c's, its items the median item of each, its spread
    the rest of each task's span (d's second item ran after its first, on the same program: two
    rounds; on two programs, one)."""
    from pto.exec.base import ItemRecord

    rng = np.random.default_rng(3)
    t0 = int(rng.integers(0, 1000))
    a = [ItemRecord(0, 0, 0, t0, t0 + 10, "fa")]
    b = [ItemRecord(1, 0, 0, t0 + 12, t0 + 20, "fb")]
    c = [ItemRecord(2, 0, 1, t0 + 13, t0 + 30, "fc")]
    d = [ItemRecord(3, 0, 0, t0 + 34, t0 + 40, "fd"), ItemRecord(3, 1, 0, t0 + 41, t0 + 49, "fd")]
    edges = np.array([[0, 1], [0, 2], [1, 3], [2, 3]])
    cp = pto.exec.trace.traced_critical_path(a + b + c + d, edges, unit=1.0)
    assert cp["tasks"] == 3 and set(cp["by_function"]) == {"fa", "fc", "fd"}
    assert cp["total"] == 49 and cp["wait"] == (13 - 10) + (34 - 30)
    assert cp["item"] == 10 + 17 + 7 and cp["spread"] == 49 - 34 - 7
    assert cp["total"] == cp["wait"] + cp["item"] + cp["spread"] and cp["launch"] == 0
    fd = cp["by_function"]["fd"]
    assert (fd["items"], fd["rounds"]) == (2, 2) and cp["by_function"]["fa"]["rounds"] == 1
    apart = [d[0], ItemRecord(3, 1, 1, t0 + 35, t0 + 43, "fd")]
    traced = pto.exec.trace.traced_critical_path(a + b + c + apart, edges, unit=1.0)
    assert (traced["by_function"]["fd"]["items"], traced["by_function"]["fd"]["rounds"]) == (2, 1)
    # d in a launch after the others' (a split plan's next segment): its gap is the launch's
    d = [ItemRecord(r.task, r.p, r.program, r.start_ns, r.end_ns, r.func, segment=1) for r in d]
    cp = pto.exec.trace.traced_critical_path(a + b + c + d, edges, unit=1.0)
    assert cp["wait"] == 13 - 10 and cp["launch"] == 34 - 30
    assert cp["total"] == cp["wait"] + cp["item"] + cp["spread"] + cp["launch"]


def test_the_item_path_takes_whatever_held_each_item_last():
    """Items on two programs (hand-made times): an item's start is held by the item it waited
    for or the one before it on its program, whichever ended later; the path from the item that
    ended last adds up its gaps as waits or dispatch, and a later launch's first item on a
    program is held by the previous launch's last item."""
    from pto.exec.base import ItemRecord

    rng = np.random.default_rng(5)
    t0 = int(rng.integers(0, 1000))

    def recs(spec):
        return [ItemRecord(k, 0, prog, t0 + a, t0 + b, f, segment=seg) for k, (prog, a, b, f, seg) in enumerate(spec)]

    spec = [(0, 0, 10, "fa", 0), (1, 0, 12, "fa", 0), (0, 14, 20, "fb", 0), (1, 13, 30, "fc", 0),
            (0, 33, 40, "fd", 0), (1, 31, 45, "fe", 0)]
    waited = np.array([-1, -1, 1, -1, 3, 2])
    # the last is e (45), held by c before it on program 1 (30) more than by b (20), c by a1 (12)
    p = pto.exec.trace.traced_item_path(recs(spec), waited, unit=1.0)
    assert (p["items"], p["total"], p["item"], p["wait"], p["dispatch"], p["launch"]) == (3, 45, 14 + 17 + 12, 0,
                                                                                           1 + 1, 0)
    assert p["by_function"]["fe"] == {"items": 1, "wait": 0, "dispatch": 1, "item": 14}
    # e ends early: d (40) is last, held by c (30, a wait of 3) more than by b before it (20)
    spec[5] = (1, 31, 39, "fe", 0)
    p = pto.exec.trace.traced_item_path(recs(spec), waited, unit=1.0)
    assert (p["items"], p["total"], p["item"], p["wait"], p["dispatch"]) == (3, 40, 7 + 17 + 12, 3, 1)
    assert set(p["by_function"]) == {"fd", "fc", "fa"} and p["by_function"]["fd"]["wait"] == 3
    # d the first item of a second launch on its program: held by the first launch's last (e, 39)
    spec[4] = (0, 41, 48, "fd", 1)
    waited[4] = -1
    p = pto.exec.trace.traced_item_path(recs(spec), waited, unit=1.0)
    assert (p["items"], p["total"], p["item"], p["wait"], p["dispatch"], p["launch"]) == (4, 48, 7 + 8 + 17 + 12,
                                                                                           0, 2, 2)
    assert p["total"] == p["item"] + p["wait"] + p["dispatch"] + p["launch"]
    with pytest.raises(ValueError, match="one entry a record"):
        pto.exec.trace.traced_item_path(recs(spec), waited[:3], unit=1.0)
