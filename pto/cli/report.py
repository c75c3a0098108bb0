"""The text ``pto run`` prints (``--json`` prints the result itself)."""

from __future__ import annotations

from pto.cli.commands.estimate import describe_columns


def format_summary(res: dict, options: tuple[str, ...] = ()) -> str:
    opts = "".join(f" {k}={res[k]}" for k in options if res.get(k, "") != "")
    # the program's named shape (seq=..., or cache=... batch=...)
    shape = " ".join(f"{k}={v}" for k, v in res.get("shape", {"seq": res.get("seq")}).items())
    # the kernels' compile (or load) of a first run, apart from its execution
    k = res.get("kernel_compile_ms")
    kernels = f"  kernels {k:.1f} ms (compiled or loaded)" if k else ""
    lines = [
        f"{res['program']} {shape} config={res['config']} dtype={res['dtype']} target={res['target']}{opts}",
        f"device={res['device']} backend={res['backend']} executor={res['executor']}",
        f"tasks {res['tasks']}  edges {res['edges']}  launches {res['launches']}",
        f"build {res['build_ms']:.2f} ms  exec {res['exec_ms']:.2f} ms{kernels}",
    ]
    counted = describe_columns(res)
    if counted:
        lines.append(counted)
    if "replay_ms" in res:
        lines.append(f"replay {res['replay_ms']:.3f} ms (median of {res['replays']}, {res['replay_mode']})")
    if "rel_err" in res:
        lines.append(f"rel_err {res['rel_err']:.3e} vs the torch reference")
    if "nonfinite" in res:
        from pto.safety.blame import format_nonfinite

        lines += format_nonfinite(res["nonfinite"]) if res.get("nonfinite") else ["sentinel: every output is finite"]
    if "schedule" in res:
        sc = res["schedule"]
        lines.append(f"schedule checked: {sc['tasks']} tasks, {sc['dependencies']} dependencies kept, "
                     f"{sc['concurrent_pairs']} concurrent accesses without a conflict")
    if "profile" in res:
        lines.append("time per InCore function (ms):")
        lines += [f"  {k:<28} {v:9.3f}" for k, v in res["profile"].items()]
    return "\n".join(lines)


__all__ = ["format_summary"]
