"""pto.viz on real task-graph dumps: levels, DOT structure, summaries wrapped into rows, drawings
readable at 100% zoom (page size and font sizes measured in the rendered SVG), outputs checked
before any work, and the two command lines (``pto visualize`` and ``tools/visualize_taskgraph.py``).

The dumps are real ones written by ``pto run`` (tests/data/taskgraphs/README.md), from 4 to
2,096 tasks, plus generated extremes: a 5,000-level chain, 10,000 independent tasks and a random
layered graph.
"""

from __future__ import annotations

import gzip
import os
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
from pto.errors import ParseError, PTOError, UsageError
from pto.runtime.dump import read_dump

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "taskgraphs"
HAVE_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAVE_DOT, reason="graphviz's dot is not installed")

# name -> checked-in dump (tests/data/taskgraphs/README.md says how each was made)
REAL = {
    "softmax": "softmax_seq100.txt.gz",        # 4 tasks
    "bgemm": "bgemm_seq100.txt.gz",            # 16 tasks
    "llama": "llama7b_seq100_fused.txt.gz",    # 44 tasks
    "split300": "llama7b_seq300_split.txt.gz",  # 325 tasks
    "fused2000": "llama7b_seq2000_fused.txt.gz",  # 693 tasks
    "pair": "llama7b_seq1000_pair.txt.gz",     # 1,040 tasks
    "split": "llama7b_seq1000_split.txt.gz",   # 2,096 tasks
}
SYNTHETIC = ("chain", "wide", "random")
PER_TASK = {"softmax", "bgemm", "llama"}  # small enough to draw one box per task

# The readability criteria, written out here rather than read from pto.viz so that a change of
# the constants has to change the tests too: a page of at most 60 x 36 in (three by three
# full-HD screens at 100% zoom), no text under 10 pt, no strip more than 3 times wider or taller
# than it is the other way once it is wider than a screen (20 in).
PAGE_PT = (60 * 72, 36 * 72)
MIN_FONT_PT = 10
SCREEN_W_PT = 20 * 72
MAX_ASPECT = 3.0


