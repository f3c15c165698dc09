"""Named attention variants of published models, ready to call on tensors.

Each is an `af.Variant`: `attnfuse.variants.llama3(q, k, v)` etc., with q
`[B, Hq, Nq, D]`, k `[B, Hkv, Nk, D]`, v `[B, Hkv, Nk, Dv]` (GQA when Hq is a
multiple of Hkv); queries are the last Nq of the Nk positions. Constants come from
the models' papers and released configurations, cited in each docstring.
"""

from __future__ import annotations

import math

import torch

import attnfuse as af

__all__ = [
    "alibi_slopes",
    "bloom",
    "gemma2",
    "gpt_oss",
    "llama3",
    "mistral",
    "packed_documents",
    "qwen3",
]


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes (Press et al., arXiv 2108.12409), float32 [n_heads], as
    BLOOM computes them: for n a power of two, the geometric sequence starting at
    2^(-8/n) with that ratio; otherwise the slopes of the largest power of two p < n,
    followed by every other slope of 2p (its odd-indexed ones) until n slopes."""
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise af.AttnFuseError(f"alibi_slopes(n_heads) needs an integer n_heads >= 1, got {n_heads!r}")

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    p = 1 << (n_heads.bit_length() - 1)
    slopes = geometric(p)
    if p < n_heads:
        slopes += geometric(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


@af.variant
def llama3(q, k, v):
    """Llama 3.1 (Meta, "The Llama 3 Herd of Models", arXiv 2407.21783; the released
    Llama-3.1 configs): RoPE with theta = 500000 and the llama3 frequency scaling
    (factor 8, low_freq_factor 1, high_freq_factor 4, original context 8192), causal
    mask, GQA (the 8B model has 32 query and 8 kv heads of dim 128)."""
    scaling = af.llama3_scaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192)
    q = af.rope(q, theta=500000.0, scaling=scaling)
    k = af.rope(k, theta=500000.0, scaling=scaling)
    s = af.mask(af.qk(q, k), af.causal)
    return af.pv(af.softmax(s), v)


@af.variant
def mistral(q, k, v):
    """Mistral 7B v0.1 (Jiang et al., arXiv 2310.06825, Table 1: sliding window 4096,
    32 query / 8 kv heads of dim 128; rope_theta 10000 in the released config): RoPE,
    then each query sees the 4096 most recent positions, itself included."""
    q = af.rope(q, theta=10000.0)
    k = af.rope(k, theta=10000.0)
    s = af.mask(af.qk(q, k), af.sliding_window(4096))
    return af.pv(af.softmax(s), v)


@af.variant
def gemma2(q, k, v):
    """Gemma 2's local (sliding-window) layers (Gemma Team, arXiv 2408.00118: window
    4096, attention logit soft-capping 50.0; the 9B config: query_pre_attn_scalar 256,
    rope_theta 10000): RoPE, scores scaled by 1/sqrt(256), soft-capped at 50, sliding
    window 4096. (Gemma 2 27B uses query_pre_attn_scalar 144; its global layers have
    no window.)"""
    q = af.rope(q, theta=10000.0)
    k = af.rope(k, theta=10000.0)
    s = af.qk(q, k, scale=1.0 / math.sqrt(256.0))
    s = af.softcap(s, 50.0)
    s = af.mask(s, af.sliding_window(4096))
    return af.pv(af.softmax(s), v)


@af.variant
def qwen3(q, k, v, q_norm_weight, k_norm_weight):
    """Qwen3 (Qwen Team, arXiv 2505.09388, which adds QK-norm to every layer; the
    released configs: rms_norm_eps 1e-6, rope_theta 1000000): RMSNorm of q and k over
    the head dim with learned weights (float tensors [D]), then RoPE, causal mask."""
    q = af.rope(af.qk_norm(q, q_norm_weight, eps=1e-6), theta=1000000.0)
    k = af.rope(af.qk_norm(k, k_norm_weight, eps=1e-6), theta=1000000.0)
    s = af.mask(af.qk(q, k), af.causal)
    return af.pv(af.softmax(s), v)


@af.variant
def bloom(q, k, v, slopes):
    """BLOOM (BigScience, arXiv 2211.05100): no rotary embedding; ALiBi biases
    slopes[h] * (kv_pos - q_pos) (slopes: float tensor [Hq], see `alibi_slopes`),
    causal mask."""
    s = af.bias(af.qk(q, k), af.alibi(slopes))
    s = af.mask(s, af.causal)
    return af.pv(af.softmax(s), v)


@af.variant
def gpt_oss(q, k, v, sinks):
    """gpt-oss's banded layers (OpenAI, gpt-oss-120b & gpt-oss-20b model card, arXiv
    2508.10925; the released configs: rope_theta 150000, YaRN factor 32 over an
    original context of 4096 with beta_fast 32, beta_slow 1 and truncate false,
    sliding_window 128): YaRN RoPE, a causal window of 128 positions and a learned
    sink logit per query head (`sinks`, float tensor [Hq]) in the softmax's normaliser."""
    scaling = af.yarn_scaling(factor=32.0, original_max_position=4096, beta_fast=32.0, beta_slow=1.0, truncate=False)
    q = af.rope(q, theta=150000.0, scaling=scaling)
    k = af.rope(k, theta=150000.0, scaling=scaling)
    s = af.mask(af.qk(q, k), af.sliding_window(128))
    return af.pv(af.softmax(s, sink=sinks), v)


@af.variant
def packed_documents(q, k, v, doc_ids):
    """Several documents packed into one sequence: causal attention within each
    document only (`doc_ids`: integer tensor [B, Nk], the document of each position)."""
    s = af.mask(af.qk(q, k), af.causal & af.document(doc_ids))
    return af.pv(af.softmax(s), v)
