"""Writing a drawing: the output format, checks of the output path before any work, and
graphviz's ``dot`` run in a subprocess.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from pto.errors import PTOError, UsageError
from pto.paths import can_write
from pto.viz.sizes import PAD_IN

FORMATS = ("pdf", "svg", "png", "dot")
# a safety net only: drawings that fit the page render in seconds
RENDER_TIMEOUT_S = 300


def resolve_format(out: str | Path, fmt: str | None) -> str:
    """``fmt`` if given, else from the suffix of ``out`` (``.gv`` is dot; none means pdf)."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise UsageError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
        return fmt
    suffix = Path(out).suffix.lower().lstrip(".")
    if not suffix:
        return "pdf"
    if suffix == "gv":
        return "dot"
    if suffix not in FORMATS:
        raise UsageError(f"cannot tell the format from {str(out)!r}; use a .pdf/.svg/.png/.dot name "
                         "(pto visualize also takes --format)")
    return suffix


def check_output(dump: str | Path, out: str | Path) -> Path:
    """Refuse, before any work, an output that cannot be written or that is the dump itself
    (same path, or the same file through a link or another path)."""
    if not str(out).strip():
        raise UsageError("the output path is empty")
    out = Path(out)
    same = (os.path.samefile(dump, out) if os.path.exists(dump) and os.path.exists(out)
            else os.path.realpath(dump) == os.path.realpath(out))
    if same:
        raise UsageError(f"output {out} is the dump {dump} itself: drawing it would overwrite the input")
    if out.is_dir():
        raise UsageError(f"cannot write {out}: it is a folder")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"cannot write {out}: folder {parent} does not exist")
    if not can_write(out):
        raise UsageError(f"cannot write {out}: the folder {parent} takes no files there")
    return out


def dot_binary() -> str:
    """Path of graphviz's ``dot``, or a PTOError saying how to do without it."""
    exe = shutil.which("dot")
    if exe is None:
        raise PTOError("graphviz's `dot` program is not installed (e.g. apt-get install graphviz); "
                       "--format dot writes the DOT text without it")
    return exe


def run_dot(exe: str, dot_text: str, fmt: str, folder: str) -> tuple[tuple[float, float], str | None]:
    """Lay out ``dot_text`` once, writing the layout (``-Tplain``) and, unless ``fmt`` is dot,
    the drawing into ``folder``. Returns the page size in inches and the drawing's path."""
    plain = os.path.join(folder, "layout.plain")
    drawing = None if fmt == "dot" else os.path.join(folder, f"drawing.{fmt}")
    cmd = [exe, "-Tplain", "-o", plain] + ([] if drawing is None else [f"-T{fmt}", "-o", drawing])
    try:
        r = subprocess.run(cmd, input=dot_text, capture_output=True, text=True, timeout=RENDER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PTOError(f"dot did not finish in {RENDER_TIMEOUT_S} s; use a smaller --max-nodes "
                       "or --format dot") from None
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        raise PTOError(f"dot -T{fmt} failed (exit {r.returncode}): {lines[0] if lines else 'no message'}")
    with open(plain, encoding="utf-8") as f:
        head = f.readline().split()  # "graph <scale> <width> <height>", inches without the margin
    return (float(head[2]) + 2 * PAD_IN, float(head[3]) + 2 * PAD_IN), drawing


def render(dot_text: str, out: str | Path, fmt: str) -> tuple[float, float] | None:
    """Write ``dot_text`` to ``out``, rendered with ``dot -T<fmt>`` unless ``fmt`` is dot; returns
    the page size in inches (None for dot text)."""
    out = Path(out)
    if not out.absolute().parent.is_dir():
        raise UsageError(f"cannot write {out}: folder {out.absolute().parent} does not exist")
    if fmt == "dot":
        out.write_text(dot_text)
        return None
    exe = dot_binary()
    with tempfile.TemporaryDirectory(prefix="pto-viz-") as tmp:
        size, drawing = run_dot(exe, dot_text, fmt, tmp)
        shutil.copyfile(drawing, out)
    return size
