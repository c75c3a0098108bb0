"""The GPU half of the Triton renderer's second load for a tile a loop both multiplies and reads
otherwise (pto/codegen/triton/operands.py, docs/PERF.md eighth session): the GPU test
``test_a_multiplied_tile_read_otherwise_is_right_at_every_pipeline_depth`` at 1 to 4 pipeline
stages, with pointer loads and with tensor descriptors, first with the rewrite patched out (what
Triton 3.6 computes for the pattern as written), then as shipped. Prints each run's rel_err
against float64 where it is over the test's bound.

    python3 bench/operands_check.py
"""

from __future__ import annotations

import pto.codegen.triton.body as body
from tests.gpu.test_gpu import test_a_multiplied_tile_read_otherwise_is_right_at_every_pipeline_depth as check


def main() -> None:
    shipped = body.separate_operand_loads
    try:
        for label, rewrite in (("without the second load", lambda fn: (fn, frozenset())), ("with it", shipped)):
            body.separate_operand_loads = rewrite
            for tma in (False, True):
                for stages in (1, 2, 3, 4):
                    try:
                        check(stages, tma)
                        print(label, "descriptors" if tma else "pointers", stages, "passed", flush=True)
                    except AssertionError as e:
                        print(label, "descriptors" if tma else "pointers", stages, "FAILED", e, flush=True)
    finally:
        body.separate_operand_loads = shipped


if __name__ == "__main__":
    main()
