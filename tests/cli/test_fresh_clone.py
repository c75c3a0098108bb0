"""What a new user hit on a fresh clone (issue 43), each through the real entry point: usage
errors answered before torch is imported, Ctrl-C at any moment, outputs that cannot be written
found before any work, and the messages, labels and units of what the commands print."""

from __future__ import annotations

import os
import subprocess
import sys

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
    r = subprocess.run([sys.executable, "-c", _MODULES_AFTER, *args], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "-"], (r.stdout, r.stderr)
    err = r.stderr.strip()
    assert err.startswith("pto: error: ") and "\n" not in err and needle in err, err
