"""Progress of long work on stderr, and how long a run will take.

On a terminal a tqdm bar appears only when the caller asks for one (the command line does, unless
``--json``), and only once the work has run for a second, so short runs stay quiet. When stderr
is not a terminal (a log file, a pipe) there is no bar to redraw: :func:`reporter` prints a line
every ``PTO_PROGRESS_S`` seconds instead (default 10; 0 turns the lines off), the first once the
work has run that long, ``--json`` or not (stdout still holds only the JSON object). Each names the
phase that is running (:meth:`ProgressLines.phase`: compiling, building the graph, making the
inputs, executing, checking), with the counts of the phases that have them::

    pto: llama7b: compiling the runtime and the generated C: 10 s elapsed
    pto: llama7b: executing: 1,234/5,678 tasks (22%), 40 s elapsed, ~2 min left

Library calls take an optional callback instead and print nothing themselves.

:func:`exec_estimate_s` is the rough cost model behind the warning ``pto run`` prints before a
long execution and the estimate ``pto graph`` reports (docs/PERF.md, "How long a run takes").
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

#: seconds between two progress lines when stderr is not a terminal (``PTO_PROGRESS_S``)
LINE_INTERVAL_S = 10.0

#: (seconds per task, flop per second) of an execution by (device, backend): a per-task cost
#: (dispatch, the batched evaluator's Python) and the program's flops at a sustained rate.
#: Measured with the llama7b layer (docs/PERF.md, "How long a run takes"); right within a factor
#: of about 3, enough to tell a minute from an hour
EXEC_COST = {
    ("cpu", "torch"): (0.02, 1.0e9),
    ("cpu", "c"): (2.0e-5, 5.0e10),  # the native executor: the 7B layer at seq 1024, 6-10 s on 2 shared cores
    ("cpu", "triton"): (0.03, 1.0e7),  # the Triton interpreter
    ("cuda", "torch"): (1.0e-3, 5.0e13),
    ("cuda", "triton"): (2.0e-5, 2.0e14),
}
#: an execution estimated to take at least this long is announced before it starts
LONG_RUN_S = 60.0


def wanted(json_output: bool) -> bool:
    """The command line's rule for bars: on a terminal, never with ``--json``."""
    return not json_output and sys.stderr.isatty()


def exec_estimate_s(tasks: int, flops: float, device: str, backend: str) -> float | None:
    """Seconds an execution of ``tasks`` tasks and ``flops`` floating-point operations takes on
    ``device`` with ``backend`` by :data:`EXEC_COST` (None for a pair it has no numbers for)."""
    cost = EXEC_COST.get((device, backend))
    if cost is None:
        return None
    per_task, rate = cost
    return tasks * per_task + flops / rate


def estimate_run_s(job, shape, tasks: int) -> float | None:
    """:func:`exec_estimate_s` of a graph of ``tasks`` tasks of ``job`` (a
    :class:`pto.engine.Job`) at ``shape`` (a :class:`pto.program.Shape`)."""
    return exec_estimate_s(tasks, job.program.flops(job.settings, shape), job.device, job.backend)


def long_run_warning(job, shape, tasks: int) -> str | None:
    """One line announcing an execution of ``job`` at ``shape`` (``tasks`` tasks) estimated to
    take :data:`LONG_RUN_S` or more; None for a shorter one."""
    est = estimate_run_s(job, shape, tasks)
    if est is None or est < LONG_RUN_S:
        return None
    flops = job.program.flops(job.settings, shape)
    work = f"{tasks:,} tasks" + (f", {flops / 1e9:,.0f} GFLOP" if flops >= 1e9 else "")
    return (f"warning: {job.program.name} at {shape} (config {job.settings.config}; {work}) may take about "
            f"{human_duration(est, rough=True)} on {job.device} with the {job.backend} backend (a rough estimate); "
            f"a smaller {job.program.swept.flag} or --config is faster")


def human_duration(seconds: float, rough: bool = False) -> str:
    """``40 s``, ``1 min 25 s``, ``12 min``, ``2.5 h``; ``rough`` (an estimate): whole minutes
    from a minute up."""
    s = max(round(seconds), 1)
    if s < 60:
        return f"{s} s"
    if s < 600 and not rough:
        return f"{s // 60} min" + (f" {s % 60} s" if s % 60 else "")
    if s < 90 * 60:
        return f"{round(s / 60)} min"
    return f"{s / 3600:.1f} h"


def line_interval() -> float:
    """``PTO_PROGRESS_S`` in seconds (:data:`LINE_INTERVAL_S` when unset); 0 or less: no lines.
    A value that is not a number is reported once and the default used."""
    text = os.environ.get("PTO_PROGRESS_S", "").strip()
    if not text:
        return LINE_INTERVAL_S
    try:
        return float(text)
    except ValueError:
        print(f"pto: PTO_PROGRESS_S={text!r} is not a number of seconds; a line every "
              f"{LINE_INTERVAL_S:g} s", file=sys.stderr)
        return LINE_INTERVAL_S


class _Bar:
    """``update(done, total)`` and :meth:`phase` of a tqdm bar."""

    def __init__(self, desc: str, unit: str):
        from tqdm import tqdm

        self.desc = desc
        self.pbar = tqdm(desc=desc, unit=unit or "it", file=sys.stderr, delay=1.0, leave=False, dynamic_ncols=True)

    def __call__(self, done: int, total: int) -> None:
        if self.pbar.total != total:
            self.pbar.total = total
        self.pbar.n = done
        self.pbar.refresh()

    def phase(self, name: str, unit: str | None = None) -> None:
        """The phase now running (the bar's description), its counts and their pace (the rate,
        the time left: tqdm's, from its start time) starting again."""
        self.pbar.set_description(f"{self.desc}: {name}", refresh=False)
        if unit is not None:
            self.pbar.unit = unit
        self.pbar.total = None
        self.pbar.reset()  # the count, the start time and the smoothed rate


