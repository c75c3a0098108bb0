"""The command line's checks of what the user typed, each one line and before any work: argument
types (sequence lengths, seeds), output files and folders, the cache folder, and what to say
about an option the command or program does not take.

Kept apart from the parser and the commands so that each stays small.
"""

from __future__ import annotations

import argparse
import os

from pto.errors import PTOError, UsageError
from pto.paths import can_create_in, can_write

INT32_MAX = 2**31 - 1  # the runtime's limit on tensor dimensions and ids
#: the commands whose work builds or runs graphs, and so uses the cache folder
CACHE_COMMANDS = ("run", "graph", "estimate", "bench", "tune", "generate")


def value_list(text: str, flag: str = "--seq") -> list[int]:
    """``--seq N,N,...`` (the swept shape parameter's flag): every item a positive integer (an
    empty one is refused, not skipped)."""
    items = [x.strip() for x in text.split(",")]
    if any(not x for x in items):
        raise UsageError(f"{flag} {text!r}: an empty value between commas (expected N,N,...)")
    try:
        out = [int(x) for x in items]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected comma-separated integers") from None
    if any(v <= 0 for v in out):
        raise UsageError(f"{flag} {text!r}: the values must be positive")
    return out


def value_list_of(flag: str):
    """An argparse ``type`` that checks ``--seq N,N,...`` as it is parsed (:func:`value_list`)
    and keeps the text."""
    def check(text: str) -> str:
        value_list(text, flag)
        return text

    return check


def positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {v}")
    if v > INT32_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {INT32_MAX}, got {v}")
    return v


def seed(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= v < 2**63:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**63), got {v}")
    return v


def page(text: str):
    from pto.viz import parse_page

    try:
        return parse_page(text)
    except PTOError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def check_output_file(path: str | None, what: str) -> None:
    """Fail before any work when an output file cannot be created: an empty path, a folder, a
    missing parent folder, or one (or a file) that takes no writes."""
    if path is None:
        return
    if not path:
        raise UsageError(f"{what}: the path is empty")
    if os.path.isdir(path):
        raise UsageError(f"{what} {path}: is a folder; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{what} {path}: the folder {parent} does not exist")
    if not can_write(path):
        raise UsageError(f"{what} {path}: cannot write there")


def check_distinct(outputs: dict[str, str | None]) -> None:
    """No two outputs of one command may be the same file (one would overwrite the other)."""
    seen: dict[str, str] = {}
    for what, path in outputs.items():
        if not path:
            continue
        key = os.path.realpath(path)
        if key in seen:
            raise UsageError(f"{seen[key]} and {what} are the same file ({path}): one would overwrite the other")
        seen[key] = what


def check_output_dir(path: str, what: str) -> None:
    """Fail before any work when an output folder cannot be written: its parent must take a new
    folder (the output is made beside it, then moved in: :mod:`pto.cli.commands.codegen`), and an existing
    folder new files."""
    if not path:
        raise UsageError(f"{what}: the folder name is empty")
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{what} {path}: is a file, not a folder")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{what} {path}: the folder {parent} does not exist")
    if not can_create_in(parent, folder_too=True):
        raise UsageError(f"{what} {path}: cannot write in its folder {parent}")
    if os.path.isdir(path) and not can_create_in(path):
        raise UsageError(f"{what} {path}: cannot write there")


def check_outputs(args: argparse.Namespace) -> None:
    """The files and folders a program's command writes (or reads: ``--inputs``), checked as soon as
    the generic flags are parsed, before the program and torch are loaded (seconds) and before
    any work (``pto codegen`` built for half a minute before finding that /proc takes no folder)."""
    if args.cmd == "run":
        for flag in ("dump", "trace", "save", "save_inputs"):
            check_output_file(getattr(args, flag), "--" + flag.replace("_", "-"))
        check_distinct({"--dump": args.dump, "--trace": args.trace, "--save": args.save,
                        "--save-inputs": args.save_inputs, "--inputs": args.inputs})
        if args.inputs is not None and not os.path.isfile(args.inputs):
            raise UsageError(f"--inputs {args.inputs}: no such file")
    elif args.cmd == "graph":
        check_output_file(args.dump, "--dump")
    elif args.cmd == "codegen":
        check_output_dir(args.out, "--out")
    elif args.cmd == "bench":
        check_output_file(args.json, "--json")