def write_dump(path: Path, funcs: list[str], task_func: list[int], succs: list[list[int]]) -> Path:
    """A well-formed dump of the given tasks (ids 0..n-1) and successor lists."""
    fanin = np.zeros(len(task_func), np.int64)
    for s in succs:
        np.add.at(fanin, np.asarray(s, np.int64), 1)
    lines = ["PTO-TASKGRAPH 1", *(f"FUNC {i} {f}" for i, f in enumerate(funcs))]
    for i, (f, s) in enumerate(zip(task_func, succs)):
        lines.append(f"TASK {i} {f} 4096 {fanin[i]} {len(s)}" + "".join(f" {t}" for t in s))
    lines.append(f"END {len(task_func)} {sum(len(s) for s in succs)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def synthetic(name: str, path: Path) -> Path:
    if name == "chain":  # 5,000 levels of 3 functions in turn
        n = 5000
        return write_dump(path, [f"step{k}_tile__R32" for k in range(3)], [i % 3 for i in range(n)],
                          [[i + 1] if i + 1 < n else [] for i in range(n)])
    if name == "wide":  # 10,000 tasks of 12 functions, no dependencies: one level
        return write_dump(path, [f"kernel{k}_tile" for k in range(12)], [i % 12 for i in range(10_000)],
                          [[] for _ in range(10_000)])
    # 80 levels of 40 tasks of 14 functions; 1-3 predecessors in the level before, some 5 back
    rng = np.random.default_rng(7)
    ids = np.arange(80 * 40).reshape(80, 40)
    succs: list[list[int]] = [[] for _ in range(ids.size)]
    for lv in range(1, 80):
        for t in ids[lv]:
            for p in rng.choice(ids[lv - 1], size=int(rng.integers(1, 4)), replace=False):
                succs[int(p)].append(int(t))
            if lv >= 5 and rng.random() < 0.1:
                succs[int(rng.choice(ids[lv - 5]))].append(int(t))
    return write_dump(path, [f"fn{k}_tile__R{16 << (k % 2)}" for k in range(14)],
                      [int(f) for f in rng.integers(0, 14, ids.size)], [sorted(s) for s in succs])


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("dumps")
    out = {}
    for name, file in REAL.items():
        out[name] = d / f"{name}.txt"
        out[name].write_bytes(gzip.decompress((DATA / file).read_bytes()))
    for name in SYNTHETIC:
        out[name] = synthetic(name, d / f"{name}.txt")
    return out


def counts(path: Path) -> tuple[int, int]:
    dump = read_dump(path)
    return len(dump.tasks), dump.n_edges


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


SVG = "{http://www.w3.org/2000/svg}"


def svg_page(path: Path) -> tuple[float, float, float]:
    """Width and height of the page in points and its smallest text in points at 100% zoom,
    after every scaling graphviz applies (the viewBox against width/height, and the graph
    group's transform, which a ``size`` or ``ratio`` attribute would change)."""
    root = ET.parse(path).getroot()
    w, h = (float(root.get(k).removesuffix("pt")) for k in ("width", "height"))
    view = [float(x) for x in root.get("viewBox").split()]
    # graphviz writes width and height as whole points: a difference under half a point is rounding
    scale = 1.0 if abs(w - view[2]) <= 0.5 and abs(h - view[3]) <= 0.5 else min(w / view[2], h / view[3])
    m = re.search(r"scale\(([\d.]+)(?: ([\d.]+))?\)", root.find(f"{SVG}g").get("transform", ""))
    if m:
        scale *= min(float(m.group(1)), float(m.group(2) or m.group(1)))
    fonts = [float(t.get("font-size")) * scale for t in root.iter(f"{SVG}text")]
    return w, h, min(fonts)


# ------------------------------------------------------------------------------------------
# levels and DOT text
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["softmax", "llama", "split300", "split"])
def test_levels_equal_longest_paths(dumps, name):
    path = dumps[name]
    g = viz.load_dump(path)
    assert (g.n_tasks, g.n_edges) == counts(path)
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
    path = dumps["llama"]
    tasks, edges = counts(path)
    g = viz.load_dump(path)
    text, summary = viz.to_dot(g)
    assert summary is None
    levels = brute_force_levels(path)
    n_levels = max(levels.values()) + 1
    initial = sum(1 for v in levels.values() if v == 0)
    assert f"{tasks} tasks · {edges} edges · {n_levels} levels · initial parallelism {initial}" in text
    assert "rankdir=LR" in text
    for t in read_dump(path).tasks:
        node = re.search(rf'^  t{t.id} \[label=<<table [^>]*><tr><td>task {t.id}</td></tr><tr><td>{t.func}</td></tr>'
                         r'<tr><td>([^<]+)</td></tr></table>>, fillcolor="#[0-9a-f]{6}"\];$', text, re.M)
        assert node, f"task {t.id} missing"
        assert node.group(1) == viz.human_bytes(t.buffer_bytes)
        for s in t.fanout:
            assert f"  t{t.id} -> t{s};" in text
    ranks = re.findall(r"\{ rank=same; ([^}]*)\}", text)
    assert len(ranks) == n_levels
    for line in ranks:
        members = {int(m) for m in re.findall(r"t(\d+);", line)}
        assert len({levels[m] for m in members}) == 1
    assert sum(len(re.findall(r"t\d+;", r)) for r in ranks) == tasks
    for fn in {v.split("__")[0] for v in read_dump(path).funcs.values()}:
        assert f">{fn}</td>" in text  # the color legend names every InCore function


def test_colors_are_per_function_and_stable(dumps):
    g = viz.load_dump(dumps["split"])
    text, _ = viz.to_dot(g)
    legend = dict(re.findall(r'<td bgcolor="(#[0-9a-f]{6})">([a-z_]+)</td>', text))
    by_name = {name: color for color, name in legend.items()}
    assert list(by_name) == g.base_names  # registration order
    assert list(by_name.values()) == list(viz.PALETTE[:len(g.base_names)])
    for name, color in re.findall(r'label=<<table [^>]*><tr><td>([a-z_]+) ×[\d,]+</td>.*?</table>>, '
                                  r'(?:style="[^"]*", )?fillcolor="(#[0-9a-f]{6})"', text):
        assert by_name[name] == color


