"""The GPU smoke check: every GPU command the README shows and every program x attention mode x
executor at a power of two and an odd length, the LLaMA family's configurations, with the
schedules that apply on this device and with none (the renderer's heuristics), each as a user
runs it (``python -m pto.cli ...`` in its own process). Run it after any change to kernels,
schedules, executors or programs; record its last green run in docs/PERF.md ("GPU smoke check").

    python bench/smoke.py [--jobs N] [--only SUBSTRING[,SUBSTRING...]] [--shard K/N] [--json FILE] [--list]

Jobs run N at a time (default: the CPU count up to 8; the Triton compiles dominate, and they run
on the CPU); a run passes when it exits 0 and, where it prints JSON with ``rel_err``, the error
is within the dtype's tolerance (bf16 2e-2, f32 1e-4). A job that needs what the machine lacks
(``dot`` for drawings, a C compiler, two GPUs) is skipped and says why. On a device other than
the H100 the H100's shipped schedules run too (``PTO_SCHEDULES``), unless the device runs them
already where its own have no entry (an H200: the H100's are its kin). Exit status 1 if any job
failed. Timings are not measurements: the jobs share the GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"
#: SmolLM2's tokenizer as tokenizer.json (the GGUF file is too large to carry to the GPU machine)
TOKENIZER = ROOT / ".bench" / "smol-tokenizer" / "tokenizer.json"
TOL = {"bf16": 2e-2, "f32": 1e-4}


@dataclass
class Job:
    name: str
    argv: list[str]
    env: dict = field(default_factory=dict)
    needs: str = ""  # "dot", "cc", "2gpus": skipped without it
    tol: float | None = 2e-2  # rel_err bound when the output is JSON with rel_err
    shell: bool = False  # argv[0] is a shell line (README's codegen + cc)
    exclusive: bool = False  # needs most of the GPU's memory: runs alone, after the others


def pto(*args: str) -> list[str]:
    return [sys.executable, "-m", "pto.cli", *args]


def torchrun(*args: str) -> list[str]:
    """Two ranks on a free port (jobs run side by side)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "pto.cli",
            *args]


def readme_jobs(tmp: Path) -> list[Job]:
    """The GPU commands of README.md's Usage, as written there (paths into ``tmp``; the long
    ones with fewer iterations or a smaller budget: the check is that they run, not their time)."""
    t = str(tmp)
    gen = f"{t}/gen"
    return [
        Job("readme info", pto("info"), tol=None),
        Job("readme run", pto("run", "llama7b"), tol=None),
        Job("readme run split 1000", pto("run", "llama7b", "--seq", "1000", "--attention", "split", "--check",
                                         "--json")),
        Job("readme run 16K profile", pto("run", "llama7b", "--config", "7b", "--device", "cuda", "--seq", "16384",
                                          "--check", "--repeat", "20", "--profile", "--json")),
        Job("readme run pair persistent trace", pto("run", "llama7b", "--config", "7b", "--attention", "pair",
                                                    "--executor", "persistent", "--trace", f"{t}/trace_pair.json"),
            tol=None),
        Job("readme softmax dump", pto("run", "softmax", "--check", "--dump", f"{t}/graph.txt", "--trace",
                                       f"{t}/trace.json", "--json")),
        Job("readme codegen + cc", [f"{sys.executable} -m pto.cli codegen llama7b --out {gen} --config 7b --target "
                                    f"cuda_h100 --dtype bf16 && cc -O2 -Wall -Wextra -Werror {gen}/*.c -o {gen}/graph "
                                    f"-lm -pthread && {gen}/graph 16384"], needs="cc", tol=None, shell=True),
        Job("readme estimate plot", pto("estimate", "llama7b", "--seq", "1024,4096,16384,131072", "--config", "7b",
                                        "--target", "cuda_h100", "--dtype", "bf16", "--plot", f"{t}/tasks.png"),
            tol=None),
        Job("readme bench", pto("bench", "llama7b", "--seq", "1024,4096,16384", "--executor", "waves,persistent",
                                "--json", f"{t}/bench.json", "--iterations", "3", "--warmup", "1"), tol=None),
        Job("readme bench softmax cpu", pto("bench", "softmax", "--device", "cpu", "--seq", "1000", "--compare",
                                            "eager"), tol=None),
        Job("readme tune", pto("tune", "llama7b", "--seq", "1024", "--budget-s", "20"), tol=None,
            env={"PTO_CACHE_DIR": f"{t}/tunecache"}),
        Job("readme tune show", pto("tune", "llama7b", "--show", "--seq", "4096"), tol=None),
        Job("readme sentinel", pto("run", "llama7b", "--sentinel", "--save", f"{t}/y.safetensors", "--json"),
            tol=None),
        Job("readme check-schedule", pto("run", "llama7b", "--attention", "split", "--check-schedule", "--json"),
            tol=None),
        Job("readme llama3-8b 4096", pto("run", "llama", "--config", "llama3-8b", "--seq", "4096", "--check",
                                         "--json")),
        Job("readme estimate tp", pto("estimate", "llama7b", "--config", "7b", "--dtype", "bf16", "--target",
                                      "cuda_h100", "--tp", "4", "--seq", "4096,32768"), tol=None),
        Job("readme tp 2 cpu", torchrun("run", "llama7b", "--tp", "2", "--device", "cpu", "--check", "--json"),
            tol=1e-4),
        Job("readme tp 2 gpu (gloo, one GPU)", torchrun("run", "llama", "--config", "llama3-8b", "--seq", "4096",
                                                        "--tp", "2", "--check", "--json"),
            env={"PTO_DIST_BACKEND": "gloo"}),
        Job("generate (SmolLM2's shape, random weights)", [
            f"{sys.executable} {ROOT / 'bench' / 'smoke.py'} --make-model {t}/smol && {sys.executable} -m pto.cli "
            f"generate --hf {t}/smol --prompt 'The capital of France is' --max-new-tokens 16 --json"],
            needs="tokenizer", tol=None, shell=True),
        Job("readme visualize", [f"{sys.executable} -m pto.cli run softmax --dump {t}/g2.txt >/dev/null && "
                                 f"{sys.executable} -m pto.cli visualize {t}/g2.txt {t}/graph.pdf"],
            needs="dot", tol=None, shell=True),
    ]


