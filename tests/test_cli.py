"""The command-line contract: --json prints exactly one JSON object on stdout; user errors end
with a one-line message on stderr and a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def pto(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "pto.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("program", ["softmax", "bgemm"])
def test_run_check_json(program):
    r = pto("run", program, "--check", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("program", "seq", "config", "device", "backend", "dtype", "tasks", "edges", "launches",
                "build_ms", "exec_ms", "rel_err"):
        assert key in out
    assert out["program"] == program and out["device"] == "cpu" and out["dtype"] == "f32"
    assert out["rel_err"] <= 1e-5
    assert out["tasks"] > 0


@pytest.mark.parametrize("args,needle", [
    (["run", "nosuch"], "unknown program 'nosuch'"),
    (["run", "softmax", "--seq", "-3"], "--seq"),
    (["run", "softmax", "--seq", "99999999999999999999"], "must be at most 2147483647"),
    (["run", "softmax", "--seed", "-1"], "--seed: must be in [0, 2**63)"),
    (["run", "softmax", "--device", "tpu"], "invalid choice: 'tpu'"),
    (["run", "softmax", "--target", "nope"], "unknown target 'nope'"),
    (["run", "softmax", "--no-causal"], "softmax has no attention"),
    (["run", "llama7b", "--trace", "/nonexistent/t.json"], "the folder /nonexistent does not exist"),
    (["run", "llama7b", "--dump", "/nonexistent/d.txt"], "the folder /nonexistent does not exist"),
    (["codegen", "softmax", "--out", ""], "--out: the folder name is empty"),
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


def test_info():
    r = pto("info", "--json")
    assert r.returncode == 0
    info = json.loads(r.stdout)
    assert info["backend"] in ("torch", "triton")
