"""The command-line contract: --json prints exactly one JSON object on stdout; user errors end
with a one-line message on stderr and a non-zero exit, before any work; one rule of defaults for
every command; help that lists what can be chosen."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest


def pto(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "pto.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("program", ["softmax", "bgemm"])
def test_run_check_json(program):
    r = pto("run", program, "--check", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("program", "seq", "config", "device", "backend", "executor", "dtype", "target", "tasks", "edges",
                "launches", "build_ms", "exec_ms", "rel_err"):
        assert key in out
    assert out["program"] == program and out["device"] == "cpu" and out["dtype"] == "f32"
    assert out["executor"] == ("native" if out["backend"] == "c" else "waves") and out["target"] in ("x86_64", "arm64")
    assert out["rel_err"] <= 1e-5
    assert out["tasks"] > 0


@pytest.mark.parametrize("args,first", [
    (["run", "softmax", "--seq", "64", "--check"], "softmax seq=64 config=tiny dtype=f32"),
    (["run", "model", "--cache", "64", "--batch", "2", "--check"], "model cache=64 batch=2 config=tiny dtype=f32")])
def test_the_text_summary_names_the_shape_by_name(args, first):
    """The summary without --json: the program's named shape (a decode step's cache and batch,
    not a seq it has none of), the options that have a value, the error against the reference."""
    r = pto(*args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(first) and "weights=" not in lines[0], lines[0]
    assert any(line.startswith("rel_err ") for line in lines)


def test_run_json_reports_the_program_options():
    out = json.loads(pto("run", "llama7b", "--seq", "40", "--attention", "pair", "--no-causal", "--json").stdout)
    assert (out["attention"], out["causal"], out["config"]) == ("pair", False, "tiny")
    out = json.loads(pto("run", "softmax", "--seq", "40", "--json").stdout)
    assert "attention" not in out and "causal" not in out


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["run", "nosuch"], "unknown program 'nosuch' (choose from bgemm, llama, llama7b, model, softmax"),
    (["run", "softmax", "--seq", "-3"], "--seq"),
    (["run", "softmax", "--seq", "99999999999999999999"], "must be at most 2147483647"),
    (["run", "softmax", "--seed", "-1"], "--seed: must be in [0, 2**63)"),
    (["run", "softmax", "--device", "tpu"], "invalid choice: 'tpu'"),
    (["run", "softmax", "--target", "nope"], "invalid choice: 'nope' (choose from"),
    (["run", "softmax", "--no-causal"], "unrecognized arguments: --no-causal"),
    (["run", "softmax", "--attention", "fused"], "unrecognized arguments: --attention fused"),
    (["run", "bgemm", "--attention", "pair"], "unrecognized arguments: --attention pair"),
    (["run", "llama7b", "--causal", "--no-causal"], "argument --no-causal: not allowed with argument --causal"),
    (["run", "llama7b", "--config", "13b"], "invalid choice: '13b' (choose from"),
    (["run", "llama7b", "--trace", "/nonexistent/t.json"], "the folder /nonexistent does not exist"),
    (["run", "llama7b", "--dump", "/nonexistent/d.txt"], "the folder /nonexistent does not exist"),
    (["run", "llama7b", "--trace", "/tmp"], "--trace /tmp: is a folder"),
    (["run", "llama7b", "--dump", "/tmp/pto-same.txt", "--trace", "/tmp/pto-same.txt"],
     "--dump and --trace are the same file"),
    (["codegen", "softmax", "--out", ""], "--out: the folder name is empty"),
    (["codegen", "softmax", "--out", "/nonexistent/deeper/dir"], "the folder /nonexistent/deeper does not exist"),
    (["visualize", "/nonexistent/dump.txt", "/tmp/x.pdf"], "/nonexistent/dump.txt"),
    (["estimate", "softmax", "--seq", "1,x"], "--seq '1,x'"),
    ([], "a command is required"),
])
def test_user_errors_are_one_line(args, needle):
    r = pto(*args)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert needle in lines[-1]
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert r.stdout.strip() == "" or not args


@pytest.mark.slow
def test_a_first_runs_kernel_compile_is_not_its_execution(tmp_path):
    """On a fresh cache the wave executor's first run compiled the c backend's kernels inside
    `exec_ms` (softmax's 4 tasks: 512 ms against 12 warm), and the native executor's program
    compile was in no figure: both are `kernel_compile_ms` now, apart."""
    import os

    env = {**os.environ, "PTO_CACHE_DIR": str(tmp_path)}
    for executor in ("waves", "native"):
        runs = [subprocess.run([sys.executable, "-m", "pto.cli", "run", "softmax", "--executor", executor, *extra],
                               capture_output=True, text=True, timeout=300, env=env) for extra in (["--json"], [])]
        assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
        fresh = json.loads(runs[0].stdout)
        assert fresh["executor"] == executor and fresh["kernel_compile_ms"] > 100 > fresh["exec_ms"], fresh
        warm = next(line for line in runs[1].stdout.splitlines() if line.startswith("build "))
        assert re.fullmatch(r"build [\d.]+ ms  exec [\d.]+ ms  kernels [\d.]+ ms \(compiled or loaded\)", warm), warm


def test_output_file_that_is_a_file_for_codegen(tmp_path):
    f = tmp_path / "f"
    f.write_text("keep")
    r = pto("codegen", "softmax", "--out", str(f))
    assert r.returncode == 2 and "is a file, not a folder" in r.stderr and f.read_text() == "keep"


def test_memory_is_refused_up_front_with_the_number():
    """2**31 - 1 rows of softmax need terabytes: refused at once, not after minutes of allocation.
    x and y are 2.2 TB each in f32 (256 columns), and x is made once more before it is copied in."""
    t0 = time.perf_counter()
    r = pto("run", "softmax", "--seq", "2147483647")
    assert time.perf_counter() - t0 < 30
    assert r.returncode == 2, r.stderr
    assert "needs about 6.6 TB of host memory (tensors 6.6 TB) but" in r.stderr
    assert r.stderr.rstrip().endswith("is available; use a smaller --seq or --config"), r.stderr


@pytest.mark.slow
def test_one_rule_of_defaults_for_every_command(tmp_path):
    """On a CPU machine run, codegen and estimate all pick the program's CPU config, f32 and the
    host's target, and all accept --config auto."""
    run = json.loads(pto("run", "llama7b", "--seq", "40", "--json").stdout)
    est = json.loads(pto("estimate", "llama7b", "--seq", "40", "--config", "auto", "--json").stdout)
    for res in (run, est):
        assert (res["config"], res["dtype"], res["target"]) == ("tiny", "f32", run["target"])
    r = pto("codegen", "llama7b", "--out", str(tmp_path), "--config", "auto")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "llama7b.pto").read_text()
    assert "[%S, 256] f32" in text  # tiny's hidden size, f32


