"""Run many tensor-parallel cases in one launch: ``python -m torch.distributed.run
--nproc-per-node N tests/dist/driver.py CASES.json OUT_DIR`` (or plain ``python`` for tp = 1
without a process group). Each case is a dict of :func:`pto.engine.run`'s program options plus
``seq``, ``seed`` and ``name``; every rank runs every case in the same order (the collectives
match), rank 0 saves each case's outputs to OUT_DIR/NAME.safetensors and writes the results
(``pto run --json``'s object per case) to OUT_DIR/results.json. Not a test module: the tests
in this folder start it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pto import dist
from pto.engine import run


def main(cases_file: str, out_dir: str) -> int:
    cases = json.loads(Path(cases_file).read_text())
    out = Path(out_dir)
    tp = dist.environment().world if dist.environment() else 1
    results = []
    for c in cases:
        c = dict(c)
        name, seq, seed = c.pop("name"), c.pop("seq"), c.pop("seed", 0)
        config, dtype = c.pop("config", "tiny"), c.pop("dtype", "f32")
        # by name, as a user of the Python API writes it (run's own tp, the options as keywords)
        res = run("llama7b", seq, check=True, seed=seed, save=str(out / f"{name}.safetensors"), device="cpu",
                  backend="torch", config=config, dtype=dtype, tp=tp, **c)
        results.append({"name": name, **res})
    if dist.rank() == 0:
        (out / "results.json").write_text(json.dumps(results))
    dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