@contextmanager
def bar(desc: str, enabled: bool, unit: str = "task"):
    """A context giving ``update(done, total)`` with a ``phase(name)`` method (None when disabled)."""
    if not enabled:
        yield None
        return
    update = _Bar(desc, unit)
    try:
        yield update
    finally:
        update.pbar.close()


class ProgressLines:
    """``update(done, total)`` for a log: a thread prints where the work stands every
    ``interval`` seconds (whether or not a task finished since), until :meth:`stop`. ``desc``
    heads every line; :meth:`phase` names the part of the work now running (counted in ``unit``,
    or not counted when None). A line gives the time since the work began; the time left, at the
    pace of the phase's counts since the phase began (``clock``: seconds, monotonic)."""

    def __init__(self, desc: str, interval: float, unit: str | None = "task", stream=None,
                 clock=time.monotonic):
        self.desc, self.interval, self.unit = desc, interval, unit
        self.stream = stream if stream is not None else sys.stderr
        self.state: tuple[int, int] | None = None
        self.phase_name: str | None = None
        self.clock = clock
        self.start = self.since = clock()  # the work's start; the phase's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pto-progress", daemon=True)
        self._thread.start()

    def __call__(self, done: int, total: int) -> None:
        self.state = (done, total)

    def phase(self, name: str, unit: str | None = None) -> None:
        """The phase now running: the lines name it, and its counts (in ``unit``) and their pace
        start again."""
        self.phase_name, self.unit, self.state, self.since = name, unit, None, self.clock()

    def line(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        elapsed = now - self.start
        head = f"pto: {self.desc}: " + (f"{self.phase_name}: " if self.phase_name else "")
        if self.unit is None:
            return f"{head}{human_duration(elapsed)} elapsed"
        if self.state is None or not self.state[1]:
            return f"{head}{human_duration(elapsed)} elapsed, no {self.unit} finished yet"
        done, total = self.state
        text = f"{head}{done:,}/{total:,} {self.unit}s ({100 * done // total}%), {human_duration(elapsed)} elapsed"
        if 0 < done < total:  # the phase's pace so far (not the compile's and the build's before it)
            text += f", ~{human_duration((now - self.since) * (total - done) / done, rough=True)} left"
        return text

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            print(self.line(), file=self.stream, flush=True)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def reporter(desc: str, json_output: bool, unit: str | None = "task"):
    """The command line's progress of long work: a bar on a terminal (none with ``--json``),
    timed lines when stderr is not a terminal (:class:`ProgressLines`), or None. Both take
    ``update(done, total)`` and ``update.phase(name, unit)``."""
    if sys.stderr.isatty():
        with bar(desc, not json_output, unit) as update:
            yield update
        return
    interval = line_interval()
    if interval <= 0:
        yield None
        return
    lines = ProgressLines(desc, interval, unit)
    try:
        yield lines
    finally:
        lines.stop()


class _UntilOutput:
    """A text stream that stops the status of the work before it at its first write."""

    def __init__(self, stream, stop):
        self._stream, self._stop = stream, stop

    def write(self, text: str) -> int:
        if text:
            self._stop()
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


#: how often a terminal's status line before the first output is redrawn (seconds)
STATUS_S = 1.0


@contextmanager
def until_output(desc: str, stream, what: str):
    """``stream`` (a text file, or None: nothing shown), wrapped so that until its first write
    the work before it shows on stderr: on a terminal a status line (``pto: DESC: WHAT, 12 s``)
    redrawn every :data:`STATUS_S` seconds and erased at the first write; else such a line every
    ``PTO_PROGRESS_S`` seconds. Only on rank 0 of a torchrun launch (the others print nothing)."""
    tty = sys.stderr.isatty()
    interval = STATUS_S if tty else line_interval()
    if stream is None or os.environ.get("RANK", "0") != "0" or interval <= 0:
        yield stream
        return
    done, lock, start = threading.Event(), threading.Lock(), time.monotonic()
    shown = []

    def loop() -> None:
        while not done.wait(interval):
            with lock:
                if done.is_set():
                    return
                msg = f"pto: {desc}: {what}, {human_duration(time.monotonic() - start)}"
                sys.stderr.write(f"\r{msg}\x1b[K" if tty else f"{msg}\n")
                sys.stderr.flush()
                shown.append(True)

    def stop() -> None:
        if done.is_set():
            return
        with lock:
            done.set()
            if tty and shown:
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()

    threading.Thread(target=loop, name="pto-status", daemon=True).start()
    try:
        yield _UntilOutput(stream, stop)
    finally:
        stop()


def iterate(items, desc: str, enabled: bool, unit: str = "item"):
    """``items``, with a bar when enabled."""
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit=unit, file=sys.stderr, delay=1.0, leave=False, dynamic_ncols=True)


__all__ = ["wanted", "bar", "reporter", "ProgressLines", "iterate", "until_output", "exec_estimate_s", "estimate_run_s",
           "long_run_warning", "human_duration", "line_interval", "EXEC_COST", "LONG_RUN_S", "LINE_INTERVAL_S"]
