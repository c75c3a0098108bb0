"""The ``llama7b`` program (:class:`LlamaProgram`, registered as ``PROGRAM``): its options,
settings, inputs, reference and counts, over the pieces of this package. Its measured launch
parameters are schedule data (pto/schedules/data/<device>/)."""

from __future__ import annotations

import torch
from pto.orchestration.llama.config import ATTENTION_MODES, CONFIGS
from pto.orchestration.llama.counts import closed_form
from pto.orchestration.llama.llama7b import build_module
from pto.orchestration.llama.reference import layer_flops, reference_layer, rope_tables
from pto.orchestration.llama.tiling import LlamaTiling, fit_functions

from pto import Var
from pto.errors import UsageError
from pto.program import Option, Program, Settings, seeded_randn

#: seed 004's published task counts (with, without adaptive tiles) of its setting (Ascend 910B,
#: f32, bidirectional, split attention), and the bytes per task of its runtime
SEED_ROWS = {1024: (1024, 3584), 2048: (3584, 13312), 4096: (13312, 51200), 8192: (51200, 200704),
             16384: (200704, 794624)}


SEED_BYTES_PER_TASK = 2864


class LlamaProgram(Program):
    name = "llama7b"
    description = "one LLaMA decoder layer (7b: hidden 4096, 32 heads x 128, FFN 11008; tiny for the CPU)"
    configs = CONFIGS
    options = (
        Option("attention", "fused", "attention granularity: split (3 tasks per q x kv tile pair, the seed's), "
               "pair (1 task per pair) or fused (1 task per q tile, residuals and SwiGLU fused too)",
               choices=ATTENTION_MODES),
        Option("causal", True, "causal attention"),
        Option("fuse_norm_rope", False, "with --attention fused: fold each RMSNorm into the projections after it "
               "and apply RoPE in the q and k projections' epilogue (7 tasks per row tile instead of 11)"),
    )
    default_seq = 128
    outputs = ("y",)

    def default_config(self, device: str) -> str:
        return "7b" if device == "cuda" else "tiny"

    def check_settings(self, s: Settings) -> None:
        if s["fuse_norm_rope"] and s["attention"] != "fused":
            raise UsageError(f"llama7b: --fuse-norm-rope needs --attention fused (got --attention {s['attention']})")

    def build(self, s: Settings):
        return build_module(CONFIGS[s.config], s.dtype, s.target, s["attention"], s["causal"], s["fuse_norm_rope"])

    def tiling(self, s: Settings) -> LlamaTiling:
        return fit_functions(CONFIGS[s.config], s.dtype, s.target, s["causal"], s["attention"],
                             s["fuse_norm_rope"])[0]

    def counts(self, s: Settings, seq: int, adaptive: bool = True) -> dict[str, int]:
        """Exact task and edge counts (see :func:`closed_form`), for ``pto estimate``."""
        return closed_form(CONFIGS[s.config], self.tiling(s), seq, s["attention"], s["causal"], adaptive,
                           s["fuse_norm_rope"])

    def check_size(self, s: Settings, seq: int) -> None:
        """Refuse, before any work, a graph the runtime cannot hold (2^31 - 1 task ids, 2^31
        edges)."""
        c = self.counts(s, seq, True)
        if c["tasks"] >= 2**31 - 1 or c["edges"] >= 2**31:
            raise UsageError(f"llama7b at seq {seq}: {c['tasks']:,} tasks and {c['edges']:,} edges exceed the "
                             "runtime's limits (2^31 task ids and edges); use a shorter --seq or "
                             "`pto estimate` for the counts")

    def seed_settings(self, config: str) -> Settings:
        """The setting of seed 004's table."""
        from pto.target import get

        return self.settings(config=config, dtype="f32", target=get("ascend910b"), attention="split", causal=False)

    def estimate_baselines(self, s: Settings) -> list:
        from pto.estimate import Baseline

        return [Baseline("seed setting (ascend910b f32 split)", self.seed_settings(s.config),
                         {k: v[0] for k, v in SEED_ROWS.items()}, ("seed runtime", SEED_BYTES_PER_TASK))]

    def scalar_exprs(self, s):
        return {"S": Var("seq")}

    def inputs(self, s, seq, device, seed=0):
        cfg = CONFIGS[s.config]
        dt = s.dtype
        H, Fd = cfg.hidden, cfg.ffn
        dev = torch.device(device)
        g = torch.Generator(device=dev if dev.type == "cuda" else "cpu").manual_seed(seed)

        def rnd(*shape, scale=1.0):
            if dev.type == "cuda":
                return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * scale).to(dt.torch)
            return seeded_randn(shape, dt, dev, g, scale)

        cos, sin = rope_tables(seq, cfg, dt, dev)
        return {
            "x": rnd(seq, H),
            "g_attn": (1.0 + 0.1 * rnd(1, H).float()).to(dt.torch),
            "g_ffn": (1.0 + 0.1 * rnd(1, H).float()).to(dt.torch),
            "wq": rnd(H, H, scale=H ** -0.5), "wk": rnd(H, H, scale=H ** -0.5),
            "wv": rnd(H, H, scale=H ** -0.5), "wo": rnd(H, H, scale=H ** -0.5),
            "wg": rnd(H, Fd, scale=H ** -0.5), "wu": rnd(H, Fd, scale=H ** -0.5),
            "wd": rnd(Fd, H, scale=Fd ** -0.5),
            "cos": cos, "sin": sin,
        }

    def reference(self, s, seq, inputs):
        return {"y": reference_layer(inputs, CONFIGS[s.config], s["causal"])}

    def flops(self, s, seq):
        return layer_flops(CONFIGS[s.config], seq, s["causal"])


PROGRAM = LlamaProgram()