def check_tp_options(args: argparse.Namespace, program) -> None:
    """A program's option that acts across tensor-parallel ranks alone (``Option.tp_only``: the
    dtype of their sums, the LM head's split) given without ``--tp N`` above 1 would be ignored:
    one line naming both flags."""
    from pto.program import without_tp

    tp = getattr(args, "tp", None)
    for o in program.options if program is not None and (tp or 1) == 1 else ():
        value = getattr(args, o.name, None)
        if o.tp_only and value is not None:
            why = "" if tp is not None else f", which pto {args.cmd} does not take"
            raise without_tp(o.flag, value, why)


def check_cache(cmd: str | None) -> None:
    """A command that builds graphs needs a usable cache folder: a bad ``PTO_CACHE_DIR`` is one
    line naming it, before any work."""
    if cmd in CACHE_COMMANDS:
        from pto.cache.cachedir import cache_root

        cache_root()


def unrecognized(extra: list[str], parser: argparse.ArgumentParser, cmd: str | None, program) -> str:
    """The message for arguments nothing took, with where the first unknown option belongs: the
    programs that have it, else the commands that take it, else where the options are listed;
    and where a GGUF file among them goes (:func:`_gguf_hint`)."""
    msg = f"unrecognized arguments: {' '.join(extra)}"
    flag = next((x.split("=", 1)[0] for x in extra if x.startswith("-")), None)
    if flag is None or cmd is None:
        return msg
    who = f"{program.name}" if program is not None else f"pto {cmd}"
    # the programs' options only where a program was loaded: loading them all imports torch, seconds
    # that a command without a program (info, generate, visualize) need not spend on a typo
    owners = _programs_with(flag) if program is not None else []
    commands = [] if owners else _commands_with(parser, flag)
    if owners:
        where = f"{who} takes no {flag}; it is an option of {', '.join(owners)}"
    elif commands:
        where = f"pto {cmd} takes no {flag}; it is an option of {', '.join(f'pto {c}' for c in commands)}"
    else:
        where = f"`{f'pto {cmd} {program.name}' if program is not None else f'pto {cmd}'} --help` lists the options"
    hint = _gguf_hint(extra, cmd) if "generate" not in commands else None
    return f"{msg} ({where}{f'; {hint}' if hint else ''})"


def _gguf_hint(extra: list[str], cmd: str) -> str | None:
    """Where a GGUF file among the arguments nothing took goes (``pto run llama7b --gguf`` is
    told by the flag's owner already)."""
    for x in extra:
        path = x.split("=", 1)[1] if x.startswith("-") and "=" in x else x
        try:
            with open(path, "rb") as f:
                if f.read(4) != b"GGUF":
                    continue
        except OSError:
            continue
        return "a GGUF file goes to --gguf" if cmd == "generate" else \
            f"a GGUF model runs with `pto generate --gguf {path}`"
    return None


def _programs_with(flag: str) -> list[str]:
    from pto import programs

    out = []
    for name in programs.names():
        try:
            prog = programs.get(name)
        except PTOError:  # a broken plugin: nothing to say about it here
            continue
        flags = {o.flag for o in prog.options} | {"--no-" + o.flag[2:] for o in prog.options
                                                 if isinstance(o.default, bool)}
        if flag in flags:
            out.append(name)
    return out


def _commands_with(parser: argparse.ArgumentParser, flag: str) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [c for c, p in sub.choices.items() if flag in p._option_string_actions]


__all__ = ["INT32_MAX", "value_list", "value_list_of", "positive", "seed", "page", "check_output_file",
           "check_distinct", "check_output_dir", "check_outputs", "check_tp_options", "check_cache", "unrecognized"]
