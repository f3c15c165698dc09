"""rope-fusion: where each pre-matmul transform runs in the kernel.

Q's transforms (RoPE, QK-norm, scale) run once per Q tile in the kernel prologue; the
Q·Kᵀ scale and, when every score op is linear, the log2(e) factor of the base-2 softmax
are one factor on the product's fp32 scores (`score_scale`: multiplying q by it before
the product would round the scaled tile to 16 bits, and with large logits cost the
gradients 20-400x SDPA's error). K's transforms run either fused in the KV loop (every K tile is rotated
once per Q tile that reads it) or in a separate pre-rotation kernel that writes a
rotated copy of K once (one extra read and write of K, one more launch). The
Rotation Calculus below compares the two.

In a backward function (attn-autodiff's), Q's and K's transforms both run in
pre-rotation kernels (`_place_backward` says why). So do K's for a function that
kernel-path gave the sm90 Gluon kernel, which reads K through TMA (the Gluon launch
pre-rotates Q too; the generic kernel beside it keeps Q's transforms in its prologue).
In the FP8 form, every quantized operand's transforms run in its quantization kernel (`_place_fp8`).
In a function kernel-path compiles for decoding, K's transforms are the cache's (`cache`):
`Variant.cache_keys` applies them once when keys are written, and the decode kernel reads them so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import DictionaryAttr, FloatAttr, IntegerAttr, ModuleOp, StringAttr, UnitAttr, f64, i64
from xdsl.passes import ModulePass

from attnfuse.dialects import attn
from attnfuse.dialects.attn import LOG2E, Placement, PlacementAttr
from attnfuse.passes.analysis import AttentionChains, analyse, check_sm, target_option, variant_funcs
from attnfuse.passes.kernel_path import DECODE, FP8, GLUON, VARLEN, kernel_path

RopeMode = Literal["auto", "fused", "prerotate"]


@dataclass(frozen=True)
class GpuModel:
    """What the Rotation Calculus needs to know of a GPU."""

    rotate_rate: float
    """K elements rotated per second inside the attention loop (measured, in-kernel)."""
    bandwidth: float
    """Device memory bandwidth, bytes per second."""
    launch_s: float
    """Cost of one more kernel launch, seconds."""


# sm90: fitted on the lent H200 on 2026-11-29 (benchmarks/results/h200/rope_smoke.md, NOTES.md):
# rotating K in the KV loop cost 0.44 ms over plain causal at B4/H12/N4096/D64 (2.0e8 rotated K
# elements, 4.5e11/s) and 0.053 ms at N=1024 (1.3e7 elements, 2.4e11/s); 2.5e11 keeps the small-N
# choice right, where it matters. Pre-rotation cost 0.026 ms at N=4096, which one launch plus
# one read and write of K at 4.3 TB/s predicts within 25%. The model is evaluated at batch 1
# (batch is a runtime size), the case most favourable to fusing. sm80/sm86/sm89 are datasheet
# estimates, not measured here.
GPU_MODELS: dict[int, GpuModel] = {
    90: GpuModel(rotate_rate=2.5e11, bandwidth=4.3e12, launch_s=8e-6),
    89: GpuModel(rotate_rate=0.8e12, bandwidth=0.9e12, launch_s=6e-6),
    86: GpuModel(rotate_rate=0.6e12, bandwidth=0.9e12, launch_s=6e-6),
    80: GpuModel(rotate_rate=1.0e12, bandwidth=1.9e12, launch_s=6e-6),
}


def rotation_costs(
    sm: int,
    seq_len: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    causal: bool,
    block_m: int = 128,
    batch: int = 1,
    elem_bytes: int = 2,
) -> tuple[float, float]:
    """(seconds K's transforms add when fused in the KV loop, when pre-rotated).

    Fused: every (Q tile, K tile) pair the kernel visits rotates the K tile again:
    batch * q_heads * ceil(N / block_m) * N * head_dim elements, halved when causal.
    Pre-rotated: K (kv_heads only) is read and written once more, plus one launch.
    """
    model = GPU_MODELS.get(sm, GPU_MODELS[90])
    visits = batch * q_heads * math.ceil(seq_len / block_m) * seq_len * head_dim
    if causal:
        visits /= 2
    fused = visits / model.rotate_rate
    k_bytes = batch * kv_heads * seq_len * head_dim * elem_bytes
    prerotate = model.launch_s + 2 * k_bytes / model.bandwidth
    return fused, prerotate


def crossover(
    sm: int, q_heads: int, kv_heads: int, head_dim: int, causal: bool, block_m: int = 128, batch: int = 1
) -> int:
    """The smallest power-of-two N from 64 up at which pre-rotation is cheaper."""
    n = 64
    while n < 1 << 22:
        fused, pre = rotation_costs(sm, n, q_heads, kv_heads, head_dim, causal, block_m, batch)
        if pre < fused:
            return n
        n *= 2
    return n


def _k_placement(mode: RopeMode, gluon: bool, fused_s: float, prerotate_s: float) -> Placement:
    """Where K's transforms run: pre-rotated for the Gluon kernel (it reads K through TMA),
    else as `mode` says, `auto` by the predicted costs."""
    if gluon or mode == "prerotate" or (mode == "auto" and prerotate_s < fused_s):
        return Placement.PREROTATE
    return Placement.KV_LOOP


def _place_backward(f: func.FuncOp, v: AttentionChains) -> None:
    """A backward function's Q and K transforms both run in pre-rotation kernels: its dK/dV
    kernel reads every Q block once per KV block and its dQ kernel every K block once per
    Q block, so a rotation in either loop would be repeated Nk / BLOCK_N times."""
    placed = {}
    for key, chain in (("q", v.q_chain), ("k", v.k_chain)):
        for x in chain:
            x.attributes["placement"] = PlacementAttr(Placement.PREROTATE)
        placed[key] = StringAttr(Placement.PREROTATE.value if chain else "none")
    f.attributes["attn.rope_fusion"] = DictionaryAttr(placed)


_PRE_REASONS = {
    True: "the gluon-sm90 kernel reads K pre-rotated",
    False: "a Hadamard rotation is a product: once per key",
}
"""Why K is pre-rotated whatever the costs: for the Gluon kernel (True), or for a Hadamard (False)."""


def _place_fp8(f: func.FuncOp, v: AttentionChains) -> None:
    """A function in the FP8 form transforms and quantizes each quantized operand in its own
    kernel before the attention (which reads e4m3 values and their scales)."""
    for x in v.q_chain + v.k_chain + v.v_chain:
        x.attributes["placement"] = PlacementAttr(Placement.PREROTATE)
    f.attributes["attn.rope_fusion"] = DictionaryAttr(
        {
            "q": StringAttr(Placement.PREROTATE.value),
            "k": StringAttr(Placement.PREROTATE.value),
            "reason": StringAttr("the FP8 form: quantization kernels"),
        }
    )


@dataclass(frozen=True)
class RopeFusionPass(ModulePass):
    """Place Q's transforms in the kernel prologue and choose, per the Rotation
    Calculus, whether K's run fused in the KV loop or in a pre-rotation kernel.

    Marks each pre-matmul op with `placement` (`#attn.placement<q_prologue>`,
    `<kv_loop>` or `<prerotate>`), the attn.qk with `score_scale` (the factor on the
    fp32 scores) and, when that factor includes the softmax's LOG2E, `log2e_folded`; and the
    function with `attn.rope_fusion` (the decision and both predicted costs)."""

    name = "rope-fusion"

    mode: RopeMode = "auto"
    """auto (cost model), fused (K transformed in the KV loop) or prerotate."""
    sm: int | None = None
    """Target SM version (e.g. 90); default: the module's attn.target, else 90."""
    seq_len: int | None = None
    """Sequence length the kernel is compiled for; default: attn.target, else 4096."""

    def _place_k(self, f: func.FuncOp, v: AttentionChains, sm: int, seq_len: int) -> DictionaryAttr:
        """Mark where K's transforms run; returns the function's `attn.rope_fusion` record."""
        if not v.k_chain:
            return DictionaryAttr({"k": StringAttr("none")})
        path = kernel_path(f)[0]
        if path in (DECODE, VARLEN):
            placement, reason = (
                (Placement.CACHE, "a decode kernel reads K as cache_keys wrote it")
                if path == DECODE
                else (Placement.KV_LOOP, "packed sequences: K rotated at positions within its sequence")
            )
            for k_op in v.k_chain:
                k_op.attributes["placement"] = PlacementAttr(placement)
            return DictionaryAttr({"k": StringAttr(placement.value), "reason": StringAttr(reason)})
        q_heads, kv_heads = v.q_type.get_shape()[1], v.k_type.get_shape()[1]
        causal = any(kind.causal_like for m in v.masks if (kind := attn.MASK_KINDS.get(m.kind.data)))
        fused_s, pre_s = rotation_costs(sm, seq_len, q_heads, kv_heads, v.k_type.get_shape()[3], causal)
        gluon = kernel_path(f)[0] == GLUON
        hadamard = any(isinstance(x, attn.HadamardOp) for x in v.k_chain)
        placement = _k_placement(self.mode, gluon or hadamard, fused_s, pre_s)
        for k_op in v.k_chain:
            k_op.attributes["placement"] = PlacementAttr(placement)
        return DictionaryAttr(
            {
                "k": StringAttr(placement.value),
                "sm": IntegerAttr(sm, i64),
                "seq_len": IntegerAttr(seq_len, i64),
                "fused_us": FloatAttr(round(fused_s * 1e6, 3), f64),
                "prerotate_us": FloatAttr(round(pre_s * 1e6, 3), f64),
                **({"reason": StringAttr(_PRE_REASONS[gluon])} if gluon or hadamard else {}),
            }
        )

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.mode not in get_args(RopeMode):  # `-p` options are checked by xDSL; this checks Python callers
            raise ValueError(f"rope-fusion mode must be one of {', '.join(get_args(RopeMode))}, got '{self.mode}'")
        sm = check_sm(target_option(op, "sm", self.sm, 90), self.name)
        seq_len = target_option(op, "seq_len", self.seq_len, 4096)
        if seq_len < 1:
            raise ValueError(f"rope-fusion seq-len must be >= 1, got {seq_len}")
        for f in variant_funcs(op):
            v = analyse(f)
            if v.is_backward:
                _place_backward(f, v)
                continue
            for q_op in v.q_chain:
                q_op.attributes["placement"] = PlacementAttr(Placement.Q_PROLOGUE)
            foldable = all(isinstance(s, attn.ScaleOp | attn.MaskOp) for s in v.score_ops)
            score_scale = v.qk.effective_scale * (LOG2E if foldable else 1.0)
            v.qk.attributes["score_scale"] = FloatAttr(score_scale, f64)
            if foldable:
                v.qk.attributes["log2e_folded"] = UnitAttr()
            if kernel_path(f)[0] == FP8:
                _place_fp8(f, v)
                continue
            f.attributes["attn.rope_fusion"] = self._place_k(f, v, sm, seq_len)
