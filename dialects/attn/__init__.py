"""The `attn` dialect: attention as a composition of ten building blocks.

A variant is a `func.func` whose arguments are q, k, v (`tensor<?xHx?xDxT>`, batch
and sequence dynamic, heads and head dim static) plus extra tensors (ALiBi slopes,
document ids, QK-norm weights, sink logits). Pre-matmul ops (`attn.rope`,
`attn.norm`, `attn.scale` on tensors) transform q or k; `attn.qk` produces the
never-materialised score matrix (`!attn.scores<H>`); post-matmul ops (`attn.mask`,
`attn.bias`, `attn.softcap`, `attn.score_mod`, `attn.scale` on scores) transform
scores; `attn.softmax` turns scores into probabilities (`!attn.probs<H>`) and
`attn.pv` multiplies them with v.

Positions: key/value token j has position j (0..Nk-1); a tensor of N rows holds the
*last* N positions of the key sequence (Nk-N..Nk-1), so queries are the last Nq
tokens (the KV-cache convention) and RoPE and masks agree for prefill and decode.

A backward function (written by the attn-autodiff pass) recomputes the forward's ops and
applies their derivatives (`attn.pv_grad`, `attn.softmax_grad`, `attn.sink_grad`,
`attn.score_mul`, `attn.qk_grad`, `attn.rope_grad`, `attn.norm_grad`,
`attn.norm_weight_grad`).

The dialect is four modules: `attributes` (types, attributes, named kinds, pass
annotations), `ops` (the pre-matmul transforms, the matmuls, the softmax),
`score_fns` (mask, bias and score_mod, and their regions' ops) and `grads` (the
derivatives). Import from here.
"""

from xdsl.ir import Dialect

from attnfuse.dialects.attn.attributes import (
    BIAS_KINDS,
    INT32_MAX,
    LOG2E,
    MASK_KINDS,
    ROPE_SCALINGS,
    KvBoundAttr,
    MaskKind,
    NamedKind,
    Placement,
    PlacementAttr,
    ProbsType,
    RopeScalingAttr,
    RopeStyle,
    RopeStyleAttr,
    ScoresType,
)
from attnfuse.dialects.attn.grads import (
    GRAD_OPS,
    NormGradOp,
    NormWeightGradOp,
    PVGradOp,
    QKGradOp,
    RopeGradOp,
    ScoreMulOp,
    SinkGradOp,
    SoftmaxGradOp,
)
from attnfuse.dialects.attn.ops import (
    E4M3_MAX,
    HadamardOp,
    NormOp,
    PVOp,
    QKOp,
    QuantizeOp,
    RopeOp,
    ScaleOp,
    SoftcapOp,
    SoftmaxOp,
    chain_ops,
)
from attnfuse.dialects.attn.score_fns import REGION_OPS, BiasOp, ExtractOp, MaskOp, ScoreModOp, YieldOp, new_region

PRE_MATMUL_OPS = (RopeOp, NormOp, ScaleOp, HadamardOp, QuantizeOp)
LOW_PRECISION_OPS = (HadamardOp, QuantizeOp)
"""The FP8 form's ops (forward-only)."""
SCORE_OPS = (ScaleOp, MaskOp, BiasOp, SoftcapOp, ScoreModOp)

Attn = Dialect(
    "attn",
    [
        RopeOp,
        NormOp,
        ScaleOp,
        HadamardOp,
        QuantizeOp,
        QKOp,
        MaskOp,
        BiasOp,
        SoftcapOp,
        ScoreModOp,
        SoftmaxOp,
        PVOp,
        ExtractOp,
        YieldOp,
        *GRAD_OPS,
    ],
    [ScoresType, ProbsType, RopeStyleAttr, RopeScalingAttr, PlacementAttr, KvBoundAttr],
)

__all__ = [
    "BIAS_KINDS",
    "E4M3_MAX",
    "GRAD_OPS",
    "INT32_MAX",
    "LOW_PRECISION_OPS",
    "LOG2E",
    "MASK_KINDS",
    "PRE_MATMUL_OPS",
    "REGION_OPS",
    "ROPE_SCALINGS",
    "SCORE_OPS",
    "Attn",
    "BiasOp",
    "ExtractOp",
    "HadamardOp",
    "KvBoundAttr",
    "MaskKind",
    "MaskOp",
    "NamedKind",
    "NormOp",
    "PVOp",
    "Placement",
    "PlacementAttr",
    "ProbsType",
    "QKOp",
    "QuantizeOp",
    "RopeOp",
    "RopeScalingAttr",
    "RopeStyle",
    "RopeStyleAttr",
    "ScaleOp",
    "ScoreModOp",
    "ScoresType",
    "SoftcapOp",
    "SoftmaxOp",
    "YieldOp",
    "chain_ops",
    "new_region",
    "NormGradOp",
    "NormWeightGradOp",
    "PVGradOp",
    "QKGradOp",
    "RopeGradOp",
    "ScoreMulOp",
    "SinkGradOp",
    "SoftmaxGradOp",
]
