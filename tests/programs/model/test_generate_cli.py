"""``pto generate`` as a user runs it, on the real checkpoint (skipped without it): the streamed
text is the text of ``--json``, the speed line follows on stderr, and a prompt that would outgrow
the model's context is one line before any decoding."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest


def _pto(*args):
    return subprocess.run([sys.executable, "-m", "pto.cli", "generate", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PTO_PROGRESS_S": "0"})


@pytest.mark.slow
def test_streamed_text_json_and_speed_line(smollm):
    args = ["--gguf", str(smollm), "--prompt", "The capital of France is", "--max-new-tokens", "8", "--device", "cpu"]
    text = _pto(*args)
    assert text.returncode == 0, text.stderr
    res = json.loads(_pto(*args, "--json").stdout)
    assert text.stdout.strip() == res["texts"][0].strip() and res["texts"][0].strip()
    assert 1 <= len(res["tokens"][0]) <= 8
    speed = text.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"prompt \d+ tokens in \d+ ms; decode [\d.]+ ms per token \([\d.]+ tokens/s\), \d+ steps of "
                        r"\d+ tasks \(\w+ executor, cpu, f32, batch 1, cache \d+\)", speed), speed


@pytest.mark.slow
def test_a_prompt_that_outgrows_the_context_is_one_line(smollm):
    r = _pto("--gguf", str(smollm), "--prompt", "hello", "--max-new-tokens", "9000", "--device", "cpu")
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert re.match(r"pto: error: the prompt \(\d+ tokens\) and --max-new-tokens 9000 exceed the model's context of "
                    r"8192 tokens", lines[0]), lines
