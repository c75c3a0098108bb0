"""One LLaMA decoder layer (LLaMA-7B dimensions or a tiny config) as a tiled task graph.

The seed's three phases, each a loop over row tiles with binary-expansion attributes:

1. per tile: RMSNorm, Q/K/V projections, RoPE on q and k (and the flash state init for the
   split and pair attention modes);
2. flash attention over (q tile, kv tile) pairs: ``split`` (score, softmax update, output update
   per pair: the seed's 3 tasks), ``pair`` (one task per pair) or ``fused`` (one task per q tile
   with the kv loop inside). Causal attention submits no fully masked pair;
3. per tile: output projection, residual, RMSNorm, gate and up projections, SwiGLU, down
   projection, residual.

Tile heights come from the SRAM model of the target (pto.passes.tiling): the flash-attention
block decides the q tile height, binary expansion runs blocks of base tiles with it and the
residual with the base height. Any sequence length works (the last tile is clipped).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pto.incore import llama as L

from pto import Orchestration, Var, cdiv, emin, f32
from pto.errors import SramError, UsageError
from pto.ir.dtypes import DType
from pto.passes.binary_expansion import tile_levels
from pto.program import Option, Program, Settings, seeded_randn
from pto.target import KiB, Target

MAX_RANGE = 4096  # base tiles in one full block of binary expansion (128K tokens of 32 rows)


@dataclass(frozen=True)
class LlamaConfig:
    hidden: int
    heads: int
    head_dim: int
    ffn: int
    eps: float = 1e-6
    theta: float = 10000.0


CONFIGS = {
    "tiny": LlamaConfig(hidden=256, heads=4, head_dim=64, ffn=704),
    "7b": LlamaConfig(hidden=4096, heads=32, head_dim=128, ffn=11008),
}


def flash_sram_bytes(rows: int, head_dim: int, dtype: DType) -> int:
    """On-chip bytes of one flash-attention block: Q, K, V, O (rows x d each) and S (rows x rows),
    so S grows quadratically and caps the tile height."""
    return (4 * rows * head_dim + rows * rows) * dtype.itemsize


def flash_tile_rows(target: Target, head_dim: int, dtype: DType, candidates=(256, 128, 64, 32, 16)) -> int:
    """The largest tile height whose flash-attention block fits the target's on-chip memory."""
    for r in candidates:
        if flash_sram_bytes(r, head_dim, dtype) <= target.sram_bytes:
            return r
    raise SramError(f"no flash-attention tile of {list(candidates)} rows with head dim {head_dim} "
                    f"({dtype}) fits the {target.sram_bytes // KiB} KiB of target {target.name}")


@dataclass(frozen=True)
class LlamaTiling:
    """Tile sizes of every function, derived from the target's on-chip memory."""

    base: int  # base tile height (residual tiles)
    tq: int  # q (and row) tile height
    tk: int  # kv tile height
    bn: int  # matmul output column block
    bk: int  # matmul K step
    norm_rows: int  # RMSNorm rows per program
    norm_chunk: int  # RMSNorm columns per pass step
    ew_block: int  # elementwise column block


