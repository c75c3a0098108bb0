"""Long runs say so when stderr is a log: one warning line with the estimated time before a long
execution starts, then a progress line every ``PTO_PROGRESS_S`` seconds (10 by default); short
runs print nothing; stdout keeps only the JSON object with ``--json``. (The bar on a terminal:
tests/cli/test_cli.py.)"""

from __future__ import annotations

import io
import json
import os
import re
import select
import subprocess
import sys
import time

import pytest

from pto.cli.progress import ProgressLines, human_duration

#: a line of each phase of a run (issue 43: the phase is named, never "executing" before it runs)
PHASES = ("compiling the runtime and the generated C", "building the graph", "making the inputs",
          "checking against the torch reference")
LINE = re.compile(r"pto: llama7b: (executing: ((?P<done>[\d,]+)/([\d,]+) tasks \(\d+%\), [\w ]+ elapsed"
                  r"(, ~[\w ]+ left)?|[\w ]+ elapsed, no task finished yet)"
                  r"|(" + "|".join(PHASES) + r"): [\w ]+ elapsed|[\w ]+ elapsed)")


def _pto(args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "pto.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_a_run_into_a_log_prints_progress_lines():
    """stderr a pipe, a line every 0.02 s (the run takes about a second with the torch backend;
    natively a tenth of it, too short to count on a line): several lines, every one of the
    documented form, the counts among them; stdout the JSON object alone."""
    r = _pto(["run", "llama7b", "--seq", "1024", "--attention", "split", "--backend", "torch", "--json"],
             env={"PTO_PROGRESS_S": "0.02"})
    assert r.returncode == 0, r.stderr
    tasks = json.loads(r.stdout)["tasks"]
    lines = r.stderr.splitlines()
    assert lines, "no progress line"
    assert all(LINE.fullmatch(line) for line in lines), lines
    counted = [LINE.fullmatch(line) for line in lines if f"/{tasks:,} tasks" in line]
    assert counted and all(int(m.group("done").replace(",", "")) <= tasks for m in counted)


@pytest.mark.slow
def test_short_runs_and_turned_off_lines_print_nothing():
    r = _pto(["run", "softmax", "--json"])  # well under the default 10 s
    assert r.returncode == 0 and r.stderr == ""
    r = _pto(["run", "llama7b", "--seq", "256"], env={"PTO_PROGRESS_S": "0"})
    assert r.returncode == 0 and r.stderr == "" and "tasks 88" in r.stdout


def test_a_long_run_is_announced_before_it_executes():
    """LLaMA-7B's layer at 1,024 tokens on the CPU with the torch backend executes for minutes: the
    warning comes once the graph is built, before the inputs are made (the run is stopped there)."""
    proc = subprocess.Popen([sys.executable, "-m", "pto.cli", "run", "llama7b", "--config", "7b", "--seq", "1024",
                             "--device", "cpu", "--backend", "torch", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PTO_PROGRESS_S": "0"})
    try:
        # a first line within 4 minutes (the build takes seconds; the execution many minutes)
        ready, _, _ = select.select([proc.stderr], [], [], 240)
        assert ready, "nothing on stderr"
        first = proc.stderr.readline()
    finally:
        proc.kill()
        proc.communicate()
    assert first.startswith("pto: warning: llama7b at seq 1024 (config 7b; 704 tasks, "), first
    assert re.search(r"may take about \d+ min on cpu with the torch backend \(a rough estimate\); a smaller --seq",
                     first), first


def test_the_line_and_its_estimate():
    lines = ProgressLines("llama7b: executing", interval=3600)
    try:
        assert lines.line(now=lines.start + 3) == "pto: llama7b: executing: 3 s elapsed, no task finished yet"
        lines(1234, 5678)
        assert lines.line(now=lines.start + 40) == \
            "pto: llama7b: executing: 1,234/5,678 tasks (21%), 40 s elapsed, ~2 min left"
        lines(5678, 5678)
        assert lines.line(now=lines.start + 200) == \
            "pto: llama7b: executing: 5,678/5,678 tasks (100%), 3 min 20 s elapsed"
    finally:
        lines.stop()
    assert [human_duration(s) for s in (0.2, 59, 60, 125, 1900, 7200)] == ["1 s", "59 s", "1 min", "2 min 5 s",
                                                                          "32 min", "2.0 h"]
    assert human_duration(125, rough=True) == "2 min"


class _Clock:
    """A clock the test sets (seconds)."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_line_names_the_phase_that_runs():
    """Issue 43, item 7: the compile and the build are named as such (a fresh cache's compile was
    reported as "executing: 10 s elapsed, no task finished yet"); only a phase that counts says
    what it counted, and the time left is at the pace since the phase began."""
    clock = _Clock()
    lines = ProgressLines("llama7b", interval=3600, unit=None, clock=clock)
    try:
        clock.t += 1
        assert lines.line() == "pto: llama7b: 1 s elapsed"
        lines.phase("compiling the runtime and the generated C")
        clock.t += 11
        assert lines.line() == "pto: llama7b: compiling the runtime and the generated C: 12 s elapsed"
        clock.t += 1
        lines.phase("executing", "task")
        assert lines.line() == "pto: llama7b: executing: 13 s elapsed, no task finished yet"
        clock.t += 1
        lines(10, 20)  # 10 tasks in the phase's first second: one more second (not the 14 of the whole)
        assert lines.line() == "pto: llama7b: executing: 10/20 tasks (50%), 14 s elapsed, ~1 s left"
        lines.phase("checking against the torch reference")
        clock.t += 1
        assert lines.line() == "pto: llama7b: checking against the torch reference: 15 s elapsed"
    finally:
        lines.stop()


def test_the_time_left_of_a_long_run_is_the_executions():
    """A long run: 10 min of compiling and 1 min of building, then 10,000 tasks at 2 a second.
    The time left at every tenth is the time the simulated run still takes; extrapolating the
    whole elapsed time (compile included) said 2.9 h where 75 min were left, at a tenth."""
    clock = _Clock()
    lines = ProgressLines("llama7b", interval=3600, unit=None, clock=clock)
    try:
        lines.phase("compiling the runtime and the generated C")
        clock.t += 600
        lines.phase("building the graph")
        clock.t += 60
        lines.phase("executing", "task")
        began, total = clock.t, 10_000
        for done in range(1000, total, 1000):
            clock.t = began + done / 2
            lines(done, total)
            left = human_duration((total - done) / 2, rough=True)
            assert lines.line().endswith(f" elapsed, ~{left} left"), (done, lines.line())
        clock.t, done = began + 500, 1000
        lines(done, total)
        assert lines.line() == "pto: llama7b: executing: 1,000/10,000 tasks (10%), 19 min elapsed, ~75 min left"
    finally:
        lines.stop()


def test_the_bars_rate_is_the_phases(monkeypatch):
    """On a terminal the bar's rate and time left are tqdm's, from its start time: a phase starts
    them again, so ten minutes of compiling before do not slow the execution's rate."""
    from pto.cli.progress import bar

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with bar("llama7b", True) as update:
        update.phase("compiling the runtime and the generated C")
        update.pbar.start_t -= 600  # the compile took ten minutes
        update.phase("executing", "task")
        update(1000, 10_000)
        meter = update.pbar.format_dict
        assert meter["elapsed"] < 60 and meter["n"] == 1000 and meter["total"] == 10_000


@pytest.mark.slow
def test_a_first_run_on_a_fresh_cache_says_it_compiles(tmp_path):
    """A fresh cache compiles the runtime for seconds: the lines say so, and none says
    "executing" before the compile is over."""
    r = _pto(["run", "llama7b", "--seq", "64", "--json"], env={"PTO_PROGRESS_S": "0.2", "PTO_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert all(LINE.fullmatch(line) for line in lines), lines
    compiling = [k for k, line in enumerate(lines) if line.startswith(f"pto: llama7b: {PHASES[0]}: ")]
    assert compiling, lines
    assert not any(": executing: " in line for line in lines[:compiling[-1]]), lines


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tty", [False, True])
def test_the_status_before_the_first_output_stops_at_it(monkeypatch, tty):
    """``until_output``: until the wrapped stream's first write, a status on stderr (a line
    every PTO_PROGRESS_S seconds, or on a terminal one line redrawn, erased at the first write);
    nothing after it; nothing at all with no stream or on a rank other than 0."""
    from pto.cli.progress import until_output

    err, out = (_Tty() if tty else io.StringIO()), io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("PTO_PROGRESS_S", "0.05")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr("pto.cli.progress.STATUS_S", 0.05)
    ticks = 0.05
    with until_output("generate", out, "loading") as s:
        time.sleep(4 * ticks + 0.1)
        before = err.getvalue()
        s.write("Paris")
        time.sleep(3 * ticks)
        after = err.getvalue()
    assert out.getvalue() == "Paris"
    assert before.count("pto: generate: loading, ") >= 3
    if tty:
        assert "\n" not in after and before.startswith("\r") and after == before + "\r\x1b[K"
    else:
        assert after == before and all(line.startswith("pto: generate: loading, ") for line in after.splitlines())
    for stream, rank in ((None, "0"), (out, "1")):
        monkeypatch.setenv("RANK", rank)
        err.truncate(0)
        err.seek(0)
        with until_output("generate", stream, "loading") as s:
            time.sleep(2 * ticks)
            assert s is stream
        assert err.getvalue() == ""