def runs() -> list[tuple[str, list[str]]]:
    """``(label, pto run arguments)``: every program x attention mode x executor at a power of two
    and an odd length, and the family's configurations."""
    out = []
    for seq in ("1024", "1537"):
        for ex in ("waves", "persistent"):
            for prog in ("softmax", "bgemm"):
                out.append((f"{prog} {seq} {ex}", [prog, "--seq", seq, "--executor", ex]))
            for mode in ("fused", "pair", "split"):
                out.append((f"llama7b 7b {mode} {seq} {ex}", ["llama7b", "--config", "7b", "--attention", mode,
                                                             "--seq", seq, "--executor", ex]))
            # the norms folded into the projections (their statistics tasks, RoPE and SwiGLU epilogues)
            out.append((f"llama7b 7b fused norms folded {seq} {ex}", ["llama7b", "--config", "7b", "--seq", seq,
                                                                      "--fuse-norm-rope", "--executor", ex]))
    for config in ("llama2-7b", "llama3-8b", "mistral-7b"):
        for ex in ("waves", "persistent"):
            out.append((f"llama {config} fused 5555 {ex}", ["llama", "--config", config, "--seq", "5555",
                                                            "--executor", ex]))
    out.append(("llama llama3-8b fused norms folded 5555 waves", ["llama", "--config", "llama3-8b", "--seq", "5555",
                                                                  "--fuse-norm-rope", "--executor", "waves"]))
    for config in ("tiny-gqa", "tiny-swa"):
        for mode in ("split", "pair", "fused"):
            out.append((f"llama {config} {mode} 333 persistent", ["llama", "--config", config, "--attention", mode,
                                                                  "--seq", "333", "--executor", "persistent"]))
    out.append(("llama7b 7b fused 20001 auto", ["llama7b", "--config", "7b", "--seq", "20001"]))
    # 1280 slots: 20 chunks, one combine reads them at once; 4096: 64 chunks, two levels (a merge
    # per span of 16); the 8B model at 2 sequences: its dot path's tiles (blocks of 32 outputs; the
    # persistent tiles' one round of items a projection, DecodeTiling.dot_round)
    for config, cache, batches, executors in (("smollm2-135m", "1280", ("1", "3"), ("waves", "persistent")),
                                              ("smollm2-135m", "4096", ("1",), ("waves", "persistent")),
                                              ("llama3-8b", "512", ("1",), ("waves", "persistent")),
                                              ("llama3-8b", "512", ("2",), ("waves", "persistent"))):
        for ex in executors:
            for batch in batches:
                out.append((f"model {config} cache {cache} batch {batch} {ex}",
                            ["model", "--config", config, "--cache", cache, "--batch", batch, "--executor", ex]))
    return out


