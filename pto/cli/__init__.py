"""The ``pto`` command line: info, run, graph, codegen, estimate, bench, tune, visualize.

The contract: ``--json`` prints one JSON object on stdout and nothing else there; every error a
user can cause ends with a one-line message on stderr and a non-zero exit, never a traceback or
a hang (set PTO_DEBUG=1 to see the traceback of an internal error). Long work shows a progress
bar on a terminal (never with ``--json``) and a line every 10 s into a log (:mod:`pto.progress`).

- :mod:`.parser`: the parser. The commands that take a PROGRAM add that program's shape
  parameters (``--seq``; a decode step's ``--batch``, ...) and its own options
  (:mod:`pto.program`): the line is parsed once to find the program, then again with its
  options, so ``pto run llama7b --help`` lists them and another program's flag is an error.
  The first parse imports neither torch nor a program, so a mistake in a command, a program's
  name or a generic flag is answered at once; a program's own options are checked once it is
  loaded (which imports torch).
- :mod:`.checks`: the checks of what the user typed, one line each, before any work.
- :mod:`.commands`: one function per command; :mod:`.report`: the text they print.
- :mod:`.main`: :func:`main`, which turns every error into its one line and exit status.
"""

from pto.cli.main import main

__all__ = ["main"]
