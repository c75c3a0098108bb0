"""pto.viz on real task-graph dumps: levels, DOT structure, summarized mode, rendered files, and
the two command lines (``pto visualize`` and ``tools/visualize_taskgraph.py``)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from pto import viz
from pto.dump import read_dump
from pto.errors import ParseError, PTOError, UsageError

ROOT = Path(__file__).resolve().parent.parent
HAVE_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAVE_DOT, reason="graphviz's dot is not installed")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """Dumps of real programs: softmax and llama7b (tiny, seq 100) executed through the engine,
    and the split-attention llama7b at seq 1000 (2,096 tasks), built but not executed."""
    from pto import programs
    from pto.engine import run
    from pto.graph import CompiledProgram
    from pto.ir.dtypes import DType
    from pto.programs import RunOptions

    d = tmp_path_factory.mktemp("dumps")
    out = {}
    for name, kw in (("softmax", {}), ("llama", {"seq": 100})):
        path = d / f"{name}.txt"
        res = run("softmax" if name == "softmax" else "llama7b", device="cpu", backend="torch",
                  dump=str(path), **kw)
        out[name] = (path, res)
    prog = programs.get("llama7b")
    opts = RunOptions(config="tiny", dtype=DType.F32, attention="split")
    graph = CompiledProgram.get(prog.build(opts)).build_graph(prog.scalars(opts, 1000))
    try:
        path = d / "llama_split.txt"
        graph.dump(path)
        out["split"] = (path, {"tasks": graph.tasks, "edges": graph.edges})
    finally:
        graph.close()
    return out


def brute_force_levels(path) -> dict[int, int]:
    """Longest path to every task by relaxing all edges until nothing changes (independent of
    the Kahn frontier code under test)."""
    dump = read_dump(path)
    level = {t.id: 0 for t in dump.tasks}
    edges = dump.edges()
    changed = True
    while changed:
        changed = False
        for a, b in edges:
            if level[b] < level[a] + 1:
                level[b] = level[a] + 1
                changed = True
    return level


@pytest.mark.parametrize("name", ["softmax", "llama", "split"])
def test_levels_equal_longest_paths(dumps, name):
    path, res = dumps[name]
    g = viz.load_dump(path)
    assert (g.n_tasks, g.n_edges) == (res["tasks"], res["edges"])
    levels = viz.compute_levels(g.ptr, g.succ)
    want = brute_force_levels(path)
    assert {int(i): int(lv) for i, lv in zip(g.ids, levels)} == want


def test_levels_reject_cycles_and_handle_empty():
    ptr, succ = np.array([0, 1, 2, 2]), np.array([1, 0])  # 0 -> 1 -> 0, task 2 alone
    with pytest.raises(ParseError, match="cycle"):
        viz.compute_levels(ptr, succ)
    assert len(viz.compute_levels(np.zeros(1, np.int64), np.zeros(0, np.int64))) == 0
    # a diamond plus a long chain: 0->1->3, 0->2->3, 0->3
    ptr, succ = np.array([0, 3, 4, 5, 5]), np.array([1, 2, 3, 3, 3])
    assert viz.compute_levels(ptr, succ).tolist() == [0, 1, 1, 2]


def test_detail_dot_has_every_task_ranks_and_title(dumps):
    path, res = dumps["llama"]
    g = viz.load_dump(path)
    text, summary = viz.to_dot(g)
    assert summary is None
    levels = brute_force_levels(path)
    n_levels = max(levels.values()) + 1
    initial = sum(1 for v in levels.values() if v == 0)
    assert (f"{res['tasks']} tasks · {res['edges']} edges · {n_levels} levels · "
            f"initial parallelism {initial}") in text
    assert "rankdir=LR" in text
    for t in read_dump(path).tasks:
        node = re.search(rf'^  t{t.id} \[label="task {t.id}\\n{t.func}\\n([^"]+)", '
                         r'fillcolor="#[0-9a-f]{6}"\];$', text, re.M)
        assert node, f"task {t.id} missing"
        assert node.group(1) == viz.human_bytes(t.buffer_bytes)
        for s in t.fanout:
            assert f"  t{t.id} -> t{s};" in text
    ranks = re.findall(r"\{ rank=same; ([^}]*)\}", text)
    assert len(ranks) == n_levels
    for line in ranks:
        members = {int(m) for m in re.findall(r"t(\d+);", line)}
        assert len({levels[m] for m in members}) == 1
    assert sum(len(re.findall(r"t\d+;", r)) for r in ranks) == res["tasks"]
    for fn in {v.split("__")[0] for v in read_dump(path).funcs.values()}:
        assert f">{fn}</td>" in text  # the color legend names every InCore function


def test_human_bytes():
    assert viz.human_bytes(512) == "512 B"
    assert viz.human_bytes(4096) == "4.0 KiB"
    assert viz.human_bytes(int(1.5 * 2**20)) == "1.5 MiB"


def test_summarized_mode_small_max_nodes(dumps):
    path, res = dumps["llama"]
    g = viz.load_dump(path)
    text, s = viz.to_dot(g, max_nodes=8)
    assert s is not None
    assert f"summarized: {res['tasks']} tasks in {s.n_groups} groups" in text
    # bounded: max_nodes, or one group per InCore function when levels are all merged
    assert s.n_groups <= max(8, len(g.base_names))
    nodes = re.findall(r'^  (g\d+_\d+) \[label="([a-z_]+) ×(\d+)', text, re.M)
    assert len(nodes) == s.n_groups
    assert sum(int(c) for _, _, c in nodes) == res["tasks"]
    internal = int((s.group[np.repeat(np.arange(g.n_tasks), np.diff(g.ptr))] == s.group[g.succ]).sum())
    assert int(s.edges[:, 2].sum()) + internal == res["edges"]


def test_summarized_mode_real_graph_beyond_max_nodes(dumps, tmp_path):
    path, res = dumps["split"]
    assert res["tasks"] > 2000
    g = viz.load_dump(path)
    text, s = viz.to_dot(g)
    assert s is not None and s.n_groups <= 2000 and s.work <= viz.LAYOUT_BUDGET
    assert f"summarized: {res['tasks']:,} tasks in {s.n_groups:,} groups" in text
    if HAVE_DOT:
        t0 = time.perf_counter()
        out = viz.visualize(path, tmp_path / "split.pdf")
        assert time.perf_counter() - t0 < 60
        assert Path(out).read_bytes().startswith(b"%PDF-")


@needs_dot
def test_rendered_files_are_valid(dumps, tmp_path):
    path, _ = dumps["llama"]
    pdf = Path(viz.visualize(path, tmp_path / "g.pdf"))
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF-") and b"%%EOF" in data[-64:] and len(data) > 10_000
    svg = Path(viz.visualize(path, tmp_path / "g.svg"))
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert "initial parallelism" in svg.read_text()
    png = Path(viz.visualize(path, tmp_path / "g.out", fmt="png"))
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    # the default format is pdf when the name has no suffix
    assert Path(viz.visualize(path, tmp_path / "noext")).read_bytes().startswith(b"%PDF-")


def test_dot_format_needs_no_graphviz(dumps, tmp_path, monkeypatch):
    path, res = dumps["softmax"]
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    out = Path(viz.visualize(path, tmp_path / "g.dot"))
    text = out.read_text()
    assert text.startswith("digraph taskgraph {") and f"{res['tasks']} tasks" in text
    with pytest.raises(PTOError, match="--format dot"):
        viz.visualize(path, tmp_path / "g.pdf")


def test_format_and_input_errors(dumps, tmp_path):
    path, _ = dumps["softmax"]
    with pytest.raises(UsageError, match="unknown format"):
        viz.visualize(path, tmp_path / "x.pdf", fmt="jpg")
    with pytest.raises(UsageError, match="cannot tell the format"):
        viz.visualize(path, tmp_path / "x.jpg")
    with pytest.raises(UsageError, match="does not exist"):
        viz.visualize(path, tmp_path / "no" / "x.dot")
    with pytest.raises(UsageError, match="cannot read"):
        viz.visualize(tmp_path / "missing.txt", tmp_path / "x.dot")
    with pytest.raises(UsageError, match="max_nodes"):
        viz.visualize(path, tmp_path / "x.dot", max_nodes=0)
    bad = tmp_path / "dangling.txt"
    bad.write_text("PTO-TASKGRAPH 1\nFUNC 0 f\nTASK 0 0 64 0 1 7\nEND 1 1\n")
    with pytest.raises(ParseError, match="successor 7"):
        viz.load_dump(bad)


def _garble(src: Path, dst: Path) -> None:
    lines = src.read_text().splitlines()
    k = next(i for i, ln in enumerate(lines) if ln.startswith("TASK"))
    lines[k] = lines[k].replace("TASK", "TASK x", 1)
    dst.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("command", [
    [sys.executable, "-m", "pto.cli", "visualize"],
    [sys.executable, str(ROOT / "tools" / "visualize_taskgraph.py")],
], ids=["pto-visualize", "tools-script"])
def test_command_lines(dumps, tmp_path, command):
    path, _ = dumps["llama"]
    out = tmp_path / ("g.pdf" if HAVE_DOT else "g.dot")
    r = subprocess.run([*command, str(path), str(out)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    assert out.read_bytes()[:5] == (b"%PDF-" if HAVE_DOT else b"digra")
    garbled = tmp_path / "garbled.txt"
    _garble(path, garbled)
    r = subprocess.run([*command, str(garbled), str(tmp_path / "h.pdf")], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert str(garbled) in lines[0] and re.search(r"line \d+", lines[0])
    assert not (tmp_path / "h.pdf").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["garbled.txt", out.name])
