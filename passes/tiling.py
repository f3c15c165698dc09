"""tiling: BLOCK_M, BLOCK_N, num_warps and num_stages of the attention kernel."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import DictionaryAttr, IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.passes import ModulePass

from attnfuse.dialects import attn
from attnfuse.dialects.attn import Placement, PlacementAttr
from attnfuse.passes.analysis import AttentionChains, analyse, check_sm, target_option, variant_funcs
from attnfuse.passes.kernel_path import DECODE, FP8, kernel_path

# (sm, head-dim bucket, variant class) -> (BLOCK_M, BLOCK_N, num_warps, num_stages).
# Head-dim bucket: the padded head dim (<= 64, <= 128, <= 256). Variant class: `plain`
# (no K transform in the loop, no score mods), `kloop` (K transformed in the KV loop),
# `mods` (softcap / bias / score_mod). sm 0 is the CPU interpreter: large tiles, few
# programs. The sm90 entries for head dims 64 and 128 are the winners of the 30-configuration
# sweep on the lent H200 (2026-11-29, benchmarks/results/h200/sweep_tiles.md: causal, RoPE with
# K in the loop, softcap at B4/H12/N4096/D64 and B1/H32-8/N8192/D128); the D=256 and sm80
# entries are unmeasured defaults.
# On sm90 a forward that kernel-path gives the Gluon kernel (passes/kernel_path.py) still gets
# these tiles for the generic kernel generated beside it; the Gluon kernel has its own fixed
# 128x128 tiles. It takes every variant class at head dim 128 (1.1-1.6x this table's kernel,
# benchmarks/results/h200/run_2026-12-01_families/); the class it does not take: head dim 64,
# where it measured 0.93-1.10x this table's kernel with Q's transforms in a pre-rotation kernel
# and 1.00-1.02x without (benchmarks/results/h200/run_2026-12-01_gluon/).
# Class `decode` (kernel-path's decode path): BLOCK_M is the fewest rows of the packed query tile
# (the launcher takes the next power of two of query heads per KV head x queries, at least this),
# BLOCK_N the keys of each step. sm90 at head dim 128: the winner of the 18-configuration sweep on the
# lent H200 (2026-12-02, benchmarks/results/h200/run_2026-12-02_decode/sweep_decode.md: BN 64, 4 warps,
# 2 stages fastest or within 1% at batch 8 to 128, 4% below BN 64 / 3 stages at 1 x 4k); the others
# are unmeasured defaults.
# Class `fp8` (kernel-path's FP8 path, e4m3 products): at head dim 128 the fastest of four tilings
# on the lent H200 (2026-12-02, benchmarks/results/h200/run_2026-12-02_fp8/: 64 x 128, 4 warps,
# 3 stages, 1.10-1.15x 128 x 64 / 8 warps at N = 4096-16384, though it spills 324 bytes); head
# dim 64 is unmeasured (128 x 64, 8 warps: no spills); elsewhere the class falls back to `plain`.
# Class `bwd` (a backward function): BLOCK_M is the rows each program owns (queries in the
# dQ kernel, keys in the dK/dV kernel) and BLOCK_N the rows of each step of its loop. The
# sm90 entries for head dims 64 and 128 are the winners of the 16-configuration sweep on the
# lent H200 (2026-11-30, benchmarks/results/h200/run_2026-11-30_backward/bwd_tiles.md: RoPE +
# causal, paper shape at N=4096, Llama shape at N=8192); the others are unmeasured defaults.
TILING_TABLE: dict[tuple[int, int, str], tuple[int, int, int, int]] = {
    (90, 64, "plain"): (128, 64, 4, 3),
    (90, 64, "kloop"): (128, 32, 8, 3),
    (90, 64, "mods"): (64, 64, 4, 3),
    (90, 128, "plain"): (128, 128, 8, 3),
    (90, 128, "kloop"): (128, 32, 8, 3),
    (90, 128, "mods"): (64, 64, 4, 3),
    (90, 256, "plain"): (64, 32, 4, 2),
    (90, 256, "kloop"): (64, 32, 4, 2),
    (90, 256, "mods"): (64, 32, 4, 2),
    (80, 64, "plain"): (128, 64, 4, 3),
    (80, 128, "plain"): (128, 32, 4, 2),
    (80, 256, "plain"): (64, 32, 4, 2),
    (90, 64, "bwd"): (64, 64, 4, 3),
    (90, 128, "bwd"): (128, 64, 8, 3),
    (90, 256, "bwd"): (32, 32, 4, 1),
    (80, 64, "bwd"): (64, 32, 4, 2),
    (80, 128, "bwd"): (64, 32, 4, 1),
    (80, 256, "bwd"): (32, 32, 4, 1),
    (90, 64, "decode"): (16, 128, 4, 3),
    (90, 128, "decode"): (16, 64, 4, 2),
    (90, 256, "decode"): (16, 32, 4, 2),
    (80, 64, "decode"): (16, 64, 4, 2),
    (80, 128, "decode"): (16, 64, 4, 2),
    (80, 256, "decode"): (16, 32, 4, 1),
    (0, 64, "decode"): (16, 32, 4, 1),
    (0, 128, "decode"): (16, 32, 4, 1),
    (0, 256, "decode"): (16, 32, 4, 1),
    (90, 64, "fp8"): (128, 64, 8, 3),
    (90, 128, "fp8"): (64, 128, 4, 3),
    (0, 64, "plain"): (32, 32, 4, 1),
    (0, 128, "plain"): (32, 32, 4, 1),
    (0, 256, "plain"): (32, 32, 4, 1),
}


def variant_class(v: AttentionChains) -> str:
    if kernel_path(v.func)[0] == DECODE:
        return "decode"
    if kernel_path(v.func)[0] == FP8:
        return "fp8"
    if v.is_backward:
        return "bwd"
    if any(op.attributes.get("placement") == PlacementAttr(Placement.KV_LOOP) for op in v.k_chain):
        return "kloop"
    if any(isinstance(op, attn.SoftcapOp | attn.BiasOp | attn.ScoreModOp) for op in v.score_ops):
        return "mods"
    return "plain"


def lookup(sm: int, head_dim: int, cls: str) -> tuple[int, int, int, int]:
    """The table entry for (sm, head dim, class), falling back to the nearest known one."""
    bucket = 64 if head_dim <= 64 else 128 if head_dim <= 128 else 256
    arch = sm if any(k[0] == sm for k in TILING_TABLE) else (90 if sm >= 90 else 80 if sm > 0 else 0)
    return TILING_TABLE.get((arch, bucket, cls), TILING_TABLE[(arch, bucket, "plain")])


def _check_pow2(name: str, value: int | None, lo: int, hi: int) -> None:
    if value is not None and (value < lo or value > hi or value & (value - 1)):
        raise ValueError(f"tiling {name} must be a power of two in [{lo}, {hi}], got {value}")


@dataclass(frozen=True)
class TilingPass(ModulePass):
    """Choose the kernel's tile sizes and launch shape from the tuning table (per SM
    version, head dim and variant class); options override the table. Sets the
    function attribute `attn.tiling`."""

    name = "tiling"

    sm: int | None = None
    """Target SM version; default: the module's attn.target, else 90 (0: interpreter)."""
    block_m: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        _check_pow2("block-m", self.block_m, 16, 256)
        _check_pow2("block-n", self.block_n, 16, 256)
        _check_pow2("num-warps", self.num_warps, 1, 16)
        if self.num_stages is not None and not 1 <= self.num_stages <= 8:
            raise ValueError(f"tiling num-stages must be in [1, 8], got {self.num_stages}")
        sm = check_sm(target_option(op, "sm", self.sm, 90), self.name)
        for f in variant_funcs(op):
            v = analyse(f)
            cls = variant_class(v)
            bm, bn, warps, stages = lookup(sm, v.q_type.get_shape()[3], cls)
            chosen = {
                "block_m": self.block_m or bm,
                "block_n": self.block_n or bn,
                "num_warps": self.num_warps or warps,
                "num_stages": self.num_stages or stages,
            }
            attrs = {k: IntegerAttr(x, i64) for k, x in chosen.items()}
            f.attributes["attn.tiling"] = DictionaryAttr({**attrs, "class": StringAttr(cls)})
