"""``pto graph``: the task graph a run builds, dumped and drawn without executing it.

The dump it writes is byte for byte the dump ``pto run --dump`` writes for the same program and
options; it never makes an executor or the run's tensors (a tripwire on both, which ``pto run``
trips), so a graph whose execution takes half an hour on a CPU is dumped in seconds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from pto.cli import main
from pto.runtime.dump import read_dump

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed")


def pto(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "pto.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["llama7b", "--seq", "100", "--attention", "pair", "--no-causal"],
    ["bgemm", "--seq", "70"],
])
def test_the_dump_is_the_one_run_writes(tmp_path, args):
    built, ran = tmp_path / "graph.txt", tmp_path / "run.txt"
    g = pto("graph", *args, "--dump", str(built), "--json")
    r = pto("run", *args, "--dump", str(ran), "--json")
    assert g.returncode == 0 and r.returncode == 0, g.stderr + r.stderr
    assert built.read_text() == ran.read_text()
    gj, rj = json.loads(g.stdout), json.loads(r.stdout)
    assert (gj["tasks"], gj["edges"]) == (rj["tasks"], rj["edges"])
    dump = read_dump(built)
    assert len(dump.tasks) == gj["tasks"] and dump.n_edges == gj["edges"]
    assert gj["dump"] == str(built) and "exec_ms" not in gj and "executor" not in gj
    for key in ("program", "seq", "config", "dtype", "target", "device", "backend", "build_ms", "exec_estimate_s"):
        assert key in gj


@pytest.fixture
def tripwire(monkeypatch):
    """Executors and the run's tensors refuse to be made."""
    import pto.data.buffers
    import pto.exec.base

    def refuse(*args, **kwargs):
        raise AssertionError("tripwire: an executor or the run's tensors were made")

    monkeypatch.setattr(pto.exec.base.Executor, "__init__", refuse)
    monkeypatch.setattr(pto.data.buffers, "allocate", refuse)


def test_a_graph_whose_run_takes_long_is_dumped_without_executing(tripwire, tmp_path, capsys):
    """LLaMA-7B's layer at 4,096 tokens on the CPU: half a minute of native execution (about half
    an hour with the torch backend, issue 20), here a graph built and dumped with neither an
    executor nor a tensor."""
    dump = tmp_path / "7b.txt"
    rc = main(["graph", "llama7b", "--config", "7b", "--seq", "4096", "--device", "cpu", "--dump", str(dump),
               "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    res = json.loads(out.out)
    assert res["tasks"] == 2816 and res["edges"] == 68608
    assert res["exec_estimate_s"] > 10  # the cost model's seconds, reported instead of spent
    assert len(read_dump(dump).tasks) == 2816
    # the tripwire catches what a run makes
    assert main(["run", "softmax", "--seq", "64"]) == 3
    assert "tripwire" in capsys.readouterr().err


def test_the_text_report(tmp_path):
    r = pto("graph", "llama7b", "--config", "7b", "--seq", "4096", "--device", "cpu", "--dump", str(tmp_path / "d.txt"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("llama7b seq=4096 config=7b dtype=f32")
    assert lines[1].startswith("tasks 2,816  edges 68,608  build ") and lines[1].endswith("not executed")
    assert lines[2].startswith("executing it would take about ") and " on cpu with the c backend" in lines[2]
    assert lines[3] == f"wrote the dump {tmp_path / 'd.txt'}"


@needs_dot
def test_draw_without_a_dump(tmp_path):
    svg = tmp_path / "g.svg"
    r = pto("graph", "llama7b", "--seq", "100", "--draw", str(svg))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"wrote the drawing {svg}"
    text = svg.read_text()
    assert "<svg" in text and "rmsnorm" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.svg"]  # no dump left behind


@needs_dot
def test_dump_and_draw_as_json(tmp_path):
    r = pto("graph", "softmax", "--seq", "300", "--dump", str(tmp_path / "d.txt"), "--draw", str(tmp_path / "d.pdf"),
            "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["drawing"] == str(tmp_path / "d.pdf") and res["dump"] == str(tmp_path / "d.txt")
    assert (tmp_path / "d.pdf").read_bytes()[:5] == b"%PDF-"


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["--dump", "/nonexistent/d.txt"], "--dump /nonexistent/d.txt: the folder /nonexistent does not exist"),
    (["--draw", "/nonexistent/g.pdf"], "folder /nonexistent does not exist"),
    (["--draw", "{tmp}/g.bmp"], "cannot tell the format from"),
    (["--dump", "{tmp}/same", "--draw", "{tmp}/same"], "--dump and --draw are the same file"),
    (["--attention", "pair"], "unrecognized arguments: --attention pair"),
    (["--seq", "0"], "--seq: must be positive"),
])
def test_user_errors_are_one_line_before_any_work(tmp_path, args, needle):
    r = pto("graph", "softmax", *[a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 2
    err = r.stderr.strip()
    assert "\n" not in err and err.startswith("pto: error:") and needle in err, err
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


def test_help_names_the_command():
    r = pto("--help")
    assert "graph" in r.stdout or "graph" in r.stderr
    r = pto("graph", "llama7b", "--help")
    assert r.returncode == 0 and "--draw" in r.stdout and "--attention" in r.stdout