def test_human_bytes():
    assert viz.human_bytes(512) == "512 B"
    assert viz.human_bytes(4096) == "4.0 KiB"
    assert viz.human_bytes(int(1.5 * 2**20)) == "1.5 MiB"


def _group_counts(text: str) -> dict[str, int]:
    """Group node -> task count, from a summary's DOT text (dashed copies excluded)."""
    found = re.findall(r'^  (g\d+_\d+) \[label=<<table [^>]*><tr><td>[a-z_0-9]+ ×([\d,]+)', text, re.M)
    return {n: int(c.replace(",", "")) for n, c in found}


def test_summarized_mode_small_max_nodes(dumps):
    path = dumps["llama"]
    tasks, edges = counts(path)
    g = viz.load_dump(path)
    text, s = viz.to_dot(g, max_nodes=8)
    assert s is not None
    assert f"summarized: {tasks} tasks in {s.n_groups} groups" in text
    assert "not drawn per task: more than max_nodes = 8 tasks" in text
    # bounded: max_nodes, or one group per InCore function when levels are all merged
    assert s.n_groups <= max(8, len(g.base_names))
    nodes = _group_counts(text)
    assert len(nodes) == s.n_groups and sum(nodes.values()) == tasks
    internal = int((s.group[np.repeat(np.arange(g.n_tasks), np.diff(g.ptr))] == s.group[g.succ]).sum())
    assert int(s.edges[:, 2].sum()) + internal == edges


def test_summary_rows_keep_every_dependency_inside_a_row(dumps):
    """A wrapped summary: every arrow stays inside one row's cluster, an arrow into a later row
    starts at a dashed copy of a group of an earlier row, and the counts add up to every
    dependency between groups."""
    path = dumps["split"]
    tasks, edges = counts(path)
    g = viz.load_dump(path)
    text, s = viz.to_dot(g)
    assert s is not None and s.rows > 1 and s.work <= viz.LAYOUT_BUDGET
    assert f"summarized: {tasks:,} tasks in {s.n_groups:,} groups: one per InCore function and " in text
    assert f"{s.rows} rows of {s.cols} " in text
    row_of = {}
    clusters = re.findall(r'subgraph cluster_row(\d+) \{ label="levels (\d+)–(\d+)";[^}]*?; (r\d+; [^}]*)\}', text)
    assert [int(r) for r, *_ in clusters] == list(range(s.rows))
    for r, lo, hi, members in clusters:
        assert (int(lo), int(hi)) == (int(r) * s.cols * s.band, min((int(r) + 1) * s.cols * s.band, s.n_levels) - 1)
        for m in re.findall(r"([gx][\w]+);", members):
            row_of[m] = int(r)
    groups = _group_counts(text)
    assert sum(groups.values()) == tasks and set(groups) <= set(row_of)
    drawn = 0
    for a, b, c in re.findall(r'^  (\w+) -> (\w+) \[xlabel="([\d,]+)"', text, re.M):
        assert row_of[a] == row_of[b], (a, b)
        if a.startswith("x"):  # x<row>_<group>: a copy of a group of an earlier row
            assert a.startswith(f"x{row_of[b]}_") and row_of[a.split("_", 1)[1]] < row_of[b]
        drawn += int(c.replace(",", ""))
    internal = int((s.group[np.repeat(np.arange(g.n_tasks), np.diff(g.ptr))] == s.group[g.succ]).sum())
    assert drawn + internal == edges


# ------------------------------------------------------------------------------------------
# readable at 100% zoom
# ------------------------------------------------------------------------------------------

