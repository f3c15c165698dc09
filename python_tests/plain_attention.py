"""Plain float64 PyTorch formulas of attention and its blocks, written independently of
AttnFuse's reference executor: the second oracle of the front-end tests.

Positions follow the KV-cache convention: kv j has position j, query row i has
position Nk - Nq + i.
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64


def positions(nq: int, nk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(query positions [Nq], kv positions [Nk]) as int64."""
    return torch.arange(nk - nq, nk), torch.arange(nk)


def default_inv_freq(theta: float, rotary_dim: int) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=F64) / rotary_dim)


def linear_inv_freq(theta: float, rotary_dim: int, factor: float) -> torch.Tensor:
    return default_inv_freq(theta, rotary_dim) / factor


def llama3_inv_freq(
    theta: float, rotary_dim: int, factor: float, low: float = 1.0, high: float = 4.0, original: float = 8192.0
) -> torch.Tensor:
    """Llama 3.1's frequency scaling, as in Meta's reference code."""
    freqs = default_inv_freq(theta, rotary_dim)
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < original / high:
            out.append(f)
        elif wavelen > original / low:
            out.append(f / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=F64)


def yarn_inv_freq(
    theta: float,
    rotary_dim: int,
    factor: float,
    original: float,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071), the correction range rounded out to whole dims when
    `truncate`: (inv_freq, cos/sin magnitude 0.1 ln(factor) + 1)."""

    def dim_for(rotations: float) -> float:
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim_for(beta_fast), dim_for(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, rotary_dim - 1)
    if lo == hi:
        hi += 0.001
    freqs = default_inv_freq(theta, rotary_dim)
    out = []
    for i, f in enumerate(freqs.tolist()):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        keep = 1.0 - ramp  # share of the original (extrapolated) frequency
        out.append(f / factor * (1 - keep) + f * keep)
    return torch.tensor(out, dtype=F64), 0.1 * math.log(factor) + 1.0


def rope(
    x: torch.Tensor,
    pos: torch.Tensor,
    inv_freq: torch.Tensor,
    style: str = "half",
    magnitude: float = 1.0,
) -> torch.Tensor:
    """Rotate the first 2 * len(inv_freq) channels of x [B, H, N, D] by pos * inv_freq."""
    x = x.to(F64)
    r = 2 * inv_freq.numel()
    angle = pos.to(F64)[:, None] * inv_freq.to(F64)[None, :]
    cos, sin = torch.cos(angle) * magnitude, torch.sin(angle) * magnitude
    rot, rest = x[..., :r], x[..., r:]
    if style == "half":
        a, b = rot[..., : r // 2], rot[..., r // 2 :]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    return torch.cat([out, rest], dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    x = x.to(F64)
    y = x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)
    return y if weight is None else y * weight.to(F64)


def scores(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """q . k^T * scale [B, Hq, Nq, Nk], kv heads repeated for GQA."""
    group = q.shape[1] // k.shape[1]
    k = k.to(F64).repeat_interleave(group, dim=1)
    s = q.to(F64) @ k.transpose(-1, -2)
    return s * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))


def finish(
    s: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None = None, sink: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(s where keep, -inf elsewhere; plus an optional sink logit per head) . v;
    a row keeping nothing gives zeros."""
    s = s.to(F64)
    if keep is not None:
        s = torch.where(keep, s, torch.tensor(-math.inf, dtype=F64))
    m = s.amax(dim=-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink.to(F64)[None, :, None, None])
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    denom = e.sum(dim=-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink.to(F64)[None, :, None, None] - m)
    p = torch.where(denom > 0, e / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(e))
    group = s.shape[1] // v.shape[1]
    return p @ v.to(F64).repeat_interleave(group, dim=1)