def matrix_jobs(schedules: dict[str, dict]) -> list[Job]:
    """:func:`runs` under each schedule setting, checked against the reference. A whole model's
    step in bf16 is further from the f32 reference than one layer (30 layers of rounding: torch's
    own bf16 step of SmolLM2's configuration is 2.7e-2 from float64, docs/PERF.md), hence 5e-2;
    the 8B model's step (16 GB of weights, 32 GB with the check's copy) runs alone."""
    return [Job(f"[{sname}] {label}", pto("run", *args, "--check", "--json"), env=dict(env),
                tol=5e-2 if label.startswith("model") else 2e-2, exclusive=label.startswith("model llama3-8b"))
            for sname, env in schedules.items() for label, args in runs()
            if sname == "device" or not label.startswith("model llama3-8b")]  # no schedules for it to differ by


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""


def schedule_sets(dev: str) -> dict[str, dict]:
    """The schedules the matrix runs under, by name: the device's own (what a user gets), none
    (the heuristics) and, on another GPU than the H100, the H100's shipped ones, unless the device
    runs those already where its own have no entry (the H100 stands in for it:
    pto.backends.triton.schedules.KIN; tests/gpu/test_schedules_gpu.py fits every shipped entry
    on the GPU)."""
    from pto import programs
    from pto.backends.triton.schedules import ScheduleDB, device_key

    sets = {"device": {}, "none": {"PTO_SCHEDULES": "none"}}
    if not dev or dev == H100:
        return sets
    db = ScheduleDB(dev, shipped=programs.get("llama7b").schedules)
    if device_key(H100) not in {d.name for d in db.kin_dirs}:
        sets["h100"] = {"PTO_SCHEDULES": H100}
    return sets


def missing(needs: str) -> str | None:
    if needs == "dot" and shutil.which("dot") is None:
        return "graphviz's dot is not installed"
    if needs == "cc" and shutil.which("cc") is None:
        return "no C compiler"
    if needs == "tokenizer" and not TOKENIZER.is_file():
        return f"no {TOKENIZER} (bench/smoke.py --save-tokenizer GGUF makes it)"
    return None


def make_model(folder: str) -> None:
    """A Hugging Face folder of SmolLM2-135M's configuration with random weights (transformers
    saves it) and SmolLM2's tokenizer (:data:`TOKENIZER`): what pto generate --hf reads."""
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                                   num_key_value_heads=3, num_hidden_layers=30, vocab_size=49152, rms_norm_eps=1e-5,
                                   rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True,
                                   bos_token_id=1, eos_token_id=2)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    shutil.copy(TOKENIZER, Path(folder) / "tokenizer.json")


