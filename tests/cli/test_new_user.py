"""What a new user trips on (issue 20, section 3): each mistake is one line on stderr that says
what is wrong and what to do, before any work; the tables and help say what they show."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest
import torch


def pto(*args, env=None, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "pto.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def one_line_error(r, rc=2) -> str:
    assert r.returncode == rc, (r.returncode, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr and "internal error" not in r.stderr
    err = r.stderr.strip()
    assert "\n" not in err and err.startswith("pto: error: "), err
    return err


@pytest.mark.slow
@pytest.mark.parametrize("cmd", [["run", "softmax"], ["estimate", "softmax", "--seq", "64"],
                                 ["tune", "softmax", "--show"], ["bench", "softmax", "--device", "cpu", "--seq", "64"]])
def test_a_bad_cache_dir_is_one_line_naming_the_variable(tmp_path, cmd):
    f = tmp_path / "f"
    f.write_text("a file, not a folder")
    err = one_line_error(pto(*cmd, env={"PTO_CACHE_DIR": str(f)}))
    assert f"PTO_CACHE_DIR={f}: not a directory" in err and "Errno" not in err
    err = one_line_error(pto(*cmd, env={"PTO_CACHE_DIR": str(f / "sub")}))
    assert f"PTO_CACHE_DIR={f / 'sub'}: not a directory ({f} is a file)" in err


def test_the_cache_dir_is_checked_by_every_user_of_it(tmp_path, monkeypatch):
    """The compiled modules, the Triton sources and the schedules all live under one checked folder."""
    from pto.backends.triton import cache_dir
    from pto.backends.triton.schedules import user_root
    from pto.cache.cachedir import cache_root
    from pto.errors import UsageError

    monkeypatch.setenv("PTO_CACHE_DIR", str(tmp_path / "new" / "cache"))
    assert cache_dir() == tmp_path / "new" / "cache" / "triton"
    assert user_root() == cache_root() / "schedules"
    (tmp_path / "f").write_text("")
    monkeypatch.setenv("PTO_CACHE_DIR", str(tmp_path / "f"))
    for where in (cache_root, cache_dir, user_root):
        with pytest.raises(UsageError, match="PTO_CACHE_DIR=.*: not a directory"):
            where()


def test_a_folder_without_config_json_says_so(tmp_path):
    err = one_line_error(pto("run", "llama", "--hf-config", str(tmp_path)))
    assert f"--hf-config {tmp_path}: the folder has no config.json" in err


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["run", "softmax", "--attention", "split"],
     "pto: error: unrecognized arguments: --attention split (softmax takes no --attention; it is an option of "
     "llama, llama7b)"),
    (["run", "bgemm", "--no-causal"], "(bgemm takes no --no-causal; it is an option of llama, llama7b)"),
    (["estimate", "softmax", "--seq", "64", "--check"], "(pto estimate takes no --check; it is an option of pto run)"),
    (["run", "softmax", "--nosuch"], "unrecognized arguments: --nosuch (`pto run softmax --help` lists the options)"),
])
def test_an_option_of_another_program_or_command_says_whose_it_is(args, needle):
    err = one_line_error(pto(*args))
    assert needle in err and "pto: error: pto:" not in err


@pytest.mark.slow
@pytest.mark.parametrize("cmd", ["estimate", "bench", "tune"])
@pytest.mark.parametrize("seq", ["1024,,4096", "1024,", ",64"])
def test_an_empty_seq_value_is_refused(cmd, seq):
    err = one_line_error(pto(cmd, "softmax", "--seq", seq, "--device", "cpu"))
    assert f"--seq {seq!r}: an empty value between commas" in err


def test_the_estimate_table_labels_every_column():
    r = pto("estimate", "softmax", "--seq", "64,100000000")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(line for line in lines if line.startswith("SeqLen |"))
    cols = [c.strip() for c in header.split("|")]
    assert all(cols) and cols[-1] == "Source"
    rows = [line for line in lines if re.match(r"\d", line)]
    assert len(rows) == 2 and all(len(row.split("|")) == len(cols) for row in rows)
    assert rows[0].endswith("| measured") and rows[1].endswith("| counted")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without a GPU")
def test_tune_without_a_gpu_points_at_show(tmp_path):
    env = {"PTO_CACHE_DIR": str(tmp_path), "TRITON_INTERPRET": "0"}  # were it to tune, not in the user's cache
    err = one_line_error(pto("tune", "softmax", env=env))
    assert "measures kernels on a GPU and none is visible" in err and "do not exist" not in err
    assert "`pto tune softmax --show` works anywhere" in err
    err = one_line_error(pto("tune", "softmax", "--device", "cpu", env=env))
    assert "TRITON_INTERPRET=1" in err and "--backend" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the listing of a machine without a GPU")
def test_tune_show_on_a_cpu_says_what_it_lists_and_how_to_see_a_gpus(capsys, monkeypatch):
    """`pto tune --show` on a CPU named a shipped folder that does not exist (schedules/cpu) and
    listed Triton's heuristics for a run that takes the c backend: it says so, and how to see
    what a GPU the program ships schedules for applies, which works as written."""
    from pto.cli.main import main

    monkeypatch.delenv("PTO_SCHEDULES", raising=False)
    assert main(["tune", "llama7b", "--show"]) == 0
    head, note = capsys.readouterr().out.splitlines()[:2]
    assert "shipped: none for llama7b on cpu;" in head and "schedules/cpu" not in head.split("shipped:")[1]
    assert note.startswith("note: on the CPU a run takes the ") and "(TRITON_INTERPRET=1)" in note, note
    how = re.search(r"`PTO_SCHEDULES=(\S+) pto (tune llama7b [^`]*)` shows what one applies$", note)
    monkeypatch.setenv("PTO_SCHEDULES", how.group(1))
    assert main(how.group(2).split()) == 0
    shown = capsys.readouterr().out
    assert "note:" not in shown and "\n    shipped: {" in shown  # the GPU's shipped entries, by kernel
    monkeypatch.delenv("PTO_SCHEDULES")
    assert main(["tune", "softmax", "--show"]) == 0
    assert "softmax ships no schedules; pto tune measures them on a GPU" in capsys.readouterr().out


def test_no_help_shows_an_empty_default():
    from pto import programs
    from pto.cli.parser import build_parser

    for prog in [None, *map(programs.get, programs.names())]:
        sub = next(a for a in build_parser(prog)._actions if isinstance(a, argparse._SubParsersAction))
        for cmd, parser in sub.choices.items():
            text = " ".join(parser.format_help().split())
            for m in re.finditer(r"\(default: ?([^)]*)\)", text):
                assert m.group(1).strip() not in ("", "None"), f"pto {cmd} {prog and prog.name}: {m.group(0)}"


def test_the_size_flags_help_gives_the_defaults_that_apply():
    """The generic --seq (`pto run --help`, no program) said "(default: 128)", llama's, where
    softmax and bgemm take 100 and the model has --cache and --batch instead: it names no number
    now, and each program's help gives its own."""
    from pto import programs
    from pto.cli.parser import build_parser

    for prog in [None, *map(programs.get, programs.names())]:
        sub = next(a for a in build_parser(prog)._actions if isinstance(a, argparse._SubParsersAction))
        for cmd in ("run", "graph", "codegen", "estimate", "bench", "tune"):
            flags = sub.choices[cmd]._option_string_actions
            for k, p in enumerate(prog.shape_params if prog is not None else ()):
                said = "(required)" if k == 0 and cmd in ("estimate", "bench") else f"(default: {p.default})"
                assert flags[p.flag].help.endswith(said), (prog.name, cmd, flags[p.flag].help)
            if prog is None:
                assert re.search(r"\((default: the program's own|required, or the program's first size); `pto "
                                 rf"{cmd} PROGRAM --help` gives the program's sizes and defaults\)$",
                                 flags["--seq"].help), (cmd, flags["--seq"].help)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without a GPU")
