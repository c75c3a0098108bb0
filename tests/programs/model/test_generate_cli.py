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


def _pto(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pto.cli", "generate", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PTO_PROGRESS_S": "0", **(env or {})})


@pytest.mark.slow
def test_streamed_text_json_and_speed_line(smollm):
    args = ["--gguf", str(smollm), "--prompt", "The capital of France is", "--max-new-tokens", "8", "--device", "cpu"]
    text = _pto(*args)
    assert text.returncode == 0, text.stderr
    res = json.loads(_pto(*args, "--json").stdout)
    assert text.stdout.strip() == res["texts"][0].strip() and res["texts"][0].strip()
    assert 1 <= len(res["tokens"][0]) <= 8
    speed = text.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"prompt \d+ tokens in [\d.,]+ ms; decode [\d.]+ ms per token \([\d.]+ tokens/s\), "
                        r"\d+ steps of \d+ tasks \(\w+ executor, cpu, f32, batch 1, cache \d+\); weights 98\.3 MB "
                        r"\(q4_1, q8_0\), 98\.3 MB read a step", speed), speed
    assert res["weights"]["types"]["wd"] == "q4_1" and res["weights"]["resident_bytes"] == 98272512


@pytest.mark.slow
def test_a_one_token_prompt_reports_no_prefill_time(smollm):
    r = _pto("--gguf", str(smollm), "--prompt", "Hi", "--max-new-tokens", "2", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("prompt 1 token, read by the first step (no prefill); decode ")


@pytest.mark.slow
def test_dequantize_gives_the_same_text_from_float_weights(smollm):
    """``--dequantize``: the weights as f32 (538 MB), the tokens of the quantized run."""
    args = ["--gguf", str(smollm), "--prompt", "def fibonacci(n):", "--max-new-tokens", "4", "--device", "cpu",
            "--json"]
    quantized, dense = (json.loads(_pto(*args, *extra).stdout) for extra in ((), ("--dequantize",)))
    assert dense["tokens"] == quantized["tokens"]
    assert dense["weights"] == {"types": {}, "resident_bytes": 538060032, "step_read_bytes": 538060032}


@pytest.mark.slow
def test_top_k_above_the_vocabulary_samples_among_all(smollm):
    """``--top-k`` above SmolLM2's 49,152 ids: accepted (as transformers clamps it), the draws of
    no --top-k, with the same seed."""
    args = ["--gguf", str(smollm), "--prompt", "Once upon a time", "--max-new-tokens", "4", "--device", "cpu",
            "--temperature", "1.5", "--seed", "7", "--json"]
    runs = [_pto(*args, *extra) for extra in ((), ("--top-k", "1000000"))]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    plain, clamped = (json.loads(r.stdout) for r in runs)
    assert clamped["tokens"] == plain["tokens"] and len(plain["tokens"][0]) == 4


@pytest.mark.slow
def test_a_prompt_that_outgrows_the_context_is_one_line(smollm):
    r = _pto("--gguf", str(smollm), "--prompt", "hello", "--max-new-tokens", "9000", "--device", "cpu")
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert re.match(r"pto: error: the prompt \(\d+ tokens\) and --max-new-tokens 9000 exceed the model's context of "
                    r"8192 tokens", lines[0]), lines


@pytest.mark.slow
def test_generation_over_three_ranks_writes_the_single_process_text(smollm):
    """``torchrun --nproc-per-node 3 -m pto.cli generate --gguf SmolLM2 --tp 3`` (its 9 query and
    3 key/value heads and its LM head's 49152 ids over 3 ranks, gloo, f32): the greedy tokens and
    text of the single process (itself transformers' tokens on the same file: test_decode.py),
    one JSON object (rank 0's)."""
    from tests.dist import driver

    args = ["-m", "pto.cli", "generate", "--gguf", str(smollm), "--prompt", "The capital of France is",
            "--max-new-tokens", "6", "--device", "cpu", "--json"]
    r3 = driver.launch(3, *args, "--tp", "3")
    r1 = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=driver.clean_env(), timeout=300)
    assert r3.returncode == 0 and r1.returncode == 0, (r3.stderr[-3000:], r1.stderr[-3000:])
    one, three = json.loads(r1.stdout), json.loads(r3.stdout)
    assert three["tokens"] == one["tokens"] and len(one["tokens"][0]) == 6
    assert three["texts"] == one["texts"]
    # every step: the o and down projections of 30 layers and the vocabulary-parallel head's
    # candidates, through gloo (no symmetric memory on the CPU)
    calls = three["collectives"]["calls"]
    assert calls % 61 == 0 and calls >= 6 * 61 and three["collectives"]["algorithms"] == {"group": calls}, three


def test_tp_that_does_not_divide_the_heads_is_one_line_before_loading(smollm):
    """Rank 0 of a torchrun launch of 2 (its variables; the launch is checked first, tests/cli)."""
    r = _pto("--gguf", str(smollm), "--prompt", "hi", "--tp", "2", "--device", "cpu",
             env={"WORLD_SIZE": "2", "RANK": "0"})
    assert r.returncode == 2 and r.stderr == "pto: error: rank 0: --tp 2: the 9 query heads do not divide among 2 " \
        "ranks\n", r.stderr


def _result(prompts: tuple[int, ...] = (4,), prefill_ms: float = 30.0, step_ms: float = 8.0) -> dict:
    """``pto generate``'s result for prompts of these lengths (a sequence each), its weights unsaid."""
    from pto.orchestration.llm.generate import Generation

    gen = Generation(tokens=[[5, 6, 7]] * len(prompts), prompt_tokens=list(prompts), prefill_ms=prefill_ms,
                     decode_ms=[step_ms] * 3, capacity=64, tasks_per_step=905, executor="waves")
    return {**gen.to_json(), "tokens": gen.tokens, "device": "cpu", "dtype": "f32"}


