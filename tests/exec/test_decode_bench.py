"""bench/decode.py runs transformers' compiled step in a child process: a result comes back as
the child's last line of JSON, and a child that dies (a segmentation fault, an error) is a
RuntimeError that says how, not the end of the benchmark."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parents[2] / "bench"
_spec = importlib.util.spec_from_file_location("decode_bench", _BENCH / "decode.py")
decode = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(decode)


def test_the_childs_last_json_line_is_its_result():
    child = "import json; print('compiling'); print(json.dumps({'ms': 2 ** 0.5}))"
    got = decode.child_json([sys.executable, "-c", child])
    assert got == {"ms": 2 ** 0.5}


def test_a_child_killed_by_a_signal_or_failing_is_an_error_that_says_how():
    with pytest.raises(RuntimeError, match=r"killed by SIGSEGV"):
        decode.child_json([sys.executable, "-c", "import ctypes; ctypes.string_at(0)"])
    with pytest.raises(RuntimeError, match=r"exited with status 1: ValueError: invalid literal"):
        decode.child_json([sys.executable, "-c", "int('x')"])
    with pytest.raises(RuntimeError, match=r"printed no result"):  # no JSON printed
        decode.child_json([sys.executable, "-c", "print('done')"])
    with pytest.raises(RuntimeError, match=r"ran past 1 s and was stopped"):
        decode.child_json([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
