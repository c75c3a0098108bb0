"""``--plot`` of ``pto estimate`` and ``pto bench``: a figure a person reads at 100% on a screen.

Measured on the figure objects the plotting functions return: panels of at least matplotlib's
default figure size at 100 dpi, no text under 10 pt, legend labels that say only which line is
which (the settings are in the title), and every text, legend and panel inside the image. On the
command line: the file is written and one line on stdout names it (with ``--json``, the JSON
object names it instead)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pto.errors import UsageError
from pto.viz.plotting import MAX_LABEL

pytest.importorskip("matplotlib")


def pto(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "pto.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def check_readable(fig, panels: int) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the figure comes back closed: draw it again as it was saved
    canvas.draw()
    renderer = canvas.get_renderer()
    page = fig.bbox
    assert fig.dpi == 100
    assert len(fig.axes) == panels
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        assert box.width >= 400 and box.height >= 300, "a squashed panel"
        whole = ax.get_tightbbox(renderer)  # the panel with its labels, title and legend
        assert whole.x0 >= page.x0 - 1 and whole.y0 >= page.y0 - 1, whole
        assert whole.x1 <= page.x1 + 1 and whole.y1 <= page.y1 + 1, whole
        legend = ax.get_legend()
        assert legend is not None
        lb = legend.get_window_extent(renderer)
        assert page.x0 <= lb.x0 and lb.x1 <= page.x1 and page.y0 <= lb.y0 and lb.y1 <= page.y1
        for t in legend.get_texts():
            assert 0 < len(t.get_text()) <= MAX_LABEL, t.get_text()
            assert t.get_fontsize() >= 10
        for t in (ax.xaxis.label, ax.yaxis.label, ax.title, *ax.get_xticklabels(), *ax.get_yticklabels()):
            assert t.get_fontsize() >= 10
    title = fig.get_suptitle()
    assert title
    tb = fig._suptitle.get_window_extent(renderer)
    assert page.x0 <= tb.x0 and tb.x1 <= page.x1 and tb.y1 <= page.y1 + 1, (tb, page)
    assert fig._suptitle.get_fontsize() >= 10


def test_estimate_plot_is_readable(tmp_path):
    from pto.cli.commands.estimate import estimate, plot
    from pto.engine import resolve

    job = resolve("llama7b", device="cpu", config="7b", dtype="bf16", target="cuda_h100")
    seqs = [1024, 4096, 16384]
    res = estimate(job.program, seqs, settings=job.settings)
    baselines = [(b, estimate(job.program, seqs, settings=b.settings))
                 for b in job.program.estimate_baselines(job.settings)]
    path = tmp_path / "est.png"
    fig = plot(res, str(path), baselines)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    check_readable(fig, 2)
    title = fig.get_suptitle()
    # the settings moved from the legend to the title: this setting's and the baseline's
    assert "cuda_h100, bf16" in title and "attention=fused" in title
    assert "seed setting: ascend910b, f32" in title and "attention=split" in title and "2,864 B/task" in title
    labels = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
    assert "ours, adaptive tiles" in labels and "seed setting, published" in labels


@pytest.mark.parametrize("settings,same", [pytest.param(dict(config="7b", device="cpu"), False, marks=pytest.mark.slow),
                                           (dict(config="7b", dtype="bf16", target="cuda_h100"), True)])
def test_estimate_plot_names_its_axes_and_shows_both_task_lines(tmp_path, settings, same):
    """Issue 43, item 1: the axes and the title name the sequence length (the baseline's runtime
    name, "seed runtime", had taken its place), and the tasks without adaptive tiles stay visible
    where they equal those with them (tiles too tall to merge on an H100 in bf16), said in the legend."""
    from pto.cli.commands.estimate import estimate, plot
    from pto.engine import resolve

    job = resolve("llama7b", **settings)
    res = estimate(job.program, [1024, 4096], settings=job.settings)
    baselines = [(b, estimate(job.program, [1024, 4096], settings=b.settings))
                 for b in job.program.estimate_baselines(job.settings)]
    fig = plot(res, str(tmp_path / "est.png"), baselines)
    assert [ax.get_xlabel() for ax in fig.axes] == ["sequence length"] * 2
    assert fig.get_suptitle().splitlines()[0] == "llama7b (config 7b): the task graph against sequence length"
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    tasks = [r["tasks"] for r in res["rows"]]
    plain = [r["tasks_no_adaptive"] for r in res["rows"]]
    assert (tasks == plain) == same
    mine = lines["ours, adaptive tiles"]
    other = lines["ours, no adaptive tiles" + (" (the same tasks)" if same else "")]
    assert list(mine.get_ydata()) == tasks and list(other.get_ydata()) == plain
    # a hollow, larger marker of another shape: visible on top of the other line's
    assert other.get_marker() != mine.get_marker() and other.get_markerfacecolor() == "none"
    assert other.get_markersize() > mine.get_markersize()


def test_bench_plot_is_readable(tmp_path):
    from pto.cli.commands.bench import Timing, bench, plot

    res = bench("softmax", [64, 128], compare=("eager",), timing=Timing(iterations=2, warmup=0), device="cpu")
    fig = plot(res, str(tmp_path / "b.png"))
    check_readable(fig, 1)
    assert "config tiny, f32" in fig.get_suptitle()


@pytest.mark.slow
def test_estimate_says_where_the_plot_is(tmp_path):
    png = tmp_path / "est.png"
    r = pto("estimate", "softmax", "--seq", "256,1024", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"wrote the plot {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    png.unlink()
    r = pto("estimate", "softmax", "--seq", "256,1024", "--plot", str(png), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["plot"] == str(png)  # stdout: the JSON object and nothing else
    assert png.is_file()


def test_bench_says_where_the_plot_is(tmp_path):
    png, js = tmp_path / "b.svg", tmp_path / "b.json"
    r = pto("bench", "softmax", "--device", "cpu", "--seq", "64", "--compare", "eager", "--iterations", "2",
            "--warmup", "0", "--plot", str(png), "--json", str(js))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"wrote the plot {png}"
    assert "<svg" in png.read_text()
    assert json.loads(js.read_text())["plot"] == str(png)


def test_bench_times_an_executor_once_when_auto_resolves_to_one_asked_for_by_name():
    """``--executor auto,waves`` where auto means waves (the torch backend on the CPU; the model
    program on a GPU): one column, not a second run writing over the first."""
    from pto.cli.commands.bench import Timing, bench

    res = bench("softmax", [64], executors=("auto", "waves"), compare=(), timing=Timing(iterations=1, warmup=0),
                device="cpu", backend="torch")
    assert res["executors"] == ["waves"] and "waves_ms" in res["rows"][0]


def test_bench_rounds_time_every_method_in_turn():
    """``rounds``: each method's runs in turn, round after round (sample ``i`` of round ``r`` at
    ``i * rounds + r``), every method warmed first; the row has each method's spread."""
    from pto.cli.commands.bench import Timing, bench, format_table, interleaved

    calls = []
    timers = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    ms = interleaved(timers, Timing(iterations=2, warmup=1, rounds=3), cuda=False)
    assert "".join(calls) == "ab" + "aabb" * 3
    assert {k: len(v) for k, v in ms.items()} == {"a": 6, "b": 6} and min(ms["a"] + ms["b"]) >= 0
    res = bench("softmax", [64], compare=("eager",), timing=Timing(iterations=2, warmup=0, rounds=3), device="cpu",
                backend="torch")
    row = res["rows"][0]
    assert res["rounds"] == 3 and row["waves_spread"] >= 0 and row["eager_spread"] >= 0
    ratios = sorted(e / w for e, w in zip(row["eager_rounds"], row["waves_rounds"]))
    # the rounds' medians are rounded to 4 decimals and the ratio to 3 (the ratio is of the unrounded
    # medians: 22.7 against 22.699 from the rounded ones failed a fresh clone's suite, issue 43)
    tol = ratios[1] * 0.5e-4 * (1 / min(row["waves_rounds"]) + 1 / min(row["eager_rounds"])) + 0.5e-3
    assert len(row["waves_rounds"]) == 3 and row["waves_vs_eager"] == pytest.approx(ratios[1], abs=tol)
    last = format_table(res).splitlines()[-1]
    assert last.startswith("spread between rounds") and f"waves {row['waves_spread']:.0%}-" in last
    with pytest.raises(UsageError, match="--rounds"):
        bench("softmax", [64], compare=(), timing=Timing(rounds=0), device="cpu")