@pytest.mark.slow
def test_help_lists_programs_targets_and_every_option():
    r = pto("run", "--help")
    assert r.returncode == 0
    for name in ("bgemm", "llama7b", "softmax", "x86_64", "cuda_h100", "ascend910b", "waves", "defaults:"):
        assert name in r.stdout, name
    r = pto("run", "llama7b", "--help")
    assert "options of llama7b" in r.stdout and "--attention {split,pair,fused}" in r.stdout
    assert "--no-causal" in r.stdout
    from pto.cli.parser import build_parser
    from pto.programs import get

    for prog in (None, get("llama7b"), get("softmax")):
        sub = next(a for a in build_parser(prog)._actions if a.dest == "cmd")
        for cmd, parser in sub.choices.items():
            for action in parser._actions:
                assert action.help, f"pto {cmd}: {action.option_strings or action.dest} has no help"


def test_version():
    """``pto --version``: the installed distribution's version, else the package's own (a checkout
    run without installing it); pyproject.toml and pto/version.py say the same."""
    from pathlib import Path

    from pto.version import __version__, installed_version

    r = pto("--version")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout == f"pto {installed_version()}\n"
    root = Path(__file__).resolve().parents[2]
    bare = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(root)!r}); "
                           "from pto.version import installed_version; print(installed_version())"],
                          capture_output=True, text=True, timeout=60)  # no site-packages: nothing installed
    assert bare.stdout == f"{__version__}\n", bare.stderr
    pyproject = (root / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"$', pyproject, re.M).group(1) == __version__


@pytest.mark.slow
def test_info():
    r = pto("info", "--json")
    assert r.returncode == 0
    info = json.loads(r.stdout)
    # auto: the c backend's native executor on a CPU with a C compiler, else the waves executor
    assert (info["backend"], info["executor"]) in (("c", "native"), ("torch", "waves"), ("triton", "waves"))
    assert info["target"] and info["sram_bytes"] > 0
    text = pto("info").stdout
    assert "target:" in text and "SRAM:" in text and "KiB" in text
    # the collectives of tensor parallelism: the mode, and symmetric memory's all-reduce or why not
    coll = info["collectives"]
    assert coll["mode"] == "auto" and coll["gloo"] and coll["multicast"] is False
    line = next(x for x in text.splitlines() if x.startswith("collectives:"))
    if info["device"] == "cpu":
        assert not coll["symmetric_memory"] and coll["symmetric_memory_why"] == "no CUDA GPU"
        assert "symmetric memory no (no CUDA GPU): the process group's at every size" in line, line
    else:
        assert ("one-shot up to 256 KiB" in line) == coll["symmetric_memory"], line


@pytest.mark.slow
def test_info_refuses_a_mode_it_does_not_know():
    import os

    r = subprocess.run([sys.executable, "-m", "pto.cli", "info"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PTO_COLLECTIVES": "nccl"})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "pto: error: PTO_COLLECTIVES='nccl': expected one of auto, group, symm, evaluator\n", r.stderr


def _run_on_a_terminal(args, timeout=300):
    """``pto ARGS`` with stderr on a pseudo-terminal (stdout a pipe); returns (rc, stdout, what
    the terminal showed)."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal's size
    proc = subprocess.Popen([sys.executable, "-m", "pto.cli", *args], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    out, _ = proc.communicate(timeout=timeout)
    os.close(master)
    return proc.returncode, out.decode(), shown.decode(errors="replace")


@pytest.mark.slow
def test_long_runs_show_a_bar_on_a_terminal_only():
    """More than a second of execution: a tqdm bar on a terminal; none with --json, none when
    stderr is not a terminal (progress lines there instead: tests/cli/test_progress.py)."""
    args = ["run", "llama7b", "--seq", "1200", "--attention", "pair"]
    rc, out, shown = _run_on_a_terminal(args)
    assert rc == 0 and "llama7b: executing" in shown and "task" in shown and "tasks" in out
    rc, out, shown = _run_on_a_terminal([*args, "--json"])
    assert rc == 0 and "executing" not in shown and json.loads(out)["tasks"] > 0
    r = pto(*args)
    assert r.returncode == 0 and "\r" not in r.stderr and "it/s" not in r.stderr and "task/s" not in r.stderr


def test_a_capped_trace_says_so(tmp_path):
    r = pto("run", "llama7b", "--seq", "1000", "--attention", "split", "--no-fuse", "--trace", str(tmp_path / "t.json"),
            "--json")
    assert r.returncode == 0, r.stderr
    assert "pto: trace: first 5,000 of 5,728 dependency arrows drawn" in r.stderr
    assert json.loads(r.stdout)["trace"] == {"path": str(tmp_path / "t.json"), "dependencies": 5728, "flows": 5000}
