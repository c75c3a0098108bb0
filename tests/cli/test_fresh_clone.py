"""What a new user hit on a fresh clone (issue 43), each through the real entry point: usage
errors answered before torch is imported, Ctrl-C at any moment, outputs that cannot be written
found before any work, and the messages, labels and units of what the commands print."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: runs the command line's main function on argv and says which heavy modules the process holds
_MODULES_AFTER = """
import sys
from pto.cli.main import main
code = main(sys.argv[1:])
heavy = sorted(m for m in ("torch", "triton", "cffi", "pto.runtime", "pto.engine") if m in sys.modules)
print(code, ",".join(heavy) or "-")
"""


def pto(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "pto.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args,needle", [
    (["run", "llama7b", "--seq", "x"], "argument --seq: expected an integer, got 'x'"),
    (["run", "nosuch"], "unknown program 'nosuch'"),
    (["rn", "llama7b"], "invalid choice: 'rn'"),
    (["run", "llama7b", "--device", "gpu"], "argument --device: invalid choice: 'gpu'"),
    (["run", "softmax", "--backend", "trition"], "argument --backend: invalid choice: 'trition'"),
    (["estimate", "llama7b", "--seq", "1024,,4096"], "--seq '1024,,4096': an empty value between commas"),
    (["codegen", "llama7b"], "the following arguments are required: --out"),
    (["generate", "--max-new-tokens", "0"], "argument --max-new-tokens: must be positive, got 0"),
    (["info", "--jsn"], "unrecognized arguments: --jsn"),
])
def test_a_usage_error_is_answered_before_torch_is_imported(args, needle):
    """Issue 43, item 13: the command line is parsed and checked before torch, Triton or the
    runtime is imported (they took 2.5-3 s before a typo was answered)."""
    assert needle in _usage_error_before_torch(args)


def _usage_error_before_torch(args: list[str]) -> str:
    """The one line ``pto ARGS`` fails with, asserting that torch was never imported."""
    r = subprocess.run([sys.executable, "-c", _MODULES_AFTER, *args], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "-"], (r.stdout, r.stderr)
    err = r.stderr.strip()
    assert err.startswith("pto: error: ") and "\n" not in err and "Errno" not in err, err
    return err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc and /sys")
@pytest.mark.parametrize("args,needle", [
    (["codegen", "llama7b", "--out", "/proc/ptogen"], "--out /proc/ptogen: cannot write in its folder /proc"),
    (["codegen", "llama7b", "--out", "/sys/ptogen"], "--out /sys/ptogen: cannot write in its folder /sys"),
    (["run", "softmax", "--trace", "/proc/pto-trace.json"], "--trace /proc/pto-trace.json: cannot write there"),
    (["graph", "llama7b", "--dump", "/sys/pto-dump.txt"], "--dump /sys/pto-dump.txt: cannot write there"),
    (["bench", "softmax", "--device", "cpu", "--seq", "64", "--json", "/proc/pto.json"],
     "--json /proc/pto.json: cannot write there"),
])
def test_an_output_that_cannot_be_written_is_refused_before_any_work(args, needle):
    """Issue 43, item 4: tried, not asked (os.access says yes to root, and /proc takes nothing):
    one line naming what the user wrote (not a temporary name), before the program is loaded
    (codegen had built for 28 s before '[Errno 2] ... /proc/.ptogen.pto-...')."""
    err = _usage_error_before_torch(args)
    assert needle in err and ".pto-" not in err, err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_cache_folder_a_drawing_and_a_plot_that_cannot_be_written_are_one_line(tmp_path):
    """``PTO_CACHE_DIR`` under /proc, a drawing (``pto graph --draw``, ``pto visualize``) or a
    plot (``pto estimate --plot``) into /proc: one line each, exit 2, no errno, before the graph
    is built (they asked os.access, which says yes to root, until an audit found them: errno
    after the work)."""
    for args, line in ((["graph", "llama7b", "--draw", "/proc/pto.pdf"],
                        "cannot write /proc/pto.pdf: the folder /proc takes no files there"),
                       (["estimate", "llama7b", "--seq", "128", "--plot", "/proc/pto.png"],
                        "--plot /proc/pto.png: cannot write in folder '/proc'")):
        r = pto(*args, env={"PTO_PROGRESS_S": "0"})
        assert r.returncode == 2 and r.stderr == f"pto: error: {line}\n", r.stderr
    r = pto("run", "softmax", env={"PTO_CACHE_DIR": "/proc/pto-cache"})
    assert r.returncode == 2 and r.stderr.startswith("pto: error: PTO_CACHE_DIR=/proc/pto-cache: cannot write /proc")
    assert r.stderr.count("\n") == 1 and "Errno" not in r.stderr, r.stderr
    dump = tmp_path / "g.txt"
    assert pto("graph", "softmax", "--dump", str(dump)).returncode == 0
    r = pto("visualize", str(dump), "/proc/pto.pdf")
    assert r.returncode == 2
    assert r.stderr == "pto: error: cannot write /proc/pto.pdf: the folder /proc takes no files there\n", r.stderr


@pytest.mark.parametrize("tp", [2, 3])
def test_generate_with_tp_outside_torchrun_says_so_before_reading_the_model(tmp_path, tp):
    """Issue 43, item 5: the launch is checked before any file is read (``--tp 2`` reported
    SmolLM2's 9 heads after reading the model; here a file that is no model at all)."""
    junk = tmp_path / "model.gguf"
    junk.write_bytes(b"not a model")
    r = pto("generate", "--gguf", str(junk), "--prompt", "hi", "--tp", str(tp), "--device", "cpu")
    hint = f"start it with `torchrun --nproc-per-node {tp} -m pto.cli generate --tp {tp} ...`"
    assert r.returncode == 2 and r.stderr == f"pto: error: --tp {tp} runs one process per rank: {hint}\n", r.stderr


# -- Ctrl-C at any moment (item 6) ----------------------------------------------------------------

#: the child's Ctrl-C as under a terminal: a suite started as a background job of a shell
#: without job control runs with SIGINT ignored, which every child inherits (and pto keeps
#: ignored, as any program does), so these tests would interrupt nothing
_SIGINT_AS_A_TERMINALS = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
#: the real entry point (``python -m pto.cli``), run as ``python -m`` runs it
_PTO_CLI = _SIGINT_AS_A_TERMINALS + "import runpy; runpy.run_module('pto.cli', run_name='__main__', alter_sys=True)"
#: the real entry point with SIGINT sent from a thread of the process itself once ``sys.argv[1]``
#: is being imported: the moment is the module's import, whoever imports it
_INTERRUPT_WHEN_IMPORTED = _SIGINT_AS_A_TERMINALS + """
import os, runpy, signal, sys, threading, time
module = sys.argv.pop(1)

def interrupt():
    while module not in sys.modules:
        time.sleep(0.0002)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt, daemon=True).start()
runpy.run_module("pto.cli", run_name="__main__", alter_sys=True)
"""


def _interrupted(r_code: int, err: str) -> None:
    assert r_code == 130 and err == "pto: interrupted\n", (r_code, err)


def _children(pid: int) -> list[str]:
    """The command names of a process's children."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    names = []
    for kid in kids:
        with contextlib.suppress(OSError):  # a child that ended meanwhile
            names.append(Path(f"/proc/{kid}/comm").read_text().strip())
    return names


def _interrupt_when(args: list[str], ready, env: dict, timeout: float = 180.0) -> tuple[int, str]:
    """Start ``pto ARGS``, wait until ``ready(pid)``, send it SIGINT; its exit status and stderr."""
    proc = subprocess.Popen([sys.executable, "-c", _PTO_CLI, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PTO_PROGRESS_S": "0", **env})
    try:
        deadline = time.monotonic() + timeout
        while not ready(proc.pid):
            assert proc.poll() is None, f"ended before the moment to interrupt it: {proc.communicate()}"
            assert time.monotonic() < deadline, "the moment to interrupt never came"
            time.sleep(0.002)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


LONG_RUN = ["run", "llama7b", "--config", "7b", "--seq", "1024", "--device", "cpu"]


@pytest.mark.parametrize("module", ["pto.builder", "torch"])
def test_ctrl_c_while_importing_ends_with_one_line_and_130(tmp_path, module):
    """Issue 43, item 6: an interrupt while the compiler (imported with the package before the
    command line's main function ran: a traceback) or torch is being imported."""
    env = {**os.environ, "PTO_PROGRESS_S": "0", "PTO_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", _INTERRUPT_WHEN_IMPORTED, module, *LONG_RUN], capture_output=True,
                       text=True, timeout=300, env=env)
    _interrupted(r.returncode, r.stderr)


def test_ctrl_c_from_outside_while_torch_loads(tmp_path):
    """SIGINT from another process, as Ctrl-C or ``timeout -s INT`` sends it, once torch's
    library is being loaded."""
    def loading_torch(pid: int) -> bool:
        try:
            return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            return False

    _interrupted(*_interrupt_when(LONG_RUN, loading_torch, {"PTO_CACHE_DIR": str(tmp_path)}))


@pytest.mark.slow
def test_ctrl_c_while_compiling_the_runtime(tmp_path):
    """On a fresh cache, while the C compiler builds the runtime and the generated C."""
    _interrupted(*_interrupt_when(LONG_RUN, lambda pid: any(c in ("cc", "gcc") for c in _children(pid)),
                                  {"PTO_CACHE_DIR": str(tmp_path)}))
    assert not list(tmp_path.rglob(".build-*")), "the interrupted compile left its folder"


# -- what the commands print ----------------------------------------------------------------------


def test_bench_on_a_cpu_shows_its_rate_in_a_unit_that_says_something(tmp_path):
    """Issue 43, item 11: 'TF/s 0' on the CPU; the column is in GF/s there, three digits, and
    agrees with the flops and the milliseconds of --json."""
    import json

    out = tmp_path / "bench.json"
    r = pto("bench", "softmax", "--device", "cpu", "--seq", "1000", "--compare", "eager", "--iterations", "3",
            "--warmup", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    head, row = [line.split(" | ") for line in r.stdout.splitlines()[1:3]]
    res = json.loads(out.read_text())["rows"][0]
    rate = [c for c in head if c.endswith(" GF/s")]  # the executor's (native: the c backend's)
    assert len(rate) == 1 and not any("TF/s" in c for c in head), head
    executor = rate[0].split()[0]
    shown = float(row[head.index(rate[0])])
    assert shown > 0 and shown == pytest.approx(res["gflop"] / (res[f"{executor}_ms"] * 1e-3), rel=6e-3), (shown, res)


@pytest.mark.parametrize("dump", [False, True])
def test_a_graph_drawing_is_titled_with_the_program_and_its_shape(tmp_path, dump):
    """Issue 43, item 10: without --dump the drawing was titled "graph.txt", the temporary dump's
    name; with or without one, the title is the report's first line."""
    out = tmp_path / "g.dot"  # the DOT text: no graphviz needed
    extra = ["--dump", str(tmp_path / "d.txt")] if dump else []
    r = pto("graph", "softmax", "--seq", "64", "--draw", str(out), *extra)
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("softmax seq=64 config=tiny dtype=f32 target="), first
    assert f"<b>{first}</b>" in out.read_text() and "graph.txt" not in out.read_text()


@pytest.mark.parametrize("prompts,needle", [([], "pto: error: give --prompt TEXT: the text to continue"),
                                            (["--prompt", ""], "pto: error: --prompt: every prompt needs some text")])
def test_generate_without_a_prompt_says_to_give_one(tmp_path, prompts, needle):
    """Issue 43, item 12: a missing --prompt got the empty prompt's message."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")  # never read: the prompts are checked first
    r = pto("generate", "--gguf", str(model), *prompts, "--device", "cpu")
    assert r.returncode == 2 and r.stderr.startswith(needle) and r.stderr.count("\n") == 1, r.stderr


def test_the_estimate_says_which_builds_its_memory_model_made_itself():
    """Issue 43, item 12: asked for 1024 and 16384, the estimate said "fitted on the builds at 1K,
    8K, 16K": the 8K is a build of its own (the fit needs three), said as such."""
    import re

    r = pto("estimate", "llama7b", "--seq", "1024,16384", "--config", "7b")
    assert r.returncode == 0, r.stderr
    last = r.stdout.splitlines()[-1]
    m = re.fullmatch(r"memory model: .* \(fitted on the builds of the rows at 1K, 16K and builds of its own at "
                     r"((\d+K)(, \d+K)*)\)", last)
    assert m and not {"1K", "16K"} & set(m.group(1).split(", ")), last


@pytest.mark.slow
def test_saved_tensors_have_the_mode_of_the_other_outputs(tmp_path):
    """Issue 43, item 12: --save and --save-inputs files were 0600 (a private temporary file
    renamed into place) where the dump beside them is what open() makes (0666 less the umask)."""
    import stat

    files = {flag: tmp_path / name for flag, name in (("--save", "y.safetensors"), ("--save-inputs", "x.safetensors"),
                                                      ("--dump", "graph.txt"))}
    r = pto("run", "softmax", "--seq", "64", *[str(x) for kv in files.items() for x in kv])
    assert r.returncode == 0, r.stderr
    modes = {flag: stat.S_IMODE(path.stat().st_mode) for flag, path in files.items()}
    assert modes["--save"] == modes["--save-inputs"] == modes["--dump"], {k: oct(v) for k, v in modes.items()}
    files["--save"].chmod(0o640)  # a file written over keeps its own mode, as open() leaves it
    r = pto("run", "softmax", "--seq", "64", "--save", str(files["--save"]))
    assert r.returncode == 0 and stat.S_IMODE(files["--save"].stat().st_mode) == 0o640, r.stderr


def _longest_run(row) -> int:
    best = cur = 0
    for ink in row:
        cur = cur + 1 if ink else 0
        best = max(best, cur)
    return best


@pytest.mark.skipif(not shutil.which("dot"), reason="graphviz's dot is not installed")
def test_a_box_label_keeps_its_lines_apart(tmp_path):
    """Issue 43, item 12: the underscores of ``softmax_tile__C256_R32`` ran into "32.5 KiB" on the
    line below. The boxes of `pto graph --draw` (DOT text) rendered by graphviz at 200 dpi: below
    the row of the double underscore's long stroke, at least 1.5 pt of blank before the next line."""
    np = pytest.importorskip("numpy")
    image = pytest.importorskip("PIL.Image")
    dot, png, dpi = tmp_path / "g.dot", tmp_path / "g.png", 200
    r = pto("graph", "softmax", "--seq", "64", "--draw", str(dot))
    assert r.returncode == 0, r.stderr
    subprocess.run(["dot", "-Tpng", f"-Gdpi={dpi}", str(dot), "-o", str(png)], check=True, timeout=120)
    pixels = np.asarray(image.open(png).convert("RGB")).astype(int)
    fill = np.abs(pixels - np.array([0xae, 0xc7, 0xe8])).sum(-1) < 12  # softmax_tile's color
    rows = np.flatnonzero(fill.any(1))
    boxes = [r for r in np.split(rows, np.flatnonzero(np.diff(rows) > 1) + 1) if len(r) > dpi / 2]  # not the legend
    assert len(boxes) == 2, len(boxes)  # two tasks, one above the other
    for box in boxes:
        cols = np.flatnonzero(fill[box].any(0))
        margin = (cols[-1] - cols[0]) // 10  # clear of the rounded border
        ink = pixels[box[0]:box[-1] + 1, cols[0] + margin:cols[-1] - margin].min(-1) < 128
        under = [i for i, row in enumerate(ink) if _longest_run(row) >= 0.1 * dpi]  # "__": a long stroke
        assert under, "no underscore found"
        below = next(i for i in range(under[-1] + 1, len(ink)) if ink[i].any())
        assert (below - under[-1] - 1) * 72 / dpi >= 1.5, (below, under)
