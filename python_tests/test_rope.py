"""RoPE frequencies (attnfuse.rope_freqs) against the published algorithms, written out here
one frequency at a time: Meta's llama3 `apply_scaling` (HF's `_compute_llama3_parameters`
is its vectorised form) and HF's `_compute_yarn_parameters`."""

from __future__ import annotations

import math

import pytest
import torch

from attnfuse import rope_freqs
from attnfuse.dialects.attn import RopeOp
from attnfuse.ir import parse_module


def inv_freq(*args, **params) -> tuple[torch.Tensor, float]:
    """rope_freqs.inv_freq, its plain floats (the compiler does not import torch) as a tensor."""
    freqs, magnitude = rope_freqs.inv_freq(*args, **params)
    assert all(type(f) is float for f in freqs)
    return as_tensor(freqs), magnitude


def op_inv_freq(op: RopeOp) -> tuple[torch.Tensor, float]:
    freqs, magnitude = rope_freqs.op_inv_freq(op)
    return as_tensor(freqs), magnitude


def base_freqs(theta: float, dim: int) -> list[float]:
    return [1.0 / theta ** (i / dim) for i in range(0, dim, 2)]


def llama3_reference(theta, dim, factor, low_freq_factor, high_freq_factor, old_context_len) -> list[float]:
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    new_freqs = []
    for freq in base_freqs(theta, dim):
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new_freqs.append(freq)
        elif wavelen > low_freq_wavelen:
            new_freqs.append(freq / factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new_freqs.append((1 - smooth) * freq / factor + smooth * freq)
    return new_freqs


def yarn_reference(
    theta, dim, factor, original_max, beta_fast=32.0, beta_slow=1.0, truncate=True
) -> tuple[list[float], float]:
    def find_correction_dim(num_rotations):
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    freqs = []
    for i, extrapolated in enumerate(base_freqs(theta, dim)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        extrapolation_factor = 1 - ramp
        interpolated = extrapolated / factor
        freqs.append(interpolated * (1 - extrapolation_factor) + extrapolated * extrapolation_factor)
    mscale = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    return freqs, mscale


def as_tensor(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize(("theta", "dim"), [(10000.0, 128), (500000.0, 64), (10.0, 8)])
def test_unscaled(theta, dim):
    freqs, magnitude = inv_freq(theta, dim)
    assert freqs.dtype == torch.float64 and freqs.shape == (dim // 2,)
    close(freqs, as_tensor(base_freqs(theta, dim)))
    assert magnitude == 1.0


def test_linear_divides_every_frequency():
    freqs, magnitude = inv_freq(10000.0, 64, "linear", factor=4.0)
    close(freqs, as_tensor(base_freqs(10000.0, 64)) / 4.0)
    assert magnitude == 1.0


@pytest.mark.parametrize(
    "params",
    [
        # Llama 3.1 8B's published configuration
        dict(theta=500000.0, dim=128, factor=8.0, low=1.0, high=4.0, old=8192.0),
        # Llama 3.2 style, and a short context so that every band is populated
        dict(theta=500000.0, dim=64, factor=32.0, low=1.0, high=4.0, old=8192.0),
        dict(theta=10000.0, dim=32, factor=4.0, low=2.0, high=8.0, old=256.0),
    ],
)
def test_llama3(params):
    p = params
    freqs, magnitude = inv_freq(
        p["theta"],
        p["dim"],
        "llama3",
        factor=p["factor"],
        low_freq_factor=p["low"],
        high_freq_factor=p["high"],
        original_max_position=p["old"],
    )
    expected = as_tensor(llama3_reference(p["theta"], p["dim"], p["factor"], p["low"], p["high"], p["old"]))
    close(freqs, expected)
    assert magnitude == 1.0
    base = as_tensor(base_freqs(p["theta"], p["dim"]))
    assert freqs[0] == base[0]  # the highest frequency is kept
    assert freqs[-1] == base[-1] / p["factor"]  # the lowest is divided by the factor


@pytest.mark.parametrize(
    ("theta", "dim", "factor", "original_max"),
    [(10000.0, 128, 4.0, 4096.0), (1000000.0, 64, 40.0, 4096.0), (10000.0, 16, 8.0, 2048.0)],
)
def test_yarn(theta, dim, factor, original_max):
    freqs, magnitude = inv_freq(theta, dim, "yarn", factor=factor, original_max_position=original_max)
    expected, mscale = yarn_reference(theta, dim, factor, original_max)
    close(freqs, as_tensor(expected))
    assert magnitude == pytest.approx(mscale)
    base = as_tensor(base_freqs(theta, dim))
    assert freqs[0] == base[0] and freqs[-1] == pytest.approx(base[-1] / factor)


def test_yarn_explicit_attention_factor_and_betas():
    freqs, magnitude = inv_freq(
        10000.0,
        64,
        "yarn",
        factor=16.0,
        original_max_position=1024.0,
        beta_fast=16.0,
        beta_slow=2.0,
        attention_factor=1.25,
    )
    expected, _ = yarn_reference(10000.0, 64, 16.0, 1024.0, beta_fast=16.0, beta_slow=2.0)
    close(freqs, as_tensor(expected))
    assert magnitude == 1.25


def test_yarn_without_truncation_gpt_oss():
    """gpt-oss's released config (theta 150000, head dim 64, factor 32 over 4096, truncate
    false): the blend's dim range keeps its fractional ends, so the ramp frequencies differ
    from the rounded form's."""
    params = dict(factor=32.0, original_max_position=4096.0, beta_fast=32.0, beta_slow=1.0)
    freqs, magnitude = inv_freq(150000.0, 64, "yarn", truncate=False, **params)
    expected, mscale = yarn_reference(150000.0, 64, 32.0, 4096.0, truncate=False)
    close(freqs, as_tensor(expected))
    assert magnitude == pytest.approx(mscale)
    rounded, _ = inv_freq(150000.0, 64, "yarn", **params)
    assert not torch.equal(freqs, rounded)
    close(rounded, as_tensor(yarn_reference(150000.0, 64, 32.0, 4096.0)[0]))


def test_op_inv_freq_fills_scaling_defaults():
    t = "tensor<?x2x?x64xf32>"
    module = parse_module(
        f"""func.func @f(%q: {t}) {{
  %a = attn.rope %q half theta = 500000.0 rotary_dim = 32 scaling = #attn.rope_scaling<llama3, factor = 8.0> : {t}
  %b = attn.rope %q interleaved theta = 100.0 rotary_dim = 64 : {t}
  func.return
}}"""
    )
    scaled, plain = [op for op in module.walk() if isinstance(op, RopeOp)]
    freqs, magnitude = op_inv_freq(scaled)
    close(freqs, as_tensor(llama3_reference(500000.0, 32, 8.0, 1.0, 4.0, 8192.0)))
    assert magnitude == 1.0
    freqs, magnitude = op_inv_freq(plain)
    close(freqs, as_tensor(base_freqs(100.0, 64)))


def test_unknown_scaling_is_rejected():
    with pytest.raises(ValueError, match="unknown rope scaling 'ntk'"):
        inv_freq(10000.0, 64, "ntk", factor=2.0)