@pytest.mark.slow
@needs_dot
@pytest.mark.parametrize("name", [*REAL, *SYNTHETIC])
def test_drawing_is_readable(dumps, tmp_path, name):
    """Whatever the graph's size: the page fits 60 x 36 in, no text is under 10 pt at 100% zoom
    (after graphviz's scaling), a drawing wider than a screen is not a strip, small graphs are
    drawn task by task and the title says what was summarized."""
    path = dumps[name]
    tasks, _ = counts(path)
    t0 = time.perf_counter()
    svg = Path(viz.visualize(path, tmp_path / f"{name}.svg"))
    assert time.perf_counter() - t0 < 60
    w, h, font = svg_page(svg)
    assert w <= PAGE_PT[0] and h <= PAGE_PT[1], f"{name}: {w:.0f} x {h:.0f} pt"
    assert font >= MIN_FONT_PT, f"{name}: {font:.1f} pt text"
    if w > SCREEN_W_PT:
        assert max(w / h, h / w) <= MAX_ASPECT, f"{name}: {w:.0f} x {h:.0f} pt"
    # what draw() reports of the same drawing (its DOT text, laid out again)
    d = viz.draw(path, tmp_path / f"{name}.dot")
    assert (d.width_in * 72, d.height_in * 72) == pytest.approx((w, h), abs=1.5)
    assert d.measured and d.note is None
    text = svg.read_text()
    if name in PER_TASK:
        assert d.summary is None and text.count('class="node"') == tasks
    else:
        s = d.summary
        assert s is not None and d.texts[0].startswith(f"summarized: {tasks:,} tasks in {s.n_groups:,} groups")
        assert html_text(d.texts[0]) in text and "not drawn per task: " in text


def html_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@needs_dot
def test_the_693_task_graph_is_no_longer_a_strip(dumps, tmp_path):
    """The issue's case: drawn per task, the 693-task graph was a 21 x 734 in strip. The per-task
    drawing is now refused by its estimated size, and the summary fits one screen."""
    pw, ph, _ = svg_page(Path(viz.visualize(dumps["fused2000"], tmp_path / "f.svg")))
    assert pw <= SCREEN_W_PT and ph <= 11.25 * 72
    g = viz.load_dump(dumps["fused2000"])
    w, h = viz.detail_size_in(g, viz.compute_levels(g.ptr, g.succ))
    assert h > 300 and w < 40  # the strip, estimated without drawing it
    d = viz.draw(dumps["fused2000"], tmp_path / "f.dot")
    assert d.summary is not None
    assert f"not drawn per task: it would be about {w:.0f} x {h:.0f} in, more than the 60 x 36 in page" in d.texts[-1]


@needs_dot
def test_rows_stack_top_to_bottom(dumps, tmp_path):
    d = viz.draw(dumps["pair"], tmp_path / "pair.svg")
    assert d.summary is not None and d.summary.rows >= 2
    root = ET.parse(d.path).getroot()
    tops = []
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "cluster":
            title = g.find(f"{SVG}title").text
            label = g.find(f"{SVG}text")
            tops.append((int(title.removeprefix("cluster_row")), float(label.get("y")),
                         int(re.match(r"levels (\d+)", label.text).group(1))))
    tops.sort()
    assert len(tops) == d.summary.rows
    assert [y for _, y, _ in tops] == sorted(y for _, y, _ in tops)  # SVG y grows downwards
    assert [lo for *_, lo in tops] == sorted(lo for *_, lo in tops)


@needs_dot
def test_max_nodes_is_honoured_or_the_note_says_why(dumps, tmp_path):
    path = dumps["split300"]
    # asked for up to 5,000 boxes: 325 tasks do not fit the page, so a summary and a note
    d = viz.draw(path, tmp_path / "a.svg", max_nodes=5000)
    assert d.summary is not None
    assert re.fullmatch(r"drew 325 tasks as \d+ groups, not one box per task as max_nodes = 5,000 allows: it "
                        r"would be about \d+ x \d+ in, more than the 60 x 36 in page that keeps 10 pt text "
                        r"readable at 100% zoom", d.note)
    # without a limit the same summary needs no note (the title says what was summarized)
    assert viz.draw(path, tmp_path / "b.svg").note is None
    # a larger page honours it: one box per task, measured within that page
    d = viz.draw(path, tmp_path / "c.svg", max_nodes=5000, page=(150, 80))
    assert d.summary is None and d.note is None
    w, h, font = svg_page(Path(d.path))
    assert 60 * 72 < w <= 150 * 72 and h <= 80 * 72 and font >= MIN_FONT_PT
    # fewer groups than InCore functions cannot be drawn: said, not silently ignored
    d = viz.draw(dumps["llama"], tmp_path / "d.svg", max_nodes=3)
    g = viz.load_dump(dumps["llama"])
    assert d.summary.n_groups == len(g.base_names) > 3
    assert d.note == (f"drew {len(g.base_names)} groups, more than max_nodes = 3: one per InCore function is the "
                      "coarsest summary")


