"""The variant families the decode and varlen tests run (`families`): the named variants, and two
of this file's own that reach what they do not (a score_mod reading the head index; QK-norm with a
weight on K, a pre-matmul scale and a custom mask), with their extra tensors."""

from __future__ import annotations

import torch

import attnfuse as af
from attnfuse import variants


@af.variant
def rope_headmod(q, k, v):
    """RoPE with a score_mod reading the head index (h is a per-row value in decode's packed tile)."""
    q, k = af.rope(q), af.rope(k)
    s = af.score_mod(af.qk(q, k), lambda x, b, h, qi, ki: x + 0.25 * h - 0.01 * (qi - ki))
    return af.pv(af.softmax(af.mask(s, af.causal)), v)


@af.variant
def scaled_norm_custom_mask(q, k, v, w):
    """QK-norm with a weight on K, a pre-matmul scale, a custom mask reading an extra per key."""
    q = af.scale(af.qk_norm(q), 2.0)
    k = af.qk_norm(k, weight=w)
    s = af.mask(af.qk(q, k), lambda b, h, qi, ki: (ki % 3 != 1) & (ki <= qi))
    return af.pv(af.softmax(s), v)


@af.variant
def small_window(q, k, v):
    """RoPE, a softcap and a 20-key sliding window: a window that crosses the interpreter's 32-key
    blocks and a 16-key page."""
    s = af.softcap(af.qk(af.rope(q), af.rope(k)), 20.0)
    return af.pv(af.softmax(af.mask(s, af.sliding_window(20))), v)


def families(hq: int, d: int, seed: int) -> list[tuple[af.Variant, tuple]]:
    """(variant, extras) for `hq` query heads at head dim `d`: Llama 3, Mistral, Gemma 2, Qwen3,
    BLOOM, gpt-oss, then the two above."""
    g = torch.Generator().manual_seed(seed)
    return [
        (variants.llama3, ()),
        (variants.mistral, ()),
        (variants.gemma2, ()),
        (variants.qwen3, (torch.rand(d, generator=g) + 0.5, torch.rand(d, generator=g) + 0.5)),
        (variants.bloom, (af.alibi_slopes(hq),)),
        (variants.gpt_oss, (torch.randn(hq, generator=g),)),
        (rope_headmod, ()),
        (scaled_norm_custom_mask, (torch.rand(d, generator=g) + 0.5,)),
    ]