def index_grids(b: int, h: int, nq: int, nk: int) -> tuple[torch.Tensor, ...]:
    """(b, h, q_pos, kv_pos) int64 grids broadcastable to [B, H, Nq, Nk]."""
    qp, kp = positions(nq, nk)
    return (
        torch.arange(b).view(b, 1, 1, 1),
        torch.arange(h).view(1, h, 1, 1),
        qp.view(1, 1, nq, 1),
        kp.view(1, 1, 1, nk),
    )


# --------------------------------------------------------------------------- score blocks
# Added for the gradient tests (test_grad.py, test_grad_random.py): each is differentiable
# by plain float64 autograd, as are `rope`, `rms_norm`, `scores` and `finish` above.


def causal_keep(nq: int, nk: int) -> torch.Tensor:
    """Keep kv_pos <= q_pos: bool [Nq, Nk]."""
    qp, kp = positions(nq, nk)
    return kp[None, :] <= qp[:, None]


def sliding_window_keep(nq: int, nk: int, w: int) -> torch.Tensor:
    """Keep 0 <= q_pos - kv_pos < w: bool [Nq, Nk]."""
    qp, kp = positions(nq, nk)
    d = qp[:, None] - kp[None, :]
    return (d >= 0) & (d < w)


def prefix_lm_keep(nq: int, nk: int, n: int) -> torch.Tensor:
    """Keep kv_pos < n (the bidirectional prefix) or kv_pos <= q_pos: bool [Nq, Nk]."""
    qp, kp = positions(nq, nk)
    return (kp[None, :] < n) | (kp[None, :] <= qp[:, None])


def document_keep(ids: torch.Tensor, nq: int) -> torch.Tensor:
    """Keep ids[b, q_pos] == ids[b, kv_pos] (ids: integer [B, Nk]): bool [B, 1, Nq, Nk]."""
    qp, kp = positions(nq, ids.shape[1])
    ids = ids.long()
    return ids[:, None, qp, None] == ids[:, None, None, kp]


def alibi_bias(slopes: torch.Tensor, nq: int, nk: int) -> torch.Tensor:
    """ALiBi: slopes[h] * (kv_pos - q_pos), float64 [1, H, Nq, Nk]."""
    qp, kp = positions(nq, nk)
    return slopes.to(F64)[None, :, None, None] * (kp[None, :] - qp[:, None]).to(F64)


def softcap(s: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(s / cap)."""
    return cap * torch.tanh(s / cap)


# --------------------------------------------------------------------------- explicit positions
# Added for the explicit-positions tests (test_positions.py): af.rope(x, positions=...).


def rope_at(
    x: torch.Tensor,
    pos: torch.Tensor,
    inv_freq: torch.Tensor,
    style: str = "half",
    magnitude: float = 1.0,
) -> torch.Tensor:
    """Rotate the first 2 * len(inv_freq) channels of x [B, H, N, D] by pos * inv_freq, pos
    giving the position of each row: [N] (every batch entry alike) or [B, N] (one row of
    positions per batch entry). Written out per batch entry with `rope`, so that the [B, N]
    form does not share its broadcasting with the reference executor."""
    if pos.dim() == 1:
        return rope(x, pos, inv_freq, style, magnitude)
    assert pos.shape == (x.shape[0], x.shape[2]), (list(pos.shape), list(x.shape))
    return torch.cat([rope(x[b : b + 1], pos[b], inv_freq, style, magnitude) for b in range(x.shape[0])], dim=0)


def left_padded_positions(n: int, pads: list[int]) -> torch.Tensor:
    """[B, N] int64 positions of a left-padded batch: batch entry b has pads[b] padding
    tokens first, at negative positions -pads[b]..-1, then its real tokens at 0, 1, ..."""
    return torch.stack([torch.arange(n) - p for p in pads])


def packed_positions(lengths: list[list[int]]) -> torch.Tensor:
    """[B, N] int64 positions of a packed batch: batch entry b holds documents of lengths
    lengths[b] back to back (summing to N), each one's positions restarting at 0."""
    return torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths])
