"""Run many tensor-parallel cases in one launch: ``python -m torch.distributed.run
--nproc-per-node N tests/dist/driver.py CASES.json OUT_DIR`` (or plain ``python`` for tp = 1
without a process group). Each case is a dict of :func:`pto.cli.commands.run.run`'s program options plus
``seq`` (the shape: an int for the program's first shape parameter, or a dict), ``seed`` and
``name``; every rank runs every case in the same order (the collectives match), rank 0 saves each
case's outputs to OUT_DIR/NAME.safetensors and writes the results (``pto run --json``'s object
per case) to OUT_DIR/results.json; a case may name its ``program`` (default llama7b), ``device``
and ``backend`` (default: the CPU and the torch backend). A case with ``generate`` (prompts'
lengths, new tokens) generates from the model program's seeded random weights of ``config``
with :class:`~pto.orchestration.llm.generate.Generator` instead (on the CPU, or its ``device``):
its result holds the tokens and this rank's sums (``collectives``).
Not a test module: the tests start it (:func:`launch`, :func:`run_cases`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from pto.cli.commands.run import run
from pto.machine import dist


def main(cases_file: str, out_dir: str) -> int:
    cases = json.loads(Path(cases_file).read_text())
    out = Path(out_dir)
    tp = dist.environment().world if dist.environment() else 1
    results = []
    for c in cases:
        c = dict(c)
        name, seed = c.pop("name"), c.pop("seed", 0)
        config, dtype = c.pop("config", "tiny"), c.pop("dtype", "f32")
        if "generate" in c:
            results.append({"name": name, "tp": tp, **generate(config, seed, tp, *c["generate"], dtype=dtype,
                                                               allreduce_dtype=c.get("allreduce_dtype", "storage"),
                                                               device=c.get("device", "cpu"),
                                                               sample=c.get("sample"))})
            continue
        device, backend = c.pop("device", "cpu"), c.pop("backend", "torch")
        program, seq = c.pop("program", "llama7b"), c.pop("seq")
        # by name, as a user of the Python API writes it (run's own tp, the options as keywords)
        res = run(program, seq, check=True, seed=seed, save=str(out / f"{name}.safetensors"), device=device,
                  backend=backend, config=config, dtype=dtype, tp=tp, **c)
        results.append({"name": name, **res})
    if dist.rank() == 0:
        (out / "results.json").write_text(json.dumps(results))
    dist.shutdown()
    return 0


def generate(config: str, seed: int, tp: int, lengths: list[int], new: int, dtype: str = "f32",
             allreduce_dtype: str = "storage", device: str = "cpu", sample: list | None = None) -> dict:
    """Greedy tokens of prompts of ``lengths`` (seeded) from the model program's random weights
    of ``config`` (seeded), ``tp`` ranks, on ``device`` in ``dtype``, the ranks' partial sums in
    ``allreduce_dtype``; sampled with ``sample`` (temperature, top-k: the generator seeded with
    ``seed``) instead of greedy."""
    import torch
    from pto.orchestration.llm.generate import Generator
    from pto.orchestration.llm.sampling import Sampler
    from pto.orchestration.model.program import CONFIGS, random_weights

    from pto.ir.dtypes import DType

    dt = DType.BF16 if dtype == "bf16" else DType.F32
    w = random_weights(CONFIGS[config], dt.torch, torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed + 1)
    prompts = [torch.randint(0, w.config.vocab, (n,), generator=g).tolist() for n in lengths]
    gen = Generator(w, device, dt, tp=tp, allreduce_dtype=allreduce_dtype)
    dist.counters(reset=True)
    try:
        sampler = Sampler(sample[0], sample[1], seed=seed) if sample else None
        got = gen.generate(prompts, new, stop_ids=(), sampler=sampler)
    finally:
        gen.close()
    return {"tokens": got.tokens, "collectives": dist.counters()}


LAUNCH_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict:
    """This environment without a torchrun launch's variables (the test may itself run under one)."""
    drop = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK"}
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PET_")}


#: the tries a launch makes when its port was taken between choosing it and binding it (another
#: test process, under pytest-xdist, may have been handed the same free port)
PORT_TRIES = 3


def launch(n: int, *args: str, env: dict | None = None, timeout: int = LAUNCH_TIMEOUT_S):
    """``python -m torch.distributed.run --nproc-per-node n --master-port FREE args``, again on
    another free port where the store could not bind the one chosen."""
    for _ in range(PORT_TRIES):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-port",
               str(free_port()), *args]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**clean_env(), **(env or {})}, timeout=timeout)
        if r.returncode == 0 or "address already in use" not in (r.stderr or "").lower():
            return r
    return r


def run_cases(tp: int, cases: list[dict], folder: Path, env: dict | None = None) -> dict[str, dict]:
    """Every case at ``tp`` ranks (tp = 1 in this process, without a process group); the results
    by case name, the outputs in ``folder``/NAME.safetensors."""
    spec = folder / "cases.json"
    spec.write_text(json.dumps(cases))
    if tp == 1:
        main(str(spec), str(folder))
    else:
        r = launch(tp, __file__, str(spec), str(folder), env=env)
        assert r.returncode == 0, r.stderr[-4000:]
    return {c["name"]: c for c in json.loads((folder / "results.json").read_text())}


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
