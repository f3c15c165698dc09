"""RoPE frequencies: the meaning of `attn.rope`'s theta, rotary_dim and scaling.

Shared by the reference executor and the generated kernels' host code: both need
the same inv_freq vector (rotary_dim / 2 entries) and cos/sin magnitude factor. Plain
Python floats (at most a few dozen), so the compiler never imports torch.
"""

from __future__ import annotations

import math

from attnfuse.dialects.attn import RopeGradOp, RopeOp
from attnfuse.errors import AttnFuseError


def inv_freq(
    theta: float, rotary_dim: int, scaling: str | None = None, **params: float | bool
) -> tuple[list[float], float]:
    """(inv_freq, rotary_dim // 2 float64 values; the magnitude factor applied to cos and sin)."""
    r = rotary_dim
    base = [1.0 / (theta ** (i / r)) for i in range(0, r, 2)]
    if scaling is None:
        return base, 1.0
    factor = _param(params, scaling, "factor")
    if scaling == "linear":
        return [f / factor for f in base], 1.0
    if scaling == "llama3":
        return _llama3(base, factor, params), 1.0
    if scaling == "yarn":
        return _yarn(base, theta, r, factor, params)
    raise AttnFuseError(f"unknown rope scaling {scaling!r}, expected linear, llama3 or yarn")


def _param(params: dict[str, float | bool], scaling: str, name: str) -> float:
    """A required scaling parameter, as a float."""
    if name not in params:
        raise AttnFuseError(
            f"{scaling} rope scaling needs {name!r}; got {', '.join(sorted(params)) or 'no parameters'}"
        )
    return float(params[name])


def _llama3(base: list[float], factor: float, params: dict[str, float | bool]) -> list[float]:
    """Llama 3.1's scaling: long wavelengths divided by factor, short ones kept, a smooth
    interpolation between the two bands."""
    old = float(params.get("original_max_position", 8192.0))
    low, high = float(params.get("low_freq_factor", 1.0)), float(params.get("high_freq_factor", 4.0))
    low_wavelen, high_wavelen = old / low, old / high
    freqs = []
    for f in base:
        wavelen = 2 * math.pi / f
        scaled = f / factor if wavelen > low_wavelen else f
        if high_wavelen <= wavelen <= low_wavelen:  # between the bands: interpolate
            smooth = (old / wavelen - low) / (high - low)
            scaled = (1 - smooth) * scaled / factor + smooth * scaled
        freqs.append(scaled)
    return freqs


def _yarn(
    base: list[float], theta: float, r: int, factor: float, params: dict[str, float | bool]
) -> tuple[list[float], float]:
    """YaRN: dims that rotate fewer than beta_slow times over the original context are
    interpolated (divided by factor), those rotating more than beta_fast times are kept, a
    linear ramp between; cos and sin are scaled by the attention factor."""
    old = _param(params, "yarn", "original_max_position")
    beta_fast, beta_slow = float(params.get("beta_fast", 32.0)), float(params.get("beta_slow", 1.0))

    def correction_dim(rotations: float) -> float:
        return (r * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, r - 1)
    if lo == hi:
        hi += 0.001
    freqs = []
    for i, f in enumerate(base):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        extrapolation = 1 - ramp
        freqs.append((f / factor) * (1 - extrapolation) + f * extrapolation)
    attn_factor = float(params.get("attention_factor", 0.0)) or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    return freqs, attn_factor


def op_inv_freq(op: RopeOp | RopeGradOp) -> tuple[list[float], float]:
    """inv_freq and magnitude factor of an `attn.rope` (or `attn.rope_grad`) op without an
    inv_freq operand."""
    scaling = op.scaling
    params = scaling.values if scaling is not None else {}
    return inv_freq(
        op.theta.value.data,
        op.rotary_dim.value.data,
        scaling.kind.data if scaling is not None else None,
        **params,
    )
