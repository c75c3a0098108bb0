"""pto.trace on real executions: the Chrome/Perfetto trace-event JSON is well formed, has one
complete event per task on named lanes, and its flow arrows are exactly the graph's
dependencies (or the first ``max_flows`` of them)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

import pto.trace
from pto.dump import read_dump
from pto.engine import run

# keys every event of a phase must have (the trace-event format's required fields)
REQUIRED = {
    "X": {"name", "cat", "ph", "pid", "tid", "ts", "dur"},
    "M": {"name", "ph", "pid", "args"},
    "s": {"name", "cat", "ph", "id", "pid", "tid", "ts"},
    "f": {"name", "cat", "ph", "id", "pid", "tid", "ts", "bp"},
}


def _run(tmp_path, program, **kw):
    trace, dump = tmp_path / f"{program}.json", tmp_path / f"{program}.txt"
    res = run(program, device="cpu", backend="torch", trace=str(trace), dump=str(dump), **kw)
    return json.loads(trace.read_text(encoding="utf-8")), read_dump(dump), res


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("trace"), "llama7b", seq=100)


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


def test_flow_cap(tmp_path, monkeypatch):
    real = pto.trace.write_trace
    monkeypatch.setattr(pto.trace, "write_trace", lambda p, r, g: real(p, r, g, max_flows=10))
    trace, dump, res = _run(tmp_path, "llama7b", seq=31)
    v = validate(trace)
    assert len(v["flows"]) == 10 < res["edges"]
    other = trace["otherData"]
    assert other["flows_capped"] is True and other["flows"] == 10 and other["dependencies"] == res["edges"]
    labels = [e["args"]["labels"] for e in trace["traceEvents"] if e["name"] == "process_labels"]
    assert f"first 10 of {res['edges']} dependency arrows" in labels[0]
    # the first ten in predecessor order
    at = _task_at(v["lanes"])
    drawn = [(at[(p["s"]["tid"], p["s"]["ts"])], at[(p["f"]["tid"], p["f"]["ts"])])
             for _, p in sorted(v["flows"].items())]
    assert drawn == dump.edges()[:10]


def test_softmax_trace_without_edges(tmp_path):
    trace, dump, res = _run(tmp_path, "softmax")
    v = validate(trace)
    tasks = [e for events in v["lanes"].values() for e in events if e["cat"] == "task"]
    assert len(tasks) == res["tasks"] == len(dump.tasks) and not v["flows"]
    assert Counter(e["tid"] for e in tasks) == Counter(range(1, res["tasks"] + 1))


def test_trace_without_graph_and_empty():
    import numpy as np

    from pto.executor import LaunchRecord

    recs = [LaunchRecord(0, "f__R32", np.array([3, 4]), 1000, 5000),
            LaunchRecord(1, "g", np.array([5]), 6000, 7000)]
    t = pto.trace.trace_events(recs)
    v = validate(t)
    assert [e["name"] for e in v["lanes"][1]] == ["f", "g"]
    assert v["lanes"][1][1]["ts"] == 5.0 and v["lanes"][1][1]["dur"] == 1.0
    empty = pto.trace.trace_events([])
    validate(empty)
    assert empty["otherData"]["tasks"] == 0


def test_cli_run_trace(tmp_path):
    out = tmp_path / "t.json"
    r = subprocess.run([sys.executable, "-m", "pto.cli", "run", "softmax", "--trace", str(out), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    trace = json.loads(out.read_text(encoding="utf-8"))
    validate(trace)
    assert trace["otherData"]["tasks"] == res["tasks"]