def choose_tiling(cfg: LlamaConfig, dtype: DType, target: Target, tq: int | None = None,
                  shrink: int = 1, tk: int | None = None) -> LlamaTiling:
    """Tiles for ``target``: the q tile height from the flash-attention SRAM model (or ``tq``),
    kv tiles of ``tk`` rows (default: as tall as the q tiles); ``shrink`` divides the column
    blocks for targets with little on-chip memory."""
    if tq is None:
        tq = min(flash_tile_rows(target, cfg.head_dim, dtype), 128)
    tk = tq if tk is None else min(tk, tq)
    base = 32 if tq > 32 else max(tq // 2, 8)
    big = cfg.hidden >= 1024
    # 128 x 256 output blocks for the GEMMs where they fit (Hopper's shared memory, half types)
    wide = big and dtype.is_half and target.sram_bytes >= 200 * 1024
    return LlamaTiling(
        base=base, tq=tq, tk=tk,
        bn=max((256 if wide else 128 if big else 64) // shrink, 16), bk=max((64 if big else 32) // shrink, 16),
        norm_rows=16, norm_chunk=max(min(512 if big else 128, cfg.hidden) // shrink, 16),
        ew_block=max((128 if big else 64) // shrink, 16),
    )


def loop_attrs(base: int, top: int) -> dict:
    levels = tile_levels(base, top)
    if len(levels) == 1:
        return dict(tile_levels=levels)
    return dict(tile_levels=levels, max_range=MAX_RANGE, min_range=2)


class Functions:
    """The InCore functions of one (config, dtype, tiling, target, attention mode)."""

    def __init__(self, cfg: LlamaConfig, dt: DType, t: LlamaTiling, target: Target, causal: bool,
                 attention: str):
        H, NH, D, Fd = cfg.hidden, cfg.heads, cfg.head_dim, cfg.ffn
        tg = target
        self.rmsnorm = L.rmsnorm_tile(H, dt, t.tq, t.norm_rows, t.norm_chunk, cfg.eps, tg)
        # one matmul definition; calls bind K and N (dims) per weight
        self.matmul = L.matmul_tile(dt, t.tq, H, H, t.bn, t.bk, tg)
        self.rope = L.rope_tile(dt, t.tq, NH, D, target=tg)
        if attention == "fused":
            # the coarse-grained layer: epilogue fusions as well as the fused attention
            self.matmul_residual = L.matmul_residual_tile(dt, t.tq, H, H, t.bn, t.bk, tg)
            self.matmul_swiglu = L.matmul_swiglu_tile(dt, t.tq, H, Fd, t.bn // 2, t.bk, tg)
            self.fused = (L.flash_fused if causal else L.flash_fused_nc)(dt, NH, D, t.tq, t.tk, tg)
            return
        self.residual = L.residual_add(dt, t.tq, H, t.ew_block, tg)
        self.swiglu = L.swiglu_tile(dt, t.tq, Fd, t.ew_block, tg)
        self.init = L.flash_init(NH, D, t.tq, tg)
        self.normalize = L.flash_normalize(dt, NH, D, t.tq, tg)
        if attention == "pair":
            self.pair = L.flash_pair(dt, NH, D, t.tq, t.tk, causal, tg)
        else:
            self.score = L.flash_score(dt, NH, D, t.tq, t.tk, causal, tg)
            self.softmax = L.flash_softmax(NH, t.tq, t.tk, tg)
            self.output = L.flash_output(dt, NH, D, t.tq, t.tk, tg)


def fit_functions(cfg: LlamaConfig, dt: DType, target: Target, causal: bool, attention: str):
    """The tiling and functions: the SRAM model's q tile height, kv tiles as tall or 64 rows,
    narrower column blocks, then halved, until every function's live tiles fit the target (the
    model counts Q, K, V, O and S in the storage dtype; the functions also keep f32 scores and
    statistics)."""
    tq = min(flash_tile_rows(target, cfg.head_dim, dt), 128)
    last = None
    while tq >= 8:
        for tk in sorted({tq, min(tq, 64)}, reverse=True):  # the tallest kv tiles that fit
            for shrink in (1, 2, 4, 8):
                t = choose_tiling(cfg, dt, target, tq, shrink, tk)
                try:
                    return t, Functions(cfg, dt, t, target, causal, attention)
                except SramError as e:
                    last = e
        tq //= 2
    raise last


def build_module(cfg: LlamaConfig, dt: DType, target: Target, attention: str = "fused",
                 causal: bool = True):
    t, fn = fit_functions(cfg, dt, target, causal, attention)
    H, NH, D, Fd = cfg.hidden, cfg.heads, cfg.head_dim, cfg.ffn
    base = t.base
    o = Orchestration("llama7b")
    S = o.scalar("S")
    x = o.input("x", S, H, dt)
    g_attn, g_ffn = o.input("g_attn", 1, H, dt), o.input("g_ffn", 1, H, dt)
    wq, wk, wv, wo = (o.input(n, H, H, dt) for n in ("wq", "wk", "wv", "wo"))
    wg, wu, wd = o.input("wg", H, Fd, dt), o.input("wu", H, Fd, dt), o.input("wd", Fd, H, dt)
    cos, sin = o.input("cos", S, D // 2, dt), o.input("sin", S, D // 2, dt)
    xn, q, k, v, qr, kr = (o.temp(n, S, H, dt) for n in ("xn", "q", "k", "v", "qr", "kr"))
    attn, h, hn = (o.temp(n, S, H, dt) for n in ("attn", "h", "hn"))
    act = o.temp("act", S, Fd, dt)
    if attention != "fused":
        ao, dn = o.temp("ao", S, H, dt), o.temp("dn", S, H, dt)
        gate, up = o.temp("gate", S, Fd, dt), o.temp("up", S, Fd, dt)
    y = o.output("y", S, H, dt)
    if attention != "fused":
        m_, l_ = o.temp("m", S, NH, f32), o.temp("l", S, NH, f32)
        acc = o.temp("acc", S, H, f32)
    if attention == "split":
        s_ = o.temp("s", S, NH * t.tk, f32)
        alpha = o.temp("alpha", S, NH, f32)
    n = o.let("n", cdiv(S, base))
    q_loop = loop_attrs(base, t.tq)

    def rows(i):
        return emin(i.rows, S - i * base)

    def tile(tensor, i, cols):
        return (tensor, i * base, 0, rows(i), cols)

    # phase 1: pre-attention, per row tile
    with o.for_loop("i", 0, n, **q_loop) as i:
        R = {"R": i.rows}
        o.call(fn.rmsnorm, {"x": tile(x, i, H), "g": g_attn, "y": tile(xn, i, H)}, dims=R)
        for w, out in ((wq, q), (wk, k), (wv, v)):
            o.call(fn.matmul, {"x": tile(xn, i, H), "w": w, "y": tile(out, i, H)}, dims={**R, "K": H, "N": H})
        for src, dst in ((q, qr), (k, kr)):
            o.call(fn.rope, {"x": tile(src, i, H), "cos": tile(cos, i, D // 2), "sin": tile(sin, i, D // 2),
                             "y": tile(dst, i, H)}, dims=R)
        if attention != "fused":
            o.call(fn.init, {"m": tile(m_, i, NH), "l": tile(l_, i, NH), "acc": tile(acc, i, H)},
                   dims={"TQ": i.rows})

    # phase 2: attention
    with o.for_loop("qi", 0, n, **q_loop) as qi:
        qpos = qi * base
        q_end = emin(S, qpos + qi.rows)
        TQ = {"TQ": qi.rows}
        if attention == "fused":
            nkv = q_end if causal else S
            nfull = (qpos // t.tk) * t.tk if causal else (S // t.tk) * t.tk
            args = {"q": tile(qr, qi, H), "k": (kr, 0, 0, nkv, H), "v": (v, 0, 0, nkv, H),
                    "o": tile(attn, qi, H), "nfull": nfull, "nkv": nkv}
            if causal:
                args["qpos"] = qpos
            o.call(fn.fused, args, dims={**TQ, "TK": t.tk})
        else:
            kv_tiles = cdiv(q_end, base) if causal else n
            # the online-softmax state (m, l, acc) and split mode's scratch (s, alpha) of the q tile
            # are updated by every kv iteration: merging kv tiles re-associates that reduction
            with o.for_loop("kj", 0, kv_tiles, **loop_attrs(base, t.tk), reassociate=True) as kj:
                kpos = kj * base
                kvr = (kr, kpos, 0, rows(kj), H)
                vr = (v, kpos, 0, rows(kj), H)
                dims = {**TQ, "TK": kj.rows}
                state = {"m": tile(m_, qi, NH), "l": tile(l_, qi, NH), "acc": tile(acc, qi, H)}
                pos = {"qpos": qpos, "kpos": kpos} if causal else {}
                if attention == "pair":
                    o.call(fn.pair, {"q": tile(qr, qi, H), "k": kvr, "v": vr, **state, **pos}, dims=dims)
                else:
                    sreg = (s_, qpos, 0, rows(qi), NH * kj.rows)
                    o.call(fn.score, {"q": tile(qr, qi, H), "k": kvr, "s": sreg, **pos}, dims=dims)
                    o.call(fn.softmax, {"s": sreg, "m": state["m"], "l": state["l"],
                                        "alpha": tile(alpha, qi, NH)}, dims=dims)
                    o.call(fn.output, {"p": sreg, "v": vr, "alpha": tile(alpha, qi, NH), "acc": state["acc"]},
                           dims=dims)
            o.call(fn.normalize, {"l": tile(l_, qi, NH), "acc": tile(acc, qi, H), "y": tile(attn, qi, H)},
                   dims=TQ)

    # phase 3: post-attention and FFN, per row tile
    if attention == "fused":
        with o.for_loop("r", 0, n, **q_loop) as r:
            R = {"R": r.rows}
            o.call(fn.matmul_residual, {"x": tile(attn, r, H), "w": wo, "r": tile(x, r, H), "y": tile(h, r, H)},
                   dims={**R, "K": H, "N": H})
            o.call(fn.rmsnorm, {"x": tile(h, r, H), "g": g_ffn, "y": tile(hn, r, H)}, dims=R)
            o.call(fn.matmul_swiglu, {"x": tile(hn, r, H), "wg": wg, "wu": wu, "y": tile(act, r, Fd)},
                   dims={**R, "K": H, "N": Fd})
            o.call(fn.matmul_residual, {"x": tile(act, r, Fd), "w": wd, "r": tile(h, r, H), "y": tile(y, r, H)},
                   dims={**R, "K": Fd, "N": H})
        return o.module()
    with o.for_loop("r", 0, n, **q_loop) as r:
        R = {"R": r.rows}
        o.call(fn.matmul, {"x": tile(attn, r, H), "w": wo, "y": tile(ao, r, H)}, dims={**R, "K": H, "N": H})
        o.call(fn.residual, {"a": tile(x, r, H), "b": tile(ao, r, H), "y": tile(h, r, H)}, dims=R)
        o.call(fn.rmsnorm, {"x": tile(h, r, H), "g": g_ffn, "y": tile(hn, r, H)}, dims=R)
        for w, out in ((wg, gate), (wu, up)):
            o.call(fn.matmul, {"x": tile(hn, r, H), "w": w, "y": tile(out, r, Fd)}, dims={**R, "K": H, "N": Fd})
        o.call(fn.swiglu, {"a": tile(gate, r, Fd), "b": tile(up, r, Fd), "y": tile(act, r, Fd)}, dims=R)
        o.call(fn.matmul, {"x": tile(act, r, Fd), "w": wd, "y": tile(dn, r, H)}, dims={**R, "K": Fd, "N": H})
        o.call(fn.residual, {"a": tile(h, r, H), "b": tile(dn, r, H), "y": tile(y, r, H)}, dims=R)
    return o.module()


# ------------------------------------------------------------------------ the torch reference


def rope_tables(seq: int, cfg: LlamaConfig, dtype: DType, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * theta^(-2i/D), each seq x D/2."""
    half = cfg.head_dim // 2
    inv = cfg.theta ** (-torch.arange(half, dtype=torch.float64) * 2 / cfg.head_dim)
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    return (ang.cos().to(device=device, dtype=dtype.torch), ang.sin().to(device=device, dtype=dtype.torch))


def reference_layer(inp: dict[str, torch.Tensor], cfg: LlamaConfig, causal: bool = True) -> torch.Tensor:
    """The layer with plain torch ops in the inputs' dtype (SDPA for attention), written
    independently of the tiled program."""
    x = inp["x"]
    S, H = x.shape
    NH, D = cfg.heads, cfg.head_dim

    def rmsnorm(t, g):
        t32 = t.float()
        return (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + cfg.eps) * g.float()).to(t.dtype)

    def heads(t):
        return t.view(S, NH, D).transpose(0, 1)

    cos = torch.cat([inp["cos"], inp["cos"]], dim=-1)
    sin = torch.cat([inp["sin"], inp["sin"]], dim=-1)

    def rope(t):
        t1, t2 = t[..., : D // 2], t[..., D // 2:]
        return t * cos + torch.cat([-t2, t1], dim=-1) * sin

    xn = rmsnorm(x, inp["g_attn"])
    q, k, v = heads(xn @ inp["wq"]), heads(xn @ inp["wk"]), heads(xn @ inp["wv"])
    a = F.scaled_dot_product_attention(rope(q)[None], rope(k)[None], v[None], is_causal=causal)[0]
    h = x + a.transpose(0, 1).reshape(S, H) @ inp["wo"]
    hn = rmsnorm(h, inp["g_ffn"])
    return h + (F.silu(hn @ inp["wg"]) * (hn @ inp["wu"])) @ inp["wd"]


def layer_flops(cfg: LlamaConfig, seq: int, causal: bool = True) -> float:
    """Matmul flops of one layer (projections, attention QK^T and PV with the causal half)."""
    H, Fd = cfg.hidden, cfg.ffn
    proj = 2.0 * seq * H * (4 * H + 3 * Fd)
    attn = 4.0 * seq * seq * H * (0.5 if causal else 1.0)
    return proj + attn


# Launch parameters measured best per GPU architecture (bench/tune_kernels.py --seq 16384 on an
# H100 80GB HBM3, 2026-11-22; docs/PERF.md has the sweeps).
LAUNCH_DEFAULTS: dict[str, dict[str, dict]] = {
    "sm90": {
        # 128 x 256 output blocks, K step 64, 3 stages, groups of 8 row tiles x every column block
        # (the activation panel stays in L2): 667-695 TFLOP/s; tasks-fastest order: 591-615
        "matmul_tile": {"num_warps": 8, "num_stages": 3, "GROUP": 8},
        "matmul_residual_tile": {"num_warps": 8, "num_stages": 3, "GROUP": 8},
        # two 128 x 128 accumulators (the register budget of one 128 x 256 block), grouped:
        # 588 TFLOP/s with 3 stages, 568 with 4; tasks-fastest order 536
        "matmul_swiglu_tile": {"num_warps": 8, "num_stages": 3, "GROUP": 8},
        # tq 128, tk 128, base-2 softmax: 501 TFLOP/s causal at 16K (tk 64: 476-487)
        "flash_fused": {"num_warps": 8, "num_stages": 3},
        "flash_fused_nc": {"num_warps": 8, "num_stages": 3},
    },
}

ATTENTION_MODES = ("split", "pair", "fused")

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
    )
    default_seq = 128
    outputs = ("y",)

    def default_config(self, device: str) -> str:
        return "7b" if device == "cuda" else "tiny"

    def build(self, s: Settings):
        return build_module(CONFIGS[s.config], s.dtype, s.target, s["attention"], s["causal"])

    def tiling(self, s: Settings) -> LlamaTiling:
        return fit_functions(CONFIGS[s.config], s.dtype, s.target, s["causal"], s["attention"])[0]

    def counts(self, s: Settings, seq: int, adaptive: bool = True) -> dict[str, int]:
        """Exact task and edge counts (see :func:`closed_form`), for ``pto estimate``."""
        return closed_form(CONFIGS[s.config], self.tiling(s), seq, s["attention"], s["causal"], adaptive)

    def check_size(self, s: Settings, seq: int) -> None:
        """Refuse, before any work, a graph the runtime cannot hold (2^31 - 1 task ids, 2^31
        edges)."""
        c = self.counts(s, seq, True)
        if c["tasks"] >= 2**31 - 1 or c["edges"] >= 2**31:
            raise UsageError(f"llama7b at seq {seq}: {c['tasks']:,} tasks and {c['edges']:,} edges exceed the "
                             "runtime's limits (2^31 task ids and edges); use a shorter --seq or "
                             "`pto estimate` for the counts")

    def launch_defaults(self, s: Settings) -> dict[str, dict]:
        return dict(LAUNCH_DEFAULTS.get(s.target.arch, {}))

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


# --------------------------------------------------------------------------- closed forms


def row_tiles(n: int, base: int, top: int) -> list[tuple[int, int]]:
    """(start, height) in base tiles of the row tiles an adaptive loop over n base tiles runs
    after binary expansion (one task per tile per call in the loop body)."""
    from pto.ir.expr import bx_blocks
    from pto.passes.binary_expansion import height_of_block

    levels = tile_levels(base, top)
    if len(levels) == 1:
        return [(i, 1) for i in range(n)]
    lv = tuple(sorted(levels.items()))
    out = []
    for start, size in bx_blocks(n, MAX_RANGE, 2):
        hb = (height_of_block(lv, size) if size >= 2 else base) // base
        out += [(start + k * hb, hb) for k in range(size // hb)]
    return out


def closed_form(cfg: LlamaConfig, t: LlamaTiling, seq: int, attention: str, causal: bool,
                adaptive: bool = True) -> dict[str, int]:
    """Exact task and edge counts of the layer's graph without building it, in O(n / 4096 +
    log^2 n) for n base tiles (milliseconds up to 2**31 - 1 tokens: nothing is enumerated per
    tile).

    With T row tiles, P (q tile, kv tile) pairs and Q = sum over q tiles of the row tiles their
    kv range overlaps (docs/ESTIMATE.md derives each term):
    fused: tasks 11T, edges 11T + 2Q; pair: tasks 16T + P, edges 16T + 4P;
    split: tasks 16T + 3P, edges 14T + 10P.
    """
    from pto.ir.expr import bx_blocks
    from pto.passes.binary_expansion import closed_form_iterations, height_of_block

    n = -(-seq // t.base)
    tq, tk = (t.tq, t.tk) if adaptive else (t.base, t.base)
    q_levels = tuple(sorted(tile_levels(t.base, tq).items()))
    kv_levels = tuple(sorted(tile_levels(t.base, tk).items()))
    M = MAX_RANGE

    def w(p: int) -> int:
        """kv tiles of one binary-expansion block of p base tiles (p = 1: the residual tile)."""
        return p if p < 2 else p // (height_of_block(kv_levels, p) // t.base)

    def low(r: int) -> int:
        """kv tiles over the r < M base tiles after the full blocks: one block per set bit."""
        return sum(w(1 << b) for b in range(r.bit_length()) if r >> b & 1)

    def q_block(start: int, p: int) -> tuple[int, int]:
        """(q tiles, pairs) of the q block of p base tiles at ``start`` within its M-chunk."""
        h = height_of_block(q_levels, p) // t.base if p >= 2 else 1
        c = p // h
        # the bit arithmetic needs power-of-two tiles dividing their block: tile_levels gives
        # min(p * base, top) with power-of-two base and top, so this only guards future levels
        if h & (h - 1) or p % h:
            raise ValueError(f"q tiles of {h} base tiles in a block of {p}: not a power-of-two split")
        return c, c * low(start) + w(p) + (c // 2) * sum(w(h << b) for b in range(c.bit_length() - 1))

    def causal_pairs() -> int:
        """The sum over q tiles of K(end of the q tile), K(m) = kv tiles covering m base tiles.

        K(m) = (m // M) w(M) + low(m % M): the blocks of bx_blocks (min_range 2), additive over
        disjoint bits. A q block of p base tiles starts at a multiple of 2p (the sum of the
        larger bits), so its c = p / h q tiles end at start + j h (j = 1 .. c): K sums to
        c low(start) + w(p) (the last end sets bit p) + the bits of j h for j < c, each bit of
        j < c being set for c / 2 of them. Per block O(log n) instead of O(tiles * log n).
        """
        full = n // M
        c_full, per_full = q_block(0, M)
        # full block k: its q tiles also count the k full kv blocks before it (its last tile,
        # ending at (k + 1) M, counts w(M) more: in per_full)
        total = full * per_full + c_full * w(M) * (full * (full - 1) // 2)
        for start, p in bx_blocks(n % M, M, 2):
            c, pairs = q_block(start, p)
            total += pairs + c * full * w(M)
        return total

    # a loop without adaptive levels is not expanded (one iteration per base tile); with a
    # single level closed_form_iterations counts exactly that
    T = closed_form_iterations(n, M, 2, q_levels)
    if attention == "fused":
        P = 0  # no pair loop: one attention task per q tile
    elif causal:
        P = causal_pairs()
    else:
        P = T * closed_form_iterations(n, M, 2, kv_levels)
    # every kv range ends on a row-tile boundary: q tile i overlaps i + 1 row tiles (causal)
    Q = T * (T + 1) // 2 if causal else T * T
    tasks = {"fused": 11 * T, "pair": 16 * T + P, "split": 16 * T + 3 * P}[attention]
    edges = {"fused": 11 * T + 2 * Q, "pair": 16 * T + 4 * P, "split": 14 * T + 10 * P}[attention]
    return {"tasks": tasks, "edges": edges, "row_tiles": T, "pairs": P}