def _speed_line(prompts: list[int], prefill_ms: float = 30.0, step_ms: float = 8.0) -> str:
    """``pto generate``'s speed line for prompts of these lengths (a sequence each)."""
    from pto.orchestration.llm.textgen import format_speed

    return format_speed(_result(tuple(prompts), prefill_ms, step_ms))


def test_the_speed_line_gives_the_prefills_dense_copies_where_it_kept_any():
    from pto.orchestration.llm.textgen import format_speed

    line = _speed_line([4])
    w = {"types": {"wg": "q4_k"}, "resident_bytes": 98_300_000, "step_read_bytes": 97_000_000}
    assert "dense copies" not in format_speed({**_result(), "weights": w})
    assert format_speed({**_result(), "weights": {**w, "prefill_dense_bytes": 56_623_104}}).endswith(
        "; weights 98.3 MB (q4_k), 97.0 MB read a step, 56.6 MB of dense copies for the prefill")
    assert "dense copies" not in line


@pytest.mark.parametrize("data,says", [
    (b"GGUF\x03\x00\x00\x00" + b"\xff" * 9, "truncated: the file ends at byte 17, in its first bytes"),
    (b"GGUF\x63\x00\x00\x00" + b"\x00" * 16, "not a readable GGUF file: its header is corrupt"),
    (b"GGUX not a checkpoint", None),
], ids=["truncated", "version-99", "magic"])
def test_a_broken_gguf_file_is_named_by_its_flag(tmp_path, monkeypatch, capsys, data, says):
    """What the GGUF reader finds wrong begins with the flag that gave the file, the path as the
    user wrote it: ``--gguf`` of pto generate, ``--weights`` of the model program."""
    from pto.cli.main import main

    pytest.importorskip("gguf", reason="needs `gguf` (pip install 'pto[model]')")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.gguf").write_bytes(data)
    for args, flag in ((["generate", "--prompt", "hi", "--gguf", "./m.gguf"], "--gguf"),
                       (["run", "model", "--weights", "./m.gguf"], "--weights"),
                       (["estimate", "model", "--cache", "64", "--weights", "./m.gguf"], "--weights")):
        assert main(args) == 2
        err = capsys.readouterr().err
        wrong = says or ("not a GGUF file (it does not begin with GGUF's magic bytes)" if flag == "--gguf" else
                         "neither a GGUF file nor a Hugging Face model folder")
        assert err.startswith(f"pto: error: {flag} ./m.gguf: {wrong}") and err.count("\n") == 1, err


def test_a_broken_model_folder_is_named_by_its_flag(tmp_path, monkeypatch, capsys):
    from pto.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{bad")
    assert main(["generate", "--prompt", "hi", "--hf", "hf"]) == 2
    assert capsys.readouterr().err == "pto: error: --hf hf has no tokenizer (no tokenizer.json)\n"
    assert main(["run", "model", "--weights", "hf"]) == 2
    assert capsys.readouterr().err.startswith("pto: error: --weights hf: hf/config.json: not JSON")


@pytest.mark.parametrize("ms,sequences", [(2500.0, 1), (25000.0, 1), (8.0, 2), (0.9, 4)])
def test_the_speed_line_gives_the_rate_to_three_digits(ms, sequences):
    """Issue 43, item 8: a CPU's 0.4 tokens/s was printed "(0 tokens/s)"; the rate comes from the
    step's milliseconds (the JSON's tokens_per_s is rounded to 0.1: 0.04 reads 0.0 there)."""
    rate = sequences * 1e3 / ms
    shown = re.search(r"\(([\d.,]+) tokens/s\)", _speed_line([4] * sequences, step_ms=ms)).group(1)
    assert float(shown.replace(",", "")) == pytest.approx(rate, rel=5e-3), (shown, rate)
    assert float(shown.replace(",", "")) > 0


@pytest.mark.parametrize("prompts,prefill_ms,shown", [
    ([1], 0.13, "prompt 1 token, read by the first step (no prefill); "),
    ([1, 1], 0.2, "prompt 2 tokens, read by the first step (no prefill); "),
    ([2], 0.412, "prompt 2 tokens in 0.412 ms; "),
    ([5, 1], 45.67, "prompt 6 tokens in 45.7 ms; "),
    ([300], 1234.5, "prompt 300 tokens in 1,234 ms; "),
])
def test_the_speed_line_gives_the_prompts_time_where_there_is_one(prompts, prefill_ms, shown):
    """A one-token prompt has nothing to prefill (the first step reads its token): it was "in 0
    ms"; a short prefill keeps three digits."""
    assert _speed_line(prompts, prefill_ms).startswith(shown)


@pytest.mark.slow
def test_a_batch_labels_every_sequence(smollm):
    """Issue 43, item 9: "--- sequence 1:" comes before the first (streamed) text as "--- sequence
    2:" before the second; the texts are those of --json."""
    args = ["--gguf", str(smollm), "--prompt", "The capital of France is", "--prompt", "def fib(n):", "--batch", "2",
            "--max-new-tokens", "3", "--device", "cpu"]
    text = _pto(*args)
    assert text.returncode == 0, text.stderr
    res = json.loads(_pto(*args, "--json").stdout)
    expected = "".join(f"--- sequence {i}:\n{t}\n" for i, t in enumerate(res["texts"], start=1))
    assert text.stdout == expected, (text.stdout, res["texts"])