def test_persistent_on_the_cpu_says_it_needs_a_gpu():
    err = one_line_error(pto("run", "softmax", "--executor", "persistent"))
    assert "the persistent executor needs a GPU" in err and "--backend triton with TRITON_INTERPRET=1" in err
    assert "--backend torch" not in err
    err = one_line_error(pto("run", "softmax", "--executor", "persistent", "--backend", "torch"))
    assert "--backend torch needs --executor waves" in err


@pytest.mark.parametrize("args,flag", [
    (["run", "llama7b", "--allreduce-dtype", "f32"], "--allreduce-dtype f32"),
    (["graph", "llama", "--tp", "1", "--allreduce-dtype", "storage"], "--allreduce-dtype storage"),
    (["estimate", "model", "--cache", "64", "--lm-head", "replicated"], "--lm-head replicated"),
    (["codegen", "model", "--out", "{tmp}/gen", "--allreduce-dtype", "f32"], "--allreduce-dtype f32"),
    (["bench", "llama7b", "--seq", "64", "--allreduce-dtype", "f32"], "--allreduce-dtype f32"),
    (["tune", "llama7b", "--show", "--allreduce-dtype", "f32"], "--allreduce-dtype f32"),
    (["generate", "--gguf", "{tmp}/model.gguf", "--prompt", "hi", "--allreduce-dtype", "f32"], "--allreduce-dtype f32"),
])
def test_an_option_of_the_ranks_sums_without_tp_is_refused(tmp_path, capsys, args, flag):
    """Options that act across tensor-parallel ranks alone, given without --tp N above 1, were
    ignored: one line naming both flags, before any work (the model file is not even read)."""
    from pto.cli.main import main

    (tmp_path / "model.gguf").write_bytes(b"not read")
    assert main([a.replace("{tmp}", str(tmp_path)) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pto: error: {flag} applies to tensor parallelism, with --tp N above 1") and \
        err.count("\n") == 1, err
    assert ("which pto " in err) == (args[0] in ("bench", "tune")), err
    assert not (tmp_path / "gen").exists()


@pytest.mark.parametrize("args,says", [
    (["run", "llama", "--weights", "m.gguf"], "--weights m.gguf: a GGUF file; the layer reads a Hugging Face "
     "checkpoint (safetensors, config.json): the GGUF model runs with `pto run model --weights m.gguf` or "
     "`pto generate --gguf m.gguf`"),
    (["run", "llama7b", "--hf-config", "m.gguf"], "--hf-config m.gguf: a GGUF file; the layer reads"),
    (["run", "softmax", "--weights", "m.gguf"], "(softmax takes no --weights; it is an option of llama, llama7b, "
     "model; a GGUF model runs with `pto generate --gguf m.gguf`)"),
    (["generate", "--prompt", "hi", "--weights=m.gguf"], "(`pto generate --help` lists the options; a GGUF file "
     "goes to --gguf)"),
    (["run", "llama7b", "--gguf", "m.gguf"], "(pto run takes no --gguf; it is an option of pto generate)"),
])
def test_a_gguf_file_where_none_goes_says_where_it_does(tmp_path, monkeypatch, capsys, args, says):
    """A GGUF checkpoint given to the layer program's safetensors flags, or to a flag the command
    or program lacks, is pointed at `pto generate --gguf` (or the model program's --weights)."""
    from pto.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"GGUF\x03\x00\x00\x00 the rest is not read")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("pto: error: ") and says in err and err.count("\n") == 1, err


def test_a_missing_dependency_is_one_line_naming_the_package(tmp_path):
    """A broken install (here cffi, which the C runtime's build imports, blocked in the child)
    says which package is missing and how to install it, not an internal error; a module of
    pto's own that will not import stays an internal error."""
    run = ("import sys; sys.modules[{mod!r}] = None; from pto.cli.main import main; "
           "raise SystemExit(main(['run', 'softmax', '--seq', '64']))")
    env = {**os.environ, "PTO_CACHE_DIR": str(tmp_path)}  # (a cold cache: the runtime is built)
    env.pop("PTO_DEBUG", None)
    r = subprocess.run([sys.executable, "-c", run.format(mod="cffi")], capture_output=True, text=True, timeout=300,
                       env=env)
    err = one_line_error(r, rc=1)
    assert "the module `cffi`, which pto imports, is not installed" in err and "pip install cffi," in err, err
    r = subprocess.run([sys.executable, "-c", run.format(mod="pto.cache.cbuild")], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 3 and r.stderr.startswith("pto: internal error: ModuleNotFoundError"), r.stderr