def test_summarized_mode_real_graph_beyond_max_nodes(dumps, tmp_path):
    path = dumps["split"]
    tasks, _ = counts(path)
    assert tasks > 2000
    g = viz.load_dump(path)
    text, s = viz.to_dot(g, max_nodes=2000)
    assert s is not None and s.n_groups <= 2000 and s.work <= viz.LAYOUT_BUDGET
    assert f"summarized: {tasks:,} tasks in {s.n_groups:,} groups" in text
    assert "not drawn per task: more than max_nodes = 2,000 tasks" in text
    if HAVE_DOT:
        t0 = time.perf_counter()
        out = viz.visualize(path, tmp_path / "split.pdf")
        assert time.perf_counter() - t0 < 60
        assert Path(out).read_bytes().startswith(b"%PDF-")


# ------------------------------------------------------------------------------------------
# files and errors
# ------------------------------------------------------------------------------------------

@needs_dot
def test_rendered_files_are_valid(dumps, tmp_path):
    path = dumps["llama"]
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
    # dot text is the text that the other formats render
    d = viz.draw(path, tmp_path / "g.gv")
    assert d.fmt == "dot" and Path(d.path).read_text().startswith("digraph taskgraph {")


def test_dot_format_needs_no_graphviz(dumps, tmp_path, monkeypatch):
    path = dumps["softmax"]
    tasks, _ = counts(path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no `dot` to find
    d = viz.draw(path, tmp_path / "g.dot")
    text = Path(d.path).read_text()
    assert text.startswith("digraph taskgraph {") and f"{tasks} tasks" in text
    assert not d.measured and d.width_in > 0
    with pytest.raises(PTOError, match="--format dot"):
        viz.visualize(path, tmp_path / "g.pdf")
    assert not (tmp_path / "g.pdf").exists()


def _garble(src: Path, dst: Path) -> Path:
    lines = src.read_text().splitlines()
    k = next(i for i, ln in enumerate(lines) if ln.startswith("TASK"))
    lines[k] = lines[k].replace("TASK", "TASK x", 1)
    dst.write_text("\n".join(lines) + "\n")
    return dst


def test_format_and_input_errors(dumps, tmp_path):
    path = dumps["softmax"]
    with pytest.raises(UsageError, match="unknown format"):
        viz.visualize(path, tmp_path / "x.pdf", fmt="jpg")
    with pytest.raises(UsageError, match="cannot tell the format"):
        viz.visualize(path, tmp_path / "x.jpg")
    with pytest.raises(UsageError, match="does not exist"):
        viz.visualize(path, tmp_path / "no" / "x.dot")
    with pytest.raises(UsageError, match="cannot read"):
        viz.visualize(tmp_path / "missing.txt", tmp_path / "x.dot")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(UsageError, match="max_nodes"):
            viz.visualize(path, tmp_path / "x.dot", max_nodes=bad)
    for page in ((0.5, 10), (10,), "60x36", (float("inf"), 10)):
        with pytest.raises(UsageError, match="page"):
            viz.visualize(path, tmp_path / "x.dot", page=page)
    assert viz.parse_page("80x45") == (80.0, 45.0)
    with pytest.raises(UsageError, match="WIDTHxHEIGHT"):
        viz.parse_page("80 by 45")
    bad = tmp_path / "dangling.txt"
    bad.write_text("PTO-TASKGRAPH 1\nFUNC 0 f\nTASK 0 0 64 0 1 7\nEND 1 1\n")
    with pytest.raises(ParseError, match="successor 7"):
        viz.load_dump(bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.txt"]


def test_output_is_never_the_dump(dumps, tmp_path):
    """The dump itself as the output, by the same path, another spelling, a symbolic or a hard
    link: refused before the dump is read (a garbled dump gives this error, not a parse error),
    and the dump is untouched."""
    dump = _garble(dumps["llama"], tmp_path / "g.txt")
    before = dump.read_bytes()
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.gv").symlink_to(dump)
    os.link(dump, tmp_path / "hard.gv")
    for out, fmt in ((dump, "dot"), (dump, "pdf"), (tmp_path / "sub" / ".." / "g.txt", "dot"),
                     (tmp_path / "link.gv", None), (tmp_path / "hard.gv", None)):
        with pytest.raises(UsageError, match=r"is the dump .* itself: drawing it would overwrite the input"):
            viz.visualize(dump, out, fmt=fmt)
        assert dump.read_bytes() == before
    # the same check when the dump does not exist yet
    with pytest.raises(UsageError, match="itself"):
        viz.visualize(tmp_path / "none.txt", tmp_path / "sub" / ".." / "none.txt", fmt="dot")


def test_output_checked_before_the_dump_is_read(dumps, tmp_path):
    dump = _garble(dumps["llama"], tmp_path / "g.txt")
    with pytest.raises(UsageError, match="folder .* does not exist"):
        viz.visualize(dump, tmp_path / "no" / "x.pdf")
    (tmp_path / "dir.pdf").mkdir()
    with pytest.raises(UsageError, match="it is a folder"):
        viz.visualize(dump, tmp_path / "dir.pdf")
    with pytest.raises(UsageError, match="the output path is empty"):
        viz.visualize(dump, "")
    with pytest.raises(ParseError):  # a writable output: now the dump is read
        viz.visualize(dump, tmp_path / "x.pdf")
    assert not (tmp_path / "x.pdf").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_output_folder(dumps, tmp_path):
    dump = _garble(dumps["llama"], tmp_path / "g.txt")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(UsageError, match="takes no files there"):
            viz.visualize(dump, locked / "x.pdf")
    finally:
        locked.chmod(0o700)


# ------------------------------------------------------------------------------------------
# command lines
# ------------------------------------------------------------------------------------------

COMMANDS = pytest.mark.parametrize("command", [
    [sys.executable, "-m", "pto.cli", "visualize"],
    [sys.executable, str(ROOT / "tools" / "visualize_taskgraph.py")],
], ids=["pto-visualize", "tools-script"])


@pytest.mark.slow
@COMMANDS
def test_command_lines(dumps, tmp_path, command):
    path = dumps["llama"]
    out = tmp_path / ("g.pdf" if HAVE_DOT else "g.dot")
    r = subprocess.run([*command, str(path), str(out)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out) and r.stderr == ""
    assert out.read_bytes()[:5] == (b"%PDF-" if HAVE_DOT else b"digra")
    garbled = _garble(path, tmp_path / "garbled.txt")
    r = subprocess.run([*command, str(garbled), str(tmp_path / "h.pdf")], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert str(garbled) in lines[0] and re.search(r"line \d+", lines[0])
    assert not (tmp_path / "h.pdf").exists()
    # the dump as its own output: refused in one line, the input untouched
    before = path.read_bytes()
    r = subprocess.run([*command, str(path), str(path), "--format", "dot"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "itself" in r.stderr
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["garbled.txt", out.name])


@needs_dot
def test_tools_script_prints_the_note(dumps, tmp_path):
    out = tmp_path / "g.svg"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "visualize_taskgraph.py"), str(dumps["split300"]),
                        str(out), "--max-nodes", "5000"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == str(out)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("visualize_taskgraph: note: drew 325 tasks as ")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "visualize_taskgraph.py"), str(dumps["split300"]),
                        str(out), "--max-nodes", "5000", "--page", "150x80"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stderr == ""
    assert svg_page(out)[0] > 60 * 72  # per task, on the larger page


def test_pto_run_dump_is_drawn(tmp_path):
    """A dump written now by ``pto run`` (not a checked-in one) draws within the criteria."""
    dump = tmp_path / "llama.txt"
    r = subprocess.run([sys.executable, "-m", "pto.cli", "run", "llama7b", "--seq", "64", "--device", "cpu",
                        "--dump", str(dump)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = viz.draw(dump, tmp_path / ("llama.svg" if HAVE_DOT else "llama.dot"))
    assert d.summary is None and d.n_tasks == counts(dump)[0]
    if HAVE_DOT:
        w, h, font = svg_page(Path(d.path))
        assert w <= PAGE_PT[0] and h <= PAGE_PT[1] and font >= MIN_FONT_PT
