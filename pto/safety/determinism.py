"""Bitwise determinism: what keeps a run's outputs the same bits, and what would not.

What holds (docs/SAFETY.md, "Deterministic replay"; tests/safety/test_determinism.py):

- **replays and processes**: the same inputs give bitwise-identical outputs on every replay of a
  runner and in every process, for every executor and backend. No task's numerics depend on the
  schedule: a task computes its outputs alone (no atomics on data, no reduction across tasks
  except through an ``inout`` region, whose updates the dependencies order in program order),
  except a function that adds into a region with ``store_add`` (the programs of its task add in
  any order on a GPU: such a run's bits may differ between replays there; :func:`guarantee`'s
  ``adds``),
  launch settings come from the program, the renderer and the schedule database, never from
  timing, and the persistent executor's queue order and program count decide only when an item
  runs, not what it computes.
- **executors**: the waves and persistent executors give identical bits under the Triton
  interpreter and with the torch backend (the persistent executor needs Triton). On a GPU the
  megakernel compiles every branch with one set of launch settings (the largest ``num_warps``
  and ``num_stages`` of its branches, FMA contraction if any branch allows it) while each batched
  kernel uses its own, and a reduction over a different number of warps, or a contracted
  multiply-add, rounds differently; :func:`uniform_launch` (``pto run --deterministic``) gives
  the batched kernels the megakernel's settings so both compile each device function alike.

:data:`RUN_OPTIONS` says, for every option of ``pto run``, what it does to the output bits; a
test fails when ``pto run`` gains an option that is not listed, so an option that would break
bitwise replay must say so here (``"breaks: why"``) and :func:`guarantee` reports it.
"""

from __future__ import annotations

from pto.backends import capable

#: ``pto run`` option (argparse dest) -> what it does to the outputs' bits:
#: ``none``: nothing; ``program``: it picks the program, its shape or its inputs (the same value
#: gives the same bits); ``executor``: how the graph runs (the same bits across executors where
#: :func:`guarantee` says so); ``breaks: <why>``: outputs may differ between replays or runs
RUN_OPTIONS = {
    "cmd": "none", "program": "program", "seq": "program", "device": "program", "config": "program",
    "dtype": "program", "target": "program", "backend": "program", "seed": "program", "inputs": "program",
    # the ranks sum their partial results in a collective: another tp is another summation order
    # (another program); the same tp on the same machine sums in the same order
    "tp": "program",
    "executor": "executor", "deterministic": "executor",
    "check": "none", "dump": "none", "trace": "none", "repeat": "none", "profile": "none", "json": "none",
    "sentinel": "none", "check_schedule": "none", "save": "none", "save_inputs": "none",
}


def breaking(options: dict) -> list[str]:
    """The options set in ``options`` (dest -> value; None/False/0 are unset) that break bitwise
    replay, each ``--flag: why``."""
    out = []
    for name, value in options.items():
        effect = RUN_OPTIONS.get(name, "program")
        if effect.startswith("breaks") and value not in (None, False, 0):
            out.append(f"--{name.replace('_', '-')}: {effect.partition(':')[2].strip()}")
    return out


def guarantee(device: str, backend: str, deterministic: bool, options: dict | None = None,
              adds: tuple[str, ...] = ()) -> dict:
    """What this run's outputs are bitwise-identical with (for ``pto run --json``); ``adds``: the
    run's functions with a ``store_add`` (their programs' adds in any order off the CPU)."""
    broken = breaking(options or {})
    if adds and device != "cpu":
        broken.append(f"`{adds[0]}` adds into a region with store_add: on a GPU its programs add in any order")
    across = capable(backend, "megakernel") and (device == "cpu" or deterministic)
    if not capable(backend, "megakernel"):
        note = "the persistent executor needs the triton backend"
    elif across:
        note = "the waves and persistent executors give the same bits" + (
            " (--deterministic: one set of launch settings)" if device != "cpu" else " under the interpreter")
    else:
        note = "on a GPU the executors agree bit for bit only with --deterministic"
    return {"replays": not broken, "processes": not broken, "executors": across and not broken,
            "note": "; ".join([*broken, note])}


def adding_functions(module) -> tuple[str, ...]:
    """The InCore functions of ``module`` with a ``store_add`` (for :func:`guarantee`)."""
    from pto.ir.nodes import IncoreFunction, walk_instrs
    from pto.ir.ops import Op

    return tuple(f.name for f in module.functions if isinstance(f, IncoreFunction)
                 and any(i.op is Op.STORE_ADD for i in walk_instrs(f.body)))


__all__ = ["guarantee", "breaking", "adding_functions", "RUN_OPTIONS"]