def run_job(job: Job, base_env: dict, timeout: int) -> dict:
    why = missing(job.needs)
    if why:
        return {"name": job.name, "status": "skipped", "why": why}
    env = {**base_env, **job.env}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(job.argv[0] if job.shell else job.argv, shell=job.shell, cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": job.name, "status": "failed", "why": f"timed out after {timeout} s", "s": timeout}
    out = {"name": job.name, "s": round(time.perf_counter() - t0, 1), "rc": proc.returncode}
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode != 0:
        return {**out, "status": "failed", "why": last[:400]}
    err = _rel_err(proc.stdout)
    if err is not None:
        out["rel_err"] = err
        if job.tol is not None and not err <= job.tol:
            return {**out, "status": "failed", "why": f"rel_err {err:.3g} > {job.tol:g}"}
    return {**out, "status": "passed"}


def _rel_err(stdout: str) -> float | None:
    """rel_err of the JSON object a command printed (torchrun: every rank's line; the worst)."""
    errs = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                v = json.loads(line).get("rel_err")
            except ValueError:
                continue
            if v is not None:
                errs.append(float(v))
    return max(errs) if errs else None


def shard(text: str) -> tuple[int, int]:
    """``K/N`` -> (K, N), 1 <= K <= N; SystemExit naming anything else."""
    parts = text.split("/")
    if len(parts) == 2 and all(x.isdigit() for x in parts) and 1 <= int(parts[0]) <= int(parts[1]):
        return int(parts[0]), int(parts[1])
    raise SystemExit(f"smoke: --shard {text}: K/N, the K-th of N parts (1 <= K <= N)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--only", default="", help="run the jobs whose name contains one of these (comma-separated)")
    ap.add_argument("--json", default=None, help="write every job's result here")
    ap.add_argument("--shard", default="", metavar="K/N",
                    help="every N-th job from the K-th (1 to N): the check split over N device calls (the whole "
                         "takes 510-600 s on an H200 at --jobs 16 with empty caches: a shard of 2 took more than "
                         "300 s once, so 3 shards leave a call room)")
    ap.add_argument("--list", action="store_true", help="list the jobs and exit")
    ap.add_argument("--timeout", type=int, default=420, help="seconds one job may take")
    ap.add_argument("--make-model", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--save-tokenizer", metavar="GGUF", help="write SmolLM2's tokenizer.json for the generate job")
    args = ap.parse_args(argv)
    if args.make_model:
        make_model(args.make_model)
        return 0
    if args.save_tokenizer:
        from pto.orchestration.llm.tokenizer import load_tokenizer

        TOKENIZER.parent.mkdir(parents=True, exist_ok=True)
        load_tokenizer(args.save_tokenizer).backend.save(str(TOKENIZER))
        return 0
    dev = device_name()
    schedules = schedule_sets(dev)
    k, n = shard(args.shard) if args.shard else (1, 1)
    tmp = Path(tempfile.mkdtemp(prefix="pto-smoke-"))
    jobs = [j for j in readme_jobs(tmp) + matrix_jobs(schedules) if any(o in j.name for o in args.only.split(","))]
    jobs = jobs[k - 1::n]
    if args.list:
        shutil.rmtree(tmp, ignore_errors=True)
        print("\n".join(j.name for j in jobs))
        return 0
    if importlib.util.find_spec("cffi") is None:  # (every job would fail on it, one by one)
        raise SystemExit("smoke: cffi is not importable, and every job runs the C runtime: on the device machine "
                         "install the carried wheels first (python3 -m pip install -q --no-index --no-deps --target "
                         "/tmp/site .whl/*.whl; PYTHONPATH=/tmp/site:$PWD), as bench/gpu_session.sh does")
    # a fresh cache: the user's schedule database is empty, every kernel is compiled here
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])),
            "PTO_CACHE_DIR": str(tmp / "cache")}
    t0 = time.perf_counter()
    # the longest first, so the slowest job does not start last
    order = sorted(jobs, key=lambda j: ("16K" not in j.name and "bench" not in j.name and "tune" not in j.name))
    results = []

    def report(r: dict) -> None:
        results.append(r)
        print(f"{r['status']:8} {r.get('s', 0):6.1f} s  {r['name']}" + (f"  ({r['why']})" if r.get("why") else "")
              + (f"  rel_err {r['rel_err']:.2e}" if "rel_err" in r else ""), flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        for r in pool.map(lambda j: run_job(j, base, args.timeout), [j for j in order if not j.exclusive]):
            report(r)
    for j in order:
        if j.exclusive:
            report(run_job(j, base, args.timeout))
    total = time.perf_counter() - t0
    failed = [r for r in results if r["status"] == "failed"]
    summary = {"device": dev, "jobs": len(results), "failed": len(failed),
               "skipped": sum(r["status"] == "skipped" for r in results), "wall_s": round(total, 1),
               "date": time.strftime("%Y-%m-%d"), "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    print(f"smoke: {len(results) - len(failed) - summary['skipped']} passed, {len(failed)} failed, "
          f"{summary['skipped']} skipped in {total:.0f} s on {dev or 'no GPU'}")
    for r in failed:
        print(f"FAILED {r['name']}: {r['why']}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
